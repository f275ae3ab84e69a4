"""Credentials for a real nats-server made in the test: a CA and certificates
(``cryptography``), NKeys (``nkeys``), an operator's JWTs and a ``.creds``
file (what ``nsc`` writes), and the server configuration with accounts and
least-privilege users: the proxy may publish only to the taps' subjects and
manage the stream; a reader may only consume its durable."""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import json
import os
import time
from pathlib import Path
from typing import Any

import attrs
import nkeys
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

STREAM = "SHADOW"


@attrs.frozen
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    #: A CA that signed nothing here: a client trusting it must refuse the server.
    other_ca: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _ca(directory: Path, common: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(_name(common))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
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
        .sign(key, hashes.SHA256())
    )
    (directory / f"{common}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert, key


def _leaf(
    directory: Path, name: str, ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey]
) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    alt = x509.SubjectAlternativeName(
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca[0].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(alt, critical=False)
        .sign(ca[1], hashes.SHA256())
    )
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, key_path)
    return cert_path, key_path


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca(directory, "ca")
    _ca(directory, "other-ca")
    server = _leaf(directory, "server", ca)
    client = _leaf(directory, "client", ca)
    return Pki(directory / "ca.pem", *server, *client, directory / "other-ca.pem")


def nkey_pair(prefix: int = nkeys.PREFIX_BYTE_USER) -> tuple[str, str]:
    """(seed, public key) of a new NKey."""
    seed = nkeys.encode_seed(os.urandom(32), prefix)
    public = nkeys.from_seed(bytearray(seed)).public_key.decode()
    return seed.decode(), public


def tls_block(pki: Pki, verify: bool = False) -> str:
    lines = [
        "tls {",
        f"  cert_file: {json.dumps(str(pki.server_cert))}",
        f"  key_file: {json.dumps(str(pki.server_key))}",
        f"  ca_file: {json.dumps(str(pki.ca))}",
        "  timeout: 2",
    ]
    if verify:
        lines.append("  verify: true")
    return "\n".join([*lines, "}"]) + "\n"


def proxy_permissions(subject_prefix: str = "shadow.>") -> dict[str, Any]:
    """The proxy publishes to the taps' subjects and manages its stream, nothing else."""
    return {
        "publish": {
            "allow": [
                subject_prefix,
                f"$JS.API.STREAM.INFO.{STREAM}",
                f"$JS.API.STREAM.CREATE.{STREAM}",
            ]
        },
        "subscribe": {"allow": ["_INBOX.>"]},
    }


def reader_permissions(durable: str) -> dict[str, Any]:
    """A reader consumes its durable (creates it, fetches, acknowledges), nothing else."""
    return {
        "publish": {
            "allow": [
                f"$JS.API.CONSUMER.INFO.{STREAM}.{durable}",
                f"$JS.API.CONSUMER.CREATE.{STREAM}.{durable}",
                f"$JS.API.CONSUMER.CREATE.{STREAM}.{durable}.>",
                f"$JS.API.CONSUMER.DURABLE.CREATE.{STREAM}.{durable}",
                f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{durable}",
                f"$JS.ACK.{STREAM}.{durable}.>",
                f"$JS.API.STREAM.INFO.{STREAM}",
            ]
        },
        "subscribe": {"allow": ["_INBOX.>"]},
    }


def accounts_config(users: list[dict[str, Any]]) -> str:
    """An account with JetStream and these users (``user``/``password`` or
    ``nkey``, each with ``permissions``); JSON is valid nats-server config."""
    return "accounts: " + json.dumps({"SHADOW": {"jetstream": "enabled", "users": users}}) + "\n"


# --- operator mode: JWTs and a .creds file --------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _jwt(claims: dict[str, Any], signer: nkeys.KeyPair) -> str:
    claims = {"iat": int(time.time()), **claims}
    digest = hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).digest()
    claims["jti"] = base64.b32encode(digest).decode().rstrip("=")
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = _b64(json.dumps(claims).encode())
    signature = signer.sign(f"{header}.{body}".encode())
    return f"{header}.{body}.{_b64(signature)}"


@attrs.frozen
class Operator:
    """An operator, an account with JetStream and a system account; users' creds."""

    config: str
    account_seed: str
    account_public: str

    def creds(self, path: Path, name: str, permissions: dict[str, Any]) -> Path:
        """A ``.creds`` file for a new user of the account, as ``nsc`` writes it."""
        seed, public = nkey_pair()
        account = nkeys.from_seed(bytearray(self.account_seed.encode()))
        pub = {"allow": permissions["publish"]["allow"]}
        sub = {"allow": permissions["subscribe"]["allow"]}
        user = _jwt(
            {
                "iss": self.account_public,
                "sub": public,
                "name": name,
                "nats": {
                    "type": "user",
                    "version": 2,
                    "pub": pub,
                    "sub": sub,
                    "subs": -1,
                    "data": -1,
                    "payload": -1,
                },
            },
            account,
        )
        path.write_text(
            "-----BEGIN NATS USER JWT-----\n"
            f"{user}\n"
            "------END NATS USER JWT------\n\n"
            "-----BEGIN USER NKEY SEED-----\n"
            f"{seed}\n"
            "------END USER NKEY SEED------\n",
            encoding="utf-8",
        )
        return path


def operator() -> Operator:
    op_seed, op_public = nkey_pair(nkeys.PREFIX_BYTE_OPERATOR)
    op = nkeys.from_seed(bytearray(op_seed.encode()))
    acct_seed, acct_public = nkey_pair(nkeys.PREFIX_BYTE_ACCOUNT)
    sys_seed, sys_public = nkey_pair(nkeys.PREFIX_BYTE_ACCOUNT)
    unlimited = {
        "subs": -1,
        "conn": -1,
        "leaf": -1,
        "imports": -1,
        "exports": -1,
        "data": -1,
        "payload": -1,
        "wildcards": True,
    }
    jetstream = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
    account = _jwt(
        {
            "iss": op_public,
            "sub": acct_public,
            "name": "SHADOW",
            "nats": {"type": "account", "version": 2, "limits": {**unlimited, **jetstream}},
        },
        op,
    )
    system = _jwt(
        {
            "iss": op_public,
            "sub": sys_public,
            "name": "SYS",
            "nats": {"type": "account", "version": 2, "limits": unlimited},
        },
        op,
    )
    op_jwt = _jwt(
        {
            "iss": op_public,
            "sub": op_public,
            "name": "OP",
            "nats": {"type": "operator", "version": 2, "system_account": sys_public},
        },
        op,
    )
    config = (
        f"operator: {op_jwt}\n"
        f"system_account: {sys_public}\n"
        "resolver: MEMORY\n"
        f"resolver_preload: {json.dumps({acct_public: account, sys_public: system})}\n"
    )
    return Operator(config, acct_seed, acct_public)
