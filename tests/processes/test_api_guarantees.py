"""The CLI, as a process, refuses by name the values the API answers with
a 422 (tests/db/test_api_guarantees.py): exit 2, never a database
error."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from testsupport.api_guarantees import NUL_CURSOR, OVERFLOWING_TIMES
from testsupport.cli import hooklane as run_cli
from testsupport.fixtures import add_endpoint


@pytest.mark.parametrize(
    "args",
    [
        *(["events", "list", "--tenant", "acme", "--since", text] for text in OVERFLOWING_TIMES),
        *(
            ["events", "list", "--tenant", "acme", "--since", "2026-01-01T00:00:00Z", "--until", text]
            for text in OVERFLOWING_TIMES
        ),
        ["events", "list", "--tenant", "acme", "--since", "2026-01-01T00:00:00Z", "--cursor", NUL_CURSOR],
        *(["endpoint", "replay", "default/a", "--since", text] for text in OVERFLOWING_TIMES),
    ],
)
async def test_the_cli_refuses_those_values_by_name(dsn: str, db: Any, args: list[str]) -> None:
    await add_endpoint(db, "a", "http://127.0.0.1:9/a")
    result = await asyncio.to_thread(run_cli, dsn, *args)
    option = args[-2]
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"hooklane: {option}: ") and "database" not in result.stderr
