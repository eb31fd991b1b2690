"""Self-service endpoints: the rules a tenant's form is held to
(hooklane/selfservice.py). The local writer on a real Postgres is
tests/db/test_selfservice.py's, the Kubernetes writer
tests/kube/test_selfservice_kubernetes.py's."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hooklane.api.endpoint_writers import new_secret
from hooklane.checks import K8S_NAME_PATTERN, check_name
from hooklane.delivery import DeliverySpec
from hooklane.errors import InvalidInput
from hooklane.guard import parse_networks
from hooklane.selfservice import (
    SECRET_KEY,
    EndpointForm,
    Limits,
    OverBound,
    chosen_name,
    filled,
    manifest,
    over_bounds,
    resource_name,
    spec_for,
    tenant_key,
)
from hooklane.settings import Settings
from hooklane.signing import parse_secret
from hooklane.spec import parse_manifest
from testsupport.selfservice import BOUNDS, FORM

_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def refusal(form: EndpointForm, bounds: Settings = BOUNDS, tenant: str = "acme") -> InvalidInput:
    with pytest.raises(InvalidInput) as caught:
        spec_for(tenant, form, bounds)
    return caught.value


# --- the form's rules ----------------------------------------------------------


def test_a_form_becomes_the_tenants_endpoint_in_the_portal_namespace():
    spec = spec_for("acme", FORM, BOUNDS)
    assert (spec.namespace, spec.name, spec.tenant) == ("portal", resource_name("acme", "orders"), "acme")
    assert (spec.url, spec.event_types, spec.max_concurrency, spec.timeout_seconds) == (
        FORM.url,
        ("order.*",),
        4,
        5,
    )
    assert (spec.secret_ref.name, spec.secret_ref.key) == (spec.name, SECRET_KEY)
    assert not spec.paused and spec.delivery == DeliverySpec()


# Each form field, a value the spec refuses, and the spec path it fills:
# the refusal is the spec parser's own, under the form's name for it.
SPEC_ERRORS = [
    ("url", "ftp://hooks.acme.example/", "spec.url"),
    ("url", "https://user:pw@hooks.acme.example/", "spec.url"),
    ("url", "https://hooks.acme.example/#x", "spec.url"),
    ("url", "https://hooks.acme.example/a b", "spec.url"),
    ("url", "https://" + "a" * 2048, "spec.url"),
    ("url", None, "spec.url"),
    ("url", 42, "spec.url"),
    ("event_types", ("order created",), "spec.eventTypes"),
    ("event_types", ("order.*.x",), "spec.eventTypes"),
    ("event_types", ("",), "spec.eventTypes"),
    ("event_types", tuple(f"t{i}" for i in range(65)), "spec.eventTypes"),
    ("event_types", "order.*", "spec.eventTypes"),
    ("max_concurrency", 0, "spec.maxConcurrency"),
    ("max_concurrency", 257, "spec.maxConcurrency"),
    ("max_concurrency", "4", "spec.maxConcurrency"),
    ("max_concurrency", True, "spec.maxConcurrency"),
    ("timeout_seconds", 0, "spec.timeoutSeconds"),
    ("timeout_seconds", 61, "spec.timeoutSeconds"),
    ("timeout_seconds", 1.5, "spec.timeoutSeconds"),
]


@pytest.mark.parametrize("field, value, path", SPEC_ERRORS)
def test_the_spec_refuses_a_form_in_its_own_words(field, value, path):
    refused = refusal(dataclasses.replace(FORM, **{field: value}))
    doc = manifest("acme", filled(FORM, BOUNDS), "portal")
    doc["spec"][path.split(".")[1]] = list(value) if isinstance(value, tuple) else value
    with pytest.raises(InvalidInput) as parsed:
        parse_manifest(doc)
    assert (refused.field, refused.message) == (field, parsed.value.message)
    assert parsed.value.field == path


@pytest.mark.parametrize(
    "name", ["Orders", "orders.eu", "-orders", "orders-", "", "o" * 64, "ordérs", None, 7]
)
def test_a_name_is_a_dns_label(name):
    refused = refusal(dataclasses.replace(FORM, name=name))
    assert refused.field == "name" and "DNS label" in refused.message


def test_the_longest_name_fits():
    spec = spec_for("acme", dataclasses.replace(FORM, name="o" * 63), BOUNDS)
    assert len(spec.name) == 63 + 1 + 16


# --- the platform's bounds -------------------------------------------------------


def test_https_only_refuses_plain_http():
    https_only = dataclasses.replace(BOUNDS, portal_https_only=True)
    refused = refusal(dataclasses.replace(FORM, url="http://hooks.acme.example/"), https_only)
    assert refused.field == "url" and "https://" in refused.message
    assert spec_for("acme", FORM, https_only).url == FORM.url
    assert Settings().portal_https_only, "https only unless the platform says otherwise"


@pytest.mark.parametrize(
    "url, allowed",
    [
        ("https://hooks.acme.example/x", True),
        ("https://HOOKS.Acme.Example./x", True),
        ("https://eu.receivers.example.net/x", True),
        ("https://a.b.receivers.example.net:8443/x", True),
        ("https://receivers.example.net/x", False),  # *. is for the names under it
        ("https://evilreceivers.example.net/x", False),
        ("https://hooks.acme.example.evil.com/x", False),
        ("https://acme.example/x", False),
        ("https://93.184.216.34/x", False),
        ("https://[2606:2800:220:1::]/x", False),
    ],
)
def test_urls_name_an_allowed_host(url, allowed):
    bounds = dataclasses.replace(BOUNDS, portal_url_hosts=("hooks.acme.example", "*.receivers.example.net"))
    if allowed:
        assert spec_for("acme", dataclasses.replace(FORM, url=url), bounds).url == url
    else:
        refused = refusal(dataclasses.replace(FORM, url=url), bounds)
        assert refused.field == "url"
        assert (
            "is not one this platform delivers to (hooks.acme.example, *.receivers.example.net)"
            in refused.message
        )


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "10.1.2.3", "169.254.169.254", "[::1]", "[fd00:ec2::254]", "[::ffff:127.0.0.1]"]
)
def test_an_address_the_destination_guard_refuses_is_refused_at_once(host):
    refused = refusal(dataclasses.replace(FORM, url=f"https://{host}/hooks"))
    assert refused.field == "url" and refused.message.endswith("is not allowed: no delivery may reach it")
    allowed = dataclasses.replace(BOUNDS, allowed_networks=parse_networks("0.0.0.0/0,::/0"))
    assert spec_for("acme", dataclasses.replace(FORM, url=f"https://{host}/hooks"), allowed)


@pytest.mark.parametrize(
    "patterns, allowed",
    [
        (("order.*",), True),
        (("order.created", "order.eu.*"), True),
        (("invoice.paid",), True),
        (("order",), False),  # order.* is every type under order., not order itself
        (("orders.created",), False),
        (("invoice.*",), False),
        (("invoice.paid.late",), False),
        (("*",), False),
        ((), False),  # every type
    ],
)
def test_event_types_are_within_the_allowed_ones(patterns, allowed):
    bounds = dataclasses.replace(BOUNDS, portal_event_types=("order.*", "invoice.paid"))
    form = dataclasses.replace(FORM, event_types=patterns)
    if allowed:
        assert spec_for("acme", form, bounds).event_types == patterns
    else:
        refused = refusal(form, bounds)
        assert refused.field == "event_types" and "order.*, invoice.paid" in refused.message
    # With no rule, any pattern the spec takes.
    assert spec_for("acme", form, BOUNDS).event_types == patterns


def test_a_long_list_of_rules_is_cut_in_a_refusal():
    bounds = dataclasses.replace(BOUNDS, portal_event_types=tuple(f"t{i}.*" for i in range(40)))
    refused = refusal(dataclasses.replace(FORM, event_types=("x",)), bounds)
    assert refused.message.endswith("t9.* and 30 more)") and "item 0: 'x'" in refused.message


def test_the_settings_refuse_malformed_rules():
    from hooklane.settings import Settings as S

    env = {"HOOKLANE_PORTAL_URL_HOSTS": "hooks.acme.example, *.receivers.example.net"}
    assert S.from_env(env).portal_url_hosts == ("hooks.acme.example", "*.receivers.example.net")
    for hosts in (
        "hooks..acme.example",
        "-hooks.acme.example",
        "hooks.acme.example.",
        "*.*.example",
        "Hooks.example",
    ):
        with pytest.raises(InvalidInput) as caught:
            S.from_env({"HOOKLANE_PORTAL_URL_HOSTS": hosts})
        assert caught.value.field == "HOOKLANE_PORTAL_URL_HOSTS"
    with pytest.raises(InvalidInput):
        S.from_env({"HOOKLANE_PORTAL_EVENT_TYPES": "order.*.x"})


@pytest.mark.parametrize(("field", "bound"), [("max_concurrency", 4), ("timeout_seconds", 5)])
def test_a_new_endpoint_keeps_within_the_platforms_bounds(field, bound):
    assert (BOUNDS.portal_max_concurrency, BOUNDS.portal_max_timeout_seconds) == (4, 5)
    at_bound = spec_for("acme", dataclasses.replace(FORM, **{field: bound}), BOUNDS)
    assert getattr(at_bound, field) == bound
    refused = refusal(dataclasses.replace(FORM, **{field: bound + 1}))
    assert (refused.field, refused.message) == (
        field,
        f"must be at most {bound}, the most this platform lets a tenant choose: not {bound + 1}",
    )


def test_a_number_left_out_takes_the_bound_when_it_is_below_the_default():
    low = dataclasses.replace(BOUNDS, portal_max_concurrency=2, portal_max_timeout_seconds=3)
    spec = spec_for("acme", FORM, low)
    assert (spec.max_concurrency, spec.timeout_seconds) == (2, 3)
    high = dataclasses.replace(BOUNDS, portal_max_concurrency=64, portal_max_timeout_seconds=30)
    spec = spec_for("acme", FORM, high)
    assert (spec.max_concurrency, spec.timeout_seconds) == (4, 5)
    assert spec_for("acme", dataclasses.replace(FORM, max_concurrency=64), high).max_concurrency == 64


def test_an_edit_may_keep_or_lower_a_value_beyond_a_lowered_bound_but_not_raise_it():
    held = Limits(max_concurrency=16, timeout_seconds=30)
    for kept in ((16, 30), (8, 30), (16, 5), (1, 1)):
        form = dataclasses.replace(FORM, max_concurrency=kept[0], timeout_seconds=kept[1])
        spec = spec_for("acme", form, BOUNDS, held)
        assert (spec.max_concurrency, spec.timeout_seconds) == kept
    with pytest.raises(InvalidInput) as caught:
        spec_for("acme", dataclasses.replace(FORM, max_concurrency=17, timeout_seconds=30), BOUNDS, held)
    assert (caught.value.field, caught.value.message) == (
        "max_concurrency",
        "must be at most 4, the most this platform lets a tenant choose, or at most 16, this"
        " endpoint's value from before that bound: not 17",
    )
    with pytest.raises(InvalidInput) as caught:
        spec_for("acme", dataclasses.replace(FORM, max_concurrency=16, timeout_seconds=31), BOUNDS, held)
    assert caught.value.field == "timeout_seconds" and "at most 30" in caught.value.message
    # Within the bound, an endpoint may go up to it, not past it.
    within_bounds = Limits(max_concurrency=2, timeout_seconds=5)
    assert spec_for("acme", dataclasses.replace(FORM, max_concurrency=4), BOUNDS, within_bounds)
    refused = refusal_of_edit(dataclasses.replace(FORM, max_concurrency=5), within_bounds)
    assert refused.message == "must be at most 4, the most this platform lets a tenant choose: not 5"


def refusal_of_edit(form: EndpointForm, held: Limits) -> InvalidInput:
    with pytest.raises(InvalidInput) as caught:
        spec_for("acme", form, BOUNDS, held)
    return caught.value


def test_over_bounds_names_each_field_beyond_its_bound():
    assert over_bounds(Limits(4, 5), BOUNDS) == ()
    assert over_bounds(Limits(16, 5), BOUNDS) == (OverBound("max_concurrency", 16, 4),)
    assert over_bounds(Limits(5, 60), BOUNDS) == (
        OverBound("max_concurrency", 5, 4),
        OverBound("timeout_seconds", 60, 5),
    )


def test_the_settings_bound_the_bounds_by_the_spec():
    from hooklane.settings import Settings as S

    env = {"HOOKLANE_PORTAL_MAX_CONCURRENCY": "256", "HOOKLANE_PORTAL_MAX_TIMEOUT_SECONDS": "60"}
    assert (S.from_env(env).portal_max_concurrency, S.from_env(env).portal_max_timeout_seconds) == (256, 60)
    for name, value in (
        ("HOOKLANE_PORTAL_MAX_CONCURRENCY", "0"),
        ("HOOKLANE_PORTAL_MAX_CONCURRENCY", "257"),
        ("HOOKLANE_PORTAL_MAX_TIMEOUT_SECONDS", "61"),
        ("HOOKLANE_PORTAL_MAX_TIMEOUT_SECONDS", "5s"),
    ):
        with pytest.raises(InvalidInput) as caught:
            S.from_env({name: value})
        assert caught.value.field == name


# --- naming ----------------------------------------------------------------------

tenants = st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")), min_size=1, max_size=253)
names = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", fullmatch=True)


@given(tenant=tenants, other=tenants, name=names, other_name=names)
def test_names_map_back_and_never_collide(tenant, other, name, other_name):
    resource = resource_name(tenant, name)
    assert check_name(resource, "name") == resource and len(resource) <= 253
    assert re.fullmatch(K8S_NAME_PATTERN, resource)
    assert chosen_name(tenant, resource) == name
    key = tenant_key(tenant)
    assert len(key) == 16 and _LABEL_VALUE.fullmatch(key)
    if other != tenant:
        assert tenant_key(other) != key
        assert resource_name(other, other_name) != resource
        assert chosen_name(other, resource) is None
    elif other_name != name:
        assert resource_name(tenant, other_name) != resource


def test_a_name_not_made_for_the_tenant_maps_to_nothing():
    key = tenant_key("acme")
    assert chosen_name("acme", key) is None
    assert chosen_name("acme", "-" + key) is None
    assert chosen_name("acme", f"orders-{key}x") is None
    assert chosen_name("globex", f"orders-{key}") is None


# --- the JSON body ---------------------------------------------------------------


def test_a_json_body_becomes_a_form_and_its_values_reach_the_parser():
    body = {"name": "orders", "url": FORM.url, "event_types": ["order.*"], "max_concurrency": None}
    assert EndpointForm.from_json(body) == FORM
    assert EndpointForm.from_json({"name": "o"}) == EndpointForm("o", None)
    for doc, field in (
        ([], "body"),
        ({"name": "o", "url": FORM.url, "paused": True}, "body"),
        ({"name": "o", "url": FORM.url, "secret": "whsec_x"}, "body"),
        # No delivery term is the tenant's: nothing to turn off or widen.
        ({"name": "o", "url": FORM.url, "delivery": {"retry": {"maxAge": "72h"}}}, "body"),
    ):
        with pytest.raises(InvalidInput) as caught:
            EndpointForm.from_json(doc)
        assert caught.value.field == field
    assert refusal(
        EndpointForm.from_json({"name": "o", "url": FORM.url, "event_types": "order.*"})
    ).field == ("event_types")


def test_a_new_secret_is_a_standard_webhooks_secret():
    secret = new_secret()
    assert len(parse_secret(secret)) == 32 and secret != new_secret()


# --- the event-type rule agrees with the one deliveries are routed by ---------


# --- the local writer --------------------------------------------------------------
