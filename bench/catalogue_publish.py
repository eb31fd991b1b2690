"""The event catalogue's check at publish (issue 41): what it costs a
publish, side by side in one run.

Three setups, on one PostgreSQL server:

- ``main``: main's hooklane_try_publish_v1, without the check (migration
  0021's body, installed over this tree's on a database of its own, whose
  schema is otherwise this tree's: the function's work is main's);
- ``off``: this tree's function, the catalogue's mode off (the type is in
  the catalogue: the two lookups of the mode and of the type run);
- ``enforce``: this tree's function, the mode enforce: every event is
  validated against the type's schema (jsonschema in PL/Python).

The events: one type with a JSON Schema of 20 properties (integers,
numbers with bounds, strings with lengths and patterns, enums, a date-time,
an array of objects, a nested object; every one required), data of about
1 KiB that validates, each event a new id, fanned out to one endpoint.

Three paths, one event at a time from one client, so that the latency is
the publish's own: ``sql`` (``hooklane_try_publish_v1`` in its own
transaction, asyncpg), ``library`` (``hooklane.publish`` in a
transaction: BEGIN, the call, COMMIT) and ``api`` (``POST /v1/events`` to
a ``hooklane api`` process of this tree, one per database). Per window:
publish latency p50 and p99 as the client sees it, and PostgreSQL CPU per
event (utime + stime of every process of the server, from /proc:
bench/steady.py's sampler). The setups take turns, ``rounds`` windows
each, in rotated order; each window starts on empty tables and warms up
first. Medians over the rounds, and each setup's over main's.

Apart, timed by the server, less exposed to a shared machine's noise:
the function alone (``function_calls`` publishes of each setup in one
statement, rolled back, ``function_rounds`` times in turns), and the
validator alone (``hooklane_catalogue_problem_v1`` called
``validator_calls`` times in one statement; and its first call in a new
session, which imports jsonschema and compiles the schema).

Run: ``python -m bench.catalogue_publish --preset full`` (~3 min;
``smoke`` is what the tests run; ``--dsn``: a server of this machine to
create the databases on, default a throwaway LocalPostgres).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass

import aiohttp
import asyncpg

import hooklane
from bench import ingest
from bench.common import (
    create_database,
    drop_database,
    free_ports,
    machine,
    percentile,
    postgres_server,
    run_and_report,
    worker_env,
)
from bench.publish_function import Server, create_tenant
from hooklane import store

TENANT = "acme"
TYPE = "order.paid"
SETUPS = ("main", "off", "enforce")
PATHS = ("sql", "library", "api")
# main's hooklane_try_publish_v1: the last migration that wrote it before
# this tree's 0024.
MAIN_FUNCTION = "0021_publish_plain_inserts.sql"


@dataclass(frozen=True)
class Config:
    rounds: int  # windows per setup and path
    warmup: int  # events published before each window
    events: int  # measured, per window
    validator_calls: int
    function_calls: int  # publishes per statement of the function alone
    function_rounds: int


PRESETS = {
    "full": Config(
        rounds=3, warmup=200, events=2000, validator_calls=20000, function_calls=2000, function_rounds=9
    ),
    "quick": Config(
        rounds=2, warmup=100, events=500, validator_calls=5000, function_calls=500, function_rounds=3
    ),
    "smoke": Config(
        rounds=1, warmup=10, events=40, validator_calls=200, function_calls=20, function_rounds=1
    ),
}


# --------------------------------------------------------------------------
# The type and its events

SCHEMA: dict = {
    "type": "object",
    "properties": {
        "order_id": {"type": "integer", "minimum": 1},
        "number": {"type": "string", "pattern": "^SO-[0-9]{8}$"},
        "status": {"enum": ["pending", "paid", "shipped", "cancelled"]},
        "currency": {"type": "string", "minLength": 3, "maxLength": 3},
        "amount": {"type": "integer", "minimum": 0},
        "tax": {"type": "number", "minimum": 0},
        "discount": {"type": "number", "minimum": 0, "maximum": 1},
        "paid_at": {"type": "string", "format": "date-time"},
        "customer_id": {"type": "integer"},
        "email": {"type": "string", "maxLength": 254},
        "name": {"type": "string", "maxLength": 200},
        "country": {"type": "string", "pattern": "^[A-Z]{2}$"},
        "gift": {"type": "boolean"},
        "channel": {"enum": ["web", "app", "store", "phone"]},
        "note": {"type": ["string", "null"], "maxLength": 1000},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 20},
        "address": {
            "type": "object",
            "properties": {
                "line1": {"type": "string"},
                "city": {"type": "string"},
                "postcode": {"type": "string"},
            },
            "required": ["line1", "city", "postcode"],
        },
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string"},
                    "quantity": {"type": "integer", "minimum": 1},
                    "unit_price": {"type": "number"},
                },
                "required": ["sku", "quantity", "unit_price"],
            },
        },
        "attempt": {"type": "integer", "minimum": 1, "maximum": 10},
        "source": {"type": "string"},
    },
    "required": [
        "order_id",
        "number",
        "status",
        "currency",
        "amount",
        "tax",
        "discount",
        "paid_at",
        "customer_id",
        "email",
        "name",
        "country",
        "gift",
        "channel",
        "note",
        "tags",
        "address",
        "items",
        "attempt",
        "source",
    ],
    "additionalProperties": False,
}


def data(n: int) -> dict:
    """About 1 KiB of JSON that validates against SCHEMA."""
    return {
        "order_id": 9_000_000 + n,
        "number": f"SO-{n % 100_000_000:08d}",
        "status": "paid",
        "currency": "EUR",
        "amount": 12_050 + n % 1000,
        "tax": 20.1,
        "discount": 0.05,
        "paid_at": "2026-12-07T10:15:30.123Z",
        "customer_id": 40_000 + n,
        "email": f"buyer{n}@example.com",
        "name": "Ada Lovelace",
        "country": "GB",
        "gift": n % 2 == 0,
        "channel": "web",
        "note": "Leave the parcel with the neighbour at number 14 if nobody answers the door.",
        "tags": ["priority", "gift", "returning-customer"],
        "address": {"line1": "12 Analytical Way", "city": "London", "postcode": "N1 9GU"},
        "items": [
            {"sku": f"SKU-{(n * 7 + i) % 100000:05d}", "quantity": 1 + i % 3, "unit_price": 4.99 + i}
            for i in range(6)
        ],
        "attempt": 1,
        "source": "checkout-service",
    }


async def add_type(conn: asyncpg.Connection) -> None:
    """The type, as `hooklane eventtype apply` writes it."""
    text = json.dumps(SCHEMA)
    await conn.execute(
        "INSERT INTO catalogue_types (name, description, source) VALUES ($1, 'An order was paid', 'local')",
        TYPE,
    )
    await conn.execute(
        "INSERT INTO catalogue_versions (type, version, schema, example, digest) "
        "VALUES ($1, 1, $2::jsonb, $3::jsonb, md5($2::jsonb::text))",
        TYPE,
        text,
        json.dumps(data(0)),
    )


def main_function() -> str:
    """main's hooklane_try_publish_v1, as its migration wrote it."""
    text = ""
    for migration in store.available_migrations():
        if f"{migration.version:04d}_{migration.name}.sql" == MAIN_FUNCTION:
            text = migration.sql
    if "CREATE OR REPLACE FUNCTION hooklane_try_publish_v1" not in text:
        raise RuntimeError(f"{MAIN_FUNCTION} does not hold main's publish function")
    return text


