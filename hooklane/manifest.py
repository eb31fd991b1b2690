"""The ``WebhookEndpoint`` manifest: parsed and checked by the same rules as
the CRD's schema, for local mode (``hooklane endpoint apply``) and the
operator alike."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from hooklane.errors import InvalidInput

API_VERSION = "hooklane.io/v1alpha1"
KIND = "WebhookEndpoint"

# A dotted event type, optionally ending in ".*" (a whole trailing part), or "*".
EVENT_TYPE_PATTERN = re.compile(r"^(\*|[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*(\.\*)?)$")
EVENT_TYPE = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
# Kubernetes object names (RFC 1123 subdomain).
_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

MAX_URL_LENGTH = 2048
MAX_EVENT_TYPES = 64
CONCURRENCY_RANGE = (1, 256)
TIMEOUT_RANGE = (1, 60)


@dataclass(frozen=True)
class SecretRef:
    name: str
    key: str


@dataclass(frozen=True)
class EndpointSpec:
    namespace: str
    name: str
    url: str
    tenant: str
    secret_ref: SecretRef | None = None
    max_concurrency: int = 4
    event_types: tuple[str, ...] = field(default_factory=tuple)
    timeout_seconds: int = 5
    paused: bool = False


def check_url(url: Any) -> str:
    if not isinstance(url, str) or not url:
        raise InvalidInput("spec.url", "is required and must be a string")
    if len(url) > MAX_URL_LENGTH:
        raise InvalidInput("spec.url", f"is longer than {MAX_URL_LENGTH} characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise InvalidInput("spec.url", f"must be an http or https URL, not {url!r}")
    if not parts.hostname or any(c.isspace() for c in url):
        raise InvalidInput("spec.url", f"is not a valid URL: {url!r}")
    return url


def _int_in(value: Any, path: str, bounds: tuple[int, int], default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(path, f"must be an integer, not {value!r}")
    low, high = bounds
    if not low <= value <= high:
        raise InvalidInput(path, f"must be between {low} and {high}, not {value}")
    return value


def _event_types(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidInput("spec.eventTypes", "must be a list of patterns")
    if len(value) > MAX_EVENT_TYPES:
        raise InvalidInput("spec.eventTypes", f"has more than {MAX_EVENT_TYPES} patterns")
    for pattern in value:
        if not isinstance(pattern, str) or not EVENT_TYPE_PATTERN.match(pattern):
            raise InvalidInput(
                "spec.eventTypes",
                f"{pattern!r} is not a pattern like 'order.created', 'order.*' or '*'",
            )
    return tuple(value)


def parse_spec(namespace: str, name: str, spec: Any) -> EndpointSpec:
    """Check a ``spec`` mapping; ``InvalidInput`` names the first bad field."""
    if not isinstance(spec, dict):
        raise InvalidInput("spec", "is required and must be a mapping")
    known = {"url", "tenant", "secretRef", "maxConcurrency", "eventTypes", "timeoutSeconds", "paused"}
    unknown = sorted(set(spec) - known)
    if unknown:
        raise InvalidInput("spec", f"unknown field(s): {', '.join(unknown)}")
    tenant = spec.get("tenant")
    if not isinstance(tenant, str) or not 1 <= len(tenant) <= 253:
        raise InvalidInput("spec.tenant", "is required: a string of 1 to 253 characters")
    secret_ref = None
    if spec.get("secretRef") is not None:
        ref = spec["secretRef"]
        if not (isinstance(ref, dict) and isinstance(ref.get("name"), str) and ref["name"]
                and isinstance(ref.get("key"), str) and ref["key"]):
            raise InvalidInput("spec.secretRef", "must have a non-empty name and key")
        secret_ref = SecretRef(ref["name"], ref["key"])
    paused = spec.get("paused", False)
    if not isinstance(paused, bool):
        raise InvalidInput("spec.paused", f"must be true or false, not {paused!r}")
    return EndpointSpec(
        namespace=namespace,
        name=name,
        url=check_url(spec.get("url")),
        tenant=tenant,
        secret_ref=secret_ref,
        max_concurrency=_int_in(spec.get("maxConcurrency"), "spec.maxConcurrency", CONCURRENCY_RANGE, 4),
        event_types=_event_types(spec.get("eventTypes")),
        timeout_seconds=_int_in(spec.get("timeoutSeconds"), "spec.timeoutSeconds", TIMEOUT_RANGE, 5),
        paused=paused,
    )


def parse_manifest(doc: Any) -> EndpointSpec:
    """Check a whole ``WebhookEndpoint`` document (apiVersion, kind,
    metadata.name, metadata.namespace defaulting to ``default``, spec)."""
    if not isinstance(doc, dict):
        raise InvalidInput("manifest", "must be a YAML mapping")
    if doc.get("apiVersion") != API_VERSION:
        raise InvalidInput("apiVersion", f"must be {API_VERSION!r}, not {doc.get('apiVersion')!r}")
    if doc.get("kind") != KIND:
        raise InvalidInput("kind", f"must be {KIND!r}, not {doc.get('kind')!r}")
    metadata = doc.get("metadata")
    if not isinstance(metadata, dict):
        raise InvalidInput("metadata", "is required")
    name = metadata.get("name")
    namespace = metadata.get("namespace") or "default"
    for path, value in (("metadata.name", name), ("metadata.namespace", namespace)):
        if not isinstance(value, str) or len(value) > 253 or not _K8S_NAME.match(value):
            raise InvalidInput(path, f"must be a lowercase DNS-style name, not {value!r}")
    return parse_spec(namespace, name, doc.get("spec"))
