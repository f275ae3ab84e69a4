"""Reading a source for ``shadow-trace``: every request collected, the counts said
in one line, nothing-to-do said why, and a progress line only on a terminal."""

from __future__ import annotations

import asyncio
import io

from shadow_proxy.records import sources
from shadow_proxy.trace import reading
from shadow_proxy.trace.selection import Selection
from tests.support.trace_records import envelope, write_records


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _collect(path, **limits):
    selection = Selection()
    source = sources.FileSource([path])

    async def go():
        await source.open()
        try:
            return await reading.collect(
                source,
                selection,
                max_records=limits.get("max_records"),
                duration_s=limits.get("duration_s"),
            )
        finally:
            await source.aclose()

    requests, acks = asyncio.run(go())
    return selection, requests, acks


class TestCollect:
    def test_every_request_with_token_ids_and_no_acks_from_a_file(self, tmp_path):
        path = write_records(tmp_path / "r.bin", [envelope(0, [1, 2]), envelope(1, None)])
        selection, requests, acks = _collect(path)
        assert [r.token_ids.tolist() for r in requests] == [[1, 2]]
        assert acks == []  # a file has nothing to acknowledge
        assert "2 records, 1 used, 1 without token ids skipped" in reading.summary_line(
            selection, 0
        )

    def test_max_records_stops_reading(self, tmp_path):
        path = write_records(tmp_path / "r.bin", [envelope(i, [i + 1]) for i in range(5)])
        selection, requests, _ = _collect(path, max_records=2)
        assert selection.records == 2 and len(requests) == 2


class TestNothingToDo:
    def test_says_why(self, tmp_path):
        empty = Selection()
        assert reading.nothing_to_do(empty, 0) == "no records in the source"
        assert reading.nothing_to_do(empty, 3) == "no records in the source (3 unreadable entries)"
        path = write_records(tmp_path / "r.bin", [envelope(0, None)])
        selection, _, _ = _collect(path)
        assert "no request with token ids" in (reading.nothing_to_do(selection, 0) or "")

    def test_nothing_to_say_when_there_is_work(self, tmp_path):
        path = write_records(tmp_path / "r.bin", [envelope(0, [1])])
        selection, _, _ = _collect(path)
        assert reading.nothing_to_do(selection, 0) is None


class TestProgress:
    def test_drawn_on_a_terminal_once_due_and_ended_with_a_newline(self, tmp_path):
        path = write_records(tmp_path / "r.bin", [envelope(0, [1])])
        selection, _, _ = _collect(path)
        out = _Terminal()
        progress = reading.Progress(out, sources.FileSource([path]))
        progress.tick(selection)
        assert out.getvalue() == ""  # not due yet
        progress.next = 0.0
        progress.tick(selection)
        progress.done()
        line = out.getvalue()
        assert line.startswith("\rshadow-trace: 1 records, 1 used") and line.endswith("\n")

    def test_never_drawn_into_a_pipe(self, tmp_path):
        path = write_records(tmp_path / "r.bin", [envelope(0, [1])])
        selection, _, _ = _collect(path)
        out = io.StringIO()
        progress = reading.Progress(out, sources.FileSource([path]))
        progress.next = 0.0
        progress.tick(selection)
        progress.done()
        assert out.getvalue() == ""
