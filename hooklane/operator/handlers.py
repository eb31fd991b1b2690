"""kopf handlers: WebhookEndpoint resources into Postgres, queue health back.

The flow for one endpoint:

- create and update (of spec) upsert it through the same store call as
  ``hooklane endpoint apply``; the signing secret comes from the
  ``secrets`` index, so a missing or malformed Secret stores the endpoint
  without one (never reserved, nothing sent unsigned) and says why in the
  Ready condition;
- at the operator's start, kopf runs those handlers for what changed while
  it was down, and one loop compares every other resource with what one
  query read from Postgres, upserting only where they differ: a restart
  costs no write and no handler per unchanged resource;
- a change to a referenced Secret upserts every endpoint that uses it, so
  a rotation reaches the workers (they read the secret at each reservation)
  without a restart;
- deletion waits on a finalizer until the row is gone;
- one status pass per interval (:mod:`hooklane.operator.reflector`) reads
  from Postgres only the endpoints whose visible health changed and patches
  only those resources, paced; no timer per resource;
- a store error is waited out and retried when it is transient, and
  otherwise reported once (:func:`kopf_error`); a spec Postgres refuses
  turns Ready False with reason StoreRefused, as an invalid spec does.

Decisions live in :mod:`hooklane.operator.reflect`, SQL in the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import kopf

from hooklane import kube, store
from hooklane.crd import GROUP, PLURAL, VERSION
from hooklane.errors import InvalidInput, StoreError
from hooklane.health import EndpointHealth
from hooklane.operator import kopf_fixes, reflect, reflector
from hooklane.operator.reflector import Observed
from hooklane.settings import Settings
from hooklane.spec import EndpointSpec, parse_spec

FINALIZER = "hooklane.io/finalizer"

# A database outage is waited out, not reported as a broken resource.
RETRY_DELAY_SECONDS = 5.0

logger = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)
# One encoder for every index entry: json.dumps with separators builds one
# per call.
_COMPACT = json.JSONEncoder(separators=(",", ":"))
# A kopf worker keeps its slot until it has been idle this long (kopf's
# default is 5 s): at the worker limit, that would cap handling at a fifth
# of the limit per second.
WORKER_IDLE_SECONDS = 1.0
_V = TypeVar("_V")


@dataclass(frozen=True, slots=True)
class Declared:
    """What the ``endpoints`` index keeps of a WebhookEndpoint: its spec and
    status as JSON text, decoded only when an event or a status pass needs
    them. Held as decoded objects they were most of the operator's memory
    per resource (docs/benchmarks.md, section 8)."""

    spec_text: str
    generation: int | None
    uid: str
    status_text: str

    @classmethod
    def of(cls, spec: dict[str, Any], generation: int | None, uid: str, status: dict[str, Any]) -> Declared:
        return cls(_COMPACT.encode(spec), generation, uid, _COMPACT.encode(status))

    def spec(self) -> dict[str, Any]:
        return dict(json.loads(self.spec_text))

    def observed(self) -> Observed:
        return Observed(self.uid, json.loads(self.status_text))


@dataclass(slots=True)
class Tracked:
    """Per endpoint, shared by its handlers, the Secret handler and the
    status pass. The lock makes each read-index-then-upsert one step, so a
    Secret event and a spec edit never store a stale mix."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    synced: reflect.Synced | None = None
    # A Secret it uses changed and the upsert has not succeeded yet. kopf
    # never retries an event handler, so the status pass does.
    stale: bool = False
    # What the last upsert stored (in Snapshot.stored's terms) and the loop
    # time Postgres acknowledged it at.
    written: tuple[Any, ...] | None = None
    written_at: float | None = None
    # Events a sync decided on, for the next handler that has the body to
    # post them on (a Secret's handler does not).
    events: list[reflect.KubeEvent] = field(default_factory=list)


def stored(endpoint: EndpointSpec | EndpointHealth) -> tuple[Any, ...]:
    """The spec fields endpoint_health returns, of what was written or what
    was read: enough to tell that a row is gone, or older than the last
    write (a failover to a replica that lagged, a restore from backup)."""
    return (endpoint.tenant, endpoint.url, endpoint.paused, endpoint.max_concurrency)


