"""Test certificates, made on the spot with ``cryptography``: a CA, certificates it signs, files on disk.

:func:`make_pki` writes everything the TLS tests need into one folder::

    ca.pem                     the CA that signs the server's and the workers' certificates
    server.pem / server.key    the control plane: CN=corral-control, SAN DNS:localhost, IP:127.0.0.1
    worker.pem / worker.key    a worker's client certificate, signed by ca.pem
    rogue-ca.pem               another CA, which the control plane does not trust
    rogue.pem / rogue.key      a client certificate signed by rogue-ca.pem
    self.pem / self.key        a self-signed client certificate

Keys are P-256 (fast to make); certificates are valid from an hour ago for a day.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CertificateAuthority", "Pki", "make_pki"]


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _builder(subject: str, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


@dataclass(frozen=True)
class CertificateAuthority:
    """A CA key and its self-signed certificate; :meth:`issue` signs leaf certificates."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def create(cls, common_name: str) -> CertificateAuthority:
        key = _key()
        cert = (
            _builder(common_name, _name(common_name), key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert)

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, common_name: str, *, server: bool) -> tuple[bytes, bytes]:
        """A leaf certificate and its key (both PEM); ``server`` adds the localhost/127.0.0.1 names."""
        key = _key()
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            _builder(common_name, self.cert.subject, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server:
            names: list[x509.GeneralName] = [
                x509.DNSName("localhost"),
                x509.IPAddress(ipaddress.IPv4Address("127.0.0.1")),
            ]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


@dataclass(frozen=True)
class Pki:
    """Paths of the files :func:`make_pki` wrote."""

    ca: Path
    server_cert: Path
    server_key: Path
    worker_cert: Path
    worker_key: Path
    rogue_ca: Path
    rogue_cert: Path
    rogue_key: Path
    self_cert: Path
    self_key: Path


def _self_signed(common_name: str) -> tuple[bytes, bytes]:
    key = _key()
    cert = (
        _builder(common_name, _name(common_name), key.public_key())
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def make_pki(folder: Path) -> Pki:
    """Make a CA, a server and a worker certificate, a rogue CA with its client, and a self-signed client."""
    folder.mkdir(parents=True, exist_ok=True)
    ca = CertificateAuthority.create("corral test CA")
    rogue = CertificateAuthority.create("rogue CA")
    files: dict[str, bytes] = {"ca.pem": ca.pem, "rogue-ca.pem": rogue.pem}
    for stem, (cert, key) in {
        "server": ca.issue("corral-control", server=True),
        "worker": ca.issue("corral-worker", server=False),
        "rogue": rogue.issue("corral-worker", server=False),
        "self": _self_signed("corral-worker"),
    }.items():
        files[f"{stem}.pem"] = cert
        files[f"{stem}.key"] = key
    for name, data in files.items():
        path = folder / name
        path.write_bytes(data)
        if name.endswith(".key"):
            path.chmod(0o600)
    return Pki(
        ca=folder / "ca.pem",
        server_cert=folder / "server.pem",
        server_key=folder / "server.key",
        worker_cert=folder / "worker.pem",
        worker_key=folder / "worker.key",
        rogue_ca=folder / "rogue-ca.pem",
        rogue_cert=folder / "rogue.pem",
        rogue_key=folder / "rogue.key",
        self_cert=folder / "self.pem",
        self_key=folder / "self.key",
    )