# --------------------------------------------------------------------------
# The paths


class Publisher:
    """One setup's database, its connection and its API."""

    def __init__(self, setup: str, dsn: str, conn: asyncpg.Connection, base: str, token: str) -> None:
        self.setup = setup
        self.dsn = dsn
        self.conn = conn
        self.base = base
        self.auth = {"Authorization": f"Bearer {token}"}
        self.n = 0
        self.prefix = secrets.token_hex(4)

    def next_id(self) -> str:
        self.n += 1
        return f"msg_{self.prefix}{self.n:024x}"

    async def sql(self, _session: aiohttp.ClientSession) -> None:
        row = await self.conn.fetchrow(
            "SELECT error_code, error_message FROM hooklane_try_publish_v1($1, $2, $3::jsonb, $4)",
            TENANT,
            TYPE,
            json.dumps(data(self.n)),
            self.next_id(),
        )
        if row["error_code"] is not None:
            raise RuntimeError(f"refused: {row['error_message']}")

    async def library(self, _session: aiohttp.ClientSession) -> None:
        async with self.conn.transaction():
            await hooklane.publish(self.conn, tenant=TENANT, type=TYPE, data=data(self.n), id=self.next_id())

    async def api(self, session: aiohttp.ClientSession) -> None:
        body = {"tenant": TENANT, "type": TYPE, "data": data(self.n), "id": self.next_id()}
        async with session.post(f"{self.base}/v1/events", json=body, headers=self.auth) as response:
            if response.status != 202:
                raise RuntimeError(f"{response.status}: {await response.text()}")


