"""What tests/db/test_secrets.py, tests/processes/test_secrets.py and
tests/unit/test_secrets.py share."""

from __future__ import annotations

import base64
import os

from hooklane import store
from hooklane.secrets import Keyring
from hooklane.spec import EndpointSpec


def whsec() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


def random_key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


OLD, NEW = whsec(), whsec()


K1, K2 = random_key(), random_key()


RING1 = Keyring.parse(f"k1:{K1}")


RING21 = Keyring.parse(f"k2:{K2},k1:{K1}")


RING2 = Keyring.parse(f"k2:{K2}")


async def upsert_with_secret(
    db, name: str, url: str, secret: str | None, keyring: Keyring | None, grace: float = 86400.0
):
    spec = EndpointSpec(namespace="default", name=name, url=url, tenant="acme")
    return await store.upsert_endpoint(db, spec, secret, keyring=keyring, grace_seconds=grace)
