"""One endpoint state: the rule itself, and the CLI, the operator's phase and
the worker's gauges showing it alike for the same rows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hooklane import metrics, store
from hooklane.endpoint_state import EndpointState, PauseReason, Standing, endpoint_state
from hooklane.operator import reflect
from testsupport.cli import hooklane
from testsupport.fixtures import add_endpoint, wait_for

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)

rows = st.fixed_dictionaries(
    {
        "state": st.sampled_from(["active", "deactivated"]),
        "paused": st.booleans(),
        "paused_until": st.none() | st.integers(-7200, 7200).map(lambda s: NOW + timedelta(seconds=s)),
    }
)


@pytest.mark.parametrize(
    "state, paused, until, expected",
    [
        ("active", False, None, Standing(EndpointState.ACTIVE)),
        ("active", True, None, Standing(EndpointState.PAUSED, PauseReason.MANUAL)),
        ("active", False, 60, Standing(EndpointState.PAUSED, PauseReason.CIRCUIT)),
        ("active", False, -60, Standing(EndpointState.PROBING)),
        # the reservation takes it at paused_until <= now()
        ("active", False, 0, Standing(EndpointState.PROBING)),
        # a manual pause hides the circuit: setting spec.paused back is the first step
        ("active", True, 60, Standing(EndpointState.PAUSED, PauseReason.MANUAL)),
        ("active", True, -60, Standing(EndpointState.PAUSED, PauseReason.MANUAL)),
        ("deactivated", True, 60, Standing(EndpointState.DEACTIVATED)),
        ("deactivated", False, None, Standing(EndpointState.DEACTIVATED)),
    ],
)
def test_states(state, paused, until, expected):
    paused_until = None if until is None else NOW + timedelta(seconds=until)
    assert endpoint_state(state=state, paused=paused, paused_until=paused_until, now=NOW) == expected


@given(rows)
def test_something_is_sent_exactly_when_the_reservation_would_take_the_endpoint(row):
    # hooklane_reserve (migration 0003): state = 'active' AND NOT paused AND
    # (paused_until IS NULL OR paused_until <= now())
    reserved = (
        row["state"] == "active"
        and not row["paused"]
        and (row["paused_until"] is None or row["paused_until"] <= NOW)
    )
    standing = endpoint_state(**row, now=NOW)
    assert (standing.state in (EndpointState.ACTIVE, EndpointState.PROBING)) == reserved
    assert (standing.paused_by is not None) == (standing.state == EndpointState.PAUSED)


@given(rows)
def test_the_circuit_shows_only_while_it_is_open(row):
    state = endpoint_state(**row, now=NOW).state
    if state in (EndpointState.PROBING, EndpointState.ACTIVE):
        assert (row["paused_until"] is not None) == (state == EndpointState.PROBING)


def test_what_the_cli_prints():
    assert [str(s) for s in (Standing(EndpointState.ACTIVE), Standing(EndpointState.PROBING))] == [
        "Active",
        "Probing",
    ]
    assert str(Standing(EndpointState.PAUSED, PauseReason.CIRCUIT)) == "Paused (circuit)"


@pytest.mark.processes
async def test_cli_operator_and_gauges_agree(dsn, db, start_worker):
    # Nothing is published: no delivery goes out, and the worker only reads.
    for name in ("active", "manual", "circuit", "probing", "deactivated"):
        await add_endpoint(db, name, "http://127.0.0.1:9/never", paused=name == "manual")
    # The circuit's columns as `complete` leaves them, with nothing pending,
    # so the worker leaves them be.
    await db.execute(
        """UPDATE endpoints SET consecutive_failures = 20, failing_since = now(),
                  paused_until = now() + CASE name WHEN 'circuit' THEN interval '1 hour'
                                                   ELSE interval '-1 minute' END
           WHERE name IN ('circuit', 'probing')"""
    )
    await db.execute("UPDATE endpoints SET state = 'deactivated' WHERE name = 'deactivated'")
    expected = {
        "active": "Active",
        "manual": "Paused (manual)",
        "circuit": "Paused (circuit)",
        "probing": "Probing",
        "deactivated": "Deactivated",
    }

    for command in (["status"], ["endpoint", "list"]):
        lines = hooklane(dsn, *command).stdout.splitlines()[1:]
        # `status` names an endpoint NAMESPACE/NAME, `endpoint list` in two columns.
        shown = {
            name: next(line for line in lines if {name, f"default/{name}"} & set(line.split()[:2]))
            for name in expected
        }
        for name, state in expected.items():
            assert f"  {state}  " in shown[name], (command, shown[name])

    now = datetime.now(UTC)
    phases = {
        h.name: reflect.reflect(
            previous={}, queue=reflect.Queue.from_health(h), synced=None, now=now, age_resolution=10
        ).patch["phase"]
        for h in await store.endpoint_health(db)
    }
    assert phases == {name: state.split()[0] for name, state in expected.items()}

    start_worker()

    def gauges() -> dict[str, float]:
        paused = {
            r: metrics.ENDPOINTS_PAUSED.labels(r)._value.get() for r in ("manual", "circuit", "deactivated")
        }
        return {**paused, "probing": metrics.ENDPOINTS_PROBING._value.get()}

    await wait_for(lambda: gauges() == {"manual": 1, "circuit": 1, "deactivated": 1, "probing": 1})
