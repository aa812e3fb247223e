"""``mooncake://`` URLs at config parse: the defaults they imply and readable errors for
the rest. No Mooncake process is needed."""

from __future__ import annotations

import sys

import pytest

from miniflex.config import MiniFlexConfig
from miniflex.config.mooncake_url import MooncakeTarget, parse_mooncake_url
from miniflex.errors import ConfigError
from miniflex.remote import open_remote_store
from tests.remote.conftest import NS_A


def _cfg(url: str, **more: str) -> MiniFlexConfig:
    return MiniFlexConfig.from_dict({"remote_url": url, **more}, env={})


def test_a_bare_master_address_takes_mooncakes_default_ports() -> None:
    assert _cfg("mooncake://10.0.0.5").remote_url == "mooncake://10.0.0.5"
    target = parse_mooncake_url("remote_url", "mooncake://10.0.0.5")
    assert target == MooncakeTarget(
        master_host="10.0.0.5",
        master_port=50051,
        metadata="http://10.0.0.5:8080/metadata",
        protocol="auto",
        devices="",
        local_hostname=None,
    )
    assert target.master == "10.0.0.5:50051"
    assert target.endpoints() == [("10.0.0.5", 50051), ("10.0.0.5", 8080)]


def test_options_name_the_metadata_server_the_transport_and_this_host() -> None:
    url = (
        "mooncake://master.internal:7000?metadata=http://meta.internal:9000/metadata"
        "&protocol=rdma&device=mlx5_0,mlx5_1&local_hostname=10.1.2.3"
    )
    target = parse_mooncake_url("remote_url", url)
    assert (target.master, target.metadata) == (
        "master.internal:7000",
        "http://meta.internal:9000/metadata",
    )
    assert (target.protocol, target.transport(), target.devices) == (
        "rdma",
        "rdma",
        "mlx5_0,mlx5_1",
    )
    assert target.hostname() == "10.1.2.3"
    p2p = parse_mooncake_url("remote_url", "mooncake://m:1?metadata=P2PHANDSHAKE&protocol=tcp")
    assert p2p.metadata == "P2PHANDSHAKE" and p2p.endpoints() == [("m", 1)]
    assert parse_mooncake_url("remote_url", "mooncake://m?metadata=etcd://e:2379").metadata == (
        "etcd://e:2379"
    )


def test_this_hosts_address_defaults_to_the_one_that_reaches_the_master() -> None:
    assert parse_mooncake_url("remote_url", "mooncake://127.0.0.1:1").hostname() == "127.0.0.1"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mooncake://", "expected mooncake://MASTER_HOST"),
        ("mooncake://m:99999", "the port must be a number"),
        ("mooncake://user:pw@m", "no credentials"),
        ("mooncake://m/db", "no path"),
        ("mooncake://m?protocol=udp", "protocol 'udp'"),
        ("mooncake://m?segment=1GB", "unknown option 'segment'"),
        ("mooncake://m?protocol=tcp&protocol=rdma", "given 2 times"),
        ("mooncake://m?metadata=meta:8080", "metadata='meta:8080'"),
        ("mooncake://m?metadata=http://meta/metadata", "give its port"),
        ("mooncake://m?protocol=tcp&device=mlx5_0", "not with protocol=tcp"),
        ("mooncake://m?protocol", "options are NAME=VALUE"),
    ],
)
def test_a_malformed_url_is_refused_at_parse_with_the_form_expected(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match="remote_url") as caught:
        _cfg(url)
    assert message in str(caught.value)
    assert "pw" not in str(caught.value)


@pytest.mark.parametrize(
    ("key", "value"), [("remote_user", "miniflex"), ("remote_password", "s3cret")]
)
def test_credentials_are_refused_for_mooncake(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"{key}.*no credentials or TLS") as caught:
        _cfg("mooncake://m", **{key: value})
    assert "s3cret" not in str(caught.value)


def test_a_missing_client_is_reported_with_the_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for module in ("mooncake", "mooncake.store"):  # as if the wheel were not installed
        monkeypatch.setitem(sys.modules, module, None)
    for module in ("miniflex.remote.mooncake_store", "miniflex.remote.mooncake_client"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ConfigError, match=r"mooncake-transfer-engine.*miniflex\[mooncake\]"):
        open_remote_store(_cfg("mooncake://127.0.0.1:1"), NS_A)
