"""An endpoint's own delivery terms (``spec.delivery``): its rate limit,
adaptive concurrency, extra request headers, TLS trust and client
certificate, and retry limits. Pure: the rules of each field, and the
resolution of the Secrets they name into the terms a worker sends with.

The headers and TLS material are resolved from Secrets by whoever reads the
spec (the operator from its index, ``hooklane endpoint apply`` from a
secrets file) and stored sealed, like the signing secret: the workers never
read a Secret, and a rotation takes effect with the next upsert."""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from hooklane.errors import InvalidInput, shown
from hooklane.tls import TlsMaterialError, client_context

# RFC 9110's token, the only characters a field name may hold.
HEADER_NAME_PATTERN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
# Visible ASCII, with spaces and tabs inside but not at either end (RFC 9110
# field values, without obsolete folding or bytes beyond ASCII): what every
# HTTP stack sends as given. A CR or LF would split the request.
HEADER_VALUE_PATTERN = r"[\x21-\x7e]([\x20-\x7e\t]*[\x21-\x7e])?"
_HEADER_VALUE = re.compile(HEADER_VALUE_PATTERN)
MAX_HEADER_VALUE = 4096
MAX_HEADERS = 32
# Headers a tenant's endpoint may not set: those of the connection itself
# (hop-by-hop, RFC 9110 section 7.6.1), those that describe the body Hooklane
# sends, and the signature's, which a receiver must be able to trust.
REFUSED_HEADERS = (
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-type",
    "content-length",
    "content-encoding",
    # 100-continue would hold the body until the receiver answers a
    # first response that most never send: a timeout on every delivery.
    "expect",
    # The trace context is Hooklane's to write (hooklane/tracing.py), and so
    # is the User-Agent, which names no version (docs/security.md).
    "traceparent",
    "tracestate",
    "user-agent",
    # An ordered delivery's key and number (docs/receivers.md).
    "hooklane-ordering-key",
    "hooklane-ordering-sequence",
)
REFUSED_HEADER_PREFIX = "webhook-"
REFUSED_HEADERS_TEXT = (
    "hop-by-hop headers, Host, Content-Type, Content-Length, Content-Encoding, Expect, User-Agent, the trace"
    " context (traceparent, tracestate), the ordering headers (hooklane-ordering-key, hooklane-ordering-sequence)"
    " and the webhook-* signature headers are Hooklane's"
)

