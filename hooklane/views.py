"""Deliveries and their attempts as JSON, one shape for the admin API and
``hooklane delivery show --json``: a program reading either reads the same
fields, and a field added here reaches both."""

from __future__ import annotations

from typing import Any

from hooklane.store import AttemptView, DeliveryDetail, DeliveryView
from hooklane.times import rfc3339


def delivery_json(d: DeliveryView) -> dict[str, Any]:
    return {
        "id": d.id,
        "event_id": d.event_id,
        "event_type": d.event_type,
        "state": d.state,
        "attempts": d.attempts,
        "attempted_by": d.attempted_by,
        "created_at": rfc3339(d.created_at),
        "queued_at": rfc3339(d.queued_at),
        "next_attempt_at": rfc3339(d.next_attempt_at),
        "delivered_at": rfc3339(d.delivered_at),
        "last_status": d.last_status,
        "last_failure": d.last_failure,
        "last_error": d.last_error,
    }


def attempt_json(a: AttemptView) -> dict[str, Any]:
    """An attempt as its delivery lists it."""
    return {
        "attempt": a.attempt,
        "attempted_by": a.attempted_by,
        "started_at": rfc3339(a.started_at),
        "duration_seconds": a.duration_seconds,
        "outcome": a.outcome,
        "status": a.status,
        "failure": a.failure,
        "error": a.error,
        "retry_after_seconds": a.retry_after_seconds,
        "next_attempt_at": rfc3339(a.next_attempt_at),
        "trace_id": a.trace_id,
        "recorded_at": rfc3339(a.recorded_at),
    }


def listed_attempt_json(a: AttemptView) -> dict[str, Any]:
    """An attempt as an endpoint's listing shows it: with its delivery."""
    return {"delivery_id": a.delivery_id, "event_id": a.event_id, **attempt_json(a)}


def detail_json(d: DeliveryDetail) -> dict[str, Any]:
    # The delivery's own fields stay an object of their own: its
    # ``attempts`` is a count, the detail's the attempts themselves.
    return {
        "delivery": delivery_json(d.delivery),
        "endpoint": {"namespace": d.namespace, "name": d.name},
        "tenant": d.tenant,
        "attempts": [attempt_json(a) for a in d.attempts],
        "attempts_truncated": d.attempts_truncated,
    }
