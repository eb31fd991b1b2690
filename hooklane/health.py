"""An endpoint's health, one way for every view.

`hooklane status`, the operator's ``status`` of each WebhookEndpoint, the
worker's per-endpoint gauges and the admin API all show the records made
here, from one statement (``endpoint_health`` in queries.sql, called as
``store.endpoint_health``). The endpoint's state is decided once per record,
by :func:`hooklane.endpoint_state.endpoint_state` at the database's clock
as the statement read it, so two views of the same snapshot cannot
disagree, and no view's clock skew moves an endpoint between Paused and
Probing.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from hooklane.endpoint_state import EndpointState, Standing, endpoint_state
from hooklane.spec import ON_DEAD_DELIVERY_NAMES, OrderingOnDead
from hooklane.times import rfc3339


class Row(Protocol):
    """A row by column name: a dict, or an asyncpg Record."""

    def __getitem__(self, key: str, /) -> Any: ...


@dataclass(frozen=True)
class EndpointHealth:
    id: int
    namespace: str
    name: str
    tenant: str
    url: str
    # The spec as stored: what the operator compares with what it wrote.
    paused: bool
    max_concurrency: int
    signed: bool
    # The queue.
    pending: int
    in_flight: int
    dead: int
    oldest_pending_age: float | None  # seconds, at observed_at
    sending_on: tuple[str, ...]  # the workers holding its deliveries in flight
    # The circuit.
    consecutive_failures: int
    paused_until: datetime | None
    last_error: str | None
    last_delivered_at: datetime | None
    deactivated_reason: str | None
    # The database's clock when the statement read the row.
    observed_at: datetime
    standing: Standing
    # When pending and the oldest pending were counted: observed_at, or in
    # a listing a worker's last gauge pass (store.endpoint_page).
    counted_at: datetime
    # Its own delivery terms: the concurrency limit in force (moved by the
    # receiver's overload signals when adaptive), until when a Retry-After
    # holds it, and its rate limit (None: none).
    effective_concurrency: int = 0
    adaptive_concurrency: bool = False
    throttled_until: datetime | None = None
    rate_per_second: int | None = None
    rate_burst: int = 1
    # What a dead delivery at the head of an ordering key does to the key
    # (endpoints.ordering_on_dead; spec.ordering.onDeadDelivery).
    ordering_on_dead: OrderingOnDead = "hold"
    # Ordered delivery: its keys held back by a dead delivery (migration
    # 0026), which only a resend or a discard of that delivery releases.
    held_keys: int = 0

    @classmethod
    def from_row(cls, row: Row) -> EndpointHealth:
        return cls(
            id=row["id"],
            namespace=row["namespace"],
            name=row["name"],
            tenant=row["tenant"],
            url=row["url"],
            paused=row["paused"],
            max_concurrency=row["max_concurrency"],
            signed=row["signed"],
            pending=row["pending"],
            in_flight=row["in_flight"],
            dead=row["dead"],
            oldest_pending_age=None
            if row["oldest_pending_age"] is None
            else float(row["oldest_pending_age"]),
            sending_on=tuple(row["sending_on"] or ()),
            consecutive_failures=row["consecutive_failures"],
            paused_until=row["paused_until"],
            last_error=row["last_error"],
            last_delivered_at=row["last_delivered_at"],
            deactivated_reason=row["deactivated_reason"],
            observed_at=row["observed_at"],
            counted_at=row["counted_at"],
            standing=endpoint_state(
                state=row["state"],
                paused=row["paused"],
                paused_until=row["paused_until"],
                now=row["observed_at"],
            ),
            effective_concurrency=row["effective_concurrency"],
            adaptive_concurrency=row["adaptive_concurrency"],
            throttled_until=row["throttled_until"],
            rate_per_second=row["rate_per_second"],
            rate_burst=row["rate_burst"],
            ordering_on_dead=row["ordering_on_dead"],
            held_keys=row["held_keys"],
        )


def standing_counts(healths: Iterable[EndpointHealth]) -> tuple[dict[str, int], int]:
    """Endpoints not delivering, by the ``reason`` label of
    ``hooklane_endpoints_paused`` (circuit, manual, deactivated), and how
    many are probing: the worker's gauges."""
    paused: Counter[str] = Counter({"circuit": 0, "manual": 0, "deactivated": 0})
    probing = 0
    for h in healths:
        if h.standing.state == EndpointState.DEACTIVATED:
            paused["deactivated"] += 1
        elif h.standing.paused_by is not None:
            paused[h.standing.paused_by] += 1
        elif h.standing.state == EndpointState.PROBING:
            probing += 1
    return dict(paused), probing


