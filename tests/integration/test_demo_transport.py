"""The demo's JetStream transport against a real nats-server (the pure parts:
tests/unit/devtools/demo/test_transport.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
import pytest
from nats.js import api

from shadow_proxy.devtools.demo import transport


@pytest.mark.nats
@pytest.mark.timeout(60)
class TestStreamOnAServer:
    """The demo's nats-server: the run's stream seen, deleted, and the exit status kept."""

    def test_exists_then_deleted(self, tmp_path: Path) -> None:
        statuses: dict[str, int] = {}

        async def scenario(urls: list[str]) -> list[bool]:
            seen = [await transport.stream_exists(urls, "DEMO_1")]
            nc = await nats.connect(servers=urls)
            try:
                await nc.jetstream().add_stream(
                    api.StreamConfig(name="DEMO_1", subjects=["shadow.>"])
                )
            finally:
                await nc.close()
            seen.append(await transport.stream_exists(urls, "DEMO_1"))
            await transport.delete_stream(urls, "DEMO_1")
            seen.append(await transport.stream_exists(urls, "DEMO_1"))
            return seen

        with transport.demo_nats_server(tmp_path, statuses) as urls:
            assert asyncio.run(scenario(urls)) == [False, True, False]
        assert statuses == {"nats-server": 0}

    def test_no_server_is_no_stream(self) -> None:
        from shadow_proxy.devtools.processes import reserve_port

        url = f"nats://127.0.0.1:{reserve_port()}"
        assert asyncio.run(transport.stream_exists([url], "DEMO_1")) is False
