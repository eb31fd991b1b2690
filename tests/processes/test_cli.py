"""The ``hooklane`` command, run as a real process."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import textwrap

import pytest

from hooklane import publish as publish_event
from hooklane import store
from hooklane.selfservice import resource_name
from hooklane.times import rfc3339, rfc3339_seconds
from hooklane.views import detail_json
from testsupport.cli import hooklane
from testsupport.fixtures import SECRET, add_endpoint, flaky_history
from testsupport.held_keys import kill_head, publish_ordered
from testsupport.manifests import LAUGHS

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


@pytest.fixture
def files(tmp_path):
    (tmp_path / "endpoint.yaml").write_text(MANIFEST)
    (tmp_path / "secret").write_text(SECRET + "\n")
    return tmp_path


def test_migrate_is_idempotent(dsn):
    result = hooklane(dsn, "migrate")
    assert result.returncode == 0 and "up to date" in result.stdout


def test_endpoint_apply_creates_then_updates(dsn, db_sync, files):
    first = hooklane(
        dsn, "endpoint", "apply", "-f", str(files / "endpoint.yaml"), "--secret-file", str(files / "secret")
    )
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "webhookendpoint shop/orders-acme created"
    (files / "endpoint.yaml").write_text(
        MANIFEST.replace("maxConcurrency: 4", "maxConcurrency: 9").replace("9000", "9001")
    )
    second = hooklane(
        dsn, "endpoint", "apply", "-f", str(files / "endpoint.yaml"), "--secret-file", str(files / "secret")
    )
    assert second.stdout.strip() == "webhookendpoint shop/orders-acme configured"
    row = db_sync("SELECT max_concurrency, url, secret, event_types FROM endpoints")
    assert row == [(9, "http://127.0.0.1:9001/hooks/acme", SECRET, ["order.*"])]
    listing = hooklane(dsn, "endpoint", "list").stdout
    assert "orders-acme" in listing and "Active" in listing


async def test_over_bounds_lists_the_tenants_endpoints_beyond_the_platforms_bounds(dsn, db):
    url = "http://127.0.0.1:9/x"
    none = await asyncio.to_thread(hooklane, dsn, "endpoint", "over-bounds")
    assert none.returncode == 0 and "no tenant's endpoint in default is beyond" in none.stdout
    await add_endpoint(db, resource_name("acme", "big"), url, max_concurrency=16)
    await add_endpoint(db, resource_name("acme", "fine"), url, max_concurrency=4, timeout_seconds=5)
    await add_endpoint(db, resource_name("globex", "slow"), url, tenant="globex", timeout_seconds=30)
    # The platform's own (not a name the portal makes) are its choice.
    await add_endpoint(db, "platform-big", url, max_concurrency=64)
    result = await asyncio.to_thread(hooklane, dsn, "endpoint", "over-bounds")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NAMESPACE", "NAME", "TENANT", "BEYOND"]
    assert sorted(line.split(None, 3)[1:] for line in lines[1:]) == sorted(
        [
            [resource_name("acme", "big"), "acme", "max_concurrency 16 > 4"],
            [resource_name("globex", "slow"), "globex", "timeout_seconds 30 > 5"],
        ]
    )
    wider = await asyncio.to_thread(
        hooklane, dsn, "endpoint", "over-bounds", HOOKLANE_PORTAL_MAX_CONCURRENCY="16"
    )
    assert resource_name("acme", "big") not in wider.stdout and "globex" in wider.stdout


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
    result = hooklane(
        dsn, "endpoint", "apply", "-f", str(files / "endpoint.yaml"), "--secret-file", str(files / "secret")
    )
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert db_sync("SELECT count(*) FROM endpoints") == [(0,)]


def test_bad_secret_file_is_refused(dsn, db_sync, files):
    (files / "secret").write_text("hunter2")
    result = hooklane(
        dsn, "endpoint", "apply", "-f", str(files / "endpoint.yaml"), "--secret-file", str(files / "secret")
    )
    assert result.returncode == 2 and "secret: must start with 'whsec_'" in result.stderr
    missing = hooklane(
        dsn, "endpoint", "apply", "-f", str(files / "endpoint.yaml"), "--secret-file", str(files / "nope")
    )
    assert missing.returncode == 2 and "--secret-file: cannot read" in missing.stderr
    assert db_sync("SELECT count(*) FROM endpoints") == [(0,)]


def test_publish_and_status(dsn, db_sync, files):
    hooklane(
        dsn, "endpoint", "apply", "-f", str(files / "endpoint.yaml"), "--secret-file", str(files / "secret")
    )
    result = hooklane(
        dsn, "publish", "--tenant", "acme", "--type", "order.updated", "--data", '{"id": 7}', "--id", "evt-7"
    )
    assert result.returncode == 0 and result.stdout.strip() == "evt-7"
    status = hooklane(dsn, "status").stdout.splitlines()
    assert status[0].split()[:4] == ["ENDPOINT", "TENANT", "STATE", "PENDING"]
    assert status[1].split()[:4] == ["shop/orders-acme", "acme", "Active", "1"]


async def test_reactivating_an_endpoint_that_is_not_deactivated_is_refused(dsn, files, db):
    assert (await asyncio.to_thread(_apply, dsn, files)).returncode == 0
    await db.execute("UPDATE endpoints SET consecutive_failures = 3, failing_since = now()")
    result = await asyncio.to_thread(hooklane, dsn, "endpoint", "reactivate", "shop/orders-acme")
    assert (result.returncode, result.stdout) == (1, "")
    assert "shop/orders-acme is not deactivated: nothing to reactivate" in result.stderr
    assert tuple(await db.fetchrow("SELECT state, consecutive_failures FROM endpoints")) == ("active", 3)
    await db.execute("UPDATE endpoints SET state = 'deactivated'")
    result = await asyncio.to_thread(hooklane, dsn, "endpoint", "reactivate", "shop/orders-acme")
    assert (result.returncode, result.stdout) == (0, "shop/orders-acme reactivated\n")
    assert tuple(await db.fetchrow("SELECT state, consecutive_failures FROM endpoints")) == ("active", 0)


def test_publish_with_an_ordering_key(dsn, db_sync, files):
    hooklane(
        dsn, "endpoint", "apply", "-f", str(files / "endpoint.yaml"), "--secret-file", str(files / "secret")
    )
    base = ["publish", "--tenant", "acme", "--type", "order.updated", "--data", "{}", "--ordering-key"]
    for event_id in ("e-2", "e-1", "e-3"):
        result = hooklane(dsn, *base, "order-7", "--id", event_id)
        assert (result.returncode, result.stdout) == (0, f"{event_id}\n"), result.stderr
    assert db_sync("SELECT DISTINCT ordering_key FROM events") == [("order-7",)]
    assert db_sync(
        "SELECT event_id, ordering_seq, next_attempt_at < 'infinity' FROM deliveries ORDER BY ordering_seq"
    ) == [("e-2", 1, True), ("e-1", 2, False), ("e-3", 3, False)]
    conflict = hooklane(dsn, *base, "order-8", "--id", "e-1")
    assert _refused(conflict, "id: 'e-1' was already published by tenant 'acme' with different content"), (
        conflict.stderr
    )
    refused = hooklane(dsn, *base, "order\x1b7", "--id", "e-4")
    assert _refused(
        refused,
        "ordering_key: must be 1 to 255 printable ASCII characters (letters, digits, punctuation, spaces)",
    ), refused.stderr
    assert db_sync("SELECT count(*) FROM events") == [(3,)]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--data", "{not json"], "--data: is not valid JSON"),
        (["--data", "[1]"], "data: must be a JSON object"),
        (["--data", "{}", "--type", "no spaces"], "type: must be a dotted event type"),
        (["--data", "{}", "--traceparent", "00-junk"], "--traceparent: must be a W3C traceparent"),
    ],
)
def test_publish_refuses_bad_input_and_stores_nothing(dsn, db_sync, args, message):
    base = {"--tenant": "acme", "--type": "order.updated"}
    for flag, value in zip(args[::2], args[1::2], strict=False):
        base[flag] = value
    result = hooklane(dsn, "publish", *[x for pair in base.items() for x in pair])
    assert result.returncode == 2 and message in result.stderr
    assert db_sync("SELECT count(*) FROM events") == [(0,)]


def test_missing_database_url_is_explained():
    result = hooklane("", "status")
    assert result.returncode == 2 and "HOOKLANE_DATABASE_URL: is not set" in result.stderr


def _apply(
    dsn: str, files, manifest: str = "endpoint.yaml", secret: str = "secret"
) -> subprocess.CompletedProcess:
    return hooklane(
        dsn, "endpoint", "apply", "-f", str(files / manifest), "--secret-file", str(files / secret)
    )


def _refused(result: subprocess.CompletedProcess, message: str) -> bool:
    """Exit 2, with one short line naming the field."""
    return (
        result.returncode == 2
        and result.stderr.startswith("hooklane: ")
        and message in result.stderr
        and result.stderr.count("\n") == 1
        and len(result.stderr) < 400
    )


MANIFEST_BYTES = MANIFEST.encode()


@pytest.mark.parametrize(
    "content, message",
    [
        (b"\xff\xfe" + MANIFEST_BYTES, "--filename: is not UTF-8"),
        (MANIFEST_BYTES.replace(b"acme\n", b"ac\x00me\n"), "--filename: contains a NUL character"),
        (MANIFEST_BYTES + b"#" * (1 << 20), "--filename: is larger than 1048576 bytes"),
        (LAUGHS, "--filename: uses a YAML alias (line 2): aliases are not supported"),
        (b"[" * 200_000, "--filename: nests deeper than 64 levels"),
        (b'{"a":' * 100_000, "--filename: nests deeper than 64 levels"),
        (MANIFEST_BYTES + b"---\n" + MANIFEST_BYTES, "--filename: holds more than one YAML document"),
        (MANIFEST_BYTES.replace(b"spec:", b"sepc:"), "manifest: unknown field(s): sepc"),
        (
            MANIFEST_BYTES.replace(b"  name: orders-acme", b"  nmae: orders-acme"),
            "metadata: unknown field(s): nmae",
        ),
        (MANIFEST_BYTES.replace(b":9000", b":99999"), "spec.url: has an invalid port '99999'"),
        (MANIFEST_BYTES.replace(b":9000", b":abc"), "spec.url: has an invalid port 'abc'"),
        (MANIFEST_BYTES.replace(b"127.0.0.1:9000", b"[::1"), "spec.url: has a malformed host"),
        (MANIFEST_BYTES.replace(b"127.0.0.1", b"127.1"), "spec.url: host '127.1' must be a DNS name or four"),
        (
            MANIFEST_BYTES.replace(b"http://", b"http://admin:hunter2@"),
            "spec.url: must not hold user:password@",
        ),
        (
            MANIFEST_BYTES.replace(b"maxConcurrency: 4", b"maxConcurrency: 99999999999999999999999"),
            "spec.maxConcurrency: must be between 1 and 256",
        ),
        (
            MANIFEST_BYTES.replace(b"maxConcurrency: 4", b"maxConcurrency: 1e400"),
            "spec.maxConcurrency: must be an integer, not '1e400'",
        ),
        (
            MANIFEST_BYTES.replace(b"maxConcurrency: 4", b"maxConcurrency: " + b"7" * 5000),
            "--filename: has an integer longer than 64 characters",
        ),
        (
            MANIFEST_BYTES.replace(b"tenant: acme", b"tenant: 2024-13-45"),
            "--filename: holds a value YAML cannot read",
        ),
        (
            MANIFEST_BYTES.replace(b"tenant: acme", b'tenant: "acme\\e[2J"'),
            "spec.tenant: must not contain control",
        ),
        (MANIFEST_BYTES.replace(b"key: secret", b"key: secret/x"), "spec.secretRef.key: must be 1 to 253"),
    ],
)
def test_hostile_manifests_exit_2_naming_the_field(dsn, db_sync, files, content, message):
    (files / "endpoint.yaml").write_bytes(content)
    result = _apply(dsn, files)
    assert _refused(result, message), result.stderr[:2000]
    assert db_sync("SELECT count(*) FROM endpoints") == [(0,)]


@pytest.mark.parametrize(
    "content, message",
    [
        (b"whsec_\xff" + SECRET.encode(), "--secret-file: is not UTF-8"),
        (SECRET.encode() + b"\n" * 5000, "--secret-file: is larger than 4096 bytes"),
        (SECRET.encode().replace(b"_", b"_\x00"), "secret: the part after whsec_ is not valid base64"),
    ],
)
def test_hostile_secret_files_exit_2(dsn, db_sync, files, content, message):
    (files / "secret").write_bytes(content)
    assert _refused(_apply(dsn, files), message)
    assert db_sync("SELECT count(*) FROM endpoints") == [(0,)]


def test_manifest_from_stdin_is_limited_too(dsn, db_sync, files):
    args = ["endpoint", "apply", "-f", "-", "--secret-file", str(files / "secret")]
    assert _refused(hooklane(dsn, *args, stdin=MANIFEST + "#" * (1 << 20)), "--filename: is larger than")
    assert _refused(
        hooklane(dsn, "endpoint", "apply", "-f", str(files), "--secret-file", str(files / "secret")),
        "--filename: cannot read",
    )
    assert db_sync("SELECT count(*) FROM endpoints") == [(0,)]
    assert hooklane(dsn, *args, stdin=MANIFEST).returncode == 0


@pytest.mark.parametrize("args", [["status"], ["endpoint", "list"]])
def test_a_reader_that_goes_away_ends_the_command_quietly(dsn, files, args):
    assert _apply(dsn, files).returncode == 0
    process = subprocess.Popen(
        [sys.executable, "-m", "hooklane.cli", *args],
        env={**os.environ, "HOOKLANE_DATABASE_URL": dsn},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    process.stdout.close()
    stderr = process.stderr.read()
    process.stderr.close()
    # 141 = 128 + SIGPIPE: what a shell reports for a tool the pipe killed.
    assert process.wait(timeout=60) == 141
    assert stderr == b""


def test_resend_and_reactivate_of_an_unknown_endpoint_fail(dsn, files):
    assert _apply(dsn, files).returncode == 0
    for action in ("resend", "reactivate"):
        result = hooklane(dsn, "endpoint", action, "shop/nope")
        assert (result.returncode, result.stdout, result.stderr) == (1, "", "shop/nope not found\n")
    known = hooklane(dsn, "endpoint", "resend", "shop/orders-acme")
    assert known.returncode == 0 and known.stdout == "0 dead deliveries of shop/orders-acme queued again\n"


@pytest.mark.parametrize(
    "args, message",
    [
        (["resend", ""], "endpoint: must be NAMESPACE/NAME or NAME"),
        (["resend", "shop/"], "endpoint: must be NAMESPACE/NAME or NAME"),
        (["resend", "/x"], "endpoint: must be NAMESPACE/NAME or NAME"),
        (["reactivate", "Shop/x"], "endpoint: must be NAMESPACE/NAME or NAME"),
        (["reactivate", "a/b/c"], "endpoint: must be NAMESPACE/NAME or NAME"),
        (
            ["reactivate", "x\n"],
            "endpoint: must be NAMESPACE/NAME or NAME, lowercase DNS-style names, not 'x\\n'",
        ),
        (["resend", "x", "--delivery", "99999999999999999999"], "is not a delivery id"),
        (["resend", "x", "--delivery", "-1"], "is not a delivery id"),
    ],
)
def test_endpoint_names_are_checked(dsn, args, message):
    result = hooklane(dsn, "endpoint", *args)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


async def test_status_and_list_escape_control_characters(dsn, db):
    await add_endpoint(db, "evil", "http://127.0.0.1:1/a")
    await db.execute(
        """UPDATE endpoints SET tenant = E'ac\\x1b[2Jme', url = E'http://x/\\x1b]0;owned\\x07',
                  last_error = E'boom\\r\\x1b[31mred\\u202e', consecutive_failures = 1"""
    )
    status = hooklane(dsn, "status")
    listing = hooklane(dsn, "endpoint", "list")
    for result in (status, listing):
        assert result.returncode == 0, result.stderr
        assert "\x1b" not in result.stdout and "\r" not in result.stdout and "\x07" not in result.stdout
        assert "ac\\x1b[2Jme" in result.stdout
    assert "boom\\r\\x1b[31mred\\u202e" in status.stdout
    assert "http://x/\\x1b]0;owned\\x07" in listing.stdout


def test_publish_data_from_a_file_or_stdin(dsn, db_sync, tmp_path):
    big = {"blob": "x" * 200_000}  # over the shell's 128 KiB limit for one argument
    (tmp_path / "data.json").write_text(json.dumps(big, indent=2))
    base = ["publish", "--tenant", "acme", "--type", "order.updated"]
    from_file = hooklane(dsn, *base, "--data", f"@{tmp_path / 'data.json'}", "--id", "from-file")
    from_stdin = hooklane(dsn, *base, "--data", "-", "--id", "from-stdin", stdin='{"id": 8}')
    assert (from_file.returncode, from_stdin.returncode) == (0, 0), from_file.stderr + from_stdin.stderr
    assert db_sync("SELECT id, length(data->>'blob') FROM events ORDER BY id") == [
        ("from-file", 200_000),
        ("from-stdin", None),
    ]


@pytest.mark.parametrize(
    "data, content, message",
    [
        ("@{path}", b'{"a": "\xff"}', "--data: is not UTF-8 (byte 7)"),
        ("@{path}", b'{"a": ', "--data: is not valid JSON: Expecting value: line 1 column 7"),
        ("@{path}", b"[" * 100_000, "--data: nests too deeply"),
        (
            "@{path}",
            b'{"a": ' + b"9" * 5000 + b"}",
            "--data: is not valid JSON: Exceeds the limit (4300 digits)",
        ),
        ("@{path}", b" " * (1 << 20) + b"{}", "--data: is larger than 1048576 bytes"),
        ("@{path}.missing", b"", "--data: cannot read"),
        (os.fsdecode(b'{"a": "\xff"}'), b"", "--data: is not UTF-8"),
        ('{"a": ' * 100 + "1" + "}" * 100, b"", "data: nests deeper than 64 levels"),
        ('{"a": "\\u0000"}', b"", "data: contains a NUL character at data.a"),
        ('{"a": NaN}', b"", "data: has nan at data.a"),
    ],
)
def test_publish_refuses_bad_data_files_and_stores_nothing(dsn, db_sync, tmp_path, data, content, message):
    (tmp_path / "data.json").write_bytes(content)
    data = data.replace("{path}", str(tmp_path / "data.json"))
    result = hooklane(dsn, "publish", "--tenant", "acme", "--type", "order.updated", "--data", data)
    assert _refused(result, message), result.stderr[:2000]
    assert db_sync("SELECT count(*) FROM events") == [(0,)]


def test_a_busy_metrics_port_is_a_clear_error(dsn):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = hooklane(dsn, "worker", HOOKLANE_METRICS_PORT=str(port), HOOKLANE_METRICS_HOST="127.0.0.1")
    assert _refused(
        result, f"HOOKLANE_METRICS_PORT: cannot serve metrics on 127.0.0.1:{port}: Address already in use"
    )


def test_an_unreachable_database_is_one_line(dsn):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    for args in (["status"], ["endpoint", "list"], ["migrate"]):
        result = hooklane(f"postgresql://postgres@127.0.0.1:{port}/hooklane", *args)
        assert result.returncode == 1 and result.stderr.startswith("hooklane: cannot reach the database: ")
        assert result.stderr.count("\n") == 1
    missing = hooklane(dsn.rsplit("/", 1)[0] + "/no_such_database", "status")
    assert missing.returncode == 1
    assert (
        missing.stderr.startswith("hooklane: cannot reach the database: ")
        and "no_such_database" in missing.stderr
    )
    malformed = hooklane("postgresql://postgres:s3cret@127.0.0.1:notaport/x", "status")
    assert malformed.returncode == 2 and "HOOKLANE_DATABASE_URL" in malformed.stderr
    assert "s3cret" not in malformed.stderr and "Traceback" not in malformed.stderr


def test_a_bad_log_level_is_a_usage_error(dsn):
    result = hooklane(dsn, "--log-level", "LOUD", "status")
    assert (
        result.returncode == 2
        and "invalid choice: 'LOUD'" in result.stderr
        and "Traceback" not in result.stderr
    )


def test_apply_refuses_an_address_the_worker_would_never_dial(dsn, files, db_sync):
    manifest = files / "endpoint.yaml"
    manifest.write_text(MANIFEST.replace("127.0.0.1:9000", "10.1.2.3:9000"))
    args = ("endpoint", "apply", "-f", str(manifest), "--secret-file", str(files / "secret"))
    refused = hooklane(dsn, *args, HOOKLANE_ALLOWED_NETWORKS="")
    assert _refused(refused, "spec.url: destination 10.1.2.3 is not allowed")
    assert db_sync("SELECT count(*) FROM endpoints") == [(0,)]
    # allow-listed for a receiver inside the cluster, it is accepted
    assert hooklane(dsn, *args, HOOKLANE_ALLOWED_NETWORKS="10.0.0.0/8").returncode == 0
    # a name is judged at each connection, after DNS, not here
    manifest.write_text(MANIFEST.replace("127.0.0.1:9000", "receiver.example:9000"))
    assert hooklane(dsn, *args, HOOKLANE_ALLOWED_NETWORKS="").returncode == 0


def test_commands_on_a_database_never_migrated_say_what_to_do(postgresql):
    info = postgresql.info
    postgresql.autocommit = True
    with postgresql.cursor() as cur:
        cur.execute(f"CREATE DATABASE {info.dbname}_empty")
    empty = f"postgresql://{info.user}@{info.host}:{info.port}/{info.dbname}_empty"
    for args in (
        ("status",),
        ("endpoint", "list"),
        ("publish", "--tenant", "a", "--type", "t", "--data", "{}"),
    ):
        result = hooklane(empty, *args)
        assert result.returncode == 1, result.stderr
        assert (
            result.stderr
            == "hooklane: the database has no Hooklane schema, or an older one: run `hooklane migrate` first\n"
        )


async def test_status_shows_the_worst_fifty_and_says_how_many_more(dsn, db):
    for i in range(55):
        await add_endpoint(
            db, f"ep-{i:02d}", "http://127.0.0.1:9/x", tenant=("acme", "globex")[i % 2], paused=i == 7
        )
    for tenant in ("acme", "globex"):
        await publish_event(db, tenant=tenant, type="order.paid", data={})
    # The higher the number, the older its pending delivery: ep-54 is the worst.
    await db.execute(
        "UPDATE deliveries d SET created_at = now() - substr(ep.name, 4)::int * interval '1 minute' "
        "FROM endpoints ep WHERE ep.id = d.endpoint_id"
    )
    worst = [f"default/ep-{i:02d}" for i in range(54, -1, -1)]

    first = hooklane(dsn, "status")
    assert first.returncode == 0, first.stderr
    assert [line.split()[0] for line in first.stdout.splitlines()[1:]] == worst[:50]
    (note,) = first.stderr.splitlines()
    assert note.startswith("hooklane: 50 shown of 55 endpoints, the most delayed first")
    cursor = note.rpartition("--cursor ")[2]
    rest = hooklane(dsn, "status", "--cursor", cursor)
    assert [line.split()[0] for line in rest.stdout.splitlines()[1:]] == worst[50:] and rest.stderr == ""

    acme = hooklane(dsn, "status", "--tenant", "acme", "--limit", "3")
    assert [line.split()[0] for line in acme.stdout.splitlines()[1:]] == worst[0:5:2]
    assert "3 shown of 28 endpoints matching" in acme.stderr
    paused = hooklane(dsn, "status", "--phase", "paused")
    assert [line.split()[0] for line in paused.stdout.splitlines()[1:]] == ["default/ep-07"]
    assert paused.stderr == ""
    held = hooklane(dsn, "endpoint", "list", "--not-delivering", "--name-prefix", "ep-0")
    assert [line.split()[:2] for line in held.stdout.splitlines()[1:]] == [["default", "ep-07"]]
    listed = hooklane(dsn, "endpoint", "list", "--limit", "2", "--tenant", "globex")
    assert [line.split()[1] for line in listed.stdout.splitlines()[1:]] == ["ep-53", "ep-51"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--phase", "Sleeping"], "--phase: must be one of Active, Paused, Probing, Deactivated"),
        (["--limit", "0"], "--limit: must be between 1 and 1000"),
        (["--name-prefix", "Ep"], "--name-prefix: must be the start of a lowercase DNS-style name"),
        (["--tenant", ""], "--tenant"),
        (["--cursor", "nope"], "--cursor: is not a cursor this listing returned"),
    ],
)
def test_listing_options_are_checked(dsn, args, message):
    for command in (["status"], ["endpoint", "list"]):
        result = hooklane(dsn, *command, *args)
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


async def test_delivery_show_lists_every_attempt(dsn, db, receiver, start_worker):
    delivery_id = await flaky_history(db, receiver, start_worker)
    result = await asyncio.to_thread(hooklane, dsn, "delivery", "show", str(delivery_id))
    assert result.returncode == 0, result.stderr
    fields, table = result.stdout.split("\n\n")
    shown_fields = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in fields.splitlines())
    assert {k: v for k, v in shown_fields.items() if k not in ("created", "delivered")} == {
        "delivery": str(delivery_id),
        "endpoint": "default/flaky",
        "tenant": "acme",
        "event": "evt-flaky (order.created)",
        "state": "delivered",
        "next attempt": "-",
        "attempts": "3",
        "last status": "204",
        "last failure": "-",
        "last error": "-",
    }
    header, *rows = table.splitlines()
    assert header.split() == ["ATTEMPT", "STARTED", "DURATION", "OUTCOME", "STATUS", "ERROR", "WORKER"]
    cells = [row.split() for row in rows]
    assert [(c[0], c[3], c[4], " ".join(c[5:-1])) for c in cells] == [
        ("1", "retry", "503", "HTTP 503"),
        ("2", "retry", "500", "HTTP 500"),
        ("3", "delivered", "204", "-"),
    ]
    assert all(c[2].endswith("s") and c[-1] != "-" for c in cells)

    as_json = await asyncio.to_thread(hooklane, dsn, "delivery", "show", str(delivery_id), "--json")
    assert as_json.returncode == 0, as_json.stderr
    detail = await store.delivery_detail(db, delivery_id)
    assert detail is not None
    # The admin API's JSON, field for field.
    assert json.loads(as_json.stdout) == detail_json(detail)
    assert [a["status"] for a in json.loads(as_json.stdout)["attempts"]] == [503, 500, 204]


async def test_a_delivery_resent_by_the_cli_shows_when_it_was_created_and_queued_again(dsn, db):
    await add_endpoint(db, "a", "http://127.0.0.1:9/a")
    await publish_event(db, tenant="acme", type="order.paid", data={})
    delivery = await db.fetchval(
        "UPDATE deliveries SET state = 'dead', created_at = now() - interval '3 days' RETURNING id"
    )
    made = await db.fetchval("SELECT created_at FROM deliveries")
    resent = await asyncio.to_thread(
        hooklane, dsn, "endpoint", "resend", "default/a", "--delivery", str(delivery)
    )
    assert resent.stdout == "1 dead deliveries of default/a queued again\n", resent.stderr
    queued = await db.fetchval("SELECT created_at FROM deliveries")
    result = await asyncio.to_thread(hooklane, dsn, "delivery", "show", str(delivery))
    fields = dict(
        re.split(r"\s{2,}", line, maxsplit=1) for line in result.stdout.split("\n\n")[0].splitlines()
    )
    assert (fields["created"], fields["queued again"]) == (rfc3339_seconds(made), rfc3339_seconds(queued))
    as_json = await asyncio.to_thread(hooklane, dsn, "delivery", "show", str(delivery), "--json")
    shown = json.loads(as_json.stdout)["delivery"]
    assert (shown["created_at"], shown["queued_at"]) == (rfc3339(made), rfc3339(queued))


def test_delivery_show_of_a_missing_or_malformed_id(dsn):
    missing = hooklane(dsn, "delivery", "show", "999999")
    assert (missing.returncode, missing.stdout, missing.stderr) == (1, "", "delivery 999999 not found\n")
    for bad in ("x", "0", "-1", "99999999999999999999"):
        result = hooklane(dsn, "delivery", "show", bad)
        assert result.returncode == 2 and "is not a delivery id" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr


async def test_status_lists_the_endpoints_with_held_keys_after_the_table(dsn, db):
    for name in ("orders", "quiet"):
        await add_endpoint(db, name, "http://127.0.0.1:9/x", event_types=[f"{name}.*"])
    for key in ("order-1", "order-2"):
        await publish_ordered(db, key, [f"{key}-created", f"{key}-paid"], type_="orders.changed")
        await kill_head(db, "orders", key)
    await publish_ordered(db, "q-1", ["q-1-created"], type_="quiet.changed")
    oldest = await db.fetchval("SELECT min(held_since) FROM ordering_keys")

    status = hooklane(dsn, "status")
    assert status.returncode == 0, status.stderr
    table, held = status.stdout.split("\n\n")
    assert [line.split()[0] for line in table.splitlines()[1:]] == ["default/orders", "default/quiet"]
    header, *rows = held.splitlines()
    assert header.split() == ["HELD", "KEYS", "OF", "TENANT", "KEYS", "HELD", "OLDEST", "HELD", "SINCE"]
    assert [row.split()[:4] for row in rows] == [["default/orders", "acme", "2", rfc3339_seconds(oldest)]]
    # Only the endpoints listed: none held among them, no second table.
    quiet = hooklane(dsn, "status", "--name-prefix", "quiet")
    assert quiet.returncode == 0 and "\n\n" not in quiet.stdout and "HELD" not in quiet.stdout
