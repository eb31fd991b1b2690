"""Endpoints: the local-mode CLI and the operator both write them here."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import NamedTuple

import asyncpg

from hooklane.delivery import DeliverySpec, RequestTerms
from hooklane.endpoint_state import EndpointState
from hooklane.errors import InvalidInput, shown
from hooklane.health import EndpointHealth
from hooklane.secrets import DEFAULT_GRACE_SECONDS, Keyring, owner, seal, terms_owner, unseal
from hooklane.spec import EndpointSpec, OrderingOnDead
from hooklane.store.cursor import EndpointPosition, endpoint_cursor, endpoint_position
from hooklane.store.queries import QUERIES

logger = logging.getLogger(__name__)

_RESEAL_BATCH = 500
# The start of an endpoint's name: what a name may hold, a dot or a dash
# anywhere (a prefix may end in one).
_NAME_PREFIX = re.compile(r"[a-z0-9.-]{1,253}")
_PHASES = {str(p).lower(): p for p in EndpointState}
# The advisory lock class of a tenant's endpoint creates ("hle"); the
# worker's partition and member classes are "hlp" and "hlm".
TENANT_CREATES_CLASS = 0x686C65


@dataclass(frozen=True)
class Upserted:
    id: int
    partition: int
    created: bool
    # The tenant the endpoint belonged to until this update, when it changed;
    # ``discarded`` of that tenant's pending and dead deliveries were then
    # discarded, never to be sent to the endpoint's new owner.
    previous_tenant: str | None
    discarded: int
    # The signing secret changed: the replaced one signs too for the grace.
    rotated: bool


async def upsert_endpoint(
    conn: asyncpg.Connection,
    spec: EndpointSpec,
    secret: str | None,
    *,
    terms: RequestTerms | None = None,
    keyring: Keyring | None = None,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
) -> Upserted:
    """Create or update the endpoint named by the spec. ``secret`` is the
    ``whsec_`` signing secret, or None while it cannot be read: the endpoint
    then receives deliveries but none is sent until a secret arrives.

    With a ``keyring`` the secret is stored sealed (re-sealed, if it was
    stored before, with the active key). A secret that replaces another keeps
    the other one signing for ``grace_seconds``, so that receivers switch
    keys without refusing a delivery. Moving the endpoint to another tenant
    discards the pending and dead deliveries of the old one, and releases
    its ordering keys (none stays held).

    ``terms``: the headers and TLS material of ``spec.delivery``, resolved
    from their Secrets (hooklane/delivery.py), stored sealed like the
    secret; the rest of ``spec.delivery`` is stored as columns."""
    bound = owner(spec.namespace, spec.name)
    async with conn.transaction():
        stored = await conn.fetchval(
            *QUERIES["lock_endpoint_secret"](namespace=spec.namespace, name=spec.name)
        )
        replaced = None
        if stored is not None and secret is not None:
            try:
                current = unseal(keyring, stored, bound)
            except InvalidInput as exc:
                # Unreadable with the keys at hand, so it could not sign
                # either: the new secret alone signs from now on.
                logger.warning(
                    "%s: the replaced signing secret is dropped: %s",
                    bound,
                    exc.message,
                    extra={"action": "rotate"},
                )
            else:
                if current != secret:
                    replaced = seal(keyring, current, bound)
        row = await conn.fetchrow(
            *QUERIES["upsert_endpoint"](
                namespace=spec.namespace,
                name=spec.name,
                tenant=spec.tenant,
                url=spec.url,
                secret=None if secret is None else seal(keyring, secret, bound),
                max_concurrency=spec.max_concurrency,
                event_types=list(spec.event_types),
                timeout_seconds=spec.timeout_seconds,
                paused=spec.paused,
                replaced_secret=replaced,
                grace_seconds=grace_seconds,
                rate_per_second=spec.delivery.rate_per_second,
                rate_burst=spec.delivery.burst,
                adaptive_concurrency=spec.delivery.adaptive,
                max_attempts=spec.delivery.max_attempts,
                max_age_seconds=spec.delivery.max_age_seconds,
                ordering_on_dead=spec.ordering_on_dead,
                request_terms=None
                if terms is None
                else seal(keyring, terms.to_json(), terms_owner(spec.namespace, spec.name)),
            )
        )
    assert row is not None, "upsert_endpoint returns one row, always"
    upserted = Upserted(
        row["id"],
        row["partition"],
        row["created"],
        row["previous_tenant"],
        row["discarded"],
        replaced is not None,
    )
    if upserted.previous_tenant is not None:
        logger.warning(
            "endpoint %s moved from tenant %s to %s: %d pending or dead deliveries of other tenants discarded",
            bound,
            upserted.previous_tenant,
            spec.tenant,
            upserted.discarded,
            extra={"action": "tenant_changed", "endpoint": upserted.id},
        )
    return upserted


# What upsert_endpoint stores of a spec, its signing secret (plaintext, or
# None without one) and its request terms (as JSON, or None), in a form to
# compare: equal means an upsert would change nothing.
class Stored(NamedTuple):
    tenant: str
    url: str
    max_concurrency: int
    event_types: tuple[str, ...]
    timeout_seconds: int
    paused: bool
    secret: str | None
    # spec.delivery's columns: rate, burst, adaptive, max attempts, max age.
    delivery: tuple[int | None, int, bool, int | None, float | None]
    terms: str | None
    ordering_on_dead: OrderingOnDead

    def spec(self, namespace: str, name: str) -> EndpointSpec:
        """The spec an upsert would store this from (without its
        secretRef and spec.delivery's Secrets, which the store never
        reads: its secret and terms are these)."""
        rate, burst, adaptive, max_attempts, max_age = self.delivery
        return EndpointSpec(
            namespace=namespace,
            name=name,
            url=self.url,
            tenant=self.tenant,
            max_concurrency=self.max_concurrency,
            event_types=self.event_types,
            timeout_seconds=self.timeout_seconds,
            paused=self.paused,
            delivery=DeliverySpec(
                rate_per_second=rate,
                burst=burst,
                adaptive=adaptive,
                max_attempts=max_attempts,
                max_age_seconds=max_age,
            ),
            ordering_on_dead=self.ordering_on_dead,
        )

    def request_terms(self) -> RequestTerms | None:
        return None if self.terms is None else RequestTerms.from_json(self.terms)


def stored_form(spec: EndpointSpec, secret: str | None, terms: RequestTerms | None = None) -> Stored:
    d = spec.delivery
    return Stored(
        spec.tenant,
        spec.url,
        spec.max_concurrency,
        tuple(spec.event_types),
        spec.timeout_seconds,
        spec.paused,
        secret,
        (d.rate_per_second, d.burst, d.adaptive, d.max_attempts, d.max_age_seconds),
        None if terms is None else terms.to_json(),
        spec.ordering_on_dead,
    )


async def stored_endpoints(
    conn: asyncpg.Connection, keyring: Keyring | None
) -> dict[tuple[str, str], Stored]:
    """(namespace, name) → what Postgres holds of every endpoint. A secret
    the keys at hand cannot open is left out of the map, so that the next
    upsert replaces it."""
    found: dict[tuple[str, str], Stored] = {}
    for row in await conn.fetch(*QUERIES["stored_endpoints"]()):
        try:
            found[(row["namespace"], row["name"])] = _stored(row, keyring)
        except InvalidInput:
            continue
    return found


def _stored(row: asyncpg.Record, keyring: Keyring | None) -> Stored:
    """A row of stored_endpoints' columns, its secret and terms unsealed;
    ``InvalidInput`` when the keys at hand cannot open one of them."""
    secret, terms = row["secret"], row["request_terms"]
    if secret is not None:
        secret = unseal(keyring, secret, owner(row["namespace"], row["name"]))
    if terms is not None:
        terms = unseal(keyring, terms, terms_owner(row["namespace"], row["name"]))
    return Stored(
        row["tenant"],
        row["url"],
        row["max_concurrency"],
        tuple(row["event_types"]),
        row["timeout_seconds"],
        row["paused"],
        secret,
        (
            row["rate_per_second"],
            row["rate_burst"],
            row["adaptive_concurrency"],
            row["max_attempts"],
            row["max_age_seconds"],
        ),
        terms,
        row["ordering_on_dead"],
    )


async def stored_endpoint(
    conn: asyncpg.Connection, namespace: str, name: str, keyring: Keyring | None, *, lock: bool = False
) -> Stored | None:
    """What Postgres holds of one endpoint: ``Stored.spec`` and
    ``Stored.request_terms`` give it back as a spec. With ``lock``, its row
    is locked as upsert_endpoint locks it, until the transaction ends (call
    inside one), for an upsert that changes part of it: a concurrent change
    waits. None when there is none; ``InvalidInput`` when the keys at hand
    cannot open its secret or terms."""
    if lock:
        await conn.execute(*QUERIES["lock_endpoint_secret"](namespace=namespace, name=name))
    row = await conn.fetchrow(*QUERIES["stored_endpoint"](namespace=namespace, name=name))
    return None if row is None else _stored(row, keyring)


async def lock_tenant_creates(conn: asyncpg.Connection, tenant: str) -> None:
    """Wait until no other transaction creates endpoints of ``tenant``, and
    keep them waiting until this one ends (call inside one): a bound on a
    tenant's endpoints counted after it holds against concurrent creates."""
    await conn.execute(*QUERIES["lock_tenant_creates"](lock_class=TENANT_CREATES_CLASS, tenant=tenant))


