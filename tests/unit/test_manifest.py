"""WebhookEndpoint manifests in local mode: the CRD's rules, in Python."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest

from hooklane.bounded_yaml import MAX_MANIFEST_BYTES
from hooklane.checks import check_url
from hooklane.crd import CRD_PATH, crd_yaml
from hooklane.delivery import SecretKeyRef
from hooklane.errors import InvalidInput
from hooklane.spec import load_manifest, parse_manifest
from testsupport.manifests import LAUGHS

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
    assert spec.secret_ref == SecretKeyRef("acme-webhook-secret", "secret")
    assert spec.max_concurrency == 8 and spec.timeout_seconds == 10 and not spec.paused
    assert spec.event_types == ("order.*", "invoice.paid")


def test_defaults():
    doc = copy.deepcopy(GOOD)
    del doc["metadata"]["namespace"]
    doc["spec"] = {"url": "http://127.0.0.1:9000/x", "tenant": "acme", "secretRef": {"name": "s", "key": "k"}}
    spec = parse_manifest(doc)
    assert spec.namespace == "default"
    assert (spec.max_concurrency, spec.timeout_seconds, spec.paused, spec.event_types) == (4, 5, False, ())
    # Hold, the safe default, with or without the object.
    assert spec.ordering_on_dead == "hold"
    doc["spec"]["ordering"] = {}
    assert parse_manifest(doc).ordering_on_dead == "hold"


def test_on_dead_delivery_is_stored_as_the_column_spells_it():
    doc = copy.deepcopy(GOOD)
    doc["spec"]["ordering"] = {"onDeadDelivery": "Skip"}
    assert parse_manifest(doc).ordering_on_dead == "skip"


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
        ("spec.secretRef", {"name": "x"}, "spec.secretRef.key"),
        # required, as by the CRD, although local mode reads the secret from --secret-file
        ("spec.secretRef", ..., "spec.secretRef"),
        ("spec.colour", "blue", "spec"),
        ("spec.ordering", "Hold", "spec.ordering"),
        ("spec.ordering", {"onDead": "Hold"}, "spec.ordering"),
        ("spec.ordering", {"onDeadDelivery": "skip"}, "spec.ordering.onDeadDelivery"),
        ("spec.ordering", {"onDeadDelivery": 1}, "spec.ordering.onDeadDelivery"),
    ],
)
def test_bad_manifests_name_the_field(path, value, field):
    with pytest.raises(InvalidInput) as info:
        parse_manifest(_with(path, value))
    assert info.value.field == field


@pytest.mark.parametrize(
    "path, value",
    [
        ("metadata.name", "orders-acme\n"),
        ("metadata.namespace", "shop\n"),
        ("spec.tenant", "acme\n"),
        ("spec.url", "https://hooks.acme.example/orders\n"),
        ("spec.eventTypes", ["order.*\n"]),
        ("spec.eventTypes", ["invoice.paid\n"]),
        ("spec.secretRef.name", "acme-webhook-secret\n"),
        ("spec.secretRef.key", "secret\n"),
    ],
)
def test_a_trailing_newline_is_refused_in_every_field(path, value):
    with pytest.raises(InvalidInput) as info:
        parse_manifest(_with(path, value))
    assert info.value.field == path


@pytest.mark.parametrize("char", ["\x00", "\n", "\r", "\t", "\x1b", "\x7f", "\x85", "\x9b", "\ud800"])
def test_tenant_refuses_control_characters(char):
    with pytest.raises(InvalidInput) as info:
        parse_manifest(_with("spec.tenant", f"ac{char}me"))
    assert info.value.field == "spec.tenant"


@pytest.mark.parametrize(
    "url, message",
    [
        ("http://[::1/", "malformed host"),
        ("http://[zz::1]/", "malformed host"),
        ("http://[fe80::1%25eth0]/", "IPv6 zone"),
        ("http://example.com:99999/", "invalid port"),
        ("http://example.com:abc/", "invalid port"),
        ("http://example.com:0/", "invalid port"),
        ("http://example.com:/", "invalid port"),
        ("http://127.1/", "four decimal numbers"),
        ("http://0x7f.1/", "four decimal numbers"),
        ("http://0x7f.0.0.1/", "four decimal numbers"),
        ("http://017700000001/", "four decimal numbers"),
        ("http://2130706433/", "four decimal numbers"),
        ("http://127.000.0.1/", "four decimal numbers"),
        ("http://1.2.3.4.5/", "four decimal numbers"),
        ("http://example.com\x00.evil/", "control characters"),
        ("http://example.com/\x1b[2J", "control characters"),
        ("http://example.com/a b", "whitespace"),
        ("http://example.com/\u2028", "control characters"),
        ("http://user:pass@example.com/", "user:password@"),
        ("http://token@example.com/", "user:password@"),
        ("http://example.com/hook#frag", "#fragment"),
        ("http://exa_mple.com/", "not a DNS name"),
        ("http://-example.com/", "not a DNS name"),
        ("http://example-.com/", "not a DNS name"),
        ("http://" + "a" * 64 + ".com/", "not a DNS name"),
        ("http://" + ".".join(["a" * 63] * 4) + "/", "not a DNS name"),
        ("http://example..com/", "not a DNS name"),
        ("http://example.com\\@evil.example/", "user:password@"),
        ("http://ex%61mple.com/", "not a DNS name"),
        ("http://exämple.com/", "punycode"),
        ("http://例え.jp/", "punycode"),
        ("http:example.com", "like https://host/path"),
        ("http:///path", "no host"),
        ("javascript://example.com/", "http or https"),
    ],
)
def test_bad_urls_are_refused(url, message):
    with pytest.raises(InvalidInput) as info:
        check_url(url)
    assert info.value.field == "spec.url"
    assert message in info.value.message


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9000/hooks/acme",
        "https://hooks.acme.example/orders?tenant=acme&x=%20",
        "https://hooks.acme.example./orders",
        "https://xn--exmple-cua.example/",
        "http://[::1]:8080/",
        "http://[2001:db8::7]/x",
        "http://localhost/",
        "HTTPS://Hooks.Example.COM/Path",
        "https://example.com:65535/über",
    ],
)
def test_good_urls_are_kept_as_written(url):
    assert check_url(url) == url


@pytest.mark.parametrize(
    "path, value",
    [
        ("spec.maxConcurrency", 10**30),
        pytest.param("spec.maxConcurrency", 10**5000, id="spec.maxConcurrency-5000-digits"),
        ("spec.maxConcurrency", -(10**30)),
        ("spec.maxConcurrency", 4.0),
        ("spec.maxConcurrency", float("inf")),
        ("spec.maxConcurrency", float("nan")),
        ("spec.maxConcurrency", True),
        ("spec.maxConcurrency", "1e400"),
        ("spec.timeoutSeconds", 10**30),
        ("spec.timeoutSeconds", 5.5),
        ("spec.timeoutSeconds", False),
        ("spec.paused", 1),
        ("spec.tenant", 7),
        ("spec.tenant", "x" * 254),
        ("spec.url", 7),
        ("spec.eventTypes", ["order." + "x" * 250]),
        ("spec.eventTypes", [7]),
        ("spec.eventTypes", [["order.*"]]),
        ("spec.secretRef", "acme-webhook-secret"),
        ("spec.secretRef.name", "Acme_Secret"),
        ("spec.secretRef.name", "x" * 254),
        ("spec.secretRef.key", "se cret"),
        ("spec.secretRef.key", "secret/../x"),
        ("spec.secretRef.key", "k" * 254),
        ("spec.secretRef.key", ""),
        ("metadata.name", "x" * 254),
        ("metadata.name", 7),
        ("metadata.namespace", "a.b"),
        ("metadata.namespace", "n" * 64),
    ],
)
def test_values_of_the_wrong_type_or_size_name_the_field(path, value):
    with pytest.raises(InvalidInput) as info:
        parse_manifest(_with(path, value))
    assert info.value.field == path
    assert len(str(info.value)) < 300


def test_the_committed_crd_is_what_hack_gen_crd_writes():
    committed = (Path(__file__).parents[2] / CRD_PATH).read_text()
    assert committed == crd_yaml(), "the CRD differs from hooklane/spec.py and crd.py: run hack/gen-crd"


def test_values_at_the_limits_are_accepted():
    longest = "order." + "x" * 249
    doc = _with("spec.eventTypes", [longest])
    doc["spec"]["secretRef"] = {"name": "s" * 253, "key": "-._" + "k" * 250}
    doc["spec"]["tenant"] = "t" * 253
    doc["metadata"]["namespace"] = "n" * 63
    spec = parse_manifest(doc)
    assert spec.event_types == (longest,) and len(spec.tenant) == 253


@pytest.mark.parametrize(
    "path, value, field, named",
    [
        ("sepc", {}, "manifest", "sepc"),
        ("metadata.nmae", "x", "metadata", "nmae"),
        ("spec.secretRef.optional", True, "spec.secretRef", "optional"),
        ("spec.tenat", "acme", "spec", "tenat"),
    ],
)
def test_unknown_fields_are_named(path, value, field, named):
    with pytest.raises(InvalidInput) as info:
        parse_manifest(_with(path, value))
    assert info.value.field == field and named in info.value.message


def test_what_kubectl_get_exports_applies():
    doc = copy.deepcopy(GOOD)
    doc["metadata"].update(
        uid="6f1c",
        resourceVersion="42",
        generation=3,
        creationTimestamp="2024-05-01T00:00:00Z",
        labels={"team": "shop"},
        annotations={"note": "x"},
        managedFields=[{"manager": "kubectl"}],
    )
    doc["status"] = {"phase": "Active", "pending": 0}
    assert parse_manifest(doc).name == "orders-acme"


def _nested(depth: int):
    value = "x"
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    "path, value, field",
    [
        ("metadata.annotations", {"note": "a\x00b"}, "metadata.annotations.note"),
        ("metadata.annotations", {"no\x00te": "ab"}, "metadata.annotations"),
        ("metadata.labels", {"x": "\udc80"}, "metadata.labels.x"),
        ("metadata.labels", {1: "x"}, "metadata.labels"),
        ("metadata.labels", {None: "x"}, "metadata.labels"),
        ("status", _nested(100_000), "status" + ".a" * 47 + "..."),
        ("spec", {1: 2}, "spec"),
        ("spec.tenant", "ac\x00me", "spec.tenant"),
    ],
)
def test_unstorable_text_odd_keys_and_deep_nesting_are_refused(path, value, field):
    with pytest.raises(InvalidInput) as info:
        parse_manifest(_with(path, value))
    assert info.value.field == field
    assert len(str(info.value)) < 600


def test_a_value_repr_cannot_print_is_still_reported():
    with pytest.raises(InvalidInput) as info:
        parse_manifest(_with("apiVersion", 10**5000))
    assert info.value.field == "apiVersion" and "too large to print" in info.value.message


MANIFEST = (Path(__file__).parents[2] / "examples" / "endpoint.yaml").read_bytes()


def test_the_example_and_its_json_form_load():
    spec = load_manifest(MANIFEST, "--filename")
    assert (spec.namespace, spec.name, spec.tenant) == ("default", "orders-acme", "acme")
    assert load_manifest(json.dumps(GOOD).encode(), "--filename").name == "orders-acme"
    assert load_manifest(b"---\n" + MANIFEST + b"...\n", "--filename").name == "orders-acme"


@pytest.mark.parametrize(
    "raw, message",
    [
        (LAUGHS, "aliases are not supported"),
        (MANIFEST.replace(b"tenant: acme", b"tenant: &t acme\n  other: *t"), "aliases are not supported"),
        (b"x: &x {a: 1}\n<<: *x\n", "aliases are not supported"),
        (b"[" * 100_000, "nests deeper than 64 levels"),
        (b'{"a":' * 100_000, "nests deeper than 64 levels"),
        (b"".join(b"  " * i + b"- \n" for i in range(100)), "nests deeper than 64 levels"),
        (b"[" + b"1," * 20_000 + b"1]", "more than 10000 values"),
        (MANIFEST + b"---\n" + MANIFEST, "more than one YAML document"),
        (MANIFEST + b"---\n", "more than one YAML document"),
        (b"\xff\xfe" + MANIFEST, "is not UTF-8 (byte 0)"),
        (MANIFEST.replace(b"acme", b"ac\xc3me"), "is not UTF-8"),
        (MANIFEST.replace(b"tenant: acme", b"tenant: ac\x00me"), "contains a NUL character"),
        (MANIFEST + b"#" * MAX_MANIFEST_BYTES, "is larger than 1048576 bytes"),
        (
            MANIFEST.replace(b"maxConcurrency: 4", b"maxConcurrency: " + b"1:" * 300_000 + b"1"),
            "integer longer than",
        ),
        (MANIFEST.replace(b"maxConcurrency: 4", b"maxConcurrency: " + b"9" * 5000), "integer longer than"),
        (MANIFEST.replace(b"tenant: acme", b"tenant: 2024-13-45"), "cannot read: month must be in 1..12"),
        (MANIFEST.replace(b"tenant: acme", b"tenant: !!python/object:os.system x"), "is not valid YAML"),
        (MANIFEST.replace(b"tenant: acme", b"tenant: ac\x1bme"), "character #x001b is not allowed"),
        (b"spec: [\n", "is not valid YAML"),
    ],
)
def test_hostile_files_are_refused_quickly_and_briefly(raw, message):
    started = time.monotonic()
    with pytest.raises(InvalidInput) as info:
        load_manifest(raw, "--filename")
    assert time.monotonic() - started < 10
    assert info.value.field == "--filename"
    assert message in info.value.message
    assert len(str(info.value)) < 300 and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "replace, field",
    [
        ((b"tenant: acme", b'tenant: "ac\\0me"'), "spec.tenant"),
        ((b"tenant: acme", b'tenant: "acme\\n"'), "spec.tenant"),
        ((b"tenant: acme", b'tenant: "\\ud800"'), "spec.tenant"),
        ((b"tenant: acme", b"tenant: 99999999999999999999999"), "spec.tenant"),
        ((b"maxConcurrency: 4", b"maxConcurrency: 99999999999999999999999"), "spec.maxConcurrency"),
        ((b"maxConcurrency: 4", b"maxConcurrency: 1e400"), "spec.maxConcurrency"),
        ((b"maxConcurrency: 4", b"maxConcurrency: 1.0e+400"), "spec.maxConcurrency"),
        ((b"maxConcurrency: 4", b"maxConcurrency: 4.0"), "spec.maxConcurrency"),
        ((b"maxConcurrency: 4", b"maxConcurrency: yes"), "spec.maxConcurrency"),
        ((b"name: orders-acme", b'name: "orders-acme\\n"'), "metadata.name"),
        ((b"spec:", b"sepc:"), "manifest"),
        ((b"9000", b"99999"), "spec.url"),
    ],
)
def test_escapes_and_numbers_in_yaml_reach_the_field_checks(replace, field):
    with pytest.raises(InvalidInput) as info:
        load_manifest(MANIFEST.replace(*replace), "--filename")
    assert info.value.field == field
