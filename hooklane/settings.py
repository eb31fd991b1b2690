"""Configuration: one typed object, read from the environment once and
checked whole at start, so that a bad value stops the process with its
variable named instead of making a worker that silently does nothing."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import field, fields
from ipaddress import IPv4Network, IPv6Network
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError
from pydantic.dataclasses import dataclass

from hooklane.errors import InvalidInput
from hooklane.guard import parse_networks
from hooklane.policies import CircuitPolicy, Count, RetryPolicy, Seconds
from hooklane.secrets import DEFAULT_GRACE_SECONDS, Keyring
from hooklane.spec import check_tenant
from hooklane.tokens import Tokens

# How far back a setting may reach: ten years. Postgres computes
# ``now() - interval`` of it, and a larger one (1e13, meant as "for ever")
# is out of its range: maintenance would fail on every pass.
MAX_AGE_SECONDS = 10 * 365 * 24 * 3600.0
Age = Annotated[float, Field(gt=0, le=MAX_AGE_SECONDS, allow_inf_nan=False)]

logger = logging.getLogger(__name__)

_PREFIX = "HOOKLANE_"
# The build and test scripts under hack/ read variables of their own with
# the same prefix; they are not settings, and not typos.
_TOOLING = (
    "HOOKLANE_CLUSTER_",
    "HOOKLANE_DEBIAN_",
    "HOOKLANE_ENVTEST_",
    "HOOKLANE_IMAGE_",
    "HOOKLANE_TOOLS_",
)
# The policies are read from HOOKLANE_RETRY_* and HOOKLANE_CIRCUIT_*.
_NESTED = {"retry": RetryPolicy, "circuit": CircuitPolicy}

# 0 turns the metrics endpoint off.
Port = Annotated[int, Field(ge=0, le=65535)]

# Where each command serves /metrics (the worker its probes too) when
# HOOKLANE_METRICS_PORT is unset: ports apart, so that a worker and the API
# run side by side on one machine as they come. The chart sets the port of
# each pod, which has its own network.
METRICS_PORTS: dict[Literal["worker", "api"], int] = {"worker": 9100, "api": 9101}


def _networks(value: Any) -> Any:
    # From the environment: comma-separated text, read the one way
    # `parse_networks` reads it; from code, networks already.
    if not isinstance(value, str):
        return value
    try:
        return parse_networks(value)
    except InvalidInput as exc:
        raise ValueError(exc.message) from None


Networks = Annotated[tuple[IPv4Network | IPv6Network, ...], BeforeValidator(_networks)]


def _keyring(value: Any) -> Any:
    # From the environment: the key ids and keys, read by `Keyring.parse`,
    # whose messages never quote a key; from code, a Keyring already.
    if not isinstance(value, str):
        return value
    try:
        return Keyring.parse(value)
    except InvalidInput as exc:
        raise ValueError(exc.message) from None


EncryptionKey = Annotated[Keyring, BeforeValidator(_keyring)]


def _tokens(variable: str, *, tenants_allowed: bool) -> BeforeValidator:
    # From the environment: the token list, read by `Tokens.parse`, whose
    # messages never quote a token; from code, Tokens already.
    def parse(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return Tokens.parse(value, variable, tenants_allowed=tenants_allowed)
        except InvalidInput as exc:
            raise ValueError(exc.message) from None

    return BeforeValidator(parse)


ApiTokens = Annotated[Tokens, _tokens("HOOKLANE_API_TOKENS", tenants_allowed=True)]
# Admin tokens act for every tenant; a file read for them (TokenSource)
# takes its rule from the Tokens given here, hence the default's.
AdminTokens = Annotated[Tokens, _tokens("HOOKLANE_ADMIN_TOKENS", tenants_allowed=False)]


def _tenant(value: Any) -> Any:
    # spec.tenant's rule (hooklane.spec.check_tenant), in its words.
    if value is None:
        return value
    try:
        return check_tenant(value, "tenant")
    except InvalidInput as exc:
        raise ValueError(exc.message) from None


Tenant = Annotated[str | None, BeforeValidator(_tenant)]
TokenFile = Annotated[str | None, Field(min_length=1)]


def _words(value: Any) -> Any:
    # From the environment: comma-separated, spaces around each ignored.
    if not isinstance(value, str):
        return value
    return tuple(word.strip() for word in value.split(",") if word.strip())


# A CSP source a page may be framed by: a scheme and host, a wildcard for
# its subdomains, a port. Nothing that could end the directive (`;`, `,`,
# spaces) or name a scheme of its own (data:, javascript:).
_FRAME_SOURCE = r"^https?://(\*\.)?[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?(:([0-9]{1,5}|\*))?$"
FrameAncestors = Annotated[
    tuple[Annotated[str, Field(pattern=_FRAME_SOURCE)], ...], BeforeValidator(_words), Field(max_length=32)
]
# A host a self-service endpoint's URL may name: exactly, or any subdomain
# of one with `*.`. Lowercase DNS labels, as a URL's host is compared
# lowercased: a rule no host could match (an empty label, a trailing dot)
# is refused rather than silently allowing nothing.
_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
_HOST_RULE = rf"^(\*\.)?{_LABEL}(\.{_LABEL})*$"
HostRules = Annotated[
    tuple[Annotated[str, Field(pattern=_HOST_RULE, max_length=253)], ...],
    BeforeValidator(_words),
    Field(max_length=256),
]
# An event type a self-service endpoint may subscribe to: a type, or a
# prefix ending in `.*` (spec.eventTypes' own syntax).
_TYPE_RULE = r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*(\.\*)?$"
TypeRules = Annotated[
    tuple[Annotated[str, Field(pattern=_TYPE_RULE, max_length=255)], ...],
    BeforeValidator(_words),
    Field(max_length=256),
]
_DNS_LABEL = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"

# Printable and short enough for a pod name, which is what it usually is.
WorkerId = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[!-~]+$")]


def _default_worker_id() -> str:
    # A pod's hostname is its name; the pid tells processes of one host apart.
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class Settings:
    database_url: str = ""
    # Who reserved a delivery: recorded in deliveries.attempted_by and shown
    # by `hooklane status`, so that an operator can tell which worker holds
    # or last tried what.
    worker_id: WorkerId = field(default_factory=_default_worker_id)
    # Deliveries in flight at once in one worker process, over all endpoints.
    # Each waits on the network, not on the CPU; enough of them hide the
    # round trips to Postgres between reservations (docs/benchmarks.md).
    worker_concurrency: Count = 256
    # Those quick slots are for calls that answer quickly: a call still
    # unanswered after long_call_seconds gives its slot back and is counted
    # against worker_long_calls instead, and an endpoint whose calls run
    # that long waits for room there (hooklane/worker/slots.py). Receivers
    # that turn slow together then share the long budget, and never take
    # the slots of those that answer (issue 39; docs/concepts.md).
    worker_long_calls: Count = 1024
    long_call_seconds: Seconds = 0.25
    # Deliveries reserved per round trip at most.
    reserve_batch: Count = 256
    # A tenant's calls in flight at most, over every worker (its live
    # leases, whichever worker holds them), so that one tenant's endpoints
    # together cannot take the capacity of the others however many it has
    # or however large their limits: each endpoint's maxConcurrency bounds
    # only itself. Unset: no ceiling. Every worker should have the same.
    tenant_max_in_flight: Count | None = None
    # Unset: the command's own (METRICS_PORTS).
    metrics_port: Port | None = None
    metrics_host: Annotated[str, Field(min_length=1)] = "0.0.0.0"
    # A lease outlives the endpoint's whole-call deadline by this much before
    # rescue may hand the delivery to another worker.
    lease_grace_seconds: Seconds = 10.0
    # The pace of an adaptive endpoint's concurrency limit
    # (spec.delivery.adaptiveConcurrency): it rises by one a step after its
    # last change while the receiver keeps up, and at a limit of 1 an
    # overload without a Retry-After holds the endpoint for a step.
    adaptive_step_seconds: Seconds = 5.0
    # Polling interval when no notification arrives: due retries, unpaused
    # endpoints and ownership changes are noticed this often.
    poll_seconds: Seconds = 1.0
    # The probe for published events (hooklane/worker/commits.py): publishes
    # send no notification, so a worker asks Postgres what committed since
    # its last probe, sqrt(r * probe_pace) times a second while events come
    # at r per second (45 at 10/s, 141 at 100/s), no more often than every
    # probe_min_seconds, stretching when none come up to probe_max_seconds;
    # sooner, when the snapshot the rebalancer reads shows that a
    # transaction ended since (every rebalance_seconds). The API's group
    # commit has it probe at once.
    probe_min_seconds: Seconds = 0.005
    probe_max_seconds: Seconds = 10.0
    probe_pace: Annotated[float, Field(gt=0, le=1_000_000, allow_inf_nan=False)] = 200.0
    # How often a worker re-checks the live workers and rebalances partitions.
    rebalance_seconds: Seconds = 1.0
    # How often per-endpoint gauges are refreshed from Postgres.
    gauges_seconds: Seconds = 10.0
    # Which endpoints get series of their own (hooklane/health.py,
    # exported_endpoints): "top", the metrics_endpoints_top most delayed and
    # the as many with the most dead deliveries of each worker's partitions,
    # so that a worker exports a bounded number however many endpoints
    # there are and the alerts still see the worst ones; "all", every
    # endpoint (4 series each: 40,000 at 10,000 endpoints); "tenant", none,
    # per-tenant sums instead (hooklane_tenant_*).
    metrics_endpoints: Literal["top", "all", "tenant"] = "top"
    metrics_endpoints_top: Count = 100
    # How often maintenance runs (rescue, deactivation, retention).
    maintenance_seconds: Seconds = 5.0
    # How often a worker reads the queues of its partitions again, from its
    # last sweep on and a tenth of them from the start (a safety net: see
    # ReadySweep).
    sweep_seconds: Seconds = 60.0
    deactivate_after_seconds: Age = 5 * 24 * 3600.0
    event_retention_seconds: Age = 30 * 24 * 3600.0
    # How long each attempt's record is kept: its whole day is dropped once
    # the day ended this long ago (delivery_attempts is partitioned by day).
    # As long as events by default, so a delivery's history goes with it.
    attempt_retention_seconds: Age = 30 * 24 * 3600.0
    # How long SIGTERM waits for deliveries in flight; 0 records them as
    # they are, without waiting.
    drain_seconds: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 70.0
    # How often the operator writes queue health back onto each
    # WebhookEndpoint's status; one query serves all endpoints per interval.
    operator_status_seconds: Seconds = 10.0
    # At most this many status patches and Events per second from the
    # operator's status pass, whatever changed at once, so that a burst (a
    # restart, an outage of many receivers) never floods the API server.
    operator_status_writes_per_second: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 50.0
    # At most this many resources handled at once by the operator once its
    # start is over (kopf's worker limit, see operator/kopf_fixes.py): a
    # burst of changes waits as raw events, not as that many handlers in
    # progress, each holding its resource's state.
    operator_workers: Count = 500
    # A watch the API server sends nothing on (not even a bookmark, which
    # it sends about once a minute) for this long is dropped and resumed
    # from its last resourceVersion: a restarted API server can strand a
    # watch, open but silent, and the operator would miss every change
    # until the watch ended (kopf's inactivity timeout; 70 s is kopf's own).
    operator_watch_idle_seconds: Seconds = 70.0
    # Networks deliveries may reach beyond globally routable addresses
    # (hooklane/guard.py): receivers inside the cluster, loopback for tests.
    # Empty by default, so that nothing private is reachable by accident.
    allowed_networks: Networks = ()
    # Seals signing secrets in Postgres (hooklane/secrets.py): unset, they
    # are stored as they are. Its repr shows key ids only.
    encryption_key: EncryptionKey | None = None
    # How long a replaced signing secret still signs next to the new one.
    secret_grace_seconds: Seconds = DEFAULT_GRACE_SECONDS
    # `hooklane api`: where it listens (its /metrics is on metrics_port_of("api")).
    api_host: Annotated[str, Field(min_length=1)] = "0.0.0.0"
    api_port: Annotated[int, Field(ge=1, le=65535)] = 8080
    # Tokens that may publish (hooklane/tokens.py has the format), from
    # the variable, a file re-read when it changes (a mounted Secret), or
    # both. Without any, `hooklane api` refuses to start.
    api_tokens: ApiTokens = field(default_factory=Tokens)
    api_tokens_file: TokenFile = None
    # Tokens of the admin API and the dashboard; without any, both answer 404.
    admin_tokens: AdminTokens = field(default_factory=lambda: Tokens(tenants_allowed=False))
    admin_tokens_file: TokenFile = None
    # A request body larger than this is refused (413) before it is read whole.
    api_max_body_bytes: Annotated[int, Field(ge=1024, le=64 * 1024 * 1024)] = 1024 * 1024
    # Events in one POST /v1/events/batch at most.
    api_batch_max_events: Annotated[int, Field(ge=1, le=10_000)] = 100
    # How long a request may wait for the database before it is answered
    # 503 with Retry-After: a producer retries rather than hangs.
    api_ack_timeout_seconds: Seconds = 5.0
    # After SIGTERM, how long /readyz fails before the API stops listening:
    # the time Kubernetes takes to stop routing requests to the pod.
    api_drain_seconds: Annotated[float, Field(ge=0, le=300, allow_inf_nan=False)] = 5.0
    # Connections of one API process to Postgres.
    api_pool_size: Annotated[int, Field(ge=2, le=1000)] = 10
    # Of those, how many only ingest may use: the admin API, the dashboard
    # and the tenants share the rest (hooklane/api/shares.py). Unset, 4 (the
    # group committer's connections at most), or the pool less one.
    api_pool_ingest_reserved: Annotated[int, Field(ge=1, le=999)] | None = None
    # How many the tenant API and the portal may hold at once between them.
    # Unset, half of what the reserve leaves (at least 1).
    api_pool_tenant_max: Annotated[int, Field(ge=1, le=999)] | None = None
    # A connection that has not sent a whole request head (request line and
    # headers) this long after connecting, or after its previous answer, is
    # closed: a client trickling headers, or none, holds no socket longer.
    api_header_timeout_seconds: Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)] = 10.0
    # Connections open at once to the API's port; past it, a new one is
    # answered 503 and closed. It must fit, with the pool, in the open files
    # limit (hooklane/api/server.py checks at start).
    api_max_connections: Annotated[int, Field(ge=1, le=1_000_000)] = 1000
    # The tenant portal and tenant API (docs/portal.md). A signed link is
    # good for one use within this long; the session it opens, or a
    # tenant token, for portal_session_seconds.
    portal_link_seconds: Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)] = 300.0
    portal_session_seconds: Annotated[float, Field(gt=0, le=7 * 24 * 3600, allow_inf_nan=False)] = 3600.0
    # The platform's name and colour, on every portal page.
    portal_name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[ -~]+$")] = "Webhooks"
    portal_colour: Annotated[str, Field(pattern=r"^#[0-9a-fA-F]{6}$")] = "#2457a6"
    # Pages that may show the portal in a frame (CSP frame-ancestors);
    # empty, none may.
    portal_frame_ancestors: FrameAncestors = ()
    # Where tenants' own endpoints are written: "off" (no tenant may manage
    # endpoints), "local" (Postgres, as `hooklane endpoint apply` does) or
    # "kubernetes" (WebhookEndpoint resources and Secrets in
    # portal_namespace, which the operator turns into rows).
    portal_endpoints: Literal["off", "local", "kubernetes"] = "off"
    portal_namespace: Annotated[str, Field(pattern=_DNS_LABEL)] = "default"
    # The bounds of self-service: endpoints per tenant, the event types
    # they may subscribe to (empty: any), the hosts their URLs may name
    # (empty: any the destination guard allows), https only.
    portal_max_endpoints: Annotated[int, Field(ge=0, le=10_000)] = 10
    portal_event_types: TypeRules = ()
    portal_url_hosts: HostRules = ()
    portal_https_only: bool = True
    # The most of a worker's capacity a tenant may ask for: one endpoint's
    # calls in flight, and how long each may hold its slot. Within the
    # spec's own limits (256, 60 s); the defaults are the spec's defaults,
    # so that a tenant gets what an endpoint gets unless the platform
    # chooses more. Endpoints the platform writes are not bounded.
    portal_max_concurrency: Annotated[int, Field(ge=1, le=256)] = 4
    portal_max_timeout_seconds: Annotated[int, Field(ge=1, le=60)] = 5
    # Operational events (hooklane.endpoint.*) are published for this
    # tenant; unset, none are. At most one of each kind per endpoint per
    # notification_interval_seconds.
    notifications_tenant: Tenant = None
    notification_interval_seconds: Seconds = 3600.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    circuit: CircuitPolicy = field(default_factory=CircuitPolicy)

    def metrics_port_of(self, command: Literal["worker", "api"]) -> int:
        """The port ``command`` serves its metrics on; 0: none."""
        return METRICS_PORTS[command] if self.metrics_port is None else self.metrics_port

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """``HOOKLANE_<FIELD>`` for each plain field; ``HOOKLANE_RETRY_<FIELD>``
        and ``HOOKLANE_CIRCUIT_<FIELD>`` for the policies. ``InvalidInput``
        names the first variable at fault."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        known: set[str] = set()
        for f in fields(cls):
            nested = _NESTED.get(f.name)
            if nested is None:
                known.add(_variable(f.name))
                if _variable(f.name) in env:
                    values[f.name] = env[_variable(f.name)]
                continue
            inner = {
                g.name: env[_variable(f.name, g.name)]
                for g in fields(nested)
                if _variable(f.name, g.name) in env
            }
            known.update(_variable(f.name, g.name) for g in fields(nested))
            if inner:
                values[f.name] = inner
        for name in sorted(set(env) - known):
            if name.startswith(_PREFIX) and not name.startswith(_TOOLING):
                logger.warning("%s is not a Hooklane setting; ignored", name)
        try:
            return cls(**values)
        except ValidationError as exc:
            raise _invalid(exc.errors()[0]) from None


def _invalid(error: Any) -> InvalidInput:
    # An item of a list setting (portal_url_hosts) is named in the message:
    # its index is no part of the variable's name.
    path = [part for part in error["loc"] if isinstance(part, str)]
    item = "".join(f"item {part}: " for part in error["loc"] if isinstance(part, int))
    if path and path[-1] in _NESTED:
        # a rule between two fields of a policy
        return InvalidInput(_variable(*path) + "_*", error["msg"].removeprefix("Value error, "))
    if error["type"] == "value_error":
        # our own validator's words, which quote the value already
        return InvalidInput(_variable(*path), item + error["msg"].removeprefix("Value error, "))
    shown = repr(error["input"])
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return InvalidInput(_variable(*path), f"{item}{error['msg'].lower()}, not {shown}")


def _variable(*path: str) -> str:
    return _PREFIX + "_".join(path).upper()
