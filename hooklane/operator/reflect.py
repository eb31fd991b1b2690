"""What a WebhookEndpoint's status should say, decided without I/O.

The operator feeds in what Postgres holds for the endpoint (its queue row),
what the last sync to Postgres found (generation, signing secret), and the
status the resource carries now; out come the status fields that changed and
the Kubernetes Events those changes deserve. Nothing here talks to the API
server or the database, so every rule is tested directly.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from hooklane.delivery import (
    HEADER_VALUE_PATTERN,
    MAX_HEADER_VALUE,
    MAX_PEM_CHARS,
    DeliverySpec,
    RequestTerms,
    SecretKeyRef,
    SecretLookup,
    SecretProblem,
    resolve,
)
from hooklane.endpoint_state import EndpointState, PauseReason, Standing, endpoint_state
from hooklane.errors import InvalidInput
from hooklane.guard import is_refusal
from hooklane.health import EndpointHealth
from hooklane.signing import SECRET_PREFIX, parse_secret
from hooklane.times import rfc3339_seconds

# Condition types. Ready: the spec is stored in Postgres with a usable
# signing secret. Delivering: deliveries go out right now.
READY = "Ready"
DELIVERING = "Delivering"


class Reason(StrEnum):
    """Condition reasons: CamelCase and stable, as alerts and `kubectl wait`
    key on them. A Ready condition turning False posts an Event with its
    reason too."""

    SYNCED = "Synced"
    SECRET_MISSING = "SecretMissing"
    SECRET_INVALID = "SecretInvalid"
    INVALID_SPEC = "InvalidSpec"
    # Postgres refused the spec, and would refuse it again: see the operator's log.
    STORE_REFUSED = "StoreRefused"
    DELIVERING = "Delivering"
    MANUALLY_PAUSED = "ManuallyPaused"
    CIRCUIT_OPEN = "CircuitOpen"
    DEACTIVATED = "Deactivated"
    UNSIGNED = "NoSigningSecret"
    # The URL leads to an address the destination guard refuses (hooklane/guard.py).
    DESTINATION_DENIED = "DestinationNotAllowed"
    # A WebhookEventType's name is held by a type `hooklane eventtype apply`
    # stored (local mode), which the operator neither overwrites nor deletes.
    DECLARED_LOCALLY = "DeclaredLocally"


class EventReason(StrEnum):
    """Reasons of the other Kubernetes Events posted on an endpoint; stable too."""

    SECRET_RESOLVED = "SecretResolved"
    ENDPOINT_PAUSED = "EndpointPaused"
    ENDPOINT_DEACTIVATED = "EndpointDeactivated"
    ENDPOINT_RESUMED = "EndpointResumed"
    ENDPOINT_REACTIVATED = "EndpointReactivated"
    DELIVERIES_DEAD = "DeliveriesDead"
    # spec.tenant changed, and deliveries of the old tenant's events were
    # discarded rather than sent to the new tenant's receiver.
    TENANT_CHANGED = "TenantChanged"
    REACTIVATE_REQUESTED = "ReactivateRequested"
    RESEND_REQUESTED = "ResendRequested"


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


REACTIVATE_ANNOTATION = "hooklane.io/reactivate"
RESEND_DEAD_ANNOTATION = "hooklane.io/resend-dead"

# A Secret value longer than this is not a Standard Webhooks secret (64 key
# bytes encode to 88 characters); keeping it out of the index bounds memory.
_MAX_SECRET_CHARS = 256
_PEM_START = "-----BEGIN "
_HEADER_VALUE = re.compile(HEADER_VALUE_PATTERN)


@dataclass(frozen=True)
class SecretCheck:
    """The signing secret an endpoint's secretRef resolves to: ``secret`` is
    the ``whsec_`` value, or None with the reason nothing may be signed;
    ``terms``, the request terms of its spec.delivery (headers, TLS), read
    from their Secrets. A Secret those name that is missing or unusable
    leaves the endpoint unsigned too: nothing is sent without the
    credentials its receiver expects."""

    secret: str | None
    reason: Reason
    message: str
    terms: RequestTerms | None = None


@dataclass(frozen=True, slots=True)
class Synced:
    """The outcome of the last write of a spec to Postgres."""

    generation: int | None
    paused: bool
    reason: Reason
    message: str

    @property
    def signed(self) -> bool:
        return self.reason == Reason.SYNCED


@dataclass(frozen=True)
class Queue:
    """What the status shows of an endpoint's health (hooklane/health.py),
    its state decided there, once, at the database's clock."""

    standing: Standing
    consecutive_failures: int
    paused_until: datetime | None
    last_error: str | None
    last_delivered_at: datetime | None
    pending: int
    in_flight: int
    oldest_pending_age: float | None
    dead: int = 0
    # The concurrency limit in force (adaptive concurrency moves it); 0:
    # not known, not shown.
    effective_concurrency: int = 0
    # Ordered delivery's keys held back by a dead delivery; shown only
    # when some are, as most endpoints never order.
    held_keys: int = 0

    @classmethod
    def from_health(cls, health: EndpointHealth) -> Queue:
        return cls(
            standing=health.standing,
            consecutive_failures=health.consecutive_failures,
            paused_until=health.paused_until,
            last_error=health.last_error,
            last_delivered_at=health.last_delivered_at,
            pending=health.pending,
            in_flight=health.in_flight,
            oldest_pending_age=health.oldest_pending_age,
            dead=health.dead,
            effective_concurrency=health.effective_concurrency,
            held_keys=health.held_keys,
        )


