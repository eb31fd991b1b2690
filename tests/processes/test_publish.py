"""The API and the CLI, as processes, refuse data that would be sent larger
than the limit."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import aiohttp

from hooklane.dev.postgres import free_port
from testsupport.fixtures import add_endpoint, api_process, wait_api_up
from testsupport.publish import FITS, HUGE, TINY, compact, delivered_as_checked

API_TOKEN = "publish-token-0123456789"


async def test_the_api_refuses_data_that_would_be_sent_larger_than_the_limit(dsn, db, receiver, start_worker):
    await add_endpoint(db, "a", receiver.url("/hook"))
    port = free_port()
    api = api_process(dsn, port, HOOKLANE_API_TOKENS=API_TOKEN)
    base = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {API_TOKEN}", "Content-Type": "application/json"}
    try:
        async with aiohttp.ClientSession() as session:

            async def post(data: dict) -> tuple[int, dict]:
                body = f'{{"tenant":"acme","type":"reading.taken","data":{compact(data)}}}'
                async with session.post(f"{base}/v1/events", data=body, headers=headers) as response:
                    return response.status, await response.json()

            await wait_api_up(session, base, api)
            for data in (TINY, HUGE):
                status, answer = await post(data)
                assert (status, answer["field"]) == (422, "data")
            assert await db.fetchval("SELECT count(*) FROM events") == 0
            assert (await post(FITS))[0] == 202
        await delivered_as_checked(receiver, start_worker, FITS)
    finally:
        api.kill()
        api.wait()


async def test_the_cli_refuses_data_that_would_be_sent_larger_than_the_limit(
    dsn, db, receiver, start_worker, tmp_path
):
    await add_endpoint(db, "a", receiver.url("/hook"))

    async def cli_publish(data: dict) -> subprocess.CompletedProcess:
        (tmp_path / "data.json").write_text(compact(data))
        args = ["publish", "--tenant", "acme", "--type", "reading.taken", "--data", f"@{tmp_path}/data.json"]
        return await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "hooklane.cli", *args],
            env={**os.environ, "HOOKLANE_DATABASE_URL": dsn},
            capture_output=True,
            text=True,
            timeout=60,
        )

    for data in (TINY, HUGE):
        refused = await cli_publish(data)
        assert refused.returncode == 2 and refused.stderr.startswith("hooklane: data: ")
    assert await db.fetchval("SELECT count(*) FROM events") == 0
    assert (await cli_publish(FITS)).returncode == 0
    await delivered_as_checked(receiver, start_worker, FITS)
