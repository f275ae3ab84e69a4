"""Metric conventions shared by both processes (pure values).

Each process builds its own metrics on its own registry: the serving loop's in
``serving/metrics.py``, the tap worker's in ``worker/shard/metrics.py`` (relayed to
the serving process as snapshots, ``channel/control.py``). Label values come
from fixed vocabularies, never from the client.
"""

from __future__ import annotations

#: Request duration, time to first byte, record lag: LLM requests run from
#: milliseconds (a cached prefix, one token) to many minutes (long generations).
LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
    600,
    1200,
)
