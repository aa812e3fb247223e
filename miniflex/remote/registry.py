"""Open the remote store that ``remote_url`` names; the backend is chosen by the URL's scheme.

Backends are imported here, on first use, so that ``import miniflex.remote``
needs no client library and a missing one is reported with the install
command rather than as an ImportError at start-up.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType

from miniflex.config import MiniFlexConfig
from miniflex.config.remote import MOONCAKE_SCHEME, REMOTE_SCHEMES
from miniflex.errors import ConfigError
from miniflex.remote.base import RemoteStore

__all__ = ["BACKENDS", "open_remote_store"]

BACKENDS: Mapping[str, tuple[str, str, str]] = MappingProxyType(
    {
        **{
            scheme: ("miniflex.remote.redis_store", "RedisStore", "redis, crc32c")
            for scheme in REMOTE_SCHEMES
        },
        MOONCAKE_SCHEME: (
            "miniflex.remote.mooncake_store",
            "MooncakeStore",
            "mooncake-transfer-engine-non-cuda, crc32c, and libibverbs1 from apt",
        ),
    }
)
"""URL scheme -> (module, class, client library it imports)."""
_EXTRAS = {MOONCAKE_SCHEME: "mooncake"}
"""URL scheme -> the pip extra that installs its client (``remote`` where not listed)."""


def open_remote_store(cfg: MiniFlexConfig, namespace_digest: bytes) -> RemoteStore | None:
    """The store of ``cfg.remote_url`` for one namespace, not yet connected; None if unset.

    Raises ConfigError for a scheme no backend serves (listing those that
    exist) or a client library that is not installed (with the pip command).
    Call :meth:`RemoteStore.check` next, to refuse bad credentials at start-up.
    """
    if cfg.remote_url is None:
        return None
    scheme = cfg.remote_url.split("://", 1)[0]
    if scheme not in BACKENDS:
        valid = ", ".join(f"{s}://" for s in BACKENDS)
        raise ConfigError("remote_url", cfg.remote_url, f"expected one of {valid}")
    module_name, class_name, library = BACKENDS[scheme]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            "remote_url",
            cfg.remote_url,
            f"a library it needs ({library}) is missing ({exc}): "
            f"pip install 'miniflex[{_EXTRAS.get(scheme, 'remote')}]'",
        ) from None
    store_class: type[RemoteStore] = getattr(module, class_name)
    return store_class(  # type: ignore[call-arg]
        cfg.remote_url,
        namespace_digest,
        user=cfg.remote_user,
        password=cfg.remote_secret(),
        prefix=cfg.remote_prefix,
        tls=cfg.remote_tls_on,
        tls_ca_file=cfg.remote_tls_ca_file,
        tls_cert_file=cfg.remote_tls_cert_file,
        tls_key_file=cfg.remote_tls_key_file,
        timeout_s=cfg.remote_timeout_s,
        retry_s=cfg.remote_retry_s,
    )
