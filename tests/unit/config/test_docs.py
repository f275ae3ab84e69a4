"""The keys' table and the example file are written from the keys' definitions:
both files in the repository are what the definitions write now, and the example
shows every key and loads."""

from __future__ import annotations

import re

from shadow_proxy.config import Config, docs
from shadow_proxy.config.keys import keys
from shadow_proxy.config.values import TapConfig

REWRITE = "run python -m shadow_proxy.config.docs"


class TestWritten:
    def test_the_example_file_is_what_the_definitions_write(self) -> None:
        assert docs.EXAMPLE.read_text(encoding="utf-8") == docs.example(), REWRITE

    def test_the_table_is_what_the_definitions_write(self) -> None:
        page = docs.TABLE_PAGE.read_text(encoding="utf-8")
        assert docs.page_with_table(page) == page, REWRITE


class TestExample:
    def test_it_loads(self) -> None:
        config = Config.from_yaml(docs.EXAMPLE)
        assert [t.name for t in config.taps] == ["kv-history-tracker", "shadow-replay"]

    def test_every_key_is_shown(self) -> None:
        text = docs.EXAMPLE.read_text(encoding="utf-8")
        shown = set(re.findall(r"^[#\s-]*([a-z_]+):", text, re.M))
        names = {f.name for cls in (Config, TapConfig) for f in keys(cls)}
        assert names - shown == set()


class TestTable:
    def test_a_row_per_key_with_its_doc(self) -> None:
        table = docs.table()
        assert "| `taps[].capture` | `request` \\| `request_response` | required |" in table
        assert "| `worker.max_rss_mb` | integer or null | `1024` |" in table
        assert "| `nats.servers` | list of strings | required |" in table
        assert "`shadow-requests-{name}`" in table
