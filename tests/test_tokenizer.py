"""Model loading: ids come from tokenizer.json as written, as Dynamo encodes."""

from __future__ import annotations

import json
import shutil

from tokenizers import Tokenizer, normalizers

from shadow_proxy.worker.request.tokenizer import load_model


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