def exported_endpoints(healths: Iterable[EndpointHealth], mode: str, top: int) -> list[EndpointHealth]:
    """The endpoints whose per-endpoint gauges a worker exports
    (HOOKLANE_METRICS_ENDPOINTS): every one ("all"), none ("tenant"), or
    ("top") the ``top`` most delayed with something pending and the ``top``
    with the most dead deliveries: what the lagging and dead-letter alerts
    look at, in at most 2 x ``top`` endpoints."""
    if mode == "all":
        return list(healths)
    if mode == "tenant":
        return []
    found = list(healths)
    # The few first without sorting them all: a worker's every endpoint
    # passes here at each gauge pass, with the event loop held.
    delayed = heapq.nsmallest(
        top,
        (h for h in found if h.oldest_pending_age is not None),
        key=lambda h: (-(h.oldest_pending_age or 0.0), h.namespace, h.name),
    )
    dead = heapq.nsmallest(top, (h for h in found if h.dead), key=lambda h: (-h.dead, h.namespace, h.name))
    chosen = {h.id: h for h in (*delayed, *dead)}
    return sorted(chosen.values(), key=lambda h: (h.namespace, h.name))


@dataclass(frozen=True)
class TenantTotals:
    pending: int
    in_flight: int
    dead: int
    oldest_pending_age: float  # seconds; 0 when nothing is pending


def tenant_totals(healths: Iterable[EndpointHealth]) -> dict[str, TenantTotals]:
    """Per tenant: the sums of its endpoints' queues and its oldest pending
    age, the gauges of HOOKLANE_METRICS_ENDPOINTS=tenant."""
    found: dict[str, TenantTotals] = {}
    for h in healths:
        was = found.get(h.tenant, TenantTotals(0, 0, 0, 0.0))
        found[h.tenant] = TenantTotals(
            was.pending + h.pending,
            was.in_flight + h.in_flight,
            was.dead + h.dead,
            max(was.oldest_pending_age, h.oldest_pending_age or 0.0),
        )
    return found


def concurrency_text(h: EndpointHealth) -> str:
    """The concurrency limit as the CLI and the dashboard show it: the one
    in force, and what an adaptive endpoint's may rise to ("2/8")."""
    if h.adaptive_concurrency and h.effective_concurrency < h.max_concurrency:
        return f"{h.effective_concurrency}/{h.max_concurrency}"
    return str(h.max_concurrency)


def as_json(h: EndpointHealth) -> dict[str, Any]:
    """The admin API's (and the dashboard's) form of a record."""
    return {
        "namespace": h.namespace,
        "name": h.name,
        "tenant": h.tenant,
        "url": h.url,
        "phase": str(h.standing.state),
        "paused_by": None if h.standing.paused_by is None else str(h.standing.paused_by),
        "signed": h.signed,
        "max_concurrency": h.max_concurrency,
        "effective_concurrency": h.effective_concurrency,
        "adaptive_concurrency": h.adaptive_concurrency,
        "throttled_until": rfc3339(h.throttled_until),
        "rate_limit": None
        if h.rate_per_second is None
        else {"per_second": h.rate_per_second, "burst": h.rate_burst},
        "ordering_on_dead": ON_DEAD_DELIVERY_NAMES[h.ordering_on_dead],
        "pending": h.pending,
        "in_flight": h.in_flight,
        "dead": h.dead,
        "held_keys": h.held_keys,
        "oldest_pending_age_seconds": h.oldest_pending_age,
        "sending_on": list(h.sending_on),
        "circuit": {
            "consecutive_failures": h.consecutive_failures,
            "paused_until": rfc3339(h.paused_until),
        },
        "last_error": h.last_error,
        "last_delivered_at": rfc3339(h.last_delivered_at),
        "deactivated_reason": h.deactivated_reason,
        "observed_at": rfc3339(h.observed_at),
        "counted_at": rfc3339(h.counted_at),
    }
