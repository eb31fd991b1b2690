"""The catalogue's pure parts: its OpenAPI 3.1 export (a valid document,
one webhook per type and version, the body Hooklane sends, references that
resolve after the lifting), and what the portal shows of a schema. The
export against a real delivery: tests/db/test_catalogue_api.py."""

from __future__ import annotations

import json
import re
from datetime import UTC, date, datetime
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from openapi_spec_validator import validate
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from hooklane.catalogue_openapi import component_key, openapi_document, webhook_key
from hooklane.catalogue_view import (
    MAX_ROW_DEPTH,
    CatalogueEntry,
    CatalogueVersion,
    entry_json,
    grouped,
    pickable,
    picked_types,
    picker_split,
    schema_rows,
    type_text,
)
from hooklane.signing import event_body
from testsupport.catalogue import (
    ORDER_PAID_V1,
    ORDER_PAID_V1_EXAMPLE,
    ORDER_PAID_V2,
    ORDER_PAID_V2_EXAMPLE,
)

ORDER_PAID = CatalogueEntry(
    "order.paid",
    "An order was paid in full.\nSent once per order.",
    "orders",
    None,
    False,
    (
        CatalogueVersion(1, ORDER_PAID_V1, ORDER_PAID_V1_EXAMPLE),
        CatalogueVersion(2, ORDER_PAID_V2, ORDER_PAID_V2_EXAMPLE),
    ),
)
REFUNDED = CatalogueEntry(
    "order.refunded", "", "orders", date(2026, 6, 1), False, (CatalogueVersion(1, True, {}),)
)
ARCHIVED = CatalogueEntry(
    "invoice.sent", "Mailed.", "billing", None, True, (CatalogueVersion(1, {"type": "object"}, {}),)
)
LOOSE = CatalogueEntry("user.created", "", None, None, False, ())


def body_validator(document: dict[str, Any], key: str) -> Draft202012Validator:
    """A check of a delivered body by the document alone, as a receiver
    would build one: the webhook's request body schema, its references
    resolved in the document."""
    ref = document["webhooks"][key]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    registry: Registry[Any] = Registry().with_resource("urn:events", DRAFT202012.create_resource(document))
    return Draft202012Validator({"$ref": "urn:events" + ref}, registry=registry)


def test_the_document_is_valid_openapi_3_1_with_a_webhook_per_type_and_version() -> None:
    document = openapi_document([LOOSE, ARCHIVED, ORDER_PAID, REFUNDED], title="Acme events")
    validate(document)
    assert document["openapi"] == "3.1.0"
    assert document["info"]["title"] == "Acme events"
    assert sorted(document["webhooks"]) == [
        "hooklane.test",
        "invoice.sent",
        "order.paid",
        "order.paid@1",
        "order.refunded",
    ]
    latest = document["webhooks"]["order.paid"]["post"]
    assert (latest["x-hooklane-version"], latest["summary"], latest["tags"]) == (
        2,
        "An order was paid in full.",
        ["orders"],
    )
    assert document["webhooks"]["order.paid@1"]["post"]["x-hooklane-version"] == 1
    assert "deprecated" not in latest
    assert document["webhooks"]["order.refunded"]["post"]["deprecated"] is True
    assert document["webhooks"]["invoice.sent"]["post"]["x-hooklane-archived"] is True
    headers = {p["name"]: p["required"] for p in latest["parameters"]}
    assert headers == {
        "webhook-id": True,
        "webhook-timestamp": True,
        "webhook-signature": True,
        "traceparent": False,
    }
    assert [t["name"] for t in document["tags"]] == ["billing", "orders"]
    # Every component name is one OpenAPI allows.
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", k) for k in document["components"]["schemas"])


def test_the_test_event_has_an_entry_unless_the_catalogue_names_its_type() -> None:
    sent = {"test": True, "message": "A test event sent from the webhook portal.", "tenant": "acme"}
    body = {"id": "test_1", "type": "hooklane.test", "timestamp": "2026-01-01T00:00:00.000Z", "data": sent}
    body_validator(openapi_document([], title="T"), "hooklane.test").validate(body)
    own = CatalogueEntry("hooklane.test", "Ours.", None, None, False, (CatalogueVersion(1, False, {}),))
    document = openapi_document([own], title="T")
    assert document["webhooks"]["hooklane.test"]["post"]["description"] == "Ours."
    with pytest.raises(ValidationError):
        body_validator(document, "hooklane.test").validate(body)


def test_the_version_is_a_digest_of_what_the_document_describes() -> None:
    one = openapi_document([ORDER_PAID], title="A")["info"]["version"]
    assert openapi_document([ORDER_PAID], title="B")["info"]["version"] == one
    assert openapi_document([ORDER_PAID, REFUNDED], title="A")["info"]["version"] != one


def test_a_body_as_the_worker_sends_it_validates_and_a_wrong_one_does_not() -> None:
    document = openapi_document([ORDER_PAID], title="Acme events")
    sent = json.loads(
        event_body(
            "evt_1",
            "order.paid",
            datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
            json.dumps(ORDER_PAID_V2_EXAMPLE),
        )
    )
    check = body_validator(document, "order.paid")
    check.validate(sent)
    # The $defs reference, lifted into a component of its own, still holds.
    wrong_city = json.loads(json.dumps(sent))
    wrong_city["data"]["customer"]["address"]["city"] = 7
    with pytest.raises(ValidationError, match="7 is not of type 'string'"):
        check.validate(wrong_city)
    with pytest.raises(ValidationError, match=r"'order\.paid' was expected"):
        check.validate({**sent, "type": "order.refunded"})
    with pytest.raises(ValidationError, match="'currency' is a required property"):
        check.validate({**sent, "data": ORDER_PAID_V1_EXAMPLE})
    # Version 1 has its own entry, which that data fits.
    body_validator(document, "order.paid@1").validate({**sent, "data": ORDER_PAID_V1_EXAMPLE})
    # Each webhook's own example is a body it accepts.
    for key, webhook in document["webhooks"].items():
        body_validator(document, key).validate(
            webhook["post"]["requestBody"]["content"]["application/json"]["example"]
        )


