"""spec.delivery's terms in a worker, their pure parts: one opened set per
endpoint and value, terms OpenSSL refuses fail the attempt as an invalid
endpoint, and a connection ended by an alert is a TLS error. End to end:
tests/db/test_delivery_terms.py and tests/processes/test_delivery_terms.py."""

from __future__ import annotations

import ssl

import aiohttp
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from hooklane.delivery import DeliverySpec, RequestTerms, SecretKeyRef, TlsSpec
from hooklane.errors import InvalidInput
from hooklane.secrets import seal, terms_owner
from hooklane.worker.sender import failure_class
from hooklane.worker.terms import TermsCache
from testsupport.delivery_terms import CA, KEYRING, SECRETS, terms

# Local mode: hooklane endpoint apply --secrets-file.


# TLS: an HTTPS receiver with the test CA's certificate.


def test_a_worker_keeps_one_opened_terms_an_endpoint_and_opens_each_new_value():
    cache = TermsCache(KEYRING)
    owner = terms_owner("default", "mtls")
    resolved = terms(DeliverySpec(tls=TlsSpec(SecretKeyRef("ca", "ca.crt"), "client")), SECRETS)
    assert resolved is not None
    first = cache.get(seal(KEYRING, resolved.to_json(), owner), owner)
    assert first.ssl_context is not None
    sealed = seal(KEYRING, resolved.to_json(), owner)
    # The same terms sealed again by the next upsert: opened again, and
    # kept in place of the first, not beside it.
    again = cache.get(sealed, owner)
    assert again is not first and cache.get(sealed, owner) is again
    assert len(cache) == 1
    # A server name alone needs no context of its own: the client's shared
    # one verifies the name given.
    named = terms(DeliverySpec(tls=TlsSpec(None, None, "receiver.test")), SECRETS)
    assert named is not None
    opened = cache.get(
        seal(KEYRING, named.to_json(), terms_owner("default", "named")), terms_owner("default", "named")
    )
    assert opened.ssl_context is None and opened.server_name == "receiver.test"


def test_terms_a_row_holds_that_openssl_refuses_fail_the_attempt_as_an_invalid_endpoint():
    weak = CA.issue("weak", client=True, key=rsa.generate_private_key(65537, 1024))
    owner = terms_owner("default", "weak")
    stored = RequestTerms(cert_pem=weak.cert, key_pem=weak.key).to_json()
    with pytest.raises(InvalidInput) as refused:
        TermsCache(KEYRING).get(seal(KEYRING, stored, owner), owner)
    assert str(refused.value) == (
        "spec.delivery.tls (client_certificate): refused by OpenSSL: EE_KEY_TOO_SMALL"
    )


def _caused(exc: BaseException, cause: BaseException) -> BaseException:
    exc.__cause__ = cause
    return exc


# What uvloop leaves a sender whose certificate the receiver refused: the
# write's error, and the connection's end that carries the alert. The alert
# as a receiver's reset leaves it unread: one TLS 1.3 record of 19 bytes.
WRITE_FAILED = _caused(
    aiohttp.ClientOSError(None, "Can not write request body for https://receiver.test/"),
    aiohttp.ClientConnectionResetError("Cannot write to closing transport"),
)
ALERT = ssl.SSLError(1, "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required")
UNREAD_ALERT = bytes.fromhex("1703030013") + bytes(19)


@pytest.mark.parametrize(
    "exc, lost, unread, expected",
    [
        (WRITE_FAILED, None, b"", "connection_failed"),
        (WRITE_FAILED, _caused(aiohttp.ClientConnectionError("Connection lost"), ALERT), b"", "tls_error"),
        (WRITE_FAILED, ALERT, b"", "tls_error"),
        (WRITE_FAILED, ConnectionResetError(104, "Connection reset by peer"), b"", "connection_failed"),
        (aiohttp.ClientOSError(104, "Connection reset by peer"), None, UNREAD_ALERT, "tls_error"),
        # More than an alert, a longer record, or a handshake record: not
        # an alert alone, and not guessed at.
        (WRITE_FAILED, None, UNREAD_ALERT * 2, "connection_failed"),
        (WRITE_FAILED, None, bytes.fromhex("1703030014") + bytes(20), "connection_failed"),
        (WRITE_FAILED, None, bytes.fromhex("1603030013") + bytes(19), "connection_failed"),
        (WRITE_FAILED, None, UNREAD_ALERT[:-1], "connection_failed"),
        # A timeout stays one, whatever the connection ended with.
        (TimeoutError(), ALERT, UNREAD_ALERT, "timeout"),
        (aiohttp.ServerDisconnectedError(), ALERT, b"", "tls_error"),
    ],
)
def test_a_connection_failure_is_a_tls_error_when_its_connection_ended_with_an_alert(
    exc, lost, unread, expected
):
    assert failure_class(exc, 5, lost, unread)[0] == expected


# Retry limits of the endpoint's own.
