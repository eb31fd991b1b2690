"""The event catalogue as an OpenAPI 3.1 document (docs/catalogue.md, "The
OpenAPI export"): one ``webhooks`` entry per type and version, each the
``POST`` a receiver gets, with the Standard Webhooks headers and the body
Hooklane sends (hooklane/worker/sender.py: ``id``, ``type``,
``timestamp``, ``data``) whose ``data`` is the version's schema. No I/O:
the API's route and ``hooklane catalogue openapi`` read the catalogue and
hand it here.

The portal's test event (``hooklane.test``) has an entry of its own.

Keys: the latest version of a type is under the type's own name
(``order.paid``), what a receiver switches on; each older version under
``order.paid@1``. ``@`` is no character of a type's name, so an older
version's key never collides with another type's.

A version's schema is bundled (a ``$ref`` only points inside it), but
pointers inside it are relative to its own root, which in this document is
no longer the root. So each schema becomes a component of its own, its
``$defs`` lifted into components beside it, and every local ``$ref``
rewritten to the component it now lives in: generators and validators
that know nothing of nested ``$id`` resolve them all.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

from hooklane.catalogue_view import CatalogueEntry, CatalogueVersion

OPENAPI_VERSION = "3.1.0"
# What OpenAPI does not allow in the name of a component.
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")

_HEADERS = [
    {
        "name": "webhook-id",
        "in": "header",
        "required": True,
        "description": "The event's id: the same on every retry of the same event; deduplicate on it.",
        "schema": {"type": "string", "minLength": 1, "maxLength": 255},
    },
    {
        "name": "webhook-timestamp",
        "in": "header",
        "required": True,
        "description": "Unix seconds when this attempt was signed; refuse one too far from your clock.",
        "schema": {"type": "string", "pattern": "^[0-9]{1,12}$"},
    },
    {
        "name": "webhook-signature",
        "in": "header",
        "required": True,
        "description": (
            "`v1,` and the base64 HMAC-SHA256 of `id.timestamp.body` with the endpoint's secret; "
            "during a secret rotation two of them, space-separated (Standard Webhooks)."
        ),
        "schema": {"type": "string", "pattern": "^v1,[A-Za-z0-9+/]+=*( v1,[A-Za-z0-9+/]+=*)*$"},
    },
    {
        "name": "traceparent",
        "in": "header",
        "required": False,
        "description": "W3C Trace Context, only when the event was published in a trace. Not signed.",
        "schema": {"type": "string"},
    },
]

_RESPONSES = {
    "2XX": {"description": "Delivered: any 2xx within the endpoint's timeout. The body is never read."},
    "410": {"description": "Gone: the endpoint is deactivated and the delivery dead."},
    "413": {"description": "Too large: the delivery is dead."},
    "default": {
        "description": (
            "Any other answer, or none within the timeout: retried with backoff "
            "(a `Retry-After` is honoured, up to 6 h)."
        )
    },
}


# The test event the portal and the tenant API send to one endpoint
# (hooklane/store/grants.py: send_test_event): a receiver's generated check
# meets it too. A catalogue type of the same name replaces it.
TEST_EVENT = CatalogueEntry(
    "hooklane.test",
    "A test event, sent to one endpoint when its owner asks for one (the portal's "
    '"Send a test event"). Whatever types the endpoint subscribes to.',
    None,
    None,
    False,
    (
        CatalogueVersion(
            1,
            {
                "type": "object",
                "required": ["test", "message", "tenant"],
                "properties": {
                    "test": {"const": True},
                    "message": {"type": "string"},
                    "tenant": {"type": "string", "description": "The tenant whose endpoint it went to."},
                },
            },
            {"test": True, "message": "A test event sent from the webhook portal.", "tenant": "acme"},
        ),
    ),
)


def export_title(portal_name: str) -> str:
    """The document's title: the platform's name, as the portal shows it."""
    return f"{portal_name} events"


def webhook_key(name: str, version: int, latest: bool) -> str:
    """The ``webhooks`` key of one version of a type."""
    return name if latest else f"{name}@{version}"


def component_key(name: str, version: int) -> str:
    """The component of one version's body. ``_v`` and digits end it, and
    a type's name holds no ``@``: two (type, version) pairs never share one."""
    return f"{name}_v{version}"


