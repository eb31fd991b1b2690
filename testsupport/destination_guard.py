"""What tests/db/test_destination_guard.py,
tests/processes/test_destination_guard.py and
tests/unit/test_destination_guard.py share."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

import hooklane
from hooklane.guard import parse_networks
from testsupport.fixtures import LOOPBACK, add_endpoint

ALLOWED = parse_networks(LOOPBACK)


class Listener:
    """HTTP/1.1 on 127.0.0.1 and ::1, one port: counts every connection it
    accepts and answers every request 204."""

    def __init__(self) -> None:
        self.accepted = 0
        self.requests = 0
        self.port = 0
        self._servers: list[asyncio.Server] = []

    def url(self, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}/hook"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            self.requests += 1
            writer.write(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> Listener:
        # The port is free on 127.0.0.1; it almost always is on ::1 too.
        for _ in range(20):
            v4 = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            port = v4.sockets[0].getsockname()[1]
            try:
                v6 = await asyncio.start_server(self._serve, "::1", port)
            except OSError:
                v4.close()
                await v4.wait_closed()
                continue
            self._servers, self.port = [v4, v6], port
            return self
        raise RuntimeError("no port free on both 127.0.0.1 and ::1")

    async def __aexit__(self, *exc: object) -> None:
        for server in self._servers:
            server.close()
            await server.wait_closed()


@pytest.fixture
async def listener() -> AsyncIterator[Listener]:
    async with Listener() as server:
        yield server


async def add_listener_endpoints(db, listener: Listener, hosts: list[str]) -> None:
    # Inserted behind URL validation (which refuses some of these spellings
    # outright): the guard must hold whatever got into the table.
    for i, host in enumerate(hosts):
        await add_endpoint(db, f"e{i}", listener.url(host), timeout_seconds=2)
    await hooklane.publish(db, tenant="acme", type="probe", data={})


async def outcomes_by_host(db, n: int) -> dict[str, tuple[str, str | None]] | None:
    rows = await db.fetch(
        """
        SELECT e.url, d.state, d.last_error FROM deliveries d JOIN endpoints e ON e.id = d.endpoint_id
        WHERE d.attempts >= 1 AND d.state <> 'sending'
        """
    )
    if len(rows) < n:
        return None
    return {r["url"].split("//")[1].rsplit(":", 1)[0]: (r["state"], r["last_error"]) for r in rows}
