"""Configuration: one typed object, read from the environment once."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Mapping

from hooklane.errors import InvalidInput
from hooklane.worker.rules import RetryPolicy

_PREFIX = "HOOKLANE_"


@dataclass(frozen=True)
class CircuitPolicy:
    """Consecutive failures that pause an endpoint, and for how long: each
    failure from the threshold on pauses it ``step`` x (failures past the
    threshold + 1), up to ``cap``."""

    threshold: int = 20
    step_seconds: float = 60.0
    cap_seconds: float = 3600.0


@dataclass(frozen=True)
class Settings:
    database_url: str = ""
    # Deliveries in flight at once in one worker process, over all endpoints.
    # Each waits on the network, not on the CPU; enough of them hide the
    # round trips to Postgres between reservations (docs/benchmarks.md).
    worker_concurrency: int = 256
    # Deliveries reserved per round trip at most.
    reserve_batch: int = 256
    metrics_port: int = 9100
    metrics_host: str = "0.0.0.0"
    # A lease outlives the endpoint's whole-call deadline by this much before
    # rescue may hand the delivery to another worker.
    lease_grace_seconds: float = 10.0
    # Polling interval when no notification arrives: due retries, unpaused
    # endpoints and ownership changes are noticed this often.
    poll_seconds: float = 1.0
    # How often a worker re-checks the live workers and rebalances partitions.
    rebalance_seconds: float = 1.0
    # How often per-endpoint gauges are refreshed from Postgres.
    gauges_seconds: float = 10.0
    # How often maintenance runs (rescue, deactivation, retention).
    maintenance_seconds: float = 5.0
    # How often a worker checks that every endpoint of its partitions with
    # pending deliveries is in the ready index (a safety net: see sweep_ready).
    sweep_seconds: float = 60.0
    deactivate_after_seconds: float = 5 * 24 * 3600.0
    event_retention_seconds: float = 30 * 24 * 3600.0
    drain_seconds: float = 70.0
    # How often the operator writes queue health back onto each
    # WebhookEndpoint's status; one query serves all endpoints per interval.
    operator_status_seconds: float = 10.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    circuit: CircuitPolicy = field(default_factory=CircuitPolicy)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        """``HOOKLANE_<FIELD>`` for each plain field; ``HOOKLANE_RETRY_<FIELD>``
        and ``HOOKLANE_CIRCUIT_<FIELD>`` for the policies."""
        env = os.environ if environ is None else environ
        values = _read(cls, env, _PREFIX, skip={"retry", "circuit"})
        values["retry"] = RetryPolicy(**_read(RetryPolicy, env, _PREFIX + "RETRY_"))
        values["circuit"] = CircuitPolicy(**_read(CircuitPolicy, env, _PREFIX + "CIRCUIT_"))
        return cls(**values)


def _read(cls: type, env: Mapping[str, str], prefix: str, skip: frozenset[str] | set[str] = frozenset()) -> dict:
    values: dict = {}
    for f in fields(cls):
        if f.name in skip:
            continue
        raw = env.get(prefix + f.name.upper())
        if raw is None:
            continue
        kind = type(f.default)
        try:
            values[f.name] = kind(raw)
        except ValueError:
            raise InvalidInput(prefix + f.name.upper(), f"must be a {kind.__name__}, not {raw!r}") from None
    return values
