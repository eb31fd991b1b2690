"""The WebhookEndpoint CustomResourceDefinition, written from ``SPEC``
(hooklane/spec.py) by ``hack/gen-crd``: the names the API server serves it
under, its printer columns and status schema, and the YAML of it.

The operator watches the resource by these names, and the tests read the
columns from here, so that none of them is written twice."""

from __future__ import annotations

from typing import Any

import yaml

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
    return _CRD_HEADER + yaml.dump(crd(), Dumper=_CrdDumper, sort_keys=False, width=1000, allow_unicode=True)
