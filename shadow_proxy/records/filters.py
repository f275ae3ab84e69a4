"""Named filters, the explicit projection and the sampling decision (SPEC sections 2, 5).

Pure. ``FilterSet.select`` decides whether a tap takes a request at all;
``FilterSet.project`` builds the copy that leaves the proxy. The projection names
every field of ``PreprocessedRequest`` in ``FIELD_DECISIONS`` and decides its fate
there, so a field added to the request is not copied until someone decides
(``tests/unit/records/test_filters.py`` fails until then). Inside the open-ended maps
(``routing``) only keys listed here are copied; an unknown routing key is dropped.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from shadow_proxy.records.preprocessed import PreprocessedRequest

STRIP_WORKER_PINS = "strip-worker-pins"
KEEP_WORKER_PINS = "keep-worker-pins"
STRIP_MULTIMODAL = "strip-multimodal"
STRIP_EMBEDS = "strip-embeds"
STRIP_EXTRA_ARGS = "strip-extra-args"
STRIP_AGENT_CONTEXT = "strip-agent-context"
TOKENS_ONLY = "tokens-only"
#: Drops the request's own text that ``tokens-only`` keeps: stop strings and
#: guided-decoding schemas (regexes, grammars, JSON schemas, choices). A replay
#: without stop strings may run past where the primary stopped.
STRIP_TEXT_OPTIONS = "strip-text-options"
SKIP_MULTIMODAL = "skip-multimodal"
MAX_TOKENS = "max-tokens"

KNOWN_FILTERS = (
    STRIP_WORKER_PINS,
    KEEP_WORKER_PINS,
    STRIP_MULTIMODAL,
    STRIP_EMBEDS,
    STRIP_EXTRA_ARGS,
    STRIP_AGENT_CONTEXT,
    TOKENS_ONLY,
    STRIP_TEXT_OPTIONS,
    SKIP_MULTIMODAL,
    f"{MAX_TOKENS}=N",
)
#: Inside ``stop_conditions`` and ``sampling_options``: the keys that carry the
#: client's text, dropped by ``strip-text-options``.
TEXT_OPTION_KEYS = frozenset({"stop", "guided_decoding"})

#: ``select`` returns one of these, or None to take the request.
SKIP_REASONS = frozenset({SKIP_MULTIMODAL, MAX_TOKENS})

#: Routing keys that name workers or ranks of the primary deployment: wrong for
#: a shadow, which has its own (Dynamo's ``RoutingHints`` pins).
ROUTING_PINS = frozenset(
    {
        "backend_instance_id",
        "prefill_worker_id",
        "decode_worker_id",
        "dp_rank",
        "prefill_dp_rank",
        "allowed_worker_ids",
    }
)
#: Routing keys that describe the workload; kept unless ``tokens-only``.
ROUTING_HINTS = frozenset(
    {
        "expected_output_tokens",
        "lora_name",
        "cache_namespace",
        "priority_jump",
        "strict_priority",
        "priority",
        "routing_constraints",
        "router",
        "kv_hint",
        "router_config_override",
        "cache_salt",
    }
)
#: Routing keys that identify a session; dropped with ``strip-agent-context``.
ROUTING_SESSION_KEYS = frozenset({"session_id", "conversation_id"})
#: Fields that carry a session or conversation id in Dynamo 1.6.1's
#: preprocessed request (from the session headers): ``strip-agent-context``
#: removes them whole. Inside ``routing`` and ``extra_args`` it also removes
#: every key whose name says session or conversation, at any depth (other
#: frontends, or future ones, may put ids there).
SESSION_FIELDS = ("agent_context", "image_cache_scope")
#: Nesting a projection walks at most: 128 levels, what Dynamo 1.6.1's JSON
#: parser accepts (and the bound of the encoder's own walk, ``worker/encoding.py``),
#: so whatever that frontend accepts, a tap that strips session keys copies.
#: Deeper input is a ``ProjectionError`` (that tap's record is dropped and
#: counted, the other taps are unaffected).
MAX_DEPTH = 128

_MAX_TOKENS_RE = re.compile(r"max-tokens=(?P<n>.*)")
_PREFIX_TOKENS = 64
_TOKEN = struct.Struct(">Q")


def _is_embed_key(key: object) -> bool:
    return isinstance(key, str) and "embed" in key.lower()


def _is_session_key(key: object) -> bool:
    if not isinstance(key, str):
        return False
    lowered = key.lower()
    return "session" in lowered or "conversation" in lowered


class ProjectionError(ValueError):
    """A request this tap's projection cannot copy (nested past ``MAX_DEPTH``)."""


@attrs.frozen
class ProjectionKey:
    """What a projection depends on; equal keys build equal copies."""

    strip_worker_pins: bool
    strip_multimodal: bool
    strip_embeds: bool
    strip_extra_args: bool
    strip_agent_context: bool
    strip_routing: bool
    strip_text_options: bool = False