@dataclass(frozen=True, slots=True)
class Condition:
    """What a condition says: whether it holds (its status, "True" or
    "False"), why (its reason) and in words."""

    holds: bool
    reason: Reason
    message: str

    def status(
        self, type_: str, old: Mapping[str, Any] | None, generation: int | None, now: datetime
    ) -> dict[str, Any]:
        """As the resource's status carries it, with the time it last
        changed: ``old``'s while its status stays the same."""
        status = "True" if self.holds else "False"
        since = rfc3339_seconds(now)
        if old is not None and old.get("status") == status:
            since = old.get("lastTransitionTime", since)
        condition: dict[str, Any] = {
            "type": type_,
            "status": status,
            "reason": self.reason,
            "message": self.message,
            "lastTransitionTime": since,
        }
        if generation is not None:
            condition["observedGeneration"] = generation
        return condition


@dataclass(frozen=True)
class KubeEvent:
    """A Kubernetes Event to post on the resource (not a webhook event)."""

    type: EventType
    reason: Reason | EventReason
    message: str


@dataclass(frozen=True)
class Reflection:
    """Status fields to patch (None removes a field) and Events to post."""

    patch: dict[str, Any] = field(default_factory=dict)
    events: list[KubeEvent] = field(default_factory=list)


def secret_values(data: Mapping[str, str] | None) -> dict[str, str | None]:
    """A Secret's ``data`` reduced to what the operator may need: each key
    with its decoded text when it looks like a signing secret, a PEM block
    (a CA or a client certificate and key) or a header value (an API key),
    None otherwise. Every Secret of the watched namespaces passes through
    here: binary values, long ones (Helm releases) and multi-line text
    that is no PEM are not kept. Short one-line values (passwords, tokens)
    are: any of them may be a header's, and the index cannot know which
    until an endpoint refers to it."""
    values: dict[str, str | None] = {}
    for key, encoded in (data or {}).items():
        try:
            value = base64.b64decode(encoded, validate=True).decode().strip()
        except (binascii.Error, UnicodeDecodeError):
            value = ""
        values[key] = value if _kept(value) else None
    return values


def _kept(value: str) -> bool:
    if value.startswith(SECRET_PREFIX):
        return len(value) <= _MAX_SECRET_CHARS
    # Bundles often say before each certificate which one it is (certifi's,
    # `openssl x509 -text`): the PEM parser skips such text.
    if _PEM_START in value:
        return len(value) <= MAX_PEM_CHARS
    return len(value) <= MAX_HEADER_VALUE and _HEADER_VALUE.fullmatch(value) is not None


