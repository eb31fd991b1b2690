"""The endpoint field rules (``SPEC`` in hooklane/spec.py) against the API
server, through the CRD written from them: for every row, both accept or
both refuse."""

from __future__ import annotations

import copy
import json
import uuid
from typing import Any

import pytest

from hooklane.dev.controlplane import ControlPlane
from hooklane.errors import InvalidInput
from hooklane.spec import (
    API_VERSION,
    KIND,
    SPEC,
    _checked,
    parse_manifest,
    parse_spec,
)

SPEC_ = {
    "url": "https://hooks.acme.example/orders",
    "tenant": "acme",
    "secretRef": {"name": "acme-webhook-secret", "key": "secret"},
}


LONG_URL = "https://hooks.acme.example/" + "x" * (2048 - len("https://hooks.acme.example/"))


LABELS = ".".join(["a" * 63] * 4)[:253]


Absent = object()


def _from_secret(name: str, key: str) -> dict[str, Any]:
    return {"name": "Authorization", "valueFrom": {"secretKeyRef": {"name": name, "key": key}}}


STATIC = {"name": "X-Api-Key", "value": "k-123"}


FROM_SECRET = _from_secret("acme-api-key", "token")


# The names spec.delivery.headers refuses, in the cases people write them.
REFUSED = (
    "Host",
    "content-length",
    "Transfer-Encoding",
    "Connection",
    "Upgrade",
    "webhook-id",
    "Webhook-Signature",
)


def _spec(path: str, value: Any, base: dict[str, Any] = SPEC_) -> dict[str, Any]:
    """``base`` with the field at the dotted ``path`` set to ``value``; the
    objects on the way (delivery.retry, ...) are created where missing."""
    spec = copy.deepcopy(base)
    *parents, last = path.split(".")
    target = spec
    for part in parents:
        target = target.setdefault(part, {})
    if value is Absent:
        del target[last]
    else:
        target[last] = value
    return spec


