"""Model loading: ids come from tokenizer.json as written, as Dynamo encodes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from tokenizers import Tokenizer, normalizers

from shadow_proxy.devtools import modeldirs
from shadow_proxy.worker.request.tokenizer import ModelLoadError, checksum, load_model


class TestEncodeFollowsTokenizerJson:
    """transformers may replace a family's pre-tokenizer; the proxy must not."""

    def test_qwen2_model_type_does_not_change_ids(self, model_dirs, tmp_path):
        model_dir = tmp_path / "odd"
        shutil.copytree(model_dirs["chatml"], model_dir)
        # A tokenizer.json whose normalizer differs from Qwen2's (no NFC).
        backend = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        backend.normalizer = normalizers.Sequence([])
        backend.save(str(model_dir / "tokenizer.json"))
        config = json.loads((model_dir / "config.json").read_text())
        assert config["model_type"] == "qwen2"

        model = load_model("odd", str(model_dir))
        text = "cafe\u0301 nai\u0308ve"  # decomposed accents: NFC would compose them
        as_written = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        assert model.encode(text) == as_written.encode(text, add_special_tokens=False).ids
        via_transformers = model.tokenizer.encode(text, add_special_tokens=False)
        assert via_transformers != model.encode(text), "the trap this test guards is gone"


class TestModelLoading:
    """Loading reads EOS ids, context length and a stable checksum from the model directory."""

    def test_eos_ids_are_the_ordered_union(self, loaded):
        assert loaded["deepseek"].eos_token_ids == (1,)
        tok = loaded["chatml"].tokenizer
        ids = (tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>"))
        assert loaded["chatml"].eos_token_ids == ids

    def test_context_length_from_config_unless_given(self, model_dirs, loaded):
        assert loaded["deepseek"].context_length == modeldirs.DEEPSEEK_CONTEXT_LENGTH
        assert loaded["chatml"].context_length == modeldirs.CHATML_CONTEXT_LENGTH
        assert load_model("c", str(model_dirs["chatml"]), 100).context_length == 100

    def test_checksum_is_stable_and_differs_between_models(self, model_dirs, loaded):
        assert loaded["chatml"].mdc_sum == checksum(model_dirs["chatml"])
        assert len(loaded["chatml"].mdc_sum) == 16
        assert loaded["chatml"].mdc_sum != loaded["deepseek"].mdc_sum

    def test_missing_directory_says_so_without_network(self, tmp_path):
        with pytest.raises(ModelLoadError, match="absent for model 'm' does not exist"):
            load_model("m", str(tmp_path / "absent"), None)
        with pytest.raises(ModelLoadError, match="point `tokenizer` at a local"):
            load_model("m", "no-such-org/no-such-model", None)


class TestWithoutTransformers:
    """The worker reads a minijinja model's files itself, as Dynamo does:
    importing transformers and loading its tokenizer cost every shard about
    2 s of CPU at start-up. What it reads equals what transformers reads."""

    def test_a_shard_never_imports_transformers(self, model_dirs):
        code = (
            "import sys\n"
            "from shadow_proxy.worker.request.tokenizer import load_model\n"
            f"model = load_model('m', {str(model_dirs['deepseek'])!r})\n"
            "assert model.chat_template.render({'messages': [{'role': 'user', 'content': 'x'}]})\n"
            "print('transformers' in sys.modules)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        assert done.stdout.strip() == "False", done.stderr[-2000:]

    @pytest.mark.parametrize("name", ["deepseek", "chatml"])
    def test_eos_and_context_as_transformers_reads_them(self, model_dirs, name, tmp_path):
        model = load_model(name, str(model_dirs[name]))
        tok = model.tokenizer  # transformers', loaded on first use
        assert model.eos_token_ids[0] == tok.eos_token_id
        # Without config.json's length, tokenizer_config.json's model_max_length counts.
        bare = tmp_path / name
        shutil.copytree(model_dirs[name], bare)
        (bare / "config.json").write_text("{}")
        assert load_model(name, str(bare)).context_length == tok.model_max_length

    def test_eos_from_special_tokens_map(self, model_dirs, tmp_path):
        """A tokenizer_config.json without ``eos_token``: special_tokens_map.json's."""
        bare = tmp_path / "chatml"
        shutil.copytree(model_dirs["chatml"], bare)
        config = json.loads((bare / "tokenizer_config.json").read_text())
        eos = config.pop("eos_token")
        (bare / "tokenizer_config.json").write_text(json.dumps(config))
        (bare / "special_tokens_map.json").write_text(json.dumps({"eos_token": {"content": eos}}))
        model = load_model("chatml", str(bare))
        assert model.eos_token_ids[0] == model.backend.token_to_id(eos)
        assert model.eos_token_ids[0] == model.tokenizer.eos_token_id

    def test_a_jinja2_model_without_transformers_says_what_to_install(
        self, model_dirs, monkeypatch
    ):
        """The lean image has no transformers: a ``jinja2`` model is a plain
        load error (exit 2 at start-up) naming the full image and the extra."""
        monkeypatch.setitem(sys.modules, "transformers", None)  # import fails
        with pytest.raises(ModelLoadError, match=r"needs transformers.*shadow-proxy\[jinja2\]"):
            load_model("m", str(model_dirs["chatml"]), template_engine="jinja2")

    def test_no_tokenizer_json(self, model_dirs, tmp_path):
        bare = tmp_path / "slow"
        shutil.copytree(model_dirs["chatml"], bare)
        (bare / "tokenizer.json").unlink()
        with pytest.raises(ModelLoadError, match=r"has no fast \(tokenizer.json\) version"):
            load_model("slow", str(bare))
