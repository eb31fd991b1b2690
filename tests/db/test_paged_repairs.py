"""The repairs that may touch many rows (a replay, a resend or a discard of
every dead delivery), through the tenant API, the portal and the admin
API on a real Postgres: each page commits on its own and checks the
endpoint's tenant, a repair stops before its deadline and says how far it
got, and its continuation finishes the job with each delivery queued once.
And the shares of the API's pool: tenants holding theirs never keep a
producer waiting."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import REGISTRY

from hooklane import store
from hooklane.api.app import make_app
from hooklane.api.auth import PORTAL_COOKIE, token_sources
from hooklane.api.portal import FLASH_COOKIE
from hooklane.settings import Settings
from hooklane.store.deliveries import REPLAY_PAGE
from hooklane.tokens import Tokens
from testsupport.fixtures import add_endpoint, wait_for

ADMIN = "admin-token-0123456789"


INGEST = "ingest-token-0123456789"


ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN}"}


INGEST_AUTH = {"Authorization": f"Bearer {INGEST}"}


# Nothing listens here, and no worker runs: what is queued stays queued.
NOWHERE = "http://127.0.0.1:9/hook"


REPLAY = "/v1/tenant/endpoints/default/orders/replay"


SINCE = "2000-01-01T00:00:00Z"


# Long enough that a statement blocked on purpose by a test outlasts any
# pause of a busy machine: the test releases it.
LOCK_WAIT = {"lock_timeout": "120s"}


@asynccontextmanager
async def api_of(settings: Settings, session: dict[str, str] | None = None) -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    """``hooklane api``'s app on loopback with ``settings``, its pool's
    sessions set as the API's (and ``session`` over them)."""
    configured = replace(
        settings,
        api_tokens=Tokens.parse(INGEST, "HOOKLANE_API_TOKENS"),
        admin_tokens=Tokens.parse(ADMIN, "HOOKLANE_ADMIN_TOKENS"),
    )
    pool = await store.create_pool(
        settings.database_url,
        min_size=0,
        max_size=configured.api_pool_size,
        server_settings={**store.API_SESSION, **(session or {})},
    )
    try:
        async with TestClient(TestServer(make_app(configured, pool, *token_sources(configured)))) as client:
            yield client
    finally:
        await pool.close()


async def tenant_token(api: TestClient, tenant: str, access: str = "resend") -> dict[str, str]:  # type: ignore[type-arg]
    response = await api.post(
        "/v1/admin/portal-sessions",
        headers=ADMIN_AUTH,
        json={"tenant": tenant, "access": access, "kind": "token"},
    )
    body = await response.json()
    assert response.status == 201, body
    return {"Authorization": f"Bearer {body['token']}"}


async def stored_events(db: asyncpg.Connection, tenant: str, count: int) -> None:
    """``count`` events of ``tenant`` stored as publish stores them when no
    endpoint receives them (so that none has a delivery yet), in id order
    within one transaction: the order a replay pages through them."""
    await db.execute(
        "INSERT INTO events (id, tenant, type, data, fanout)"
        " SELECT format('e-%s', lpad(n::text, 6, '0')), $1, 'order.paid', '{}', 0"
        " FROM generate_series(1, $2) n",
        tenant,
        count,
    )


async def queued(db: asyncpg.Connection, endpoint: str = "orders") -> list[tuple[str, int]]:
    """(event id, deliveries) of each event with a delivery to ``endpoint``."""
    rows = await db.fetch(
        "SELECT d.event_id, count(*) AS n FROM deliveries d JOIN endpoints ep ON ep.id = d.endpoint_id"
        " WHERE ep.name = $1 GROUP BY d.event_id ORDER BY d.event_id",
        endpoint,
    )
    return [(r["event_id"], r["n"]) for r in rows]


async def lock_waiters(db: asyncpg.Connection) -> int:
    """Backends of this database waiting for a lock."""
    return await db.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )


def pool_waits(share: str) -> float:
    return REGISTRY.get_sample_value("hooklane_api_pool_wait_seconds_count", {"share": share}) or 0.0


async def test_a_large_tenant_replay_commits_as_it_goes_and_its_continuation_queues_each_event_once(
    settings, db
):
    events = 30 * REPLAY_PAGE
    await add_endpoint(db, "orders", NOWHERE, tenant="acme")
    await stored_events(db, "acme", events)
    answers = []
    # A deadline short enough that a page of a thousand inserts fits a few
    # times, not thirty.
    async with api_of(replace(settings, api_ack_timeout_seconds=0.5)) as api:
        headers = await tenant_token(api, "acme")
        body: dict[str, Any] = {"since": SINCE}
        while len(answers) < 200:
            response = await api.post(REPLAY, headers=headers, json=body)
            answer = await response.json()
            assert response.status == 200, answer
            answers.append(answer)
            # Committed when answered, seen from another session.
            assert sum(n for _, n in await queued(db)) == sum(a["replayed"] for a in answers)
            if answer["complete"]:
                break
            body = {"since": SINCE, "cursor": answer["next_cursor"]}
    assert len(answers) > 1, "the replay never stopped at its deadline"
    assert answers[0]["complete"] is False and answers[0]["replayed"] > 0
    assert answers[-1]["next_cursor"] is None
    assert sum(a["replayed"] for a in answers) == events
    counted = await queued(db)
    assert len(counted) == events and {n for _, n in counted} == {1}


