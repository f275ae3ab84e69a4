"""Command-line entry points: ``shadow-proxy serve|mock-frontend|demo|bench`` and
``shadow-consumer``.

An invalid configuration exits with status 2 and one line that names the file,
the line, the key and what was expected.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from shadow_proxy.config import Config, ConfigError

log = logging.getLogger("shadow_proxy")

EXIT_CONFIG = 2

DESCRIPTION = (
    "A reverse-proxy sidecar for OpenAI-compatible LLM frontends: it forwards "
    "traffic unchanged and publishes each request, as the engine sees it, on taps."
)
EPILOG = (
    "Configuration: --config FILE or $SHADOW_PROXY_CONFIG (config/example.yaml). "
    "A start-up error (invalid file, port in use, tokenizer missing) exits with "
    "status 2 and one line naming the file, line and key. "
    "'shadow-proxy COMMAND --help' describes each command."
)


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # Libraries that would otherwise log per request or warn on import.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def load_config(path: str | None) -> Config:
    path = path or os.environ.get("SHADOW_PROXY_CONFIG")
    if not path:
        msg = "no configuration: pass --config FILE or set SHADOW_PROXY_CONFIG"
        raise ConfigError(msg)
    return Config.from_yaml(path)


def serve(args: argparse.Namespace) -> int:
    """Run the proxy until SIGTERM or SIGINT; in-flight streams get the grace period."""
    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(f"shadow-proxy: {e}", file=sys.stderr)
        return EXIT_CONFIG
    from shadow_proxy.serving.server import run
    from shadow_proxy.serving.supervisor import StartupError

    try:
        run(config)
    except StartupError as e:
        print(f"shadow-proxy: {e}", file=sys.stderr)
        return EXIT_CONFIG
    log.info("stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shadow-proxy", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument(
        "--log-level",
        default=os.environ.get("SHADOW_PROXY_LOG_LEVEL", "info"),
        help="debug, info, warning or error [$SHADOW_PROXY_LOG_LEVEL or info]",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the proxy")
    p.add_argument("--config", help="YAML file (default: $SHADOW_PROXY_CONFIG)")
    p.set_defaults(func=serve)

    p = sub.add_parser(
        "mock-frontend", add_help=False, help="run the built-in OpenAI-compatible frontend"
    )
    p.set_defaults(func=None, passthrough="mock-frontend")

    p = sub.add_parser("consumer", add_help=False, help="subscribe to a tap and keep totals")
    p.set_defaults(func=None, passthrough="consumer")

    p = sub.add_parser("bench", help="the cost benchmark (repository checkout)", add_help=False)
    p.set_defaults(func=None, passthrough="bench")

    p = sub.add_parser(
        "demo", add_help=False, help="frontend, proxy, taps, consumers and a load; one table"
    )
    p.set_defaults(func=None, passthrough="demo")

    args, rest = parser.parse_known_args(argv)
    _setup_logging(args.log_level)
    passthrough = getattr(args, "passthrough", None)
    if passthrough == "mock-frontend":
        from shadow_proxy.devtools.frontend import run_mock_frontend

        return run_mock_frontend(rest)
    if passthrough == "consumer":
        return consumer_main(rest)
    if passthrough == "bench":
        return bench_main(rest)
    if passthrough == "demo":
        from shadow_proxy.devtools.demo import run_demo

        return run_demo(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return args.func(args)


def consumer_main(argv: list[str] | None = None) -> int:
    from shadow_proxy.consumer.main import consumer_main as run

    return run(argv)


def bench_main(argv: list[str]) -> int:
    """``bench/proxy_bench.py`` of the checkout this package is installed from (editable)."""
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    if not (repo / "bench" / "proxy_bench.py").is_file():
        print(f"shadow-proxy bench: needs a repository checkout ({repo}/bench)", file=sys.stderr)
        return EXIT_CONFIG
    sys.path.insert(0, str(repo))
    from bench.proxy_bench import main as run

    return run(argv)


if __name__ == "__main__":
    raise SystemExit(main())
