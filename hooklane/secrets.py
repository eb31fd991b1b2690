"""Signing secrets at rest: sealed with AES-256-GCM under a key that only
Hooklane's processes hold (``HOOKLANE_ENCRYPTION_KEY``), never Postgres.

``HOOKLANE_ENCRYPTION_KEY`` is ``KID:BASE64[,KID:BASE64...]``: key ids with
32-byte keys. The first seals; every one of them opens, so that the key can
be rotated (docs/security.md). A sealed value is
``enc:v1:<kid>:<base64(nonce | ciphertext | tag)>``, bound to the endpoint it
belongs to: copied onto another endpoint's row, it does not open.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from hooklane.errors import InvalidInput

VARIABLE = "HOOKLANE_ENCRYPTION_KEY"
# How long a replaced signing secret still signs, next to the new one.
DEFAULT_GRACE_SECONDS = 24 * 3600.0

_PREFIX = "enc:v1:"
_KID = re.compile(r"[A-Za-z0-9_-]{1,32}")
_KEY_BYTES = 32
_NONCE_BYTES = 12


@dataclass(frozen=True)
class Keyring:
    """Keys by id; ``active`` seals. Never prints a key."""

    keys: dict[str, bytes] = field(repr=False)
    active: str

    @classmethod
    def parse(cls, value: str) -> Keyring:
        """Read ``HOOKLANE_ENCRYPTION_KEY``. ``InvalidInput`` names the
        variable and the entry at fault by position or key id, never by its
        key, so that the message may be logged."""
        keys: dict[str, bytes] = {}
        for position, entry in enumerate(value.split(","), start=1):
            kid, sep, encoded = entry.strip().partition(":")
            if not sep or not _KID.fullmatch(kid):
                raise InvalidInput(
                    VARIABLE,
                    f"entry {position} must be KEY_ID:BASE64, the key id 1 to 32 letters, digits, _ or -",
                )
            if kid in keys:
                raise InvalidInput(VARIABLE, f"key id {kid} appears twice")
            try:
                key = base64.b64decode(encoded.strip(), validate=True)
            except binascii.Error:
                raise InvalidInput(VARIABLE, f"the key of {kid} is not valid base64") from None
            if len(key) != _KEY_BYTES:
                raise InvalidInput(
                    VARIABLE, f"the key of {kid} must be {_KEY_BYTES} bytes (AES-256), not {len(key)}"
                )
            keys[kid] = key
        return cls(keys, next(iter(keys)))

    @property
    def sealed_prefix(self) -> str:
        """How every value sealed with the active key starts."""
        return f"{_PREFIX}{self.active}:"

    def seal(self, plaintext: str, owner: str) -> str:
        nonce = os.urandom(_NONCE_BYTES)
        sealed = AESGCM(self.keys[self.active]).encrypt(nonce, plaintext.encode(), _aad(owner))
        return self.sealed_prefix + base64.b64encode(nonce + sealed).decode()


def owner(namespace: str, name: str) -> str:
    """What a sealed secret is bound to: its endpoint's identity."""
    return f"{namespace}/{name}"


def terms_owner(namespace: str, name: str) -> str:
    """What an endpoint's sealed request terms are bound to: not its
    signing secret's binding, so that neither opens in the other's place."""
    return f"{namespace}/{name} request terms"


def seal(keyring: Keyring | None, plaintext: str, owner: str) -> str:
    """The secret as stored: sealed when there is a key, as is otherwise."""
    return plaintext if keyring is None else keyring.seal(plaintext, owner)


def unseal(keyring: Keyring | None, stored: str, owner: str) -> str:
    """The secret of a stored value. Values stored before a key was set
    pass through as they are, until `hooklane migrate` seals them."""
    if not stored.startswith(_PREFIX):
        return stored
    kid, _, encoded = stored[len(_PREFIX) :].partition(":")
    if keyring is None:
        raise InvalidInput(
            VARIABLE, f"is not set, but the signing secret of {owner} is encrypted (key id {kid})"
        )
    key = keyring.keys.get(kid)
    if key is None:
        raise InvalidInput(
            VARIABLE, f"has no key id {kid}, which the signing secret of {owner} is encrypted with"
        )
    try:
        raw = base64.b64decode(encoded, validate=True)
        return AESGCM(key).decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], _aad(owner)).decode()
    except (binascii.Error, InvalidTag, ValueError):
        raise InvalidInput(
            VARIABLE,
            f"key id {kid} does not open the signing secret of {owner}: "
            "another key under that id, or a value altered or copied from another endpoint",
        ) from None


def _aad(owner: str) -> bytes:
    return b"hooklane endpoint secret v1:" + owner.encode()
