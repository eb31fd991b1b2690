"""The connections of `hooklane api` are bounded (issue 18, hooklane/api/server.py):
a connection without a complete request head is closed after
HOOKLANE_API_HEADER_TIMEOUT_SECONDS, connections past
HOOKLANE_API_MAX_CONNECTIONS are shed at once while producers keep
publishing, both are counted and logged, and the open files limit is raised
at start. Real sockets against a real `hooklane api` and Postgres."""

from __future__ import annotations

import asyncio
import json
import re
import resource
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hooklane.api import server
from hooklane.dev.postgres import free_port
from testsupport.fixtures import api_process, wait_for

TOKEN = "9tq0oZ7qkY8v1H5XyV4m2sT3bQ0cR6eJ"
# Long enough for the waits of a loaded machine; a test never waits for it
# to pass, only for the server to act.
SERVER_ACTS_WITHIN = 30.0


@dataclass
class Api:
    process: subprocess.Popen
    port: int
    metrics_port: int
    log: Path

    async def metric(self, name: str, **labels: str) -> float:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            text = await response.text()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return sample.value
        return 0.0

    def logged(self) -> str:
        return self.log.read_text()


def start_api(dsn: str, tmp_path: Path, **env: str) -> Api:
    log = tmp_path / "api.log"
    port, metrics_port = free_port(), free_port()
    with log.open("w") as stderr:
        process = api_process(
            dsn,
            port,
            stderr=stderr,
            HOOKLANE_API_TOKENS=TOKEN,
            HOOKLANE_METRICS_PORT=str(metrics_port),
            **env,
        )
    return Api(process, port, metrics_port, log)


@asynccontextmanager
async def running(api: Api) -> AsyncIterator[Api]:
    try:
        await wait_for(lambda: _listening(api), timeout=SERVER_ACTS_WITHIN)
        yield api
    finally:
        api.process.kill()
        api.process.wait()


def _listening(api: Api) -> bool:
    assert api.process.poll() is None, f"hooklane api exited:\n{api.logged()}"
    return "hooklane api listening on" in api.logged()


async def open_connections(api: Api, expected: float) -> bool:
    return await api.metric("hooklane_api_connections_open") == expected


@contextmanager
def opened(*closers: asyncio.StreamWriter) -> Iterator[None]:
    try:
        yield
    finally:
        for writer in closers:
            writer.close()


async def until_closed(reader: asyncio.StreamReader) -> bytes:
    """What the server sent before it closed the connection."""
    received = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), SERVER_ACTS_WITHIN):
            received += chunk
    except ConnectionResetError:
        pass
    return received


async def publish(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, event_id: str) -> int:
    """POST one event on this connection, keeping it open; the status."""
    body = json.dumps({"id": event_id, "type": "order.paid", "tenant": "acme", "data": {}}).encode()
    writer.write(
        b"POST /v1/events HTTP/1.1\r\nHost: api\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), SERVER_ACTS_WITHIN)
    length = int(re.search(rb"(?i)content-length: *(\d+)", head)[1])
    await reader.readexactly(length)
    return int(head.split()[1])


async def connect(api: Api) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", api.port)


# --------------------------------------------------------------------------
# No complete request head within the bound: closed

TRICKLE_SECONDS = 0.4
TRICKLED_AT_MOST = int(SERVER_ACTS_WITHIN / TRICKLE_SECONDS)


async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
    """A request head a header line every TRICKLE_SECONDS: each line comes
    within the bound, the whole head never does. How many lines were sent
    before the server closed the connection."""
    writer.write(b"POST /v1/events HTTP/1.1\r\n")
    for lines in range(TRICKLED_AT_MOST):
        try:
            writer.write(f"X-Slow-{lines}: {lines}\r\n".encode())
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(1), TRICKLE_SECONDS)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return lines
        assert answer == b"", "answered a head that was not complete"
        return lines
    return TRICKLED_AT_MOST


async def test_a_connection_without_a_complete_head_is_closed(dsn: str, tmp_path: Path) -> None:
    async with running(start_api(dsn, tmp_path, HOOKLANE_API_HEADER_TIMEOUT_SECONDS="1")) as api:
        before = await api.metric("hooklane_api_connections_shed_total", reason="header_timeout")
        idle = await connect(api)
        request_line = await connect(api)
        trickled = await connect(api)
        with opened(idle[1], request_line[1], trickled[1]):
            request_line[1].write(b"POST /v1/events HTTP/1.1\r\n")

            *received, lines = await asyncio.gather(
                until_closed(idle[0]), until_closed(request_line[0]), trickle(*trickled)
            )
        # Closed without an answer, the trickler in the middle of its head.
        assert received == [b"", b""]
        assert 2 <= lines < TRICKLED_AT_MOST
        after = await api.metric("hooklane_api_connections_shed_total", reason="header_timeout")
        assert after == before + 3
        assert (
            "closed: no complete request head within 1 s (HOOKLANE_API_HEADER_TIMEOUT_SECONDS)"
            in api.logged()
        )


