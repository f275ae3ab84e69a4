"""The demo's accounting rules: why a run's result does not hold.

``evaluate`` runs once per run, on its result. A run holds when every tap
holds one record per request sent, with no gap, no tail loss, no duplicate and
nothing undecodable; each tap's prompt tokens equal what the frontend reports;
the joined tap's outcomes are ``complete`` for the requests the clients got in
full and ``cancelled`` for those they cancelled, except that a cancelled one
may be ``complete`` (the client hung up after the proxy had written the whole
answer: a short, fast stream); the proxy counts no
prompt-token mismatch and drops nothing; every process exited with status 0.
Each broken rule is one line saying what was found and what was expected.
"""

from __future__ import annotations

from typing import Any

from shadow_proxy.devtools.demo.table import counts
from shadow_proxy.devtools.reference_taps import reference_taps


def evaluate(result: dict[str, Any]) -> list[str]:
    """Why the run's accounting does not hold (empty: it holds)."""
    failures = []
    clients = result["clients"]
    sent = clients["requests"]
    if clients["errors"]:
        failures.append(f"{clients['errors']} client requests failed")
    expected_prompt = clients["frontend_prompt_tokens"]
    if clients["prompt_tokens_uncounted"]:
        failures.append(
            f"the frontend gave no prompt-token count for "
            f"{clients['prompt_tokens_uncounted']} requests"
        )
    for tap in reference_taps():
        name = tap["name"]
        totals = result["taps"].get(name) or {}
        if totals.get("records") != sent:
            failures.append(f"{name}: {totals.get('records')} records for {sent} requests")
        for key in ("tap_gaps", "transport_gaps", "tail_loss", "transport_tail_loss"):
            if totals.get(key):
                failures.append(f"{name}: {key} = {totals[key]}")
        if totals.get("duplicates"):
            failures.append(f"{name}: {totals['duplicates']} duplicate records")
        if totals.get("undecodable"):
            failures.append(f"{name}: undecodable messages {totals['undecodable']}")
        if (
            not clients["prompt_tokens_uncounted"]
            and totals.get("prompt_tokens") != expected_prompt
        ):
            failures.append(
                f"{name}: {totals.get('prompt_tokens')} prompt tokens, "
                f"the frontend reports {expected_prompt}"
            )
        if tap["capture"] == "request_response":
            outcomes = dict(totals.get("outcomes") or {})
            complete, cancelled = outcomes.pop("complete", 0), outcomes.pop("cancelled", 0)
            # A client that hangs up after its first token may do so after the
            # proxy has written the whole answer (a short, fast stream): that
            # record is rightly complete. The other way round never holds.
            if not (
                complete >= clients["ok"]
                and cancelled <= clients["cancelled"]
                and complete + cancelled == clients["ok"] + clients["cancelled"]
            ):
                failures.append(
                    f"{name}: {complete} complete and {cancelled} cancelled records, the "
                    f"clients saw {clients['ok']} answered and {clients['cancelled']} cancelled"
                )
            for outcome, count in outcomes.items():
                if count:
                    said = totals.get("errors") if outcome == "error" else None
                    # What the error records said: the cause is then in the failure.
                    failures.append(
                        f"{name}: {count} {outcome} records"
                        + (f" ({counts(said)})" if said else "")
                    )
        dropped = (result["proxy"]["taps"].get(name) or {}).get("dropped") or {}
        if any(dropped.values()):
            failures.append(f"{name}: the proxy dropped records {counts(dropped)}")
    proxy = result["proxy"]
    if proxy["prompt_token_mismatches"]:
        failures.append(f"the proxy counted {proxy['prompt_token_mismatches']} prompt mismatches")
    if any(proxy["handoff_dropped"].values()):
        failures.append(f"the proxy dropped hand-offs {proxy['handoff_dropped']}")
    for name, status in result["exit_status"].items():
        if status != 0:
            failures.append(f"{name} exited with status {status} after SIGTERM")
    return failures