async def endpoint_limits(conn: asyncpg.Connection, namespace: str, name: str) -> tuple[int, int] | None:
    """The endpoint's max_concurrency and timeout_seconds; None when there
    is none."""
    row = await conn.fetchrow(*QUERIES["endpoint_limits"](namespace=namespace, name=name))
    return None if row is None else (row["max_concurrency"], row["timeout_seconds"])


class OverLimits(NamedTuple):
    name: str
    tenant: str
    max_concurrency: int
    timeout_seconds: int


async def over_limits(
    conn: asyncpg.Connection, namespace: str, max_concurrency: int, timeout_seconds: int
) -> list[OverLimits]:
    """The endpoints of ``namespace`` with a max_concurrency or a
    timeout_seconds above these, by name."""
    rows = await conn.fetch(
        *QUERIES["over_limits"](
            namespace=namespace, max_concurrency=max_concurrency, timeout_seconds=timeout_seconds
        )
    )
    return [OverLimits(*row) for row in rows]


async def tenant_endpoint_count(conn: asyncpg.Connection, namespace: str, tenant: str) -> int:
    """How many endpoints ``tenant`` has in ``namespace``."""
    count: int = await conn.fetchval(*QUERIES["tenant_endpoint_count"](namespace=namespace, tenant=tenant))
    return count


