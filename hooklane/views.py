"""Deliveries and their attempts as JSON, one shape for the admin API and
``hooklane delivery show --json``: a program reading either reads the same
fields, and a field added here reaches both; and an endpoint's ordering
state (its keys held back and why), the admin and tenant APIs'."""

from __future__ import annotations

from typing import Any

from hooklane.store import AttemptView, DeliveryDetail, DeliveryView, HeldKey, HeldKeyPage, OrderingSummary
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
        "ordering_key": d.ordering_key,
        "ordering_seq": d.ordering_seq,
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
    return {
        "delivery_id": a.delivery_id,
        "event_id": a.event_id,
        "ordering_key": a.ordering_key,
        "ordering_seq": a.ordering_seq,
        **attempt_json(a),
    }


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


def held_key_json(k: HeldKey) -> dict[str, Any]:
    return {
        "key": k.key,
        "held_since": rfc3339(k.held_since),
        "head": {
            "ordering_seq": k.head_seq,
            "delivery_id": k.delivery_id,
            "event_id": k.event_id,
            "event_type": k.event_type,
            "attempts": k.attempts,
            "last_status": k.last_status,
            "last_failure": k.last_failure,
            "last_error": k.last_error,
        },
        "waiting": k.waiting,
    }


def ordering_json(summary: OrderingSummary, held: HeldKeyPage) -> dict[str, Any]:
    """An endpoint's ordering summary with a page of its held keys."""
    return {
        "on_dead": summary.on_dead,
        "keys_outstanding": summary.keys_outstanding,
        "keys_held": summary.keys_held,
        "oldest_held_since": rfc3339(summary.oldest_held_since),
        "waiting": summary.waiting,
        "skipped": summary.skipped,
        "held_keys": [held_key_json(k) for k in held.keys],
        "next_cursor": held.cursor,
    }
