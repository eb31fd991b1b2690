"""spec.delivery's headers, TLS and retry limits as the parser reads them,
and their Secrets resolved into request terms (hooklane/delivery.py)."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from hooklane.delivery import (
    DeliverySpec,
    HeaderSpec,
    RequestTerms,
    SecretKeyRef,
    SecretProblem,
    TlsSpec,
    resolve,
    secrets_of,
)
from hooklane.errors import InvalidInput
from hooklane.spec import parse_spec
from hooklane.tls import client_context
from testsupport import certs

URL = "https://receiver.example/hooks"
BASE = {"url": URL, "tenant": "acme", "secretRef": {"name": "s", "key": "k"}}
FROM_SECRET = {"secretKeyRef": {"name": "api", "key": "token"}}


def parsed(delivery: Any, url: str = URL) -> DeliverySpec:
    return parse_spec("shop", "orders", {**BASE, "url": url, "delivery": delivery}).delivery


def refusal(delivery: Any, url: str = URL) -> InvalidInput:
    with pytest.raises(InvalidInput) as refused:
        parsed(delivery, url)
    return refused.value


def test_the_full_delivery_block_is_read():
    delivery = parsed(
        {
            "rateLimit": {"perSecond": 50, "burst": 10},
            "adaptiveConcurrency": True,
            "headers": [{"name": "X-Api-Key", "valueFrom": FROM_SECRET}, {"name": "X-Team", "value": "a b"}],
            "tls": {
                "caSecretRef": {"name": "ca"},
                "clientCertificateSecretRef": {"name": "client"},
                "serverName": "receiver.test",
            },
            "retry": {"maxAttempts": 3, "maxAge": "1h30m"},
        }
    )
    assert delivery == DeliverySpec(
        rate_per_second=50,
        burst=10,
        adaptive=True,
        headers=(
            HeaderSpec("X-Api-Key", secret=SecretKeyRef("api", "token")),
            HeaderSpec("X-Team", "a b"),
        ),
        tls=TlsSpec(SecretKeyRef("ca", "ca.crt"), "client", "receiver.test"),
        max_attempts=3,
        max_age_seconds=5400.0,
    )
    assert delivery.secret_names() == {"api", "ca", "client"}


@pytest.mark.parametrize(
    "name",
    [
        "Host",
        "Content-Type",
        "Content-Length",
        "Transfer-Encoding",
        "Connection",
        "Expect",
        "webhook-signature",
    ],
)
@pytest.mark.parametrize("case", [str.lower, str.upper, lambda s: s])
def test_headers_hooklane_owns_are_refused_in_any_case(name, case):
    refused = refusal({"headers": [{"name": "X-Fine", "value": "1"}, {"name": case(name), "value": "x"}]})
    assert refused.field == "spec.delivery.headers"
    assert refused.message.startswith(f"item 1: name {case(name)!r} may not be set")


@pytest.mark.parametrize(
    "header, message",
    [
        ({"name": "X Key", "value": "x"}, "item 0: name must be a header name"),
        ({"name": "X-Key", "value": "a\r\nInjected: 1"}, "item 0: value must be visible ASCII"),
        ({"name": "X-Key", "value": "a\nb"}, "item 0: value must be visible ASCII"),
        ({"name": "X-Key"}, "item 0: must set exactly one of value and valueFrom"),
        ({"name": "X-Key", "value": "x", "valueFrom": FROM_SECRET}, "item 0: must set exactly one of value"),
        ({"name": "X-Key", "value": "x", "secret": "y"}, "item 0: unknown field(s): secret"),
    ],
)
def test_bad_headers_are_refused(header, message):
    refused = refusal({"headers": [header]})
    assert refused.field == "spec.delivery.headers"
    assert refused.message.startswith(message), refused.message
    # A value may be the very credential, mistyped: never repeated.
    if header.get("value", "x") != "x":
        assert header["value"] not in str(refused)


def test_a_header_set_twice_in_different_case_is_refused():
    refused = refusal(
        {"headers": [{"name": "X-Key", "value": "a"}, {"name": "x-KEY", "valueFrom": FROM_SECRET}]}
    )
    assert (refused.field, refused.message) == ("spec.delivery.headers", "item 1: sets 'x-KEY' a second time")


@pytest.mark.parametrize(
    "retry, field, message",
    [
        ({"maxAttempts": 0}, "maxAttempts", "must be between 1 and 20, not 0"),
        ({"maxAttempts": 21}, "maxAttempts", "must be between 1 and 20, not 21"),
        ({"maxAge": "73h"}, "maxAge", "must be between 1s and 72h, not '73h'"),
        ({"maxAge": "0s"}, "maxAge", "must be between 1s and 72h, not '0s'"),
        ({"maxAge": "10d"}, "maxAge", 'must be a duration such as "90s", "30m" or "36h": \'10d\''),
        ({"maxAttempts": 3, "backoff": "1s"}, "", "unknown field(s): backoff"),
    ],
)
def test_retry_limits_outside_the_contract_are_refused(retry, field, message):
    refused = refusal({"retry": retry})
    assert refused.field == "spec.delivery.retry" + (f".{field}" if field else "")
    assert refused.message.startswith(message), refused.message


@pytest.mark.parametrize(
    "max_age, seconds", [("1s", 1.0), ("90m", 5400.0), ("72h", 259200.0), ("1.5h", 5400.0)]
)
def test_retry_max_age_within_the_contract_is_read(max_age, seconds):
    assert parsed({"retry": {"maxAge": max_age}}).max_age_seconds == seconds


def test_tls_needs_an_https_url():
    refused = refusal({"tls": {"serverName": "receiver.test"}}, url="http://receiver.example/hooks")
    assert (refused.field, refused.message) == ("spec.delivery.tls", "needs an https:// url")


@pytest.mark.parametrize(
    "delivery, field, unknown",
    [
        ({"retries": {}}, "spec.delivery", "retries"),
        (
            {"tls": {"caSecretRef": {"name": "ca", "namespace": "x"}}},
            "spec.delivery.tls.caSecretRef",
            "namespace",
        ),
        ({"tls": {"insecure": True}}, "spec.delivery.tls", "insecure"),
        ({"rateLimit": {"perSecond": 1, "per": 2}}, "spec.delivery.rateLimit", "per"),
    ],
)
def test_unknown_fields_are_refused(delivery, field, unknown):
    refused = refusal(delivery)
    assert refused.field == field
    assert refused.message.startswith(f"unknown field(s): {unknown} ")


# resolve(): the Secrets the spec names, into what a worker sends with.

CA = certs.Authority()
CLIENT = certs.client(CA)
FULL = DeliverySpec(
    headers=(HeaderSpec("X-Api-Key", secret=SecretKeyRef("api", "token")), HeaderSpec("X-Team", "payments")),
    tls=TlsSpec(SecretKeyRef("ca", "ca.crt"), "client", "receiver.test"),
)


def good_secrets() -> dict[str, dict[str, str | None]]:
    return {
        "api": {"token": "s3cr3t-token"},
        "ca": {"ca.crt": CA.pem},
        "client": {"tls.crt": CLIENT.cert, "tls.key": CLIENT.key},
    }


def test_a_good_set_resolves_to_terms_that_round_trip():
    terms = resolve(FULL, "shop", good_secrets().get)
    assert terms == RequestTerms(
        (("X-Api-Key", "s3cr3t-token"), ("X-Team", "payments")),
        CA.pem,
        CLIENT.cert,
        CLIENT.key,
        "receiver.test",
        ("X-Api-Key",),
    )
    assert RequestTerms.from_json(terms.to_json()) == terms
    assert terms.tls


def test_terms_without_headers_or_tls_are_none_and_static_headers_need_no_secret():
    assert resolve(DeliverySpec(max_attempts=3), "shop", {}.get) is None
    static = resolve(DeliverySpec(headers=(HeaderSpec("X-Team", "payments"),)), "shop", {}.get)
    assert static == RequestTerms((("X-Team", "payments"),))
    assert not static.tls


@pytest.mark.parametrize("stored", ["", "{}", '{"headers": 1}', "not json"])
def test_terms_not_stored_as_hooklane_stores_them_are_refused(stored):
    with pytest.raises(InvalidInput, match="request terms: are not stored as Hooklane stores them"):
        RequestTerms.from_json(stored)


@pytest.mark.parametrize(
    "secret, change, field",
    [
        ("api", None, "spec.delivery.headers[0].valueFrom.secretKeyRef: Secret shop/api not found"),
        ("api", {}, "spec.delivery.headers[0].valueFrom.secretKeyRef: Secret shop/api has no key 'token'"),
        ("ca", None, "spec.delivery.tls.caSecretRef: Secret shop/ca not found"),
        ("ca", {"ca.pem": CA.pem}, "spec.delivery.tls.caSecretRef: Secret shop/ca has no key 'ca.crt'"),
        ("client", None, "spec.delivery.tls.clientCertificateSecretRef: Secret shop/client not found"),
        (
            "client",
            {"tls.crt": CLIENT.cert},
            "spec.delivery.tls.clientCertificateSecretRef: Secret shop/client has no key 'tls.key'",
        ),
    ],
)
def test_a_missing_secret_or_key_is_a_missing_problem(secret, change, field):
    secrets = good_secrets()
    if change is None:
        del secrets[secret]
    else:
        secrets[secret] = change
    with pytest.raises(SecretProblem) as problem:
        resolve(FULL, "shop", secrets.get)
    assert problem.value.missing
    assert problem.value.message.startswith(field)
    assert "nothing is delivered until" in problem.value.message


OTHER_CLIENT = certs.client(CA)

# A key of an algorithm cryptography does not read (SM2, made by `openssl
# genpkey -algorithm SM2`): it raises UnsupportedAlgorithm, not ValueError.
SM2_KEY = """\
-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqBHM9VAYItBG0wawIBAQQgmod7rDGLCbj4E9uL
H0QkBuckoCDqcyIbOsHaxpupl9ihRANCAATxa6OXDbxjwOg+EW9ti71StF/wf3cK
Ereiuv/UKV1XVxGMbl+rcdum0lCXMuYr2huSJ5aiWtgAb9/kPLQLSgfH
-----END PRIVATE KEY-----
"""
WEAK_CLIENT = CA.issue("weak", client=True, key=rsa.generate_private_key(65537, 1024))


def with_bad_point(pem: certs.Pem) -> str:
    """``pem``'s certificate with its public key moved off the curve: it
    parses, and reading its key raises ValueError."""
    cert = x509.load_pem_x509_certificate(pem.cert.encode())
    point = cert.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    der = cert.public_bytes(serialization.Encoding.DER)
    bad = der.replace(point, point[:-1] + bytes([point[-1] ^ 1]))
    assert bad != der
    return "-----BEGIN CERTIFICATE-----\n" + base64.encodebytes(bad).decode() + "-----END CERTIFICATE-----\n"


@pytest.mark.parametrize(
    "secret, values, message",
    [
        (
            "api",
            {"token": "line one\nline two"},
            "spec.delivery.headers[0].valueFrom.secretKeyRef: key 'token' of Secret shop/api is not a header value",
        ),
        ("api", {"token": "x" * 4097}, "key 'token' of Secret shop/api is not a header value"),
        ("api", {"token": None}, "key 'token' of Secret shop/api is not a header value"),
        (
            "ca",
            {"ca.crt": "not a certificate"},
            "spec.delivery.tls.caSecretRef: key 'ca.crt' of Secret shop/ca",
        ),
        ("ca", {"ca.crt": CLIENT.key}, "holds no PEM certificate"),
        (
            "client",
            {"tls.crt": CLIENT.cert, "tls.key": OTHER_CLIENT.key},
            "spec.delivery.tls.clientCertificateSecretRef: Secret shop/client: 'tls.key' is not the key of the"
            " certificate in 'tls.crt'",
        ),
        (
            "client",
            {"tls.crt": CLIENT.cert, "tls.key": "junk"},
            "'tls.key', holds no unencrypted PEM private key",
        ),
        ("client", {"tls.crt": "junk", "tls.key": CLIENT.key}, "'tls.crt', holds no PEM certificate"),
        (
            "client",
            {"tls.crt": CLIENT.cert, "tls.key": SM2_KEY},
            "spec.delivery.tls.clientCertificateSecretRef: Secret shop/client, key 'tls.key', holds no"
            " unencrypted PEM private key",
        ),
        (
            "client",
            {"tls.crt": with_bad_point(CLIENT), "tls.key": CLIENT.key},
            "Secret shop/client, key 'tls.crt', holds a certificate whose public key cannot be read",
        ),
        # Read by cryptography, refused by OpenSSL at its security level.
        (
            "client",
            {"tls.crt": WEAK_CLIENT.cert, "tls.key": WEAK_CLIENT.key},
            "spec.delivery.tls.clientCertificateSecretRef: Secret shop/client is refused by OpenSSL:"
            " EE_KEY_TOO_SMALL",
        ),
        # A bundle cut off in its last certificate: cryptography reads the
        # first and passes over the rest.
        (
            "ca",
            {"ca.crt": CA.pem + certs.Authority().pem[:300]},
            "spec.delivery.tls.caSecretRef: key 'ca.crt' of Secret shop/ca holds 2 PEM certificates, of which 1"
            " cannot be read",
        ),
    ],
)
def test_a_secret_holding_the_wrong_thing_is_not_a_missing_problem(secret, values, message):
    secrets = {**good_secrets(), secret: values}
    with pytest.raises(SecretProblem) as problem:
        resolve(FULL, "shop", secrets.get)
    assert not problem.value.missing
    assert message in problem.value.message
    # The value is never repeated: it may be the very credential.
    for value in values.values():
        if value is not None and value not in (CLIENT.cert, CA.pem):
            assert value not in problem.value.message


def test_a_bundle_with_comments_in_any_language_is_trusted():
    # As distributions ship theirs: each certificate's name in its own words.
    bundle = f"# Főtanúsítvány\n# Hooklane test CA\n{CA.pem}\n# 根证书\n{certs.Authority().pem}"
    terms = resolve(
        DeliverySpec(tls=TlsSpec(SecretKeyRef("ca", "ca.crt"))), "shop", {"ca": {"ca.crt": bundle}}.get
    )
    assert terms is not None and terms.ca_pem == bundle
    context = client_context(terms.ca_pem, None, None)
    assert context is not None and context.cert_store_stats()["x509_ca"] == 2


def test_request_terms_never_print_their_credentials():
    terms = resolve(FULL, "shop", good_secrets().get)
    assert terms is not None
    shown = repr(terms) + str(terms)
    assert "X-Api-Key" in shown
    for credential in ("s3cr3t-token", "payments", CLIENT.key, CLIENT.cert, CA.pem):
        assert credential not in shown


# secrets_of(): the Secrets of a --secrets-file.


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def secret(name: str, namespace: str | None = "shop", **fields: Any) -> dict[str, Any]:
    metadata = {"name": name} if namespace is None else {"name": name, "namespace": namespace}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, **fields}


def test_secrets_are_read_from_data_and_string_data():
    documents = [
        secret("api", data={"token": b64("from-data\n")}),
        None,
        secret("ca", namespace=None, stringData={"ca.crt": CA.pem}),
        secret(
            "client",
            type="kubernetes.io/tls",
            data={"tls.crt": b64(CLIENT.cert)},
            stringData={"tls.key": CLIENT.key},
        ),
        secret("api", namespace="elsewhere", stringData={"token": "not this one"}),
    ]
    found = secrets_of(documents, "shop", "--secrets-file")
    assert found == {
        "api": {"token": "from-data"},
        "ca": {"ca.crt": CA.pem.strip()},
        "client": {"tls.crt": CLIENT.cert.strip(), "tls.key": CLIENT.key.strip()},
    }
    terms = resolve(FULL, "shop", found.get)
    assert terms is not None and terms.headers[0] == ("X-Api-Key", "from-data")


@pytest.mark.parametrize(
    "document, message",
    [
        (
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}},
            "document 2: must be a v1 Secret",
        ),
        ({"kind": "Secret", "metadata": {"name": "x"}}, "document 2: must be a v1 Secret"),
        (["a list"], "document 2: must be a v1 Secret"),
        ({"apiVersion": "v1", "kind": "Secret"}, "document 2: has no metadata"),
        ({"apiVersion": "v1", "kind": "Secret", "metadata": {}}, "document 2: has no metadata.name"),
        (secret("x", data={"k": "not base64!"}), "document 2, data: key 'k' is not base64 of UTF-8 text"),
        (secret("x", data={"k": b64("a")[:-1]}), "document 2, data: key 'k' is not base64"),
        (secret("x", stringData={"k": 1}), "document 2, stringData: key 'k' must map to a string"),
        (secret("x", data=["k"]), "document 2, data: must be a mapping of keys to values"),
    ],
)
def test_documents_that_are_not_secrets_are_refused(document, message):
    with pytest.raises(InvalidInput) as refused:
        secrets_of([secret("fine", stringData={"k": "v"}), document], "shop", "--secrets-file")
    assert str(refused.value).startswith(f"--secrets-file: {message}")
