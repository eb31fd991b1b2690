"""Deliveries: reservation, results, rescue and the endpoint lifecycle jobs."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import asyncpg

from hooklane.policies import CircuitPolicy
from hooklane.store.queries import QUERIES


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


async def reserve(
    conn: asyncpg.Connection, partitions: list[int], limit: int, lease_grace_seconds: float, worker_id: str
) -> list[asyncpg.Record]:
    """Reserve up to ``limit`` due deliveries of ``partitions``, visiting only
    endpoints that may have work; each records ``worker_id`` as the worker
    that attempted it. Call only while this session holds those partitions'
    advisory locks."""
    return await conn.fetch(QUERIES["reserve"], partitions, limit, lease_grace_seconds, worker_id)


async def complete(
    conn: asyncpg.Connection, results: list[Result], circuit: CircuitPolicy
) -> list[asyncpg.Record]:
    """Record results in one statement; returns the endpoints touched, with
    their circuit state after it and ``ready``: whether one now has due work
    and a free slot, the only reason to run a reservation round for it."""
    return await conn.fetch(
        QUERIES["complete"],
        [r.delivery_id for r in results],
        [r.attempts for r in results],
        [r.outcome for r in results],
        [r.retry_in for r in results],
        [r.status for r in results],
        [r.error for r in results],
        circuit.threshold,
        circuit.step_seconds,
        circuit.cap_seconds,
    )


async def rescue_expired(conn: asyncpg.Connection, partitions: list[int]) -> int:
    """Requeue deliveries whose lease expired. Call under the partitions' locks."""
    return len(await conn.fetch(QUERIES["rescue_expired"], partitions))


async def sweep_ready(conn: asyncpg.Connection, partitions: list[int]) -> int:
    """Make ready the endpoints with pending deliveries the ready index lacks.
    Call under the partitions' locks."""
    return len(await conn.fetch(QUERIES["sweep_ready"], partitions))


async def deactivate_failing(conn: asyncpg.Connection, after_seconds: float) -> list[asyncpg.Record]:
    return await conn.fetch(QUERIES["deactivate_failing"], after_seconds)


async def resend_dead(
    conn: asyncpg.Connection, namespace: str, name: str, ids: list[int] | None = None
) -> int | None:
    """How many dead deliveries were queued again; None if there is no such endpoint."""
    return await conn.fetchval(QUERIES["resend_dead"], namespace, name, ids)


async def dead_counts(conn: asyncpg.Connection, partitions: list[int] | None) -> list[asyncpg.Record]:
    return await conn.fetch(QUERIES["dead_counts"], partitions)


async def unrouted_events(conn: asyncpg.Connection) -> int:
    return await conn.fetchval(QUERIES["unrouted_events"])


async def partition_count(conn: asyncpg.Connection) -> int:
    return await conn.fetchval(QUERIES["partition_count"])
