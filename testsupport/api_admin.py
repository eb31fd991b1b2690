"""What tests/db/test_api_admin.py, tests/processes/test_api_admin.py and
tests/unit/test_api_admin.py share."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import TestClient

from hooklane.settings import Settings
from testsupport.fixtures import in_process_api

ADMIN = "admin-token-0123456789"


INGEST = "ingest-token-0123456789"


AUTH = {"Authorization": f"Bearer {ADMIN}"}


@pytest.fixture
async def api(dsn: str, settings: Settings) -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    async with in_process_api(dsn, settings, INGEST, ADMIN) as client:
        yield client


async def call(api: TestClient, method: str, path: str, status: int = 200, **kwargs: Any) -> Any:
    response = await api.request(method, path, headers=AUTH, **kwargs)
    body = await response.json()
    assert response.status == status, body
    return body


async def kill(db: asyncpg.Connection, ids: list[int]) -> None:
    await db.execute(
        "UPDATE deliveries SET state = 'dead', last_status = 500, last_error = 'HTTP 500' "
        "WHERE id = ANY($1::bigint[])",
        ids,
    )


def openapi_document() -> Any:
    return json.loads(resources.files("hooklane.api").joinpath("openapi.json").read_text())