async def test_a_portal_replay_that_stops_leaves_its_form_set_to_continue(settings, db):
    events = 30 * REPLAY_PAGE
    await add_endpoint(db, "orders", NOWHERE, tenant="acme")
    await stored_events(db, "acme", events)
    async with api_of(replace(settings, api_ack_timeout_seconds=0.5)) as api:
        # A tenant token is a portal session too (the same grant).
        token = (await tenant_token(api, "acme"))["Authorization"].removeprefix("Bearer ")
        cookie = f"{PORTAL_COOKIE}={token}"
        page = "/portal/endpoints/default/orders"
        form = {"since": SINCE}
        replayed = 0
        for _ in range(200):
            response = await api.post(
                page + "/replay",
                data=form,
                headers={"Cookie": cookie, "Sec-Fetch-Site": "same-origin"},
                allow_redirects=False,
            )
            assert response.status == 303, await response.text()
            location = urlsplit(response.headers["Location"])
            assert location.path == page
            flash = response.cookies[FLASH_COOKIE].value
            shown = await (
                await api.get(
                    response.headers["Location"], headers={"Cookie": f"{cookie}; {FLASH_COOKIE}={flash}"}
                )
            ).text()
            api.session.cookie_jar.clear()
            replayed = sum(n for _, n in await queued(db))
            if not location.query:
                # (The last may find nothing left: the one before it
                # stopped at the very end.)
                assert "queued to be sent again." in shown or "No events to send again" in shown
                assert "Continue the replay" not in shown and 'name="cursor"' not in shown
                break
            query = parse_qs(location.query)
            assert "time ran out before the others" in shown and "Continue the replay" in shown
            assert f'name="cursor" value="{query["replay_cursor"][0]}"' in shown
            form = {"since": query["replay_since"][0], "cursor": query["replay_cursor"][0]}
        assert form.get("cursor"), "the replay never stopped at its deadline"
    assert replayed == events
    assert {n for _, n in await queued(db)} == {1}


async def test_an_endpoint_moved_to_another_tenant_between_pages_stops_the_replay(settings, db, dsn):
    await add_endpoint(db, "orders", NOWHERE, tenant="acme")
    await stored_events(db, "acme", 3 * REPLAY_PAGE)
    second_page = f"e-{REPLAY_PAGE + 1:06d}"
    holder = await asyncpg.connect(dsn)
    mover = await store.connect(dsn)
    try:
        async with api_of(replace(settings, api_ack_timeout_seconds=120), LOCK_WAIT) as api:
            headers = await tenant_token(api, "acme")
            # The second page's first delivery waits for its event, which
            # this transaction holds: the first page has committed by then.
            held = holder.transaction()
            await held.start()
            await holder.execute(
                "SELECT FROM events WHERE tenant = 'acme' AND id = $1 FOR UPDATE", second_page
            )
            replay = asyncio.create_task(api.post(REPLAY, headers=headers, json={"since": SINCE}))
            await wait_for(lambda: lock_waiters(db))
            assert len(await queued(db)) == REPLAY_PAGE
            # The endpoint moves while the second page runs, which then
            # ends, and the third finds it gone.
            await add_endpoint(mover, "orders", NOWHERE, tenant="globex")
            await held.rollback()
            response = await replay
            answer = await response.json()
    finally:
        await holder.close()
        await mover.close()
    assert response.status == 404, answer
    assert sum(n for _, n in await queued(db)) == 2 * REPLAY_PAGE


async def test_a_page_still_running_at_the_deadline_is_cut_off_and_the_replay_says_where_it_stopped(
    settings, db, dsn
):
    await add_endpoint(db, "orders", NOWHERE, tenant="acme")
    await stored_events(db, "acme", 2 * REPLAY_PAGE)
    holder = await asyncpg.connect(dsn)
    try:
        async with api_of(replace(settings, api_ack_timeout_seconds=2.0), LOCK_WAIT) as api:
            headers = await tenant_token(api, "acme")
            # The second page waits for an event this transaction holds,
            # far past the request's deadline.
            held = holder.transaction()
            await held.start()
            await holder.execute(
                "SELECT FROM events WHERE tenant = 'acme' AND id = $1 FOR UPDATE", f"e-{REPLAY_PAGE + 1:06d}"
            )
            response = await api.post(REPLAY, headers=headers, json={"since": SINCE})
            stopped = await response.json()
            assert response.status == 200, stopped
            assert stopped["replayed"] == REPLAY_PAGE and stopped["complete"] is False
            # Its connection closed, the server ended the waiting statement.
            await wait_for(lambda: _none(lock_waiters(db)))
            await held.rollback()
            response = await api.post(
                REPLAY, headers=headers, json={"since": SINCE, "cursor": stopped["next_cursor"]}
            )
            rest = await response.json()
    finally:
        await holder.close()
    assert rest == {"replayed": REPLAY_PAGE, "complete": True, "next_cursor": None}
    counted = await queued(db)
    assert len(counted) == 2 * REPLAY_PAGE and {n for _, n in counted} == {1}