# (spec field, value, accepted): every bound and its neighbour past it,
# patterns, required fields, types and unknown fields.
ROWS: list[tuple[str, Any, bool]] = [
    ("maxConcurrency", 1, True),
    ("maxConcurrency", 0, False),
    ("maxConcurrency", 256, True),
    ("maxConcurrency", 257, False),
    ("maxConcurrency", None, True),
    ("maxConcurrency", "4", False),
    ("maxConcurrency", True, False),
    ("maxConcurrency", 4.5, False),
    ("timeoutSeconds", 1, True),
    ("timeoutSeconds", 0, False),
    ("timeoutSeconds", 60, True),
    ("timeoutSeconds", 61, False),
    ("timeoutSeconds", "5", False),
    ("paused", True, True),
    ("paused", "yes", False),
    ("paused", 1, False),
    ("url", LONG_URL, True),
    ("url", LONG_URL + "x", False),
    ("url", "", False),
    ("url", Absent, False),
    ("url", None, False),
    ("url", 7, False),
    ("url", "http://[::1]:8080/x?y=%20", True),
    ("url", "ftp://hooks.acme.example/", False),
    ("url", "hooks.acme.example/orders", False),
    ("url", "http:///orders", False),
    ("url", "http://hooks.acme.example/a b", False),
    ("url", "http://hooks.acme.example/\x1b[2J", False),
    ("url", "http://hooks.acme.example/orders\n", False),
    ("url", "http://hooks.acme.example/orders#frag", False),
    ("url", "http://user:pw@hooks.acme.example/", False),
    ("url", "http://token@hooks.acme.example/", False),
    ("tenant", "t", True),
    ("tenant", "t" * 253, True),
    ("tenant", "t" * 254, False),
    ("tenant", "", False),
    ("tenant", Absent, False),
    ("tenant", 7, False),
    ("tenant", "Acme Corp / EU", True),
    ("tenant", "ac\nme", False),
    ("tenant", "ac\x1bme", False),
    ("tenant", "ac\x7fme", False),
    ("tenant", "ac\x85me", False),
    ("tenant", "acmé", True),
    ("secretRef", Absent, False),
    ("secretRef", "acme-webhook-secret", False),
    ("secretRef.name", LABELS, True),
    ("secretRef.name", LABELS + "a", False),
    ("secretRef.name", "s" * 253, True),
    ("secretRef.name", "s" * 254, False),
    ("secretRef.name", "Acme_Secret", False),
    ("secretRef.name", "acme-", False),
    ("secretRef.name", "", False),
    ("secretRef.name", Absent, False),
    ("secretRef.key", "k" * 253, True),
    ("secretRef.key", "k" * 254, False),
    ("secretRef.key", "-._Key9", True),
    ("secretRef.key", "se cret", False),
    ("secretRef.key", "a/b", False),
    ("secretRef.key", "secret\n", False),
    ("secretRef.key", "", False),
    ("secretRef.key", Absent, False),
    ("secretRef.optional", True, False),
    ("eventTypes", [], True),
    ("eventTypes", None, True),
    ("eventTypes", ["*"], True),
    ("eventTypes", ["order.*", "invoice.paid", "a-b_c.d"], True),
    ("eventTypes", [f"type{i}" for i in range(64)], True),
    ("eventTypes", [f"type{i}" for i in range(65)], False),
    ("eventTypes", ["order." + "x" * 249], True),
    ("eventTypes", ["order." + "x" * 250], False),
    ("eventTypes", [""], False),
    ("eventTypes", ["order.**"], False),
    ("eventTypes", ["*.created"], False),
    ("eventTypes", ["order"], True),
    ("eventTypes", ["order.*\n"], False),
    ("eventTypes", ["order created"], False),
    ("eventTypes", "order.*", False),
    ("eventTypes", [7], False),
    ("colour", "blue", False),
    # spec.delivery
    ("delivery", {}, True),
    ("delivery", None, True),
    ("delivery", "fast", False),
    ("delivery.colour", "blue", False),
    ("delivery.rateLimit.perSecond", 1, True),
    ("delivery.rateLimit.perSecond", 0, False),
    ("delivery.rateLimit.perSecond", 10_000, True),
    ("delivery.rateLimit.perSecond", 10_001, False),
    ("delivery.rateLimit.perSecond", "10", False),
    ("delivery.rateLimit.perSecond", 1.5, False),
    ("delivery.rateLimit", {"burst": 5}, False),
    ("delivery.rateLimit", {}, False),
    ("delivery.rateLimit", None, True),
    ("delivery.rateLimit", {"perSecond": 10}, True),
    ("delivery.rateLimit", {"perSecond": 10, "burst": 1}, True),
    ("delivery.rateLimit", {"perSecond": 10, "burst": 0}, False),
    ("delivery.rateLimit", {"perSecond": 10, "burst": 10_000}, True),
    ("delivery.rateLimit", {"perSecond": 10, "burst": 10_001}, False),
    ("delivery.rateLimit", {"perSecond": 10, "burst": None}, True),
    ("delivery.rateLimit", {"perSecond": 10, "burst": True}, False),
    ("delivery.rateLimit", {"perSecond": 10, "perMinute": 60}, False),
    ("delivery.adaptiveConcurrency", True, True),
    ("delivery.adaptiveConcurrency", False, True),
    ("delivery.adaptiveConcurrency", "yes", False),
    ("delivery.adaptiveConcurrency", 1, False),
    ("delivery.headers", [], True),
    ("delivery.headers", [STATIC], True),
    ("delivery.headers", [FROM_SECRET], True),
    ("delivery.headers", [STATIC, FROM_SECRET], True),
    *(("delivery.headers", [{"name": name, "value": "x"}], False) for name in REFUSED),
    # Only the names themselves, and webhook-* as a prefix, are Hooklane's.
    ("delivery.headers", [{"name": "X-Webhook-Id", "value": "x"}], True),
    ("delivery.headers", [{"name": "Webhook", "value": "x"}], True),
    ("delivery.headers", [{"name": "Hostname", "value": "x"}], True),
    ("delivery.headers", [{"name": "X Api Key", "value": "x"}], False),
    ("delivery.headers", [{"name": "X-Api-Key:", "value": "x"}], False),
    ("delivery.headers", [{"name": "X-Äpi", "value": "x"}], False),
    ("delivery.headers", [{"name": "", "value": "x"}], False),
    ("delivery.headers", [{"name": "!#$%&'*+.^_`|~-09AZaz", "value": "x"}], True),
    ("delivery.headers", [{"name": "X" * 256, "value": "x"}], True),
    ("delivery.headers", [{"name": "X" * 257, "value": "x"}], False),
    ("delivery.headers", [{"name": 7, "value": "x"}], False),
    ("delivery.headers", [{"value": "x"}], False),
    ("delivery.headers", [{"name": "X-Api-Key", "value": "a\nb"}], False),
    ("delivery.headers", [{"name": "X-Api-Key", "value": "key\n"}], False),
    ("delivery.headers", [{"name": "X-Api-Key", "value": "key\r"}], False),
    ("delivery.headers", [{"name": "X-Api-Key", "value": " key"}], False),
    ("delivery.headers", [{"name": "X-Api-Key", "value": "key "}], False),
    ("delivery.headers", [{"name": "X-Api-Key", "value": "\tkey"}], False),
    ("delivery.headers", [{"name": "X-Api-Key", "value": "Bearer a\tb c"}], True),
    ("delivery.headers", [{"name": "X-Api-Key", "value": "clé"}], False),
    ("delivery.headers", [{"name": "X-Api-Key", "value": "\x7f"}], False),
    ("delivery.headers", [{"name": "X-Api-Key", "value": ""}], False),
    ("delivery.headers", [{"name": "X-Api-Key", "value": "k" * 4096}], True),
    ("delivery.headers", [{"name": "X-Api-Key", "value": "k" * 4097}], False),
    ("delivery.headers", [{"name": "X-Api-Key", "value": 7}], False),
    ("delivery.headers", [{**STATIC, "valueFrom": FROM_SECRET["valueFrom"]}], False),
    ("delivery.headers", [{"name": "X-Api-Key"}], False),
    ("delivery.headers", [{"name": "X-Api-Key", "value": None}], False),
    ("delivery.headers", [{**STATIC, "secret": "acme-api-key"}], False),
    ("delivery.headers", [{"name": "X-Api-Key", "valueFrom": {}}], False),
    (
        "delivery.headers",
        [{"name": "X-Api-Key", "valueFrom": {"secretKeyRef": {"name": "acme-api-key"}}}],
        False,
    ),
    ("delivery.headers", [{"name": "X-Api-Key", "valueFrom": {"secretKeyRef": {"key": "token"}}}], False),
    ("delivery.headers", [_from_secret("Acme_Key", "token")], False),
    ("delivery.headers", [_from_secret("acme-api-key", "a/b")], False),
    ("delivery.headers", [_from_secret("acme-api-key", "-._Key9")], True),
    (
        "delivery.headers",
        [
            {
                **FROM_SECRET,
                "valueFrom": {"secretKeyRef": {**FROM_SECRET["valueFrom"]["secretKeyRef"], "optional": True}},
            }
        ],
        False,
    ),
    ("delivery.headers", [STATIC, {"name": "x-api-key", "value": "other"}], False),
    ("delivery.headers", [STATIC, {**FROM_SECRET, "name": "X-API-KEY"}], False),
    ("delivery.headers", [STATIC, STATIC], False),
    ("delivery.headers", [{"name": f"X-Extra-{i}", "value": "x"} for i in range(32)], True),
    ("delivery.headers", [{"name": f"X-Extra-{i}", "value": "x"} for i in range(33)], False),
    ("delivery.headers", STATIC, False),
    ("delivery.headers", ["X-Api-Key: k-123"], False),
    ("delivery.tls", {}, True),
    ("delivery.tls", None, True),
    ("delivery.tls.caSecretRef", {"name": "acme-ca", "key": "bundle.pem"}, True),
    ("delivery.tls.caSecretRef", {"name": "acme-ca"}, True),
    ("delivery.tls.caSecretRef", {"key": "ca.crt"}, False),
    ("delivery.tls.caSecretRef", {"name": "acme-ca", "key": ""}, False),
    ("delivery.tls.caSecretRef", {"name": "acme-ca", "key": "ca crt"}, False),
    ("delivery.tls.caSecretRef", {"name": "Acme_CA"}, False),
    ("delivery.tls.caSecretRef", "acme-ca", False),
    ("delivery.tls.clientCertificateSecretRef", {"name": "acme-client"}, True),
    ("delivery.tls.clientCertificateSecretRef", {}, False),
    ("delivery.tls.clientCertificateSecretRef", {"key": "tls.crt"}, False),
    ("delivery.tls.clientCertificateSecretRef", {"name": "acme-client", "key": "tls.crt"}, False),
    ("delivery.tls.serverName", "hooks.internal.example", True),
    ("delivery.tls.serverName", "Hooks.Internal.Example", True),
    ("delivery.tls.serverName", "localhost", True),
    ("delivery.tls.serverName", "a" * 253, True),
    ("delivery.tls.serverName", "a" * 254, False),
    ("delivery.tls.serverName", "bad_name.example", False),
    ("delivery.tls.serverName", "-hooks.example", False),
    ("delivery.tls.serverName", "hooks-.example", False),
    ("delivery.tls.serverName", "hooks.example.", False),
    ("delivery.tls.serverName", "hooks..example", False),
    ("delivery.tls.serverName", "*.hooks.example", False),
    ("delivery.tls.serverName", "hooks.example:443", False),
    ("delivery.tls.serverName", "hooks example", False),
    ("delivery.tls.serverName", "hooks.example\n", False),
    ("delivery.tls.serverName", "", False),
    ("delivery.tls.serverName", 7, False),
    ("delivery.tls.insecureSkipVerify", True, False),
    ("delivery.retry", {}, True),
    ("delivery.retry", None, True),
    ("delivery.retry.maxAttempts", 1, True),
    ("delivery.retry.maxAttempts", 20, True),
    ("delivery.retry.maxAttempts", 0, False),
    ("delivery.retry.maxAttempts", 21, False),
    ("delivery.retry.maxAttempts", "5", False),
    ("delivery.retry.maxAttempts", 5.5, False),
    ("delivery.retry.maxAge", "1s", True),
    ("delivery.retry.maxAge", "72h", True),
    ("delivery.retry.maxAge", "90m", True),
    ("delivery.retry.maxAge", "1h30m", True),
    ("delivery.retry.maxAge", "1.5h", True),
    ("delivery.retry.maxAge", "4320m", True),
    ("delivery.retry.maxAge", "71h60m", True),
    ("delivery.retry.maxAge", "259200s", True),
    ("delivery.retry.maxAge", "73h", False),
    ("delivery.retry.maxAge", "72h1s", False),
    ("delivery.retry.maxAge", "259201s", False),
    ("delivery.retry.maxAge", "0s", False),
    ("delivery.retry.maxAge", "0.5s", False),
    ("delivery.retry.maxAge", "10d", False),
    ("delivery.retry.maxAge", "abc", False),
    ("delivery.retry.maxAge", "1ms", False),
    ("delivery.retry.maxAge", "-1h", False),
    ("delivery.retry.maxAge", "1h ", False),
    ("delivery.retry.maxAge", "h", False),
    ("delivery.retry.maxAge", "", False),
    ("delivery.retry.maxAge", "36", False),
    ("delivery.retry.maxAge", 3600, False),
    # Past what a Go duration holds: the CEL rule fails to evaluate.
    ("delivery.retry.maxAge", "999999h999999h999999h", False),
    ("delivery.retry.maxRetries", 3, False),
    ("ordering", {}, True),
    ("ordering", None, True),
    ("ordering", "Hold", False),
    ("ordering.onDeadDelivery", "Hold", True),
    ("ordering.onDeadDelivery", "Skip", True),
    ("ordering.onDeadDelivery", "hold", False),
    ("ordering.onDeadDelivery", "Drop", False),
    ("ordering.onDeadDelivery", "", False),
    ("ordering.onDeadDelivery", True, False),
    ("ordering.onDeadDelivery", ["Hold"], False),
    ("ordering.onDeadAttempt", "Hold", False),
]


