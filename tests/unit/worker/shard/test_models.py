"""A shard's set-up: models with their prompt encoder and budget; one message's
failure counted and logged without its text."""

from __future__ import annotations

from shadow_proxy.config import Config
from shadow_proxy.worker.request.incremental import IncrementalEncoder
from shadow_proxy.worker.shard.models import load_models, tokenizer_families


def config(model_dirs, **worker) -> Config:
    return Config.from_mapping(
        {
            "schema_version": 1,
            "upstream": {"url": "http://127.0.0.1:1"},
            "models": [
                {"name": "deepseek", "tokenizer": str(model_dirs["deepseek"])},
                {"name": "chatml", "tokenizer": str(model_dirs["chatml"]), "context_length": 100},
            ],
            "worker": worker,
        }
    )


class TestModels:
    """Each model gets an incremental encoder (its share of the cache) and a budget."""

    def test_encoders_and_budgets(self, model_dirs) -> None:
        models = load_models(config(model_dirs, tokenizer_cache_bytes=1 << 20))
        for model in models.values():
            assert isinstance(model.prompt_encoder, IncrementalEncoder)
            assert model.prompt_encoder.fallback_reason is None
            assert model.prompt_encoder.cache.max_bytes == (1 << 20) // 2
        # The context length times 32 bytes, or the longest token's if fewer (chatml: 26).
        assert models["chatml"].max_prompt_bytes == 100 * 26
        assert models["deepseek"].max_prompt_bytes == 32768 * 32

    def test_cache_off_and_explicit_budget(self, model_dirs) -> None:
        models = load_models(config(model_dirs, tokenizer_cache_bytes=0, max_prompt_bytes=1000))
        assert all(m.prompt_encoder is None for m in models.values())
        assert all(m.turns is None for m in models.values())  # it resumes the encoder's scans
        assert all(m.max_prompt_bytes == 1000 for m in models.values())

    def test_turn_caches(self, model_dirs) -> None:
        models = load_models(config(model_dirs, turn_cache_bytes=1 << 20))
        assert all(m.turns.max_bytes == (1 << 20) // 2 for m in models.values())
        models = load_models(config(model_dirs, turn_cache_bytes=0))
        assert all(m.turns is None for m in models.values())

    def test_tokenizer_metrics(self, model_dirs) -> None:
        models = load_models(config(model_dirs))
        models["deepseek"].prompt_encoder.encode("hello there")
        families = {f[0]: f[3] for f in tokenizer_families(models)}
        encoded = [
            value
            for _, labels, value in families["shadow_tokenizer_tokens"]
            if labels == {"model": "deepseek", "source": "encoded"}
        ]
        assert encoded == [2]
        assert {s[2] for s in families["shadow_tokenizer_incremental_processes"]} == {1}
