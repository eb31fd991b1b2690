"""What tests/db/test_delivery_terms.py,
tests/processes/test_delivery_terms.py and
tests/unit/test_delivery_terms.py share."""

from __future__ import annotations

import base64
import os
import ssl
from collections.abc import Mapping
from pathlib import Path

from hooklane.delivery import DeliverySpec, RequestTerms, resolve
from hooklane.secrets import Keyring
from testsupport import certs

KEYRING = Keyring.parse("k1:" + base64.b64encode(b"\x11" * 32).decode())


def terms(delivery: DeliverySpec, secrets: Mapping[str, Mapping[str, str | None]]) -> RequestTerms | None:
    return resolve(delivery, "default", secrets.get)


CA = certs.Authority()


CLIENT = certs.client(CA)


SECRETS = {"ca": {"ca.crt": CA.pem}, "client": {"tls.crt": CLIENT.cert, "tls.key": CLIENT.key}}


def server_context(tmp_path: Path, pem: certs.Pem, *, clients_of: certs.Authority | None) -> ssl.SSLContext:
    """A receiver's context, requiring a client certificate signed by
    ``clients_of`` when given."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    cert.write_text(pem.cert)
    key.write_text(pem.key)
    os.chmod(key, 0o600)
    context.load_cert_chain(cert, key)
    if clients_of is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=clients_of.pem)
    return context
