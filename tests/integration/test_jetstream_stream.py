"""The stream check against a real nats-server (the subjects: the unit test)."""

from __future__ import annotations

import logging

import nats
import nats.errors
import pytest

from shadow_proxy.config.nats import NatsConfig
from shadow_proxy.devtools.nats_server import nats_server_binary
from shadow_proxy.devtools.processes import Child, reserve_port, wait_until
from shadow_proxy.worker.main.publishers.jetstream_stream import (
    ensure_stream,
)

pytestmark = pytest.mark.timeout(60)

SUBJECTS = ["shadow.kv", "shadow.kv.heartbeat"]


async def _connect(url: str) -> nats.NATS | None:
    """A connection to ``url``, or None while nothing answers there."""
    try:
        return await nats.connect(url, connect_timeout=1, allow_reconnect=False)
    except (nats.errors.Error, OSError, TimeoutError):
        return None


class TestEnsure:
    """Create the stream if missing, else check it covers the subjects."""

    async def test_created_then_found(self, nats_server, caplog) -> None:
        config = NatsConfig(servers=tuple(nats_server.urls), max_bytes=2**20)
        nc = await nats.connect(nats_server.urls)
        try:
            js = nc.jetstream(timeout=5)
            check = await ensure_stream(js, config, SUBJECTS)
            assert check.ok and check.created
            info = await js.stream_info("SHADOW")
            assert info.config.subjects == ["shadow.>"] and info.config.max_bytes == 2**20
            with caplog.at_level(logging.WARNING):
                again = await ensure_stream(js, NatsConfig(servers=config.servers), SUBJECTS)
            assert again.ok and not again.created
            assert "max_bytes is 1048576, the configuration says" in caplog.text
        finally:
            await nc.close()

    async def test_existing_stream_that_does_not_cover(self, nats_server) -> None:
        config = NatsConfig(servers=tuple(nats_server.urls))
        nc = await nats.connect(nats_server.urls)
        try:
            js = nc.jetstream(timeout=5)
            await js.add_stream(name="SHADOW", subjects=["shadow.*"])
            check = await ensure_stream(js, config, SUBJECTS)
        finally:
            await nc.close()
        assert (check.ok, check.reason) == (False, "subjects")
        assert check.problem == (
            "JetStream stream 'SHADOW' has subjects ['shadow.*'], which do not cover "
            "['shadow.kv.heartbeat']: add them to the stream (nats stream edit) or change "
            "the taps' 'subject' or 'nats.stream'"
        )

    async def test_refused_when_another_stream_takes_the_subjects(self, nats_server) -> None:
        """JetStream will not create a second stream on ``shadow.>``: the check says
        so, with the server's reason, and the problem is fatal (start-up stops)."""
        config = NatsConfig(servers=tuple(nats_server.urls), stream="MINE")
        nc = await nats.connect(nats_server.urls)
        try:
            js = nc.jetstream(timeout=5)
            await js.add_stream(name="OTHER", subjects=["shadow.>"])
            check = await ensure_stream(js, config, SUBJECTS)
        finally:
            await nc.close()
        assert (check.ok, check.reason, check.fatal) == (False, "refused", True)
        assert check.problem.startswith(
            "JetStream refused to create stream 'MINE' with subjects ['shadow.>']: "
        )
        assert "overlap" in check.problem  # the server's own words

    async def test_refused_for_want_of_storage(self, nats_server) -> None:
        """Issue 31: ``max_bytes`` past the server's store is err_code 10047, a
        ServerError (500), which was logged as 'JetStream did not answer' every
        10 s for ever: the server did answer. It is a refusal, with the reason."""
        config = NatsConfig(servers=tuple(nats_server.urls), max_bytes=64 * 2**40)
        nc = await nats.connect(nats_server.urls)
        try:
            check = await ensure_stream(nc.jetstream(timeout=5), config, SUBJECTS)
        finally:
            await nc.close()
        assert (check.ok, check.reason, check.fatal) == (False, "refused", True)
        assert "insufficient storage resources" in check.problem, check.problem
        assert "err_code 10047" in check.problem and "lower 'nats.max_bytes'" in check.problem

    async def test_no_jetstream_answer(self, tmp_path) -> None:
        """A NATS server without JetStream: the check says it is unavailable."""
        port = reserve_port()
        argv = [str(nats_server_binary()), "-a", "127.0.0.1", "-p", str(port)]
        with Child("plain-nats", argv, tmp_path, merge_output=True) as child:
            url = f"nats://127.0.0.1:{port}"
            nc = await wait_until(lambda: _connect(url), timeout=10, children=[child])
            try:
                check = await ensure_stream(
                    nc.jetstream(timeout=1), NatsConfig(servers=(url,)), SUBJECTS
                )
            finally:
                await nc.close()
        assert (check.ok, check.reason) == (False, "unavailable")
        assert check.problem.startswith("JetStream did not answer about stream 'SHADOW'")