async def reseal_secrets(conn: asyncpg.Connection, keyring: Keyring) -> int:
    """Seal with the active key every signing secret stored in plaintext or
    with another key, and drop previous secrets past their overlap; returns
    how many endpoints changed. Raises ``InvalidInput`` for a secret no key
    of ``keyring`` opens, after resealing the rest: retiring that key would
    leave its endpoint unable to sign."""
    changed = 0
    after = 0
    unreadable: InvalidInput | None = None
    while True:
        rows = await conn.fetch(
            *QUERIES["secrets_to_reseal"](
                sealed_prefix=keyring.sealed_prefix, after_id=after, batch_size=_RESEAL_BATCH
            )
        )
        if not rows:
            break
        after = rows[-1]["id"]
        batch: list[tuple[int, str | None, str | None, str | None, str | None, str | None, str | None]] = []
        for r in rows:
            bound = owner(r["namespace"], r["name"])
            terms_bound = terms_owner(r["namespace"], r["name"])
            try:
                secret = r["secret"] and keyring.seal(unseal(keyring, r["secret"], bound), bound)
                previous = (
                    keyring.seal(unseal(keyring, r["previous_secret"], bound), bound)
                    if r["previous_valid"]
                    else None
                )
                terms = r["request_terms"] and keyring.seal(
                    unseal(keyring, r["request_terms"], terms_bound), terms_bound
                )
            except InvalidInput as exc:
                unreadable = exc
                continue
            batch.append(
                (r["id"], r["secret"], secret, r["previous_secret"], previous, r["request_terms"], terms)
            )
        if batch:
            ids, read_secrets, secrets, read_previous, previous_secrets, read_terms, terms_list = map(
                list, zip(*batch, strict=True)
            )
            status = await conn.execute(
                *QUERIES["reseal_secrets"](
                    ids=ids,
                    read_secrets=read_secrets,
                    secrets=secrets,
                    read_previous=read_previous,
                    previous_secrets=previous_secrets,
                    read_terms=read_terms,
                    terms=terms_list,
                )
            )
            changed += int(status.split()[-1])
    if unreadable is not None:
        raise unreadable
    return changed


