"""``shadow-proxy mock-frontend``: the built-in frontend as a process.

``run_mock_frontend`` runs when the command starts: it parses the arguments,
loads the models and serves until interrupted, on uvloop, with handler
cancellation on. Bad arguments or a model that cannot load exit with status 2
and one line on stderr, before anything listens.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from aiohttp import web

from shadow_proxy.devtools.frontend.app import make_app
from shadow_proxy.devtools.frontend.config import MockConfig

log = logging.getLogger(__name__)

DEFAULT_MODEL = "deepseek=.models/deepseek"


def _model_arg(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep:
        return Path(text).name, Path(text)
    if not name or not path:
        msg = f"expected NAME=TOKENIZER_DIR (got {text!r})"
        raise argparse.ArgumentTypeError(msg)
    return name, Path(path)


def build_parser() -> argparse.ArgumentParser:
    """The command's options (runs when ``shadow-proxy mock-frontend`` starts)."""
    parser = argparse.ArgumentParser(
        prog="shadow-proxy mock-frontend",
        description="A mock OpenAI-compatible frontend with exact prompt token counts.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--model",
        action="append",
        type=_model_arg,
        metavar="NAME=TOKENIZER_DIR",
        help=f"a served model and its tokenizer directory; repeatable (default {DEFAULT_MODEL})",
    )
    parser.add_argument("--ttft-ms", type=float, default=0.0, help="time to first token")
    parser.add_argument("--itl-ms", type=float, default=0.0, help="time per output token")
    parser.add_argument(
        "--default-max-tokens", type=int, default=16, help="tokens per choice without max_tokens"
    )
    parser.add_argument(
        "--diverge-fraction",
        type=float,
        default=0.0,
        help="fraction of requests (by request id) whose output differs from --diverge-at on",
    )
    parser.add_argument(
        "--diverge-at", type=int, default=0, help="token position where outputs diverge"
    )
    parser.add_argument(
        "--tokenizer-threads",
        type=int,
        default=1,
        help="threads encoding prompts off the event loop (0: inline)",
    )
    return parser


def run_mock_frontend(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: serve until interrupted. Exit status 2 on bad arguments."""
    args = build_parser().parse_args(argv)
    pairs = args.model or [_model_arg(DEFAULT_MODEL)]
    try:
        config = MockConfig(
            models=dict(pairs),
            ttft_ms=args.ttft_ms,
            itl_ms=args.itl_ms,
            default_max_tokens=args.default_max_tokens,
            tokenizer_threads=args.tokenizer_threads,
            diverge_fraction=args.diverge_fraction,
            diverge_at=args.diverge_at,
        )
        app = make_app(config)
    except (ValueError, OSError) as exc:
        print(f"mock-frontend: {exc}", file=sys.stderr)
        return 2
    import uvloop

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    log.info("mock frontend serving %s on %s:%d", ", ".join(config.models), args.host, args.port)
    web.run_app(
        app,
        host=args.host,
        port=args.port,
        loop=uvloop.new_event_loop(),
        handler_cancellation=True,
        access_log=None,
        print=None,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(run_mock_frontend())
