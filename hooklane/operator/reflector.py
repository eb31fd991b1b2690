"""The status pass: one loop for every WebhookEndpoint, not a timer each.

Every ``HOOKLANE_OPERATOR_STATUS_SECONDS`` one statement returns the
endpoints whose visible health differs from the digest this loop last
reflected onto their resource (store.endpoint_health_changed); only those
are compared with the status the resource carries (the ``endpoints`` index)
and patched where :func:`hooklane.operator.reflect.reflect` finds a
difference. An idle pass costs one statement and no API call, whatever the
number of resources. Writes (status patches and Events) are paced at
``HOOKLANE_OPERATOR_STATUS_WRITES_PER_SECOND``.

kopf runs the loop (a task started by the startup handler, ended by the
cleanup one) and its API client writes, with the operator's credentials;
the per-resource work stays in kopf's event handlers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import asyncpg
import kopf

from hooklane import kube, store
from hooklane.errors import StoreError
from hooklane.health import EndpointHealth
from hooklane.operator import kopf_fixes, reflect
from hooklane.spec import API_VERSION, KIND

logger = logging.getLogger(__name__)

Key = tuple[str, str]
EVENTS = kopf.Resource("", "v1", "events", namespaced=True)


@dataclass(frozen=True, slots=True)
class Observed:
    """What a status pass reads of a resource: enough to reflect onto it
    and to post Events about it."""

    uid: str
    status: Mapping[str, Any]


@dataclass(frozen=True)
class Write:
    key: Key
    endpoint_id: int
    digest: str
    observed: Observed
    reflection: reflect.Reflection


class Pacer:
    """At most ``per_second`` writes started per second."""

    def __init__(self, per_second: float) -> None:
        self._interval = 1.0 / per_second
        self._next = 0.0

    async def slot(self) -> None:
        clock = asyncio.get_running_loop().time()
        self._next = max(self._next, clock)
        wait = self._next - clock
        self._next += self._interval
        if wait > 0:
            await asyncio.sleep(wait)


# A digest no status pass computes (they are md5 hex): "reflect it again".
_UNREFLECTED = ""


class Reflector:
    """The digests last reflected, per endpoint id, and the pass that uses them."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        settings: kopf.OperatorSettings,
        *,
        age_step: float,
        writes_per_second: float,
    ) -> None:
        self._pool = pool
        self._settings = settings
        self._age_step = age_step
        self._pacer = Pacer(writes_per_second)
        self._digests: dict[int, str] = {}
        self._keys: dict[int, Key] = {}
        self._ids: dict[Key, int] = {}
        # The loop clock at which the last query began.
        self.taken: float | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self, loop: Callable[[], Coroutine[Any, Any, None]]) -> None:
        if self._task is None:
            self._task = asyncio.create_task(loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def forget(self, key: Key) -> None:
        """Reflect ``key`` at the next pass whether or not its health changed.
        Its id stays known, with a digest no pass computes: dropped, a row
        deleted before the next pass was neither returned nor reported gone,
        and so never stored again."""
        endpoint_id = self._ids.get(key)
        if endpoint_id is not None:
            self._digests[endpoint_id] = _UNREFLECTED

    async def changed(self) -> store.Changed:
        self.taken = asyncio.get_running_loop().time()
        async with store.acquire(self._pool) as conn:
            return await store.endpoint_health_changed(conn, self._digests, self._age_step)

    def gone(self, endpoint_id: int) -> Key | None:
        key = self._keys.pop(endpoint_id, None)
        self._digests.pop(endpoint_id, None)
        if key is not None and self._ids.get(key) == endpoint_id:
            del self._ids[key]
        return key

    def reflected(self, key: Key, endpoint_id: int, digest: str) -> None:
        previous = self._ids.get(key)
        if previous is not None and previous != endpoint_id:
            self._digests.pop(previous, None)
            self._keys.pop(previous, None)
        self._ids[key] = endpoint_id
        self._keys[endpoint_id] = key
        self._digests[endpoint_id] = digest

    def plan(
        self,
        health: EndpointHealth,
        digest: str,
        observed: Observed | None,
        synced: reflect.Synced | None,
        age_resolution: float,
    ) -> Write | None:
        """The write that brings the resource up to date; None when there
        is nothing to write (the digest is then taken as reflected)."""
        key = (health.namespace, health.name)
        if observed is None:
            # Not a resource this operator watches (another namespace,
            # `hooklane endpoint apply`), or one being deleted.
            self.reflected(key, health.id, digest)
            return None
        reflection = reflect.reflect(
            previous=observed.status,
            queue=reflect.Queue.from_health(health),
            synced=synced,
            now=datetime.now(UTC),
            age_resolution=age_resolution,
        )
        if not reflection.patch and not reflection.events:
            self.reflected(key, health.id, digest)
            return None
        return Write(key, health.id, digest, observed, reflection)

    async def write(self, write: Write) -> None:
        """Patch the status, then post the Events; the digest counts as
        reflected only once the patch is accepted, so a failure is retried
        at the next pass."""
        namespace, name = write.key
        if write.reflection.patch:
            await self._pacer.slot()
            try:
                await kopf_fixes.patch(
                    url=kube.endpoints_path(namespace, name, "status"),
                    headers={"Content-Type": "application/merge-patch+json"},
                    payload={"status": write.reflection.patch},
                    settings=self._settings,
                    logger=logger,
                )
            except kopf_fixes.APINotFoundError:
                return
        self.reflected(write.key, write.endpoint_id, write.digest)
        await self.post(write.key, write.observed, write.reflection.events)

    async def post(self, key: Key, observed: Observed, events: list[reflect.KubeEvent]) -> None:
        namespace, name = key
        ref = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": name,
            "namespace": namespace,
            "uid": observed.uid,
        }
        for event in events:
            await self._pacer.slot()
            await kopf_fixes.post_event(
                ref=ref,  # type: ignore[arg-type]
                type=event.type,
                reason=event.reason,
                message=event.message,
                resource=EVENTS,
                settings=self._settings,
                logger=logger,
            )


