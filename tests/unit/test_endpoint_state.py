"""One endpoint state (hooklane/endpoint_state.py): the rule itself, the
circuit it shows and what the CLI prints. The CLI, the operator's phase
and the worker's gauges showing it alike for the same rows:
tests/processes/test_endpoint_state.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hooklane.endpoint_state import EndpointState, PauseReason, Standing, endpoint_state

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
