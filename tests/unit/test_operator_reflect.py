"""The operator's pure decisions: secrets, phase, conditions, Events."""

from __future__ import annotations

import base64
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from hooklane.delivery import SecretKeyRef
from hooklane.endpoint_state import EndpointState, PauseReason, Standing
from hooklane.operator import reflect
from hooklane.operator.reflect import Queue, Synced
from testsupport.fixtures import SECRET

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
EARLIER = "2026-03-01T11:00:00Z"
REF = SecretKeyRef("acme-webhook-secret", "secret")
SYNCED = Synced(generation=3, paused=False, reason=reflect.Reason.SYNCED, message="stored")
ACTIVE = Standing(EndpointState.ACTIVE)
PAUSED_BY_CIRCUIT = Standing(EndpointState.PAUSED, PauseReason.CIRCUIT)
PAUSED_BY_HAND = Standing(EndpointState.PAUSED, PauseReason.MANUAL)
DEACTIVATED = Standing(EndpointState.DEACTIVATED)
IDLE = Queue(
    standing=ACTIVE,
    consecutive_failures=0,
    paused_until=None,
    last_error=None,
    last_delivered_at=None,
    pending=0,
    in_flight=0,
    oldest_pending_age=None,
    dead=0,
)


def run(
    previous: dict[str, Any], queue: Queue | None = IDLE, synced: Synced | None = SYNCED, now: datetime = NOW
) -> reflect.Reflection:
    return reflect.reflect(previous=previous, queue=queue, synced=synced, now=now, age_resolution=10)


def settled(queue: Queue = IDLE, synced: Synced = SYNCED) -> dict[str, Any]:
    """The status a first pass writes, as the resource would then carry it."""
    return run({}, queue, synced).patch


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


def reasons(reflection: reflect.Reflection) -> list[str]:
    return [e.reason for e in reflection.events]


def b64(value: str) -> str:
    return base64.b64encode(value.encode()).decode()


# --- secrets ---------------------------------------------------------------
def test_secret_values_keep_only_signing_secrets_pem_and_header_values():
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"
    values = reflect.secret_values(
        {
            "secret": b64(SECRET + "\n"),
            "token": b64("eyJhbGciOi"),
            "ca.crt": b64(pem + "\n"),
            # certifi's cacert.pem, and `openssl x509 -text`, write text first
            "bundle": b64(f"# Issuer: CN=Test CA\n{pem}\n"),
            "binary": base64.b64encode(b"\xff\xfe").decode(),
            "huge": b64("whsec_" + "A" * 1000),
            "lines": b64("two\nlines"),
            "long": b64("k" * 5000),
        }
    )
    assert values == {
        "secret": SECRET,
        "token": "eyJhbGciOi",
        "ca.crt": pem,
        "bundle": f"# Issuer: CN=Test CA\n{pem}",
        "binary": None,
        "huge": None,
        "lines": None,
        "long": None,
    }
    assert reflect.secret_values(None) == {}


@pytest.mark.parametrize(
    ("values", "reason", "says"),
    [
        (None, reflect.Reason.SECRET_MISSING, "Secret ns/acme-webhook-secret not found"),
        ({"other": SECRET}, reflect.Reason.SECRET_MISSING, "has no key 'secret'"),
        ({"secret": None}, reflect.Reason.SECRET_INVALID, "is not a Standard Webhooks secret"),
        ({"secret": "whsec_c2hvcnQ="}, reflect.Reason.SECRET_INVALID, "must encode 24 to 64 bytes"),
        ({"secret": "whsec_not base64!"}, reflect.Reason.SECRET_INVALID, "not valid base64"),
    ],
    ids=["no-secret", "no-key", "not-whsec", "short-key", "bad-base64"],
)
def test_unusable_secrets_give_no_secret_and_a_reason(values, reason, says):
    check = reflect.check_secret("ns", REF, values)
    assert check.secret is None
    assert check.reason == reason
    assert says in check.message


def test_a_good_secret_is_used():
    check = reflect.check_secret("ns", REF, {"secret": SECRET})
    assert (check.secret, check.reason) == (SECRET, reflect.Reason.SYNCED)


def test_no_secret_ref_is_missing():
    assert reflect.check_secret("ns", None, None).reason == reflect.Reason.SECRET_MISSING


# --- fields and phase --------------------------------------------------------
def test_first_pass_writes_everything_and_ready():
    patch = run({}).patch
    assert patch["phase"] == EndpointState.ACTIVE
    assert patch["observedGeneration"] == 3
    assert (patch["pending"], patch["inFlight"], patch["dead"], patch["oldestPendingAgeSeconds"]) == (
        0,
        0,
        0,
        0,
    )
    ready = condition(patch, reflect.READY)
    assert ready == {
        "type": "Ready",
        "status": "True",
        "reason": "Synced",
        "message": "stored",
        "lastTransitionTime": "2026-03-01T12:00:00Z",
        "observedGeneration": 3,
    }
    assert condition(patch, reflect.DELIVERING)["status"] == "True"
    # Absent values are not written as nulls.
    assert "pausedUntil" not in patch and "lastError" not in patch


