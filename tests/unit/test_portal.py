"""The portal's pure parts: cookie terms and header, ink, security headers,
flash messages and the endpoint form as posted."""

from __future__ import annotations

import pytest

from hooklane import store
from hooklane.api import inputs
from hooklane.api import portal as pages
from hooklane.api.pages import security_headers
from hooklane.errors import InvalidInput
from hooklane.selfservice import EndpointForm
from testsupport.portal import OWN_URL, PLATFORM


@pytest.mark.parametrize(
    ("https", "framed", "terms"),
    [
        (False, False, pages.CookieTerms(False, "Strict", False)),
        (True, False, pages.CookieTerms(True, "Strict", False)),
        (False, True, pages.CookieTerms(False, "Strict", False)),
        (True, True, pages.CookieTerms(True, "None", True)),
    ],
)
def test_cookie_terms(https: bool, framed: bool, terms: pages.CookieTerms) -> None:
    assert pages.cookie_terms(https, framed) == terms


def test_cookie_header() -> None:
    assert pages.cookie_header("a", "b", pages.CookieTerms(True, "None", True), 60) == (
        "a=b; Path=/portal; HttpOnly; SameSite=None; Max-Age=60; Secure; Partitioned"
    )
    assert pages.cookie_header("a", "", pages.CookieTerms(False, "Strict", False), 0) == (
        "a=; Path=/portal; HttpOnly; SameSite=Strict; Max-Age=0"
    )


@pytest.mark.parametrize(
    ("colour", "ink"),
    [("#2457a6", "#ffffff"), ("#ffd500", "#000000"), ("#000000", "#ffffff"), ("#FFFFFF", "#000000")],
)
def test_ink(colour: str, ink: str) -> None:
    assert pages.ink(colour) == ink


def test_security_headers() -> None:
    closed = security_headers(())
    assert "frame-ancestors 'none';" in closed["Content-Security-Policy"]
    assert closed["X-Frame-Options"] == "DENY"
    framed = security_headers((PLATFORM, "https://*.example.net"))
    assert f"frame-ancestors {PLATFORM} https://*.example.net;" in framed["Content-Security-Policy"]
    assert "X-Frame-Options" not in framed


def test_flash_messages_come_only_from_known_values() -> None:
    assert (
        pages.flash_message("replayed.0")
        == "No events to send again since then (or they are pending already)."
    )
    assert pages.flash_message("replayed.2") == "2 events queued to be sent again."
    assert pages.flash_message("resent-one.7") == "Delivery 7 queued again."
    assert pages.flash_message("paused") == "Paused: nothing is sent to this endpoint until you resume it."
    for value in (None, "", "logged-out", "paused<script>", "replayed.x"):
        assert pages.flash_message(value) is None, value


def test_the_endpoint_form_as_posted() -> None:
    form = pages.endpoint_form(
        {
            "name": " orders ",
            "url": OWN_URL,
            "event_types": "order.*, invoice.paid\norder.x",
            "max_concurrency": "",
        }
    )
    assert form == EndpointForm("orders", OWN_URL, ("order.*", "invoice.paid", "order.x"))
    # Left for the spec's parser to refuse in its own words.
    assert pages.endpoint_form({"name": "a", "url": "u", "timeout_seconds": "5s"}).timeout_seconds == "5s"
    assert pages.endpoint_form({"name": "a", "url": "u", "timeout_seconds": "07"}).timeout_seconds == 7
    assert pages.endpoint_form({"url": "u"}, name="kept").name == "kept"
    assert pages.form_values(form)["event_types"] == "order.*, invoice.paid, order.x"
    # The picker's ticked types first, then the typed ones, each once.
    picked = pages.endpoint_form(
        {"name": "a", "url": "u", "event_types": "order.*, user.created"},
        picked=["user.created", "order.paid"],
    )
    assert picked.event_types == ("user.created", "order.paid", "order.*")
    with pytest.raises(InvalidInput):
        inputs.tenant_filter({"phase": "Sleeping"}, "acme")
    assert inputs.tenant_filter({"tenant": "globex", "name_prefix": "ep-"}, "acme") == store.EndpointFilter(
        tenant="acme", name_prefix="ep-"
    )
