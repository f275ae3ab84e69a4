"""The source arguments: exactly one source, or ``SourceError`` says what is missing."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from shadow_proxy.records import sources
from tests.support.record_sources import record, write


def arguments(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sources.add_arguments(parser)
    return parser.parse_args(list(argv))


class TestOpenSource:
    """The arguments name exactly one source, or ``SourceError`` says what is missing."""

    def test_files(self, tmp_path: Path) -> None:
        write(tmp_path / "a", record(0))
        source = sources.open_source(arguments(str(tmp_path)))
        assert isinstance(source, sources.FileSource) and not source.live

    async def test_live_tap(self) -> None:
        source = sources.open_source(arguments("--endpoint", "tcp://127.0.0.1:1", "--topic", "t"))
        assert isinstance(source, sources.TapSource)
        await source.aclose()

    @pytest.mark.parametrize(
        ("argv", "message"),
        [
            ((), "give one source"),
            (("x.mpk", "--topic", "t"), "got files and tap"),
            (("--topic", "t"), "needs --topic and --endpoint"),
            (("--discover", "http://127.0.0.1:1/shadow/taps"), "--discover needs --tap"),
            (("--nats", "nats://127.0.0.1:1", "--tap", "kv"), "--nats needs --tap NAME and"),
            (("--discover", "http://127.0.0.1:1/shadow/taps", "--tap", "kv"), "discovery failed"),
        ],
    )
    def test_errors(self, tmp_path: Path, argv: tuple[str, ...], message: str) -> None:
        with pytest.raises(sources.SourceError, match=message):
            sources.open_source(arguments(*argv))

    def test_nats_servers_repeated_or_comma_separated(self) -> None:
        """``--nats a,b`` was a raw ValueError traceback from the NATS client."""
        args = arguments(
            "--nats",
            "nats://a:4222,nats://b:4222",
            "--nats",
            "nats://c:4222",
            "--tap",
            "kv",
            "--durable",
            "d",
        )
        source = sources.open_source(args)
        assert source.servers == ["nats://a:4222", "nats://b:4222", "nats://c:4222"]
        assert source.live and not source.stop_at_end
        args = arguments(
            "--nats", "nats://a:4222", "--tap", "kv", "--durable", "d", "--stop-at-end"
        )
        batch = sources.open_source(args)
        assert batch.stop_at_end and not batch.live

    def test_stop_at_end_is_for_streams(self, tmp_path: Path) -> None:
        write(tmp_path / "a", record(0))
        with pytest.raises(sources.SourceError, match="--stop-at-end is for a JetStream stream"):
            sources.open_source(arguments(str(tmp_path), "--stop-at-end"))

    def test_missing_file(self, tmp_path: Path) -> None:
        with pytest.raises(sources.SourceError, match="no record file at"):
            sources.open_source(arguments(str(tmp_path / "absent")))