# A duration as Kubernetes writes one (metav1.Duration: "72h", "1h30m",
# "90s"), in hours, minutes and seconds only.
DURATION_PATTERN = r"([0-9]{1,6}([.][0-9]{1,6})?(h|m|s))+"
_DURATION_PART = re.compile(r"([0-9]{1,6}(?:\.[0-9]{1,6})?)(h|m|s)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0}
MAX_AGE_SECONDS = 72 * 3600.0
MAX_ATTEMPTS = 20

# The Secret keys a kubernetes.io/tls Secret holds, and a CA's usual one.
TLS_CERT_KEY = "tls.crt"
TLS_KEY_KEY = "tls.key"
CA_KEY = "ca.crt"
# A CA bundle of a few hundred certificates; a value beyond is not one.
MAX_PEM_CHARS = 256 * 1024


@dataclass(frozen=True)
class SecretKeyRef:
    """A key of a Secret in the endpoint's namespace: its signing secret's
    (spec.secretRef), a header's, a CA's."""

    name: str
    key: str


@dataclass(frozen=True)
class HeaderSpec:
    """A header as the spec gives it: a value, or a Secret's key holding it."""

    name: str
    value: str | None = None
    secret: SecretKeyRef | None = None


@dataclass(frozen=True)
class TlsSpec:
    ca: SecretKeyRef | None = None
    # The name of a kubernetes.io/tls Secret (tls.crt, tls.key).
    client_certificate: str | None = None
    server_name: str | None = None


@dataclass(frozen=True)
class DeliverySpec:
    """``spec.delivery``; every field left out keeps the default behaviour."""

    rate_per_second: int | None = None
    burst: int = 1
    adaptive: bool = False
    headers: tuple[HeaderSpec, ...] = ()
    tls: TlsSpec | None = None
    max_attempts: int | None = None
    max_age_seconds: float | None = None

    def secret_names(self) -> frozenset[str]:
        """Every Secret these terms read (a change to one re-reads them)."""
        names = {h.secret.name for h in self.headers if h.secret is not None}
        if self.tls is not None:
            if self.tls.ca is not None:
                names.add(self.tls.ca.name)
            if self.tls.client_certificate is not None:
                names.add(self.tls.client_certificate)
        return frozenset(names)


@dataclass(frozen=True)
class RequestTerms:
    """What a worker sends with, resolved from the spec and its Secrets:
    stored sealed in the endpoint's row (``to_json``), never shown."""

    headers: tuple[tuple[str, str], ...] = ()
    ca_pem: str | None = None
    cert_pem: str | None = None
    key_pem: str | None = None
    server_name: str | None = None
    # The names of the headers whose values were read from a Secret, which
    # the delivery pages hide; None for terms stored before they were kept,
    # of which every value is hidden.
    secret_headers: tuple[str, ...] | None = ()

    def __repr__(self) -> str:
        # Header values and keys are credentials: a traceback's locals or a
        # debug line must not print them.
        return (
            f"RequestTerms(headers={[name for name, _ in self.headers]}, ca={self.ca_pem is not None},"
            f" client_certificate={self.cert_pem is not None}, server_name={self.server_name!r})"
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "headers": [list(h) for h in self.headers],
                "ca": self.ca_pem,
                "cert": self.cert_pem,
                "key": self.key_pem,
                "server_name": self.server_name,
                "secret_headers": None if self.secret_headers is None else list(self.secret_headers),
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> RequestTerms:
        """The terms as stored; ``InvalidInput`` for anything else, so that a
        row changed by hand fails its deliveries with a clear error."""
        try:
            doc = json.loads(text)
            secret = doc.get("secret_headers")
            return cls(
                tuple((str(n), str(v)) for n, v in doc["headers"]),
                doc["ca"],
                doc["cert"],
                doc["key"],
                doc["server_name"],
                None if secret is None else tuple(str(n) for n in secret),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InvalidInput("request terms", f"are not stored as Hooklane stores them: {exc}") from None

    @property
    def tls(self) -> bool:
        return any((self.ca_pem, self.cert_pem, self.server_name))


def check_header_name(name: str) -> str:
    """A header name a spec may set (the pattern is the schema's)."""
    lowered = name.lower()
    if lowered in REFUSED_HEADERS or lowered.startswith(REFUSED_HEADER_PREFIX):
        raise InvalidInput(
            "",
            f"{shown(name)} may not be set: {REFUSED_HEADERS_TEXT}",
        )
    return name


def check_headers(headers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each header sets exactly one of value and valueFrom, and no name
    twice (in any case)."""
    seen: set[str] = set()
    for i, header in enumerate(headers):
        if (header.get("value") is None) == (header.get("valueFrom") is None):
            raise InvalidInput("", f"item {i}: must set exactly one of value and valueFrom")
        lowered = header["name"].lower()
        if lowered in seen:
            raise InvalidInput("", f"item {i}: sets {shown(header['name'])} a second time")
        seen.add(lowered)
    return headers


def parse_duration(text: str) -> float:
    """Seconds of a duration matched by ``DURATION_PATTERN``."""
    return sum(float(n) * _UNIT_SECONDS[unit] for n, unit in _DURATION_PART.findall(text))


def check_max_age(text: str) -> str:
    seconds = parse_duration(text)
    if not 1 <= seconds <= MAX_AGE_SECONDS:
        raise InvalidInput("", f"must be between 1s and 72h, not {shown(text)}")
    return text


class SecretProblem(Exception):
    """A Secret the terms name is missing (``missing``) or holds something
    else than they need; the message names the field and the Secret."""

    def __init__(self, message: str, *, missing: bool) -> None:
        super().__init__(message)
        self.message = message
        self.missing = missing


# A Secret's values by key (None: present but not text Hooklane keeps), or
# None when the Secret does not exist.
SecretLookup = Callable[[str], Mapping[str, str | None] | None]


def resolve(delivery: DeliverySpec, namespace: str, lookup: SecretLookup) -> RequestTerms | None:
    """The request terms of ``delivery``, read from the Secrets ``lookup``
    finds; None when it sets no header and no TLS. Raises ``SecretProblem``."""
    if not delivery.headers and delivery.tls is None:
        return None
    headers = []
    secret_headers = []
    for i, header in enumerate(delivery.headers):
        value = header.value
        if header.secret is not None:
            secret_headers.append(header.name)
            field = f"spec.delivery.headers[{i}].valueFrom.secretKeyRef"
            value = _value(lookup, namespace, header.secret, field, _HEADER_TEXT)
            if len(value) > MAX_HEADER_VALUE or not _HEADER_VALUE.fullmatch(value):
                raise SecretProblem(
                    f"{field}: key {header.secret.key!r} of Secret {namespace}/{header.secret.name} is not a"
                    f" header value (visible ASCII, at most {MAX_HEADER_VALUE} characters, no line breaks)",
                    missing=False,
                )
        assert value is not None, "the schema requires value or valueFrom"
        headers.append((header.name, value))
    tls = delivery.tls or TlsSpec()
    ca = cert = key = None
    # Where each part of the material comes from, for OpenSSL's refusal.
    where: dict[str, str] = {}
    if tls.ca is not None:
        field = "spec.delivery.tls.caSecretRef"
        where["ca"] = f"{field}: key {tls.ca.key!r} of Secret {namespace}/{tls.ca.name}"
        ca = _value(lookup, namespace, tls.ca, field, _PEM_TEXT)
        _certificates(ca, where["ca"])
    if tls.client_certificate is not None:
        field = "spec.delivery.tls.clientCertificateSecretRef"
        where["client_certificate"] = f"{field}: Secret {namespace}/{tls.client_certificate}"
        cert = _value(lookup, namespace, SecretKeyRef(tls.client_certificate, TLS_CERT_KEY), field, _PEM_TEXT)
        key = _value(lookup, namespace, SecretKeyRef(tls.client_certificate, TLS_KEY_KEY), field, _PEM_TEXT)
        _key_pair(cert, key, where["client_certificate"])
    if refused := _openssl_refusal(ca, cert, key):
        raise SecretProblem(f"{where[refused.part]} is refused by OpenSSL: {refused.reason}", missing=False)
    return RequestTerms(tuple(headers), ca, cert, key, tls.server_name, tuple(secret_headers))


_HEADER_TEXT = f"a header value (visible ASCII on one line, at most {MAX_HEADER_VALUE} characters)"
_PEM_TEXT = f"PEM text (at most {MAX_PEM_CHARS // 1024} KiB)"


def _value(lookup: SecretLookup, namespace: str, ref: SecretKeyRef, field: str, wanted: str) -> str:
    """The text of ``ref``; ``wanted`` says what it should be, for the
    error when it is there but not text Hooklane keeps."""
    where = f"Secret {namespace}/{ref.name}"
    values = lookup(ref.name)
    if values is None:
        raise SecretProblem(f"{field}: {where} not found; nothing is delivered until it exists", missing=True)
    if ref.key not in values:
        raise SecretProblem(
            f"{field}: {where} has no key {ref.key!r}; nothing is delivered until it does", missing=True
        )
    value = values[ref.key]
    if value is None:
        raise SecretProblem(f"{field}: key {ref.key!r} of {where} is not {wanted}", missing=False)
    return value


@functools.lru_cache(maxsize=256)
def _openssl_refusal(ca: str | None, cert: str | None, key: str | None) -> TlsMaterialError | None:
    """Whether OpenSSL takes the material, as the worker will build it.
    Kept by value: endpoints often share one Secret, and an operator's start
    resolves every endpoint (a context with a client certificate is some
    2 ms to build)."""
    try:
        client_context(ca, cert, key)
    except TlsMaterialError as exc:
        return exc
    return None


# What cryptography raises for material it cannot read: a malformed
# encoding, a key of an algorithm it does not know (SM2), a certificate
# whose public key is not a valid point.
_UNREADABLE = (ValueError, TypeError, UnsupportedAlgorithm)


def _certificates(pem: str, where: str) -> list[x509.Certificate]:
    try:
        found = x509.load_pem_x509_certificates(pem.encode())
    except _UNREADABLE:
        found = []
    if not found:
        raise SecretProblem(f"{where} holds no PEM certificate", missing=False)
    # cryptography passes over a block it cannot read (a bundle cut off in
    # its last certificate): trusting the rest would fail later, and
    # quietly, for whichever receiver that one was for.
    begun = pem.count("-----BEGIN CERTIFICATE-----")
    if begun != len(found):
        raise SecretProblem(
            f"{where} holds {begun} PEM certificates, of which {begun - len(found)} cannot be read"
            " (cut off or corrupt)",
            missing=False,
        )
    return found


def _key_pair(cert_pem: str, key_pem: str, where: str) -> None:
    leaf = _certificates(cert_pem, f"{where}, key {TLS_CERT_KEY!r},")[0]
    try:
        key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    except _UNREADABLE:
        raise SecretProblem(
            f"{where}, key {TLS_KEY_KEY!r}, holds no unencrypted PEM private key", missing=False
        ) from None
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    try:
        matches = key.public_key().public_bytes(
            serialization.Encoding.DER, spki
        ) == leaf.public_key().public_bytes(serialization.Encoding.DER, spki)
    except _UNREADABLE:
        raise SecretProblem(
            f"{where}, key {TLS_CERT_KEY!r}, holds a certificate whose public key cannot be read",
            missing=False,
        ) from None
    if not matches:
        raise SecretProblem(
            f"{where}: {TLS_KEY_KEY!r} is not the key of the certificate in {TLS_CERT_KEY!r}", missing=False
        )


def secrets_of(documents: list[Any], namespace: str, source: str) -> dict[str, dict[str, str]]:
    """The Secrets of a stream of ``v1`` Secret manifests (as ``kubectl
    create secret ... -o yaml`` writes them) in ``namespace``, by name: each
    key's text from ``data`` (base64) or ``stringData``. What ``hooklane
    endpoint apply --secrets-file`` resolves spec.delivery's references in."""
    found: dict[str, dict[str, str]] = {}
    for i, doc in enumerate(documents):
        where = f"{source}: document {i + 1}"
        if doc is None:
            continue
        if not isinstance(doc, dict) or doc.get("apiVersion") != "v1" or doc.get("kind") != "Secret":
            raise InvalidInput(where, "must be a v1 Secret")
        metadata = doc.get("metadata")
        if not isinstance(metadata, dict):
            raise InvalidInput(where, "has no metadata")
        name = metadata.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidInput(where, "has no metadata.name")
        if (metadata.get("namespace") or namespace) != namespace:
            continue
        values: dict[str, str] = {}
        for field, encoded in (("data", True), ("stringData", False)):
            given = doc.get(field) or {}
            if not isinstance(given, dict):
                raise InvalidInput(f"{where}, {field}", "must be a mapping of keys to values")
            for key, value in given.items():
                if not isinstance(key, str) or not isinstance(value, str):
                    raise InvalidInput(f"{where}, {field}", f"key {shown(key)} must map to a string")
                try:
                    text = base64.b64decode(value, validate=True).decode() if encoded else value
                except (binascii.Error, UnicodeDecodeError):
                    raise InvalidInput(
                        f"{where}, {field}", f"key {shown(key)} is not base64 of UTF-8 text"
                    ) from None
                values[key] = text.strip()
        found[name] = values
    return found