# Rows of more than one field: (the fields set, by dotted path; accepted).
# delivery.tls needs an https:// url, checked by a CEL rule on the whole
# spec and by a Python check.
CROSS_FIELD: list[tuple[dict[str, Any], bool]] = [
    ({"url": "http://hooks.acme.example/orders", "delivery.tls": {}}, False),
    ({"url": "http://hooks.acme.example/orders", "delivery.tls.serverName": "hooks.example"}, False),
    ({"url": "http://hooks.acme.example/orders", "delivery.tls.caSecretRef": {"name": "acme-ca"}}, False),
    ({"url": "http://hooks.acme.example/orders", "delivery.tls": None}, True),
    ({"url": "http://hooks.acme.example/orders", "delivery.headers": [STATIC]}, True),
    ({"url": "HTTPS://hooks.acme.example/orders", "delivery.tls.serverName": "hooks.example"}, True),
    ({"url": "HTTP://hooks.acme.example/orders", "delivery.tls.serverName": "hooks.example"}, False),
]


def _manifest(namespace: str, spec: Any) -> dict[str, Any]:
    name = f"row-{uuid.uuid4().hex[:12]}"
    doc: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}}
    doc["metadata"]["namespace"] = namespace
    if spec is not Absent:
        doc["spec"] = spec
    return doc


