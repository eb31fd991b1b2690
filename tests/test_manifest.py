"""WebhookEndpoint manifests in local mode: the CRD's rules, in Python."""

from __future__ import annotations

import copy

import pytest

from hooklane.errors import InvalidInput
from hooklane.manifest import SecretRef, parse_manifest

GOOD = {
    "apiVersion": "hooklane.io/v1alpha1",
    "kind": "WebhookEndpoint",
    "metadata": {"name": "orders-acme", "namespace": "shop"},
    "spec": {
        "url": "https://hooks.acme.example/orders",
        "tenant": "acme",
        "secretRef": {"name": "acme-webhook-secret", "key": "secret"},
        "maxConcurrency": 8,
        "eventTypes": ["order.*", "invoice.paid"],
        "timeoutSeconds": 10,
    },
}


def test_good_manifest():
    spec = parse_manifest(GOOD)
    assert (spec.namespace, spec.name, spec.tenant) == ("shop", "orders-acme", "acme")
    assert spec.secret_ref == SecretRef("acme-webhook-secret", "secret")
    assert spec.max_concurrency == 8 and spec.timeout_seconds == 10 and not spec.paused
    assert spec.event_types == ("order.*", "invoice.paid")


def test_defaults():
    doc = copy.deepcopy(GOOD)
    del doc["metadata"]["namespace"]
    doc["spec"] = {"url": "http://127.0.0.1:9000/x", "tenant": "acme"}
    spec = parse_manifest(doc)
    assert spec.namespace == "default"
    assert (spec.max_concurrency, spec.timeout_seconds, spec.paused, spec.event_types) == (4, 5, False, ())


def _with(path: str, value):
    doc = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    target = doc
    for part in parents:
        target = target[part]
    if value is ...:
        del target[last]
    else:
        target[last] = value
    return doc


@pytest.mark.parametrize(
    "path, value, field",
    [
        ("apiVersion", "v1", "apiVersion"),
        ("kind", "Endpoint", "kind"),
        ("metadata.name", "Not_A_Name", "metadata.name"),
        ("spec.url", "ftp://example.com/x", "spec.url"),
        ("spec.url", "not a url", "spec.url"),
        ("spec.url", ..., "spec.url"),
        ("spec.tenant", ..., "spec.tenant"),
        ("spec.maxConcurrency", 0, "spec.maxConcurrency"),
        ("spec.maxConcurrency", 257, "spec.maxConcurrency"),
        ("spec.maxConcurrency", "4", "spec.maxConcurrency"),
        ("spec.timeoutSeconds", 0, "spec.timeoutSeconds"),
        ("spec.timeoutSeconds", 61, "spec.timeoutSeconds"),
        ("spec.eventTypes", ["order.**"], "spec.eventTypes"),
        ("spec.eventTypes", ["*.created"], "spec.eventTypes"),
        ("spec.eventTypes", "order.*", "spec.eventTypes"),
        ("spec.paused", "yes", "spec.paused"),
        ("spec.secretRef", {"name": "x"}, "spec.secretRef"),
        ("spec.colour", "blue", "spec"),
    ],
)
def test_bad_manifests_name_the_field(path, value, field):
    with pytest.raises(InvalidInput) as info:
        parse_manifest(_with(path, value))
    assert info.value.field == field
