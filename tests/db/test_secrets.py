"""Signing secrets: rotation with an overlap, checked by the Standard
Webhooks verifier holding either key; encryption at rest with key rotation.
Real Postgres, real receivers, real worker. No secret in any log, metric or
command output: tests/processes/test_secrets.py."""

from __future__ import annotations

import asyncpg
import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

import hooklane
from hooklane import store
from hooklane.delivery import RequestTerms
from hooklane.errors import InvalidInput
from hooklane.secrets import terms_owner, unseal
from hooklane.spec import EndpointSpec
from testsupport.fixtures import wait_for
from testsupport.secrets import NEW, OLD, RING1, RING2, RING21, upsert_with_secret


async def _stored(db, name: str = "a") -> asyncpg.Record:
    return await db.fetchrow("SELECT secret, previous_secret FROM endpoints WHERE name = $1", name)


# --- the keyring -------------------------------------------------------------


# --- rotation with an overlap ------------------------------------------------


async def test_a_rotated_secret_signs_next_to_the_new_one_for_the_grace_then_stops(
    db, receiver, start_worker
):
    url = receiver.url("a")
    await upsert_with_secret(db, "a", url, OLD, RING1)
    assert not (await upsert_with_secret(db, "a", url, OLD, RING1)).rotated  # same secret: no rotation
    assert (await upsert_with_secret(db, "a", url, NEW, RING1, grace=3.0)).rotated
    start_worker(encryption_key=RING1)

    during = await hooklane.publish(db, tenant="acme", type="order.paid", data={"n": 1})
    await wait_for(lambda: receiver.at("a"))
    (got,) = receiver.at("a")
    assert len(got.headers["webhook-signature"].split(" ")) == 2
    for secret in (OLD, NEW):  # a receiver holding either key accepts it
        assert Webhook(secret).verify(got.body, got.headers)["id"] == during

    await wait_for(lambda: db.fetchval("SELECT previous_secret_until < now() FROM endpoints"), timeout=10)
    after = await hooklane.publish(db, tenant="acme", type="order.paid", data={"n": 2})
    await wait_for(lambda: len(receiver.at("a")) == 2)
    late = receiver.at("a")[1]
    assert len(late.headers["webhook-signature"].split(" ")) == 1
    assert Webhook(NEW).verify(late.body, late.headers)["id"] == after
    with pytest.raises(WebhookVerificationError):
        Webhook(OLD).verify(late.body, late.headers)


async def test_deliveries_say_hooklane_without_a_version(db, receiver, start_worker):
    await upsert_with_secret(db, "a", receiver.url("a"), NEW, None)
    start_worker()
    await hooklane.publish(db, tenant="acme", type="order.paid", data={})
    await wait_for(lambda: receiver.at("a"))
    assert receiver.at("a")[0].headers["User-Agent"] == "Hooklane"


# --- encryption at rest ------------------------------------------------------


async def test_secrets_are_stored_sealed_and_plaintext_ones_are_sealed_by_reseal(db):
    await upsert_with_secret(db, "plain", "http://127.0.0.1:1/p", OLD, None)  # before a key was set
    await upsert_with_secret(db, "a", "http://127.0.0.1:1/a", OLD, RING1)
    await upsert_with_secret(db, "a", "http://127.0.0.1:1/a", NEW, RING1)
    stored = await _stored(db)
    assert stored["secret"].startswith("enc:v1:k1:") and stored["previous_secret"].startswith("enc:v1:k1:")
    assert unseal(RING1, stored["previous_secret"], "default/a") == OLD
    assert (await _stored(db, "plain"))["secret"] == OLD

    assert await store.reseal_secrets(db, RING1) == 1
    assert unseal(RING1, (await _stored(db, "plain"))["secret"], "default/plain") == OLD
    assert await store.reseal_secrets(db, RING1) == 0
    dump = await db.fetchval("SELECT string_agg(e::text, ' ') FROM endpoints e")
    assert OLD not in dump and NEW not in dump
    assert OLD.removeprefix("whsec_") not in dump and NEW.removeprefix("whsec_") not in dump


async def test_what_the_operator_compares_at_start_is_what_the_upsert_stored(db):
    """The operator's restart skips an endpoint whose stored spec and
    secret equal the resource's: read through the keyring, a sealed secret
    compares as its plaintext, and one no key opens never compares equal."""
    await upsert_with_secret(db, "a", "http://127.0.0.1:1/a", OLD, RING1)
    await upsert_with_secret(db, "plain", "http://127.0.0.1:1/p", OLD, None)
    await upsert_with_secret(db, "none", "http://127.0.0.1:1/n", None, RING1)
    spec = EndpointSpec(namespace="default", name="a", url="http://127.0.0.1:1/a", tenant="acme")

    held = await store.stored_endpoints(db, RING21)
    assert held[("default", "a")] == store.stored_form(spec, OLD)
    assert held[("default", "a")] != store.stored_form(spec, NEW)
    assert held[("default", "plain")].secret == OLD
    assert held[("default", "none")].secret is None
    # Sealed with k1, which RING2 no longer holds: left out, so upserted again.
    assert ("default", "a") not in await store.stored_endpoints(db, RING2)


