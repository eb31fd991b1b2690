"""Numbered SQL migrations, applied in order, each in its own transaction."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from importlib import resources

import asyncpg

from hooklane.store.queries import QUERIES

logger = logging.getLogger(__name__)

# Serialises concurrent `hooklane migrate` runs (an init container per replica).
_MIGRATION_LOCK = 0x686C6D67

_FILE_NAME = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def available() -> list[Migration]:
    folder = resources.files("hooklane.store").joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = _FILE_NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text()))
    return sorted(found, key=lambda m: m.version)


async def migrate(conn: asyncpg.Connection, target: int | None = None) -> list[Migration]:
    """Apply the migrations the database lacks, up to version ``target``
    (all by default: an older target is for testing upgrades); return those
    applied."""
    await conn.execute(*QUERIES["migration_lock"](key=_MIGRATION_LOCK))
    try:
        await conn.execute(*QUERIES["create_migration_table"]())
        done = {r["version"] for r in await conn.fetch(*QUERIES["applied_migrations"]())}
        applied = []
        for migration in available():
            if migration.version in done or (target is not None and migration.version > target):
                continue
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(
                    *QUERIES["record_migration"](version=migration.version, name=migration.name)
                )
            logger.info(
                "applied migration %04d_%s",
                migration.version,
                migration.name,
                extra={"action": "migrate", "version": migration.version},
            )
            applied.append(migration)
        return applied
    finally:
        await conn.execute(*QUERIES["migration_unlock"](key=_MIGRATION_LOCK))
