"""Endpoint health's pure parts: the state is decided at the database's
clock, and the gauges' counts and JSON."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from hooklane.endpoint_state import EndpointState, PauseReason, Standing
from hooklane.health import EndpointHealth, as_json, exported_endpoints, standing_counts

OBSERVED = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def row(**changes: Any) -> dict[str, Any]:
    return {
        "id": 1,
        "namespace": "default",
        "name": "a",
        "tenant": "acme",
        "url": "http://127.0.0.1:9/a",
        "state": "active",
        "paused": False,
        "signed": True,
        "max_concurrency": 4,
        "effective_concurrency": 4,
        "adaptive_concurrency": False,
        "throttled_until": None,
        "rate_per_second": None,
        "rate_burst": 1,
        "ordering_on_dead": "hold",
        "held_keys": 0,
        "consecutive_failures": 0,
        "paused_until": None,
        "last_error": None,
        "last_delivered_at": None,
        "deactivated_reason": None,
        "pending": 0,
        "oldest_pending_age": None,
        "in_flight": 0,
        "sending_on": None,
        "dead": 0,
        "observed_at": OBSERVED,
        "counted_at": OBSERVED,
        **changes,
    }


def test_the_state_is_decided_at_the_databases_clock():
    # Paused until one second after the statement read the row: Paused,
    # whatever the reader's own clock says by the time it looks.
    paused = EndpointHealth.from_row(
        row(consecutive_failures=20, paused_until=OBSERVED + timedelta(seconds=1))
    )
    assert paused.standing == Standing(EndpointState.PAUSED, PauseReason.CIRCUIT)
    probing = EndpointHealth.from_row(row(consecutive_failures=20, paused_until=OBSERVED))
    assert probing.standing == Standing(EndpointState.PROBING)


def test_gauge_counts_and_json():
    healths = [
        EndpointHealth.from_row(row(name="a")),
        EndpointHealth.from_row(row(name="b", paused=True)),
        EndpointHealth.from_row(row(name="c", state="deactivated", paused=True)),
        EndpointHealth.from_row(row(name="d", paused_until=OBSERVED - timedelta(seconds=5))),
        EndpointHealth.from_row(row(name="e", paused_until=OBSERVED + timedelta(seconds=5))),
    ]
    assert standing_counts(healths) == ({"circuit": 1, "manual": 1, "deactivated": 1}, 1)
    shown = as_json(
        EndpointHealth.from_row(
            row(pending=3, oldest_pending_age=12.5, sending_on=["pod-1"], dead=2, last_error="HTTP 500")
        )
    )
    assert shown["phase"] == "Active" and shown["paused_by"] is None
    assert (shown["pending"], shown["dead"], shown["sending_on"]) == (3, 2, ["pod-1"])
    assert shown["oldest_pending_age_seconds"] == 12.5
    assert shown["circuit"] == {"consecutive_failures": 0, "paused_until": None}
    assert shown["observed_at"] == "2026-03-01T12:00:00Z"


@given(
    st.lists(st.tuples(st.one_of(st.none(), st.floats(0, 1e6)), st.integers(0, 5)), max_size=60),
    st.integers(0, 8),
)
def test_top_exports_the_most_delayed_and_the_most_dead(queues, top):
    healths = [
        EndpointHealth.from_row(row(id=i, name=f"ep-{i:02d}", oldest_pending_age=age, dead=dead))
        for i, (age, dead) in enumerate(queues)
    ]
    exported = exported_endpoints(healths, "top", top)
    names = [h.name for h in exported]
    assert names == sorted(set(names)) and len(names) <= 2 * top
    # One left out had at least `top` taken before it in each of the two.
    for h in healths:
        if h in exported:
            continue
        if h.oldest_pending_age is not None:
            ahead = [
                e
                for e in exported
                if e.oldest_pending_age is not None and e.oldest_pending_age >= h.oldest_pending_age
            ]
            assert len(ahead) >= top
        if h.dead:
            assert len([e for e in exported if e.dead >= h.dead]) >= top