async def _none(count: Any) -> bool:
    return await count == 0


async def _at_least(count: Any, wanted: int) -> bool:
    return await count >= wanted


async def dead_deliveries(db: asyncpg.Connection, tenant: str, count: int) -> None:
    await stored_events(db, tenant, count)
    await db.execute(
        "INSERT INTO deliveries (endpoint_id, event_tenant, event_id, state, attempts, last_error)"
        " SELECT ep.id, e.tenant, e.id, 'dead', 5, 'HTTP 500'"
        " FROM events e JOIN endpoints ep ON ep.name = 'orders' WHERE e.tenant = $1",
        tenant,
    )


async def states(db: asyncpg.Connection) -> dict[str, int]:
    return dict(await db.fetch("SELECT state, count(*) FROM deliveries GROUP BY state"))


@pytest.mark.parametrize(
    ("path", "key", "state", "tenant"),
    [
        ("/v1/tenant/endpoints/default/orders/resend-dead", "resent", "pending", True),
        ("/v1/admin/endpoints/default/orders/resend-dead", "resent", "pending", False),
        ("/v1/admin/endpoints/default/orders/discard-dead", "discarded", "discarded", False),
    ],
)
async def test_every_dead_delivery_is_repaired_page_by_page_and_again_until_complete(
    settings, db, path, key, state, tenant
):
    dead = 40_000
    await add_endpoint(db, "orders", NOWHERE, tenant="acme")
    await dead_deliveries(db, "acme", dead)
    answers = []
    async with api_of(replace(settings, api_ack_timeout_seconds=0.3)) as api:
        headers = await tenant_token(api, "acme") if tenant else ADMIN_AUTH
        while len(answers) < 200:
            response = await api.post(path, headers=headers)
            answer = await response.json()
            assert response.status == 200, answer
            answers.append(answer)
            assert (await states(db)).get(state, 0) == sum(a[key] for a in answers)
            if answer["complete"]:
                break
    assert len(answers) > 1 and answers[0]["complete"] is False
    assert sum(a[key] for a in answers) == dead
    assert await states(db) == {state: dead}


async def test_tenants_holding_their_share_of_the_pool_never_delay_ingest(settings, db, dsn):
    await add_endpoint(db, "orders", NOWHERE, tenant="acme")
    await stored_events(db, "acme", 10)
    shares = replace(
        settings,
        api_ack_timeout_seconds=120,
        api_pool_size=10,
        api_pool_ingest_reserved=4,
        api_pool_tenant_max=3,
    )
    holder = await asyncpg.connect(dsn)
    try:
        async with api_of(shares, LOCK_WAIT) as api:
            headers = await tenant_token(api, "acme")
            # Every replay waits for the endpoint, which this transaction
            # holds: twelve slow tenant requests from one token.
            held = holder.transaction()
            await held.start()
            await holder.execute("SELECT FROM endpoints WHERE name = 'orders' FOR UPDATE")
            waited = pool_waits("tenant")
            replays = [
                asyncio.create_task(api.post(REPLAY, headers=headers, json={"since": SINCE}))
                for _ in range(12)
            ]
            # The tenants' share held in full, the other nine queued behind it.
            await wait_for(lambda: _at_least(lock_waiters(db), 3))
            await wait_for(lambda: pool_waits("tenant") - waited >= 3)
            published = await api.post(
                "/v1/events",
                headers=INGEST_AUTH,
                json={"id": "while-held", "type": "order.paid", "tenant": "globex", "data": {}},
            )
            assert published.status == 202, await published.text()
            assert not any(r.done() for r in replays)
            assert await lock_waiters(db) == 3
            await held.rollback()
            answers = [await (await r).json() for r in replays]
    finally:
        await holder.close()
    # (Replays running at once may each queue an event: receivers
    # deduplicate on webhook-id.)
    assert all(a["complete"] for a in answers)
    assert [e for e, _ in await queued(db)] == [f"e-{n:06d}" for n in range(1, 11)]
    assert await db.fetchval("SELECT count(*) FROM events WHERE id = 'while-held'") == 1
