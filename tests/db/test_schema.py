"""schema.sql is what the migrations add up to: a database migrated from
zero and one loaded from schema.sql have the same catalog."""

from __future__ import annotations

import difflib
import re
from importlib import resources

import asyncpg
import pytest

from hooklane import store

# Each part of the catalog as sorted lines of text, so that a difference
# reads as a diff. Columns are compared by name, not position: a column a
# migration added goes last in the table, and schema.sql may group it with
# its kind.
CATALOG = {
    "tables": """
        SELECT c.relname
        FROM pg_class c
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S')""",
    "columns": """
        SELECT c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
               || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END
               || coalesce(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), '')
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r'
          AND a.attnum > 0 AND NOT a.attisdropped""",
    "constraints": """
        SELECT conrelid::regclass::text || ' ' || conname || ' ' || pg_get_constraintdef(oid)
        FROM pg_constraint
        WHERE connamespace = 'public'::regnamespace""",
    "indexes": """
        SELECT pg_get_indexdef(i.indexrelid)
        FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        WHERE c.relnamespace = 'public'::regnamespace""",
    "functions": """
        SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ') RETURNS '
               || pg_get_function_result(p.oid) || ' LANGUAGE ' || l.lanname
               || ' VOLATILITY ' || p.provolatile::text
               || ' SET ' || coalesce(array_to_string(p.proconfig, ', '), '') || E'\\n' || p.prosrc
        FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
        WHERE p.pronamespace = 'public'::regnamespace""",
    "triggers": """
        SELECT pg_get_triggerdef(oid)
        FROM pg_trigger
        WHERE NOT tgisinternal AND tgrelid::regclass::text NOT LIKE 'pg\\_%'""",
}

_COMMENT = re.compile(r"--[^\n]*")


def _normalised(text: str) -> str:
    """A function body without its comments and with whitespace collapsed."""
    return " ".join(_COMMENT.sub(" ", text).split())


async def catalog(conn: asyncpg.Connection) -> dict[str, list[str]]:
    parts = {}
    for part, query in CATALOG.items():
        rows = [r[0] for r in await conn.fetch(query)]
        if part == "functions":
            rows = [_normalised(r) for r in rows]
        parts[part] = sorted(rows)
    return parts


def difference(migrated: dict[str, list[str]], loaded: dict[str, list[str]]) -> str:
    """A unified diff per part of the catalog; empty when they agree."""
    out = []
    for part in CATALOG:
        out += difflib.unified_diff(
            migrated[part],
            loaded[part],
            fromfile=f"{part}: migrations",
            tofile=f"{part}: schema.sql",
            lineterm="",
        )
    return "\n".join(out)


def schema_sql() -> str:
    return resources.files("hooklane.store").joinpath("schema.sql").read_text()


async def _migrated_catalog(dsn: str) -> dict[str, list[str]]:
    """The test's database is a clone of a template migrated from zero, by
    this run, with the migrations as they are now."""
    conn = await asyncpg.connect(dsn)
    try:
        assert await store.migrate(conn) == []
        # The record of applied migrations is `hooklane migrate`'s own, not
        # part of the schema.
        await conn.execute("DROP TABLE hooklane_migrations")
        return await catalog(conn)
    finally:
        await conn.close()


async def _loaded_catalog(dsn: str, sql: str) -> dict[str, list[str]]:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql)
        return await catalog(conn)
    finally:
        await conn.close()


async def test_schema_sql_is_what_the_migrations_build(dsn, fresh_dsn):
    migrated = await _migrated_catalog(dsn)
    loaded = await _loaded_catalog(fresh_dsn, schema_sql())
    assert migrated["tables"], "the migrated database has no tables: the catalog queries are wrong"
    diff = difference(migrated, loaded)
    assert not diff, "schema.sql differs from the migrations:\n" + diff


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            ("CREATE INDEX events_unrouted ON events (created_at) WHERE fanout = 0;", ""),
            "-CREATE INDEX events_unrouted",
        ),
        (
            (
                "max_concurrency      integer NOT NULL DEFAULT 4",
                "max_concurrency      integer NOT NULL DEFAULT 5",
            ),
            "+endpoints.max_concurrency integer NOT NULL DEFAULT 5",
        ),
        (
            ("attempted_by    text,", "attempted_by    text NOT NULL,"),
            "+deliveries.attempted_by text NOT NULL",
        ),
        (
            (
                "SELECT ep.state = 'active' AND NOT ep.paused AND ep.secret IS NOT NULL",
                "SELECT ep.state = 'active' AND ep.secret IS NOT NULL",
            ),
            "+hooklane_deliverable(ep endpoints) RETURNS boolean",
        ),
        (
            (
                "dues timestamptz[])\nRETURNS void\nLANGUAGE plpgsql\nSET plan_cache_mode = force_generic_plan\nAS $$",
                "dues timestamptz[])\nRETURNS void\nLANGUAGE plpgsql\nAS $$",
            ),
            "+hooklane_wake_v2(endpoint_ids bigint[]",
        ),
        (
            (
                "CHECK (state IN ('pending', 'sending', 'delivered', 'dead', 'discarded'))",
                "CHECK (state IN ('pending', 'sending', 'delivered', 'dead'))",
            ),
            "deliveries_state_check",
        ),
    ],
    ids=["index", "default", "nullability", "function body", "function setting", "constraint"],
)
async def test_a_schema_sql_that_drifted_is_caught(dsn, fresh_dsn, change, expected):
    old, new = change
    sql = schema_sql()
    assert sql.count(old) == 1, f"the scratch change no longer applies to schema.sql: {old!r}"
    migrated = await _migrated_catalog(dsn)
    loaded = await _loaded_catalog(fresh_dsn, sql.replace(old, new))
    diff = difference(migrated, loaded)
    assert expected in diff, diff


async def test_comments_and_whitespace_in_function_bodies_do_not_count():
    assert _normalised("SELECT 1 -- one\n   FROM  x;") == _normalised("SELECT 1\nFROM x; -- the x")
