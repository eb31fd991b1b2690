"""An event posted to the real ``hooklane api`` process is delivered."""

from __future__ import annotations

import json
import signal

import aiohttp
import asyncpg

from hooklane.dev.postgres import free_port
from testsupport.api_ingest import AUTH, EVENT, TOKEN
from testsupport.fixtures import LOOPBACK, add_endpoint, api_process, wait_api_up, wait_for, worker_process


async def test_an_event_posted_to_hooklane_api_is_delivered(
    dsn: str, db: asyncpg.Connection, receiver
) -> None:
    await add_endpoint(db, "orders", receiver.url("/hook"))
    port = free_port()
    api = api_process(dsn, port, HOOKLANE_API_TOKENS=TOKEN, HOOKLANE_ALLOWED_NETWORKS=LOOPBACK)
    worker = worker_process(dsn)
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            await wait_api_up(session, base, api)
            async with session.post(
                f"{base}/v1/events", json={**EVENT, "id": "e2e-1"}, headers=AUTH
            ) as response:
                assert response.status == 202
                assert await response.json() == {"id": "e2e-1"}
        [arrived] = await wait_for(lambda: receiver.at("/hook"), timeout=30)
        assert arrived.headers["webhook-id"] == "e2e-1"
        assert json.loads(arrived.body)["data"] == {"order": 1}
        api.send_signal(signal.SIGTERM)
        assert api.wait(timeout=30) == 0
    finally:
        for proc in (api, worker):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
