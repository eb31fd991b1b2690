"""Checks of the text and trees that come in: a manifest's values, an
event's type, tenant and data, the CLI's and the API's arguments.

Each check returns the value it was given or raises ``InvalidInput`` naming
the field, so that a caller checks and assigns in one line."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from hooklane.errors import InvalidInput, shown

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
K8S_NAME_PATTERN = rf"{_DNS_LABEL}(\.{_DNS_LABEL})*"
_K8S_NAME = re.compile(K8S_NAME_PATTERN)
_K8S_NAMESPACE = re.compile(_DNS_LABEL)
# The keys of a Secret's data, as Kubernetes has them.
SECRET_KEY_PATTERN = r"[-._a-zA-Z0-9]+"
# Text that is stored, matched exactly and printed by the CLI must not hold C0
# or C1 controls (\t, \n, \r, ESC and DEL among them), nor lone surrogates,
# which have no UTF-8 form and so cannot be stored at all (the API server's
# JSON cannot carry them, so the shared pattern leaves them to _UNSTORABLE).
NO_CONTROLS_PATTERN = r"[^\x00-\x1f\x7f-\x9f]+"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
# What check_url refuses that a pattern can say: whitespace, controls, "#".
URL_TEXT_PATTERN = r"[^\x00-\x20\x7f-\x9f#]+"
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
# Bounds on any input tree (a manifest, an event's data), so that checking it
# costs bounded time and stack whatever it holds. A real manifest has a few
# dozen values, a few hundred with the server's managedFields.
MAX_DEPTH = 64
MAX_NODES = 10_000
MAX_PATH_LENGTH = 100


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
        if isinstance(node, str) and (problem := unstorable(node)):
            raise refuse(path, problem)
        if isinstance(node, (dict, list, tuple)) and depth >= MAX_DEPTH:
            raise refuse(path, f"nests deeper than {MAX_DEPTH} levels")
        children: list[tuple[str, Any]] = []
        if isinstance(node, dict):
            for key, child in node.items():
                if not isinstance(key, str):
                    raise refuse(path, f"has a key that is not a string: {shown(key)}")
                if problem := unstorable(key):
                    raise refuse(path, f"has a key that {problem}")
                children.append((_child(path, key), child))
        elif isinstance(node, (list, tuple)):
            children = [(_join(path, f"[{i}]"), child) for i, child in enumerate(node)]
        yield path, node
        stack.extend((p, c, depth + 1) for p, c in reversed(children))


def unstorable(text: str) -> str | None:
    """What makes ``text`` impossible to store in Postgres, None when nothing."""
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    return (
        "contains a NUL character" if found.group() == "\x00" else "contains a lone surrogate (not Unicode)"
    )


def shown_key(key: Any) -> str:
    """A mapping key as a message names it: bare when plain, else quoted."""
    return key if isinstance(key, str) and _PLAIN_KEY.fullmatch(key) else shown(key)


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
