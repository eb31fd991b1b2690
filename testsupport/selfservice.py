"""The self-service writer's database connection."""

from __future__ import annotations

import functools

import pytest
from hypothesis import strategies as st

from hooklane import store
from hooklane.selfservice import (
    EndpointForm,
)
from hooklane.settings import Settings


@pytest.fixture
async def connect(dsn):
    """Connections of a pool as the API's writers take them."""
    pool = await store.create_pool(dsn, min_size=0, max_size=12, server_settings=store.API_SESSION)
    yield functools.partial(store.acquire, pool)
    await pool.close()


PORTAL = {"portal_namespace": "portal", "portal_https_only": False}


BOUNDS = Settings(**PORTAL)


FORM = EndpointForm("orders", "https://hooks.acme.example/orders", ("order.*",))


patterns = st.one_of(
    st.just("*"),
    st.from_regex(r"[a-c](\.[a-c]){0,2}(\.\*)?", fullmatch=True),
)
