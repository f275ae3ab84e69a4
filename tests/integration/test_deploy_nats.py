"""deploy/nats/accounts.conf, the example NATS server configuration (issue 31):
its users are the ones the JetStream overlay's proxy and readers (and the
live shadow's replayer) use, with the
least privilege tests/support/nats_auth.py grants (the proxy: publish to
shadow.> and manage SHADOW; a reader: consume its durables), and a real
nats-server runs with it: the proxy's records reach a reader, and a reader on
a durable of its own choosing is refused."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shadow_proxy.config import Config
from shadow_proxy.devtools.processes import wait_until
from tests.integration.test_deploy import (
    DEPLOY,
    JETSTREAM_OVERLAY,
    LIVE_OVERLAY,
    command_options,
    find,
    render,
)
from tests.support.jetstream import DirectPublisher
from tests.support.nats import started
from tests.support.nats_auth import proxy_permissions, reader_permissions

ACCOUNTS = DEPLOY / "nats" / "accounts.conf"
PASSWORDS = {"SHADOW_PROXY_PASSWORD": "proxy-Hq3", "SHADOW_READER_PASSWORD": "reader-Wm8"}


def accounts() -> dict[str, Any]:
    lines = [line for line in ACCOUNTS.read_text().splitlines() if not line.startswith("#")]
    text = re.sub(r":\s*\$([A-Z_]+)", r': "$\1"', "\n".join(lines))  # the variables
    text = text.replace("accounts:", "", 1)
    return json.loads(text)["SHADOW"]


def overlay() -> tuple[Config, list[dict[str, str]]]:
    objects = render(JETSTREAM_OVERLAY)
    text = find(objects, "ConfigMap", "shadow-proxy-config")["data"]["config.yaml"]
    pod = find(objects, "Deployment", "shadow-consumer-jetstream")["spec"]["template"]
    readers = [command_options(c["command"]) for c in pod["spec"]["containers"]]
    live = find(render(LIVE_OVERLAY), "Deployment", "shadow-replay-live")["spec"]["template"]
    readers += [command_options(c["command"]) for c in live["spec"]["containers"]]
    return Config.from_text(text), readers


def test_users_and_least_privilege() -> None:
    config, readers = overlay()
    users = {u["user"]: u for u in accounts()["users"]}
    assert config.nats is not None and config.nats.auth is not None
    proxy = users.pop(config.nats.auth.user)
    assert proxy["permissions"] == proxy_permissions()
    [reader_user] = {r["--nats-user"] for r in readers}
    reader = users.pop(reader_user)
    allowed: list[str] = []
    for durable in [r["--durable"] for r in readers]:
        allowed += [s for s in reader_permissions(durable)["publish"]["allow"] if s not in allowed]
    assert sorted(reader["permissions"]["publish"]["allow"]) == sorted(allowed)
    assert reader["permissions"]["subscribe"] == {"allow": ["_INBOX.>"]}
    assert users == {}, "no other user"


@pytest.mark.nats
@pytest.mark.timeout(120)
async def test_a_real_server_with_it(tmp_path: Path, monkeypatch) -> None:
    for name, value in PASSWORDS.items():
        monkeypatch.setenv(name, value)
    config, readers = overlay()
    extra = ACCOUNTS.read_text()  # as an include of it would: include takes relative paths
    with started(tmp_path / "nats", 1, extra_config=extra) as cluster:
        password = tmp_path / "proxy-password"
        password.write_text(PASSWORDS["SHADOW_PROXY_PASSWORD"])
        tap = readers[0]["--tap"]
        auth = {"user": config.nats.auth.user, "password_file": str(password)}
        publisher = DirectPublisher(cluster.urls, tap=tap, auth=auth)
        try:
            assert publisher.startup_problem(10) is None
            publisher.offer(5)
            await wait_until(lambda: publisher.queue.published == 5, timeout=20)
        finally:
            publisher.close()
        reader_password = tmp_path / "reader-password"
        reader_password.write_text(PASSWORDS["SHADOW_READER_PASSWORD"])

        def consumer(durable: str) -> subprocess.CompletedProcess[str]:
            argv = [
                sys.executable,
                "-m",
                "shadow_proxy.cli",
                "consumer",
                "--nats",
                cluster.urls[0],
                "--tap",
                tap,
                "--durable",
                durable,
                "--stop-at-end",
                "--nats-user",
                readers[0]["--nats-user"],
                "--nats-password-file",
                str(reader_password),
            ]
            return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)

        read = consumer(readers[0]["--durable"])
        assert read.returncode == 0 and json.loads(read.stdout)["records"] == 5, read.stderr
        other = consumer("mine")
        assert other.returncode == 2 and "permissions violation" in other.stderr, other.stderr
