"""Model loading: the tokenizer, chat template, EOS ids and context length of one model.

The chat template is rendered by the engine the model's frontend uses
(``template_engine``: ``minijinja`` as Dynamo, ``jinja2`` as vLLM and SGLang);
see ``templates/``.

Pure module (no aiohttp, no zmq). Runs at start-up of the tap worker. Nothing here
touches the network unless the caller passes ``allow_hub=True``: a ``tokenizer``
that is not a local directory is looked up in the local Hugging Face cache only,
and a miss is a ``ModelLoadError`` with a plain message, never a hang.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import attrs

from shadow_proxy.worker.request.pre_tokenizer import APPLIED, faster_pre_tokenizer
from shadow_proxy.worker.request.templates import (
    ChatTemplate,
    TemplateLoadError,
    load_chat_template,
    read_json,
    token_text,
)
from shadow_proxy.worker.request.templates.jinja2_env import template_environment

__all__ = ["LoadedModel", "ModelLoadError", "checksum", "load_model", "template_environment"]

log = logging.getLogger(__name__)

#: Files whose bytes make up ``mdc_sum``, in this order (those that exist).
CHECKSUM_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "config.json",
    "generation_config.json",
)
#: Files fetched from the hub when ``allow_hub`` is set.
_HUB_PATTERNS = [*CHECKSUM_FILES, "special_tokens_map.json", "chat_template.jinja", "*.model"]
#: ``config.json`` keys that hold the context length, first match wins.
_CONTEXT_KEYS = ("max_position_embeddings", "max_seq_len", "n_positions")
#: Larger ``model_max_length`` values are transformers' "unset" sentinel (1e30).
_SANE_MODEL_MAX_LENGTH = 10_000_000


class ModelLoadError(ValueError):
    """A model from the configuration cannot be loaded; the message says why."""


@attrs.frozen
class LoadedModel:
    """One model, ready to preprocess requests. Immutable once loaded."""

    name: str
    #: The compiled chat template (``render(request) -> str``), or None when the
    #: model has none.
    chat_template: ChatTemplate | None
    eos_token_ids: tuple[int, ...]
    context_length: int | None
    #: Checksum of the tokenizer files (first 16 hex digits of a sha256).
    mdc_sum: str
    path: Path
    #: ``tokenizers.Tokenizer`` read from tokenizer.json as written (DeepSeek's
    #: pre-tokenizer runs its three splits as one: the same pieces,
    #: ``pre_tokenizer.py``). Dynamo encodes with this; transformers'
    #: AutoTokenizer may swap in a model family's own pre-tokenizer or normalizer (e.g. for
    #: ``model_type: qwen2``), which changes the ids where the file disagrees.
    backend: Any = None
    #: Encodes prompts (``worker/request/incremental.py``: exact, reusing the ids
    #: of segments seen before); None: every prompt is encoded in full. Set by the
    #: tap worker after loading. Output text is encoded in full, and its ids are
    #: kept for the next turn, which resends the answer (``encode_output``).
    prompt_encoder: Any = None
    #: The prompt-bytes budget (``worker/budget.py``); None: no bound.
    max_prompt_bytes: int | None = None
    #: Each conversation's previous prompt, for its next turn's answer spans
    #: (``worker/request/turn_cache.py``); None: the spans are rendered. Set by
    #: the tap worker after loading.
    turns: Any = None
    #: Whose preprocessing the records reproduce: ``minijinja`` (Dynamo 1.6.1)
    #: or ``jinja2`` (vLLM 0.32).
    template_engine: str = "minijinja"
    #: The ids transformers' tokenizer puts before and after a text it encodes
    #: with special tokens (vLLM's completions, ``add_special_tokens`` true).
    special_ids: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())

    @functools.cached_property
    def tokenizer(self) -> Any:
        """``transformers.PreTrainedTokenizerFast`` of the directory, loaded on first
        use. The worker never uses it for a ``minijinja`` model (Dynamo reads the
        files itself; so does ``load_model``): importing transformers costs about
        1.4 s of CPU and its tokenizer another 0.6 s, in every shard at start-up."""
        return _auto_tokenizer(self.name, str(self.path), self.path)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens, as Dynamo's tokenizer encodes."""
        # encode_batch_fast skips the offsets: ~20% less CPU, the same ids.
        return self.backend.encode_batch_fast([text], add_special_tokens=False)[0].ids

    def encode_output(self, text: str, *, conversation: bool = True) -> list[int]:
        """``encode`` of an answer's text, whose ids the prompt encoder keeps: a
        conversation's next turn resends the answer as an assistant message
        (``IncrementalEncoder.encode_output``)."""
        if self.prompt_encoder is None:
            return self.encode(text)
        return self.prompt_encoder.encode_output(text, conversation=conversation)


