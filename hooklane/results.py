"""What a finished attempt did, as the worker decides it
(hooklane/worker/rules.py) and the store records it (``store.complete``).
A plain value on the ground floor, so that the pure rules need not import
the store."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ResultOutcome(StrEnum):
    """What a finished attempt did, in the words of the ``complete``
    statement (queries.sql), and the ``outcome`` label of
    ``hooklane_deliveries_total``."""

    DELIVERED = "delivered"
    RETRY = "retry"
    DEAD = "dead"


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

    @classmethod
    def delivered(cls, delivery_id: int, attempts: int, *, status: int) -> Result:
        return cls(delivery_id, attempts, ResultOutcome.DELIVERED, None, status, None)

    @classmethod
    def retry(
        cls, delivery_id: int, attempts: int, *, retry_in: float, status: int | None, error: str
    ) -> Result:
        return cls(delivery_id, attempts, ResultOutcome.RETRY, retry_in, status, error)

    @classmethod
    def dead(cls, delivery_id: int, attempts: int, *, status: int | None, error: str) -> Result:
        return cls(delivery_id, attempts, ResultOutcome.DEAD, None, status, error)