def openapi_document(entries: Sequence[CatalogueEntry], *, title: str) -> dict[str, Any]:
    """The catalogue ``entries`` as an OpenAPI 3.1 document. Its
    ``info.version`` is a digest of what it describes, so that a receiver
    can tell whether the catalogue changed since it generated its code."""
    webhooks: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    tags: dict[str, dict[str, str]] = {}
    named = {e.name for e in entries}
    shown = [*entries, *([] if TEST_EVENT.name in named else [TEST_EVENT])]
    for entry in sorted(shown, key=lambda e: e.name):
        if entry.group is not None:
            tags.setdefault(entry.group, {"name": entry.group})
        for v in entry.versions:
            is_latest = v is entry.latest
            body = component_key(entry.name, v.version)
            data = _lift(body + ".data", v.schema, schemas)
            schemas[body] = _envelope(entry, v, data)
            webhooks[webhook_key(entry.name, v.version, is_latest)] = {"post": _operation(entry, v, body)}
    described = {"webhooks": webhooks, "components": {"schemas": schemas}}
    digest = hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]
    document: dict[str, Any] = {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": title,
            "version": digest,
            "description": (
                "The events this platform sends to your endpoints, one webhook per event type and "
                "version: the latest under the type's name, older ones as `type@version`. Every "
                "request is signed as Standard Webhooks describe; verify the signature over the raw "
                "body before parsing it."
            ),
        },
    }
    if tags:
        document["tags"] = [tags[g] for g in sorted(tags)]
    return document | described


def _operation(entry: CatalogueEntry, v: CatalogueVersion, body: str) -> dict[str, Any]:
    summary = entry.description.split("\n", 1)[0].strip() or entry.name
    operation: dict[str, Any] = {
        "operationId": f"{entry.name}@{v.version}",
        "summary": summary[:200],
        "description": entry.description or entry.name,
        "parameters": copy.deepcopy(_HEADERS),
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {"$ref": f"#/components/schemas/{body}"},
                    "example": _example_body(entry.name, v),
                }
            },
        },
        "responses": copy.deepcopy(_RESPONSES),
        "x-hooklane-type": entry.name,
        "x-hooklane-version": v.version,
    }
    if entry.group is not None:
        operation["tags"] = [entry.group]
    if entry.deprecated_since is not None or entry.archived:
        operation["deprecated"] = True
    if entry.deprecated_since is not None:
        operation["x-hooklane-deprecated-since"] = entry.deprecated_since.isoformat()
    if entry.archived:
        # No longer published; a replay of an older event may still bring one.
        operation["x-hooklane-archived"] = True
    return operation


def _envelope(entry: CatalogueEntry, v: CatalogueVersion, data: str) -> dict[str, Any]:
    """The body Hooklane sends: the event's id, type and time around its data."""
    return {
        "title": f"{entry.name} v{v.version}",
        "type": "object",
        "required": ["id", "type", "timestamp", "data"],
        "properties": {
            "id": {"type": "string", "minLength": 1, "maxLength": 255, "description": "As webhook-id."},
            "type": {"const": entry.name},
            "timestamp": {
                "type": "string",
                "format": "date-time",
                "description": "When the event was published, UTC, in milliseconds.",
            },
            "data": {"$ref": f"#/components/schemas/{data}"},
        },
    }


def _example_body(name: str, v: CatalogueVersion) -> dict[str, Any]:
    return {"id": "evt_example", "type": name, "timestamp": "2026-01-01T00:00:00.000Z", "data": v.example}


def _lift(key: str, schema: Any, schemas: dict[str, Any]) -> str:
    """Put ``schema`` into ``schemas`` under ``key`` with its top-level
    ``$defs`` beside it (``key.Name``), every local ``$ref`` pointing where
    its target now is; return ``key``."""
    schema = copy.deepcopy(schema)
    if isinstance(schema, dict):
        # The dialect is the document's now; an $id would make the
        # rewritten pointers resolve against another base.
        schema.pop("$schema", None)
        schema.pop("$id", None)
    defs: dict[str, str] = {}
    if isinstance(schema, dict) and isinstance(schema.get("$defs"), dict):
        lifted = schema.pop("$defs")
        for name in lifted:
            candidate = f"{key}.{_UNSAFE.sub('_', name)}"
            while candidate in schemas or candidate in defs.values():
                candidate += "_"
            defs[name] = candidate
        for name, sub in lifted.items():
            schemas[defs[name]] = _rewritten(sub, key, defs)
    schemas[key] = _rewritten(schema, key, defs)
    return key


def _rewritten(node: Any, key: str, defs: dict[str, str]) -> Any:
    if isinstance(node, list):
        return [_rewritten(item, key, defs) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: _rewritten(v, key, defs) for k, v in node.items()}
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        out["$ref"] = _moved(ref, key, defs)
    return out


def _moved(ref: str, key: str, defs: dict[str, str]) -> str:
    """Where the local pointer ``ref`` of the schema now at ``key`` points."""
    parts = ref[1:].split("/")
    if len(parts) >= 3 and parts[0] == "" and parts[1] == "$defs":
        name = unquote(parts[2]).replace("~1", "/").replace("~0", "~")
        if name in defs:
            return "/".join([f"#/components/schemas/{defs[name]}", *parts[3:]])
    if ref in ("#", "#/"):
        return f"#/components/schemas/{key}"
    if ref.startswith("#/"):
        return f"#/components/schemas/{key}{ref[1:]}"
    # A plain-name anchor (#name) stays: it resolves wherever it is.
    return ref
