"""Signing secrets and the encryption key as processes: no secret in any
log, metric or command output, and ``migrate`` and ``endpoint apply`` seal
once a key is set."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import prometheus_client

import hooklane
from hooklane import metrics
from hooklane.secrets import Keyring, unseal
from testsupport.fixtures import LOOPBACK, wait_for
from testsupport.receivers import Answer
from testsupport.secrets import K1, K2, NEW, OLD, RING1, upsert_with_secret


async def test_secrets_never_appear_in_logs_metrics_or_command_output(
    db, dsn, receiver, start_worker, caplog
):
    """A worker delivering during a rotation, to a receiver that fails, with
    sealed secrets, one of which cannot be opened; then every command that
    prints endpoint state."""
    fail = receiver.on("fail", Answer(status=500))
    await upsert_with_secret(db, "a", receiver.url("a"), OLD, RING1)
    await upsert_with_secret(db, "a", receiver.url("a"), NEW, RING1)
    await upsert_with_secret(db, "fail", fail, NEW, RING1)
    await upsert_with_secret(db, "locked", receiver.url("locked"), OLD, Keyring.parse(f"k3:{K2}"))
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
