"""The catalogue check's pure parts: telling its refusals from the publish
function's other WH422s, the modes, and what a role that cannot create
the validator is told."""

from __future__ import annotations

import pytest

from hooklane.errors import CatalogueRefused, InvalidInput
from hooklane.store.catalogue_check import check_mode, unavailable_reason
from hooklane.store.events import catalogue_refusal


@pytest.mark.parametrize(
    ("field", "message", "expected"),
    [
        ("type", "order.payed is not in the event catalogue (hooklane eventtype apply, ...)", True),
        ("type", "order.old is archived in the event catalogue: it is no longer published", True),
        ("data", "data.amount: 'x' is not of type 'integer' (schema version 2, rule type)", True),
        ("data", "data: the schema refers to what it does not hold: x (schema version 1, rule $ref)", True),
        # check_event's own rules, which the function holds too
        ("type", "must be a dotted event type like 'order.updated'", False),
        ("data", "must be a JSON object", False),
        ("data", "nests deeper than 64 levels", False),
        ("tenant", "x in the event catalogue", False),
        ("data", "(schema version 2, rule type) and more", False),
    ],
)
def test_catalogue_refusals_are_told_apart(field: str, message: str, expected: bool) -> None:
    assert catalogue_refusal(field, message) is expected


@pytest.mark.parametrize(
    ("field", "message", "reason"),
    [
        ("type", "order.payed is not in the event catalogue (hooklane eventtype apply, ...)", "unknown"),
        ("type", "order.old is archived in the event catalogue: it is no longer published", "archived"),
        ("data", "data.amount: 'x' is not of type 'integer' (schema version 2, rule type)", "schema"),
    ],
)
def test_a_refusal_names_its_reason_as_the_refusals_table_does(field: str, message: str, reason: str) -> None:
    assert CatalogueRefused(field, message).reason == reason


def test_modes() -> None:
    assert [check_mode(m) for m in ("off", "warn", "enforce")] == ["off", "warn", "enforce"]
    with pytest.raises(InvalidInput, match="mode: must be one of off, warn, enforce, not 'on'"):
        check_mode("on")


def test_what_to_install_is_named() -> None:
    missing = unavailable_reason("58P01", 'could not open extension control file "plpython3u.control"', 16)
    assert "install postgresql-plpython3-16 and python3-jsonschema" in missing
    assert "superuser" in unavailable_reason("42501", "permission denied to create extension", 15)
    # The server's own words for anything else (the jsonschema check's).
    other = unavailable_reason("XX000", "the PostgreSQL server's Python has no jsonschema module", 15)
    assert other.endswith("has no jsonschema module")
