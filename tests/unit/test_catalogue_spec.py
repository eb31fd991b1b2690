"""WebhookEventType specs (hooklane/catalogue.py): what is refused, with
the field named, and how file references are bundled. The API server's
side: tests/kube/test_eventtypes.py."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from hooklane.catalogue import (
    MAX_SCHEMA_BYTES,
    NAME_PATTERN,
    EventTypeSpec,
    load_manifests,
    parse_manifest,
    parse_spec,
    resource_name_for,
)
from hooklane.checks import EVENT_TYPE, K8S_NAME_PATTERN
from hooklane.crd import EVENTTYPE_CRD_PATH, eventtype_crd, eventtype_crd_yaml
from hooklane.errors import InvalidInput

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "eventtypes" / "order-paid.yaml"

SCHEMA = {
    "type": "object",
    "required": ["amount"],
    "properties": {"amount": {"type": "integer", "minimum": 0}, "customer": {"$ref": "#/$defs/customer"}},
    "$defs": {"customer": {"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}}},
}
SPEC = {
    "description": "An order was paid.",
    "group": "Orders",
    "versions": [
        {"version": 1, "schema": {"type": "object"}, "example": {}},
        {"version": 2, "schema": SCHEMA, "example": {"amount": 5, "customer": {"id": "c1"}}},
    ],
}


def _spec(path: str, value: Any) -> dict[str, Any]:
    """SPEC with the value at the dotted path (list indexes as numbers) set."""
    spec = copy.deepcopy(SPEC)
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    target: Any = spec
    for part in parents:
        target = target[part]
    target[last] = value
    return spec


def _refused(spec: Any, name: str = "order.paid", **kwargs: Any) -> str:
    with pytest.raises(InvalidInput) as caught:
        parse_spec(name, spec, **kwargs)
    return str(caught.value)


def test_a_good_spec_is_read_whole():
    spec = parse_spec("order.paid", SPEC)
    assert (spec.name, spec.group, spec.latest, spec.archived, spec.deprecated_since) == (
        "order.paid",
        "Orders",
        2,
        False,
        None,
    )
    assert spec.versions[1].json_schema == SCHEMA


@pytest.mark.parametrize(
    ("path", "value", "error"),
    [
        (
            "versions.1.example",
            {"customer": {"id": "c1"}},
            "spec.versions[1].example: 'amount' is a required property",
        ),
        (
            "versions.1.example",
            {"amount": 1, "customer": {}},
            "spec.versions[1].example.customer: 'id' is a required property",
        ),
        (
            "versions.1.example",
            {"amount": -1},
            "spec.versions[1].example.amount: -1 is less than the minimum of 0",
        ),
        (
            "versions.0.schema",
            {"type": "objekt"},
            "spec.versions[0].schema.type: 'objekt' is not valid under any",
        ),
        (
            "versions.0.schema",
            {"minLength": "3"},
            "spec.versions[0].schema.minLength: '3' is not of type 'integer'",
        ),
        (
            "versions.0.schema",
            "object",
            "spec.versions[0].schema: must be a JSON Schema (an object or a boolean)",
        ),
        (
            "versions.0.schema",
            {"$ref": "#/$defs/nowhere"},
            "spec.versions[0].schema.$ref: '#/$defs/nowhere' points nowhere",
        ),
        (
            "versions.0.schema",
            {"$schema": "http://json-schema.org/draft-07/schema#"},
            "spec.versions[0].schema.$schema: must be https://json-schema.org/draft/2020-12/schema",
        ),
        (
            "versions.0.schema",
            {"$ref": "https://schemas.example.com/order.json"},
            "spec.versions[0].schema.$ref: 'https://schemas.example.com/order.json' is on the network: schemas are never fetched",
        ),
        (
            "versions.0.schema",
            {"properties": {"a": {"$ref": "http://x/a.json#/b"}}},
            "spec.versions[0].schema.properties.a.$ref: 'http://x/a.json#/b' is on the network",
        ),
        (
            "versions.0.schema",
            {"$ref": "urn:example:order"},
            "spec.versions[0].schema.$ref: 'urn:example:order': only #/... references and relative file paths",
        ),
        (
            "versions.0.schema",
            {"$ref": "money.json"},
            "spec.versions[0].schema.$ref: 'money.json' refers to a file: a resource holds its whole schema",
        ),
        ("versions.0.example", [], "spec.versions[0].example: Input should be a valid dictionary"),
        ("versions.0.version", 0, "spec.versions[0].version: Input should be greater than or equal to 1"),
        ("versions.0.version", 1001, "spec.versions[0].version: Input should be less than or equal to 1000"),
        ("versions.0.version", True, "spec.versions[0].version: Input should be a valid integer"),
        ("versions.0.version", 2, "spec.versions[1].version: 2 is listed twice: versions are unique"),
        ("versions", [], "spec.versions: List should have at least 1 item"),
        ("versions.0.extra", 1, "spec.versions[0].extra: is not a field of a WebhookEventType"),
        ("deprecated", {"since": "2026-02-30"}, "spec.deprecated.since: Input should be a valid date"),
        ("deprecated", {"on": "2026-02-01"}, "spec.deprecated.since: is required"),
        ("archived", "yes", "spec.archived: Input should be a valid boolean"),
        ("description", "x" * 4097, "spec.description: String should have at most 4096 characters"),
        ("group", "", "spec.group: String should have at least 1 character"),
        ("group", "Orders\n", "spec.group: must not contain control characters"),
        ("name", "order paid", "spec.name: must be an event type like 'order.paid'"),
        (
            "name",
            "Order_Paid",
            "metadata.name: must be 'order-paid' (spec.name lowercased, '_' as '-'), not 'order.paid'",
        ),
        (
            "versions.1.example",
            {"amount": 1, "at": __import__("datetime").date(2026, 1, 1)},
            "spec.versions[1].example.at: is not a JSON value",
        ),
    ],
)
def test_a_bad_field_is_refused_by_name(path, value, error):
    assert _refused(_spec(path, value)).startswith(error)


def test_a_schema_past_its_bound_is_refused():
    big = {"type": "object", "description": "x" * MAX_SCHEMA_BYTES}
    assert _refused(_spec("versions.0.schema", big)).startswith(
        f"spec.versions[0].schema: is {len(json.dumps(big, separators=(',', ':')))} bytes of JSON: at most {MAX_SCHEMA_BYTES}"
    )


def test_spec_name_comes_down_to_the_resource_name():
    spec = parse_spec("order-paid", {**SPEC, "name": "Order_Paid"})
    assert spec.name == "Order_Paid"
    assert resource_name_for("Billing.Invoice_Sent") == "billing.invoice-sent"


@given(st.from_regex(re.compile(f"(?:{K8S_NAME_PATTERN})"), fullmatch=True).filter(lambda n: len(n) <= 253))
def test_every_kubernetes_name_is_an_event_type(name):
    """A resource without spec.name declares its own name: always a type's."""
    assert re.fullmatch(NAME_PATTERN, name) and EVENT_TYPE.fullmatch(name)
    assert parse_spec(name, SPEC).name == name