def _server_create(cp: ControlPlane, doc: dict[str, Any]) -> tuple[bool, Any]:
    """What `kubectl create` with server-side dry run and strict field
    validation says: (accepted, the defaulted object or the error)."""
    done = cp.kubectl(
        "create",
        "--dry-run=server",
        "--validate=strict",
        "-o",
        "json",
        "-f",
        "-",
        stdin=json.dumps(doc),
        check=False,
    )
    if done.returncode == 0:
        return True, json.loads(done.stdout)
    return False, done.stderr.strip()


def _parser(doc: dict[str, Any]) -> tuple[bool, Any]:
    try:
        return True, parse_manifest(doc)
    except InvalidInput as exc:
        return False, str(exc)


@pytest.fixture(scope="module")
def namespace(control_plane: ControlPlane) -> str:
    name = f"crd-agreement-{uuid.uuid4().hex[:8]}"
    control_plane.create_namespace(name)
    return name


def _spec_of(fields: dict[str, Any]) -> dict[str, Any]:
    spec = SPEC_
    for path, value in fields.items():
        spec = _spec(path, value, spec)
    return spec


def _without_nulls(value: Any) -> Any:
    """What the API server keeps of a value: nulls are pruned."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def test_the_api_server_and_the_parser_agree_on_every_row(control_plane, namespace):
    specs = [_spec(path, value) for path, value, _ in ROWS] + [_spec_of(f) for f, _ in CROSS_FIELD]
    docs = [_manifest(namespace, spec) for spec in specs]
    # Manifests beside the spec: none, an unknown top-level field.
    docs += [_manifest(namespace, Absent), {**_manifest(namespace, SPEC_), "sepc": {}}]
    expected = (
        [accepted for *_, accepted in ROWS] + [accepted for _, accepted in CROSS_FIELD] + [False, False]
    )
    disagreements = []
    for doc, accepted in zip(docs, expected, strict=True):
        server, server_said = _server_create(control_plane, doc)
        parser, parsed = _parser(doc)
        if not server == parser == accepted:
            disagreements.append(
                f"{json.dumps(doc.get('spec'))[:160]}: server {server_said}, parser {parsed}"
            )
        elif accepted:
            # The server's defaults are the parser's, at every depth
            # (delivery.rateLimit.burst, tls.caSecretRef.key, ...).
            stored = server_said["spec"]
            assert parse_spec(namespace, doc["metadata"]["name"], stored) == parsed
            assert stored == _without_nulls(_checked(SPEC, doc["spec"], "spec"))
    assert not disagreements, "\n".join(disagreements)


def test_a_bad_on_dead_delivery_is_refused_naming_the_field_and_the_choices(control_plane, namespace):
    doc = _manifest(namespace, _spec("ordering.onDeadDelivery", "Drop"))
    server, server_said = _server_create(control_plane, doc)
    assert not server
    assert "spec.ordering.onDeadDelivery" in server_said
    assert '"Hold"' in server_said and '"Skip"' in server_said
    parser, parsed = _parser(doc)
    assert not parser
    assert parsed == "spec.ordering.onDeadDelivery: must be one of Hold, Skip, not 'Drop'"