@attrs.frozen
class FilterSet:
    """The filters of one tap, parsed. Build with ``FilterSet.parse``."""

    names: tuple[str, ...]
    projection_key: ProjectionKey
    skip_multimodal: bool = False
    max_tokens: int | None = None

    @classmethod
    def parse(cls, names: Sequence[str]) -> FilterSet:
        """Resolve filter names from a tap's config; ``ValueError`` names the culprit."""
        if isinstance(names, str):
            msg = f"filters must be a list of names (got the string {names!r})"
            raise ValueError(msg)
        given: list[str] = []
        max_tokens: int | None = None
        for name in names:
            if not isinstance(name, str):
                msg = f"a filter must be a string (got {name!r})"
                raise ValueError(msg)
            if name in given:
                msg = f"filter {name!r} is given twice"
                raise ValueError(msg)
            if match := _MAX_TOKENS_RE.fullmatch(name):
                if max_tokens is not None:
                    msg = f"'max-tokens=N' is given twice (got {name!r})"
                    raise ValueError(msg)
                digits = match["n"]
                if not digits.isascii() or not digits.isdigit() or int(digits) < 1:
                    msg = f"'max-tokens=N' needs a positive integer (got {name!r})"
                    raise ValueError(msg)
                max_tokens = int(digits)
            elif name not in KNOWN_FILTERS:
                msg = f"unknown filter {name!r} (known: {', '.join(KNOWN_FILTERS)})"
                raise ValueError(msg)
            given.append(name)

        tokens_only = TOKENS_ONLY in given
        keep_pins = KEEP_WORKER_PINS in given
        if keep_pins and tokens_only:
            msg = f"{KEEP_WORKER_PINS!r} conflicts with {TOKENS_ONLY!r}, which drops all routing"
            raise ValueError(msg)
        if keep_pins and STRIP_WORKER_PINS in given:
            msg = f"{KEEP_WORKER_PINS!r} conflicts with {STRIP_WORKER_PINS!r}"
            raise ValueError(msg)

        key = ProjectionKey(
            strip_worker_pins=not keep_pins,
            strip_multimodal=tokens_only or STRIP_MULTIMODAL in given,
            strip_embeds=tokens_only or STRIP_EMBEDS in given,
            strip_extra_args=tokens_only or STRIP_EXTRA_ARGS in given,
            strip_agent_context=tokens_only or STRIP_AGENT_CONTEXT in given,
            strip_routing=tokens_only,
            strip_text_options=STRIP_TEXT_OPTIONS in given,
        )
        in_effect = [name for name in given if name != STRIP_WORKER_PINS]
        if key.strip_worker_pins:
            in_effect.append(STRIP_WORKER_PINS)
        return cls(
            names=tuple(in_effect),
            projection_key=key,
            skip_multimodal=SKIP_MULTIMODAL in given,
            max_tokens=max_tokens,
        )

    def select(self, pre: PreprocessedRequest) -> str | None:
        """None if the tap takes the request, else why not (a ``SKIP_REASONS`` value)."""
        if self.skip_multimodal and (
            pre.has_multimodal or any(_is_embed_key(key) for key in pre.extra_args)
        ):
            return SKIP_MULTIMODAL
        if self.max_tokens is not None and len(pre.token_ids) > self.max_tokens:
            return MAX_TOKENS
        return None

    def project(self, pre: PreprocessedRequest) -> dict[str, Any]:
        """The copy of ``pre`` this tap publishes (see ``project``)."""
        return project(pre, self.projection_key)


# --- the projection ------------------------------------------------------------

_Decision = Callable[[Any, ProjectionKey], Any]
_OMIT: Any = object()


def _keep(value: Any, key: ProjectionKey) -> Any:
    return value


def _keep_if_set(value: Any, key: ProjectionKey) -> Any:
    return _OMIT if value is None else value


def _text_options(value: Mapping[str, Any], key: ProjectionKey) -> Any:
    """``stop_conditions`` or ``sampling_options``, without stop strings and
    guided-decoding schemas under ``strip-text-options``."""
    if not key.strip_text_options:
        return value
    return {name: item for name, item in value.items() if name not in TEXT_OPTION_KEYS}


def _annotations(value: list[str], key: ProjectionKey) -> Any:
    return _OMIT if key.strip_agent_context else list(value)


def _routing(value: Mapping[str, Any], key: ProjectionKey) -> Any:
    if key.strip_routing:
        return _OMIT
    if key.strip_agent_context:
        value = _without_session_keys(value)
    kept: dict[str, Any] = {}
    for name, item in value.items():
        if name in ROUTING_HINTS:
            keep = True
        elif name in ROUTING_PINS:
            keep = not key.strip_worker_pins
        elif name in ROUTING_SESSION_KEYS:
            keep = not key.strip_agent_context
        else:
            keep = False  # unknown here: not copied until someone decides
        if keep:
            kept[name] = item
    return kept