async def test_a_keep_alive_connection_gets_the_same_bound_after_each_answer(
    dsn: str, tmp_path: Path
) -> None:
    async with running(start_api(dsn, tmp_path, HOOKLANE_API_HEADER_TIMEOUT_SECONDS="1")) as api:
        idle_before = await api.metric("hooklane_api_connections_shed_total", reason="idle")
        head_before = await api.metric("hooklane_api_connections_shed_total", reason="header_timeout")
        producer = await connect(api)
        half = await connect(api)
        with opened(producer[1], half[1]):
            # Requests one after the other on one connection, each well
            # within the bound, keep it.
            for n in range(3):
                assert await publish(*producer, f"kept-{n}") == 202
            assert await publish(*half, "half") == 202
            # The start of a next head that never ends...
            half[1].write(b"GET /healthz HTTP/1.1\r\nHost: api\r\n")
            # ...and nothing at all after an answer: both closed.
            assert await asyncio.gather(until_closed(producer[0]), until_closed(half[0])) == [b"", b""]
        assert await api.metric("hooklane_api_connections_shed_total", reason="idle") == idle_before + 1
        assert (
            await api.metric("hooklane_api_connections_shed_total", reason="header_timeout")
            == head_before + 1
        )
        assert await api.metric("hooklane_api_connections_open") == 0


# --------------------------------------------------------------------------
# Past the limit: shed at once, producers keep publishing

LIMIT = 20


async def test_connections_past_the_limit_are_shed_while_producers_publish(dsn: str, tmp_path: Path) -> None:
    # A long header timeout, so that the idle connections below stay until closed here.
    api = start_api(
        dsn, tmp_path, HOOKLANE_API_MAX_CONNECTIONS=str(LIMIT), HOOKLANE_API_HEADER_TIMEOUT_SECONDS="300"
    )
    async with running(api):
        before = await api.metric("hooklane_api_connections_shed_total", reason="limit")
        producer = await connect(api)
        assert await publish(*producer, "before-the-flood") == 202
        idle = [await connect(api) for _ in range(LIMIT - 1)]
        with opened(producer[1], *(writer for _, writer in idle)):
            await wait_for(lambda: open_connections(api, LIMIT))
            extra = [await connect(api) for _ in range(5)]
            answers = await asyncio.gather(*(until_closed(reader) for reader, _ in extra))
            for answer in answers:
                assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), answer
                assert b"Retry-After: 2\r\n" in answer and b'"error": "unavailable"' in answer
            assert await api.metric("hooklane_api_connections_shed_total", reason="limit") == before + 5
            # Liveness, probed on the metrics port, holds: the flood must not get the pod restarted.
            url = f"http://127.0.0.1:{api.metrics_port}/healthz"
            async with aiohttp.ClientSession() as session, session.get(url) as response:
                assert response.status == 200
            # The producer's connection, open before, still publishes.
            assert await publish(*producer, "during-the-flood") == 202
            for _, writer in idle:
                writer.close()
            # Once there is room again, a new connection publishes too.
            await wait_for(lambda: open_connections(api, 1))
            newcomer = await connect(api)
            with opened(newcomer[1]):
                assert await publish(*newcomer, "after-the-flood") == 202
        assert f"closed at once: {LIMIT} connections are open (HOOKLANE_API_MAX_CONNECTIONS)" in api.logged()
        # Logged once at once; the four after it are counted in one line
        # (LOG_INTERVAL_SECONDS later, the test does not wait for it).
        assert api.logged().count("closed at once") == 1


# --------------------------------------------------------------------------
# The open files limit


def _open_files(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open files limit")


async def test_the_open_files_limit_is_raised_to_the_hard_one(dsn: str, tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 2048:
        pytest.fail(f"the hard open files limit ({hard}) leaves no room to test raising it")
    # A container's usual soft limit, inherited by the API, which raises it.
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        api = start_api(dsn, tmp_path)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    async with running(api):
        assert _open_files(api.process.pid) == (hard, hard)
        assert f"open files limit raised from 1024 to {hard}" in api.logged()


def test_a_limit_that_cannot_fit_in_the_open_files_limit_is_refused_at_start() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    too_many = hard - server.FD_MARGIN
    # Refused before any connection to the database, which is not there.
    nowhere = f"postgresql://postgres@127.0.0.1:{free_port()}/hooklane"
    api = api_process(
        nowhere,
        free_port(),
        stderr=subprocess.PIPE,
        HOOKLANE_API_TOKENS=TOKEN,
        HOOKLANE_API_MAX_CONNECTIONS=str(too_many),
    )
    try:
        _, raw = api.communicate(timeout=SERVER_ACTS_WITHIN)
    finally:
        api.kill()
    stderr = raw.decode()
    assert api.returncode == 2, stderr
    assert (
        f"hooklane: HOOKLANE_API_MAX_CONNECTIONS: {too_many} connections, 10 to the database and"
        f" {server.FD_MARGIN} other files need {too_many + 10 + server.FD_MARGIN} open files, but this"
        f" process may open {hard} (RLIMIT_NOFILE)"
    ) in stderr
