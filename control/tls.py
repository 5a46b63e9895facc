"""The control plane's TLS material: its certificate and key, and the CA that signs workers' certificates.

:meth:`ServerTls.load` reads and checks the files once, at start-up, and says which variable is wrong
(``CORRAL_TLS_KEY is not the private key of CORRAL_TLS_CERT``). The same material serves:

* the gRPC port (server TLS; clients need no certificate),
* the worker port, only with ``CORRAL_TLS_CLIENT_CA``: mutual TLS, a worker's certificate must verify
  against that CA or the handshake fails (``control.api.server_credentials`` builds both),
* the HTTP port: HTTPS through :meth:`ServerTls.ssl_context` (aiohttp).

:class:`ContainerTls` is the other side, for the worker containers the docker autoscaler starts: the
CA they verify the control plane with and the client certificate they present on the worker port.

Why a worker port of its own: grpcio's ``ssl_server_credentials`` either requires and verifies a client
certificate or never asks for one (there is no "ask, verify if given"), and one port has one setting.
Requiring certificates on the main port would force one on every gRPC client; a second port asks only
workers, and the WorkerService accepts only calls whose TLS session carries a verified certificate.

Imports nothing from grpc (the configuration checks use it).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

__all__ = ["ContainerTls", "ServerTls", "TlsError"]


class TlsError(ValueError):
    """Raised when a TLS file cannot be read or is not what its variable says; the message names it."""


def _read(var: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise TlsError(f"{var} must be a readable file, got {path!r} ({exc.strerror or exc})") from None


def _check_certificates(var: str, path: str, data: bytes, what: str) -> None:
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=data.decode("ascii", "replace"))
    except (ssl.SSLError, ValueError):
        raise TlsError(f"{var} must hold {what}, got {path!r}") from None


def _check_pair(cert_var: str, cert: str, key_var: str, key: str) -> None:
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
    except (ssl.SSLError, ValueError):
        raise TlsError(f"{key_var} must be the unencrypted PEM private key of {cert_var}, got {key!r}") from None


@dataclass(frozen=True)
class ServerTls:
    """PEM bytes (for grpc) and paths (for ssl) of the server's certificate chain, key and client CA."""

    cert_path: str
    key_path: str
    cert_chain: bytes
    private_key: bytes
    client_ca: bytes | None = None
    """When set, workers must present a certificate this CA signed (on the worker port)."""

    @classmethod
    def load(cls, cert: str, key: str, client_ca: str = "") -> ServerTls:
        """Read and check CORRAL_TLS_CERT, CORRAL_TLS_KEY and CORRAL_TLS_CLIENT_CA.

        Raises:
            TlsError: a file is unreadable, not PEM, or the key does not belong to the certificate.
        """
        chain = _read("CORRAL_TLS_CERT", cert)
        private_key = _read("CORRAL_TLS_KEY", key)
        ca = _read("CORRAL_TLS_CLIENT_CA", client_ca) if client_ca else None
        _check_certificates("CORRAL_TLS_CERT", cert, chain, "PEM certificates")
        _check_pair("CORRAL_TLS_CERT", cert, "CORRAL_TLS_KEY", key)
        if ca is not None:
            _check_certificates("CORRAL_TLS_CLIENT_CA", client_ca, ca, "PEM CA certificates")
        return cls(cert, key, chain, private_key, ca)

    def ssl_context(self) -> ssl.SSLContext:
        """The HTTPS context of the HTTP port: this certificate, no client certificates asked."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert_path, self.key_path)
        return context


@dataclass(frozen=True)
class ContainerTls:
    """What the worker containers the autoscaler starts need to reach a TLS control plane (PEM bytes).

    ``ca`` verifies the control plane (the containers' CORRAL_TLS_CA); ``cert`` and ``key`` are the client
    certificate they present on the worker port (CORRAL_WORKER_TLS_CERT/KEY), empty when none is asked.
    """

    ca: bytes
    cert: bytes = b""
    key: bytes = b""

    @classmethod
    def load(cls, ca: str, cert: str = "", key: str = "") -> ContainerTls:
        """Read and check CORRAL_AUTOSCALE_TLS_CA, CORRAL_AUTOSCALE_TLS_CERT and CORRAL_AUTOSCALE_TLS_KEY.

        Raises:
            TlsError: a file is unreadable, not PEM, or the key does not belong to the certificate.
        """
        ca_pem = _read("CORRAL_AUTOSCALE_TLS_CA", ca)
        _check_certificates("CORRAL_AUTOSCALE_TLS_CA", ca, ca_pem, "PEM CA certificates")
        if not cert:
            return cls(ca_pem)
        cert_pem = _read("CORRAL_AUTOSCALE_TLS_CERT", cert)
        key_pem = _read("CORRAL_AUTOSCALE_TLS_KEY", key)
        _check_certificates("CORRAL_AUTOSCALE_TLS_CERT", cert, cert_pem, "PEM certificates")
        _check_pair("CORRAL_AUTOSCALE_TLS_CERT", cert, "CORRAL_AUTOSCALE_TLS_KEY", key)
        return cls(ca_pem, cert_pem, key_pem)