def load_model(
    name: str,
    tokenizer: str,
    context_length: int | None = None,
    *,
    allow_hub: bool = False,
    template_engine: str = "minijinja",
) -> LoadedModel:
    """Load the model ``name`` from ``tokenizer`` (a local directory or a cached hub id).

    Raises ``ModelLoadError`` when the directory cannot be found or read.
    """
    path = _resolve_dir(name, tokenizer, allow_hub=allow_hub)
    if not (path / "tokenizer.json").is_file():
        msg = f"tokenizer '{tokenizer}' for model '{name}' has no fast (tokenizer.json) version"
        raise ModelLoadError(msg)
    try:
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(path / "tokenizer.json"))
    except Exception as exc:
        msg = f"cannot read tokenizer.json of '{tokenizer}' for model '{name}': {exc}"
        raise ModelLoadError(msg) from exc
    # The same pieces in fewer passes (DeepSeek's three splits as one), or as written.
    # A probe that cuts otherwise means the library changed under us: say so.
    rewrite = faster_pre_tokenizer(backend)
    if rewrite is not None:
        (log.info if rewrite == APPLIED else log.warning)("model %r: %s", name, rewrite)
    try:
        config = read_json(path / "config.json")
        generation = read_json(path / "generation_config.json")
        tokenizer_config = read_json(path / "tokenizer_config.json")
        special = read_json(path / "special_tokens_map.json")
        # jinja2: the template transformers picks, from its tokenizer.
        auto = _auto_tokenizer(name, tokenizer, path) if template_engine == "jinja2" else None
        chat_template = load_chat_template(path, auto, name, template_engine)
    except TemplateLoadError as exc:
        raise ModelLoadError(str(exc)) from exc
    # As transformers reads them: tokenizer_config.json, then special_tokens_map.json.
    eos = token_text(tokenizer_config.get("eos_token")) or token_text(special.get("eos_token"))
    return LoadedModel(
        name=name,
        chat_template=chat_template,
        eos_token_ids=_eos_ids(
            backend.token_to_id(eos) if eos else None, generation.get("eos_token_id")
        ),
        context_length=_context_length(
            context_length, config, tokenizer_config.get("model_max_length")
        ),
        mdc_sum=checksum(path),
        path=path,
        backend=backend,
        template_engine=template_engine,
        special_ids=_special_ids(auto) if auto is not None else ((), ()),
    )


def _special_ids(tokenizer: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """What ``tokenizer`` adds around a text with ``add_special_tokens`` (a BOS
    before it, an EOS after it, or nothing), read off one probe encoding."""
    bare = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a", add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return tuple(full[:start]), tuple(full[start + len(bare) :])
    return (), ()


def _auto_tokenizer(name: str, tokenizer: str, path: Path) -> Any:
    """transformers' tokenizer of ``path`` (imported here only: see ``LoadedModel.tokenizer``)."""
    try:
        from transformers import AutoTokenizer
    except ImportError:  # the lean image, or the package without its jinja2 extra
        msg = (
            f"model '{name}' has template_engine jinja2, which needs transformers: use the "
            "full image (VARIANT=full) or pip install 'shadow-proxy[jinja2]'"
        )
        raise ModelLoadError(msg) from None

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:
        msg = f"cannot load tokenizer '{tokenizer}' for model '{name}': {exc}"
        raise ModelLoadError(msg) from exc


def _resolve_dir(name: str, tokenizer: str, *, allow_hub: bool) -> Path:
    local = Path(tokenizer).expanduser()
    if local.is_dir():
        return local
    if local.is_absolute() or tokenizer.startswith((".", "~")) or tokenizer.count("/") > 1:
        problem = "is not a directory" if local.exists() else "does not exist"
        msg = f"tokenizer directory {tokenizer} for model '{name}' {problem}"
        raise ModelLoadError(msg)
    unreachable = (
        f"tokenizer '{tokenizer}' for model '{name}' is neither a local directory nor in "
        "the local Hugging Face cache (no model hub is reachable here); point `tokenizer` "
        "at a local Hugging Face directory"
    )
    from huggingface_hub import snapshot_download

    try:  # the local cache only: never the network
        return Path(
            snapshot_download(tokenizer, local_files_only=True, allow_patterns=_HUB_PATTERNS)
        )
    except Exception:
        if not allow_hub or os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0"):
            raise ModelLoadError(unreachable) from None
    try:
        return Path(snapshot_download(tokenizer, allow_patterns=_HUB_PATTERNS, etag_timeout=10))
    except Exception as exc:
        raise ModelLoadError(unreachable) from exc


def _eos_ids(tokenizer_eos: Any, generation_eos: Any) -> tuple[int, ...]:
    """The union of the tokenizer's EOS id and generation_config's, in order, no duplicates."""
    candidates = [tokenizer_eos]
    candidates += generation_eos if isinstance(generation_eos, list) else [generation_eos]
    ids: list[int] = []
    for value in candidates:
        if isinstance(value, int) and not isinstance(value, bool) and value not in ids:
            ids.append(value)
    return tuple(ids)


def _context_length(entry: int | None, config: dict[str, Any], model_max: Any) -> int | None:
    if entry is not None:
        return entry
    for key in _CONTEXT_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    if isinstance(model_max, int) and 0 < model_max < _SANE_MODEL_MAX_LENGTH:
        return model_max
    return None


def checksum(path: Path) -> str:
    """``mdc_sum``: sha256 over the tokenizer files that exist, first 16 hex digits."""
    digest = hashlib.sha256()
    for file_name in CHECKSUM_FILES:
        file = path / file_name
        if file.is_file():
            digest.update(file_name.encode())
            digest.update(b"\0")
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]
