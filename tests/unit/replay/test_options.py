"""The run's options: targets by name, the tokenizer --tokenizer names."""

from __future__ import annotations

from pathlib import Path

import pytest

from shadow_proxy.replay.options import ReplayOptions, load_tokenizer


def test_baseline_only_when_comparing(tmp_path: Path):
    both = ReplayOptions(candidate="http://a", out_dir=tmp_path, baseline="http://b")
    assert both.targets == {"candidate": "http://a", "baseline": "http://b"}
    load = ReplayOptions(candidate="http://a", out_dir=tmp_path, baseline="http://b", compare=False)
    assert load.targets == {"candidate": "http://a"}


def test_closed_loop_defaults(tmp_path: Path):
    o = ReplayOptions(candidate="http://a", out_dir=tmp_path)
    assert (o.closed_loop, o.warmup, o.warmup_s) == (False, 0, 0.0)


def test_tokenizer_must_exist(tmp_path: Path):
    with pytest.raises(ValueError, match="'--tokenizer' must name a tokenizer"):
        load_tokenizer(tmp_path)
