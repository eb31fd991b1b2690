"""The attempt history (delivery_attempts, migration 0010): its daily
partitions, kept by the worker's maintenance."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from hooklane.store.queries import QUERIES

# Days of partitions made ahead of today: maintenance runs every few
# seconds and keeps these hourly, so a worker fleet down for three days
# still records into daily partitions, and past that into the default one.
PARTITIONS_AHEAD = 3


@dataclass(frozen=True)
class PartitionsKept:
    """What one pass did: partitions created, dropped, and skipped because
    their lock was not had in time (dropped by a later pass); rows deleted
    from the default partition."""

    created: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    busy: tuple[str, ...] = ()
    purged: int = 0


async def keep_attempt_partitions(
    conn: asyncpg.Connection, retention_seconds: float, ahead: int = PARTITIONS_AHEAD
) -> PartitionsKept:
    """Create the daily partitions of today and ``ahead`` days on, drop
    those whose day ended more than ``retention_seconds`` ago."""
    rows = await conn.fetch(*QUERIES["attempt_partitions"](ahead=ahead, keep_seconds=retention_seconds))
    done: dict[str, list[str]] = {"created": [], "dropped": [], "busy": []}
    purged = 0
    for row in rows:
        if row["action"] == "purged":
            purged = row["rows_deleted"]
        else:
            done[row["action"]].append(row["partition_name"])
    return PartitionsKept(tuple(done["created"]), tuple(done["dropped"]), tuple(done["busy"]), purged)