def register(registry: kopf.OperatorRegistry, config: Settings) -> None:
    """Wire the handlers into ``registry``. Done here rather than with
    decorators at import so that each operator has a registry of its own."""
    kopf_fixes.apply()
    resource = (GROUP, VERSION, PLURAL)
    # An explicit registry starts without kopf's default logins.
    kopf.on.login(registry=registry)(kube.login)
    kopf.on.startup(registry=registry)(startup)  # type: ignore[arg-type]
    kopf.on.cleanup(registry=registry)(cleanup)
    kopf.on.probe(id="database", registry=registry)(database)

    # The ignores below: kopf's callback protocols type ``namespace`` as
    # optional (for cluster-scoped resources; ours and Secrets are
    # namespaced, so the handlers take a str) and cannot name the indices it
    # passes as extra keyword arguments (``endpoints``, ``secrets``).
    kopf.index("v1", "secrets", id="secrets", registry=registry)(index_secret)  # type: ignore[arg-type]
    kopf.index(*resource, id="endpoints", registry=registry)(index_endpoint)  # type: ignore[arg-type]
    kopf.index(*resource, id="endpoints_by_secret", registry=registry)(index_endpoint_by_secret)  # type: ignore[arg-type]

    # No resume handler: kopf runs create and update handlers for what
    # changed while the operator was down, and the first status pass
    # compares every other resource with Postgres in one loop.
    kopf.on.create(*resource, id="sync", when=_after_indexing, registry=registry)(sync)  # type: ignore[arg-type]
    kopf.on.update(*resource, id="sync", field="spec", registry=registry)(sync)  # type: ignore[arg-type]
    kopf.on.event("v1", "secrets", when=_referenced, registry=registry)(secret_changed)  # type: ignore[arg-type]
    kopf.on.delete(*resource, registry=registry)(delete)  # type: ignore[arg-type]
    kopf.on.update(
        *resource,
        id="reactivate",
        field=("metadata", "annotations", reflect.REACTIVATE_ANNOTATION),
        registry=registry,
    )(reactivate)  # type: ignore[arg-type]
    kopf.on.update(
        *resource,
        id="resend_dead",
        field=("metadata", "annotations", reflect.RESEND_DEAD_ANNOTATION),
        registry=registry,
    )(resend_dead)  # type: ignore[arg-type]


async def startup(
    *,
    settings: kopf.OperatorSettings,
    memo: kopf.Memo,
    endpoints: kopf.Index[Key, Declared],
    secrets: kopf.Index[Key, dict[str, str | None]],
    **_: Any,
) -> None:
    config: Settings = memo.config
    settings.persistence.finalizer = FINALIZER
    settings.persistence.diffbase_storage = kopf_fixes.Essence()
    settings.queueing.worker_limit = config.operator_workers
    settings.queueing.idle_timeout = WORKER_IDLE_SECONDS
    settings.watching.inactivity_timeout = config.operator_watch_idle_seconds
    # kopf would post an Event for every handler run; the resource's Events
    # are the ones this module posts, plus handler failures.
    settings.posting.level = logging.WARNING
    async with _store_errors():
        memo.pool = await store.create_pool(config.database_url, min_size=1, max_size=4)
    memo.tracked = {}
    memo.at_start = AtStart()
    memo.reflector = reflector.Reflector(
        memo.pool,
        settings,
        age_step=config.operator_status_seconds,
        writes_per_second=config.operator_status_writes_per_second,
    )
    memo.indexes = (endpoints, secrets)


def start_status_loop(memo: kopf.Memo) -> None:
    """Once kopf's indexes are filled (it runs no handler and evaluates no
    filter before): a pass before that would take every resource for one
    this operator does not watch."""
    config: Settings = memo.config
    # kopf hands each resource's handlers a shallow copy of the memo: the
    # task lives on the Reflector they all share.
    memo.reflector.start(
        lambda: reflector.run_forever(config.operator_status_seconds, lambda: status_pass(memo))
    )


async def cleanup(*, memo: kopf.Memo, **_: Any) -> None:
    await memo.reflector.stop()
    await memo.pool.close()


async def database(*, memo: kopf.Memo, **_: Any) -> bool:
    """Liveness: an operator that cannot reach Postgres is not working."""
    async with store.acquire(memo.pool) as conn:
        await store.partition_count(conn)
    return True


async def index_secret(
    *, namespace: str, name: str, body: kopf.Body, **_: Any
) -> dict[Key, dict[str, str | None]]:
    return {(namespace, name): reflect.secret_values(body.get("data"))}


