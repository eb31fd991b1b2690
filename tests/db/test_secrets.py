"""Signing secrets: rotation with an overlap, checked by the Standard
Webhooks verifier holding either key; encryption at rest with key rotation;
and no secret in any log, metric or command output. Real Postgres, real
receivers, real worker."""

from __future__ import annotations

import base64
import logging
import os
import re
import subprocess
import sys

import asyncpg
import prometheus_client
import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

import hooklane
from hooklane import metrics, store
from hooklane.delivery import RequestTerms
from hooklane.errors import InvalidInput
from hooklane.secrets import Keyring, seal, terms_owner, unseal
from hooklane.settings import Settings
from hooklane.spec import EndpointSpec
from testsupport.fixtures import LOOPBACK, wait_for
from testsupport.receivers import Answer


def _whsec() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


def _key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


OLD, NEW = _whsec(), _whsec()
K1, K2 = _key(), _key()
RING1 = Keyring.parse(f"k1:{K1}")
RING21 = Keyring.parse(f"k2:{K2},k1:{K1}")
RING2 = Keyring.parse(f"k2:{K2}")


async def _apply(
    db, name: str, url: str, secret: str | None, keyring: Keyring | None, grace: float = 86400.0
):
    spec = EndpointSpec(namespace="default", name=name, url=url, tenant="acme")
    return await store.upsert_endpoint(db, spec, secret, keyring=keyring, grace_seconds=grace)


async def _stored(db, name: str = "a") -> asyncpg.Record:
    return await db.fetchrow("SELECT secret, previous_secret FROM endpoints WHERE name = $1", name)


# --- the keyring -------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    "value, message",
    [
        ("", "entry 1 must be KEY_ID:BASE64"),
        (K1, "entry 1 must be KEY_ID:BASE64"),
        (f"k1:{K1},k 2:{K2}", "entry 2 must be KEY_ID:BASE64"),
        (f"k1:{K1},k1:{K2}", "key id k1 appears twice"),
        ("k1:not base64!", "the key of k1 is not valid base64"),
        ("k1:" + base64.b64encode(b"x" * 16).decode(), "the key of k1 must be 32 bytes (AES-256), not 16"),
    ],
    ids=["empty", "no-id", "bad-id", "twice", "not-base64", "short"],
)
def test_a_bad_key_stops_the_process_naming_the_variable_never_the_key(value, message):
    with pytest.raises(InvalidInput) as refused:
        Settings.from_env({"HOOKLANE_ENCRYPTION_KEY": value})
    assert str(refused.value).startswith(f"HOOKLANE_ENCRYPTION_KEY: {message}")
    assert K1 not in str(refused.value) and K2 not in str(refused.value)


@pytest.mark.unit
def test_settings_never_print_the_key():
    settings = Settings.from_env(
        {"HOOKLANE_ENCRYPTION_KEY": f"k2:{K2},k1:{K1}", "HOOKLANE_SECRET_GRACE_SECONDS": "60"}
    )
    assert settings.encryption_key.active == "k2" and settings.secret_grace_seconds == 60
    for text in (repr(settings), str(settings), repr(settings.encryption_key)):
        assert K1 not in text and K2 not in text and "Keyring(active='k2')" in text
    with pytest.raises(InvalidInput, match="HOOKLANE_SECRET_GRACE_SECONDS"):
        Settings.from_env({"HOOKLANE_SECRET_GRACE_SECONDS": "0"})


@pytest.mark.unit
def test_sealed_secrets_open_only_for_their_own_endpoint_and_key():
    sealed = RING1.seal(NEW, "default/a")
    assert sealed.startswith("enc:v1:k1:") and NEW not in sealed
    assert sealed != RING1.seal(NEW, "default/a")  # a fresh nonce each time
    assert unseal(RING1, sealed, "default/a") == unseal(RING21, sealed, "default/a") == NEW
    refusals = [
        (RING1, sealed, "default/b", "does not open the signing secret of default/b"),
        (RING2, sealed, "default/a", "has no key id k1"),
        (
            None,
            sealed,
            "default/a",
            "is not set, but the signing secret of default/a is encrypted (key id k1)",
        ),
        (Keyring.parse(f"k1:{K2}"), sealed, "default/a", "key id k1 does not open"),
        (RING1, sealed[:-6] + "AAAAAA", "default/a", "does not open"),
        (RING1, "enc:v1:k1:%%%", "default/a", "does not open"),
    ]
    for keyring, stored, owner, message in refusals:
        with pytest.raises(InvalidInput, match=re.escape(message)) as refused:
            unseal(keyring, stored, owner)
        assert refused.value.field == "HOOKLANE_ENCRYPTION_KEY"
    # stored before a key was set: read as it is
    assert unseal(RING1, NEW, "default/a") == unseal(None, NEW, "default/a") == NEW
    assert seal(None, NEW, "default/a") == NEW


