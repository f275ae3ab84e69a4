"""NATS with accounts, least-privilege users and TLS (issue 31), against a real
nats-server: the proxy's publisher and ``shadow-consumer --nats`` (a real
process) with each credential kind (user and password, NKey seed, token,
``.creds``), TLS checked against a CA made here, mutual TLS; and the
refusals, each one clear line and exit 2, no traceback: anonymous, wrong
password, wrong CA, a reader touching a durable it may not. No secret shows
in any output or log."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pyarrow.parquet as pq
import pytest

from shadow_proxy.devtools.nats_server import NatsCluster
from shadow_proxy.devtools.processes import wait_until
from tests.support.jetstream import DirectPublisher
from tests.support.nats import started
from tests.support.nats_auth import (
    Pki,
    accounts_config,
    make_pki,
    nkey_pair,
    operator,
    proxy_permissions,
    reader_permissions,
    tls_block,
)

pytestmark = [pytest.mark.nats, pytest.mark.timeout(180)]

TAP = "direct"
RECORDS = 12
PROXY_PASSWORD = "proxy-pw-Q7xv1"
READER_PASSWORD = "reader-pw-K2mz8"
TOKEN = "token-Zr91Lq"


@attrs.frozen
class Secured:
    cluster: NatsCluster
    pki: Pki
    files: Path
    secrets: tuple[str, ...]

    @property
    def url(self) -> str:
        return self.cluster.urls[0]

    def secret_file(self, name: str, value: str) -> Path:
        path = self.files / name
        path.write_text(value + "\n", encoding="utf-8")
        return path


@pytest.fixture
def accounts(tmp_path: Path) -> Iterator[Secured]:
    """One server: an account with the proxy's user, a reader's user and a
    reader's NKey, each with least privilege; TLS with a certificate of our CA."""
    pki = make_pki(tmp_path / "pki")
    seed, public = nkey_pair()
    nkey_reader = reader_permissions("nk")  # and a second durable, for shadow-trace
    nkey_reader["publish"]["allow"] += reader_permissions("nkt")["publish"]["allow"]
    users = [
        {"user": "proxy", "password": PROXY_PASSWORD, "permissions": proxy_permissions()},
        {"user": "reader", "password": READER_PASSWORD, "permissions": reader_permissions("rd")},
        {"nkey": public, "permissions": nkey_reader},
        # A proxy's user that may publish to another tap's subject only.
        {
            "user": "narrow",
            "password": PROXY_PASSWORD,
            "permissions": proxy_permissions("shadow.another-tap"),
        },
    ]
    files = tmp_path / "files"
    files.mkdir()
    (files / "reader.nk").write_text(seed + "\n")
    config = accounts_config(users) + tls_block(pki)
    with started(tmp_path / "nats", 1, extra_config=config) as cluster:
        yield Secured(cluster, pki, files, (PROXY_PASSWORD, READER_PASSWORD, seed))


def publish(secured: Secured, count: int = RECORDS, **access) -> DirectPublisher:
    publisher = DirectPublisher([secured.url], tap=TAP, **access)
    assert publisher.startup_problem(10) is None
    publisher.offer(count)
    return publisher


