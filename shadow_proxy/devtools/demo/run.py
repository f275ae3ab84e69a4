"""One demo run: a fresh proxy and fresh consumers in front of a frontend.

``run_once`` runs once per run. With ZeroMQ taps it starts one consumer per
reference tap, then the proxy (logging warnings only), and waits until the
proxy answers and every consumer has seen its tap's heartbeat (so no record is
sent before the subscriptions are in place); with JetStream taps it starts the
proxy, waits until the proxy has made the run's stream, then starts the
consumers (durables read the stream from its start). Each consumer keeps its
tap's records in ``record_dir/<tap>.rec`` (``--record``). Then it sends the load
(``loadgen`` for a load run, ``conversations`` for the multi-turn run); waits
until each tap has published or dropped a record for every request and each
consumer holds every record its tap sent (or has seen the final heartbeat and
waited out its grace: a loss then shows as a gap); stops the consumers, then
the proxy, with SIGTERM (and deletes the run's stream); and returns the run's
result with its failures (``checks.evaluate``). Guarantees: every process it
started has exited when it returns or raises; on an error the output tails of
the processes are printed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from shadow_proxy.devtools.conversations import ConversationSpec, run_conversations
from shadow_proxy.devtools.demo.checks import evaluate
from shadow_proxy.devtools.demo.readings import (
    frontend_prompt_tokens,
    load_probe,
    proxy_metrics,
    read_summary,
    tap_totals,
)
from shadow_proxy.devtools.demo.runs import DemoError, RunOptions
from shadow_proxy.devtools.demo.services import (
    STARTUP_TIMEOUT_S,
    STOP_TIMEOUT_S,
    get_json,
    print_tails,
    wait_for_run,
)
from shadow_proxy.devtools.demo.transport import RunTaps, delete_stream, stream_exists
from shadow_proxy.devtools.loadgen import LoadSpec, Report, run_load, tokens_per_word_of
from shadow_proxy.devtools.processes import Child, cli_argv, reserve_port
from shadow_proxy.devtools.reference_taps import proxy_config, write_config

#: How long the taps and the consumers may take to catch up after the load.
SETTLE_TIMEOUT_S = 15.0
#: The consumers' summary-file interval and heartbeat grace.
CONSUMER_INTERVAL_S = 0.2
CONSUMER_GRACE_S = 1.0


def run_config(run: RunOptions, frontend: str, listen_port: int, taps: RunTaps) -> dict[str, Any]:
    """The proxy's configuration: the reference taps on the run's transport."""
    return proxy_config(
        frontend,
        port=listen_port,
        models={run.model: run.tokenizer},
        taps=taps.taps,
        shutdown_grace_s=5,
        **taps.config,
    )


def consumer_argv(taps: RunTaps, name: str, summary: Path, record: Path) -> list[str]:
    """``shadow-proxy consumer`` on tap ``name``, keeping its summary and records."""
    return cli_argv(
        "consumer",
        *taps.sources[name],
        "--summary-path",
        str(summary),
        "--record",
        str(record),
        "--interval",
        str(CONSUMER_INTERVAL_S),
        "--grace",
        str(CONSUMER_GRACE_S),
    )


async def send_load(run: RunOptions, proxy_url: str, frontend: str) -> tuple[Report, Any]:
    """The run's load through the proxy; returns the report and the probe that
    asks ``frontend`` again for a request's prompt tokens."""
    tokens_per_word = tokens_per_word_of(str(run.tokenizer / "tokenizer.json"))
    if run.kind == "multi-turn":
        spec = ConversationSpec(
            url=proxy_url,
            model=run.model,
            conversations=run.conversations,
            turns=run.turns,
            output_tokens=run.osl,
            tokens_per_word=tokens_per_word,
        )
        report = await run_conversations(spec)
        return report, report.probe
    load = LoadSpec(
        url=proxy_url,
        model=run.model,
        requests=run.requests,
        concurrency=run.concurrency,
        prompt_tokens=run.isl,
        # --isl counts the model's tokens, not words of the prompt list.
        tokens_per_word=tokens_per_word,
        output_tokens=run.osl,
        stream=run.stream,
        api=run.api,
        cancel_fraction=run.cancel_fraction,
    )
    return await run_load(load), load_probe(load)


