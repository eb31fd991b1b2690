"""The WebhookEndpoint CustomResourceDefinition, written from ``SPEC``
(hooklane/spec.py) by ``hack/gen-crd``: the names the API server serves it
under, its printer columns and status schema, and the YAML of it; and the
WebhookEventType's, from the bounds of hooklane/catalogue.py.

The operator watches the resource by these names, and the tests read the
columns from here, so that none of them is written twice."""

from __future__ import annotations

from typing import Any

import yaml

from hooklane import catalogue
from hooklane.checks import NO_CONTROLS_PATTERN
from hooklane.endpoint_state import EndpointState
from hooklane.spec import API_VERSION, KIND, SPEC, FieldRule

GROUP, VERSION = API_VERSION.split("/")
PLURAL = "webhookendpoints"
# A CRD must be named <plural>.<group>.
CRD_NAME = f"{PLURAL}.{GROUP}"

CRD_PATH = "crds/webhookendpoints.hooklane.io.yaml"
_CRD_HEADER = """\
# WebhookEndpoint: one receiver of a tenant's webhooks (docs/concepts.md; the
# operator's side, status and Events in docs/operator.md). The API server
# validates every spec field, so a bad manifest is refused at `kubectl apply`
# instead of surfacing later as a stuck delivery queue.
# Generated from hooklane/spec.py and hooklane/crd.py by hack/gen-crd: edit
# the rules there, not this file.
"""

