"""Deliveries: reservation, results, rescue and the endpoint lifecycle jobs."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from hooklane.policies import CircuitPolicy
from hooklane.store.queries import QUERIES


@dataclass(frozen=True)
class Result:
    """One finished attempt, as the worker records it."""

    delivery_id: int
    attempts: int  # the fence: the attempt number the worker reserved
    outcome: str  # 'delivered', 'retry' or 'dead'
    retry_in: float | None
    status: int | None
    error: str | None


async def reserve(
    conn: asyncpg.Connection, partitions: list[int], limit: int, lease_grace_seconds: float
) -> list[asyncpg.Record]:
    """Reserve up to ``limit`` due deliveries of ``partitions``, visiting only
    endpoints that may have work. Call only while this session holds those
    partitions' advisory locks."""
    return await conn.fetch(QUERIES["reserve"], partitions, limit, lease_grace_seconds)


async def complete(
    conn: asyncpg.Connection, results: list[Result], circuit: CircuitPolicy
) -> list[asyncpg.Record]:
    """Record results in one statement; returns the endpoints touched, with
    their circuit state after it."""
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