def statistics_stale(changed: int, rows: float) -> bool:
    """Whether ``changed`` rows inserted, updated or deleted since the last
    analysis of a table the planner believes holds ``rows`` make its
    statistics worth refreshing: autovacuum's default rule (50 rows and a
    tenth of the table), which autovacuum itself applies only when it gets
    to the table (a minute or more later, never with autovacuum off)."""
    return changed > 50 + 0.1 * rows


async def refresh_endpoint_statistics(conn: asyncpg.Connection) -> bool:
    """Analyse ``endpoints`` when many of its rows changed since it last was
    (10,000 endpoints applied at once): the planner's estimates of which
    endpoints a tenant has then hold from the next statement on, whoever
    wrote them (the operator, the CLI, SQL by hand). True if it analysed;
    never when the role connected does not own the table (autovacuum then
    stays the only one to)."""
    row = await conn.fetchrow(*QUERIES["endpoint_statistics"]())
    assert row is not None, "endpoint_statistics returns one row, always"
    if not row["may_analyze"] or not statistics_stale(row["changed"], row["rows"]):
        return False
    await conn.execute(*QUERIES["analyze_endpoints"]())
    return True


class Reactivation(Enum):
    """What ``reactivate_endpoint`` did."""

    REACTIVATED = "reactivated"
    # Active (or paused, or probing): its circuit is left as it is.
    NOT_DEACTIVATED = "not deactivated"
    NO_ENDPOINT = "no endpoint"


async def reactivate_endpoint(conn: asyncpg.Connection, namespace: str, name: str) -> Reactivation:
    """Reactivate the endpoint if it is deactivated, and say which case it was."""
    row = await conn.fetchrow(*QUERIES["reactivate_endpoint"](namespace=namespace, name=name))
    assert row is not None
    if row["reactivated"]:
        return Reactivation.REACTIVATED
    return Reactivation.NOT_DEACTIVATED if row["found"] else Reactivation.NO_ENDPOINT


async def delete_endpoint(conn: asyncpg.Connection, namespace: str, name: str) -> bool:
    return await conn.fetchval(*QUERIES["delete_endpoint"](namespace=namespace, name=name)) is not None


async def endpoint_health(
    conn: asyncpg.Connection,
    partitions: list[int] | None = None,
    endpoint: tuple[str, str] | None = None,
    floors: Mapping[int, datetime] | None = None,
    *,
    listed: bool = False,
) -> list[EndpointHealth]:
    """Every endpoint's health (of ``partitions``, or the one named by
    ``endpoint``, a (namespace, name)), most delayed first: the records
    every view shows (:mod:`hooklane.health`). ``floors``: where the queue
    of some endpoints starts (a worker's ready list), so that their pending
    deliveries are counted from there; ``listed``: they are the whole
    list, and a deliverable endpoint left out has none."""
    namespace, name = endpoint or (None, None)
    rows = await conn.fetch(
        *QUERIES["endpoint_health"](
            partitions=partitions,
            namespace=namespace,
            name=name,
            floor_ids=list(floors) if floors else None,
            floors=list(floors.values()) if floors else None,
            listed=listed,
        )
    )
    return [EndpointHealth.from_row(r) for r in rows]


