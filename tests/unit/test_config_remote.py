"""The remote tier's config keys: URLs, credentials, TLS and timeouts, with readable errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from miniflex.config import MiniFlexConfig
from miniflex.errors import ConfigError


def _cfg(extra: dict[str, object], env: dict[str, str] | None = None) -> MiniFlexConfig:
    return MiniFlexConfig.from_dict(extra, env=env or {})


def _error(extra: dict[str, object], env: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        _cfg(extra, env)
    return info.value


def test_the_remote_tier_is_off_by_default() -> None:
    cfg = _cfg({})
    assert cfg.remote_url is None and cfg.remote_secret() is None and not cfg.remote_tls_on


@pytest.mark.parametrize(
    "url",
    [
        "redis://cache:6379",
        "redis://10.0.0.5",
        "redis://[::1]:6380/2",
        "valkey://c:1",
        "unix:///s",
        "redis+cluster://c0:7000,c1:7000,[::1]:7001",
        "valkey+cluster://c0",
    ],
)
def test_store_urls_are_accepted(url: str) -> None:
    assert _cfg({"remote_url": url}).remote_url == url


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://cache:6379", "redis://HOST"),
        ("redis://cache:99999", "from 1 to 65535"),
        ("redis://cache:6379/zero", "database number"),
        ("redis://cache:6379?socket_timeout=9", "remote_* keys"),
        ("unix://", "unix:///PATH"),
        ("redis+cluster://c0:7000,c1:99999", "startup node 'c1:99999'"),
        ("redis+cluster://c0:7000,", "startup node ''"),
        ("redis+cluster://c0:7000/1", "no databases"),
    ],
)
def test_bad_urls_say_what_is_accepted(url: str, says: str) -> None:
    err = _error({"remote_url": url})
    assert err.key == "remote_url" and says in str(err)


@pytest.mark.parametrize(
    "url", ["redis://:hunter2@cache:6379", "redis+cluster://c0:1,u:hunter2@c1:2"]
)
def test_a_password_in_the_url_is_refused_and_not_echoed(url: str) -> None:
    err = _error({"remote_url": url})
    assert err.key == "remote_url" and "remote_password_file" in str(err)
    assert "hunter2" not in str(err)


def test_tls_follows_the_cluster_scheme() -> None:
    assert _cfg({"remote_url": "rediss+cluster://c0:1,c1:2"}).remote_tls_on
    assert not _cfg({"remote_url": "redis+cluster://c0:1"}).remote_tls_on


def test_password_comes_from_the_environment_and_is_not_shown() -> None:
    cfg = _cfg({"remote_url": "redis://c:1"}, env={"MINIFLEX_REMOTE_PASSWORD": "hunter2"})
    assert cfg.remote_secret() == "hunter2"
    assert "hunter2" not in repr(cfg) and "hunter2" not in str(cfg.public_dict())


def test_password_file_is_read_without_its_newline(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("hunter2\n")
    cfg = _cfg({"remote_url": "redis://c:1", "remote_password_file": str(secret)})
    assert cfg.remote_secret() == "hunter2"
    secret.write_text("")
    err = _error({"remote_url": "redis://c:1", "remote_password_file": str(secret)})
    assert err.key == "remote_password_file" and "empty" in str(err)
    missing = _error({"remote_url": "redis://c:1", "remote_password_file": str(tmp_path / "x")})
    assert "existing file" in str(missing)


def test_password_and_password_file_together_are_refused(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("a")
    extra = {"remote_url": "redis://c:1", "remote_password_file": str(secret)}
    err = _error(extra, env={"MINIFLEX_REMOTE_PASSWORD": "b"})
    assert err.key == "remote_password_file" and "only one" in str(err)


def test_credentials_without_a_url_would_be_ignored_so_they_are_refused() -> None:
    err = _error({}, env={"MINIFLEX_REMOTE_PASSWORD": "hunter2"})
    assert err.key == "remote_password" and "set remote_url" in str(err)
    assert "hunter2" not in str(err)
    assert _error({"remote_user": "mf"}).key == "remote_user"


def test_tls_is_on_by_flag_or_by_rediss_scheme(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    assert _cfg({"remote_url": "rediss://c:1"}).remote_tls_on
    assert _cfg({"remote_url": "redis://c:1", "remote_tls": "on"}).remote_tls_on
    err = _error({"remote_url": "redis://c:1", "remote_tls_ca_file": str(ca)})
    assert err.key == "remote_tls_ca_file" and "remote_tls=true" in str(err)


def test_client_certificate_needs_its_key(tmp_path: Path) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    err = _error({"remote_url": "rediss://c:1", "remote_tls_cert_file": str(cert)})
    assert err.key == "remote_tls_cert_file" and "together" in str(err)


@pytest.mark.parametrize(
    ("key", "value"),
    [("remote_timeout_s", 0), ("remote_timeout_s", "soon"), ("remote_retry_s", -1)],
)
def test_timeouts_are_bounded(key: str, value: object) -> None:
    err = _error({"remote_url": "redis://c:1", key: value})
    assert err.key == key and "expected seconds from" in str(err)


def test_prefix_must_be_a_plain_word() -> None:
    assert _cfg({"remote_url": "redis://c:1", "remote_prefix": "team-a.mf"}).remote_prefix
    assert _error({"remote_url": "redis://c:1", "remote_prefix": "a:b"}).key == "remote_prefix"


def test_fetch_streams_are_auto_by_default_or_a_count_from_1_to_64() -> None:
    from miniflex.remote.fetch import auto_fetch_streams

    assert _cfg({}).remote_fetch_streams is None
    assert _cfg({"remote_fetch_streams": "auto"}).remote_fetch_streams is None
    assert _cfg({"remote_fetch_streams": "8"}).remote_fetch_streams == 8
    for bad in ("0", "65", "many"):
        with pytest.raises(ConfigError, match="remote_fetch_streams"):
            _cfg({"remote_fetch_streams": bad})
    # auto: a quarter of the CPUs, 1 to 4
    assert [auto_fetch_streams(n) for n in (None, 1, 2, 7, 8, 16, 128)] == [1, 1, 1, 1, 2, 4, 4]
