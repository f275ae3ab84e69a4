"""The local model directories: built without a download, complete, deterministic,
rebuilt only when their version changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from shadow_proxy.devtools import modeldirs

FILES = {"tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json"}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return modeldirs.build_all(tmp_path_factory.mktemp("models"))


class TestBuild:
    """Each directory has the Hugging Face layout, a chat template and its EOS ids."""

    @pytest.mark.parametrize("name", ["deepseek", "chatml"])
    def test_layout(self, built: dict[str, Path], name: str) -> None:
        assert {p.name for p in built[name].iterdir()} >= FILES
        config = json.loads((built[name] / "tokenizer_config.json").read_text())
        assert "{{" in config["chat_template"] or "{%" in config["chat_template"]

    def test_context_lengths(self, built: dict[str, Path]) -> None:
        lengths = {
            name: json.loads((path / "config.json").read_text())["max_position_embeddings"]
            for name, path in built.items()
        }
        assert lengths == {
            "deepseek": modeldirs.DEEPSEEK_CONTEXT_LENGTH,
            "chatml": modeldirs.CHATML_CONTEXT_LENGTH,
        }

    def test_chatml_has_two_eos_ids_of_its_specials(self, built: dict[str, Path]) -> None:
        tokenizer = Tokenizer.from_file(str(built["chatml"] / "tokenizer.json"))
        eos = json.loads((built["chatml"] / "generation_config.json").read_text())["eos_token_id"]
        assert eos == [tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")]

    def test_the_two_families_differ(self, built: dict[str, Path]) -> None:
        templates = {
            name: json.loads((path / "tokenizer_config.json").read_text())["chat_template"]
            for name, path in built.items()
        }
        assert "<|im_start|>" in templates["chatml"]
        assert "<|im_start|>" not in templates["deepseek"]


class TestRebuild:
    """A second build leaves a built directory alone; a new version rebuilds it."""

    def test_deterministic_and_idempotent(self, tmp_path: Path, built: dict[str, Path]) -> None:
        again = modeldirs.build_all(tmp_path)
        for name in ("deepseek", "chatml"):
            assert (again[name] / "tokenizer.json").read_bytes() == (
                built[name] / "tokenizer.json"
            ).read_bytes()
        before = (again["chatml"] / "tokenizer.json").stat().st_mtime_ns
        modeldirs.build_all(tmp_path)
        assert (again["chatml"] / "tokenizer.json").stat().st_mtime_ns == before

    def test_an_old_version_is_rebuilt(self, tmp_path: Path) -> None:
        paths = modeldirs.build_all(tmp_path)
        (paths["chatml"] / ".shadow-proxy-version").write_text("0")
        (paths["chatml"] / "tokenizer.json").write_text("{}")
        modeldirs.build_all(tmp_path)
        assert Tokenizer.from_file(str(paths["chatml"] / "tokenizer.json")).get_vocab_size() > 256

    def test_main(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        assert modeldirs.main([str(tmp_path)]) == 0
        assert capsys.readouterr().out.splitlines() == [
            f"deepseek: {tmp_path / 'deepseek'}",
            f"chatml: {tmp_path / 'chatml'}",
        ]