PRINTER_COLUMNS = [
    {"name": "Tenant", "type": "string", "jsonPath": ".spec.tenant"},
    {"name": "URL", "type": "string", "jsonPath": ".spec.url"},
    {"name": "MaxConcurrency", "type": "integer", "jsonPath": ".spec.maxConcurrency"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Pending", "type": "integer", "jsonPath": ".status.pending"},
    {
        "name": "OldestPendingAge",
        "type": "integer",
        "description": "Age in seconds of the oldest pending delivery; the headline lag signal.",
        "jsonPath": ".status.oldestPendingAgeSeconds",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

_TIME = {"type": "string", "format": "date-time"}
_GENERATION = {"type": "integer", "format": "int64"}
_STATUS = {
    "type": "object",
    # The operator (kopf) keeps its own bookkeeping under status too.
    "x-kubernetes-preserve-unknown-fields": True,
    "properties": {
        "phase": {
            "type": "string",
            "description": "Active; Paused (spec.paused, or the circuit is open and pausing); Probing (the"
            " circuit's pause is over: the next delivery is a probe, and a success closes it); Deactivated.",
            "enum": [str(state) for state in EndpointState],
        },
        "observedGeneration": _GENERATION,
        "conditions": {
            "type": "array",
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
            "items": {
                "type": "object",
                "required": ["type", "status"],
                "properties": {
                    "type": {"type": "string", "maxLength": 316},
                    "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                    "reason": {"type": "string", "maxLength": 1024},
                    "message": {"type": "string", "maxLength": 32768},
                    "lastTransitionTime": _TIME,
                    "observedGeneration": _GENERATION,
                },
            },
        },
        "consecutiveFailures": {"type": "integer"},
        "pausedUntil": _TIME,
        "lastError": {"type": "string"},
        "lastDeliveredAt": _TIME,
        "pending": {"type": "integer"},
        "inFlight": {"type": "integer"},
        "dead": {"type": "integer"},
        "oldestPendingAgeSeconds": {"type": "integer"},
        "effectiveConcurrency": {
            "type": "integer",
            "description": "The concurrency limit in force: maxConcurrency, or where"
            " spec.delivery.adaptiveConcurrency moved it to.",
        },
        "ordering": {
            "type": "object",
            "description": "Ordered delivery, while some of its keys are held back (absent otherwise).",
            "properties": {
                "heldKeys": {
                    "type": "integer",
                    "description": "Keys whose delivery died and which send nothing more until it is"
                    " resent or discarded (the held keys and why: the dashboard's endpoint page).",
                },
            },
        },
    },
}


def openapi(rule: FieldRule) -> dict[str, Any]:
    """``rule`` as an OpenAPI v3 schema, as a CRD holds it."""
    schema: dict[str, Any] = {"type": rule.type}
    optional = {
        "description": rule.description,
        "required": list(rule.required) or None,
        "format": rule.format,
        "minLength": rule.min_length,
        "maxLength": rule.max_length,
        "enum": None if rule.enum is None else list(rule.enum),
        "pattern": None if rule.pattern is None else f"^(?:{rule.pattern})$",
        "minimum": rule.minimum,
        "maximum": rule.maximum,
        "maxItems": rule.max_items,
        "default": rule.default,
        "items": None if rule.items is None else openapi(rule.items),
        "properties": {key: openapi(child) for key, child in rule.properties.items()} or None,
        "x-kubernetes-validations": [{"rule": r, "message": m} for r, m in rule.cel] or None,
    }
    schema.update((key, value) for key, value in optional.items() if value is not None)
    return schema


def crd() -> dict[str, Any]:
    """The WebhookEndpoint CustomResourceDefinition."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": "webhookendpoint",
                "shortNames": ["whe"],
                "categories": ["hooklane"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "required": ["spec"],
                            "properties": {"spec": openapi(SPEC), "status": _STATUS},
                        }
                    },
                }
            ],
        },
    }


class _CrdDumper(yaml.SafeDumper):
    """Block style with indented lists, as kubectl writes; no anchors for the
    schemas that several fields share."""

    def ignore_aliases(self, data: Any) -> bool:
        return True

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def crd_yaml() -> str:
    """What ``hack/gen-crd`` writes into CRD_PATH."""
    return _CRD_HEADER + _dump(crd())


def _dump(doc: dict[str, Any]) -> str:
    return yaml.dump(doc, Dumper=_CrdDumper, sort_keys=False, width=1000, allow_unicode=True)


EVENTTYPE_PLURAL = catalogue.PLURAL
EVENTTYPE_CRD_NAME = f"{EVENTTYPE_PLURAL}.{GROUP}"
EVENTTYPE_CRD_PATH = "crds/webhookeventtypes.hooklane.io.yaml"
_EVENTTYPE_HEADER = """\
# WebhookEventType: one event type of the catalogue, with a JSON Schema
# (draft 2020-12) and an example per version (docs/catalogue.md).
# Cluster-scoped: a type means the same for every tenant, and the platform,
# not a tenant's namespace, owns it. The API server checks what a schema
# can say here; the operator checks the schemas and examples themselves and
# says in the Ready condition which field is wrong.
# Generated from hooklane/catalogue.py and hooklane/crd.py by hack/gen-crd:
# edit the rules there, not this file.
"""

EVENTTYPE_PRINTER_COLUMNS = [
    {"name": "Type", "type": "string", "jsonPath": ".status.type"},
    {"name": "Group", "type": "string", "jsonPath": ".spec.group"},
    {
        "name": "Latest",
        "type": "integer",
        "description": "The highest version, the one producers should publish.",
        "jsonPath": ".status.latestVersion",
    },
    {"name": "Deprecated", "type": "string", "jsonPath": ".spec.deprecated.since"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

_JSON_VALUE = {"x-kubernetes-preserve-unknown-fields": True}
_EVENTTYPE_SPEC: dict[str, Any] = {
    "type": "object",
    "required": ["versions"],
    "properties": {
        "name": {
            "type": "string",
            "description": "The event type, as events carry it (order.paid). Unset: the resource's name."
            " Set, the resource's name must be it lowercased, with '_' as '-'.",
            "minLength": 1,
            "maxLength": catalogue.MAX_NAME,
            "pattern": f"^(?:{catalogue.NAME_PATTERN})$",
        },
        "description": {
            "type": "string",
            "description": "What the event means and when it is sent, shown to the platform's customers.",
            "maxLength": catalogue.MAX_DESCRIPTION,
        },
        "group": {
            "type": "string",
            "description": "A heading the catalogue lists the type under (Orders, Billing).",
            "minLength": 1,
            "maxLength": catalogue.MAX_GROUP,
            "pattern": f"^(?:{NO_CONTROLS_PATTERN})$",
        },
        "versions": {
            "type": "array",
            "description": "One JSON Schema per version; the highest is the latest. A version no longer"
            " listed is removed from the catalogue.",
            "minItems": 1,
            "maxItems": catalogue.MAX_VERSIONS,
            # Versions are unique: the API server refuses a repeated one.
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["version"],
            "items": {
                "type": "object",
                "required": ["version", "schema", "example"],
                "properties": {
                    "version": {
                        "type": "integer",
                        "description": f"1 to {catalogue.MAX_VERSION}.",
                        "minimum": 1,
                        "maximum": catalogue.MAX_VERSION,
                    },
                    "schema": {
                        **_JSON_VALUE,
                        "description": "A JSON Schema (draft 2020-12) of the event's data: an object or a"
                        " boolean. $refs point inside it (#/$defs/...); nothing is fetched.",
                    },
                    "example": {
                        **_JSON_VALUE,
                        "type": "object",
                        "description": "An event's data that validates against the schema.",
                    },
                },
            },
        },
        "deprecated": {
            "type": "object",
            "description": "Deprecated: still accepted at publish, and counted.",
            "required": ["since"],
            "properties": {
                "since": {"type": "string", "format": "date", "description": "The day, as 2026-06-30."}
            },
        },
        "archived": {
            "type": "boolean",
            "description": "Archived: refused at publish whatever the mode, still shown.",
            "default": False,
        },
    },
}

_EVENTTYPE_STATUS = {
    "type": "object",
    "x-kubernetes-preserve-unknown-fields": True,
    "properties": {
        "type": {"type": "string", "description": "The event type the catalogue holds it as."},
        "latestVersion": {"type": "integer"},
        "observedGeneration": _GENERATION,
        "conditions": _STATUS["properties"]["conditions"],  # type: ignore[index]
    },
}


def eventtype_crd() -> dict[str, Any]:
    """The WebhookEventType CustomResourceDefinition."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": EVENTTYPE_CRD_NAME},
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {
                "kind": catalogue.KIND,
                "listKind": f"{catalogue.KIND}List",
                "plural": EVENTTYPE_PLURAL,
                "singular": "webhookeventtype",
                "shortNames": ["whet"],
                "categories": ["hooklane"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": EVENTTYPE_PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "required": ["spec"],
                            "properties": {"spec": _EVENTTYPE_SPEC, "status": _EVENTTYPE_STATUS},
                            "x-kubernetes-validations": [
                                {
                                    "rule": "!has(self.spec.name)"
                                    " || self.spec.name.lowerAscii().replace('_', '-') == self.metadata.name",
                                    "message": "metadata.name must be spec.name lowercased, with '_' as '-'",
                                }
                            ],
                        }
                    },
                }
            ],
        },
    }


def eventtype_crd_yaml() -> str:
    """What ``hack/gen-crd`` writes into EVENTTYPE_CRD_PATH."""
    return _EVENTTYPE_HEADER + _dump(eventtype_crd())
