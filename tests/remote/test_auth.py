"""Credentials and TLS against a real Redis: the right ones work, wrong ones are refused at
start-up with one clear line, and a user without permission is told what to grant."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from miniflex.config import MiniFlexConfig
from miniflex.errors import MiniFlexError, RemoteError
from miniflex.remote import open_remote_store
from miniflex.remote.local_server import LocalServer, ServerTLS
from tests.remote.certs import Certs, make_certs, openssl_missing
from tests.remote.conftest import CHUNK_BYTES, NEEDS_SERVER, key, payload, store

pytest.importorskip("redis", reason="the redis client is missing: pip install -e '.[remote]'")
ACL_RULES = pytest.importorskip("miniflex.remote.redis_store").ACL_RULES
pytestmark = NEEDS_SERVER


def _refusal(url: str, **options: object) -> str:
    with store(url, **options) as s, pytest.raises(RemoteError) as info:
        s.check()
    message = str(info.value)
    print(message)  # shown with -s: what an operator reads
    assert "\n" not in message  # one line in the start-up log
    return message


def test_the_right_password_works_and_a_wrong_one_is_refused(tmp_path: Path) -> None:
    with LocalServer(tmp_path, password="s3cret") as server:
        with store(server.url, password="s3cret") as s:
            assert s.check() and s.put(key(1), b"ok") and s.get(key(1)) == b"ok"
        wrong = _refusal(server.url, password="guess")
        assert "refused the credentials of user 'default'" in wrong
        assert "remote_password" in wrong and "guess" not in wrong
        assert "requires credentials and none are set" in _refusal(server.url)


def test_an_acl_user_works_and_wrong_credentials_name_the_user(tmp_path: Path) -> None:
    users = ["mf on >mfpass ~miniflex:* +@all", "default off"]
    with LocalServer(tmp_path, acl_users=users) as server:
        with store(server.url, user="mf", password="mfpass") as s:
            assert s.check() and s.put(key(1), b"ok") and s.get(key(1)) == b"ok"
        wrong = _refusal(server.url, user="mf", password="nope")
        assert "user 'mf'" in wrong and "remote_user" in wrong


def test_a_user_confined_to_other_keys_is_told_what_to_grant(tmp_path: Path) -> None:
    users = ["other on >pw ~elsewhere:* +@all"]
    with LocalServer(tmp_path, acl_users=users) as server:
        message = _refusal(server.url, user="other", password="pw")
        assert f"ACL SETUSER other ~miniflex:* {ACL_RULES}" in message


def test_the_granted_rules_are_all_a_user_needs(tmp_path: Path) -> None:
    users = [f"narrow on >pw ~miniflex:* {ACL_RULES}", "default off"]
    with (
        LocalServer(tmp_path, acl_users=users) as server,
        store(server.url, user="narrow", password="pw") as s,
    ):
        assert s.check() and s.put(key(1), b"ok") and s.get(key(1)) == b"ok"
        assert s.exists([key(1)]) == [True] and s.delete(key(1))
        assert s.stats().errors == 0


def test_a_read_only_user_cannot_pass_the_start_up_check(tmp_path: Path) -> None:
    users = ["reader on >pw ~miniflex:* +@read +ping"]
    with LocalServer(tmp_path, acl_users=users) as server:
        assert "may not write and read" in _refusal(server.url, user="reader", password="pw")


def test_the_config_password_file_reaches_the_server(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("from-a-file\n")
    with LocalServer(tmp_path / "srv", password="from-a-file") as server:
        extra = {"remote_url": server.url, "remote_password_file": str(secret)}
        with open_remote_store(MiniFlexConfig.from_dict(extra, env={}), bytes(16)) as s:  # type: ignore[union-attr]
            assert s.check()


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[LocalServer, Certs]]:
    """A server that speaks only TLS and verifies client certificates, and its certificates."""
    reason = openssl_missing()
    if reason:
        pytest.skip(reason)
    certs = make_certs(tmp_path / "certs")
    tls = ServerTLS(certs.server_cert, certs.server_key, certs.ca, auth_clients=True)
    server = LocalServer(tmp_path / "server", tls=tls)
    try:
        server.start()
    except MiniFlexError as exc:
        if "Bad directive" not in str(exc):
            raise
        pytest.skip(f"this redis-server was built without TLS: {exc}")
    yield server, certs
    server.kill()


def test_tls_with_a_verified_server_and_a_client_certificate(
    tls_server: tuple[LocalServer, Certs],
) -> None:
    server, certs = tls_server
    opts = {"tls_ca_file": certs.ca, "tls_cert_file": certs.client_cert}
    with store(server.url, tls=True, tls_key_file=certs.client_key, **opts) as s:
        data = payload(CHUNK_BYTES)
        assert s.check() and s.put(key(1), data) and s.get(key(1)) == data


def test_tls_refuses_a_server_signed_by_another_ca(
    tls_server: tuple[LocalServer, Certs], tmp_path: Path
) -> None:
    server, certs = tls_server
    other = make_certs(tmp_path / "other", name="other-ca")
    message = _refusal(
        server.url,
        tls=True,
        tls_ca_file=other.ca,
        tls_cert_file=certs.client_cert,
        tls_key_file=certs.client_key,
    )
    assert "TLS handshake failed" in message and "remote_tls_ca_file" in message


def test_tls_refuses_a_client_without_a_certificate(tls_server: tuple[LocalServer, Certs]) -> None:
    server, certs = tls_server
    message = _refusal(server.url, tls=True, tls_ca_file=certs.ca)
    assert "remote_tls_cert_file" in message
