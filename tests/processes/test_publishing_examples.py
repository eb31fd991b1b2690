"""The publishing examples (examples/publishing/), run as written: the Go
example's binary that hack/examples/build makes with ``go build``, ``node
publish.js`` with the ``node_modules`` it installs with ``npm ci``, and
``psql -f publish.sql``, each against the tests' PostgreSQL, with a worker
delivering to a receiver on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest
from standardwebhooks.webhooks import Webhook

from testsupport.fixtures import SECRET, add_endpoint, wait_for
from testsupport.receivers import Answer, Receiver

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "hack" / "examples" / "build"
EXAMPLES = ROOT / "examples" / "publishing"
LANGUAGES = ("go", "node", "psql")
# psql cannot choose its exit status: the script ends the refused case
# with a failing statement, which ON_ERROR_STOP makes 3.
REFUSED_STATUS = {"go": 2, "node": 2, "psql": 3}
# The total every example writes into its order and its event.
TOTAL = Decimal("19.99")


@pytest.fixture(scope="session")
def publishing_examples() -> Path:
    """hack/examples/build's folder: ``publish`` (the Go example) and
    ``node_modules``. Fails, never skips, when a toolchain is missing:
    every developer's machine and CI's have them."""
    if shutil.which("psql") is None:
        pytest.fail("psql not found on PATH: the psql example needs it (Debian's postgresql-client)")
    build = subprocess.run([str(BUILD)], capture_output=True, text=True)
    if build.returncode != 0:
        pytest.fail(f"hack/examples/build exited {build.returncode}:\n{build.stderr[-4000:]}")
    return Path(build.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class Ran:
    status: int
    stdout: str
    stderr: str


async def run_example(
    language: str, built: Path, dsn: str, order_id: str, event_type: str, *, rollback: bool = False
) -> Ran:
    """One run of an example, from its own folder, as its header says."""
    env = {**os.environ, "DATABASE_URL": dsn}
    if language == "go":
        argv = [str(built / "publish"), order_id, event_type, *(["rollback"] if rollback else [])]
    elif language == "node":
        # In place of the node_modules `npm ci` would make beside publish.js.
        env["NODE_PATH"] = str(built / "node_modules")
        argv = ["node", "publish.js", order_id, event_type, *(["rollback"] if rollback else [])]
    else:
        variables = [f"order_id={order_id}", f"type={event_type}", *(["rollback=1"] if rollback else [])]
        argv = ["psql", dsn, "-X", *(a for v in variables for a in ("-v", v)), "-f", "publish.sql"]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=EXAMPLES / language,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(), err.decode())


@pytest.fixture
async def shop(db, receiver: Receiver) -> Receiver:
    """The application's own table, and one endpoint of tenant acme taking
    every event type, at ``receiver``'s path ``orders``."""
    await db.execute("CREATE TABLE orders (id text PRIMARY KEY, total numeric NOT NULL)")
    await add_endpoint(db, "orders", receiver.on("orders", Answer(204)))
    return receiver


async def delivered(db, receiver: Receiver, language: str, built: Path, dsn: str, order_id: str) -> dict:
    """Publish order ``order_id`` with the example and wait for it to arrive
    at the receiver, signed; the event the receiver verified."""
    ran = await run_example(language, built, dsn, order_id, "order.created")
    assert (ran.status, ran.stdout, ran.stderr) == (0, f"order-{order_id}-created\n", "")
    event_id = f"order-{order_id}-created"
    got = await wait_for(lambda: [r for r in receiver.at("orders") if r.headers["webhook-id"] == event_id])
    assert len(got) == 1
    verified = Webhook(SECRET).verify(got[0].body, got[0].headers)
    # Read again with exact decimals: the total must arrive as the number stored.
    event = json.loads(got[0].body, parse_float=Decimal)
    assert verified["id"] == event["id"] == event_id
    return event


@pytest.mark.parametrize("language", LANGUAGES)
async def test_a_committed_order_is_delivered_signed(
    language, publishing_examples, dsn, db, shop, start_worker
):
    start_worker()
    event = await delivered(db, shop, language, publishing_examples, dsn, "1042")
    assert event["type"] == "order.created"
    assert event["data"] == {"order_id": "1042", "total": TOTAL}
    assert await db.fetchval("SELECT total FROM orders WHERE id = '1042'") == TOTAL
    stored = await db.fetch("SELECT tenant, id, type, fanout, ordering_key FROM events")
    assert [tuple(r) for r in stored] == [("acme", "order-1042-created", "order.created", 1, "order-1042")]
    # The order is its ordering key: its first event is the key's first.
    assert await db.fetchval("SELECT ordering_seq FROM deliveries") == 1
    await wait_for(lambda: db.fetchval("SELECT state = 'delivered' FROM deliveries"))
    assert len(shop.received) == 1