async def index_endpoint(
    *, namespace: str, name: str, body: kopf.Body, meta: kopf.Meta, **_: Any
) -> dict[Key, Declared]:
    # A resource on its way out must not be stored again by a late Secret
    # event, nor reflected onto; an empty mapping drops it from the index.
    if meta.get("deletionTimestamp"):
        return {}
    # The body's own dicts: kopf's spec and status views resolve their path
    # again for every key read, a restart's largest cost of this function.
    spec, status = body.get("spec") or {}, body.get("status") or {}
    return {(namespace, name): Declared.of(spec, meta.get("generation"), meta["uid"], status)}


async def index_endpoint_by_secret(
    *, namespace: str, name: str, spec: kopf.Spec, meta: kopf.Meta, **_: Any
) -> dict[Key, str]:
    """Every Secret the endpoint reads: its signing secret's, and those of
    its spec.delivery (headers, TLS), whichever of them is valid."""
    if meta.get("deletionTimestamp"):
        return {}
    ref = spec.get("secretRef") or {}
    names = {ref["name"]} if isinstance(ref, dict) and ref.get("name") else set()
    # An invalid spec is the sync's to report; its signing secret's name is
    # still followed.
    with contextlib.suppress(InvalidInput):
        if spec.get("delivery"):
            names |= parse_spec(namespace, name, dict(spec)).delivery.secret_names()
    return {(namespace, secret): name for secret in names}


async def sync(
    *,
    namespace: str,
    name: str,
    status: kopf.Status,
    body: kopf.Body,
    patch: kopf.Patch,
    memo: kopf.Memo,
    endpoints: kopf.Index[Key, Declared],
    secrets: kopf.Index[Key, dict[str, str | None]],
    **_: Any,
) -> None:
    start_status_loop(memo)
    synced = await _sync(memo, endpoints, secrets, namespace, name)
    async with _store_errors(), store.acquire(memo.pool) as conn:
        found = await store.endpoint_health(conn, endpoint=(namespace, name))
    _write(body, status, patch, reflect.Queue.from_health(found[0]) if found else None, synced, memo.config)
    _post(body, _tracked(memo, (namespace, name)))
    # What this patch writes is not what the status pass reflected last.
    memo.reflector.forget((namespace, name))


def _after_indexing(*, memo: kopf.Memo, **_: Any) -> bool:
    """kopf evaluates handler filters only once every index is filled, and
    then evaluates the first changing handler's for every resource's event
    (to learn whether any handler is for it): the first evaluation starts
    the status loop. It lets every event through."""
    start_status_loop(memo)
    return True


async def secret_changed(
    *,
    namespace: str,
    name: str,
    memo: kopf.Memo,
    endpoints: kopf.Index[Key, Declared],
    endpoints_by_secret: kopf.Index[Key, str],
    secrets: kopf.Index[Key, dict[str, str | None]],
    **_: Any,
) -> None:
    """Store the new secret (or none, once deleted) in every endpoint that
    references this Secret; the status pass reports the outcome."""
    referrers = list(endpoints_by_secret.get((namespace, name), ()))
    for endpoint in referrers:
        _tracked(memo, (namespace, endpoint)).stale = True
    # Thousands of endpoints may share it: changes are served first.
    async for endpoint in reflector.idle_steps(referrers):
        try:
            # At the start, every Secret is listed: most of its endpoints
            # already hold its value.
            if not await _unchanged(memo, endpoints, secrets, namespace, endpoint):
                await _sync(memo, endpoints, secrets, namespace, endpoint)
        except kopf.TemporaryError as exc:
            logger.warning(
                "%s/%s keeps its old secret until the next status pass: %s",
                namespace,
                endpoint,
                exc,
                extra={"action": "rotate"},
            )


def _referenced(*, namespace: str, name: str, endpoints_by_secret: kopf.Index[Key, str], **_: Any) -> bool:
    return (namespace, name) in endpoints_by_secret


