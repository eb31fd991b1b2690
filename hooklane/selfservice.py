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
from dataclasses import dataclass, fields, replace
from typing import Any, NamedTuple, Protocol
from urllib.parse import urlsplit

from hooklane.checks import check_namespace, shown_key
from hooklane.errors import InvalidInput, shown
from hooklane.guard import Network, literal_never_allowed
from hooklane.spec import (
    API_VERSION,
    KIND,
    ON_DEAD_DELIVERY_NAMES,
    ORDERING,
    SPEC,
    EndpointSpec,
    parse_manifest,
)

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
    "spec.ordering.onDeadDelivery": "ordering_on_dead",
}


@dataclass(frozen=True)
class EndpointForm:
    """What a tenant submits to create or edit one of its endpoints. The
    rest is the platform's: the tenant (its session's), the namespace, the
    signing secret (made by the server), the delivery terms (defaults:
    headers and TLS would name Secrets in a namespace tenants share; a rate
    limit, retries or adaptive concurrency the platform may set on the
    resource, and an edit keeps)."""

    # A DNS label the tenant chooses; unique among its own endpoints.
    name: str
    url: str
    # Patterns as spec.eventTypes has them ("order.*"); empty: every type.
    event_types: tuple[str, ...] = ()
    # None: the spec's default, or the platform's bound when lower
    # (:func:`filled`).
    max_concurrency: int | None = None
    timeout_seconds: int | None = None
    # spec.ordering.onDeadDelivery ("Hold", "Skip"); None: the spec's
    # default, Hold. The tenant's to choose: its receiver is the one that
    # needs the order, and either way nothing more of a worker is held.
    ordering_on_dead: str | None = None

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
    def portal_max_concurrency(self) -> int: ...
    @property
    def portal_max_timeout_seconds(self) -> int: ...
    @property
    def allowed_networks(self) -> Sequence[Network]: ...


class Limits(NamedTuple):
    """What an endpoint may hold of a worker, the two fields the platform
    bounds: its calls in flight, and how long each may hold its slot."""

    max_concurrency: int
    timeout_seconds: int


@dataclass(frozen=True)
class OverBound:
    """A field of a tenant's endpoint beyond the platform's bound (the
    form's name for it): set before the bound was lowered, or by the
    platform itself."""

    field: str
    value: int
    bound: int


def over_bounds(limits: Limits, settings: PortalBounds) -> tuple[OverBound, ...]:
    """The fields of ``limits`` beyond the platform's bounds on what a
    tenant may choose."""
    found = (
        OverBound("max_concurrency", limits.max_concurrency, settings.portal_max_concurrency),
        OverBound("timeout_seconds", limits.timeout_seconds, settings.portal_max_timeout_seconds),
    )
    return tuple(over for over in found if over.value > over.bound)


def self_service_name(settings: PortalBounds, tenant: str, namespace: str, name: str) -> str | None:
    """The name ``tenant`` chose for an endpoint the portal made for it,
    which it may change and the platform's bounds hold; None for any other
    (one the platform set up is the platform's to change, and to size)."""
    return chosen_name(tenant, name) if namespace == settings.portal_namespace else None


def filled(form: EndpointForm, settings: PortalBounds) -> EndpointForm:
    """``form`` with a field left out given its default: the spec's, or for
    a number the platform's bound when that is lower, so that a form that
    leaves it out is never refused for it."""
    return replace(
        form,
        max_concurrency=_default(form.max_concurrency, "maxConcurrency", settings.portal_max_concurrency),
        timeout_seconds=_default(form.timeout_seconds, "timeoutSeconds", settings.portal_max_timeout_seconds),
        ordering_on_dead=ORDERING.properties["onDeadDelivery"].default
        if form.ordering_on_dead is None
        else form.ordering_on_dead,
    )


def _default(value: int | None, spec_field: str, bound: int) -> int:
    if value is not None:
        return value
    default: int = SPEC.properties[spec_field].default
    return min(default, bound)


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
    """The ``WebhookEndpoint`` document of ``form`` (:func:`filled`),
    unchecked: what :func:`spec_for` parses and the Kubernetes writer
    creates."""
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
        "ordering": {"onDeadDelivery": form.ordering_on_dead},
    }
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def spec_for(
    tenant: str, form: EndpointForm, settings: PortalBounds, held: Limits | None = None
) -> EndpointSpec:
    """``tenant``'s endpoint as ``form`` describes it, in the portal's
    namespace; ``held``: the limits of the endpoint an edit changes.
    ``InvalidInput`` names the form field at fault: the spec's rules with
    the spec's words (parse_manifest), then the platform's bounds: event
    types, URL hosts, https only, the destination guard's refusal of an
    address no delivery may reach, and the most of a worker it may hold
    (:func:`_check_limits`)."""
    check_namespace(form.name, "name")
    try:
        spec = parse_manifest(manifest(tenant, filled(form, settings), settings.portal_namespace))
    except InvalidInput as exc:
        raise InvalidInput(_FORM_FIELDS.get(exc.field, exc.field), exc.message) from None
    _check_url(spec.url, settings)
    _check_event_types(spec.event_types, settings.portal_event_types)
    _check_limits(Limits(spec.max_concurrency, spec.timeout_seconds), settings, held)
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
        # The whole object: onDeadDelivery is all it holds.
        "ordering": {"onDeadDelivery": ON_DEAD_DELIVERY_NAMES[spec.ordering_on_dead]},
    }


def _check_limits(limits: Limits, settings: PortalBounds, held: Limits | None) -> None:
    """A value beyond its bound is refused, unless an edit keeps or lowers
    the endpoint's own (set before the bound was lowered, or by the
    platform): nothing accepted once is taken away by a lower bound, and
    no edit takes more than the endpoint had."""
    for over in over_bounds(limits, settings):
        kept = None if held is None else getattr(held, over.field)
        if kept is not None and over.value <= kept:
            continue
        allowed = f"must be at most {over.bound}, the most this platform lets a tenant choose"
        if kept is not None and kept > over.bound:
            allowed += f", or at most {kept}, this endpoint's value from before that bound"
        raise InvalidInput(over.field, f"{allowed}: not {over.value}")


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
