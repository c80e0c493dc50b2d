"""A throwaway certificate authority for the TLS tests, made with ``cryptography``.

:func:`make_pki` writes, under a directory: ``ca.pem`` (a self-signed CA), ``server.pem`` /
``server.key`` (for ``127.0.0.1`` and ``localhost``, signed by the CA), ``client.pem`` /
``client.key`` (a client certificate signed by the CA), and ``stranger.pem`` / ``stranger.key``
(a client certificate of another CA, which no listener may take). Keys are PKCS#8 PEM, what
granian reads.
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

from luftpause.testkit.launch.stack import StackTls


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path

    def stack_tls(self, mutual: bool = False) -> StackTls:
        return StackTls(
            cert=self.server_cert,
            key=self.server_key,
            ca=self.ca,
            client_cert=self.client_cert if mutual else None,
            client_key=self.client_key if mutual else None,
        )


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return path


def _ca(name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(
    ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate, name: str, server: bool
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return key, builder.sign(ca_key, hashes.SHA256())


def make_pki(directory: Path) -> Pki:
    """A CA, a server certificate, a client certificate and a stranger's, as PEM files."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca = _ca("luftpause test CA")
    (directory / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths = {}
    for name, server in (("server", True), ("client", False)):
        key, cert = _leaf(ca_key, ca, f"luftpause test {name}", server)
        (directory / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        paths[name] = (directory / f"{name}.pem", _write_key(key, directory / f"{name}.key"))
    other_key, other = _ca("someone else's CA")
    key, cert = _leaf(other_key, other, "stranger", False)
    (directory / "stranger.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    stranger_key = _write_key(key, directory / "stranger.key")
    return Pki(
        ca=directory / "ca.pem",
        server_cert=paths["server"][0],
        server_key=paths["server"][1],
        client_cert=paths["client"][0],
        client_key=paths["client"][1],
        stranger_cert=directory / "stranger.pem",
        stranger_key=stranger_key,
    )
