"""An endpoint's state, decided once from its row in Postgres.

`hooklane status`, `hooklane endpoint list`, the operator's ``status.phase``
and the worker's ``hooklane_endpoints_paused`` / ``hooklane_endpoints_probing``
gauges all show it, so they cannot disagree about an endpoint.

The circuit, as ``complete`` in queries.sql keeps it: ``paused_until`` is set
when the failures reach the threshold and cleared only by a success. While it
lies ahead nothing is sent (Paused); once it has passed, the next delivery
goes out as a probe (Probing), and a failed probe sets it ahead again.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import NamedTuple


class EndpointState(StrEnum):
    """The values of the CRD's ``status.phase`` (CamelCase, stable)."""

    ACTIVE = "Active"
    PAUSED = "Paused"
    PROBING = "Probing"
    DEACTIVATED = "Deactivated"


class PauseReason(StrEnum):
    """Why a Paused endpoint sends nothing; the label values of
    ``hooklane_endpoints_paused{reason}`` (with ``deactivated``)."""

    MANUAL = "manual"
    CIRCUIT = "circuit"


class Standing(NamedTuple):
    state: EndpointState
    # Set exactly when state is PAUSED.
    paused_by: PauseReason | None = None

    def __str__(self) -> str:
        return f"{self.state} ({self.paused_by})" if self.paused_by else str(self.state)


def endpoint_state(*, state: str, paused: bool, paused_until: datetime | None, now: datetime) -> Standing:
    """The standing of an endpoint whose row has ``state`` ('active' or
    'deactivated'), ``paused`` (spec.paused) and ``paused_until``, at ``now``.

    Deactivation outranks a manual pause, which outranks the circuit: each
    needs the one before it undone before deliveries can resume."""
    if state == "deactivated":
        return Standing(EndpointState.DEACTIVATED)
    if paused:
        return Standing(EndpointState.PAUSED, PauseReason.MANUAL)
    if paused_until is None:
        return Standing(EndpointState.ACTIVE)
    # The reservation takes an endpoint whose paused_until <= now() (0003).
    if paused_until > now:
        return Standing(EndpointState.PAUSED, PauseReason.CIRCUIT)
    return Standing(EndpointState.PROBING)