async def window(
    publisher: Publisher,
    path: str,
    session: aiohttp.ClientSession,
    server: Server,
    cfg: Config,
) -> dict:
    """``cfg.events`` publishes one after another, after a warm-up, on
    empty tables: their latencies, and the server's CPU."""
    await publisher.conn.execute("TRUNCATE wakeups, deliveries, events, catalogue_refusals")
    await publisher.conn.execute("CHECKPOINT")
    publish: Callable[[aiohttp.ClientSession], Awaitable[None]] = getattr(publisher, path)
    for _ in range(cfg.warmup):
        await publish(session)
    latencies = []
    cpu_before = server.cpu()
    started = time.perf_counter()
    for _ in range(cfg.events):
        t0 = time.perf_counter()
        await publish(session)
        latencies.append(time.perf_counter() - t0)
    wall = time.perf_counter() - started
    cpu = server.cpu() - cpu_before
    checked = await publisher.conn.fetchval("SELECT count(schema_version) FROM events")
    stored = await publisher.conn.fetchval("SELECT count(*) FROM events")
    if stored != cfg.warmup + cfg.events:
        raise RuntimeError(f"{cfg.warmup + cfg.events} published, {stored} stored")
    return {
        "setup": publisher.setup,
        "path": path,
        "events": cfg.events,
        "p50_ms": 1000 * percentile(latencies, 50),
        "p99_ms": 1000 * percentile(latencies, 99),
        "events_per_s": cfg.events / wall,
        "postgres_us_per_event": 1e6 * cpu / cfg.events,
        "validated": checked,
        "load_average": os.getloadavg()[0],
    }


FIGURES = ("p50_ms", "p99_ms", "postgres_us_per_event", "events_per_s")


def ratio(value: float, main: float) -> float | None:
    """``value`` over main's; None when main's measured nothing: a short
    round's CPU can be under the kernel's 10 ms tick."""
    return round(value / main, 3) if main else None


def summarise(runs: list[dict]) -> list[dict]:
    """Medians over the rounds per setup and path, and over main's."""
    rows = []
    for path in PATHS:
        medians = {
            setup: {
                f: statistics.median(r[f] for r in runs if (r["setup"], r["path"]) == (setup, path))
                for f in FIGURES
            }
            for setup in SETUPS
        }
        for setup in SETUPS:
            row = {"path": path, "setup": setup, **{f: round(v, 3) for f, v in medians[setup].items()}}
            if setup != "main":
                row["over_main"] = {f: ratio(medians[setup][f], medians["main"][f]) for f in FIGURES}
            rows.append(row)
    return rows


async def validator_alone(dsn: str, calls: int) -> dict:
    """Microseconds per call of the validator, timed by the server: the
    first of a new session (importing jsonschema, compiling the schema),
    then ``calls`` more, cached."""
    sample = json.dumps(data(1))
    timed = (
        "WITH s AS MATERIALIZED (SELECT clock_timestamp() AS t), "
        "v AS MATERIALIZED (SELECT count(p.version) AS n FROM s, generate_series(1, $3) g, "
        "      LATERAL hooklane_catalogue_problem_v1($1, $2 || repeat(' ', g % 2)) p) "
        "SELECT extract(epoch FROM clock_timestamp() - s.t) * 1e6 / v.n FROM s, v"
    )
    conn = await asyncpg.connect(dsn)
    try:
        # Each row its own call: no Memoize node may reuse a result.
        await conn.execute("SET enable_memoize = off")
        first = await conn.fetchval(timed, TYPE, sample, 1)
        cached = await conn.fetchval(timed, TYPE, sample, calls)
    finally:
        await conn.close()
    return {
        "first_call_us": round(float(first), 1),
        "cached_us_per_call": round(float(cached), 2),
        "calls": calls,
    }


