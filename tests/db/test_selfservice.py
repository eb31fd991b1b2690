"""Self-service endpoints on a real Postgres: the local writer
(hooklane/api/endpoint_writers.py) holding a tenant's form to its rules,
and the patterns agreeing with the database's. The rules alone are
tests/unit/test_selfservice.py's, the Kubernetes writer
tests/kube/test_selfservice_kubernetes.py's."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook

import hooklane
from hooklane import store
from hooklane.api.endpoint_writers import KubernetesWriter, LocalWriter, make_writer, new_secret
from hooklane.api.errors import Refused
from hooklane.checks import EVENT_TYPE_PATTERN
from hooklane.delivery import DeliverySpec
from hooklane.errors import InvalidInput
from hooklane.selfservice import (
    EndpointForm,
    resource_name,
    spec_for,
    tenant_key,
    within,
)
from hooklane.settings import Settings
from hooklane.signing import parse_secret
from testsupport.fixtures import wait_for
from testsupport.receivers import Answer
from testsupport.selfservice import BOUNDS, FORM, PORTAL, patterns

types = st.lists(st.from_regex(r"[a-c](\.[a-c]){0,3}", fullmatch=True), min_size=1, max_size=20)


@hypothesis_settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(pattern=patterns, rule=patterns, sample=types)
def test_within_agrees_with_hooklane_type_matches(db_sync, pattern, rule, sample):
    """What a pattern within a rule lets through, the rule lets through, as
    Postgres routes events (hooklane_type_matches)."""
    assert re.fullmatch(EVENT_TYPE_PATTERN, pattern) and re.fullmatch(EVENT_TYPE_PATTERN, rule)
    rows = db_sync(
        "SELECT t, hooklane_type_matches(ARRAY[%s], t), hooklane_type_matches(ARRAY[%s], t)"
        " FROM unnest(%s::text[]) AS t",
        pattern,
        rule,
        [*sample, pattern.replace("*", "a")],
    )
    if within(pattern, rule):
        assert all(by_rule for _, by_pattern, by_rule in rows if by_pattern), rows
    elif pattern != "*" and not pattern.endswith(".*"):
        # An exact type outside the rule: that very type is refused by it.
        assert not db_sync("SELECT hooklane_type_matches(ARRAY[%s], %s)", rule, pattern)[0][0]


@pytest.fixture
def portal_settings(settings) -> Settings:
    return dataclasses.replace(settings, portal_endpoints="local", portal_max_endpoints=3, **PORTAL)


@pytest.fixture
def writer(portal_settings, connect) -> LocalWriter:
    made = make_writer(portal_settings, connect)
    assert isinstance(made, LocalWriter)
    return made


async def row(db, name: str, namespace: str = "portal"):
    return await db.fetchrow("SELECT * FROM endpoints WHERE namespace = $1 AND name = $2", namespace, name)


async def test_make_writer_follows_the_mode(portal_settings, connect):
    assert make_writer(dataclasses.replace(portal_settings, portal_endpoints="off"), connect) is None
    assert isinstance(
        make_writer(dataclasses.replace(portal_settings, portal_endpoints="kubernetes"), connect),
        KubernetesWriter,
    )


async def test_a_created_endpoint_is_the_row_endpoint_apply_writes(writer, db, receiver, start_worker):
    url = receiver.on("hooks", Answer(204))
    created = await writer.create("acme", dataclasses.replace(FORM, url=url))
    assert (created.namespace, created.name) == ("portal", resource_name("acme", "orders"))
    stored = await row(db, created.name)
    assert (stored["tenant"], stored["url"], stored["event_types"], stored["secret"]) == (
        "acme",
        url,
        ["order.*"],
        created.secret,
    )
    start_worker()
    async with db.transaction():
        await hooklane.publish(db, tenant="acme", type="order.created", data={"n": 1})
    (got,) = await wait_for(lambda: receiver.at("hooks"))
    assert Webhook(created.secret).verify(got.body, got.headers)["data"] == {"n": 1}


async def test_names_are_per_tenant(writer, db):
    ours = await writer.create("acme", FORM)
    theirs = await writer.create("globex", FORM)
    assert ours.name != theirs.name
    with pytest.raises(Refused) as caught:
        await writer.create("acme", dataclasses.replace(FORM, url="https://elsewhere.example/"))
    assert (caught.value.status, caught.value.code, caught.value.field) == (409, "exists", "name")
    assert (await row(db, ours.name))["url"] == FORM.url


async def test_a_tenant_gets_at_most_its_bound(writer, db):
    for i in range(3):
        await writer.create("acme", dataclasses.replace(FORM, name=f"e{i}"))
    with pytest.raises(Refused) as caught:
        await writer.create("acme", dataclasses.replace(FORM, name="e3"))
    assert (caught.value.status, caught.value.code) == (409, "endpoint_limit")
    assert "at most 3" in caught.value.detail
    # Another tenant's, and the same tenant's in other namespaces, do not count.
    await writer.create("globex", FORM)
    await store.upsert_endpoint(
        db, dataclasses.replace(spec_for("acme", FORM, BOUNDS), namespace="shop"), new_secret()
    )
    assert await writer.delete("acme", "portal", resource_name("acme", "e0"))
    await writer.create("acme", dataclasses.replace(FORM, name="e3"))


async def test_concurrent_creates_keep_to_the_bound(writer, db):
    forms = [dataclasses.replace(FORM, name=f"e{i}") for i in range(10)]
    results = await asyncio.gather(*(writer.create("acme", f) for f in forms), return_exceptions=True)
    refused = [r for r in results if isinstance(r, Refused)]
    assert len(refused) == 7 and {r.code for r in refused} == {"endpoint_limit"}
    assert await db.fetchval("SELECT count(*) FROM endpoints WHERE tenant = 'acme'") == 3


async def test_an_edit_changes_what_the_form_sets_and_keeps_the_rest(writer, db, portal_settings):
    created = await writer.create("acme", FORM)
    # What the platform set itself (endpoint apply): kept by the edit.
    spec = spec_for("acme", FORM, BOUNDS)
    platform = dataclasses.replace(spec, delivery=DeliverySpec(rate_per_second=5, burst=2, max_attempts=3))
    await store.upsert_endpoint(db, platform, created.secret)
    assert await writer.set_paused("acme", "portal", created.name, True)

    edited = EndpointForm("orders", "https://new.acme.example/", ("order.created",), 2, 3)
    assert await writer.update("acme", "portal", created.name, edited)
    stored = await row(db, created.name)
    assert (stored["url"], stored["event_types"], stored["max_concurrency"], stored["timeout_seconds"]) == (
        "https://new.acme.example/",
        ["order.created"],
        2,
        3,
    )
    assert (stored["paused"], stored["secret"], stored["previous_secret"]) == (True, created.secret, None)
    assert (stored["rate_per_second"], stored["rate_burst"], stored["max_attempts"]) == (5, 2, 3)

    with pytest.raises(InvalidInput) as caught:
        await writer.update("acme", "portal", created.name, dataclasses.replace(edited, name="renamed"))
    assert caught.value.field == "name"
    with pytest.raises(InvalidInput) as caught:
        await writer.update("acme", "portal", created.name, dataclasses.replace(edited, max_concurrency=0))
    assert caught.value.field == "max_concurrency"


async def test_an_edit_keeps_a_value_beyond_the_bound_and_may_not_raise_it(writer, db):
    created = await writer.create("acme", FORM)
    # The platform raises it itself (endpoint apply), which no bound holds.
    spec = spec_for("acme", FORM, BOUNDS)
    await store.upsert_endpoint(
        db, dataclasses.replace(spec, max_concurrency=16, timeout_seconds=30), created.secret
    )
    kept = dataclasses.replace(FORM, url="https://new.acme.example/", max_concurrency=16, timeout_seconds=30)
    assert await writer.update("acme", "portal", created.name, kept)
    for raised in ({"max_concurrency": 17}, {"timeout_seconds": 31}):
        with pytest.raises(InvalidInput) as caught:
            await writer.update(
                "acme", "portal", created.name, dataclasses.replace(kept, url="https://x.example/", **raised)
            )
        assert caught.value.field in raised
    stored = await row(db, created.name)
    assert (stored["url"], stored["max_concurrency"], stored["timeout_seconds"]) == (
        "https://new.acme.example/",
        16,
        30,
    )


async def test_the_tenant_chooses_what_a_dead_ordered_delivery_does(writer, db):
    created = await writer.create("acme", dataclasses.replace(FORM, ordering_on_dead="Skip"))
    assert (await row(db, created.name))["ordering_on_dead"] == "skip"
    # A pause and a rotation write the row back whole: the choice stays.
    assert await writer.set_paused("acme", "portal", created.name, True)
    assert await writer.rotate_secret("acme", "portal", created.name)
    assert (await row(db, created.name))["ordering_on_dead"] == "skip"
    with pytest.raises(InvalidInput) as caught:
        await writer.update(
            "acme", "portal", created.name, dataclasses.replace(FORM, ordering_on_dead="skip")
        )
    assert (caught.value.field, caught.value.message) == (
        "ordering_on_dead",
        "must be one of Hold, Skip, not 'skip'",
    )
    # An edit sets every field again: left out, it is the default, Hold.
    assert await writer.update("acme", "portal", created.name, FORM)
    assert (await row(db, created.name))["ordering_on_dead"] == "hold"


async def test_pause_and_resume(writer, db):
    created = await writer.create("acme", FORM)
    assert await writer.set_paused("acme", "portal", created.name, True)
    assert (await row(db, created.name))["paused"] is True
    assert await writer.set_paused("acme", "portal", created.name, False)
    assert (await row(db, created.name))["paused"] is False


async def test_a_rotation_signs_with_both_secrets_for_the_grace(
    writer, db, receiver, start_worker, portal_settings
):
    url = receiver.on("hooks", Answer(204))
    created = await writer.create("acme", dataclasses.replace(FORM, url=url))
    rotated = await writer.rotate_secret("acme", "portal", created.name)
    assert rotated not in (None, created.secret) and len(parse_secret(rotated)) == 32
    stored = await row(db, created.name)
    assert (stored["secret"], stored["previous_secret"], stored["url"]) == (rotated, created.secret, url)
    grace = timedelta(seconds=portal_settings.secret_grace_seconds)
    assert abs(stored["previous_secret_until"] - (datetime.now(UTC) + grace)) < timedelta(minutes=1)

    start_worker()
    async with db.transaction():
        await hooklane.publish(db, tenant="acme", type="order.created", data={"n": 2})
    (got,) = await wait_for(lambda: receiver.at("hooks"))
    Webhook(rotated).verify(got.body, got.headers)
    Webhook(created.secret).verify(got.body, got.headers)


async def test_a_deleted_endpoint_is_gone(writer, db):
    created = await writer.create("acme", FORM)
    assert await writer.delete("acme", "portal", created.name)
    assert await row(db, created.name) is None
    assert not await writer.delete("acme", "portal", created.name)
    assert await writer.rotate_secret("acme", "portal", created.name) is None
    assert not await writer.set_paused("acme", "portal", created.name, True)
    assert not await writer.update("acme", "portal", created.name, FORM)


async def test_another_tenants_endpoint_is_as_if_it_did_not_exist(writer, db):
    theirs = await writer.create("globex", FORM)
    before = await row(db, theirs.name)
    # Every name this tenant could aim at: globex's own, and one named as
    # acme's that globex owns (a platform's apply, or keys that agree).
    aimed = resource_name("acme", "orders")
    await store.upsert_endpoint(
        db, dataclasses.replace(spec_for("globex", FORM, BOUNDS), name=aimed), new_secret()
    )
    for name in (theirs.name, aimed, resource_name("acme", "missing"), "../../x-" + tenant_key("acme")):
        assert not await writer.update("acme", "portal", name, FORM)
        assert not await writer.set_paused("acme", "portal", name, True)
        assert await writer.rotate_secret("acme", "portal", name) is None
        assert not await writer.delete("acme", "portal", name)
    assert await row(db, theirs.name) == before
    assert (await row(db, aimed))["tenant"] == "globex"


async def test_an_endpoint_outside_the_portal_namespace_is_not_the_portals(writer, db):
    spec = dataclasses.replace(spec_for("acme", FORM, BOUNDS), namespace="shop")
    await store.upsert_endpoint(db, spec, new_secret())
    assert not await writer.set_paused("acme", "shop", spec.name, True)
    assert not await writer.delete("acme", "shop", spec.name)
    assert (await row(db, spec.name, "shop"))["paused"] is False


async def test_a_secret_the_keys_cannot_open_is_a_clear_refusal(writer, db, portal_settings, connect):
    from hooklane.secrets import Keyring

    created = await writer.create("acme", FORM)
    other_key = Keyring.parse("k2:" + "B" * 43 + "=")
    sealed = dataclasses.replace(portal_settings, encryption_key=other_key)
    await store.upsert_endpoint(db, spec_for("acme", FORM, BOUNDS), created.secret, keyring=other_key)
    with pytest.raises(Refused) as caught:
        await LocalWriter(
            dataclasses.replace(sealed, encryption_key=Keyring.parse("k3:" + "C" * 43 + "=")), connect
        ).set_paused("acme", "portal", created.name, True)
    assert caught.value.status == 503
    assert await LocalWriter(sealed, connect).set_paused("acme", "portal", created.name, True)
