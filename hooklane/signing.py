"""Standard Webhooks signing (https://www.standardwebhooks.com/).

The signed content is ``{webhook-id}.{webhook-timestamp}.{body}``; the
signature is ``v1,`` + base64(HMAC-SHA256(key, content)), where the key is the
base64 part of a ``whsec_`` secret.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Sequence

from hooklane.errors import InvalidInput

SECRET_PREFIX = "whsec_"
# Standard Webhooks asks for 24 to 64 random bytes.
_MIN_KEY_BYTES = 24
_MAX_KEY_BYTES = 64


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
