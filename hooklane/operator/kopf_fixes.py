"""Three fixes to kopf for operators that watch thousands of resources.

At its start kopf holds every resource's handlers until all of them are
indexed: each resource of the first listing gets a toggle in one set, and
each handler waits on the set's condition until no toggle is left. kopf
wakes every waiting handler whenever a toggle is added or dropped, though
the set's state (what they wait for) changes once: N resources make N²
wakeups. Measured with 2,000 resources, that was 60% of the operator's CPU
in the 29 s before it served its first change after a restart (the py-spy
profile is in docs/benchmarks.md, section 8).

The fix wakes the waiters only when adding or dropping a toggle changes
the set's state, which is all that any of them checks; the state of a
single toggle is never changed by adding or dropping another, so the
waiters of single toggles lose nothing either. It replaces two methods of
kopf's ``ToggleSet`` as kopf 1.45 (the version pyproject.toml pins) writes
them.

kopf compares each resource it handles with the configuration it last
handled: it builds the resource's "essence" by deep-copying the whole
body and then deleting what it ignores (``metadata`` but its labels and
annotations, and ``status``). At a restart that is every resource once,
and most of what it copies are ``managedFields``. py-spy at 10,000
resources put 8% of the start's CPU in that copy. The second fix hands
kopf's own ``build`` a body without what it would delete, so that it copies
only what it keeps; the essence is the same (``tests/test_kopf_fixes.py``
compares them).

kopf starts a worker per resource with events, each holding the
resource's body and its handlers' state until it is done. With no limit,
a burst (thousands of resources created while the operator was stopped
for a moment) had every one of them in progress at once: at 10,000
resources, an operator stopped for 20 s halfway through their creation
held 1,449 MB afterwards, where one that kept pace held 255 MB (320 MB
with the limit; docs/benchmarks.md, section 8). kopf's ``worker_limit``
bounds that, but kopf also applies it while it holds every listed
resource's handlers until all are indexed, and the first ``worker_limit``
resources then wait for others that never get a worker. The third fix applies the limit only while no index is being
filled (kopf's index gates, every ``ToggleSet(all)``, are on): at the start
and when a new namespace's listing is indexed, as many workers as
resources, as kopf does without a limit; otherwise at most the limit,
the rest waiting as their raw events.

All three are applied by :func:`apply`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any, cast

from kopf._cogs.aiokits import aiotasks, aiotoggles
from kopf._cogs.configs import diffbase
from kopf._cogs.structs import bodies, dicts

_kopf_build = diffbase.DiffBaseStorage.build
_kopf_toggle_set_init = aiotoggles.ToggleSet.__init__
# kopf's index gates (a ToggleSet(all) per operator; its pausing sets use
# any), kept as long as kopf keeps them.
_gates: weakref.WeakSet[aiotoggles.ToggleSet] = weakref.WeakSet()


async def _make_toggle(
    self: aiotoggles.ToggleSet, __val: bool = False, *, name: str | None = None
) -> aiotoggles.Toggle:
    toggle = aiotoggles.Toggle(__val, name=name, condition=self._condition)
    async with self._condition:
        was = self.is_on()
        self._toggles.add(toggle)
        if self.is_on() != was:
            self._condition.notify_all()
    return toggle


async def _drop_toggles(self: aiotoggles.ToggleSet, toggles: Iterable[aiotoggles.Toggle]) -> None:
    async with self._condition:
        was = self.is_on()
        self._toggles.difference_update(toggles)
        if self.is_on() != was:
            self._condition.notify_all()


async def _drop_toggle(self: aiotoggles.ToggleSet, toggle: aiotoggles.Toggle) -> None:
    await _drop_toggles(self, (toggle,))


def _build(
    self: diffbase.DiffBaseStorage,
    *,
    body: bodies.Body,
    extra_fields: Iterable[dicts.FieldSpec] | None = None,
) -> bodies.BodyEssence:
    # What kopf's build keeps of metadata and status: labels, annotations
    # and the fields its handlers name (``extra_fields``).
    fields = [dicts.parse_field(f) for f in extra_fields or ()]
    raw: dict[str, Any] = dict(body)
    meta = raw.get("metadata") or {}
    kept = {"labels", "annotations"} | {f[1] for f in fields if len(f) > 1 and f[0] == "metadata"}
    light = {**raw, "metadata": {k: v for k, v in meta.items() if k in kept}}
    if not any(f[:1] == ("status",) for f in fields):
        light.pop("status", None)
    return _kopf_build(self, body=bodies.Body(cast(bodies.RawBody, light)), extra_fields=extra_fields)


def _toggle_set_init(self: aiotoggles.ToggleSet, fn: Callable[[Iterable[bool]], bool]) -> None:
    _kopf_toggle_set_init(self, fn)
    if fn is all:
        _gates.add(self)


def _can_spawn(self: aiotasks.Scheduler) -> bool:
    if self._pending_coros.empty():
        return False
    if self._limit is None or len(self._running_tasks) < self._limit:
        return True
    return not all(gate.is_on() for gate in _gates)


def apply() -> None:
    aiotoggles.ToggleSet.__init__ = _toggle_set_init  # type: ignore[method-assign]
    aiotasks.Scheduler._can_spawn = _can_spawn  # type: ignore[method-assign]
    diffbase.DiffBaseStorage.build = _build  # type: ignore[method-assign]
    aiotoggles.ToggleSet.make_toggle = _make_toggle  # type: ignore[method-assign]
    aiotoggles.ToggleSet.drop_toggle = _drop_toggle  # type: ignore[method-assign]
    aiotoggles.ToggleSet.drop_toggles = _drop_toggles  # type: ignore[method-assign]
