"""Tenant isolation through the CLI: a conflicting id exits 2, and
``endpoint apply`` says what a tenant change discarded."""

from __future__ import annotations

import os
import subprocess
import sys

from testsupport.fixtures import LOOPBACK, SECRET


def test_the_cli_exits_2_on_a_conflicting_id(dsn):
    env = {**os.environ, "HOOKLANE_DATABASE_URL": dsn}

    def publish(data: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "hooklane.cli",
                "publish",
                "--tenant",
                "acme",
                "--type",
                "order.paid",
                "--data",
                data,
                "--id",
                "evt-1",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert publish('{"v": 1}').stdout.strip() == "evt-1"
    assert publish('{"v": 1}').stdout.strip() == "evt-1"
    refused = publish('{"v": 2}')
    assert refused.returncode == 2
    assert "id: 'evt-1' was already published by tenant 'acme' with different content" in refused.stderr
    # and another tenant may use the id
    other = subprocess.run(
        [
            sys.executable,
            "-m",
            "hooklane.cli",
            "publish",
            "--tenant",
            "globex",
            "--type",
            "order.paid",
            "--data",
            '{"v": 2}',
            "--id",
            "evt-1",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (other.returncode, other.stdout.strip()) == (0, "evt-1")


def test_endpoint_apply_says_what_a_tenant_change_discarded(dsn, db_sync, tmp_path):
    env = {**os.environ, "HOOKLANE_DATABASE_URL": dsn, "HOOKLANE_ALLOWED_NETWORKS": LOOPBACK}
    (tmp_path / "secret").write_text(SECRET)

    def hooklane_cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "hooklane.cli", *args], env=env, capture_output=True, text=True, timeout=60
        )

    def apply(tenant: str) -> subprocess.CompletedProcess:
        (tmp_path / "endpoint.yaml").write_text(
            "apiVersion: hooklane.io/v1alpha1\nkind: WebhookEndpoint\n"
            "metadata: {name: orders, namespace: shop}\n"
            f"spec: {{url: 'http://127.0.0.1:9/hooks', tenant: {tenant},"
            " secretRef: {name: orders-secret, key: secret}}\n"
        )
        return hooklane_cli(
            "endpoint",
            "apply",
            "-f",
            str(tmp_path / "endpoint.yaml"),
            "--secret-file",
            str(tmp_path / "secret"),
        )

    assert apply("acme").stdout == "webhookendpoint shop/orders created\n"
    assert hooklane_cli("publish", "--tenant", "acme", "--type", "order.paid", "--data", "{}").returncode == 0
    moved = apply("globex")
    assert moved.stdout == (
        "webhookendpoint shop/orders configured\n"
        "tenant changed from acme to globex: 1 pending or dead deliveries of the old tenant's events discarded\n"
    )
    assert db_sync("SELECT state FROM deliveries") == [("discarded",)]
