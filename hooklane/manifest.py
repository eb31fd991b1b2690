"""The ``WebhookEndpoint`` manifest: parsed and checked for local mode
(``hooklane endpoint apply``) and the operator alike.

``SPEC`` is the one definition of the spec's fields: ``parse_spec`` checks a
spec against it, and ``hack/gen-crd`` writes the CRD's schema from it
(``crd_yaml``, into crds/webhookendpoints.hooklane.io.yaml), so that the
parser and the API server accept the same manifests."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml

from hooklane.endpoint_state import EndpointState
from hooklane.errors import InvalidInput, printable, shown

API_VERSION = "hooklane.io/v1alpha1"
KIND = "WebhookEndpoint"

# Patterns that check a whole value are used with fullmatch, and written into
# the CRD as ^(?:...)$: Python's "$" also matches before a trailing newline,
# and a value accepted so fails every delivery later, at aiohttp's
# header-injection check. They are read by Python's re here and by RE2 in the
# API server, so they keep to the syntax both read alike.
# A dotted event type, optionally ending in ".*" (a whole trailing part), or "*".
EVENT_TYPE_PATTERN = r"\*|[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*(\.\*)?"
EVENT_TYPE = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
# Kubernetes object names (RFC 1123 subdomain) and namespaces (RFC 1123 label).
_K8S_NAME_PATTERN = rf"{_DNS_LABEL}(\.{_DNS_LABEL})*"
_K8S_NAME = re.compile(_K8S_NAME_PATTERN)
_K8S_NAMESPACE = re.compile(_DNS_LABEL)
# The keys of a Secret's data, as Kubernetes has them.
_SECRET_KEY_PATTERN = r"[-._a-zA-Z0-9]+"
# Text that is stored, matched exactly and printed by the CLI must not hold C0
# or C1 controls (\t, \n, \r, ESC and DEL among them), nor lone surrogates,
# which have no UTF-8 form and so cannot be stored at all (the API server's
# JSON cannot carry them, so the shared pattern leaves them to _UNSTORABLE).
_NO_CONTROLS_PATTERN = r"[^\x00-\x1f\x7f-\x9f]+"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
# What check_url refuses that a pattern can say: whitespace, controls, "#".
_URL_TEXT_PATTERN = r"[^\x00-\x20\x7f-\x9f#]+"
# Postgres text and jsonb refuse NUL; neither can hold a lone surrogate.
_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_./-]{1,100}")
_HOST_LABEL = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?")
# A host whose last label is a number is an IPv4 address to URL parsers
# (WHATWG's "ends in a number"), in whichever of their many notations.
_NUMERIC_LABEL = re.compile(r"[0-9]+|0[xX][0-9A-Fa-f]*")
_NETLOC = re.compile(r"(?P<host>\[[^\]]*\]|[^:\[\]]*)(?::(?P<port>[^:]*))?")
_PORT = re.compile(r"[0-9]{1,5}")

MAX_URL_LENGTH = 2048
MAX_TENANT_LENGTH = 253
MAX_MANIFEST_BYTES = 1024 * 1024
# Bounds on any input tree (a manifest, an event's data), so that checking it
# costs bounded time and stack whatever it holds. A real manifest has a few
# dozen values, a few hundred with the server's managedFields.
MAX_DEPTH = 64
MAX_NODES = 10_000
MAX_PATH_LENGTH = 100
# No integer a manifest needs is longer; PyYAML's base-60 integers cost
# quadratic time in their length.
MAX_INT_CHARS = 64

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
class SecretRef:
    name: str
    key: str


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
    # Matched against the whole value (see EVENT_TYPE_PATTERN above).
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
    # The endpoints column whose CHECK constraint and default repeat this
    # rule's bounds and default, the database's backstop (tested to agree).
    column: str | None = None


def walk(value: Any, root: str, *, field: str | None = None) -> Iterator[tuple[str, Any]]:
    """Every value of a JSON-like tree with its path, without recursion.

    Refuses mapping keys that are not strings, text that Postgres cannot store
    (NUL, lone surrogates) and nesting deeper than ``MAX_DEPTH``. Errors name
    ``field`` with the path in the message if given, else the path."""

    def refuse(path: str, problem: str) -> InvalidInput:
        return InvalidInput(field, f"{problem} at {path}") if field else InvalidInput(path, problem)

    stack: list[tuple[str, Any, int]] = [(root, value, 0)]
    while stack:
        path, node, depth = stack.pop()
        if isinstance(node, str) and (problem := _unstorable(node)):
            raise refuse(path, problem)
        if isinstance(node, (dict, list, tuple)) and depth >= MAX_DEPTH:
            raise refuse(path, f"nests deeper than {MAX_DEPTH} levels")
        children: list[tuple[str, Any]] = []
        if isinstance(node, dict):
            for key, child in node.items():
                if not isinstance(key, str):
                    raise refuse(path, f"has a key that is not a string: {shown(key)}")
                if problem := _unstorable(key):
                    raise refuse(path, f"has a key that {problem}")
                children.append((_child(path, key), child))
        elif isinstance(node, (list, tuple)):
            children = [(_join(path, f"[{i}]"), child) for i, child in enumerate(node)]
        yield path, node
        stack.extend((p, c, depth + 1) for p, c in reversed(children))


def _unstorable(text: str) -> str | None:
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    return (
        "contains a NUL character" if found.group() == "\x00" else "contains a lone surrogate (not Unicode)"
    )


def _child(path: str, key: str) -> str:
    if _PLAIN_KEY.fullmatch(key):
        return _join(path, f".{key}" if path else key)
    return _join(path, f"[{shown(key)}]")


def _join(path: str, part: str) -> str:
    # Deep paths are cut, so that a message about them stays short.
    if len(path) >= MAX_PATH_LENGTH:
        return path if path.endswith("...") else f"{path}..."
    return path + part


def check_text(value: Any, field: str, max_length: int) -> str:
    """A required string of 1 to ``max_length`` characters without control
    characters or lone surrogates."""
    if not isinstance(value, str) or not 1 <= len(value) <= max_length:
        raise InvalidInput(field, f"is required: a string of 1 to {max_length} characters")
    if _CONTROL.search(value):
        raise InvalidInput(field, f"must not contain control characters: {shown(value)}")
    return value


def check_tenant(value: Any, field: str) -> str:
    """A tenant, by the same rule as spec.tenant."""
    if value is None:
        raise InvalidInput(field, "is required")
    tenant: str = _checked(SPEC.properties["tenant"], value, field)
    return tenant


def check_name(value: Any, field: str) -> str:
    """A Kubernetes object name (RFC 1123 subdomain)."""
    if not isinstance(value, str) or len(value) > 253 or not _K8S_NAME.fullmatch(value):
        raise InvalidInput(field, f"must be a lowercase DNS-style name (RFC 1123), not {shown(value)}")
    return value


def check_namespace(value: Any, field: str) -> str:
    """A Kubernetes namespace (RFC 1123 label)."""
    if not isinstance(value, str) or len(value) > 63 or not _K8S_NAMESPACE.fullmatch(value):
        raise InvalidInput(
            field, f"must be a lowercase DNS label (RFC 1123, at most 63 characters), not {shown(value)}"
        )
    return value


def check_url(url: Any) -> str:
    """An absolute http(s) URL with a DNS name or an IP address literal. Its
    text is sent and printed as it is, so anything a client or a terminal
    would read otherwise is refused rather than normalised."""
    if not isinstance(url, str) or not url:
        raise InvalidInput("spec.url", "is required and must be a string")
    if len(url) > MAX_URL_LENGTH:
        raise InvalidInput("spec.url", f"is longer than {MAX_URL_LENGTH} characters")
    if " " in url or not url.isprintable():
        raise InvalidInput("spec.url", f"must not contain whitespace or control characters: {shown(url)}")
    try:
        parts = urlsplit(url)
    except ValueError:
        raise InvalidInput("spec.url", f"has a malformed host: {shown(url)}") from None
    if parts.scheme not in ("http", "https") or not url.lower().startswith(f"{parts.scheme}://"):
        raise InvalidInput(
            "spec.url", f"must be an http or https URL like https://host/path, not {shown(url)}"
        )
    if "#" in url:
        raise InvalidInput("spec.url", "must not have a #fragment: it is never sent")
    if "@" in parts.netloc:
        raise InvalidInput(
            "spec.url",
            "must not hold user:password@: it would be sent as Basic auth and shown by `hooklane endpoint list`",
        )
    netloc = _NETLOC.fullmatch(parts.netloc)
    if netloc is None:
        raise InvalidInput("spec.url", f"has a malformed host or port: {shown(parts.netloc)}")
    _check_host(netloc["host"])
    _check_port(netloc["port"])
    return url


def _check_host(host: str) -> None:
    if host.startswith("["):
        address = host[1:-1]
        if "%" in address:
            raise InvalidInput("spec.url", f"must not have an IPv6 zone: {shown(host)}")
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            raise InvalidInput("spec.url", f"has an invalid IPv6 address: {shown(host)}") from None
        return
    if not host:
        raise InvalidInput("spec.url", "has no host")
    if not host.isascii():
        raise InvalidInput(
            "spec.url", f"has a non-ASCII host {shown(host)}: write it in its ASCII (punycode, xn--) form"
        )
    # One trailing dot marks a fully qualified name; aiohttp drops it for TLS.
    labels = host.removesuffix(".").split(".")
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        _check_ipv4(host)
    elif len(host) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
        raise InvalidInput(
            "spec.url",
            f"host {shown(host)} is not a DNS name: labels of 1 to 63 letters, digits and inner hyphens,"
            " 253 characters in all",
        )


def _check_ipv4(host: str) -> None:
    # 127.1, 0x7f.1, 017700000001 and 2130706433 all reach 127.0.0.1; only
    # the dotted-quad form is accepted, so that what is stored is what is
    # reached.
    try:
        canonical = str(ipaddress.IPv4Address(host))
    except ValueError:
        canonical = None
    if canonical != host:
        raise InvalidInput(
            "spec.url", f"host {shown(host)} must be a DNS name or four decimal numbers like 192.0.2.7"
        )


def _check_port(port: str | None) -> None:
    if port is None:
        return
    if not _PORT.fullmatch(port) or not 1 <= int(port) <= 65535:
        raise InvalidInput("spec.url", f"has an invalid port {shown(port)}: a number from 1 to 65535")


SPEC = FieldRule(
    "object",
    required=("url", "tenant", "secretRef"),
    properties={
        "url": FieldRule(
            "string",
            "http(s) URL the deliveries are POSTed to.",
            min_length=1,
            max_length=MAX_URL_LENGTH,
            pattern=_URL_TEXT_PATTERN,
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
            pattern=_NO_CONTROLS_PATTERN,
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
                    pattern=_K8S_NAME_PATTERN,
                    pattern_message="must be a lowercase DNS-style name (RFC 1123)",
                ),
                "key": FieldRule(
                    "string",
                    min_length=1,
                    max_length=253,
                    pattern=_SECRET_KEY_PATTERN,
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
    },
)
_FIELDS = SPEC.properties


@dataclass(frozen=True)
class EndpointSpec:
    namespace: str
    name: str
    url: str
    tenant: str
    secret_ref: SecretRef | None = None
    max_concurrency: int = _FIELDS["maxConcurrency"].default
    event_types: tuple[str, ...] = field(default_factory=tuple)
    timeout_seconds: int = _FIELDS["timeoutSeconds"].default
    paused: bool = _FIELDS["paused"].default


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
            _check_array(rule, value, path)
        case "object":
            return _check_object(rule, value, path)
    if rule.check is not None:
        rule.check(value)
    return value


def _check_string(rule: FieldRule, value: Any, path: str) -> None:
    low, high = rule.min_length or 0, rule.max_length
    if not isinstance(value, str) or len(value) < low or (high is not None and len(value) > high):
        size = f"{low} to {high}" if high is not None else f"at least {low}"
        raise InvalidInput(path, f"must be a string of {size} characters, not {shown(value)}")
    if problem := _unstorable(value):
        raise InvalidInput(path, problem)
    if rule.pattern is not None and not re.fullmatch(rule.pattern, value):
        raise InvalidInput(path, f"{rule.pattern_message}: {shown(value)}")


def _check_integer(rule: FieldRule, value: Any, path: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(path, f"must be an integer, not {shown(value)}")
    if (rule.minimum is not None and value < rule.minimum) or (
        rule.maximum is not None and value > rule.maximum
    ):
        raise InvalidInput(path, f"must be between {rule.minimum} and {rule.maximum}, not {shown(value)}")


def _check_array(rule: FieldRule, value: Any, path: str) -> None:
    if not isinstance(value, list):
        raise InvalidInput(path, f"must be a list, not {shown(value)}")
    if rule.max_items is not None and len(value) > rule.max_items:
        raise InvalidInput(path, f"has more than {rule.max_items} items")
    if rule.items is None:
        return
    for i, item in enumerate(value):
        try:
            _checked(rule.items, item, path)
        except InvalidInput as exc:
            raise InvalidInput(path, f"item {i}: {exc.message}") from None


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
    unknown = sorted(
        k if isinstance(k, str) and _PLAIN_KEY.fullmatch(k) else shown(k) for k in mapping if k not in known
    )
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
        secret_ref=SecretRef(ref["name"], ref["key"]),
        max_concurrency=checked["maxConcurrency"],
        event_types=tuple(checked["eventTypes"] or ()),
        timeout_seconds=checked["timeoutSeconds"],
        paused=checked["paused"],
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


def load_yaml(raw: bytes, source: str) -> Any:
    """One YAML document, without aliases, at most ``MAX_MANIFEST_BYTES``,
    ``MAX_DEPTH`` deep and ``MAX_NODES`` values."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise InvalidInput(source, f"is larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(source, f"is not UTF-8 (byte {exc.start})") from None
    if "\x00" in text:
        raise InvalidInput(source, "contains a NUL character")
    try:
        loader = _BoundedLoader(text, source)
        try:
            return loader.load_single()
        finally:
            loader.dispose()
    except InvalidInput:
        raise
    except yaml.YAMLError as exc:
        raise InvalidInput(source, f"is not valid YAML: {_yaml_problem(exc)}") from None
    except (ValueError, OverflowError) as exc:
        # Constructors raise these for values like 2024-13-45.
        raise InvalidInput(source, f"holds a value YAML cannot read: {printable(str(exc))[:200]}") from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    # Never str(exc): it quotes the document around the problem.
    if isinstance(exc, yaml.reader.ReaderError):
        return f"character #x{exc.character:04x} is not allowed (position {exc.position})"
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"{printable(exc.problem or '')[:200]} (line {mark.line + 1}, column {mark.column + 1})"
    return type(exc).__name__


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader without aliases, and with bounded depth and size: through
    aliases a "billion laughs" file of a few hundred bytes expands to
    gigabytes, and PyYAML composes nested nodes recursively."""

    def __init__(self, text: str, source: str) -> None:
        super().__init__(text)
        self.source = source
        self.depth = 0
        self.nodes = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        # PyYAML's stubs leave the parser's methods untyped.
        event = self.peek_event()  # type: ignore[no-untyped-call]
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent):
            raise InvalidInput(self.source, f"uses a YAML alias (line {line}): aliases are not supported")
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise InvalidInput(self.source, f"has more than {MAX_NODES} values")
        nested = isinstance(event, yaml.CollectionStartEvent)
        if nested and self.depth >= MAX_DEPTH:
            raise InvalidInput(self.source, f"nests deeper than {MAX_DEPTH} levels (line {line})")
        self.depth += nested
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= nested

    def load_single(self) -> Any:
        self.get_event()  # type: ignore[no-untyped-call]
        node = None if self.check_event(yaml.StreamEndEvent) else self.compose_document()
        if not self.check_event(yaml.StreamEndEvent):
            raise InvalidInput(self.source, "holds more than one YAML document: one WebhookEndpoint per file")
        return None if node is None else self.construct_document(node)

    def construct_bounded_int(self, node: yaml.ScalarNode) -> int:
        if len(node.value) > MAX_INT_CHARS:
            raise InvalidInput(self.source, f"has an integer longer than {MAX_INT_CHARS} characters")
        return self.construct_yaml_int(node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_bounded_int)


CRD_PATH = "crds/webhookendpoints.hooklane.io.yaml"
_CRD_HEADER = """\
# WebhookEndpoint: one receiver of a tenant's webhooks (docs/concepts.md; the
# operator's side, status and Events in docs/operator.md). The API server
# validates every spec field, so a bad manifest is refused at `kubectl apply`
# instead of surfacing later as a stuck delivery queue.
# Generated from hooklane/manifest.py by hack/gen-crd: edit the rules there,
# not this file.
"""

_PRINTER_COLUMNS = [
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
        "metadata": {"name": "webhookendpoints.hooklane.io"},
        "spec": {
            "group": API_VERSION.split("/")[0],
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": "webhookendpoints",
                "singular": "webhookendpoint",
                "shortNames": ["whe"],
                "categories": ["hooklane"],
            },
            "versions": [
                {
                    "name": API_VERSION.split("/")[1],
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": _PRINTER_COLUMNS,
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
