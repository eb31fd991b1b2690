"""The event catalogue's check, from the command line: `hooklane catalogue
mode` sets and prints the modes, and `hooklane publish` is refused under
enforce with the path inside data and the rule named. The rule itself, on
every other path: tests/db/test_catalogue_check.py."""

from __future__ import annotations

import json

import asyncpg

from testsupport.cli import hooklane

SCHEMA = {"type": "object", "properties": {"amount": {"type": "integer"}}, "required": ["amount"]}


async def test_modes_are_set_and_printed(dsn: str) -> None:
    assert hooklane(dsn, "catalogue", "mode").stdout.split() == ["TENANT", "MODE", "(default)", "off"]
    done = hooklane(dsn, "catalogue", "mode", "warn", "--default")
    assert (done.returncode, done.stdout) == (
        0,
        "published events of every tenant without a mode of its own are checked: warn\n",
    )
    assert hooklane(dsn, "catalogue", "mode", "off", "--tenant", "globex").returncode == 0
    assert hooklane(dsn, "catalogue", "mode").stdout.split() == [
        "TENANT",
        "MODE",
        "(default)",
        "warn",
        "globex",
        "off",
    ]
    assert hooklane(dsn, "catalogue", "mode", "--tenant", "acme").stdout == "acme: warn (the default)\n"
    assert hooklane(dsn, "catalogue", "mode", "--tenant", "globex").stdout == "globex: off\n"
    # enforce on an empty catalogue refuses every event: said.
    empty = hooklane(dsn, "catalogue", "mode", "enforce", "--tenant", "initech")
    assert empty.returncode == 0
    assert empty.stderr.startswith("hooklane: note: the catalogue holds no type yet")


async def test_bad_input_is_refused_in_one_line(dsn: str) -> None:
    for args, said in (
        (["enforce"], "hooklane: --tenant: or --default is required: whose mode is set\n"),
        (["strict", "--default"], "invalid choice: 'strict'"),
        (["warn", "--tenant", "a\x01b"], "--tenant"),
    ):
        done = hooklane(dsn, "catalogue", "mode", *args)
        assert done.returncode == 2, done
        assert said in done.stderr and "Traceback" not in done.stderr


async def test_publish_is_refused_under_enforce(dsn: str, db: asyncpg.Connection) -> None:
    await db.execute("INSERT INTO catalogue_types (name, source) VALUES ('order.paid', 'local')")
    await db.execute(
        "INSERT INTO catalogue_versions (type, version, schema, example, digest) "
        "VALUES ('order.paid', 1, $1::jsonb, '{\"amount\": 1}', md5($1::jsonb::text))",
        json.dumps(SCHEMA),
    )
    enforced = hooklane(dsn, "catalogue", "mode", "enforce", "--tenant", "acme")
    assert (enforced.returncode, enforced.stderr) == (0, "")
    args = ["publish", "--tenant", "acme", "--type", "order.paid", "--data"]
    refused = hooklane(dsn, *args, '{"amount": "12"}')
    assert (refused.returncode, refused.stderr) == (
        2,
        "hooklane: data: data.amount: '12' is not of type 'integer' (schema version 1, rule type)\n",
    )
    unknown = hooklane(dsn, "publish", "--tenant", "acme", "--type", "order.payed", "--data", "{}")
    assert unknown.returncode == 2
    assert unknown.stderr.startswith("hooklane: type: order.payed is not in the event catalogue")
    published = hooklane(dsn, *args, '{"amount": 12}')
    assert published.returncode == 0, published.stderr
    assert await db.fetchval("SELECT schema_version FROM events") == 1


async def test_migrate_sets_the_default_mode_as_the_chart_asks(dsn: str) -> None:
    done = hooklane(dsn, "migrate", "--catalogue-mode", "warn")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "catalogue mode of every tenant without one of its own: warn"
    assert hooklane(dsn, "catalogue", "mode", "--tenant", "acme").stdout == "acme: warn (the default)\n"
