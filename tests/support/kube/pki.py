"""A throwaway certificate authority for the real control plane in tests.

A real API server authenticates clients by certificate (or token) and serves TLS only, and so
do Kueue's webhooks; kubeadm and envtest make a CA per cluster for the same reason. Keys are
ECDSA P-256: generating one takes milliseconds where RSA 2048 takes tenths of a second, and
every component accepts them (the service-account signer included, as ES256).

Client identities are the ones the bootstrap RBAC policy binds: ``system:masters`` for the
admin, ``system:kube-controller-manager``, ``system:kube-scheduler``, and
``system:node:<name>`` in ``system:nodes`` for a kubelet (the Node authorizer's subject).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID = dt.timedelta(days=7)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its key, written as ``<stem>.crt`` and ``<stem>.key``."""

    cert: Path
    key: Path


class Authority:
    """The CA of one control plane; its files live in ``root`` (the control plane's DIR)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._key = _key()
        start = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(_name("jupyter-mn-test-ca"))
            .issuer_name(_name("jupyter-mn-test-ca"))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + _VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert = root / "ca.crt"
        self.cert.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def serving(self, stem: str, hosts: list[str]) -> KeyPair:
        """A server certificate for ``hosts`` (IP addresses and DNS names)."""
        sans: list[x509.GeneralName] = []
        for host in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                sans.append(x509.DNSName(host))
        return self._issue(stem, _name(hosts[0]), ExtendedKeyUsageOID.SERVER_AUTH, sans)

    def client(self, stem: str, user: str, group: str | None = None) -> KeyPair:
        """A client certificate: the API server reads the user from CN, groups from O."""
        return self._issue(stem, _name(user, group), ExtendedKeyUsageOID.CLIENT_AUTH, [])

    def _issue(
        self,
        stem: str,
        subject: x509.Name,
        usage: x509.ObjectIdentifier,
        sans: list[x509.GeneralName],
    ) -> KeyPair:
        key = _key()
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._cert.not_valid_before_utc)
            .not_valid_after(self._cert.not_valid_after_utc)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        pair = KeyPair(self.root / f"{stem}.crt", self.root / f"{stem}.key")
        pair.cert.write_bytes(
            builder.sign(self._key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
        )
        pair.key.write_bytes(_pem_key(key))
        pair.key.chmod(0o600)
        return pair


def signing_key(root: Path) -> KeyPair:
    """The service-account token signer: private key and public key (not a certificate)."""
    key = _key()
    pair = KeyPair(root / "sa.pub", root / "sa.key")
    pair.key.write_bytes(_pem_key(key))
    pair.key.chmod(0o600)
    pair.cert.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pair