# --- rotation with an overlap ------------------------------------------------


async def test_a_rotated_secret_signs_next_to_the_new_one_for_the_grace_then_stops(
    db, receiver, start_worker
):
    url = receiver.url("a")
    await _apply(db, "a", url, OLD, RING1)
    assert not (await _apply(db, "a", url, OLD, RING1)).rotated  # same secret: no rotation
    assert (await _apply(db, "a", url, NEW, RING1, grace=3.0)).rotated
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
    await _apply(db, "a", receiver.url("a"), NEW, None)
    start_worker()
    await hooklane.publish(db, tenant="acme", type="order.paid", data={})
    await wait_for(lambda: receiver.at("a"))
    assert receiver.at("a")[0].headers["User-Agent"] == "Hooklane"


# --- encryption at rest ------------------------------------------------------


async def test_secrets_are_stored_sealed_and_plaintext_ones_are_sealed_by_reseal(db):
    await _apply(db, "plain", "http://127.0.0.1:1/p", OLD, None)  # before a key was set
    await _apply(db, "a", "http://127.0.0.1:1/a", OLD, RING1)
    await _apply(db, "a", "http://127.0.0.1:1/a", NEW, RING1)
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
    await _apply(db, "a", "http://127.0.0.1:1/a", OLD, RING1)
    await _apply(db, "plain", "http://127.0.0.1:1/p", OLD, None)
    await _apply(db, "none", "http://127.0.0.1:1/n", None, RING1)
    spec = EndpointSpec(namespace="default", name="a", url="http://127.0.0.1:1/a", tenant="acme")

    held = await store.stored_endpoints(db, RING21)
    assert held[("default", "a")] == store.stored_form(spec, OLD)
    assert held[("default", "a")] != store.stored_form(spec, NEW)
    assert held[("default", "plain")].secret == OLD
    assert held[("default", "none")].secret is None
    # Sealed with k1, which RING2 no longer holds: left out, so upserted again.
    assert ("default", "a") not in await store.stored_endpoints(db, RING2)


async def test_a_sealed_secret_copied_to_another_endpoint_signs_nothing(db, receiver, start_worker):
    await _apply(db, "a", receiver.url("a"), NEW, RING1)
    await _apply(db, "b", receiver.url("b"), OLD, RING1)
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
    await _apply(db, "a", receiver.url("a"), NEW, RING1)
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
    await _apply(db, "a", "http://127.0.0.1:1/a", NEW, RING1)
    await _apply(db, "b", "http://127.0.0.1:1/b", OLD, None)
    with pytest.raises(InvalidInput, match="has no key id k1, which the signing secret of default/a"):
        await store.reseal_secrets(db, RING2)
    assert (await _stored(db, "b"))["secret"].startswith("enc:v1:k2:")


async def test_expired_previous_secrets_are_dropped_by_reseal(db):
    await _apply(db, "a", "http://127.0.0.1:1/a", OLD, RING1)
    await _apply(db, "a", "http://127.0.0.1:1/a", NEW, RING1, grace=0.01)
    await wait_for(lambda: db.fetchval("SELECT previous_secret_until < now() FROM endpoints"))
    assert await store.reseal_secrets(db, RING1) == 1
    assert await db.fetchval(
        "SELECT previous_secret IS NULL AND previous_secret_until IS NULL FROM endpoints"
    )


# --- never in any output -----------------------------------------------------


