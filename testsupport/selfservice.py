"""The self-service writer's database connection."""

from __future__ import annotations

import functools

import pytest

from hooklane import store


@pytest.fixture
async def connect(dsn):
    """Connections of a pool as the API's writers take them."""
    pool = await store.create_pool(dsn, min_size=0, max_size=12, server_settings=store.API_SESSION)
    yield functools.partial(store.acquire, pool)
    await pool.close()