@pytest.mark.parametrize("language", LANGUAGES)
async def test_a_rolled_back_order_stores_and_sends_nothing(
    language, publishing_examples, dsn, db, shop, start_worker
):
    start_worker()
    ran = await run_example(language, publishing_examples, dsn, "1042", "order.created", rollback=True)
    assert (ran.status, ran.stdout, ran.stderr) == (0, "order-1042-created\n", "")
    assert await db.fetchval("SELECT count(*) FROM orders") == 0
    assert await db.fetchval("SELECT count(*) FROM events") == 0
    assert await db.fetchval("SELECT count(*) FROM deliveries") == 0
    # A later order's delivery arriving proves the worker went past the
    # point where the first would have been sent.
    await delivered(db, shop, language, publishing_examples, dsn, "1043")
    assert [r.headers["webhook-id"] for r in shop.received] == ["order-1043-created"]


@pytest.mark.parametrize("language", LANGUAGES)
async def test_a_refused_event_still_commits_the_order(
    language, publishing_examples, dsn, db, shop, start_worker
):
    start_worker()
    ran = await run_example(language, publishing_examples, dsn, "1042", "order created")
    assert ran.status == REFUSED_STATUS[language], ran
    assert ran.stdout == ""
    refusal = "refused WH422 type: must be a dotted event type like 'order.updated'\n"
    assert ran.stderr.startswith(refusal), ran.stderr
    # The refusal left the transaction usable: the order is committed.
    assert await db.fetchval("SELECT total FROM orders WHERE id = '1042'") == TOTAL
    assert await db.fetchval("SELECT count(*) FROM events") == 0
    assert await db.fetchval("SELECT count(*) FROM deliveries") == 0
    await delivered(db, shop, language, publishing_examples, dsn, "1043")
    assert [r.headers["webhook-id"] for r in shop.received] == ["order-1043-created"]


def test_the_build_names_what_is_missing(tmp_path):
    # A PATH holding bash alone: no Go, no Node.js, no npm.
    bare = tmp_path / "bin"
    bare.mkdir()
    bash = shutil.which("bash")
    assert bash is not None
    (bare / "bash").symlink_to(bash)
    done = subprocess.run(
        [str(BUILD)],
        env={**os.environ, "PATH": str(bare), "HOOKLANE_EXAMPLES_CACHE": str(tmp_path / "cache")},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert "build: go node npm not found on PATH" in done.stderr, done.stderr
    assert not (tmp_path / "cache").exists()


# An application's transaction around a publish of data read from a file,
# through the v2 function (JSON text): what the examples do, with data of
# any depth. Each prints the answer's code and message, then commits.
DEEP_PSQL = r"""\set ON_ERROR_STOP on
\set QUIET on
\set data `cat {path}`
BEGIN;
INSERT INTO orders (id, total) VALUES ('1042', 19.99);
SELECT coalesce(error_code, 'stored') || ' ' || coalesce(error_message, '')
FROM hooklane_try_publish_v2(tenant => 'acme', type => 'order.created', data => :'data')
\g
COMMIT;
"""
DEEP_NODE = r"""
const { Client } = require('pg');
const data = require('fs').readFileSync(process.argv[1], 'utf8');
(async () => {
  const client = new Client({ connectionString: process.env.DATABASE_URL });
  await client.connect();
  await client.query('BEGIN');
  await client.query("INSERT INTO orders (id, total) VALUES ('1042', 19.99)");
  const { rows: [row] } = await client.query(
    `SELECT error_code, error_message
       FROM hooklane_try_publish_v2(tenant => 'acme', type => 'order.created', data => $1)`, [data]);
  console.log(`${row.error_code || 'stored'} ${row.error_message || ''}`);
  await client.query('COMMIT');
  await client.end();
})().catch((err) => { console.error(err.message); process.exitCode = 1; });
"""


def _deep(kind: str, depth: int) -> str:
    if kind == "object":
        return '{"k": ' * depth + "1" + "}" * depth
    return '{"a": ' + "[" * (depth - 1) + "1" + "]" * (depth - 1) + "}"


@pytest.mark.parametrize("kind", ["object", "array"])
@pytest.mark.parametrize("depth", [64, 65, 10_000, 20_000])
@pytest.mark.parametrize("language", ["psql", "node"])
async def test_deep_data_is_refused_in_the_row_and_the_order_commits(
    language, kind, depth, publishing_examples, dsn, db, shop, tmp_path
):
    """Nested 64 levels is taken; deeper is refused as an answer, however
    deep (PostgreSQL's own JSON parser gives up at ~14,000), and the
    order commits either way."""
    data = tmp_path / "data.json"
    data.write_text(_deep(kind, depth))
    if language == "psql":
        script = tmp_path / "deep.sql"
        script.write_text(DEEP_PSQL.replace("{path}", str(data)))
        argv = ["psql", dsn, "-X", "-A", "-t", "-f", str(script)]
        env = dict(os.environ)
    else:
        argv = ["node", "-e", DEEP_NODE, str(data)]
        env = {**os.environ, "DATABASE_URL": dsn, "NODE_PATH": str(publishing_examples / "node_modules")}
    proc = await asyncio.create_subprocess_exec(
        *argv,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    expected = "stored" if depth == 64 else "WH422 nests deeper than 64 levels"
    assert (proc.returncode, out.decode().strip(), err.decode()) == (0, expected, "")
    assert await db.fetchval("SELECT total FROM orders WHERE id = '1042'") == TOTAL
    assert await db.fetchval("SELECT count(*) FROM events") == (1 if depth == 64 else 0)
