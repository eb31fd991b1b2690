"""Standard Webhooks signatures, checked by the reference verifiers."""

from __future__ import annotations

import base64
import time
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from hooklane.errors import InvalidInput
from hooklane.signing import event_body, parse_secret, sign

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def _headers(msg_id: str, ts: int, signature: str) -> dict[str, str]:
    return {"webhook-id": msg_id, "webhook-timestamp": str(ts), "webhook-signature": signature}


def test_standardwebhooks_verifier_accepts_our_signature():
    body = event_body("msg_1", "order.created", datetime.now(UTC), '{"a": [1, "é"]}')
    ts = int(time.time())
    signature = sign(parse_secret(SECRET), "msg_1", ts, body)
    assert signature.startswith("v1,")
    payload = Webhook(SECRET).verify(body, _headers("msg_1", ts, signature))
    assert payload["data"] == {"a": [1, "é"]}


def test_verifier_rejects_a_tampered_body():
    ts = int(time.time())
    signature = sign(parse_secret(SECRET), "msg_1", ts, b'{"x":1}')
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(b'{"x":2}', _headers("msg_1", ts, signature))


def test_known_vector():
    # The example from the Standard Webhooks specification.
    key = parse_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    body = b'{"test": 2432232314}'
    assert sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body) == (
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    )


@pytest.mark.parametrize(
    "secret, reason",
    [
        ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "must start with"),
        ("whsec_not base64!", "not valid base64"),
        ("whsec_" + base64.b64encode(b"short").decode(), "24 to 64 bytes"),
    ],
)
def test_malformed_secrets_are_refused(secret, reason):
    with pytest.raises(InvalidInput, match=reason):
        parse_secret(secret)


@settings(deadline=None, max_examples=300)
@given(
    key=st.binary(min_size=24, max_size=64),
    # the ids publish accepts
    msg_id=st.text(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-", min_size=1, max_size=255
    ),
    # the verifier refuses timestamps more than 5 minutes from its clock
    skew=st.integers(-240, 240),
    body=st.text(),
)
def test_any_delivery_we_sign_verifies(key, msg_id, skew, body):
    secret = "whsec_" + base64.b64encode(key).decode()
    ts = int(time.time()) + skew
    data = body.encode()
    signature = sign(parse_secret(secret), msg_id, ts, data)
    Webhook(secret).verify(data, _headers(msg_id, ts, signature), json_parse=False)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(data + b" ", _headers(msg_id, ts, signature), json_parse=False)


def test_two_keys_give_two_signatures_either_verifier_accepts():
    # A secret being rotated: the new key and the replaced one both sign.
    new = "whsec_" + base64.b64encode(b"n" * 32).decode()
    body = b'{"x":1}'
    ts = int(time.time())
    signature = sign([parse_secret(new), parse_secret(SECRET)], "msg_1", ts, body)
    assert signature.split(" ") == [sign(parse_secret(s), "msg_1", ts, body) for s in (new, SECRET)]
    for secret in (new, SECRET):
        Webhook(secret).verify(body, _headers("msg_1", ts, signature), json_parse=False)
    with pytest.raises(WebhookVerificationError):
        Webhook("whsec_" + base64.b64encode(b"o" * 32).decode()).verify(
            body, _headers("msg_1", ts, signature)
        )
