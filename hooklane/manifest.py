"""The ``WebhookEndpoint`` manifest: parsed and checked by the same rules as
the CRD's schema, for local mode (``hooklane endpoint apply``) and the
operator alike."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import yaml

from hooklane.errors import InvalidInput, printable, shown

API_VERSION = "hooklane.io/v1alpha1"
KIND = "WebhookEndpoint"

# Patterns that check a whole value are used with fullmatch: "^...$" also
# matches before a trailing newline, and a value accepted so fails every
# delivery later, at aiohttp's header-injection check.
# A dotted event type, optionally ending in ".*" (a whole trailing part), or "*".
EVENT_TYPE_PATTERN = re.compile(r"\*|[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*(\.\*)?")
EVENT_TYPE = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
# Kubernetes object names (RFC 1123 subdomain) and namespaces (RFC 1123 label).
_K8S_NAME = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_K8S_NAMESPACE = re.compile(_DNS_LABEL)
# The keys of a Secret's data, as the CRD's secretRef.key pattern has them.
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
# Text that is stored, matched exactly and printed by the CLI must not hold C0
# or C1 controls (\t, \n, \r, ESC and DEL among them), nor lone surrogates,
# which have no UTF-8 form and so cannot be stored at all.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
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
MAX_EVENT_TYPES = 64
MAX_EVENT_TYPE_LENGTH = 255
MAX_TENANT_LENGTH = 253
CONCURRENCY_RANGE = (1, 256)
TIMEOUT_RANGE = (1, 60)
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
_SPEC = frozenset({"url", "tenant", "secretRef", "maxConcurrency", "eventTypes", "timeoutSeconds", "paused"})
_SECRET_REF = frozenset({"name", "key"})


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
    return check_text(value, field, MAX_TENANT_LENGTH)


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


def _int_in(value: Any, path: str, bounds: tuple[int, int], default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(path, f"must be an integer, not {shown(value)}")
    low, high = bounds
    if not low <= value <= high:
        raise InvalidInput(path, f"must be between {low} and {high}, not {shown(value)}")
    return value


def _event_types(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidInput("spec.eventTypes", "must be a list of patterns")
    if len(value) > MAX_EVENT_TYPES:
        raise InvalidInput("spec.eventTypes", f"has more than {MAX_EVENT_TYPES} patterns")
    for pattern in value:
        if (
            not isinstance(pattern, str)
            or len(pattern) > MAX_EVENT_TYPE_LENGTH
            or not EVENT_TYPE_PATTERN.fullmatch(pattern)
        ):
            raise InvalidInput(
                "spec.eventTypes",
                f"{shown(pattern)} is not a pattern like 'order.created', 'order.*' or '*'"
                f" of at most {MAX_EVENT_TYPE_LENGTH} characters",
            )
    return tuple(value)


def _secret_ref(value: Any) -> SecretRef | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidInput("spec.secretRef", "must be a mapping with name and key")
    _refuse_unknown(value, "spec.secretRef", _SECRET_REF)
    name = check_name(value.get("name"), "spec.secretRef.name")
    key = value.get("key")
    if not isinstance(key, str) or len(key) > 253 or not _SECRET_KEY.fullmatch(key):
        raise InvalidInput(
            "spec.secretRef.key", f"must be 1 to 253 letters, digits and '-._', not {shown(key)}"
        )
    return SecretRef(name, key)


def _refuse_unknown(mapping: dict, path: str, known: frozenset[str]) -> None:
    unknown = sorted(
        k if isinstance(k, str) and _PLAIN_KEY.fullmatch(k) else shown(k) for k in mapping if k not in known
    )
    if unknown:
        raise InvalidInput(
            path, f"unknown field(s): {', '.join(unknown[:5])} (known: {', '.join(sorted(known))})"
        )


def parse_spec(namespace: str, name: str, spec: Any) -> EndpointSpec:
    """Check a ``spec`` mapping; ``InvalidInput`` names the first bad field."""
    if not isinstance(spec, dict):
        raise InvalidInput("spec", "is required and must be a mapping")
    _refuse_unknown(spec, "spec", _SPEC)
    tenant = check_tenant(spec.get("tenant"), "spec.tenant")
    secret_ref = _secret_ref(spec.get("secretRef"))
    paused = spec.get("paused", False)
    if not isinstance(paused, bool):
        raise InvalidInput("spec.paused", f"must be true or false, not {shown(paused)}")
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

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
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
        self.get_event()
        node = None if self.check_event(yaml.StreamEndEvent) else self.compose_document()
        if not self.check_event(yaml.StreamEndEvent):
            raise InvalidInput(self.source, "holds more than one YAML document: one WebhookEndpoint per file")
        return None if node is None else self.construct_document(node)

    def construct_bounded_int(self, node: yaml.ScalarNode) -> int:
        if len(node.value) > MAX_INT_CHARS:
            raise InvalidInput(self.source, f"has an integer longer than {MAX_INT_CHARS} characters")
        return self.construct_yaml_int(node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_bounded_int)
