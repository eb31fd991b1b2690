"""The operator's sync against a real Postgres, of a spec the parser or
Postgres refuses: reported once on the resource, not retried; an aborted
statement is retried."""

from __future__ import annotations

from datetime import UTC, datetime

import kopf
import pytest

from hooklane import store
from hooklane.operator import handlers, reflect
from hooklane.settings import Settings

NAMESPACE, NAME = "shop", "orders"
SPEC = {
    "tenant": "acme",
    "url": "https://receiver.example/refused",
    "secretRef": {"name": "orders-secret", "key": "secret"},
}


@pytest.fixture
async def memo(settings: Settings):
    memo = kopf.Memo()
    memo.config = settings
    memo.pool = await store.create_pool(settings.database_url, min_size=0, max_size=2)
    memo.tracked = {}
    memo.at_start = handlers.AtStart()
    yield memo
    await memo.pool.close()


async def _sync(memo: kopf.Memo, spec: dict = SPEC) -> reflect.Synced | None:
    endpoints = {(NAMESPACE, NAME): [handlers.Declared.of(spec, 1, "uid-1", {})]}
    return await handlers._sync(memo, endpoints, {}, NAMESPACE, NAME)


async def test_a_spec_postgres_refuses_is_reported_once_and_not_retried(db, memo):
    # No spec the parser accepts breaks a constraint of the schema, so the
    # test adds one: the refusal is still a real one, from the real upsert.
    await db.execute("ALTER TABLE endpoints ADD CONSTRAINT no_refused CHECK (url NOT LIKE '%refused')")
    synced = await _sync(memo)  # returns: kopf has nothing to retry
    assert synced is not None and synced.reason == reflect.Reason.STORE_REFUSED
    assert "no_refused" in synced.message
    assert await db.fetchval("SELECT count(*) FROM endpoints") == 0
    tracked = memo.tracked[(NAMESPACE, NAME)]
    assert not tracked.stale  # nor does the status pass try again

    first = reflect.reflect(previous={}, queue=None, synced=synced, now=datetime.now(UTC), age_resolution=10)
    ready = next(c for c in first.patch["conditions"] if c["type"] == reflect.READY)
    assert (ready["status"], ready["reason"]) == ("False", "StoreRefused")
    assert [(e.type, e.reason) for e in first.events] == [("Warning", "StoreRefused")]
    again = reflect.reflect(
        previous=first.patch, queue=None, synced=tracked.synced, now=datetime.now(UTC), age_resolution=10
    )
    assert again.events == []

    # once Postgres accepts it, the same sync stores it
    await db.execute("ALTER TABLE endpoints DROP CONSTRAINT no_refused")
    assert (await _sync(memo)).reason == reflect.Reason.SECRET_MISSING
    assert await db.fetchval("SELECT count(*) FROM endpoints") == 1


async def test_an_aborted_upsert_is_retried(db, dsn, memo):
    await memo.pool.close()
    memo.pool = await store.create_pool(dsn, min_size=0, max_size=1, server_settings={"lock_timeout": "50ms"})
    async with db.transaction():
        await db.execute("LOCK TABLE endpoints IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(kopf.TemporaryError) as raised:
            await _sync(memo)
    assert raised.value.delay == handlers.RETRY_DELAY_SECONDS and "lock timeout" in str(raised.value)
    assert memo.tracked[(NAMESPACE, NAME)].synced is None
    assert (await _sync(memo)).reason == reflect.Reason.SECRET_MISSING


async def test_an_on_dead_delivery_the_crd_let_through_is_an_invalid_spec_naming_it(db, memo):
    # What a CRD older than the field, or without its enum, would store.
    synced = await _sync(memo, {**SPEC, "ordering": {"onDeadDelivery": "hold"}})
    assert synced is not None and synced.reason == reflect.Reason.INVALID_SPEC
    assert synced.message == "spec.ordering.onDeadDelivery: must be one of Hold, Skip, not 'hold'"
    assert await db.fetchval("SELECT count(*) FROM endpoints") == 0