def test_references_of_every_shape_resolve_once_lifted() -> None:
    tree = {
        "type": "object",
        "properties": {
            "child": {"$ref": "#"},
            "name": {"$ref": "#/$defs/a~1b"},
            "deep": {"$ref": "#/$defs/box/properties/inner"},
            "twin": {"$ref": "#/properties/name"},
        },
        "$defs": {
            "a/b": {"type": "string", "maxLength": 3},
            "box": {"type": "object", "properties": {"inner": {"type": "integer"}}},
        },
    }
    entry = CatalogueEntry("tree.grown", "", None, None, False, (CatalogueVersion(1, tree, {}),))
    document = openapi_document([entry], title="T")
    validate(document)
    check = body_validator(document, "tree.grown")
    base = {"id": "e", "type": "tree.grown", "timestamp": "2026-01-01T00:00:00.000Z"}
    check.validate({**base, "data": {"child": {"child": {"name": "abc"}}, "deep": 1, "twin": "xyz"}})
    for bad in ({"child": {"name": "abcd"}}, {"deep": "1"}, {"twin": "wxyz"}):
        with pytest.raises(ValidationError):
            check.validate({**base, "data": bad})


def test_keys_never_collide() -> None:
    assert webhook_key("order.paid", 2, latest=True) == "order.paid"
    assert webhook_key("order.paid", 1, latest=False) == "order.paid@1"
    # A type named like another's component: still two components.
    assert component_key("a_v1", 2) != component_key("a", 12)
    assert component_key("a_v1", 2) == "a_v1_v2"


def test_schema_rows_follow_nesting_arrays_and_references() -> None:
    rows, cut = schema_rows(ORDER_PAID_V2)
    assert not cut
    shown = [(r.path, r.depth, r.type, r.required, r.description) for r in rows]
    # Required first, then the rest, each by name.
    assert shown == [
        ("amount", 0, "integer", True, "In the currency's smallest unit."),
        ("currency", 0, 'one of: "EUR", "USD"', True, "ISO 4217."),
        ("customer", 0, "object", True, "Who paid."),
        ("customer.email", 1, "string (email)", True, "Where the receipt went."),
        ("customer.address", 1, "address", False, "A postal address."),
        ("customer.address.city", 2, "string", True, ""),
        ("customer.address.zip", 2, "string", False, ""),
        ("order_id", 0, "string", True, "The order's id."),
        ("items", 0, "array of object", False, ""),
        ("items[].sku", 1, "string", False, "Stock keeping unit."),
    ]


def test_schema_rows_stop_at_loops_and_depth() -> None:
    looped = {"type": "object", "properties": {"next": {"$ref": "#"}}}
    rows, cut = schema_rows(looped)
    assert [r.path for r in rows] == ["next"] and cut
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(MAX_ROW_DEPTH + 2):
        deep = {"type": "object", "properties": {"x": deep}}
    rows, cut = schema_rows(deep)
    assert len(rows) == MAX_ROW_DEPTH and cut
    assert schema_rows(True) == ([], False)


@pytest.mark.parametrize(
    ("schema", "text"),
    [
        ({"type": ["string", "null"]}, "string or null"),
        ({"const": 3}, "exactly 3"),
        ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "one of: string | integer"),
        ({"type": "array", "items": {"type": "string", "format": "uuid"}}, "array of string (uuid)"),
        ({}, "any"),
        (False, "nothing"),
    ],
)
def test_type_text(schema: Any, text: str) -> None:
    assert type_text(schema) == text


def test_entry_json_and_groups() -> None:
    shown = entry_json(REFUNDED)
    assert (shown["deprecated"], shown["deprecated_since"], shown["latest_version"]) == (
        True,
        "2026-06-01",
        1,
    )
    assert entry_json(LOOSE)["latest_version"] is None
    assert [(g, [e.name for e in es]) for g, es in grouped([LOOSE, REFUNDED, ARCHIVED, ORDER_PAID])] == [
        ("billing", ["invoice.sent"]),
        ("orders", ["order.paid", "order.refunded"]),
        (None, ["user.created"]),
    ]


def test_the_picker_offers_what_may_be_chosen() -> None:
    everything = [ORDER_PAID, REFUNDED, ARCHIVED, LOOSE]
    assert [e.name for e in pickable(everything, ())] == ["order.paid", "order.refunded", "user.created"]
    assert [e.name for e in pickable(everything, ("order.*",))] == ["order.paid", "order.refunded"]
    assert [e.name for e in pickable(everything, ("user.created", "invoice.*"))] == ["user.created"]


def test_the_picker_splits_and_merges_event_types() -> None:
    assert picker_split(["order.paid", "order.*", "gone.type"], ["order.paid", "user.created"]) == (
        ["order.paid"],
        ["order.*", "gone.type"],
    )
    assert picked_types(["order.paid", "user.created"], ["order.*", "order.paid"]) == [
        "order.paid",
        "user.created",
        "order.*",
    ]