def _without_session_keys(value: Any) -> Any:
    """A copy of ``value`` without any session or conversation key, at any depth
    up to ``MAX_DEPTH`` (iterative: deep input cannot exhaust the stack)."""
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any, int]] = [(root, 0, value, 0)]
    while stack:
        parent, slot, item, depth = stack.pop()
        if depth > MAX_DEPTH:
            msg = f"value nested deeper than {MAX_DEPTH} levels"
            raise ProjectionError(msg)
        if isinstance(item, Mapping):
            copy: Any = {}
            for name, child in item.items():
                if not _is_session_key(name):
                    copy[name] = None
                    stack.append((copy, name, child, depth + 1))
        elif isinstance(item, list):
            copy = [None] * len(item)
            stack.extend((copy, i, child, depth + 1) for i, child in enumerate(item))
        else:
            copy = item
        parent[slot] = copy
    return root[0]


def _extra_args(value: Mapping[str, Any], key: ProjectionKey) -> Any:
    if key.strip_extra_args:
        return _OMIT
    kept = {
        name: item for name, item in value.items() if not (key.strip_embeds and _is_embed_key(name))
    }
    return _without_session_keys(kept) if key.strip_agent_context else kept


def _multi_modal_data(value: Mapping[str, Any], key: ProjectionKey) -> Any:
    if key.strip_multimodal:
        return _OMIT
    return {
        name: item for name, item in value.items() if not (key.strip_embeds and _is_embed_key(name))
    }


def _agent_context(value: Mapping[str, Any], key: ProjectionKey) -> Any:
    return _OMIT if key.strip_agent_context else dict(value)


def _image_cache_scope(value: str | None, key: ProjectionKey) -> Any:
    return _OMIT if key.strip_agent_context or value is None else value


def _mdc_sum(value: str | None, key: ProjectionKey) -> Any:
    return _OMIT if key.strip_routing or value is None else value


#: The fate of every field of ``PreprocessedRequest``, in record order.
FIELD_DECISIONS: Mapping[str, _Decision] = {
    "model": _keep,
    "token_ids": _keep,
    "stop_conditions": _text_options,
    "sampling_options": _text_options,
    "output_options": _keep,
    "eos_token_ids": _keep,
    "annotations": _annotations,
    "routing": _routing,
    "extra_args": _extra_args,
    "multi_modal_data": _multi_modal_data,
    "agent_context": _agent_context,
    "image_cache_scope": _image_cache_scope,
    "mdc_sum": _mdc_sum,
    "request_timestamp_ms": _keep_if_set,
    # Token positions and the template's own text around answers, no client text.
    "prompt_spans": _keep_if_set,
}

#: Fields a record carries even when empty (Dynamo's reader requires them).
_ALWAYS = frozenset(
    {"model", "token_ids", "stop_conditions", "sampling_options", "output_options", "eos_token_ids"}
)


def project(pre: PreprocessedRequest, key: ProjectionKey) -> dict[str, Any]:
    """The projected request as a map with SPEC field names.

    Only fields named in ``FIELD_DECISIONS`` are read. Optional fields that end
    up empty are left out. Token id lists are shared with ``pre``, not copied:
    treat the result as read-only.
    """
    out: dict[str, Any] = {}
    for name, decide in FIELD_DECISIONS.items():
        value = decide(getattr(pre, name), key)
        if value is _OMIT:
            continue
        if name not in _ALWAYS and value in ({}, [], None):
            continue
        out[name] = value
    return out


# --- sampling ------------------------------------------------------------------


def sample_in(key: bytes, fraction: float) -> bool:
    """Whether the request with this key is mirrored at ``fraction``.

    A stable hash of the key against the fraction: the same key is in or out
    alike for every tap with the same fraction, and whatever a smaller fraction
    takes a larger one takes too.
    """
    if not 0.0 <= fraction <= 1.0:
        msg = f"'sample' must be within 0..1 (got {fraction!r})"
        raise ValueError(msg)
    if fraction >= 1.0:
        return True
    point = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")
    return point < int(fraction * 2**64)


def request_sample_key(request_id: str) -> bytes:
    """The sampling key with ``sample_by: request``."""
    return request_id.encode("utf-8")


def prefix_sample_key(token_ids: Sequence[int]) -> bytes:
    """The sampling key with ``sample_by: prefix``: a hash of the first 64 prompt tokens.

    Turns of one conversation share their prefix, so they are kept or skipped
    together.
    """
    digest = hashlib.blake2b(digest_size=16, person=b"shadow-prefix")
    for token in token_ids[:_PREFIX_TOKENS]:
        digest.update(_TOKEN.pack(token))
    return digest.digest()