def test_nothing_changed_means_no_patch_and_no_events():
    previous = settled()
    again = run(previous, now=NOW + timedelta(minutes=5))
    assert again.patch == {}
    assert again.events == []


def test_only_changed_fields_are_patched():
    previous = settled()
    patch = run(previous, replace(IDLE, pending=7, in_flight=2, oldest_pending_age=4.6)).patch
    assert patch == {"pending": 7, "inFlight": 2, "oldestPendingAgeSeconds": 4}


def test_held_keys_are_shown_while_there_are_some():
    assert "ordering" not in settled()
    previous = settled()
    held = run(previous, replace(IDLE, held_keys=3)).patch
    assert held == {"ordering": {"heldKeys": 3}}
    previous = {**previous, **held}
    assert run(previous, replace(IDLE, held_keys=3)).patch == {}
    # None removes the field from the status (a merge patch).
    assert run(previous).patch == {"ordering": None}


def test_oldest_pending_age_is_patched_only_when_it_moved_enough():
    previous = {**settled(), "pending": 1, "oldestPendingAgeSeconds": 600}
    queue = replace(IDLE, pending=1)
    assert run(previous, replace(queue, oldest_pending_age=650)).patch == {}
    assert run(previous, replace(queue, oldest_pending_age=661)).patch == {"oldestPendingAgeSeconds": 661}
    # Young backlogs move by the status interval (10 s here) at least.
    young = {**previous, "oldestPendingAgeSeconds": 20}
    assert run(young, replace(queue, oldest_pending_age=25)).patch == {}
    assert run(young, replace(queue, oldest_pending_age=30)).patch == {"oldestPendingAgeSeconds": 30}
    # An emptied queue is reported at once.
    assert run(previous, IDLE).patch == {"pending": 0, "oldestPendingAgeSeconds": 0}


def test_an_open_circuit_is_paused_until_a_success_closes_it():
    open_ = replace(
        IDLE,
        standing=PAUSED_BY_CIRCUIT,
        consecutive_failures=20,
        paused_until=NOW + timedelta(seconds=60),
        last_error="HTTP 500",
    )
    patch = run(settled(), open_).patch
    assert patch["phase"] == EndpointState.PAUSED
    assert patch["pausedUntil"] == "2026-03-01T12:01:00Z"
    delivering = condition(patch, reflect.DELIVERING)
    assert (delivering["status"], delivering["reason"]) == ("False", reflect.Reason.CIRCUIT_OPEN)
    assert (
        "20 consecutive failures, paused until 2026-03-01T12:01:00Z; last error: HTTP 500"
        in delivering["message"]
    )
    # Once the pause ran out, probes go out: Probing, and the circuit is
    # still open, so no Event says it closed.
    probing = run(
        {**settled(), **patch},
        replace(open_, standing=Standing(EndpointState.PROBING)),
        now=NOW + timedelta(seconds=90),
    )
    assert probing.patch["phase"] == EndpointState.PROBING
    assert "probing since" in condition(probing.patch, reflect.DELIVERING)["message"]
    assert probing.events == []
    # A failed probe pauses it again.
    reopened = replace(open_, consecutive_failures=21, paused_until=NOW + timedelta(seconds=210))
    again = run({**settled(), **patch, **probing.patch}, reopened, now=NOW + timedelta(seconds=91))
    assert again.patch["phase"] == EndpointState.PAUSED and again.events == []


def test_a_refused_destination_says_what_to_change():
    refused = replace(IDLE, consecutive_failures=3, last_error="destination 10.0.0.1 is not allowed")
    delivering = condition(run(settled(), refused).patch, reflect.DELIVERING)
    assert (delivering["status"], delivering["reason"]) == ("False", reflect.Reason.DESTINATION_DENIED)
    assert delivering["message"].startswith("destination 10.0.0.1 is not allowed: change spec.url")
    # even once the circuit opened over it: the address is what to fix
    opened = replace(
        refused, standing=PAUSED_BY_CIRCUIT, consecutive_failures=20, paused_until=NOW + timedelta(seconds=60)
    )
    assert (
        condition(run(settled(), opened).patch, reflect.DELIVERING)["reason"]
        == reflect.Reason.DESTINATION_DENIED
    )
    # a receiver's own failure is not a refusal
    failing = replace(IDLE, consecutive_failures=3, last_error="connection failed")
    assert "conditions" not in run(settled(), failing).patch  # still Delivering


