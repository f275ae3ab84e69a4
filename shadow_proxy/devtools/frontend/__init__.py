"""A built-in OpenAI-compatible frontend for the demo, the tests and the benchmarks.

It answers ``/v1/chat/completions`` and ``/v1/completions`` (streaming SSE and
unary), ``/v1/responses`` (``responses.py``), ``/v1/models`` and ``/health`` as a
real frontend would, without a model:

- ``usage.prompt_tokens`` is exact: chat messages are rendered with the model's
  own chat template (generation prompt added) and the text is encoded without
  special tokens, as a Dynamo frontend does; a string prompt is encoded as it
  is, a token-id prompt is counted as it is (``models.py``).
- The output is deterministic: every choice cycles over the token ids of a
  fixed sentence; ``max_completion_tokens`` or ``max_tokens`` (else the
  configured default) tokens per choice, finish reason ``length``; ``n``
  choices are interleaved chunk by chunk (``generation.py``).
- ``ttft_ms`` passes before the first token and ``itl_ms`` between tokens; each
  SSE event is its own ``write()`` (``handlers.py``).
- Divergence (for replay tests and the demo): with ``diverge_fraction`` above 0,
  a request whose request id (``x-shadow-original-request-id``, the record's id
  a replayed request carries, else ``x-request-id``, else the response id) falls in
  that fraction (``config.diverges``: a CRC-32 of the id) skips one token of the
  cycle from token position ``diverge_at`` on, in every choice: same token count,
  the output differs from position ``diverge_at``.

Tests steer a request with the header ``x-mock-fault`` (or the body field
``mock_fault``): a comma-separated list of directives (``config.Faults``).
``GET /mock/stats`` returns counters that show what the frontend did, in
particular that it stopped generating when the client went away.

Modules: ``config`` (configuration, faults), ``models`` (templates, prompt
counts), ``generation`` (validation, planning, chunk encoding), ``handlers``
(the routes), ``responses`` (the Responses API route), ``app`` (the
application and its server), ``cli``
(``shadow-proxy mock-frontend``).
"""

from shadow_proxy.devtools.frontend.app import STATS_KEY, make_app, serve_mock_frontend
from shadow_proxy.devtools.frontend.cli import build_parser, run_mock_frontend
from shadow_proxy.devtools.frontend.config import Faults, MockConfig, MockRequestError, diverges
from shadow_proxy.devtools.frontend.handlers import MockStats
from shadow_proxy.devtools.frontend.models import (
    PROMPT_CACHE_SIZE,
    ServedModel,
    compile_chat_template,
    load_models,
)

__all__ = [
    "PROMPT_CACHE_SIZE",
    "STATS_KEY",
    "Faults",
    "MockConfig",
    "MockRequestError",
    "MockStats",
    "ServedModel",
    "build_parser",
    "compile_chat_template",
    "diverges",
    "load_models",
    "make_app",
    "run_mock_frontend",
    "serve_mock_frontend",
]
