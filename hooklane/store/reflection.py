"""What the operator's status pass reads: only the endpoints whose health
changed since it last reflected them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import asyncpg

from hooklane.health import EndpointHealth
from hooklane.store.queries import QUERIES


@dataclass(frozen=True)
class Changed:
    """Endpoints whose visible health differs from the digest the operator
    holds for them, each with its new digest; and the ids it knew that are
    gone from Postgres."""

    health: list[tuple[EndpointHealth, str]]
    gone: list[int]


async def endpoint_health_changed(
    conn: asyncpg.Connection, reflected: Mapping[int, str], age_step: float
) -> Changed:
    """``reflected``: endpoint id → the digest last reflected onto its
    resource. ``age_step``: the oldest pending age counts as changed in
    steps of this many seconds (see queries.sql)."""
    ids = list(reflected)
    rows = await conn.fetch(
        *QUERIES["endpoint_health_changed"](ids=ids, digests=[reflected[i] for i in ids], age_step=age_step)
    )
    health = [(EndpointHealth.from_row(r), r["digest"]) for r in rows if r["id"] is not None]
    return Changed(health, [r["known_id"] for r in rows if r["id"] is None])
