"""What a shard sets up once: its models (each with an exact incremental prompt
encoder and its prompt-bytes budget) and their tokenizer metrics. Runs in a shard
(``worker/shard/loop.py``).
"""

from __future__ import annotations

import logging
from typing import Any

import attrs

from shadow_proxy.channel.families import Family
from shadow_proxy.config import Config
from shadow_proxy.worker.budget import Budget, longest_token_bytes
from shadow_proxy.worker.request.incremental import IncrementalEncoder
from shadow_proxy.worker.request.tokenizer import LoadedModel, ModelLoadError, load_model
from shadow_proxy.worker.request.turn_cache import TurnCache

log = logging.getLogger(__name__)

TOKENS = "shadow_tokenizer_tokens_total"
INCREMENTAL = "shadow_tokenizer_incremental_processes"


def tokenizer_families(models: dict[str, LoadedModel]) -> list[Family]:
    """Incremental tokenization, per model: tokens encoded vs reused, cache bytes
    (read from the encoders when a report is made)."""
    tokens: list[list[Any]] = []
    cache: list[list[Any]] = []
    incremental: list[list[Any]] = []
    for name, model in models.items():
        encoder = model.prompt_encoder
        if encoder is None:
            continue
        encoded, per_model = encoder.encoded_tokens, {"model": name}
        tokens.append([TOKENS, {**per_model, "source": "encoded"}, encoded])
        tokens.append(
            [TOKENS, {**per_model, "source": "reused"}, encoder.returned_tokens - encoded]
        )
        cache.append(["shadow_tokenizer_cache_bytes", per_model, encoder.cache.size_bytes])
        incremental.append([INCREMENTAL, per_model, 0 if encoder.fallback_reason else 1])
    return [
        [
            "shadow_tokenizer_tokens",
            "counter",
            "Prompt tokens returned, by source: encoded by the tokenizer, or reused "
            "(cached segments and added tokens).",
            tokens,
        ],
        ["shadow_tokenizer_cache_bytes", "gauge", "Bytes held by the prompt segment cache.", cache],
        [
            INCREMENTAL,
            "gauge",
            "Processes encoding prompts incrementally (0: the tokenizer is not provably "
            "segmentable, every prompt is encoded in full).",
            incremental,
        ],
    ]


def load_models(config: Config) -> dict[str, LoadedModel]:
    """The configured models, each with its prompt encoder and prompt-bytes budget."""
    worker = config.worker
    budget = Budget(worker.max_prompt_bytes, worker.max_decoded_bytes, worker.max_request_cpu_s)
    cache_bytes = worker.tokenizer_cache_bytes // max(1, len(config.models))
    turn_bytes = worker.turn_cache_bytes // max(1, len(config.models))
    models = {}
    for index, entry in enumerate(config.models):
        try:
            model = load_model(
                entry.name,
                entry.tokenizer,
                entry.context_length,
                template_engine=entry.template_engine,
            )
        except ModelLoadError as e:
            msg = f"{config.where(f'models[{index}].tokenizer')}: {e}"
            raise ModelLoadError(msg) from e
        encoder = None
        if cache_bytes > 0:
            encoder = IncrementalEncoder.for_tokenizer(model.backend, cache_bytes)
            if model.chat_template is not None:
                encoder.learn_answer_gap(model.chat_template.render)
            if encoder.fallback_reason:
                log.warning(
                    "model %r: prompts encoded in full (%s)", entry.name, encoder.fallback_reason
                )
        limit = budget.prompt_bytes(model.context_length, longest_token_bytes(model.backend))
        turns = TurnCache(turn_bytes) if turn_bytes > 0 and encoder is not None else None
        models[entry.name] = attrs.evolve(
            model, prompt_encoder=encoder, max_prompt_bytes=limit, turns=turns
        )
    return models
