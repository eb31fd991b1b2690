"""What the worker and the store hand each other: what a finished attempt
did, as the worker decides it (hooklane/worker/rules.py) and the store
records it (``store.complete``), what a round found of each candidate
(``store.reserve``) and how a batch of results left each endpoint
(``store.complete``). Plain values on the ground floor, so that the pure
rules need not import the store."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol


class ResultOutcome(StrEnum):
    """What a finished attempt did, in the words of the ``complete``
    statement (queries.sql), and the ``outcome`` label of
    ``hooklane_deliveries_total``."""

    DELIVERED = "delivered"
    RETRY = "retry"
    DEAD = "dead"


class FailureClass(StrEnum):
    """Why an attempt got no HTTP answer, as tenants may read it: a class,
    never which port answered how (docs/security.md). Stored in
    ``delivery_attempts.failure`` and ``deliveries.last_failure``, and what
    the admin API filters on."""

    TIMEOUT = "timeout"
    CONNECTION_FAILED = "connection_failed"
    TLS_ERROR = "tls_error"
    INVALID_RESPONSE = "invalid_response"
    INVALID_URL = "invalid_url"
    DESTINATION_NOT_ALLOWED = "destination_not_allowed"
    # Our side: an endpoint whose stored secret or URL does not work, or a
    # fault in the worker itself.
    INVALID_ENDPOINT = "invalid_endpoint"
    INTERNAL_ERROR = "internal_error"
    # Recorded by the rescue, not by a worker: no result came back before
    # the delivery's lease ended (rescue_expired in queries.sql).
    LEASE_EXPIRED = "lease_expired"


@dataclass(frozen=True)
class Timing:
    """When an attempt's call started, how long it took, and the trace id
    of the ``traceparent`` the receiver got (None: it got none): what its
    history row records beside the result."""

    started_at: datetime
    duration: float
    trace_id: str | None = None


@dataclass(frozen=True)
class Result:
    """One finished attempt, as the worker records it. Made by
    :meth:`delivered`, :meth:`retry` or :meth:`dead`."""

    delivery_id: int
    attempts: int  # the fence: the attempt number the worker reserved
    outcome: ResultOutcome
    retry_in: float | None
    status: int | None
    error: str | None
    # Without an HTTP answer: why (None with one).
    failure: FailureClass | None = None
    # The receiver's Retry-After, in seconds, when the retry waits for it.
    retry_after: float | None = None
    # None: recorded as started when the result is written, with no duration.
    timing: Timing | None = None
    # An ordered delivery's endpoint and key, whose head this may settle
    # (None: unordered).
    ordered: tuple[int, str] | None = None

    @classmethod
    def delivered(
        cls, delivery_id: int, attempts: int, *, status: int, timing: Timing | None = None
    ) -> Result:
        return cls(delivery_id, attempts, ResultOutcome.DELIVERED, None, status, None, timing=timing)

    @classmethod
    def retry(
        cls,
        delivery_id: int,
        attempts: int,
        *,
        retry_in: float,
        status: int | None,
        error: str,
        failure: FailureClass | None = None,
        retry_after: float | None = None,
        timing: Timing | None = None,
    ) -> Result:
        return cls(
            delivery_id, attempts, ResultOutcome.RETRY, retry_in, status, error, failure, retry_after, timing
        )

    @classmethod
    def dead(
        cls,
        delivery_id: int,
        attempts: int,
        *,
        status: int | None,
        error: str,
        failure: FailureClass | None = None,
        timing: Timing | None = None,
    ) -> Result:
        return cls(delivery_id, attempts, ResultOutcome.DEAD, None, status, error, failure, None, timing)


class Row(Protocol):
    """A row as the driver returns it."""

    def __getitem__(self, key: str) -> Any: ...


@dataclass(frozen=True)
class Verdict:
    """What a round found of a candidate (a verdict row of ``reserve``)."""

    endpoint_id: int
    exists: bool
    deliverable: bool
    # When a start may be granted again: its circuit's pause, its hold (a
    # Retry-After, or a step at a limit of 1), its rate limit's next starts.
    paused_until: datetime | None
    head: datetime | None  # earliest pending from its floor on, after the round
    at_limit: bool  # every slot held by a live lease, or its tenant's at the ceiling
    leases_end: datetime | None  # when the first live lease ends
    held_by: str | None = None  # its tenant, while at its ceiling of calls in flight

    @classmethod
    def of(cls, row: Row) -> Verdict:
        return cls(
            row["endpoint_id"],
            row["max_concurrency"] is not None,
            bool(row["deliverable"]),
            row["paused_until"],
            row["head"],
            bool(row["at_limit"]),
            row["leases_end"],
            row["tenant"],
        )


@dataclass(frozen=True)
class Recorded:
    """What the ready list needs of an endpoint a batch of results touched
    (``store.Touched.recorded``)."""

    endpoint_id: int
    partition: int
    deliverable: bool
    paused_until: datetime | None  # its circuit's pause, or its hold (throttled_until)
    retried_head: datetime | None  # earliest retry the batch queued
