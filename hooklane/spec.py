"""The ``WebhookEndpoint`` resource as Hooklane reads it, in local mode
(``hooklane endpoint apply``) and in the operator alike: its apiVersion and
kind, the rules of its spec and the parser.

``SPEC`` is the one definition of the spec's fields: ``parse_spec`` checks a
spec against it, and ``hack/gen-crd`` writes the CRD's schema from it
(hooklane/crd.py, into crds/webhookendpoints.hooklane.io.yaml), so that the
parser and the API server accept the same manifests."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from hooklane.bounded_yaml import load_yaml
from hooklane.checks import (
    EVENT_TYPE_PATTERN,
    K8S_NAME_PATTERN,
    MAX_NODES,
    MAX_URL_LENGTH,
    NO_CONTROLS_PATTERN,
    SECRET_KEY_PATTERN,
    URL_TEXT_PATTERN,
    check_name,
    check_namespace,
    check_url,
    shown_key,
    unstorable,
    walk,
)
from hooklane.delivery import (
    CA_KEY,
    DURATION_PATTERN,
    HEADER_NAME_PATTERN,
    HEADER_VALUE_PATTERN,
    MAX_ATTEMPTS,
    MAX_HEADER_VALUE,
    MAX_HEADERS,
    REFUSED_HEADER_PREFIX,
    REFUSED_HEADERS,
    REFUSED_HEADERS_TEXT,
    DeliverySpec,
    HeaderSpec,
    SecretKeyRef,
    TlsSpec,
    check_header_name,
    check_headers,
    check_max_age,
    parse_duration,
)
from hooklane.errors import InvalidInput, shown

API_VERSION = "hooklane.io/v1alpha1"
KIND = "WebhookEndpoint"

MAX_TENANT_LENGTH = 253

# status comes along in what `kubectl get -o yaml` exports; it is the
# operator's to write, so it is ignored here rather than refused.
_TOP_LEVEL = frozenset({"apiVersion", "kind", "metadata", "spec", "status"})
# Every field of Kubernetes' ObjectMeta: a manifest saved with `kubectl get -o
# yaml` carries the server's (uid, resourceVersion, managedFields, ...) and must
# apply as it is. Only name and namespace are read; anything else is a typo.
_METADATA = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)


@dataclass(frozen=True)
class FieldRule:
    """One field of the spec: what ``parse_spec`` checks and what the CRD's
    schema says, in the terms of an OpenAPI schema."""

    type: Literal["string", "integer", "boolean", "array", "object"]
    description: str | None = None
    # Taken when the field is absent or null, here and by the API server.
    default: Any = None
    min_length: int | None = None
    max_length: int | None = None
    # The only values a string may take (checked before its type, so that
    # any other value, of any type, gets the list).
    enum: tuple[str, ...] | None = None
    # Matched against the whole value (see EVENT_TYPE_PATTERN in hooklane/checks.py).
    pattern: str | None = None
    # The error message when the pattern does not match.
    pattern_message: str = "has the wrong form"
    minimum: int | None = None
    maximum: int | None = None
    max_items: int | None = None
    items: FieldRule | None = None
    properties: Mapping[str, FieldRule] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    # For the API server only: an OpenAPI format and CEL rules (rule,
    # message), saying in CEL what ``check`` says in Python where CEL can.
    format: str | None = None
    cel: tuple[tuple[str, str], ...] = ()
    # For Python only: what a schema cannot say (a URL's host and port).
    check: Callable[[Any], Any] | None = None
    # For Python only: a value that may be a credential (a header's), never
    # repeated in an error, which reaches status, Events and the CLI.
    confidential: bool = False
    # The endpoints column whose CHECK constraint and default repeat this
    # rule's bounds and default, the database's backstop (tested to agree).
    column: str | None = None


_SECRET_NAME = FieldRule(
    "string",
    "The Secret's name, in this namespace.",
    min_length=1,
    max_length=253,
    pattern=K8S_NAME_PATTERN,
    pattern_message="must be a lowercase DNS-style name (RFC 1123)",
)


def _secret_key(description: str, default: str | None = None) -> FieldRule:
    return FieldRule(
        "string",
        description,
        default=default,
        min_length=1,
        max_length=253,
        pattern=SECRET_KEY_PATTERN,
        pattern_message="must be 1 to 253 letters, digits and '-._'",
    )


# spec.ordering.onDeadDelivery as the resource spells it (Kubernetes' enum
# style), and as endpoints.ordering_on_dead stores it.
OrderingOnDead = Literal["hold", "skip"]
ON_DEAD_DELIVERY: Mapping[str, OrderingOnDead] = {"Hold": "hold", "Skip": "skip"}
ON_DEAD_DELIVERY_NAMES: Mapping[OrderingOnDead, str] = {v: k for k, v in ON_DEAD_DELIVERY.items()}

ORDERING = FieldRule(
    "object",
    "Deliveries of events published with an ordering key: per key, one in flight at a time, in the"
    " order their publishing transactions committed.",
    properties={
        "onDeadDelivery": FieldRule(
            "string",
            "What the key's later deliveries do when its delivery at the head dies (retries or age"
            " exhausted). Hold (default, the safe one): they wait until the dead delivery is resent or"
            " discarded, so the receiver never sees a later event before an earlier one. Skip: the dead"
            " delivery stays dead and visible, and the next one goes out. A change from Hold to Skip"
            " moves held keys on within the worker's ordering sweep interval.",
            default="Hold",
            enum=tuple(ON_DEAD_DELIVERY),
        ),
    },
)

_REFUSED_CEL = ", ".join(f"'{h}'" for h in REFUSED_HEADERS)
_HOSTNAME_PATTERN = r"[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*"

DELIVERY = FieldRule(
    "object",
    "How deliveries go to this receiver: its rate limit, adaptive concurrency, extra headers, TLS and"
    " retries. Every field is optional; left out, the defaults apply.",
    properties={
        "rateLimit": FieldRule(
            "object",
            "At most perSecond delivery starts per second, across every worker (a token bucket kept in"
            " Postgres). After an idle spell up to burst start at once.",
            required=("perSecond",),
            properties={
                "perSecond": FieldRule(
                    "integer", "Delivery starts per second, at most. 1 to 10000.", minimum=1, maximum=10_000
                ),
                "burst": FieldRule(
                    "integer",
                    "Starts allowed at once after an idle spell (1: evenly spaced starts). Default 1; 1 to"
                    " 10000.",
                    default=1,
                    minimum=1,
                    maximum=10_000,
                ),
            },
        ),
        "adaptiveConcurrency": FieldRule(
            "boolean",
            "Move the concurrency limit between 1 and maxConcurrency: down on the receiver's overload"
            " signals (429, 503, timeouts), once per generation of calls (only a call reserved after the"
            " last lowering lowers it again), and up while it keeps up. At a limit of 1 an overload"
            " signal without a Retry-After holds the whole endpoint for HOOKLANE_ADAPTIVE_STEP_SECONDS;"
            " a Retry-After on a 429 or 503 holds it as long as it asks. The limit in force is"
            " status.effectiveConcurrency. Default false.",
            default=False,
        ),
        "headers": FieldRule(
            "array",
            "Extra request headers, each with a value or one read from a Secret key (an API key). Never"
            " shown in status, logs or the dashboard. At most 32; no name twice (in any case).",
            max_items=MAX_HEADERS,
            items=FieldRule(
                "object",
                required=("name",),
                properties={
                    "name": FieldRule(
                        "string",
                        "The header's name: 1 to 256 characters of an HTTP token (letters, digits and"
                        f" !#$%&'*+.^_`|~-). Refused: {REFUSED_HEADERS_TEXT}.",
                        min_length=1,
                        max_length=256,
                        pattern=HEADER_NAME_PATTERN,
                        pattern_message="must be a header name (letters, digits and !#$%&'*+.^_`|~-)",
                        cel=(
                            (
                                f"!(self.lowerAscii() in [{_REFUSED_CEL}])"
                                f" && !self.lowerAscii().startsWith('{REFUSED_HEADER_PREFIX}')",
                                f"may not be set: {REFUSED_HEADERS_TEXT}",
                            ),
                        ),
                        check=check_header_name,
                    ),
                    "value": FieldRule(
                        "string",
                        f"The header's value: 1 to {MAX_HEADER_VALUE} characters of visible ASCII, with"
                        " spaces and tabs only inside, no line breaks.",
                        min_length=1,
                        max_length=MAX_HEADER_VALUE,
                        pattern=HEADER_VALUE_PATTERN,
                        pattern_message="must be visible ASCII, spaces and tabs only inside, no line breaks",
                        confidential=True,
                    ),
                    "valueFrom": FieldRule(
                        "object",
                        "Where the value is read from instead.",
                        required=("secretKeyRef",),
                        properties={
                            "secretKeyRef": FieldRule(
                                "object",
                                "A key of a Secret in this namespace; a change takes effect without a"
                                " restart.",
                                required=("name", "key"),
                                properties={"name": _SECRET_NAME, "key": _secret_key("The key.")},
                            )
                        },
                    ),
                },
                cel=(
                    ("has(self.value) != has(self.valueFrom)", "must set exactly one of value and valueFrom"),
                ),
            ),
            cel=(
                (
                    "self.all(h, self.exists_one(o, o.name.lowerAscii() == h.name.lowerAscii()))",
                    "must not set a header twice",
                ),
            ),
            check=check_headers,
        ),
        "tls": FieldRule(
            "object",
            "TLS to an https:// receiver: a private CA to trust (for this endpoint only), a client"
            " certificate (mutual TLS) and the name to verify.",
            properties={
                "caSecretRef": FieldRule(
                    "object",
                    "A Secret key holding the PEM certificates to trust instead of the system's.",
                    required=("name",),
                    properties={
                        "name": _SECRET_NAME,
                        "key": _secret_key(f"The key. Default {CA_KEY}.", CA_KEY),
                    },
                ),
                "clientCertificateSecretRef": FieldRule(
                    "object",
                    "A kubernetes.io/tls Secret (tls.crt, tls.key): the certificate presented to the"
                    " receiver.",
                    required=("name",),
                    properties={"name": _SECRET_NAME},
                ),
                "serverName": FieldRule(
                    "string",
                    "The name sent in SNI and verified in the receiver's certificate, instead of the URL's"
                    " host. The address dialled is still the URL's, and still judged by the destination"
                    " guard.",
                    min_length=1,
                    max_length=253,
                    pattern=_HOSTNAME_PATTERN,
                    pattern_message="must be a DNS name",
                ),
            },
        ),
        "retry": FieldRule(
            "object",
            "This endpoint's retry limits, within the contract's (20 attempts, 72h).",
            properties={
                "maxAttempts": FieldRule(
                    "integer",
                    f"Attempts before a delivery is dead. 1 to {MAX_ATTEMPTS}; unset:"
                    " HOOKLANE_RETRY_MAX_ATTEMPTS (default 20).",
                    minimum=1,
                    maximum=MAX_ATTEMPTS,
                ),
                "maxAge": FieldRule(
                    "string",
                    'Age at which a delivery is dead, a duration ("1h", "90m", "36h"). 1s to 72h; unset:'
                    " HOOKLANE_RETRY_MAX_AGE_SECONDS (default 72h).",
                    min_length=2,
                    max_length=32,
                    pattern=DURATION_PATTERN,
                    pattern_message='must be a duration such as "90s", "30m" or "36h"',
                    cel=(
                        (
                            # Guarded by the pattern, so that a value it refuses gets
                            # its message rather than a CEL conversion error too.
                            f"!self.matches('^(?:{DURATION_PATTERN})$')"
                            " || (duration(self) >= duration('1s') && duration(self) <= duration('72h'))",
                            "must be between 1s and 72h",
                        ),
                    ),
                    check=check_max_age,
                ),
            },
        ),
    },
)

SPEC = FieldRule(
    "object",
    required=("url", "tenant", "secretRef"),
    properties={
        "url": FieldRule(
            "string",
            "http(s) URL the deliveries are POSTed to.",
            min_length=1,
            max_length=MAX_URL_LENGTH,
            pattern=URL_TEXT_PATTERN,
            pattern_message="must not contain whitespace, control characters or a #fragment",
            format="uri",
            cel=(
                (
                    "isURL(self) && url(self).getScheme() in ['http', 'https'] && url(self).getHostname() != ''",
                    "must be an absolute http:// or https:// URL with a host",
                ),
                (
                    "!self.matches('^[^:/?#]*://[^/?#]*@')",
                    "must not hold user:password@: it would be sent as Basic auth",
                ),
            ),
            check=check_url,
        ),
        "tenant": FieldRule(
            "string",
            "The customer whose events go to this endpoint.",
            min_length=1,
            max_length=MAX_TENANT_LENGTH,
            pattern=NO_CONTROLS_PATTERN,
            pattern_message="must not contain control characters",
        ),
        "secretRef": FieldRule(
            "object",
            "Secret in this namespace holding the Standard Webhooks signing secret (whsec_ + base64).",
            required=("name", "key"),
            properties={
                "name": FieldRule(
                    "string",
                    min_length=1,
                    max_length=253,
                    pattern=K8S_NAME_PATTERN,
                    pattern_message="must be a lowercase DNS-style name (RFC 1123)",
                ),
                "key": FieldRule(
                    "string",
                    min_length=1,
                    max_length=253,
                    pattern=SECRET_KEY_PATTERN,
                    pattern_message="must be 1 to 253 letters, digits and '-._'",
                ),
            },
        ),
        "maxConcurrency": FieldRule(
            "integer",
            "Deliveries in flight at once to this endpoint, exact across all workers.",
            default=4,
            minimum=1,
            maximum=256,
            column="max_concurrency",
        ),
        "eventTypes": FieldRule(
            "array",
            'Event-type patterns this endpoint receives ("order.*", "*"); empty means all.',
            max_items=64,
            items=FieldRule(
                "string",
                min_length=1,
                max_length=255,
                pattern=EVENT_TYPE_PATTERN,
                pattern_message="must be a pattern like 'order.created', 'order.*' or '*'",
            ),
        ),
        "timeoutSeconds": FieldRule(
            "integer",
            "Deadline for the whole call (connect, TLS, send and response).",
            default=5,
            minimum=1,
            maximum=60,
            column="timeout_seconds",
        ),
        "paused": FieldRule(
            "boolean", "Manual pause; pending deliveries are kept.", default=False, column="paused"
        ),
        "delivery": DELIVERY,
        "ordering": ORDERING,
    },
    cel=(
        (
            "!has(self.delivery) || !has(self.delivery.tls) || url(self.url).getScheme() == 'https'",
            "delivery.tls needs an https:// url",
        ),
    ),
    check=lambda spec: _tls_needs_https(spec),
)
_FIELDS = SPEC.properties


@dataclass(frozen=True)
class EndpointSpec:
    namespace: str
    name: str
    url: str
    tenant: str
    secret_ref: SecretKeyRef | None = None
    max_concurrency: int = _FIELDS["maxConcurrency"].default
    event_types: tuple[str, ...] = field(default_factory=tuple)
    timeout_seconds: int = _FIELDS["timeoutSeconds"].default
    paused: bool = _FIELDS["paused"].default
    delivery: DeliverySpec = field(default_factory=DeliverySpec)
    # spec.ordering.onDeadDelivery, as endpoints.ordering_on_dead stores it.
    ordering_on_dead: OrderingOnDead = "hold"


def _tls_needs_https(spec: dict[str, Any]) -> None:
    delivery = spec.get("delivery") or {}
    if delivery.get("tls") is not None and not spec["url"].lower().startswith("https://"):
        raise InvalidInput("spec.delivery.tls", "needs an https:// url")


def check_tenant(value: Any, field: str) -> str:
    """A tenant, by the same rule as spec.tenant."""
    if value is None:
        raise InvalidInput(field, "is required")
    tenant: str = _checked(SPEC.properties["tenant"], value, field)
    return tenant


def _checked(rule: FieldRule, value: Any, path: str) -> Any:
    """``value`` (not None) checked against ``rule``; ``InvalidInput`` names
    the first bad field, or the list for a bad item."""
    match rule.type:
        case "string":
            _check_string(rule, value, path)
        case "integer":
            _check_integer(rule, value, path)
        case "boolean":
            if not isinstance(value, bool):
                raise InvalidInput(path, f"must be true or false, not {shown(value)}")
        case "array":
            value = _check_array(rule, value, path)
        case "object":
            value = _check_object(rule, value, path)
    if rule.check is not None:
        try:
            rule.check(value)
        except InvalidInput as exc:
            # A check that does not know where its value sits leaves the
            # field empty: it is this one.
            if exc.field:
                raise
            raise InvalidInput(path, exc.message) from None
    return value


def _check_string(rule: FieldRule, value: Any, path: str) -> None:
    if rule.enum is not None:
        if value not in rule.enum:
            raise InvalidInput(path, f"must be one of {', '.join(rule.enum)}, not {shown(value)}")
        return
    low, high = rule.min_length or 0, rule.max_length
    if not isinstance(value, str) or len(value) < low or (high is not None and len(value) > high):
        size = f"{low} to {high}" if high is not None else f"at least {low}"
        raise InvalidInput(path, f"must be a string of {size} characters{_quoted(rule, value, ', not ')}")
    if problem := unstorable(value):
        raise InvalidInput(path, problem)
    if rule.pattern is not None and not re.fullmatch(rule.pattern, value):
        raise InvalidInput(path, f"{rule.pattern_message}{_quoted(rule, value, ': ')}")


def _quoted(rule: FieldRule, value: Any, lead: str) -> str:
    """``value`` as an error quotes it after ``lead``; nothing for a
    confidential string (anything else is no credential)."""
    return "" if rule.confidential and isinstance(value, str) else f"{lead}{shown(value)}"


def _check_integer(rule: FieldRule, value: Any, path: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(path, f"must be an integer, not {shown(value)}")
    if (rule.minimum is not None and value < rule.minimum) or (
        rule.maximum is not None and value > rule.maximum
    ):
        raise InvalidInput(path, f"must be between {rule.minimum} and {rule.maximum}, not {shown(value)}")


def _check_array(rule: FieldRule, value: Any, path: str) -> list[Any]:
    """The list with every item checked (objects with their defaults)."""
    if not isinstance(value, list):
        raise InvalidInput(path, f"must be a list, not {shown(value)}")
    if rule.max_items is not None and len(value) > rule.max_items:
        raise InvalidInput(path, f"has more than {rule.max_items} items")
    if rule.items is None:
        return value
    checked = []
    for i, item in enumerate(value):
        try:
            checked.append(_checked(rule.items, item, path))
        except InvalidInput as exc:
            # An item's own field is named after the item's number.
            inner = exc.field[len(path) + 1 :] + " " if exc.field.startswith(path + ".") else ""
            raise InvalidInput(path, f"item {i}: {inner}{exc.message}") from None
    return checked


def _check_object(rule: FieldRule, value: Any, path: str) -> dict[str, Any]:
    """The object with every field checked and defaults filled in."""
    if not isinstance(value, dict):
        raise InvalidInput(path, f"must be a mapping with {', '.join(rule.properties)}")
    _refuse_unknown(value, path, frozenset(rule.properties))
    checked: dict[str, Any] = {}
    for key, field_rule in rule.properties.items():
        # The API server prunes nulls before it defaults and checks.
        given = value.get(key)
        if given is None:
            if key in rule.required:
                raise InvalidInput(f"{path}.{key}", "is required")
            checked[key] = field_rule.default
        else:
            checked[key] = _checked(field_rule, given, f"{path}.{key}")
    return checked


def _refuse_unknown(mapping: dict[Any, Any], path: str, known: frozenset[str]) -> None:
    unknown = sorted(shown_key(k) for k in mapping if k not in known)
    if unknown:
        raise InvalidInput(
            path, f"unknown field(s): {', '.join(unknown[:5])} (known: {', '.join(sorted(known))})"
        )


def parse_spec(namespace: str, name: str, spec: Any) -> EndpointSpec:
    """Check a ``spec`` mapping against ``SPEC``; ``InvalidInput`` names the
    first bad field."""
    if spec is None:
        raise InvalidInput("spec", "is required and must be a mapping")
    checked = _checked(SPEC, spec, "spec")
    ref = checked["secretRef"]
    return EndpointSpec(
        namespace=namespace,
        name=name,
        url=checked["url"],
        tenant=checked["tenant"],
        secret_ref=SecretKeyRef(ref["name"], ref["key"]),
        max_concurrency=checked["maxConcurrency"],
        event_types=tuple(checked["eventTypes"] or ()),
        timeout_seconds=checked["timeoutSeconds"],
        paused=checked["paused"],
        delivery=_delivery(checked["delivery"]),
        ordering_on_dead=_on_dead(checked["ordering"]),
    )


def _on_dead(checked: dict[str, Any] | None) -> OrderingOnDead:
    name = ORDERING.properties["onDeadDelivery"].default if checked is None else checked["onDeadDelivery"]
    return ON_DEAD_DELIVERY[name]


def _delivery(checked: dict[str, Any] | None) -> DeliverySpec:
    if checked is None:
        return DeliverySpec()
    rate, tls, retry = checked["rateLimit"], checked["tls"], checked["retry"] or {}
    headers = tuple(
        HeaderSpec(
            h["name"],
            h["value"],
            None if h["valueFrom"] is None else SecretKeyRef(**h["valueFrom"]["secretKeyRef"]),
        )
        for h in checked["headers"] or ()
    )
    return DeliverySpec(
        rate_per_second=None if rate is None else rate["perSecond"],
        burst=1 if rate is None else rate["burst"],
        adaptive=checked["adaptiveConcurrency"],
        headers=headers,
        tls=None
        if tls is None
        else TlsSpec(
            None if tls["caSecretRef"] is None else SecretKeyRef(**tls["caSecretRef"]),
            None if tls["clientCertificateSecretRef"] is None else tls["clientCertificateSecretRef"]["name"],
            tls["serverName"],
        ),
        max_attempts=retry.get("maxAttempts"),
        max_age_seconds=None if retry.get("maxAge") is None else parse_duration(retry["maxAge"]),
    )


def parse_manifest(doc: Any) -> EndpointSpec:
    """Check a whole ``WebhookEndpoint`` document (apiVersion, kind,
    metadata.name, metadata.namespace defaulting to ``default``, spec)."""
    if not isinstance(doc, dict):
        raise InvalidInput("manifest", "must be a YAML mapping")
    _refuse_unknown(doc, "manifest", _TOP_LEVEL)
    for count, _ in enumerate(walk(doc, "")):
        if count >= MAX_NODES:
            raise InvalidInput("manifest", f"has more than {MAX_NODES} values")
    if doc.get("apiVersion") != API_VERSION:
        raise InvalidInput("apiVersion", f"must be {API_VERSION!r}, not {shown(doc.get('apiVersion'))}")
    if doc.get("kind") != KIND:
        raise InvalidInput("kind", f"must be {KIND!r}, not {shown(doc.get('kind'))}")
    metadata = doc.get("metadata")
    if not isinstance(metadata, dict):
        raise InvalidInput("metadata", "is required")
    _refuse_unknown(metadata, "metadata", _METADATA)
    name = check_name(metadata.get("name"), "metadata.name")
    namespace = metadata.get("namespace")
    namespace = "default" if namespace in (None, "") else check_namespace(namespace, "metadata.namespace")
    return parse_spec(namespace, name, doc.get("spec"))


def load_manifest(raw: bytes, source: str) -> EndpointSpec:
    """A ``WebhookEndpoint`` from the bytes of a YAML (or JSON) file, at a
    bounded cost whatever they hold; ``source`` names the file in errors."""
    return parse_manifest(load_yaml(raw, source))