def consumer(secured: Secured, durable: str, *flags: str) -> subprocess.CompletedProcess[str]:
    argv = [
        sys.executable,
        "-m",
        "shadow_proxy.cli",
        "--log-level",
        "warning",
        "consumer",
        "--nats",
        secured.url,
        "--tap",
        TAP,
        "--durable",
        durable,
        "--stop-at-end",
        "--nats-connect-budget",
        "8",
        *flags,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def trace(
    secured: Secured, durable: str, out: Path, *flags: str
) -> subprocess.CompletedProcess[str]:
    """``shadow-trace export --format parquet`` of the stream (another reader)."""
    code = "from shadow_proxy.trace.cli import main; raise SystemExit(main())"
    argv = [
        sys.executable,
        "-c",
        code,
        "export",
        "--nats",
        secured.url,
        "--tap",
        TAP,
        "--durable",
        durable,
        "--stop-at-end",
        "--format",
        "parquet",
        "-o",
        str(out),
        *flags,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def assert_no_secret(secured: Secured, *texts: str) -> None:
    for text in texts:
        for secret in secured.secrets:
            assert secret not in text, f"a secret in: {text[:200]}"


def records_read(run: subprocess.CompletedProcess[str]) -> int:
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    return json.loads(run.stdout)["records"]


def assert_refused(run: subprocess.CompletedProcess[str], cause: str) -> None:
    assert run.returncode == 2, (run.returncode, run.stderr)
    assert "Traceback" not in run.stderr + run.stdout, run.stderr
    lines = [
        line for line in run.stderr.splitlines() if not line.startswith(("reading ", "records="))
    ]
    assert len(lines) == 1 and cause in lines[0], run.stderr


class TestAccountsAndTls:
    """User and password and NKey, over TLS verified against the test's CA."""

    async def test_records_flow_and_refusals(self, accounts: Secured, caplog) -> None:
        ca = str(accounts.pki.ca)
        password = accounts.secret_file("proxy-password", PROXY_PASSWORD)
        with caplog.at_level(logging.INFO):
            publisher = publish(
                accounts,
                auth={"user": "proxy", "password_file": str(password)},
                tls={"ca_file": ca},
            )
            try:
                await wait_until(lambda: publisher.queue.published == RECORDS, timeout=20)
            finally:
                publisher.close()
        reader_password = str(accounts.secret_file("reader-password", READER_PASSWORD))
        by_user = consumer(
            accounts,
            "rd",
            "--nats-user",
            "reader",
            "--nats-password-file",
            reader_password,
            "--nats-ca",
            ca,
        )
        assert records_read(by_user) == RECORDS
        by_nkey = consumer(
            accounts, "nk", "--nats-nkey", str(accounts.files / "reader.nk"), "--nats-ca", ca
        )
        assert records_read(by_nkey) == RECORDS
        parquet = accounts.files / "capture.parquet"
        # The same user's second durable: least privilege names the durables it may read.
        exported = trace(
            accounts,
            "nkt",
            parquet,
            "--nats-nkey",
            str(accounts.files / "reader.nk"),
            "--nats-ca",
            ca,
        )
        assert exported.returncode == 0, exported.stderr
        assert pq.ParquetFile(parquet).metadata.num_rows == RECORDS

        anonymous = consumer(accounts, "rd", "--nats-ca", ca)
        assert_refused(anonymous, "authorization violation")
        wrong = accounts.secret_file("wrong", "not-the-password")
        bad_password = consumer(
            accounts,
            "rd",
            "--nats-user",
            "reader",
            "--nats-password-file",
            str(wrong),
            "--nats-ca",
            ca,
        )
        assert_refused(bad_password, "authorization violation")
        wrong_ca = consumer(
            accounts,
            "rd",
            "--nats-user",
            "reader",
            "--nats-password-file",
            reader_password,
            "--nats-ca",
            str(accounts.pki.other_ca),
        )
        assert_refused(wrong_ca, "TLS verification failed")
        elsewhere = consumer(
            accounts,
            "not-mine",
            "--nats-user",
            "reader",
            "--nats-password-file",
            reader_password,
            "--nats-ca",
            ca,
        )
        assert_refused(elsewhere, "permissions violation")
        trace_refused = trace(accounts, "nkt", parquet, "--nats-ca", ca)
        assert trace_refused.returncode == 2 and "authorization violation" in trace_refused.stderr
        assert "Traceback" not in trace_refused.stderr
        runs = (
            by_user,
            by_nkey,
            anonymous,
            bad_password,
            wrong_ca,
            elsewhere,
            exported,
            trace_refused,
        )
        assert_no_secret(accounts, caplog.text, *(r.stdout + r.stderr for r in runs))

    async def test_proxy_refused_keeps_serving_and_counts(self, accounts: Secured, caplog) -> None:
        """A publisher with the wrong password: one line with the cause, counted,
        no secret; the link goes on (records wait in the queue)."""
        wrong = accounts.secret_file("proxy-wrong", "not-the-password")
        with caplog.at_level(logging.WARNING):
            publisher = DirectPublisher(
                [accounts.url],
                tap=TAP,
                auth={"user": "proxy", "password_file": str(wrong)},
                tls={"ca_file": str(accounts.pki.ca)},
            )
            try:
                publisher.startup_problem(2)
                await wait_until(lambda: publisher.link.stats.refusals > 0, timeout=20)
            finally:
                publisher.close()
        assert "refused: authorization violation" in caplog.text, caplog.text
        assert "Traceback" not in caplog.text
        assert_no_secret(accounts, caplog.text)

    async def test_proxy_publishing_where_it_may_not(self, accounts: Secured, caplog) -> None:
        """It logged 'JetStream: connection: Error' (the class name, no cause)."""
        password = accounts.secret_file("narrow-password", PROXY_PASSWORD)
        with caplog.at_level(logging.WARNING):
            publisher = DirectPublisher(
                [accounts.url],
                tap=TAP,
                auth={"user": "narrow", "password_file": str(password)},
                tls={"ca_file": str(accounts.pki.ca)},
            )
            try:
                assert publisher.startup_problem(10) is None
                publisher.offer(3)
                await wait_until(lambda: publisher.link.stats.refusals > 0, timeout=20)
            finally:
                publisher.close()
        assert "refused: permissions violation" in caplog.text, caplog.text
        assert "shadow.shadow-requests-direct" in caplog.text, caplog.text
        assert_no_secret(accounts, caplog.text)


@pytest.fixture
def token_mtls(tmp_path: Path) -> Iterator[Secured]:
    """A server with a token and mutual TLS (client certificates verified)."""
    pki = make_pki(tmp_path / "pki")
    config = "authorization { token: " + json.dumps(TOKEN) + " }\n" + tls_block(pki, verify=True)
    files = tmp_path / "files"
    files.mkdir()
    with started(tmp_path / "nats", 1, extra_config=config) as cluster:
        yield Secured(cluster, pki, files, (TOKEN,))


class TestTokenAndMutualTls:
    async def test_records_flow(self, token_mtls: Secured, caplog) -> None:
        pki = token_mtls.pki
        token = str(token_mtls.secret_file("token", TOKEN))
        tls = {
            "ca_file": str(pki.ca),
            "cert_file": str(pki.client_cert),
            "key_file": str(pki.client_key),
        }
        with caplog.at_level(logging.INFO):
            publisher = publish(token_mtls, auth={"token_file": token}, tls=tls)
            try:
                await wait_until(lambda: publisher.queue.published == RECORDS, timeout=20)
            finally:
                publisher.close()
        flags = ("--nats-token-file", token, "--nats-ca", str(pki.ca))
        mutual = ("--nats-cert", str(pki.client_cert), "--nats-key", str(pki.client_key))
        run = consumer(token_mtls, "readers", *flags, *mutual)
        assert records_read(run) == RECORDS
        no_cert = consumer(token_mtls, "readers", *flags)
        assert no_cert.returncode == 2 and "Traceback" not in no_cert.stderr, no_cert.stderr
        assert_no_secret(token_mtls, caplog.text, run.stderr, run.stdout, no_cert.stderr)


@pytest.fixture
def operator_mode(tmp_path: Path) -> Iterator[tuple[Secured, Path, Path]]:
    """A server in operator mode (JWTs), and .creds files for the proxy and a reader."""
    op = operator()
    files = tmp_path / "files"
    files.mkdir()
    proxy = op.creds(files / "proxy.creds", "proxy", proxy_permissions())
    reader = op.creds(files / "reader.creds", "reader", reader_permissions("creds"))
    seeds = tuple(
        line
        for path in (proxy, reader)
        for line in path.read_text().splitlines()
        if line.startswith("SU")
    )
    with started(tmp_path / "nats", 1, extra_config=op.config) as cluster:
        yield Secured(cluster, make_pki(tmp_path / "pki"), files, seeds), proxy, reader


class TestCreds:
    async def test_records_flow(self, operator_mode, caplog) -> None:
        secured, proxy, reader = operator_mode
        with caplog.at_level(logging.INFO):
            publisher = publish(secured, auth={"creds_file": str(proxy)})
            try:
                await wait_until(lambda: publisher.queue.published == RECORDS, timeout=20)
            finally:
                publisher.close()
        run = consumer(secured, "creds", "--nats-creds", str(reader))
        assert records_read(run) == RECORDS
        assert_no_secret(secured, caplog.text, run.stdout, run.stderr)