@given(st.text(min_size=1, max_size=40))
def test_a_name_is_accepted_exactly_when_events_may_carry_it(name):
    resource = resource_name_for(name)
    try:
        spec = parse_spec(resource, {**SPEC, "name": name})
    except InvalidInput as exc:
        assert not EVENT_TYPE.fullmatch(name), exc
        assert exc.field == "spec.name"
    else:
        assert EVENT_TYPE.fullmatch(name) and spec.name == name


def test_file_references_are_bundled_into_defs(tmp_path):
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "money.yaml").write_text(
        yaml.safe_dump(
            {
                "$id": "https://example.com/money",
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "required": ["value"],
                "properties": {"value": {"$ref": "#/$defs/cents"}, "currency": {"$ref": "currency.json"}},
                "$defs": {"cents": {"type": "integer", "minimum": 0}},
            }
        )
    )
    (tmp_path / "common" / "currency.json").write_text(
        json.dumps({"type": "string", "pattern": "^[A-Z]{3}$"})
    )
    reads = []

    def load(target: str, here: str) -> tuple[Any, str]:
        path = (Path(here).parent / target).resolve()
        reads.append(path.relative_to(tmp_path).as_posix())
        return yaml.safe_load(path.read_text()), str(path)

    schema = {
        "type": "object",
        "properties": {
            "amount": {"$ref": "common/money.yaml"},
            "fee": {"$ref": "common/money.yaml"},
            "cents": {"$ref": "common/money.yaml#/$defs/cents"},
        },
    }
    spec = _spec("versions.0.schema", schema)
    spec["versions"][0]["example"] = {"amount": {"value": 3, "currency": "EUR"}, "cents": 4}
    bundled = (
        parse_spec("order.paid", spec, load=load, base=str(tmp_path / "types.yaml")).versions[0].json_schema
    )
    # Each file once in $defs, however often it is referred to.
    assert sorted(set(reads)) == ["common/currency.json", "common/money.yaml"]
    assert sorted(bundled["$defs"]) == ["currency.json", "money.yaml"]
    assert bundled["properties"] == {
        "amount": {"$ref": "#/$defs/money.yaml"},
        "fee": {"$ref": "#/$defs/money.yaml"},
        "cents": {"$ref": "#/$defs/money.yaml/$defs/cents"},
    }
    money = bundled["$defs"]["money.yaml"]
    assert "$id" not in money and "$schema" not in money
    assert money["properties"] == {
        "value": {"$ref": "#/$defs/money.yaml/$defs/cents"},
        "currency": {"$ref": "#/$defs/currency.json"},
    }
    # The bundled schema stands alone, and checks what the files said.
    validator = Draft202012Validator(bundled)
    assert validator.is_valid({"amount": {"value": 3, "currency": "EUR"}})
    assert not validator.is_valid({"amount": {"value": 3, "currency": "euro"}})
    assert not validator.is_valid({"cents": -1})

    # An example the bundled schema refuses is refused, by the example's path.
    spec["versions"][0]["example"] = {"amount": {"value": 3, "currency": "eur"}}
    error = _refused(spec, load=load, base=str(tmp_path / "types.yaml"))
    assert error.startswith("spec.versions[0].example.amount.currency: 'eur' does not match")


