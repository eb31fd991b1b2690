"""Publishing over HTTP, its pure parts: the media types, the JSON it
takes, the field an error names, and the OpenAPI document's events."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from hooklane.api import ingest
from hooklane.api.ingest import Refused
from hooklane.errors import InvalidInput
from hooklane.settings import Settings


def test_media_types() -> None:
    ingest.check_media_type("application/json", None)
    ingest.check_media_type("application/json", "UTF-8")
    for content_type, charset in [
        ("application/x-www-form-urlencoded", None),
        ("application/json", "utf-16"),
    ]:
        with pytest.raises(Refused) as refused:
            ingest.check_media_type(content_type, charset)
        assert refused.value.status == 415


def test_parse_json_refuses_what_is_not_one_plain_object() -> None:
    assert ingest.parse_json(b'{"a": [1, 2.5, "\\u00e9"]}') == {"a": [1, 2.5, "é"]}
    for raw in [b"\xef\xbb\xbf{}", b"{} {}", b'{"a": 1, "a": 1}', b'{"a": NaN}', b"null", b"\xc3("]:
        with pytest.raises(Refused) as refused:
            ingest.parse_json(raw)
        assert (refused.value.status, refused.value.code) == (400, "malformed")


def test_event_of_names_the_field_under_its_prefix() -> None:
    with pytest.raises(InvalidInput) as invalid:
        ingest.event_of({"type": "a.b", "tenant": "acme", "data": {}, "coalesce_key": 5}, "events[4].")
    assert invalid.value.field == "events[4].coalesce_key"
    event = ingest.event_of({"type": "a.b", "tenant": "acme", "data": {"k": 1}, "id": "own"})
    assert (event.id, event.data_json) == ("own", '{"k": 1}')


def test_the_openapi_document_describes_the_events_accepted() -> None:
    doc = json.loads(resources.files("hooklane.api").joinpath("openapi.json").read_text())
    schemas = doc["components"]["schemas"]
    event = schemas["IngestEvent"]
    assert set(event["properties"]) == ingest.FIELDS
    assert set(event["required"]) == set(ingest.REQUIRED)
    assert schemas["IngestBatch"]["properties"]["events"]["maxItems"] == Settings.api_batch_max_events
    for path in (ingest.EVENTS_PATH, ingest.BATCH_PATH):
        assert {"202", "400", "401", "403", "409", "413", "415", "422", "503"} <= set(
            doc["paths"][path]["post"]["responses"]
        )
