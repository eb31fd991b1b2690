"""Property tests on a real Postgres: what ``check_event`` accepts,
``publish`` stores."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
from hypothesis import HealthCheck, given, settings

import hooklane
from hooklane.errors import InvalidInput
from testsupport.fuzz_input import EVENTS, numbers_as_floats


async def _publish_or_refuse(conn: asyncpg.Connection, event: dict[str, Any]) -> None:
    async with conn.transaction():
        await conn.execute("INSERT INTO fuzz_marker VALUES (1)")
        try:
            event_id = await hooklane.publish(conn, **event)
        except InvalidInput:
            assert await conn.fetchval("SELECT count(*) FROM events") == 0
        else:
            stored = await conn.fetchval("SELECT data::text FROM events WHERE id = $1", event_id)
            assert numbers_as_floats(json.loads(stored)) == numbers_as_floats(event["data"])
        # The caller's transaction goes on either way.
        assert await conn.fetchval("SELECT count(*) FROM fuzz_marker") >= 1
        await conn.execute("DELETE FROM events")


def test_publish_stores_what_check_event_accepts(dsn):
    with asyncio.Runner() as runner:
        conn = runner.run(asyncpg.connect(dsn))
        runner.run(conn.execute("CREATE TABLE fuzz_marker (n int)"))

        @settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(event=EVENTS)
        def publish_or_refuse(event):
            runner.run(_publish_or_refuse(conn, event))

        try:
            publish_or_refuse()
            assert runner.run(conn.fetchval("SELECT count(*) FROM fuzz_marker")) > 0
        finally:
            runner.run(conn.close())