async def run_once(
    run: RunOptions, frontend: str, log_dir: Path, taps: RunTaps, record_dir: Path
) -> dict[str, Any]:
    """One run in front of ``frontend``: a fresh proxy and fresh consumers."""
    started = time.monotonic()
    timings: dict[str, float] = {}
    listen_port = reserve_port()
    config = run_config(run, frontend, listen_port, taps)
    config_path = write_config(log_dir / "proxy.yaml", config)
    proxy_url = f"http://127.0.0.1:{listen_port}"
    proxy = Child("proxy", cli_argv("serve", "--config", str(config_path)), log_dir)
    consumers: dict[str, Child] = {}
    summaries: dict[str, Path] = {}
    records: dict[str, Path] = {}
    for tap in config["taps"]:
        name = tap["name"]
        summaries[name] = log_dir / f"consumer-{name}.json"
        records[name] = record_dir / f"{name}.rec"
        argv = consumer_argv(taps, name, summaries[name], records[name])
        consumers[name] = Child(f"consumer-{name}", argv, log_dir)
    children = [proxy, *consumers.values()]
    try:
        async with aiohttp.ClientSession() as session:
            if taps.consumers_first:
                # ZeroMQ consumers connect first (they reconnect until the proxy binds).
                for child in consumers.values():
                    child.start()
            proxy.start()
            await wait_for_run(
                "the proxy answering /healthz",
                lambda: get_json(session, proxy_url + "/healthz"),
                children if taps.consumers_first else [proxy],
                STARTUP_TIMEOUT_S,
            )
            if not taps.consumers_first:
                await wait_for_run(
                    f"the proxy making the JetStream stream {taps.stream}",
                    lambda: stream_exists(taps.servers, str(taps.stream)),
                    [proxy],
                    STARTUP_TIMEOUT_S,
                )
                for child in consumers.values():
                    child.start()

            async def subscribed() -> bool:
                loaded = [read_summary(p) for p in summaries.values()]
                if not taps.consumers_first:  # a durable misses nothing: it is up
                    return all(s is not None for s in loaded)
                return all(s is not None and s.get("heartbeats", 0) > 0 for s in loaded)

            await wait_for_run(
                "each consumer seeing its tap's heartbeat"
                if taps.consumers_first
                else "each consumer reading the stream",
                subscribed,
                children,
                STARTUP_TIMEOUT_S,
            )
            timings["startup_s"] = time.monotonic() - started

            mark = time.monotonic()
            report, probe = await send_load(run, proxy_url, frontend)
            timings["load_s"] = time.monotonic() - mark

            mark = time.monotonic()
            sent = len(report.results)
            listing = await wait_for_run(
                f"the taps publishing a record for each of the {sent} requests",
                lambda: taps_settled(session, proxy_url, sent),
                children,
                SETTLE_TIMEOUT_S,
                fatal=False,
            ) or await tap_listing(session, proxy_url)
            if not listing:
                msg = "the proxy's /shadow/taps lists no tap counters"
                raise DemoError(msg)
            next_seq = {t["name"]: t["next_seq"] for t in listing}
            await consumers_settled(summaries, next_seq, children)
            metrics_text = await get_text(session, proxy_url + "/metrics")
            timings["settle_s"] = time.monotonic() - mark
        prompt_total, asked, uncounted = await frontend_prompt_tokens(frontend, report, probe)

        mark = time.monotonic()
        exits = {}
        for child in consumers.values():
            exits[child.name] = await child.stop(STOP_TIMEOUT_S)
        exits["proxy"] = await proxy.stop(STOP_TIMEOUT_S)
        if taps.stream is not None:
            await delete_stream(taps.servers, taps.stream)
        timings["stop_s"] = time.monotonic() - mark
        timings["total_s"] = time.monotonic() - started
        summaries_read = {name: read_summary(path) or {} for name, path in summaries.items()}
    except Exception:
        print_tails(children)
        raise
    finally:
        for child in children:
            child.kill()

    clients = report.summary()
    clients["frontend_prompt_tokens"] = prompt_total
    clients["prompt_tokens_asked_again"] = asked
    clients["prompt_tokens_uncounted"] = uncounted
    result: dict[str, Any] = {
        "title": run.title,
        "kind": run.kind,
        "load": {
            "requests": run.requests,
            "concurrency": run.concurrency,
            "isl": run.isl,
            "osl": run.osl,
            "stream": run.stream,
            "cancel_fraction": run.cancel_fraction,
            "api": "chat" if run.kind == "multi-turn" else run.api,
            "model": run.model,
            "frontend": frontend,
            "transport": taps.transport,
            **({"conversations": run.conversations, "turns": run.turns} if run.turns else {}),
        },
        "clients": clients,
        "proxy": proxy_metrics(metrics_text),
        "taps": {name: tap_totals(summary) for name, summary in summaries_read.items()},
        "records": {name: str(path) for name, path in records.items()},
        "exit_status": exits,
        "timings_s": {k: round(v, 2) for k, v in timings.items()},
    }
    result["failures"] = evaluate(result)
    result["ok"] = not result["failures"]
    return result


async def get_text(session: aiohttp.ClientSession, url: str) -> str:
    """The text at ``url`` (raises on a failure: the run needs it)."""
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as response:
        return await response.text()


async def tap_listing(
    session: aiohttp.ClientSession, proxy_url: str
) -> list[dict[str, Any]] | None:
    """The proxy's tap list with the worker's counters (None before it has them)."""
    listing = await get_json(session, proxy_url + "/shadow/taps")
    taps = listing.get("taps") if isinstance(listing, dict) else None
    if not taps or any("next_seq" not in t for t in taps):
        return None
    return taps


async def taps_settled(
    session: aiohttp.ClientSession, proxy_url: str, sent: int
) -> list[dict[str, Any]] | None:
    """The tap listing once every tap has assigned ``sent`` records and has
    nothing left on its queue (published or dropped)."""
    taps = await tap_listing(session, proxy_url)
    if taps is None:
        return None
    for tap in taps:
        done = tap["published"] + sum(tap.get("dropped", {}).values())
        if tap["next_seq"] < sent or done < tap["next_seq"] or tap.get("queue_depth", 0):
            return None
    return taps


async def consumers_settled(
    summaries: dict[str, Path], next_seq: dict[str, int], children: Sequence[Child]
) -> None:
    """Wait until each consumer holds every record its tap sent, or has seen
    the tap's final heartbeat and waited out its grace (a loss then shows as
    gaps or tail loss in its summary)."""
    final_beat: dict[str, float] = {}

    async def settled() -> bool:
        now = time.monotonic()
        for name, path in summaries.items():
            summary = read_summary(path) or {}
            if summary.get("records", 0) >= next_seq[name]:
                continue
            beats = [
                (p.get("last_heartbeat") or {}).get("next_seq")
                for p in summary.get("publishers", [])
            ]
            if next_seq[name] in beats:
                final_beat.setdefault(name, now)
                if now - final_beat[name] > CONSUMER_GRACE_S + 2 * CONSUMER_INTERVAL_S:
                    continue
            return False
        return True

    await wait_for_run(
        "the consumers catching up", settled, children, SETTLE_TIMEOUT_S, fatal=False
    )
