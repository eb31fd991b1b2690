"""Operational notifications: when an endpoint's circuit opens, when it is
deactivated, when its deliveries go dead, an event for the notifications
tenant (``HOOKLANE_NOTIFICATIONS_TENANT``), published and delivered like
any other, so that the platform can tell its customer.

What a notice says and its id are decided here, from the values the store
hands over (pure); the pass, run by the worker holding partition 0 in its
maintenance, notes what changed since its last run and publishes the
notices due in the transaction that takes them (docs/operations.md,
"Operational notifications").
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg

from hooklane import store
from hooklane.errors import EventConflict
from hooklane.settings import Settings
from hooklane.times import rfc3339

logger = logging.getLogger(__name__)

# The event type of each kind of notice.
TYPES = {kind: f"hooklane.endpoint.{kind}" for kind in store.NOTICE_KINDS}

# A pass reads what changed since the last one's cut, but never from
# further back than this: the first pass of a worker that just took
# partition 0, or of notifications just turned on, reads this far back
# (a worker that held partition 0 before passed it on within seconds;
# what happened before notifications were on is nobody's news).
LOOKBACK_SECONDS = 600.0
# A pass's window ends this long before now, and so does the count of a
# dead-deliveries notice: an attempt recorded by a transaction that
# commits up to this late is still counted once. A result waits on a lock
# for 10 s at most (the worker's lock_timeout); a minute is the margin the
# rescue keeps for the same reason (jobs.py).
SETTLE_SECONDS = 60.0
# Notices published per pass at most, in one transaction; the rest go in
# the next passes, soonest due first.
BATCH = 500

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def notice_id(notice: store.Notice) -> str:
    """The event id of ``notice``: its type, its endpoint, and its subject to
    the microsecond (Postgres' precision), the same whichever worker takes
    it, so that the publish function stores a notice published twice once."""
    micros = (notice.subject - _EPOCH) // timedelta(microseconds=1)
    return f"{TYPES[notice.kind]}.{notice.endpoint_id}.{micros}"


def notice_data(notice: store.Notice) -> dict[str, object]:
    """The event's data: the endpoint, its tenant, why, the counts and when."""
    data: dict[str, object] = {
        "endpoint": {"namespace": notice.namespace, "name": notice.name},
        "tenant": notice.tenant,
        "consecutive_failures": notice.consecutive_failures,
        "noticed_at": rfc3339(notice.noticed_at),
    }
    if notice.kind == store.NOTICE_PAUSED:
        data |= {
            "reason": notice.last_error,
            "failing_since": rfc3339(notice.failing_since),
            "paused_until": rfc3339(notice.paused_until),
            "openings": notice.transitions,
        }
    elif notice.kind == store.NOTICE_DEACTIVATED:
        data |= {
            "reason": notice.deactivated_reason,
            "last_error": notice.last_error,
            "deactivated_at": rfc3339(notice.deactivated_at),
            "deactivations": notice.transitions,
        }
    else:
        data |= {
            "reason": notice.dead_error,
            "status": notice.dead_status,
            "failure": notice.dead_failure,
            "dead": notice.dead,
            "from": rfc3339(notice.counted_since),
            "until": rfc3339(notice.counted_until),
            "last_dead_at": rfc3339(notice.last_dead_at),
        }
    return data


def notice_event(tenant: str, notice: store.Notice) -> store.Event:
    """``notice`` as the notifications tenant's event, as ``insert_events``
    takes it. No coalesce key: a later notice must not replace an earlier
    one still pending, whose dead deliveries it does not count."""
    return store.Event(notice_id(notice), tenant, TYPES[notice.kind], json.dumps(notice_data(notice)))


@dataclass(frozen=True)
class Notified:
    """What a pass did: what it noted, and the ids of the notices it
    published."""

    noted: store.Noted
    published: tuple[str, ...] = ()


class Notifications:
    """The notifications pass, for one worker: it keeps the cut of its last
    run, where the next run's window starts."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._since: datetime | None = None

    async def run_once(self, conn: asyncpg.Connection) -> Notified | None:
        """Note what changed and publish what is due; None when no
        notifications tenant is set. Safe beside another worker's pass:
        each notice is published by one."""
        tenant = self._settings.notifications_tenant
        if tenant is None:
            return None
        noted = await store.note_notices(
            conn,
            tenant=tenant,
            since=self._since,
            lookback_seconds=LOOKBACK_SECONDS,
            settle_seconds=SETTLE_SECONDS,
            interval_seconds=self._settings.notification_interval_seconds,
        )
        self._since = noted.cut
        async with store.take_notices(
            conn, tenant=tenant, settle_seconds=SETTLE_SECONDS, limit=BATCH
        ) as notices:
            events = [notice_event(tenant, n) for n in notices]
            refused = await store.insert_events(conn, events)
        for position, (notice, event) in enumerate(zip(notices, events, strict=True)):
            _log(notice, event.id, tenant, refused.get(position))
        return Notified(noted, tuple(e.id for i, e in enumerate(events) if i not in refused))


def _log(notice: store.Notice, event_id: str, tenant: str, refusal: Exception | None) -> None:
    endpoint = f"{notice.namespace}/{notice.name}"
    extra = {"action": "notify", "endpoint": notice.endpoint_id, "event": event_id}
    if refusal is None:
        logger.info("published %s for %s to tenant %s", TYPES[notice.kind], endpoint, tenant, extra=extra)
    elif isinstance(refusal, EventConflict):
        # Only a pass that took the same notice again publishes its id
        # twice: the first one stands.
        logger.info("%s for %s was published already", TYPES[notice.kind], endpoint, extra=extra)
    else:
        logger.warning(
            "%s for %s to tenant %s refused: %s", TYPES[notice.kind], endpoint, tenant, refusal, extra=extra
        )