def test_manual_pause_and_deactivation_set_the_phase():
    assert run({}, replace(IDLE, standing=PAUSED_BY_HAND)).patch["phase"] == EndpointState.PAUSED
    assert (
        condition(run({}, replace(IDLE, standing=PAUSED_BY_HAND)).patch, reflect.DELIVERING)["reason"]
        == reflect.Reason.MANUALLY_PAUSED
    )
    gone = run({}, replace(IDLE, standing=DEACTIVATED, last_error="HTTP 410")).patch
    assert gone["phase"] == EndpointState.DEACTIVATED
    assert "hooklane.io/reactivate" in condition(gone, reflect.DELIVERING)["message"]


def test_an_endpoint_not_yet_in_postgres_shows_its_spec():
    patch = run({}, queue=None, synced=replace(SYNCED, paused=True)).patch
    assert patch["phase"] == EndpointState.PAUSED
    assert "pending" not in patch
    assert [c["type"] for c in patch["conditions"]] == [reflect.READY]


def test_a_pass_before_the_first_sync_keeps_ready_as_it_was():
    previous = settled()
    patch = run(previous, replace(IDLE, pending=1, oldest_pending_age=1), synced=None).patch
    assert patch == {"pending": 1, "oldestPendingAgeSeconds": 1}


# --- conditions --------------------------------------------------------------
def test_transition_time_moves_only_when_the_status_flips():
    previous = settled()
    for c in previous["conditions"]:
        c["lastTransitionTime"] = EARLIER
    edited = run(previous, synced=replace(SYNCED, generation=4, message="stored again")).patch
    ready = condition(edited, reflect.READY)
    assert (ready["lastTransitionTime"], ready["observedGeneration"], ready["message"]) == (
        EARLIER,
        4,
        "stored again",
    )
    missing = replace(SYNCED, reason=reflect.Reason.SECRET_MISSING, message="Secret gone")
    ready = condition(run(previous, synced=missing).patch, reflect.READY)
    assert (ready["status"], ready["reason"], ready["lastTransitionTime"]) == (
        "False",
        "SecretMissing",
        "2026-03-01T12:00:00Z",
    )


def test_conditions_of_other_types_are_kept():
    previous = settled()
    previous["conditions"].append({"type": "Reviewed", "status": "True", "lastTransitionTime": EARLIER})
    patch = run(previous, replace(IDLE, standing=PAUSED_BY_HAND)).patch
    assert [c["type"] for c in patch["conditions"]] == ["Ready", "Delivering", "Reviewed"]


def test_without_a_secret_nothing_is_delivering():
    missing = replace(SYNCED, reason=reflect.Reason.SECRET_MISSING, message="Secret ns/x not found")
    patch = run({}, synced=missing).patch
    assert condition(patch, reflect.READY)["status"] == "False"
    assert condition(patch, reflect.DELIVERING)["reason"] == reflect.Reason.UNSIGNED
    assert patch["phase"] == EndpointState.ACTIVE


# --- events ------------------------------------------------------------------
def test_pausing_and_resuming_post_events():
    open_ = replace(
        IDLE,
        standing=PAUSED_BY_CIRCUIT,
        consecutive_failures=20,
        paused_until=NOW + timedelta(seconds=60),
        last_error="HTTP 500",
    )
    paused = run(settled(), open_)
    assert [(e.type, e.reason) for e in paused.events] == [(reflect.EventType.WARNING, "EndpointPaused")]
    resumed = run({**settled(), **paused.patch}, IDLE)
    assert [(e.type, e.reason) for e in resumed.events] == [(reflect.EventType.NORMAL, "EndpointResumed")]


def test_deactivating_and_reactivating_post_events():
    gone = replace(IDLE, standing=DEACTIVATED, pending=3)
    deactivated = run(settled(), gone)
    assert reasons(deactivated) == ["EndpointDeactivated"]
    assert deactivated.events[0].type == reflect.EventType.WARNING
    assert reasons(run({**settled(), **deactivated.patch}, IDLE)) == ["EndpointReactivated"]


def test_growing_dead_count_posts_an_event():
    previous = {**settled(), "dead": 2}
    grown = run(previous, replace(IDLE, dead=5))
    assert reasons(grown) == ["DeliveriesDead"]
    assert grown.events[0].message.startswith("3 more dead deliveries (5 in all)")
    assert run(previous, replace(IDLE, dead=0)).events == []


def test_secret_problems_and_their_fix_post_events():
    missing = run(
        settled(),
        synced=replace(SYNCED, reason=reflect.Reason.SECRET_MISSING, message="Secret ns/x not found"),
    )
    assert [(e.type, e.reason, e.message) for e in missing.events] == [
        (reflect.EventType.WARNING, "SecretMissing", "Secret ns/x not found")
    ]
    previous = {**settled(), **missing.patch}
    invalid = run(previous, synced=replace(SYNCED, reason=reflect.Reason.SECRET_INVALID, message="bad"))
    assert reasons(invalid) == ["SecretInvalid"]
    assert reasons(run(previous, synced=SYNCED)) == ["SecretResolved"]
    # A new endpoint that is fine from the start says nothing.
    assert run({}).events == []
