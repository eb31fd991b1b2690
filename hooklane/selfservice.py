"""Self-service endpoints: what a tenant may ask for, turned into a
``WebhookEndpoint`` by the same parser as every other path, then held to the
platform's bounds. No I/O: the writers (hooklane/api/endpoint_writers.py)
store what this module decides.

A tenant chooses a name; the resource is named ``<name>-<tenant key>``, the
key a hash of the tenant, so that two tenants choosing one name never
collide, and neither learns that the other did (docs/self-service.md).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol
from urllib.parse import urlsplit

from hooklane.checks import check_namespace, shown_key
from hooklane.errors import InvalidInput, shown
from hooklane.guard import Network, literal_never_allowed
from hooklane.spec import API_VERSION, KIND, SPEC, EndpointSpec, parse_manifest

# 16 base32 characters: 80 bits of SHA-256. Two tenants' keys agree by
# chance once in 2**40 pairs, and even then only a create of the same name
# is refused: every change also checks spec.tenant itself.
TENANT_KEY_LENGTH = 16
# The key of the signing secret in the endpoint's Secret (examples/secret.yaml's).
SECRET_KEY = "secret"
# The longest rules a refusal lists: the platform may set hundreds.
_RULES_SHOWN = 10

# The form field of each spec field it fills: a spec error is reported
# under the form's name for it, in the spec's own words.
_FORM_FIELDS = {
    "metadata.name": "name",
    "spec.url": "url",
    "spec.eventTypes": "event_types",
    "spec.maxConcurrency": "max_concurrency",
    "spec.timeoutSeconds": "timeout_seconds",
}


@dataclass(frozen=True)
class EndpointForm:
    """What a tenant submits to create or edit one of its endpoints. The
    rest is the platform's: the tenant (its session's), the namespace, the
    signing secret (made by the server), the delivery terms (defaults:
    headers and TLS would name Secrets in a namespace tenants share)."""

    # A DNS label the tenant chooses; unique among its own endpoints.
    name: str
    url: str
    # Patterns as spec.eventTypes has them ("order.*"); empty: every type.
    event_types: tuple[str, ...] = ()
    max_concurrency: int = SPEC.properties["maxConcurrency"].default
    timeout_seconds: int = SPEC.properties["timeoutSeconds"].default

    @classmethod
    def from_json(cls, doc: Any) -> EndpointForm:
        """The form from a JSON request body. Only the shape is checked
        here (an object, known fields): the values are the spec parser's
        to judge, by :func:`spec_for`."""
        known = [f.name for f in fields(cls)]
        if not isinstance(doc, dict):
            raise InvalidInput("body", f"must be a JSON object with {', '.join(known)}")
        unknown = sorted(shown_key(key) for key in doc if key not in known)
        if unknown:
            raise InvalidInput(
                "body", f"unknown field(s): {', '.join(unknown[:5])} (known: {', '.join(known)})"
            )
        # A null is a field left out (its default); name and url have none.
        values = {key: value for key, value in doc.items() if value is not None}
        if isinstance(values.get("event_types"), list):
            values["event_types"] = tuple(values["event_types"])
        return cls(**{"name": None, "url": None, **values})


class PortalBounds(Protocol):
    """The settings :func:`spec_for` reads (hooklane.settings.Settings has
    them all)."""

    @property
    def portal_namespace(self) -> str: ...
    @property
    def portal_event_types(self) -> Sequence[str]: ...
    @property
    def portal_url_hosts(self) -> Sequence[str]: ...
    @property
    def portal_https_only(self) -> bool: ...
    @property
    def allowed_networks(self) -> Sequence[Network]: ...


def tenant_key(tenant: str) -> str:
    """A label-safe, fixed-length stand-in for ``tenant`` (which may hold
    any printable text): lowercase base32 of its SHA-256."""
    # surrogatepass: a tenant the parser will refuse still gets a key.
    digest = hashlib.sha256(tenant.encode("utf-8", "surrogatepass")).digest()
    return base64.b32encode(digest).decode("ascii").lower()[:TENANT_KEY_LENGTH]


def resource_name(tenant: str, name: str) -> str:
    """The resource (and Secret) name of ``tenant``'s endpoint ``name``: at
    most 63 + 1 + 16 characters, a DNS name whenever ``name`` is a label."""
    return f"{name}-{tenant_key(tenant)}"


def chosen_name(tenant: str, resource: str) -> str | None:
    """The name ``tenant`` chose for ``resource``; None when the resource is
    not named after this tenant."""
    suffix = "-" + tenant_key(tenant)
    if len(resource) > len(suffix) and resource.endswith(suffix):
        return resource[: -len(suffix)]
    return None


def manifest(tenant: str, form: EndpointForm, namespace: str) -> dict[str, Any]:
    """The ``WebhookEndpoint`` document of ``form``, unchecked: what
    :func:`spec_for` parses and the Kubernetes writer creates."""
    name = resource_name(tenant, form.name)
    event_types = form.event_types
    spec: dict[str, Any] = {
        "url": form.url,
        "tenant": tenant,
        "secretRef": {"name": name, "key": SECRET_KEY},
        # Anything but a tuple is left as it came, for the parser to refuse.
        "eventTypes": list(event_types) if isinstance(event_types, tuple) else event_types,
        "maxConcurrency": form.max_concurrency,
        "timeoutSeconds": form.timeout_seconds,
    }
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def spec_for(tenant: str, form: EndpointForm, settings: PortalBounds) -> EndpointSpec:
    """``tenant``'s endpoint as ``form`` describes it, in the portal's
    namespace. ``InvalidInput`` names the form field at fault: the spec's
    rules with the spec's words (parse_manifest), then the platform's
    bounds: event types, URL hosts, https only, and the destination guard's
    refusal of an address no delivery may reach."""
    check_namespace(form.name, "name")
    try:
        spec = parse_manifest(manifest(tenant, form, settings.portal_namespace))
    except InvalidInput as exc:
        raise InvalidInput(_FORM_FIELDS.get(exc.field, exc.field), exc.message) from None
    _check_url(spec.url, settings)
    _check_event_types(spec.event_types, settings.portal_event_types)
    return spec


def spec_patch(spec: EndpointSpec) -> Mapping[str, Any]:
    """The spec fields a form sets, as the resource has them: what an edit
    changes, leaving the rest of the resource (paused, secretRef, anything
    the platform added) as it is."""
    return {
        "url": spec.url,
        "eventTypes": list(spec.event_types),
        "maxConcurrency": spec.max_concurrency,
        "timeoutSeconds": spec.timeout_seconds,
    }


def _check_url(url: str, settings: PortalBounds) -> None:
    parts = urlsplit(url)
    # urlsplit lowercases the host and drops an IPv6 literal's brackets.
    host = (parts.hostname or "").removesuffix(".")
    if settings.portal_https_only and parts.scheme != "https":
        raise InvalidInput(
            "url", f"must be an https:// URL: this platform delivers over TLS only, not {shown(url)}"
        )
    rules = settings.portal_url_hosts
    if rules and not any(_host_allowed(host, rule) for rule in rules):
        raise InvalidInput(
            "url", f"host {shown(host)} is not one this platform delivers to ({_listed(rules)})"
        )
    refusal = literal_never_allowed(parts.hostname or "", settings.allowed_networks)
    if refusal is not None:
        raise InvalidInput("url", f"{refusal}: no delivery may reach it")


def _host_allowed(host: str, rule: str) -> bool:
    """``*.example.com`` allows every name under example.com, not the name
    itself; any other rule, exactly that host."""
    if rule.startswith("*."):
        return host.endswith(rule[1:])
    return host == rule


def _check_event_types(patterns: Sequence[str], rules: Sequence[str]) -> None:
    if not rules:
        return
    if not patterns:
        raise InvalidInput("event_types", f"must name the event types to receive, among {_listed(rules)}")
    for i, pattern in enumerate(patterns):
        if not any(within(pattern, rule) for rule in rules):
            raise InvalidInput(
                "event_types",
                f"item {i}: {shown(pattern)} is not among the types this platform allows ({_listed(rules)})",
            )


def within(pattern: str, rule: str) -> bool:
    """Every type ``pattern`` matches, ``rule`` matches too, as
    hooklane_type_matches (migration 0006) matches them: ``*`` every type,
    ``order.*`` every type starting with ``order.``, else the type itself."""
    if rule == "*":
        return True
    if pattern == "*":
        return False
    if rule.endswith(".*"):
        return pattern.startswith(rule[:-1])
    return pattern == rule


def _listed(rules: Sequence[str]) -> str:
    shown_rules = ", ".join(rules[:_RULES_SHOWN])
    return (
        shown_rules if len(rules) <= _RULES_SHOWN else f"{shown_rules} and {len(rules) - _RULES_SHOWN} more"
    )