def test_a_loader_error_names_the_reference():
    def load(target: str, here: str) -> tuple[Any, str]:
        raise InvalidInput(target, "cannot read it")

    error = _refused(_spec("versions.0.schema", {"$ref": "gone.json"}), load=load)
    assert error == "spec.versions[0].schema.$ref: 'gone.json': cannot read it"


def test_manifests_name_the_document_and_refuse_a_type_twice():
    text = EXAMPLE.read_text()
    (spec,) = load_manifests(text.encode(), "--filename")
    assert isinstance(spec, EventTypeSpec) and spec.latest == 2
    with pytest.raises(
        InvalidInput, match=r"^--filename \(document 2\): declares order\.paid a second time$"
    ):
        load_manifests(f"{text}---\n{text}".encode(), "--filename")
    bad = yaml.safe_load(text)
    bad["spec"]["versions"][0]["example"] = {"orderId": "o1"}
    with pytest.raises(
        InvalidInput, match=r"^--filename \(document 2\) spec\.versions\[0\]\.example: 'amount'"
    ):
        load_manifests(f"{text}---\n{yaml.safe_dump(bad)}".encode(), "--filename")
    with pytest.raises(InvalidInput, match="holds no WebhookEventType"):
        load_manifests(b"---\n", "--filename")


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"kind": "WebhookEndpoint"}, "kind: must be WebhookEventType"),
        ({"apiVersion": "v1"}, "apiVersion: must be hooklane.io/v1alpha1"),
        ({"metadata": {"name": "order.paid", "namespace": "shop"}}, "metadata.namespace: must not be set"),
        ({"metadata": {"name": "Order.Paid"}}, "metadata.name: must be a lowercase DNS-style name"),
        ({"extra": 1}, "extra: is not a field of a WebhookEventType"),
    ],
)
def test_a_bad_manifest_is_refused(change, error):
    doc = {**yaml.safe_load(EXAMPLE.read_text()), **change}
    with pytest.raises(InvalidInput) as caught:
        parse_manifest(doc)
    assert str(caught.value).startswith(error)


def test_the_committed_crd_is_what_hack_gen_crd_writes():
    committed = (ROOT / EVENTTYPE_CRD_PATH).read_text()
    assert committed == eventtype_crd_yaml(), (
        "the CRD differs from hooklane/catalogue.py and crd.py: run hack/gen-crd"
    )


def test_the_crd_is_cluster_scoped_and_its_bounds_are_the_models():
    version = eventtype_crd()["spec"]["versions"][0]
    assert eventtype_crd()["spec"]["scope"] == "Cluster"
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    fields = EventTypeSpec.model_fields
    assert set(spec["properties"]) == set(fields)
    assert spec["properties"]["name"]["pattern"] == f"^(?:{NAME_PATTERN})$"
    assert spec["properties"]["versions"]["x-kubernetes-list-map-keys"] == ["version"]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Type",
        "Group",
        "Latest",
        "Deprecated",
        "Age",
    ]