async def write_queue_summaries(
    conn: asyncpg.Connection,
    partitions: Sequence[int],
    healths: Sequence[EndpointHealth],
    fresh_seconds: float,
) -> None:
    """Keep what a gauge pass counted of ``partitions`` (``healths``, read
    by one statement) for the endpoint listings, fresh for
    ``fresh_seconds``: they read it instead of walking each queue from its
    start (queue_summaries, migration 0017)."""
    if not healths:
        return
    counted_at = healths[0].counted_at
    await conn.execute(
        *QUERIES["write_queue_summaries"](
            partitions=list(partitions),
            counted_at=counted_at,
            fresh_seconds=fresh_seconds,
            endpoint_ids=[h.id for h in healths],
            pending=[h.pending for h in healths],
            oldest_pending_at=[
                None if h.oldest_pending_age is None else counted_at - timedelta(seconds=h.oldest_pending_age)
                for h in healths
            ],
        )
    )


def check_phase(text: str | None, field: str) -> EndpointState | None:
    """An endpoint phase (Active, Paused, Probing, Deactivated; any case)."""
    if text is None:
        return None
    found = _PHASES.get(text.lower())
    if found is None:
        raise InvalidInput(field, f"must be one of {', '.join(map(str, EndpointState))}, not {shown(text)}")
    return found


def check_name_prefix(text: str | None, field: str) -> str | None:
    """The start of endpoint names: lowercase letters, digits, dots, dashes."""
    if text is not None and not _NAME_PREFIX.fullmatch(text):
        raise InvalidInput(
            field, f"must be the start of a lowercase DNS-style name (a-z, 0-9, '.', '-'), not {shown(text)}"
        )
    return text


@dataclass(frozen=True)
class EndpointFilter:
    """Which endpoints a listing shows; every field left out chooses all.
    ``not_delivering``: deactivated, paused, circuit open (Paused or
    Probing) or unsigned."""

    tenant: str | None = None
    name_prefix: str | None = None
    phase: EndpointState | None = None
    not_delivering: bool = False

    def parameters(self) -> dict[str, str | bool | None]:
        """The filter parameters of endpoint_page and endpoint_totals."""
        return {
            "tenant": self.tenant,
            "name_prefix": self.name_prefix,
            "phase": None if self.phase is None else str(self.phase),
            "not_delivering": self.not_delivering,
        }


@dataclass(frozen=True)
class EndpointPage:
    endpoints: list[EndpointHealth]
    # The next page's cursor; None when this page is the last.
    cursor: str | None


@dataclass(frozen=True)
class EndpointTotals:
    endpoints: int
    not_delivering: int
    pending: int
    in_flight: int
    dead: int


async def endpoint_page(
    conn: asyncpg.Connection, chosen: EndpointFilter, *, cursor: str | None = None, limit: int
) -> EndpointPage:
    """A page of the endpoints ``chosen`` picks, with their health, most
    delayed first (as :func:`endpoint_health`), after ``cursor``.

    Keyset paging: an endpoint whose oldest pending delivery stays put
    while the pages are walked is listed exactly once. One whose position
    moves meanwhile (its oldest pending delivered: it moves later; a resend
    of old dead deliveries: earlier) may be listed twice, or not at all."""
    after = endpoint_position(cursor)
    oldest, namespace, name = after or (None, None, None)
    rows = await conn.fetch(
        *QUERIES["endpoint_page"](
            **chosen.parameters(),
            cursor_oldest_pending_at=oldest,
            cursor_namespace=namespace,
            cursor_name=name,
            limit=limit + 1,
        )
    )
    healths = [EndpointHealth.from_row(r) for r in rows[:limit]]
    more = None
    if len(rows) > limit:
        last = rows[limit - 1]
        more = endpoint_cursor(EndpointPosition(last["oldest_pending_at"], last["namespace"], last["name"]))
    return EndpointPage(healths, more)


async def endpoint_totals(conn: asyncpg.Connection, chosen: EndpointFilter) -> EndpointTotals:
    """How many endpoints ``chosen`` picks and their deliveries, in counts."""
    row = await conn.fetchrow(*QUERIES["endpoint_totals"](**chosen.parameters()))
    assert row is not None, "endpoint_totals returns one row, always"
    return EndpointTotals(**dict(row))
