"""Standard Webhooks signing (https://www.standardwebhooks.com/): the
body a receiver gets, the headers it comes with, and their signature.

The signed content is ``{webhook-id}.{webhook-timestamp}.{body}``; the
signature is ``v1,`` + base64(HMAC-SHA256(key, content)), where the key is the
base64 part of a ``whsec_`` secret.

The worker sends what :func:`event_body` and :func:`request_headers` make,
and the delivery pages show what they make of the stored event: one
definition, so that what a person reads is what the receiver got.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from hooklane.errors import InvalidInput

SECRET_PREFIX = "whsec_"
# Standard Webhooks asks for 24 to 64 random bytes.
_MIN_KEY_BYTES = 24
_MAX_KEY_BYTES = 64
# No version: telling receivers which release runs tells an attacker which
# known flaws to try.
USER_AGENT = "Hooklane"
CONTENT_TYPE = "application/json"


def event_body(event_id: str, event_type: str, created_at: datetime, data_json: str) -> bytes:
    """The JSON body a receiver gets. ``data_json`` is already JSON text from
    Postgres and is spliced in as is rather than parsed and dumped again."""
    timestamp = created_at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return (
        f'{{"id":{json.dumps(event_id)},"type":{json.dumps(event_type)},"timestamp":{json.dumps(timestamp)},"data":{data_json}}}'
    ).encode()


def request_headers(
    extra: Iterable[tuple[str, str]],
    msg_id: str,
    timestamp: int,
    signature: str,
    traceparent: str | None,
    ordering: tuple[str, int] | None = None,
) -> dict[str, str]:
    """The headers of one delivery's request beyond ``User-Agent`` and
    ``Content-Type`` (every request's): the endpoint's ``extra`` ones first
    (which cannot name any of these), then the signature's, the trace
    context when there is one, and an ordered delivery's key and number
    (``ordering``). Like the trace context, the last two are outside the
    signature, which Standard Webhooks defines over id, timestamp and body."""
    headers = {
        **dict(extra),
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature,
    }
    if traceparent is not None:
        headers["traceparent"] = traceparent
    if ordering is not None:
        headers["hooklane-ordering-key"], sequence = ordering
        headers["hooklane-ordering-sequence"] = str(sequence)
    return headers


def parse_secret(secret: str) -> bytes:
    """The HMAC key of a ``whsec_`` secret; ``InvalidInput`` if malformed."""
    secret = secret.strip()
    if not secret.startswith(SECRET_PREFIX):
        raise InvalidInput("secret", f"must start with {SECRET_PREFIX!r}")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    except binascii.Error:
        raise InvalidInput("secret", "the part after whsec_ is not valid base64") from None
    if not _MIN_KEY_BYTES <= len(key) <= _MAX_KEY_BYTES:
        raise InvalidInput(
            "secret", f"must encode {_MIN_KEY_BYTES} to {_MAX_KEY_BYTES} bytes, not {len(key)}"
        )
    return key


def sign(key: bytes | Sequence[bytes], msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value for one delivery: with several
    keys (a secret being rotated), one signature per key, space-separated,
    of which a receiver's verifier accepts any."""
    keys = [key] if isinstance(key, bytes) else key
    content = b"%s.%d.%s" % (msg_id.encode(), timestamp, body)
    return " ".join(
        "v1," + base64.b64encode(hmac.new(k, content, hashlib.sha256).digest()).decode() for k in keys
    )
