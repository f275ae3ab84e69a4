"""One demo run's parts in this process: its configuration, and the waits that
decide the taps and the consumers have caught up. (A whole run, with its
processes: tests/integration/test_demo.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from shadow_proxy.config import Config
from shadow_proxy.devtools.demo import run
from shadow_proxy.devtools.demo.runs import RunOptions
from shadow_proxy.devtools.demo.transport import nats_taps, zmq_taps
from shadow_proxy.devtools.reference_taps import TAP_NAMES
from tests.support.servers import serve


def _options(tmp_path: Path) -> RunOptions:
    return RunOptions(
        "t",
        requests=1,
        concurrency=1,
        isl=8,
        osl=2,
        stream=True,
        cancel_fraction=0.0,
        model="deepseek",
        tokenizer=tmp_path,
    )


def test_run_config_is_the_reference_taps_on_the_run_endpoints(tmp_path: Path) -> None:
    taps = zmq_taps()
    config = Config.from_mapping(run.run_config(_options(tmp_path), "http://f:1", 8123, taps))
    endpoints = [t["endpoint"] for t in taps.taps]
    assert [(t.name, t.endpoint) for t in config.taps] == list(
        zip(TAP_NAMES, endpoints, strict=True)
    )
    assert config.listen.port == 8123 and config.upstream.url == "http://f:1"
    assert [(m.name, m.tokenizer) for m in config.models] == [("deepseek", str(tmp_path))]
    assert config.shutdown_grace_s == 5
    assert config.nats is None


def test_run_config_on_jetstream(tmp_path: Path) -> None:
    """Each tap publishes to the run's stream; the nats section names the server."""
    taps = nats_taps(["nats://127.0.0.1:4222"], 3)
    config = Config.from_mapping(run.run_config(_options(tmp_path), "http://f:1", 8123, taps))
    assert [(t.name, t.transport, t.subject) for t in config.taps] == [
        (name, "nats", f"shadow.{name}") for name in TAP_NAMES
    ]
    assert list(config.nats.servers) == ["nats://127.0.0.1:4222"]
    assert (config.nats.stream, config.nats.max_bytes) == ("DEMO_3", 2**30)


def test_consumer_argv_keeps_the_records(tmp_path: Path) -> None:
    taps = zmq_taps()
    argv = run.consumer_argv(taps, "shadow-replay", tmp_path / "s.json", tmp_path / "r.rec")
    assert argv[argv.index("consumer") + 1 :][:4] == taps.sources["shadow-replay"]
    assert argv[argv.index("--record") + 1] == str(tmp_path / "r.rec")
    assert argv[argv.index("--summary-path") + 1] == str(tmp_path / "s.json")


class TestTapsSettled:
    """Settled once every tap assigned a seq to every request and emptied its queue."""

    @pytest.mark.parametrize(
        ("listing", "settled"),
        [
            ({"taps": [{"name": "kv"}]}, False),  # the worker's counters not relayed yet
            ({"taps": [{"name": "kv", "next_seq": 2, "published": 2, "queue_depth": 0}]}, False),
            ({"taps": [{"name": "kv", "next_seq": 3, "published": 2, "queue_depth": 1}]}, False),
            ({"taps": [{"name": "kv", "next_seq": 3, "published": 2, "queue_depth": 0}]}, False),
            (
                {
                    "taps": [
                        {
                            "name": "kv",
                            "next_seq": 3,
                            "published": 2,
                            "queue_depth": 0,
                            "dropped": {"full": 1},
                        }
                    ]
                },
                True,
            ),
            ({"taps": [{"name": "kv", "next_seq": 3, "published": 3, "queue_depth": 0}]}, True),
        ],
    )
    async def test_settled(self, listing: dict[str, Any], settled: bool) -> None:
        async def taps(_request: web.Request) -> web.Response:
            return web.json_response(listing)

        app = web.Application()
        app.router.add_get("/shadow/taps", taps)
        async with serve(app) as url, aiohttp.ClientSession() as session:
            found = await run.taps_settled(session, url, sent=3)
        assert (found == listing["taps"]) if settled else found is None


def summary(path: Path, records: int, last_beat: int | None) -> None:
    beat = None if last_beat is None else {"next_seq": last_beat}
    path.write_text(json.dumps({"records": records, "publishers": [{"last_heartbeat": beat}]}))


class TestConsumersSettled:
    """Done when each consumer holds every record, or saw the final heartbeat and
    waited out its grace; otherwise it says so and counts what arrived."""

    async def test_every_record_arrived(self, tmp_path: Path, capsys) -> None:
        summary(tmp_path / "a.json", 5, 5)
        await run.consumers_settled({"a": tmp_path / "a.json"}, {"a": 5}, [])
        assert capsys.readouterr().err == ""

    async def test_a_loss_seen_through_the_final_heartbeat(
        self, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(run, "CONSUMER_GRACE_S", 0.05)
        summary(tmp_path / "a.json", 4, 5)
        await run.consumers_settled({"a": tmp_path / "a.json"}, {"a": 5}, [])
        assert capsys.readouterr().err == ""

    async def test_nothing_settles(self, tmp_path: Path, capsys, monkeypatch) -> None:
        monkeypatch.setattr(run, "SETTLE_TIMEOUT_S", 0.2)
        summary(tmp_path / "a.json", 4, 4)  # behind, and no final heartbeat yet
        await run.consumers_settled({"a": tmp_path / "a.json"}, {"a": 5}, [])
        assert "the consumers catching up: not within" in capsys.readouterr().err
