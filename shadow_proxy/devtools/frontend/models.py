"""The served models: tokenizer, chat template, prompt counts, the output cycle.

``ServedModel.load`` runs once per model at start-up (slow: transformers reads
the tokenizer config); afterwards a model is read-only except for its bounded
prompt-count cache, touched from the event loop only. Guarantees: a prompt is
counted as a Dynamo frontend counts it (chat: the model's own template with
the generation prompt, then tokenizer.json as written, without special
tokens; completions: a string encoded as it is, token ids counted as they
are), and a request the template cannot render is a ``MockRequestError``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2
from tokenizers import Tokenizer

from shadow_proxy.devtools.frontend.config import MockConfig, MockRequestError
from shadow_proxy.worker.request.tokenizer import template_environment

#: The output text: every choice cycles over this sentence's tokens.
OUTPUT_SENTENCE = "The quick brown fox jumps over the lazy dog, and the shadow keeps pace. "
#: Bound of the per-model prompt-count cache (entries are rendered prompt texts).
PROMPT_CACHE_SIZE = 1024


def compile_chat_template(source: str) -> jinja2.Template:
    """Compile a chat template in the environment Hugging Face renders it in
    (the proxy's own: sandboxed, trim and lstrip blocks, loop controls, a
    ``tojson`` that keeps non-ASCII, ``raise_exception`` and ``strftime_now``)."""
    return template_environment().from_string(source)


def _context_length(directory: Path) -> int | None:
    path = directory / "config.json"
    if not path.exists():
        return None
    value = json.loads(path.read_text(encoding="utf-8"))
    length = value.get("max_position_embeddings") if isinstance(value, dict) else None
    return length if isinstance(length, int) and length > 0 else None


class ServedModel:
    """One served model: its tokenizer, compiled chat template and the
    pre-encoded output tokens. Built once at start-up; read-only afterwards
    except for the bounded prompt-count cache."""

    def __init__(
        self,
        name: str,
        tokenizer: Tokenizer,
        chat_template: str | None,
        special_tokens: Mapping[str, Any],
        context_length: int | None,
    ) -> None:
        self.name = name
        self.tokenizer = tokenizer
        self.template = compile_chat_template(chat_template) if chat_template else None
        self.special_tokens = dict(special_tokens)
        self.context_length = context_length
        self.name_json = json.dumps(name)
        special_ids = set(tokenizer.get_added_tokens_decoder())
        ids = [
            i
            for i in tokenizer.encode(OUTPUT_SENTENCE, add_special_tokens=False).ids
            if i not in special_ids
        ]
        #: The output cycle: token ids, their texts, and each text as a JSON literal.
        self.output_ids: tuple[int, ...] = tuple(ids)
        self.output_texts: tuple[str, ...] = tuple(tokenizer.decode([i]) for i in ids)
        self.output_json: tuple[bytes, ...] = tuple(
            json.dumps(t).encode() for t in self.output_texts
        )
        #: Rendered prompt text -> token count; insertion-ordered, oldest evicted
        #: first. Touched only from the event loop.
        self._counts: dict[str, int] = {}

    @classmethod
    def load(cls, name: str, directory: Path | str) -> ServedModel:
        """Load a model directory as the proxy does: chat template and special
        tokens through ``transformers.AutoTokenizer``, the encoder from
        tokenizer.json exactly as written (Dynamo encodes with that; the
        AutoTokenizer backend may swap in a model family's own pre-tokenizer,
        e.g. for ``model_type: qwen2``, and then count differently)."""
        from transformers import AutoTokenizer

        directory = Path(directory)
        if not (directory / "tokenizer.json").exists():
            msg = f"model {name!r}: no tokenizer.json in {str(directory)!r}"
            raise ValueError(msg)
        hf = AutoTokenizer.from_pretrained(str(directory))
        template = hf.chat_template if isinstance(hf.chat_template, str) else None
        specials = dict(hf.special_tokens_map)
        encoder = Tokenizer.from_file(str(directory / "tokenizer.json"))
        return cls(name, encoder, template, specials, _context_length(directory))

    def encode_count(self, text: str) -> int:
        """Token count of ``text`` without special tokens (thread-safe, uncached)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def cached_count(self, text: str) -> int | None:
        """The remembered count of ``text``, if any (event loop only)."""
        return self._counts.get(text)

    def remember_count(self, text: str, count: int) -> None:
        """Remember a count; the oldest entry goes past ``PROMPT_CACHE_SIZE``."""
        counts = self._counts
        if len(counts) >= PROMPT_CACHE_SIZE:
            del counts[next(iter(counts))]
        counts[text] = count

    def chat_prompt_text(self, body: Mapping[str, Any]) -> str:
        """The prompt text of a chat request, rendered as the engine would see it."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            msg = "'messages' must be a non-empty list"
            raise MockRequestError(msg)
        if not all(isinstance(m, dict) for m in messages):
            msg = "each message must be an object"
            raise MockRequestError(msg)
        if self.template is None:
            msg = f"model {self.name!r} has no chat template"
            raise MockRequestError(msg)
        kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, dict):
            msg = "'chat_template_kwargs' must be an object"
            raise MockRequestError(msg)
        # As Hugging Face does: keys whose value is None are dropped from messages.
        messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
        try:
            text = self.template.render(
                messages=messages,
                tools=body.get("tools"),
                documents=None,
                add_generation_prompt=True,
                **{**self.special_tokens, **kwargs},
            )
        except (jinja2.TemplateError, TypeError, ValueError) as exc:
            msg = f"chat template failed: {exc}"
            raise MockRequestError(msg) from exc
        return text

    def completion_prompts(self, prompt: object) -> list[str | int]:
        """The prompts of a completions request, one per prompt (a list of
        strings or of token-id lists is a batch): a text to encode, or the
        length of a token-id prompt."""
        if isinstance(prompt, str):
            return [prompt]
        if isinstance(prompt, list) and prompt:
            if all(isinstance(t, int) for t in prompt):
                return [len(prompt)]
            if all(isinstance(p, str) for p in prompt):
                return list(prompt)
            if all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in prompt):
                return [len(p) for p in prompt]
        msg = "'prompt' must be a string, a list of token ids, or a list of either"
        raise MockRequestError(msg)

    def output_text(self, count: int, diverge_at: int | None = None) -> str:
        """The text of the first ``count`` output tokens of the cycle; from
        position ``diverge_at`` on, one token of the cycle is skipped."""
        if diverge_at is not None and diverge_at < count:
            cycle = self.output_texts
            return self.output_text(diverge_at) + "".join(
                cycle[(step + 1) % len(cycle)] for step in range(diverge_at, count)
            )
        cycle = self.output_texts
        full, rest = divmod(count, len(cycle))
        return "".join(cycle) * full + "".join(cycle[:rest])


def load_models(config: MockConfig) -> dict[str, ServedModel]:
    """Load every model the config names (slow: do it once)."""
    return {name: ServedModel.load(name, path) for name, path in config.models.items()}
