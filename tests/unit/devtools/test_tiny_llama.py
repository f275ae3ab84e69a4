"""The tiny Llama model directories: servable layout, weights from a seed,
other seeds differ, noise stays small, a build with the same arguments is kept."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from shadow_proxy.devtools import tiny_llama


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("llamas")
    return {
        "base": tiny_llama.build_llama(root / "base"),
        "other": tiny_llama.build_llama(root / "other", seed=1),
        "noisy": tiny_llama.build_llama(root / "noisy", noise=(7, 0.05)),
        "tools": tiny_llama.build_llama(root / "tools", template="tools"),
    }


class TestBuild:
    """A checkpoint vLLM loads: config, weights of every layer, the template."""

    def test_layout(self, built: dict[str, Path]) -> None:
        names = {p.name for p in built["base"].iterdir()}
        assert {
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
        } <= names
        config = json.loads((built["base"] / "config.json").read_text())
        assert (config["head_dim"], config["vocab_size"], config["tie_word_embeddings"]) == (
            32,
            129280,
            False,
        )
        weights = load_file(str(built["base"] / "model.safetensors"))
        assert set(weights) == set(tiny_llama._shapes())
        assert weights["lm_head.weight"].dtype == np.float32

    def test_templates(self, built: dict[str, Path]) -> None:
        template = json.loads((built["tools"] / "tokenizer_config.json").read_text())[
            "chat_template"
        ]
        assert "<tool_call>" in template
        assert (
            "<tool_call>"
            not in json.loads((built["base"] / "tokenizer_config.json").read_text())[
                "chat_template"
            ]
        )


class TestWeights:
    """Seeds give other models; noise perturbs by about its scale."""

    def test_seed_and_noise(self, built: dict[str, Path]) -> None:
        base, other, noisy = (
            load_file(str(built[k] / "model.safetensors"))["lm_head.weight"]
            for k in ("base", "other", "noisy")
        )
        assert not np.allclose(base, other)
        relative = np.std(noisy - base) / np.std(base)
        assert 0.03 < relative < 0.07

    def test_rebuild_kept_and_deterministic(self, built: dict[str, Path], tmp_path: Path) -> None:
        weights = built["base"] / "model.safetensors"
        before = weights.stat().st_mtime_ns
        tiny_llama.build_llama(built["base"])
        assert weights.stat().st_mtime_ns == before
        again = tiny_llama.build_llama(tmp_path / "again")
        assert (again / "model.safetensors").read_bytes() == weights.read_bytes()
