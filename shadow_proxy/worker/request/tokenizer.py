"""Model loading: the tokenizer, chat template, EOS ids and context length of one model.

Pure module (no aiohttp, no zmq). Runs at start-up of the tap worker. Nothing here
touches the network unless the caller passes ``allow_hub=True``: a ``tokenizer``
that is not a local directory is looked up in the local Hugging Face cache only,
and a miss is a ``ModelLoadError`` with a plain message, never a hang.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from datetime import datetime
from pathlib import Path
from typing import Any

import attrs
import jinja2
import jinja2.ext
import jinja2.sandbox

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
    #: ``transformers.PreTrainedTokenizerFast`` (any fast tokenizer class).
    tokenizer: Any
    #: The compiled chat template, or None when the model has none.
    chat_template: jinja2.Template | None
    #: Special tokens (``bos_token``, ``eos_token``, ...) visible to the template.
    template_globals: dict[str, Any]
    eos_token_ids: tuple[int, ...]
    context_length: int | None
    #: Checksum of the tokenizer files (first 16 hex digits of a sha256).
    mdc_sum: str
    path: Path
    #: ``tokenizers.Tokenizer`` read from tokenizer.json exactly as written.
    #: Dynamo encodes with this; transformers' AutoTokenizer may swap in a
    #: model family's own pre-tokenizer or normalizer (e.g. for
    #: ``model_type: qwen2``), which changes the ids where the file disagrees.
    backend: Any = None

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens, as Dynamo's tokenizer encodes."""
        # encode_batch_fast skips the offsets: ~20% less CPU, the same ids.
        return self.backend.encode_batch_fast([text], add_special_tokens=False)[0].ids


def load_model(
    name: str,
    tokenizer: str,
    context_length: int | None = None,
    *,
    allow_hub: bool = False,
) -> LoadedModel:
    """Load the model ``name`` from ``tokenizer`` (a local directory or a cached hub id).

    Raises ``ModelLoadError`` when the directory cannot be found or read.
    """
    path = _resolve_dir(name, tokenizer, allow_hub=allow_hub)
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:
        msg = f"cannot load tokenizer '{tokenizer}' for model '{name}': {exc}"
        raise ModelLoadError(msg) from exc
    if not getattr(tok, "is_fast", False):
        msg = f"tokenizer '{tokenizer}' for model '{name}' has no fast (tokenizer.json) version"
        raise ModelLoadError(msg)
    try:
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(path / "tokenizer.json"))
    except Exception as exc:
        msg = f"cannot read tokenizer.json of '{tokenizer}' for model '{name}': {exc}"
        raise ModelLoadError(msg) from exc
    config = _read_json(path / "config.json")
    generation = _read_json(path / "generation_config.json")
    return LoadedModel(
        name=name,
        tokenizer=tok,
        chat_template=_compile_template(tok, name),
        template_globals=dict(tok.special_tokens_map),
        eos_token_ids=_eos_ids(tok.eos_token_id, generation.get("eos_token_id")),
        context_length=_context_length(context_length, config, tok.model_max_length),
        mdc_sum=checksum(path),
        path=path,
        backend=backend,
    )


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


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        msg = f"cannot read {path}: {exc}"
        raise ModelLoadError(msg) from exc
    return value if isinstance(value, dict) else {}


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


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` renders its body (transformers marks
    assistant spans with it; the prompt text is the same)."""

    tags = frozenset({"generation"})

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Like transformers: no HTML escaping, json.dumps options exposed.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def template_environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    """A sandbox with the settings and helpers of transformers' ``apply_chat_template``."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _compile_template(tok: Any, name: str) -> jinja2.Template | None:
    try:
        source = tok.get_chat_template()
    except Exception:  # no template in the tokenizer files
        log.warning("model %r has no chat template; its chat requests are not mirrored", name)
        return None
    try:
        return template_environment().from_string(source)
    except jinja2.TemplateError as exc:
        msg = f"chat template of model '{name}' does not compile: {exc}"
        raise ModelLoadError(msg) from exc
