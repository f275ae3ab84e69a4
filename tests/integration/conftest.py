"""Fixtures of the integration tests that start real processes."""

from tests.integration.nats_harness import nats_cluster, nats_server  # noqa: F401 (fixtures)
