"""Chat templates, rendered by the engine the model's frontend uses. Pure.

``load_chat_template`` runs once per model at worker start-up and returns an
object with ``engine`` and ``render(request) -> str``:

- ``minijinja`` (the default; Dynamo): ``dynamo.DynamoTemplate``, the sources
  picked as Dynamo picks them (a ``chat_template.jinja`` file replaces
  tokenizer_config.json's ``chat_template``; else ``chat_template.json``;
  else tokenizer_config.json), special tokens from tokenizer_config.json;
- ``jinja2`` (vLLM, SGLang): ``jinja2_env.Jinja2Template``, the template
  transformers picks, special tokens from the tokenizer.

``render`` raises ``fields.Reject`` for requests the frontend rejects before
rendering, and the engine's template error when the template fails.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

ENGINES = ("minijinja", "jinja2")
#: config.json model types Dynamo 1.6.1 formats with native (non-Jinja) code.
NATIVE_FORMATTER_TYPES = frozenset({"deepseek_v4", "deepseek_v32", "deepseek_v3_2", "kimi_k3"})


class ChatTemplate(Protocol):
    engine: str

    def render(self, request: dict) -> str: ...


class TemplateLoadError(ValueError):
    """A chat template that cannot be read or compiled; the message says why."""


def load_chat_template(path: Path, tokenizer: Any, name: str, engine: str) -> ChatTemplate | None:
    """The chat template of the model in ``path`` for ``engine``, or None when it
    has none (its chat requests are then not mirrored)."""
    if engine == "jinja2":
        return _load_jinja2(tokenizer, name)
    if engine != "minijinja":
        msg = f"template_engine of model '{name}' must be one of {ENGINES} (got {engine!r})"
        raise TemplateLoadError(msg)
    return _load_minijinja(path, name)


def _load_jinja2(tokenizer: Any, name: str) -> ChatTemplate | None:
    import jinja2

    from shadow_proxy.worker.request.templates.jinja2_env import Jinja2Template

    try:
        source = tokenizer.get_chat_template()
    except Exception:  # no template in the tokenizer files
        log.warning("model %r has no chat template; its chat requests are not mirrored", name)
        return None
    try:
        return Jinja2Template(source, dict(tokenizer.special_tokens_map))
    except jinja2.TemplateError as exc:
        msg = f"chat template of model '{name}' does not compile: {exc}"
        raise TemplateLoadError(msg) from exc


def read_json(path: Path) -> dict[str, Any]:
    """A model directory's JSON file as a dict ({} when absent or not an object);
    ``TemplateLoadError`` when it cannot be read."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        msg = f"cannot read {path}: {exc}"
        raise TemplateLoadError(msg) from exc
    return value if isinstance(value, dict) else {}


def token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an
    AddedToken mapping with its ``content``."""
    if isinstance(value, dict):  # an AddedToken written out
        value = value.get("content")
    return value if isinstance(value, str) else None


def _load_minijinja(path: Path, name: str) -> ChatTemplate | None:
    import minijinja

    from shadow_proxy.worker.request.templates.dynamo import DynamoTemplate

    config = read_json(path / "tokenizer_config.json")
    model_type = read_json(path / "config.json").get("model_type")
    if model_type in NATIVE_FORMATTER_TYPES:
        log.warning(
            "model %r (model_type %s) is formatted by Dynamo's native code, not its "
            "chat template: its prompts may differ from the frontend's",
            name,
            model_type,
        )
    source: Any = config.get("chat_template")
    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():
        source = jinja_file.read_text(encoding="utf-8")
    elif "chat_template" in (json_file := read_json(path / "chat_template.json")):
        source = json_file["chat_template"]
    if source is None:
        log.warning("model %r has no chat template; its chat requests are not mirrored", name)
        return None
    if not isinstance(source, (str, list)):
        msg = f"chat_template of model '{name}' must be a string or a list (got {source!r:.80})"
        raise TemplateLoadError(msg)
    tokens = {key: token_text(config.get(key)) for key in ("bos_token", "eos_token", "unk_token")}
    try:
        return DynamoTemplate.from_sources(source, tokens)
    except (minijinja.TemplateError, ValueError) as exc:
        msg = f"chat template of model '{name}' does not compile: {exc}"
        raise TemplateLoadError(msg) from exc
