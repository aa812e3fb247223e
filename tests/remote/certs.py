"""A throwaway CA and certificates for the TLS tests, made with the ``openssl`` command."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Certs", "make_certs", "openssl_missing"]

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def openssl_missing() -> str | None:
    """Why certificates cannot be made here, or None."""
    return None if shutil.which("openssl") else "the openssl command is not installed"


@dataclass(frozen=True)
class Certs:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


def _run(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _signed(directory: Path, name: str, ca: Path, ca_key: Path, san: str) -> tuple[str, str]:
    key, csr, cert, ext = (directory / f"{name}.{x}" for x in ("key", "csr", "pem", "ext"))
    _run("req", *_EC, "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}")
    ext.write_text(f"subjectAltName={san}\n")
    _run(
        "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-days", "2", "-out", str(cert), "-extfile", str(ext),
    )  # fmt: skip
    return str(cert), str(key)


def make_certs(directory: Path, name: str = "ca") -> Certs:
    """A CA named ``name``, a server certificate for 127.0.0.1 and a client certificate."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = directory / f"{name}.pem", directory / f"{name}.key"
    _run(
        "req", "-x509", *_EC, "-keyout", str(ca_key), "-out", str(ca), "-days", "2",
        "-subj", f"/CN=MiniFlex test {name}",
    )  # fmt: skip
    server = _signed(directory, "server", ca, ca_key, "IP:127.0.0.1")
    client = _signed(directory, "client", ca, ca_key, "DNS:miniflex-client")
    return Certs(str(ca), *server, *client)