def check_secret(
    namespace: str, ref: SecretKeyRef | None, values: Mapping[str, str | None] | None
) -> SecretCheck:
    """Resolve a secretRef against the Secret's :func:`secret_values`
    (None when the Secret does not exist)."""
    if ref is None:
        return SecretCheck(
            None, Reason.SECRET_MISSING, "spec.secretRef is not set; nothing is delivered unsigned"
        )
    where = f"Secret {namespace}/{ref.name}"
    if values is None:
        return SecretCheck(
            None, Reason.SECRET_MISSING, f"{where} not found; nothing is delivered until it exists"
        )
    if ref.key not in values:
        return SecretCheck(
            None, Reason.SECRET_MISSING, f"{where} has no key {ref.key!r}; nothing is delivered until it does"
        )
    value = values[ref.key]
    if value is None or not value.startswith(SECRET_PREFIX) or len(value) > _MAX_SECRET_CHARS:
        return SecretCheck(
            None,
            Reason.SECRET_INVALID,
            f"key {ref.key!r} of {where} is not a Standard Webhooks secret ({SECRET_PREFIX} + base64)",
        )
    try:
        parse_secret(value)
    except InvalidInput as exc:
        return SecretCheck(None, Reason.SECRET_INVALID, f"key {ref.key!r} of {where}: {exc.message}")
    return SecretCheck(value, Reason.SYNCED, f"stored in Postgres, signed with key {ref.key!r} of {where}")


def reflect(
    *,
    previous: Mapping[str, Any],
    queue: Queue | None,
    synced: Synced | None,
    now: datetime,
    age_resolution: float,
) -> Reflection:
    """The status patch and Events that take ``previous`` to the state that
    ``queue`` (Postgres) and ``synced`` (the last spec write) describe.

    Either input may be unknown (None): an endpoint not yet in the last
    queue snapshot, or a status pass that runs before the operator's first
    sync of the resource. Fields fed by an unknown input keep their value.
    ``oldestPendingAgeSeconds`` grows every second while anything waits;
    it is patched only when it moved by ``age_resolution`` seconds or a
    tenth of its value, so a backlog does not mean a patch per pass."""
    desired: dict[str, Any] = {}
    if queue is not None:
        desired.update(_queue_fields(queue, previous, age_resolution))
    if synced is not None and synced.generation is not None:
        desired["observedGeneration"] = synced.generation
    phase = _phase(queue, synced, now)
    if phase is not None:
        desired["phase"] = phase

    generation = desired.get("observedGeneration", previous.get("observedGeneration"))
    old_conditions = {c.get("type"): c for c in previous.get("conditions") or []}
    new_conditions = dict(old_conditions)
    if synced is not None:
        ready = Condition(synced.signed, synced.reason, synced.message)
        new_conditions[READY] = ready.status(READY, old_conditions.get(READY), generation, now)
    delivering = _delivering(queue, synced)
    if delivering is not None:
        new_conditions[DELIVERING] = delivering.status(
            DELIVERING, old_conditions.get(DELIVERING), generation, now
        )
    if new_conditions != old_conditions:
        desired["conditions"] = list(new_conditions.values())

    patch = {key: value for key, value in desired.items() if previous.get(key) != value}
    return Reflection(patch, _events(previous, old_conditions, new_conditions, queue))


def _queue_fields(queue: Queue, previous: Mapping[str, Any], age_resolution: float) -> dict[str, Any]:
    age = int(queue.oldest_pending_age or 0)
    old_age = previous.get("oldestPendingAgeSeconds")
    if (
        isinstance(old_age, int)
        and age
        and old_age
        and abs(age - old_age) < max(age_resolution, old_age / 10)
    ):
        age = old_age
    return {
        "consecutiveFailures": queue.consecutive_failures,
        "pausedUntil": rfc3339_seconds(queue.paused_until),
        "lastError": queue.last_error,
        "lastDeliveredAt": rfc3339_seconds(queue.last_delivered_at),
        "pending": queue.pending,
        "inFlight": queue.in_flight,
        "dead": queue.dead,
        "oldestPendingAgeSeconds": age,
        "effectiveConcurrency": queue.effective_concurrency or None,
        "ordering": {"heldKeys": queue.held_keys} if queue.held_keys else None,
    }


def _phase(queue: Queue | None, synced: Synced | None, now: datetime) -> EndpointState | None:
    if queue is not None:
        return queue.standing.state
    # Not in the snapshot yet: the spec alone says whether it is paused.
    if synced is None or synced.reason == Reason.INVALID_SPEC:
        return None
    return endpoint_state(state="active", paused=synced.paused, paused_until=None, now=now).state


