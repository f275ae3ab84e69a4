"""A demo run's taps over ZeroMQ or JetStream, and the run's stream on a real nats-server."""

from __future__ import annotations

import argparse

import pytest

from shadow_proxy.devtools.demo import transport
from shadow_proxy.devtools.reference_taps import TAP_NAMES
from shadow_proxy.records import sources


class TestZeroMQ:
    """Each tap on its own loopback endpoint; consumers subscribe before the proxy starts."""

    def test_endpoints_and_sources(self) -> None:
        taps = transport.zmq_taps()
        endpoints = [t["endpoint"] for t in taps.taps]
        assert len(set(endpoints)) == 2 and all(e.startswith("tcp://127.0.0.1:") for e in endpoints)
        for tap in taps.taps:
            assert taps.sources[tap["name"]] == [
                "--endpoint",
                tap["endpoint"],
                "--topic",
                tap["topic"],
            ]
        assert taps.consumers_first and taps.stream is None and taps.config == {}


class TestJetStream:
    """One stream per run; each consumer reads its tap with a durable of its own."""

    def test_taps_and_sources(self) -> None:
        taps = transport.nats_taps(["nats://a:1", "nats://b:2"], 2)
        assert taps.stream == "DEMO_2" and not taps.consumers_first
        assert taps.config == {
            "nats": {
                "servers": ["nats://a:1", "nats://b:2"],
                "stream": "DEMO_2",
                "max_bytes": 2**30,
            },
        }
        assert [(t["name"], t["transport"], "endpoint" in t) for t in taps.taps] == [
            (name, "nats", False) for name in TAP_NAMES
        ]

    @pytest.mark.parametrize("name", TAP_NAMES)
    def test_the_consumer_reads_the_tap_subject(self, name: str) -> None:
        """The source the consumer opens reads the subject the proxy publishes to."""
        taps = transport.nats_taps(["nats://a:1"], 1)
        parser = argparse.ArgumentParser()
        sources.add_arguments(parser)
        source = sources.open_source(parser.parse_args(taps.sources[name]))
        assert (source.stream, source.tap, source.durable) == ("DEMO_1", name, f"demo-{name}")
        assert source.subject == f"shadow.{name}"
