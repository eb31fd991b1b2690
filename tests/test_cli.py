"""The ``hooklane`` command, run as a real process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import SECRET

MANIFEST = textwrap.dedent(
    """\
    apiVersion: hooklane.io/v1alpha1
    kind: WebhookEndpoint
    metadata:
      name: orders-acme
      namespace: shop
    spec:
      url: http://127.0.0.1:9000/hooks/acme
      tenant: acme
      secretRef: {name: acme-webhook-secret, key: secret}
      maxConcurrency: 4
      eventTypes: ["order.*"]
    """
)


def hooklane(dsn: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hooklane.cli", *args],
        env={**os.environ, "HOOKLANE_DATABASE_URL": dsn},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def files(tmp_path):
    (tmp_path / "endpoint.yaml").write_text(MANIFEST)
    (tmp_path / "secret").write_text(SECRET + "\n")
    return tmp_path


def test_migrate_is_idempotent(dsn):
    result = hooklane(dsn, "migrate")
    assert result.returncode == 0 and "up to date" in result.stdout


def test_endpoint_apply_creates_then_updates(dsn, db_sync, files):
    first = hooklane(dsn, "endpoint", "apply", "-f", str(files / "endpoint.yaml"), "--secret-file", str(files / "secret"))
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "webhookendpoint shop/orders-acme created"
    (files / "endpoint.yaml").write_text(MANIFEST.replace("maxConcurrency: 4", "maxConcurrency: 9").replace("9000", "9001"))
    second = hooklane(dsn, "endpoint", "apply", "-f", str(files / "endpoint.yaml"), "--secret-file", str(files / "secret"))
    assert second.stdout.strip() == "webhookendpoint shop/orders-acme configured"
    row = db_sync("SELECT max_concurrency, url, secret, event_types FROM endpoints")
    assert row == [(9, "http://127.0.0.1:9001/hooks/acme", SECRET, ["order.*"])]
    listing = hooklane(dsn, "endpoint", "list").stdout
    assert "orders-acme" in listing and "Active" in listing


@pytest.mark.parametrize(
    "change, message",
    [
        (("maxConcurrency: 4", "maxConcurrency: 0"), "spec.maxConcurrency: must be between 1 and 256"),
        (("http://127.0.0.1", "ftp://127.0.0.1"), "spec.url: must be an http or https URL"),
        (("kind: WebhookEndpoint", "kind: Endpoint"), "kind: must be 'WebhookEndpoint'"),
        (('["order.*"]', '["order.**"]'), "spec.eventTypes"),
        (("  tenant: acme\n", ""), "spec.tenant: is required"),
        (("spec:", "spec: [\n"), "is not valid YAML"),
    ],
)
def test_bad_manifests_get_a_clear_error_and_store_nothing(dsn, db_sync, files, change, message):
    (files / "endpoint.yaml").write_text(MANIFEST.replace(*change))
    result = hooklane(dsn, "endpoint", "apply", "-f", str(files / "endpoint.yaml"), "--secret-file", str(files / "secret"))
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert db_sync("SELECT count(*) FROM endpoints") == [(0,)]


def test_bad_secret_file_is_refused(dsn, db_sync, files):
    (files / "secret").write_text("hunter2")
    result = hooklane(dsn, "endpoint", "apply", "-f", str(files / "endpoint.yaml"), "--secret-file", str(files / "secret"))
    assert result.returncode == 2 and "secret: must start with 'whsec_'" in result.stderr
    missing = hooklane(dsn, "endpoint", "apply", "-f", str(files / "endpoint.yaml"), "--secret-file", str(files / "nope"))
    assert missing.returncode == 2 and "--secret-file: cannot read" in missing.stderr
    assert db_sync("SELECT count(*) FROM endpoints") == [(0,)]


def test_publish_and_status(dsn, db_sync, files):
    hooklane(dsn, "endpoint", "apply", "-f", str(files / "endpoint.yaml"), "--secret-file", str(files / "secret"))
    result = hooklane(dsn, "publish", "--tenant", "acme", "--type", "order.updated", "--data", '{"id": 7}', "--id", "evt-7")
    assert result.returncode == 0 and result.stdout.strip() == "evt-7"
    status = hooklane(dsn, "status").stdout.splitlines()
    assert status[0].split()[:4] == ["ENDPOINT", "TENANT", "STATE", "PENDING"]
    assert status[1].split()[:4] == ["shop/orders-acme", "acme", "Active", "1"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--data", "{not json"], "--data: is not valid JSON"),
        (["--data", "[1]"], "data: must be a JSON object"),
        (["--data", "{}", "--type", "no spaces"], "type: must be a dotted event type"),
    ],
)
def test_publish_refuses_bad_input_and_stores_nothing(dsn, db_sync, args, message):
    base = {"--tenant": "acme", "--type": "order.updated"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    result = hooklane(dsn, "publish", *[x for pair in base.items() for x in pair])
    assert result.returncode == 2 and message in result.stderr
    assert db_sync("SELECT count(*) FROM events") == [(0,)]


def test_missing_database_url_is_explained():
    result = hooklane("", "status")
    assert result.returncode == 2 and "HOOKLANE_DATABASE_URL: is not set" in result.stderr