def _delivering(queue: Queue | None, synced: Synced | None) -> Condition | None:
    if queue is None:
        return None
    standing = queue.standing
    if standing.state == EndpointState.DEACTIVATED:
        return Condition(
            False,
            Reason.DEACTIVATED,
            f"deactivated ({queue.last_error or 'failing for too long'}); pending deliveries are "
            f"kept: set the annotation {REACTIVATE_ANNOTATION} to a new value to deliver again",
        )
    if standing.paused_by == PauseReason.MANUAL:
        return Condition(False, Reason.MANUALLY_PAUSED, "spec.paused is true; pending deliveries are kept")
    if queue.consecutive_failures and is_refusal(queue.last_error):
        return Condition(
            False,
            Reason.DESTINATION_DENIED,
            f"{queue.last_error}: change spec.url, or allow its network in "
            "HOOKLANE_ALLOWED_NETWORKS if the receiver is inside the cluster",
        )
    if standing.state in (EndpointState.PAUSED, EndpointState.PROBING):
        when = (
            f"probing since {rfc3339_seconds(queue.paused_until)}"
            if standing.state == EndpointState.PROBING
            else f"paused until {rfc3339_seconds(queue.paused_until)}"
        )
        return Condition(
            False,
            Reason.CIRCUIT_OPEN,
            f"circuit open after {queue.consecutive_failures} consecutive failures, {when}; "
            f"last error: {queue.last_error or 'unknown'}",
        )
    if synced is not None and not synced.signed:
        return Condition(False, Reason.UNSIGNED, "no usable signing secret: see the Ready condition")
    return Condition(True, Reason.DELIVERING, "deliveries go out as they are due")


def _events(
    previous: Mapping[str, Any],
    old: Mapping[str, Mapping[str, Any]],
    new: Mapping[str, Mapping[str, Any]],
    queue: Queue | None,
) -> list[KubeEvent]:
    events: list[KubeEvent] = []
    old_ready, new_ready = old.get(READY, {}), new.get(READY, {})
    if new_ready.get("reason") != old_ready.get("reason"):
        if new_ready.get("status") == "False":
            events.append(KubeEvent(EventType.WARNING, Reason(new_ready["reason"]), new_ready["message"]))
        elif old_ready.get("status") == "False":
            events.append(KubeEvent(EventType.NORMAL, EventReason.SECRET_RESOLVED, new_ready["message"]))

    old_reason = old.get(DELIVERING, {}).get("reason")
    new_delivering = new.get(DELIVERING, {})
    new_reason = new_delivering.get("reason")
    if new_reason != old_reason:
        if new_reason == Reason.CIRCUIT_OPEN:
            events.append(
                KubeEvent(EventType.WARNING, EventReason.ENDPOINT_PAUSED, new_delivering["message"])
            )
        elif new_reason == Reason.DEACTIVATED:
            events.append(
                KubeEvent(EventType.WARNING, EventReason.ENDPOINT_DEACTIVATED, new_delivering["message"])
            )
        elif old_reason == Reason.CIRCUIT_OPEN and new_reason is not None:
            events.append(
                KubeEvent(
                    EventType.NORMAL,
                    EventReason.ENDPOINT_RESUMED,
                    "a delivery succeeded: the circuit is closed",
                )
            )
        elif old_reason == Reason.DEACTIVATED and new_reason is not None:
            events.append(
                KubeEvent(EventType.NORMAL, EventReason.ENDPOINT_REACTIVATED, "the endpoint is active again")
            )

    if queue is not None:
        old_dead = previous.get("dead") or 0
        if queue.dead > old_dead:
            events.append(
                KubeEvent(
                    EventType.WARNING,
                    EventReason.DELIVERIES_DEAD,
                    f"{queue.dead - old_dead} more dead deliveries ({queue.dead} in all); set the "
                    f"annotation {RESEND_DEAD_ANNOTATION} to a new value to send them again",
                )
            )
    return events


def tenant_changed(previous: str, tenant: str, discarded: int) -> KubeEvent:
    return KubeEvent(
        EventType.WARNING,
        EventReason.TENANT_CHANGED,
        f"spec.tenant changed from {previous} to {tenant}: {discarded} pending or dead deliveries "
        f"of {previous}'s events discarded, never to be sent to this endpoint",
    )


def check_terms(
    check: SecretCheck, namespace: str, delivery: DeliverySpec, lookup: SecretLookup
) -> SecretCheck:
    """``check`` with the request terms of ``delivery`` resolved, or unsigned
    with the reason when a Secret they name is missing or unusable."""
    if check.secret is None:
        return check
    try:
        terms = resolve(delivery, namespace, lookup)
    except SecretProblem as exc:
        return SecretCheck(None, Reason.SECRET_MISSING if exc.missing else Reason.SECRET_INVALID, exc.message)
    return SecretCheck(check.secret, check.reason, check.message, terms)