# A sleep this long that wakes this much late or more: the event loop has
# callbacks queued (kopf's handlers have events to work through).
IDLE_PROBE_SECONDS = 0.005
IDLE_LATE_SECONDS = 0.005
# A walk over thousands of endpoints (the start's comparison, a shared
# Secret's change) waits for the event loop to be idle every this many, for
# at most this long: long enough to let a restart's burst of events
# through, short enough to finish within a minute at 10,000 endpoints.
IDLE_STEP = 200
IDLE_STEP_WAIT_SECONDS = 1.0

_T = TypeVar("_T")


async def idle_turn(most: float) -> None:
    """Return once the event loop has nothing queued, or after ``most``
    seconds. Background work (the status pass, the comparisons of a start)
    waits here, so that a change an event brings is not served after it:
    at a restart kopf wakes every resource's handlers at once."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + most
    while loop.time() < deadline:
        asked = loop.time()
        await asyncio.sleep(IDLE_PROBE_SECONDS)
        if loop.time() - asked < IDLE_PROBE_SECONDS + IDLE_LATE_SECONDS:
            return


async def idle_steps(items: Iterable[_T]) -> AsyncIterator[_T]:
    """``items``, with an :func:`idle_turn` every ``IDLE_STEP`` of them, so
    that changes are served before the rest of the walk."""
    for done, item in enumerate(items):
        if done and done % IDLE_STEP == 0:
            await idle_turn(most=IDLE_STEP_WAIT_SECONDS)
        yield item


async def run_forever(interval: float, one_pass: Callable[[], Awaitable[None]]) -> None:
    """``one_pass`` every ``interval`` seconds (after the previous one
    ends, and once the event loop is idle, for at most another interval);
    a failed pass is logged and the next one tries again."""
    while True:
        await idle_turn(most=interval)
        try:
            await one_pass()
        except (StoreError, kopf.TemporaryError) as exc:
            logger.warning(
                "status pass failed, retried in %.0f s: %s", interval, exc, extra={"action": "status"}
            )
        except kopf_fixes.APIError as exc:
            logger.warning("status pass: the API server refused a write: %s", exc, extra={"action": "status"})
        await asyncio.sleep(interval)
