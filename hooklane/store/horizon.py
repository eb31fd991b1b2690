"""What holds back the database's xmin horizon, and what its dead rows cost
Hooklane's tables: read from Postgres' statistics and replication views,
never from Hooklane's own rows."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from importlib import resources

import asyncpg

from hooklane.store.queries import QUERIES


def _created_tables() -> tuple[str, ...]:
    """Hooklane's tables: those schema.sql creates (the schema after every
    migration, which a migration dropping a table changes with it), and the
    record of migrations, which queries.sql creates."""
    store = resources.files("hooklane.store")
    text = store.joinpath("schema.sql").read_text() + store.joinpath("queries.sql").read_text()
    return tuple(sorted(set(re.findall(r"^CREATE TABLE (?:IF NOT EXISTS )?(\w+)", text, re.MULTILINE))))


TABLES = _created_tables()


@dataclass(frozen=True)
class HorizonHolder:
    """The oldest of what holds the horizon back (statement xmin_horizon)."""

    kind: str  # backend, prepared_transaction, replication_slot, standby
    pid: int | None
    usename: str | None
    application_name: str | None
    state: str | None  # "idle in transaction"...; a slot's active or inactive
    name: str | None  # a slot's name, a prepared transaction's gid
    xmin: int  # the transaction id it holds
    xid_age: int  # transactions begun since
    seconds: float | None  # since its transaction began, where Postgres keeps that


@dataclass(frozen=True)
class Horizon:
    # Whether this role sees every session's state and transaction start
    # (pg_read_all_stats); without, another role's backend shows no age.
    visible: bool
    holder: HorizonHolder | None


async def xmin_horizon(conn: asyncpg.Connection) -> Horizon:
    row = await conn.fetchrow(*QUERIES["xmin_horizon"]())
    assert row is not None, "xmin_horizon returns one row, always"
    if row["kind"] is None:
        return Horizon(row["visible"], None)
    holder = HorizonHolder(
        kind=row["kind"],
        pid=row["pid"],
        usename=row["usename"],
        application_name=row["application_name"],
        state=row["state"],
        name=row["name"],
        xmin=row["xmin"],
        xid_age=row["xid_age"],
        seconds=row["seconds"],
    )
    return Horizon(row["visible"], holder)


@dataclass(frozen=True)
class TableStatistics:
    """One of Hooklane's tables, as the statistics system counts it."""

    table: str
    live: int
    dead: int
    last_autovacuum: datetime | None
    last_vacuum: datetime | None
    autovacuums: int


async def table_statistics(conn: asyncpg.Connection) -> list[TableStatistics]:
    """Each of Hooklane's tables that exists (``TABLES``), by name."""
    rows = await conn.fetch(*QUERIES["table_statistics"](tables=list(TABLES)))
    return [
        TableStatistics(
            r["name"], r["live"], r["dead"], r["last_autovacuum"], r["last_vacuum"], r["autovacuums"]
        )
        for r in rows
    ]