async def delete(*, namespace: str, name: str, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """The endpoint and its deliveries (pending and dead) go; events stay
    listable for reconciliation. See docs/operator.md."""
    async with _tracked(memo, (namespace, name)).lock, _store_errors(), store.acquire(memo.pool) as conn:
        found = await store.delete_endpoint(conn, namespace, name)
    memo.tracked.pop((namespace, name), None)
    memo.at_start.record((namespace, name), None)
    logger.info("removed from Postgres with its deliveries" if found else "was not in Postgres")


async def reactivate(
    *,
    namespace: str,
    name: str,
    new: str | None,
    body: kopf.Body,
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    if not new:
        return
    async with _store_errors(), store.acquire(memo.pool) as conn:
        done = await store.reactivate_endpoint(conn, namespace, name)
    if done is store.Reactivation.REACTIVATED:
        kopf.event(
            body,
            type=reflect.EventType.NORMAL,
            reason=reflect.EventReason.REACTIVATE_REQUESTED,
            message=f"{reflect.REACTIVATE_ANNOTATION}={new}: the endpoint is active again",
        )
    elif done is store.Reactivation.NOT_DEACTIVATED:
        # Its circuit is the worker's: left as it is. The annotation goes, so
        # that the same value set again once it is deactivated still counts.
        logger.info(
            f"{reflect.REACTIVATE_ANNOTATION}={new}: the endpoint is not deactivated; nothing changed"
        )
        patch.metadata.annotations[reflect.REACTIVATE_ANNOTATION] = None


async def resend_dead(
    *, namespace: str, name: str, new: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    if not new:
        return
    async with _store_errors(), store.acquire(memo.pool) as conn:
        count = await store.resend_dead(conn, namespace, name)
    if count is None:
        # created a moment ago, and its sync has not stored it yet
        raise kopf.TemporaryError("the endpoint is not stored yet", delay=5)
    kopf.event(
        body,
        type=reflect.EventType.NORMAL,
        reason=reflect.EventReason.RESEND_REQUESTED,
        message=f"{reflect.RESEND_DEAD_ANNOTATION}={new}: {count} dead deliveries queued again",
    )


async def status_pass(memo: kopf.Memo) -> None:
    """Retry the syncs a Secret change left undone, store again what
    Postgres lost, then reflect what changed there onto the resources."""
    endpoints, secrets = memo.indexes
    config: Settings = memo.config
    refl: reflector.Reflector = memo.reflector
    if not memo.at_start.reconciled:
        await _reconcile(memo, endpoints, secrets)
    memo.at_start.expire(after=max(60.0, 6 * config.operator_status_seconds))
    for key, tracked in list(memo.tracked.items()):
        if tracked.stale:
            await _sync(memo, endpoints, secrets, *key)
            refl.forget(key)
    async with _store_errors():
        changed = await refl.changed()
    for endpoint_id in changed.gone:
        key = refl.gone(endpoint_id)
        if key is not None and _forgot(memo, key, None) and endpoints.get(key):
            await _resync(memo, endpoints, secrets, key)
    writes = []
    for health, digest in changed.health:
        key = (health.namespace, health.name)
        if _forgot(memo, key, health) and endpoints.get(key):
            await _resync(memo, endpoints, secrets, key)
            continue
        tracked = memo.tracked.get(key)
        declared = _first(endpoints.get(key, ()))
        write = refl.plan(
            health,
            digest,
            declared.observed() if declared is not None else None,
            tracked.synced if tracked else None,
            config.operator_status_seconds,
        )
        if write is not None:
            writes.append(write)
    for key, tracked in list(memo.tracked.items()):
        if tracked.events and (declared := _first(endpoints.get(key, ()))) is not None:
            events, tracked.events = tracked.events, []
            await refl.post(key, declared.observed(), events)
    for write in writes:
        await refl.write(write)


def _forgot(memo: kopf.Memo, key: Key, health: EndpointHealth | None) -> bool:
    """Postgres no longer holds what the last upsert of ``key`` stored,
    although Postgres acknowledged it before this pass's query began."""
    tracked = memo.tracked.get(key)
    taken = memo.reflector.taken
    if tracked is None or tracked.written is None or tracked.written_at is None or taken is None:
        return False
    # A write acknowledged after the query began may be missing from it
    # without being lost.
    if taken <= tracked.written_at:
        return False
    return health is None or stored(health) != tracked.written


async def _resync(
    memo: kopf.Memo,
    endpoints: kopf.Index[Key, Declared],
    secrets: kopf.Index[Key, dict[str, str | None]],
    key: Key,
) -> None:
    # The resource is the source of truth: store it again.
    logger.warning(
        "%s/%s: Postgres no longer holds what was stored there; storing it again",
        *key,
        extra={"action": "resync"},
    )
    await _sync(memo, endpoints, secrets, *key)
    memo.reflector.forget(key)


@dataclass
class AtStart:
    """What Postgres holds of every endpoint, while the operator starts:
    loaded in one query when the first status pass or Secret event asks, kept up
    to date by every upsert, and dropped once the start is over."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    stored: dict[Key, store.Stored] | None = None
    loaded_at: float | None = None
    # Every resource indexed at the start has been compared with Postgres.
    reconciled: bool = False

    async def get(self, memo: kopf.Memo, key: Key) -> store.Stored | None:
        if self.loaded_at is None:
            await self._load(memo)
        return None if self.stored is None else self.stored.get(key)

    async def _load(self, memo: kopf.Memo) -> None:
        async with self.lock:
            if self.loaded_at is None:
                config: Settings = memo.config
                async with _store_errors(), store.acquire(memo.pool) as conn:
                    self.stored = await store.stored_endpoints(conn, config.encryption_key)
                self.loaded_at = asyncio.get_running_loop().time()

    def record(self, key: Key, stored: store.Stored | None) -> None:
        """What an upsert stored, or None once the row is deleted."""
        if self.stored is None:
            return
        if stored is None:
            self.stored.pop(key, None)
        else:
            self.stored[key] = stored

    def expire(self, after: float) -> None:
        if self.loaded_at is not None and asyncio.get_running_loop().time() - self.loaded_at > after:
            self.stored = None


async def _reconcile(
    memo: kopf.Memo,
    endpoints: kopf.Index[Key, Declared],
    secrets: kopf.Index[Key, dict[str, str | None]],
) -> None:
    """The start's one loop over every resource: store what Postgres does
    not hold as the resource and its Secret say (edited in Postgres, or
    restored from an older backup, while the operator was down), and
    record the sync state of the rest, for the Ready condition."""
    keys = list(endpoints)
    stored_again = 0
    # Changes are served first.
    async for key in reflector.idle_steps(keys):
        if not await _unchanged(memo, endpoints, secrets, *key):
            await _sync(memo, endpoints, secrets, *key)
            memo.reflector.forget(key)
            stored_again += 1
    memo.at_start.reconciled = True
    logger.info(
        "start: %d resources compared with Postgres, %d stored again",
        len(keys),
        stored_again,
        extra={"action": "reconcile"},
    )


async def _unchanged(
    memo: kopf.Memo,
    endpoints: kopf.Index[Key, Declared],
    secrets: kopf.Index[Key, dict[str, str | None]],
    namespace: str,
    name: str,
) -> bool:
    """Postgres holds what an upsert of ``namespace/name`` would store; its
    sync state is then recorded as if the upsert had run."""
    key = (namespace, name)
    held = await memo.at_start.get(memo, key)
    if held is None:
        return False
    tracked = _tracked(memo, key)
    async with tracked.lock:
        try:
            wanted = _wanted(endpoints, secrets, namespace, name)
        except InvalidInput:
            return False
        if wanted is None or store.stored_form(wanted.spec, wanted.check.secret, wanted.check.terms) != held:
            return False
        _stored_as(tracked, wanted)
    memo.reflector.forget(key)
    return True


@dataclass(frozen=True)
class Wanted:
    """What the resource and its Secret say Postgres should hold."""

    declared: Declared
    spec: EndpointSpec
    check: reflect.SecretCheck

    def synced(self) -> reflect.Synced:
        return reflect.Synced(
            self.declared.generation, self.spec.paused, self.check.reason, self.check.message
        )


def _stored_as(tracked: Tracked, wanted: Wanted) -> None:
    """Postgres holds what ``wanted`` says, as of now."""
    tracked.written = stored(wanted.spec)
    tracked.written_at = asyncio.get_running_loop().time()
    tracked.synced = wanted.synced()
    tracked.stale = False


def _wanted(
    endpoints: kopf.Index[Key, Declared],
    secrets: kopf.Index[Key, dict[str, str | None]],
    namespace: str,
    name: str,
) -> Wanted | None:
    """From the indexes; None when the resource is gone or being deleted.
    Raises ``InvalidInput`` for a spec the CRD schema should have refused."""
    declared = _first(endpoints.get((namespace, name), ()))
    if declared is None:
        return None
    spec = parse_spec(namespace, name, declared.spec())
    values = None
    if spec.secret_ref is not None:
        values = _first(secrets.get((namespace, spec.secret_ref.name), ()))
    check = reflect.check_terms(
        reflect.check_secret(namespace, spec.secret_ref, values),
        namespace,
        spec.delivery,
        lambda secret: _first(secrets.get((namespace, secret), ())),
    )
    return Wanted(declared, spec, check)


async def _sync(
    memo: kopf.Memo,
    endpoints: kopf.Index[Key, Declared],
    secrets: kopf.Index[Key, dict[str, str | None]],
    namespace: str,
    name: str,
) -> reflect.Synced | None:
    """Upsert the endpoint from the latest indexed spec and Secret; None when
    it is gone or being deleted."""
    tracked = _tracked(memo, (namespace, name))
    async with tracked.lock:
        try:
            wanted = _wanted(endpoints, secrets, namespace, name)
        except InvalidInput as exc:
            # Retrying cannot help.
            declared = _first(endpoints.get((namespace, name), ()))
            generation = declared.generation if declared is not None else None
            tracked.synced = reflect.Synced(generation, False, reflect.Reason.INVALID_SPEC, str(exc))
            tracked.stale = False
            return tracked.synced
        if wanted is None:
            return None
        declared, spec, check = wanted.declared, wanted.spec, wanted.check
        config: Settings = memo.config
        try:
            async with store.acquire(memo.pool) as conn:
                upserted = await store.upsert_endpoint(
                    conn,
                    spec,
                    check.secret,
                    terms=check.terms,
                    keyring=config.encryption_key,
                    grace_seconds=config.secret_grace_seconds,
                )
                # Before the release awaits: a status pass in between must not
                # take the previous write for this one.
                _stored_as(tracked, wanted)
                memo.at_start.record((namespace, name), store.stored_form(spec, check.secret, check.terms))
        except StoreError as exc:
            if exc.transient:
                raise kopf_error(exc) from exc
            # Postgres would refuse this spec again: like an invalid spec,
            # it is reported on the resource until the spec changes, and
            # not retried.
            logger.error(
                "%s/%s: Postgres refused the spec: %s",
                namespace,
                name,
                exc,
                extra={"action": "sync", "sqlstate": exc.sqlstate},
            )
            tracked.synced = reflect.Synced(
                declared.generation,
                spec.paused,
                reflect.Reason.STORE_REFUSED,
                f"Postgres refused the spec: {exc}",
            )
            tracked.stale = False
            return tracked.synced
        if upserted.previous_tenant is not None:
            tracked.events.append(
                reflect.tenant_changed(upserted.previous_tenant, spec.tenant, upserted.discarded)
            )
        return tracked.synced


def _write(
    body: kopf.Body,
    status: Mapping[str, Any],
    patch: kopf.Patch,
    queue: reflect.Queue | None,
    synced: reflect.Synced | None,
    config: Settings,
) -> None:
    reflection = reflect.reflect(
        previous=status,
        queue=queue,
        synced=synced,
        now=datetime.now(UTC),
        age_resolution=config.operator_status_seconds,
    )
    for key, value in reflection.patch.items():
        patch.status[key] = value
    for event in reflection.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)


def _post(body: kopf.Body, tracked: Tracked) -> None:
    for event in tracked.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
    tracked.events.clear()


def _tracked(memo: kopf.Memo, key: Key) -> Tracked:
    return memo.tracked.setdefault(key, Tracked())


def _first(values: Iterable[_V]) -> _V | None:
    return next(iter(values), None)


def kopf_error(error: StoreError) -> kopf.TemporaryError | kopf.PermanentError:
    """How a handler reports a store error to kopf: a transient one (an
    outage, an aborted statement) is waited out and retried; any other would
    fail the same way again, so it is reported once, as a permanent failure
    kopf posts on the resource, instead of being retried for ever."""
    if error.transient:
        return kopf.TemporaryError(f"Postgres: {error}", delay=RETRY_DELAY_SECONDS)
    return kopf.PermanentError(f"Postgres refused it, and would again: {error}")


@asynccontextmanager
async def _store_errors() -> AsyncIterator[None]:
    try:
        yield
    except StoreError as exc:
        raise kopf_error(exc) from exc