async def test_a_sealed_secret_copied_to_another_endpoint_signs_nothing(db, receiver, start_worker):
    await upsert_with_secret(db, "a", receiver.url("a"), NEW, RING1)
    await upsert_with_secret(db, "b", receiver.url("b"), OLD, RING1)
    await db.execute(
        "UPDATE endpoints SET secret = (SELECT secret FROM endpoints WHERE name = 'a') WHERE name = 'b'"
    )
    start_worker(encryption_key=RING1)
    await hooklane.publish(db, tenant="acme", type="order.paid", data={})
    await wait_for(lambda: receiver.at("a"))
    await wait_for(
        lambda: db.fetchval(
            "SELECT d.last_error FROM deliveries d JOIN endpoints e ON e.id = d.endpoint_id WHERE e.name = 'b'"
        )
    )
    assert receiver.at("b") == []
    error = await db.fetchval("SELECT last_error FROM endpoints WHERE name = 'b'")
    assert error == (
        "invalid endpoint: HOOKLANE_ENCRYPTION_KEY: key id k1 does not open the signing secret of default/b: "
        "another key under that id, or a value altered or copied from another endpoint"
    )


async def test_the_encryption_key_rotates_without_a_lost_delivery(db, receiver, start_worker):
    await upsert_with_secret(db, "a", receiver.url("a"), NEW, RING1)
    # 1. the new key first, the old one still there: both open
    worker = start_worker(encryption_key=RING21)
    await hooklane.publish(db, tenant="acme", type="order.paid", data={"n": 1})
    await wait_for(lambda: len(receiver.at("a")) == 1)
    # 2. re-seal (what `hooklane migrate` does with a key set)
    assert await store.reseal_secrets(db, RING21) == 1
    assert (await _stored(db))["secret"].startswith("enc:v1:k2:")
    await worker.stop()
    # 3. the old key removed
    start_worker(encryption_key=RING2)
    await hooklane.publish(db, tenant="acme", type="order.paid", data={"n": 2})
    await wait_for(lambda: len(receiver.at("a")) == 2)
    for got in receiver.at("a"):
        Webhook(NEW).verify(got.body, got.headers)


async def test_reseal_reports_a_secret_no_key_opens_after_resealing_the_rest(db):
    await upsert_with_secret(db, "a", "http://127.0.0.1:1/a", NEW, RING1)
    await upsert_with_secret(db, "b", "http://127.0.0.1:1/b", OLD, None)
    with pytest.raises(InvalidInput, match="has no key id k1, which the signing secret of default/a"):
        await store.reseal_secrets(db, RING2)
    assert (await _stored(db, "b"))["secret"].startswith("enc:v1:k2:")


async def test_expired_previous_secrets_are_dropped_by_reseal(db):
    await upsert_with_secret(db, "a", "http://127.0.0.1:1/a", OLD, RING1)
    await upsert_with_secret(db, "a", "http://127.0.0.1:1/a", NEW, RING1, grace=0.01)
    await wait_for(lambda: db.fetchval("SELECT previous_secret_until < now() FROM endpoints"))
    assert await store.reseal_secrets(db, RING1) == 1
    assert await db.fetchval(
        "SELECT previous_secret IS NULL AND previous_secret_until IS NULL FROM endpoints"
    )


# --- never in any output -----------------------------------------------------


async def test_request_terms_are_sealed_apart_and_resealed_with_the_active_key(db):
    """An endpoint's headers and TLS material are sealed like its signing
    secret, bound to another purpose (neither opens in the other's place),
    and `hooklane migrate`'s reseal moves them to the active key with it."""
    terms = RequestTerms(headers=(("X-Api-Key", "sk_live_terms"),))
    spec = EndpointSpec(namespace="default", name="t", url="http://127.0.0.1:1/t", tenant="acme")
    await store.upsert_endpoint(db, spec, OLD, terms=terms, keyring=RING1)
    stored = await db.fetchrow("SELECT secret, request_terms FROM endpoints WHERE name = 't'")
    assert "sk_live_terms" not in stored["request_terms"]
    assert (
        RequestTerms.from_json(unseal(RING1, stored["request_terms"], terms_owner("default", "t"))) == terms
    )
    with pytest.raises(InvalidInput):
        unseal(RING1, stored["request_terms"], "default/t")
    held = await store.stored_endpoints(db, RING1)
    assert held[("default", "t")] == store.stored_form(spec, OLD, terms)
    assert held[("default", "t")] != store.stored_form(spec, OLD, None)

    assert await store.reseal_secrets(db, RING21) == 1
    resealed = await db.fetchval("SELECT request_terms FROM endpoints WHERE name = 't'")
    assert RequestTerms.from_json(unseal(RING2, resealed, terms_owner("default", "t"))) == terms
    assert await store.reseal_secrets(db, RING21) == 0