@pytest.mark.processes
async def test_secrets_never_appear_in_logs_metrics_or_command_output(
    db, dsn, receiver, start_worker, caplog
):
    """A worker delivering during a rotation, to a receiver that fails, with
    sealed secrets, one of which cannot be opened; then every command that
    prints endpoint state."""
    fail = receiver.on("fail", Answer(status=500))
    await _apply(db, "a", receiver.url("a"), OLD, RING1)
    await _apply(db, "a", receiver.url("a"), NEW, RING1)
    await _apply(db, "fail", fail, NEW, RING1)
    await _apply(db, "locked", receiver.url("locked"), OLD, Keyring.parse(f"k3:{K2}"))
    # The series of an earlier test's worker go, so that the ones read
    # below are this worker's.
    for gauge in metrics.PER_ENDPOINT:
        gauge.clear()
    with caplog.at_level(logging.DEBUG):
        worker = start_worker(encryption_key=RING1, gauges_seconds=0.1)
        await hooklane.publish(db, tenant="acme", type="order.paid", data={})
        await wait_for(lambda: receiver.at("a") and receiver.at("fail"))
        await wait_for(lambda: db.fetchval("SELECT count(*) = 0 FROM deliveries WHERE state = 'sending'"))
        # a gauge refresh has exported the failing endpoint's retry
        await wait_for(lambda: 'name="fail"' in prometheus_client.generate_latest().decode())
        await worker.stop()
    env = {**os.environ, "HOOKLANE_DATABASE_URL": dsn, "HOOKLANE_ENCRYPTION_KEY": f"k1:{K1}"}
    outputs = [
        caplog.text,
        "\n".join(str(vars(r)) for r in caplog.records),
        prometheus_client.generate_latest().decode(),
    ]
    for command in (["status"], ["endpoint", "list"], ["migrate"]):
        done = subprocess.run(
            [sys.executable, "-m", "hooklane.cli", *command],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        outputs += [done.stdout, done.stderr]
    assert "could not be attempted" in caplog.text  # the locked one's failure was logged
    for text in outputs:
        for secret in (OLD, NEW, K1, K2):
            assert secret not in text
            assert secret.removeprefix("whsec_") not in text


@pytest.mark.processes
def test_migrate_and_apply_seal_once_a_key_is_set(dsn, db_sync, tmp_path):
    env = {**os.environ, "HOOKLANE_DATABASE_URL": dsn, "HOOKLANE_ALLOWED_NETWORKS": LOOPBACK}
    keyed = {**env, "HOOKLANE_ENCRYPTION_KEY": f"k1:{K1}", "HOOKLANE_SECRET_GRACE_SECONDS": "3600"}
    (tmp_path / "endpoint.yaml").write_text(
        "apiVersion: hooklane.io/v1alpha1\nkind: WebhookEndpoint\n"
        "metadata: {name: orders, namespace: shop}\nspec: {url: 'http://127.0.0.1:9/hooks', tenant: acme,"
        " secretRef: {name: orders-secret, key: secret}}\n"
    )

    def hooklane_cli(environ: dict[str, str], *args: str) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [sys.executable, "-m", "hooklane.cli", *args],
            env=environ,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done

    def apply(environ: dict[str, str], secret: str) -> str:
        (tmp_path / "secret").write_text(secret)
        return hooklane_cli(
            environ,
            "endpoint",
            "apply",
            "-f",
            str(tmp_path / "endpoint.yaml"),
            "--secret-file",
            str(tmp_path / "secret"),
        ).stdout

    apply(env, OLD)  # before the key: stored as it is
    assert db_sync("SELECT secret FROM endpoints") == [(OLD,)]
    assert hooklane_cli(keyed, "migrate").stdout == (
        "database is up to date\n1 endpoint(s) with signing secrets sealed with key k1\n"
    )
    (stored,) = db_sync("SELECT secret FROM endpoints")[0]
    assert unseal(RING1, stored, "shop/orders") == OLD

    assert apply(keyed, NEW) == (
        "webhookendpoint shop/orders configured\n"
        "signing secret rotated: the previous one also signs for 3600 s\n"
    )
    secret, previous = db_sync("SELECT secret, previous_secret FROM endpoints")[0]
    assert (unseal(RING1, secret, "shop/orders"), unseal(RING1, previous, "shop/orders")) == (NEW, OLD)


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
