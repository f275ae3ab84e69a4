"""The demo: ``shadow-proxy demo`` (what ``make demo`` runs).

A run through the proxy starts, each as its own process, the proxy with the
two taps of the reference deployment (``devtools/reference_taps.py``) and one
consumer per tap (keeping the tap's records with ``--record``), in front of the
built-in frontend (unless ``--frontend URL`` names a running one; one frontend
serves every run); then it sends the load from this process, waits until
every record has reached its consumer, stops every process with SIGTERM and
prints one table: what the clients saw, what the proxy's ``/metrics`` say and
each consumer's totals. The taps publish over ZeroMQ, or with ``--transport
nats`` to a local nats-server's JetStream (one stream per run).

The run is checked (``checks.py``): every tap holds one record per request
sent, with no gap and no tail loss; each tap's prompt tokens equal what the
frontend reports (its ``usage`` of the answers, and for requests the client
cancelled, the frontend's count asked afterwards with the same prompt sent
straight to it); the joined tap's outcomes are ``complete`` for the requests
the clients got in full and ``cancelled`` for those they cancelled (or
``complete``: a cancel after the whole answer was written); the proxy counts
no prompt-token mismatch and no drop; every process exits with status 0. The
exit status is 0 when all of this holds for every run, 1 otherwise (the
table says why).

Without options (``--runs all``): the four reference runs (200 requests, ISL
512, OSL 32: chat streaming; chat not streaming; chat streaming with 25%
cancelled by the client; Responses API streaming with 25% cancelled); the
multi-turn run (20 conversations x 8 turns, each turn resending its history,
with the KV-cache reuse summary of its ``kv-history-tracker`` records from
``shadow-trace analyze``, ``multiturn.py``); and the replay run (the first
run's joined records replayed by ``shadow-replay`` to a slower, diverging
built-in candidate beside a baseline twin of the primary, ``replay.py``).

Modules: ``runs`` (the runs and the plan), ``services`` (frontends, tools and
the waits on processes), ``transport`` (ZeroMQ or JetStream taps), ``run``
(one run through the proxy), ``readings`` (metrics, consumer totals, the
frontend's prompt tokens), ``checks`` (the accounting rules), ``table`` (the
text), ``multiturn`` (sessions and reuse), ``replay`` (the replay run),
``cli`` (the command line).
"""

from shadow_proxy.devtools.demo.checks import evaluate
from shadow_proxy.devtools.demo.cli import build_parser, run_demo
from shadow_proxy.devtools.demo.readings import proxy_metrics
from shadow_proxy.devtools.demo.runs import DemoError, RunOptions, plan
from shadow_proxy.devtools.demo.table import format_table

__all__ = [
    "DemoError",
    "RunOptions",
    "build_parser",
    "evaluate",
    "format_table",
    "plan",
    "proxy_metrics",
    "run_demo",
]
