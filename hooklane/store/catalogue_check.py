"""The event catalogue's check at publish (migration 0024,
docs/catalogue.md): the mode each tenant's events are checked under, and
the PL/Python validator the modes warn and enforce need."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

import asyncpg

from hooklane.errors import CatalogueRefused, InvalidInput, StoreError
from hooklane.store.queries import QUERIES

MODES = ("off", "warn", "enforce")
# The tenant whose row is every other tenant's mode: no tenant is ''.
DEFAULT_TENANT = ""

# Why PL/Python could not be created, by SQLSTATE.
_UNDEFINED_FILE = "58P01"  # no plpython3u.control: the package is missing
_INSUFFICIENT_PRIVILEGE = "42501"  # an untrusted language needs a superuser


@dataclass(frozen=True)
class TenantMode:
    """A mode set: for ``tenant``, or for every tenant without one of its
    own when ``tenant`` is ``DEFAULT_TENANT``."""

    tenant: str
    mode: str


def check_mode(value: str) -> str:
    if value not in MODES:
        raise InvalidInput("mode", f"must be one of {', '.join(MODES)}, not {value!r}")
    return value


def unavailable_reason(sqlstate: str | None, message: str, major: int) -> str:
    """What to do when the validator cannot be created: the packages to
    install, or the role to run as; the server's own words otherwise."""
    packages = f"postgresql-plpython3-{major} and python3-jsonschema"
    if sqlstate == _UNDEFINED_FILE:
        return (
            f"the PostgreSQL server has no PL/Python (plpython3u): install {packages} "
            "on the database server, then set the mode again"
        )
    if sqlstate == _INSUFFICIENT_PRIVILEGE:
        return (
            "creating the PL/Python validator (plpython3u, an untrusted language) needs a "
            "PostgreSQL superuser: set this mode once as one (the modes after it need none), "
            f"or keep the mode off. The server also needs {packages}."
        )
    return f"the PostgreSQL server cannot run the catalogue's validator: {message}"


async def _install_check(conn: asyncpg.Connection) -> None:
    if await conn.fetchval(*QUERIES["catalogue_check_installed"]()):
        return
    sql = resources.files("hooklane.store").joinpath("catalogue_check.sql").read_text()
    try:
        # A savepoint: the failure leaves the caller's transaction usable.
        async with conn.transaction():
            await conn.execute(sql)
    except (StoreError, asyncpg.PostgresError) as exc:
        major = await conn.fetchval(*QUERIES["server_major_version"]())
        message = str(exc)
        sqlstate = getattr(exc, "sqlstate", None)
        raise InvalidInput("mode", unavailable_reason(sqlstate, message, int(major))) from None


async def set_catalogue_mode(conn: asyncpg.Connection, tenant: str, mode: str) -> None:
    """Check ``tenant``'s published events (``DEFAULT_TENANT``: every
    tenant's without a mode of its own) under ``mode``. warn and enforce
    create the PL/Python validator first, if it is not there: refused with
    ``InvalidInput`` naming what to install (or whom to run as) where it
    cannot be, the mode unchanged."""
    check_mode(mode)
    async with conn.transaction():
        if mode != "off":
            await _install_check(conn)
        await conn.execute(*QUERIES["set_catalogue_mode"](tenant=tenant, mode=mode))


async def catalogue_modes(conn: asyncpg.Connection) -> list[TenantMode]:
    """Every mode set, the default's first."""
    return [TenantMode(r["tenant"], r["mode"]) for r in await conn.fetch(*QUERIES["catalogue_modes"]())]


async def catalogue_mode_of(conn: asyncpg.Connection, tenant: str) -> tuple[str, bool]:
    """The mode ``tenant``'s publishes are checked under, and whether it is
    its own (else the default's, or 'off')."""
    row = await conn.fetchrow(*QUERIES["catalogue_mode_of"](tenant=tenant))
    assert row is not None
    return row["mode"], row["own"]


async def catalogue_type_count(conn: asyncpg.Connection) -> int:
    """How many types the catalogue holds."""
    return int(await conn.fetchval(*QUERIES["catalogue_type_count"]()))


async def record_catalogue_refusals(
    conn: asyncpg.Connection, refused: Sequence[tuple[str, str, CatalogueRefused]]
) -> None:
    """Write again the refusal rows of ``refused`` (tenant, type, refusal),
    whose transaction rolled back to a savepoint before the row's and goes
    on: an API batch refused whole."""
    if refused:
        await conn.execute(
            *QUERIES["record_catalogue_refusals"](
                tenants=[tenant for tenant, _, _ in refused],
                types=[type for _, type, _ in refused],
                reasons=[r.reason for _, _, r in refused],
                messages=[r.message for _, _, r in refused],
            )
        )


async def purge_catalogue_refusals(
    conn: asyncpg.Connection, retention_seconds: float, batch: int = 1000
) -> int:
    """Drop the refusals past retention, a batch at a time, oldest first;
    returns how many. A producer refused a thousand times a second writes
    as many rows: they go as its events would."""
    purged = 0
    while True:
        deleted = int(
            await conn.fetchval(
                *QUERIES["purge_catalogue_refusals"](retention_seconds=retention_seconds, batch_size=batch)
            )
        )
        purged += deleted
        if deleted < batch:
            return purged
