"""Signing secrets and the encryption key without a database: a bad key
stops the process naming the variable, settings never print it, and a
sealed secret opens only for its own endpoint and key."""

from __future__ import annotations

import base64
import re

import pytest

from hooklane.errors import InvalidInput
from hooklane.secrets import Keyring, seal, unseal
from hooklane.settings import Settings
from testsupport.secrets import K1, K2, NEW, RING1, RING2, RING21


@pytest.mark.parametrize(
    "value, message",
    [
        ("", "entry 1 must be KEY_ID:BASE64"),
        (K1, "entry 1 must be KEY_ID:BASE64"),
        (f"k1:{K1},k 2:{K2}", "entry 2 must be KEY_ID:BASE64"),
        (f"k1:{K1},k1:{K2}", "key id k1 appears twice"),
        ("k1:not base64!", "the key of k1 is not valid base64"),
        ("k1:" + base64.b64encode(b"x" * 16).decode(), "the key of k1 must be 32 bytes (AES-256), not 16"),
    ],
    ids=["empty", "no-id", "bad-id", "twice", "not-base64", "short"],
)
def test_a_bad_key_stops_the_process_naming_the_variable_never_the_key(value, message):
    with pytest.raises(InvalidInput) as refused:
        Settings.from_env({"HOOKLANE_ENCRYPTION_KEY": value})
    assert str(refused.value).startswith(f"HOOKLANE_ENCRYPTION_KEY: {message}")
    assert K1 not in str(refused.value) and K2 not in str(refused.value)


def test_settings_never_print_the_key():
    settings = Settings.from_env(
        {"HOOKLANE_ENCRYPTION_KEY": f"k2:{K2},k1:{K1}", "HOOKLANE_SECRET_GRACE_SECONDS": "60"}
    )
    assert settings.encryption_key.active == "k2" and settings.secret_grace_seconds == 60
    for text in (repr(settings), str(settings), repr(settings.encryption_key)):
        assert K1 not in text and K2 not in text and "Keyring(active='k2')" in text
    with pytest.raises(InvalidInput, match="HOOKLANE_SECRET_GRACE_SECONDS"):
        Settings.from_env({"HOOKLANE_SECRET_GRACE_SECONDS": "0"})


def test_sealed_secrets_open_only_for_their_own_endpoint_and_key():
    sealed = RING1.seal(NEW, "default/a")
    assert sealed.startswith("enc:v1:k1:") and NEW not in sealed
    assert sealed != RING1.seal(NEW, "default/a")  # a fresh nonce each time
    assert unseal(RING1, sealed, "default/a") == unseal(RING21, sealed, "default/a") == NEW
    refusals = [
        (RING1, sealed, "default/b", "does not open the signing secret of default/b"),
        (RING2, sealed, "default/a", "has no key id k1"),
        (
            None,
            sealed,
            "default/a",
            "is not set, but the signing secret of default/a is encrypted (key id k1)",
        ),
        (Keyring.parse(f"k1:{K2}"), sealed, "default/a", "key id k1 does not open"),
        (RING1, sealed[:-6] + "AAAAAA", "default/a", "does not open"),
        (RING1, "enc:v1:k1:%%%", "default/a", "does not open"),
    ]
    for keyring, stored, owner, message in refusals:
        with pytest.raises(InvalidInput, match=re.escape(message)) as refused:
            unseal(keyring, stored, owner)
        assert refused.value.field == "HOOKLANE_ENCRYPTION_KEY"
    # stored before a key was set: read as it is
    assert unseal(RING1, NEW, "default/a") == unseal(None, NEW, "default/a") == NEW
    assert seal(None, NEW, "default/a") == NEW
