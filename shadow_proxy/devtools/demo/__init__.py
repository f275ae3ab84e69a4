"""The demo: ``shadow-proxy demo`` (what ``make demo`` runs).

One run starts, each as its own process, the built-in frontend (unless
``--frontend URL`` names a running one), the proxy with the two taps of the
reference deployment (``devtools/reference_taps.py``) and one consumer per tap;
then it sends the load from this process (``devtools/loadgen.py``), waits until
every record has reached its consumer, stops every process with SIGTERM and
prints one table: what the clients saw, what the proxy's ``/metrics`` say and
each consumer's totals.

The run is checked (``checks.py``): every tap holds one record per request
sent, with no gap and no tail loss; each tap's prompt tokens equal what the
frontend reports (``usage.prompt_tokens`` of the answers, and for requests the
client cancelled, the frontend's count asked afterwards with the same prompt
sent straight to it); the joined tap's outcomes are ``cancelled`` exactly for
the requests the clients cancelled and ``complete`` for the rest; the proxy
counts no prompt-token mismatch and no drop; every process exits with status
0. The exit status is 0 when all of this holds, 1 otherwise (the table says
why).

Without options the three reference runs go one after the other (200 requests,
ISL 512, OSL 32: streaming; not streaming; streaming with 25% cancelled by the
client), the built-in frontend shared by the three.

Modules: ``runs`` (the runs and the plan), ``services`` (the frontend and the
waits on processes), ``run`` (one run), ``readings`` (metrics, consumer
totals, the frontend's prompt tokens), ``checks`` (the accounting rules),
``table`` (the text), ``cli`` (the command line).
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