async def function_alone(publishers: list[Publisher], calls: int, rounds: int) -> list[dict]:
    """Microseconds per hooklane_try_publish_v1 call of each setup, timed by
    the server: ``calls`` publishes in one statement, with no client, no
    round trip and no commit in the time (the statement is rolled back), in
    turns, ``rounds`` times. Less exposed to a shared machine's noise than
    the windows: what the check adds to the function itself."""
    timed = (
        "WITH s AS MATERIALIZED (SELECT clock_timestamp() AS t), "
        "v AS MATERIALIZED (SELECT count(p.stored) AS n FROM s, generate_series(1, $4) g, "
        "      LATERAL hooklane_try_publish_v1($1, $2, $3::jsonb, $5 || g) p) "
        "SELECT extract(epoch FROM clock_timestamp() - s.t) * 1e6 / v.n FROM s, v"
    )
    found: dict[str, list[float]] = {p.setup: [] for p in publishers}
    for round_ in range(rounds):
        for publisher in [*publishers[round_ % 3 :], *publishers[: round_ % 3]]:
            tx = publisher.conn.transaction()
            await tx.start()
            try:
                await publisher.conn.execute("SET LOCAL enable_memoize = off")
                us = await publisher.conn.fetchval(
                    timed, TENANT, TYPE, json.dumps(data(round_)), calls, f"alone-{round_}-"
                )
            finally:
                await tx.rollback()
            found[publisher.setup].append(float(us))
    main = statistics.median(found["main"])
    return [
        {
            "setup": setup,
            "median_us": round(statistics.median(us), 1),
            "min_us": round(min(us), 1),
            "over_main": ratio(statistics.median(us), main),
        }
        for setup, us in found.items()
    ]


@contextlib.asynccontextmanager
async def setup_database(server_dsn: str, setup: str, token: str) -> AsyncIterator[Publisher]:
    dsn = await create_database(server_dsn, f"catalogue_{setup}")
    conn = await asyncpg.connect(dsn)
    port, metrics_port = free_ports(2)
    env = worker_env(
        dsn,
        api_host="127.0.0.1",
        api_port=str(port),
        api_tokens=token,
        api_drain_seconds="0",
        metrics_port=str(metrics_port),
    )
    try:
        await create_tenant(conn, 1)
        await add_type(conn)
        if setup == "main":
            await conn.execute(main_function())
        else:
            await store.set_catalogue_mode(conn, store.DEFAULT_TENANT, setup)
        with ingest.running(ingest.start_api(env)) as api:
            base = f"http://127.0.0.1:{port}"
            await ingest.wait_listening(base, api)
            yield Publisher(setup, dsn, conn, base, token)
    finally:
        await conn.close()
        await drop_database(server_dsn, dsn)


async def main_async(args: argparse.Namespace) -> dict:
    cfg = PRESETS[args.preset]
    result: dict = {
        "preset": args.preset,
        "config": asdict(cfg),
        "machine": machine(),
        "load_average_before": os.getloadavg(),
    }
    started = time.monotonic()
    token = secrets.token_urlsafe(24)
    with postgres_server(args.dsn) as server_dsn:
        async with contextlib.AsyncExitStack() as stack:
            publishers = [
                await stack.enter_async_context(setup_database(server_dsn, s, token)) for s in SETUPS
            ]
            server = Server(publishers[0].conn.get_server_pid())
            runs = []
            async with aiohttp.ClientSession() as session:
                for round_ in range(cfg.rounds):
                    for path in PATHS:
                        # Rotated, so that no setup always runs first.
                        turn = [*publishers[round_ % 3 :], *publishers[: round_ % 3]]
                        for publisher in turn:
                            runs.append(
                                {"round": round_, **await window(publisher, path, session, server, cfg)}
                            )
            result["function"] = await function_alone(publishers, cfg.function_calls, cfg.function_rounds)
            enforce = publishers[SETUPS.index("enforce")]
            result["validator"] = await validator_alone(enforce.dsn, cfg.validator_calls)
    result["runs"] = runs
    result["summary"] = summarise(runs)
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description="the catalogue's check at publish: main, off and enforce")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full")
    parser.add_argument(
        "--dsn", help="a server of this machine to create the databases on (default: LocalPostgres)"
    )
    parser.add_argument("--json", help="write the whole result here")
    args = parser.parse_args()
    run_and_report(
        main_async,
        args,
        lambda r: {
            "seconds": r["seconds"],
            "validator": r["validator"],
            "function": r["function"],
            "summary": r["summary"],
        },
    )


if __name__ == "__main__":
    main()
