"""Credentials from files or the environment, one kind at a time, TLS files;
no secret in what is shown."""

from __future__ import annotations

import argparse
import ssl
from pathlib import Path

import pytest

from shadow_proxy.records import nats_access
from shadow_proxy.records.errors import SourceError
from shadow_proxy.records.nats_access import NatsAccess

SECRET = "s3cret-Zq9"


def secret_file(tmp_path: Path, name: str = "secret") -> Path:
    path = tmp_path / name
    path.write_text(SECRET + "\n", encoding="utf-8")
    return path


def test_user_and_password_from_a_file(tmp_path: Path) -> None:
    access = NatsAccess(user="proxy", password_file=secret_file(tmp_path))
    assert access.connect_options() == {"user": "proxy", "password": SECRET}
    assert SECRET not in access.describe() and "proxy" in access.describe()


def test_token_from_the_environment() -> None:
    access = NatsAccess(token_env="NATS_TOKEN", environ={"NATS_TOKEN": SECRET})
    assert access.connect_options() == {"token": SECRET}
    assert SECRET not in access.describe() and "$NATS_TOKEN" in access.describe()
    with pytest.raises(SourceError, match="NATS_TOKEN is not set"):
        NatsAccess(token_env="NATS_TOKEN", environ={}).connect_options()


def test_nkey_seed_and_creds(tmp_path: Path) -> None:
    seed = secret_file(tmp_path, "seed.nk")
    assert NatsAccess(nkey_file=seed).connect_options() == {"nkeys_seed_str": SECRET}
    creds = secret_file(tmp_path, "user.creds")
    assert NatsAccess(creds_file=creds).connect_options() == {"user_credentials": str(creds)}


@pytest.mark.parametrize(
    ("access", "problem"),
    [
        (NatsAccess(user="u", token_env="T"), "one credential kind, not user and token"),
        (NatsAccess(user="u"), "a user needs a password"),
        (NatsAccess(password_env="P"), "a password needs a user"),
        (NatsAccess(cert_file=Path("c")), "a client certificate needs its key"),
        (NatsAccess(token_env="T", token_file=Path("t")), "not both"),
    ],
)
def test_combinations_refused(access: NatsAccess, problem: str) -> None:
    assert problem in (access.problem() or "")
    with pytest.raises(SourceError, match=problem):
        access.connect_options()


def test_unreadable_file_named_not_shown(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="absent") as caught:
        NatsAccess(user="u", password_file=tmp_path / "absent").connect_options()
    assert SECRET not in str(caught.value)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(SourceError, match="is empty"):
        NatsAccess(token_file=empty).connect_options()


def test_tls_context_and_bad_ca(tmp_path: Path) -> None:
    options = NatsAccess(ca_file=None, cert_file=None).connect_options()
    assert "tls" not in options
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate")
    with pytest.raises(SourceError, match="NATS TLS files"):
        NatsAccess(ca_file=bad).connect_options()
    assert isinstance(NatsAccess(ca_file=None).ssl_context(), ssl.SSLContext)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://user:pw@host:4222", "nats://host:4222"),
        ("tls://tok@host:4222", "tls://host:4222"),
        ("nats://host:4222", "nats://host:4222"),
    ],
)
def test_redact(url: str, shown: str) -> None:
    assert nats_access.redact(url) == shown


def test_flags(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    nats_access.add_arguments(parser.add_argument_group("nats"))
    password = secret_file(tmp_path)
    args = parser.parse_args(["--nats-user", "r", "--nats-password-file", str(password)])
    access = nats_access.from_arguments(args)
    assert access.connect_options()["password"] == SECRET
    assert args.nats_connect_budget == nats_access.DEFAULT_CONNECT_BUDGET_S
    with pytest.raises(SourceError, match="--nats-\\* flags: a user needs a password"):
        nats_access.from_arguments(parser.parse_args(["--nats-user", "r"]))
