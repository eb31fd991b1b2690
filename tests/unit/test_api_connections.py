"""A flood of connections to `hooklane api` is logged in one line per
interval (hooklane/api/server.py)."""

from __future__ import annotations

import asyncio

import pytest

from hooklane.api import server


def test_a_flood_is_logged_in_one_line_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    async def flood() -> None:
        connections = server.Connections(1.0, 10, 2)
        for _ in range(50):
            connections.shed(server.LIMIT, ("10.0.0.1", 4000))
        for _ in range(7):
            connections.shed(server.HEADER_TIMEOUT, ("2001:db8::1", 4001, 0, 0))
        connections.shed(server.IDLE, ("10.0.0.2", 4002))
        connections._log_unlogged()
        connections.close()

    asyncio.run(flood())
    assert [r.getMessage() for r in caplog.records if r.name == "hooklane.api.server"] == [
        "connection from 10.0.0.1:4000 closed at once: 10 connections are open (HOOKLANE_API_MAX_CONNECTIONS)",
        "56 more connections shed in the last 10 s: 7 closed: no complete request head within 1 s"
        " (HOOKLANE_API_HEADER_TIMEOUT_SECONDS); 49 closed at once: 10 connections are open"
        " (HOOKLANE_API_MAX_CONNECTIONS)",
    ]
