"""The short timers tests run Hooklane with, defined once: the in-process
worker's settings (testsupport/fixtures.py: ``settings``) and the environment of
the worker and operator processes the tests start (conftest.worker_process,
testsupport/chaos.py, tests/kube/test_operator.py) are made from these, so that a
worker in a test and one in a process keep the same pace."""

from __future__ import annotations

from collections.abc import Mapping

# A reservation poll, a rebalance, a maintenance pass (rescue, deactivation,
# retention) and a gauge refresh every fraction of a second, so that tests
# do not wait on the contract's timers; a lease outlives its call's deadline
# by a second.
WORKER: Mapping[str, float] = {
    "poll_seconds": 0.1,
    "rebalance_seconds": 0.2,
    "maintenance_seconds": 0.3,
    "gauges_seconds": 0.5,
    "lease_grace_seconds": 1.0,
}
# A status pass every 0.3 s.
OPERATOR: Mapping[str, float] = {"operator_status_seconds": 0.3}


def environment(timings: Mapping[str, float]) -> dict[str, str]:
    """The variables that set ``timings`` (a Settings field -> seconds) in a
    process: ``HOOKLANE_<FIELD>``, as Settings.from_env reads them."""
    return {f"HOOKLANE_{field.upper()}": f"{seconds:g}" for field, seconds in timings.items()}
