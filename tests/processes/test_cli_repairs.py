"""The CLI's repairs and reconciliation, as a real process on a real
Postgres: `hooklane endpoint discard|replay` and `hooklane events list`."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import hooklane
from testsupport.cli import hooklane as run_cli
from testsupport.cli_repairs import published_while_a_was_deactivated
from testsupport.fixtures import add_endpoint, wait_for


async def test_discard_and_replay(dsn, db):
    await add_endpoint(db, "a", "http://127.0.0.1:9/a")
    since = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    for i in range(3):
        await hooklane.publish(db, tenant="acme", type="order.paid", data={"i": i}, id=f"e{i}")
    ids = [r["id"] for r in await db.fetch("SELECT id FROM deliveries ORDER BY id")]
    await db.execute("UPDATE deliveries SET state = 'dead', last_error = 'HTTP 500'")

    done = run_cli(dsn, "endpoint", "discard", "a", "--delivery", str(ids[0]))
    assert (done.returncode, done.stdout) == (0, "1 dead deliveries of default/a discarded\n"), done.stderr
    assert await db.fetchval("SELECT last_error FROM deliveries WHERE id = $1", ids[0]) == (
        "discarded by hooklane endpoint discard (dead of: HTTP 500)"
    )
    # the two still dead are not in flight: replay queues all three events again
    done = run_cli(dsn, "endpoint", "replay", "default/a", "--since", since)
    assert (done.returncode, done.stdout) == (0, "3 events queued again for default/a\n"), done.stderr
    assert await db.fetchval("SELECT count(*) FROM deliveries WHERE state = 'pending'") == 3
    # pending now: a second replay queues nothing
    assert run_cli(dsn, "endpoint", "replay", "a", "--since", since).stdout.startswith("0 events")

    missing = run_cli(dsn, "endpoint", "replay", "default/missing", "--since", since)
    assert (missing.returncode, missing.stderr) == (1, "default/missing not found\n")
    naive = run_cli(dsn, "endpoint", "replay", "a", "--since", "2026-03-01T12:00:00")
    assert naive.returncode == 2 and naive.stderr.startswith("hooklane: --since: needs a timezone")


async def test_events_list_prints_json_lines_and_the_next_cursor(dsn, db):
    since = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    for i in range(3):
        await hooklane.publish(db, tenant="acme", type="order.paid", data={"i": i}, id=f"e{i}")
    await hooklane.publish(db, tenant="globex", type="order.paid", data={}, id="other")

    first = run_cli(dsn, "events", "list", "--tenant", "acme", "--since", since, "--limit", "2")
    assert first.returncode == 0, first.stderr
    lines = [json.loads(line) for line in first.stdout.splitlines()]
    assert [(e["id"], e["data"], e["fanout"]) for e in lines] == [("e0", {"i": 0}, 0), ("e1", {"i": 1}, 0)]
    assert lines[0]["created_at"].endswith("Z")
    (cursor_line,) = [line for line in first.stderr.splitlines() if line.startswith("cursor: ")]
    cursor = cursor_line.removeprefix("cursor: ")

    rest = run_cli(dsn, "events", "list", "--tenant", "acme", "--since", since, "--cursor", cursor)
    assert [json.loads(line)["id"] for line in rest.stdout.splitlines()] == ["e2"]

    for args, message in (
        (["--limit", "0"], "hooklane: --limit: must be between 1 and 1000"),
        (["--cursor", "nonsense"], "hooklane: --cursor: is not a cursor this listing returned"),
        (["--until", "tomorrow"], "hooklane: --until: must be an RFC 3339 time"),
    ):
        refused = run_cli(dsn, "events", "list", "--tenant", "acme", "--since", since, *args)
        assert refused.returncode == 2 and refused.stderr.startswith(message), refused.stderr


async def test_replay_catches_up_events_published_while_the_endpoint_was_deactivated(
    dsn, db, receiver, start_worker
):
    since = await published_while_a_was_deactivated(db, receiver.url("/a"))
    done = run_cli(dsn, "endpoint", "replay", "default/a", "--since", since)
    assert (done.returncode, done.stdout) == (0, "2 events queued again for default/a\n"), done.stderr
    # pending now: not queued twice
    assert run_cli(dsn, "endpoint", "replay", "a", "--since", since).stdout.startswith("0 events")
    start_worker()
    await wait_for(lambda: len(receiver.at("/a")) == 2)
    assert [r.headers["webhook-id"] for r in receiver.at("/a")] == ["o1", "o2"]  # in the order stored
    # Nothing left to send: every delivery of a is recorded delivered, so
    # no call is still to come, and none went out twice.
    await wait_for(
        lambda: db.fetchval(
            "SELECT bool_and(d.state = 'delivered') FROM deliveries d"
            " JOIN endpoints ep ON ep.id = d.endpoint_id WHERE ep.name = 'a'"
        )
    )
    assert len(receiver.at("/a")) == 2
