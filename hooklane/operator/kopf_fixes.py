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
resources put 8% of the start's CPU in that copy. The second fix is kopf's
own diff-base storage (:class:`Essence`, set as kopf's public
``settings.persistence.diffbase_storage`` at startup), whose ``build``
hands kopf's a body without what it would delete, so that it copies only
what it keeps; the essence is the same (``tests/unit/test_kopf_fixes.py``
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

The first and third are applied by :func:`apply`, which first checks that
kopf's functions they replace, wrap or read the private state of, and
those of its private client the status pass writes through
(:mod:`hooklane.operator.reflector`), are the ones they were written for,
and refuses to start otherwise: a kopf release that changed them would
fail in the middle of a burst, not at start. This module is the only one
that imports kopf's private modules (``kopf._*``; a unit test checks it):
what others use of them it re-exports, and a kopf without them is refused
when the operator imports it, as a changed one is by :func:`apply`.
"""

from __future__ import annotations

import hashlib
import inspect
import weakref
from collections.abc import Callable, Iterable
from typing import Any, cast

import kopf

from hooklane.errors import InvalidInput

_REVIEW = "install kopf>=1.45,<1.46, or review the fixes against this kopf"

try:
    from kopf._cogs.aiokits import aiotasks, aiotoggles
    from kopf._cogs.clients import api, errors, events

    # kopf's functions the fixes replace, wrap or read the private
    # attributes of, and those of its client the status pass calls, as
    # imported (before ``apply``). WRITTEN_FOR has the sha256 of each one's
    # source in kopf 1.45.
    _KOPF: dict[str, Callable[..., Any]] = {
        "ToggleSet.__init__": aiotoggles.ToggleSet.__init__,
        "ToggleSet.make_toggle": aiotoggles.ToggleSet.make_toggle,
        "ToggleSet.drop_toggle": aiotoggles.ToggleSet.drop_toggle,
        "ToggleSet.drop_toggles": aiotoggles.ToggleSet.drop_toggles,
        "Scheduler.__init__": aiotasks.Scheduler.__init__,
        "Scheduler._can_spawn": aiotasks.Scheduler._can_spawn,
        "DiffBaseStorage.build": kopf.DiffBaseStorage.build,
        "api.patch": api.patch,
        "events.post_event": events.post_event,
    }
except (ImportError, AttributeError) as exc:
    raise InvalidInput(
        "kopf", f"the installed kopf lacks what hooklane operator uses ({exc}): {_REVIEW}"
    ) from None

# kopf's client, logged in by the operator's login handler: the status
# pass patches and posts Events through it.
patch = api.patch
post_event = events.post_event
APIError = errors.APIError
APINotFoundError = errors.APINotFoundError

WRITTEN_FOR = {
    "ToggleSet.__init__": "e359f1392c56d4cee2e3ff3e2d0189e8cb731ade35b4a42269bde0ea00b38955",
    "ToggleSet.make_toggle": "354b83ba5188615ff0e4fdebfafbbe18b60ba30335ba55c4bd54d5429519aaa0",
    "ToggleSet.drop_toggle": "434b23b721ea2e78a2f8cf18816a369cc9d41767651b5c7260d2b872008b6e7c",
    "ToggleSet.drop_toggles": "497f86cc1160dd771d125a53d3aa0057df73286019d60d93328403483f34bbd4",
    "Scheduler.__init__": "d99e3d799446dfbeadb7ef04f1fd9270ad37a2d7a69bb98309f15e42ef0de025",
    "Scheduler._can_spawn": "04fd18d2f0e7137cef3718edd7ca380ffb8386a3a5fb4e3fa93e63351adb6d99",
    "DiffBaseStorage.build": "e018d8276c04d889f8bb5736b69a430437b2a904e16b09ae90567ac58225f103",
    "api.patch": "d798f493adbeb071a38fd6e8554c1cee0ec89e6d986a4094308ca6690346635b",
    "events.post_event": "3417b4beed131deb1c818506320935bdb9cb4662fc23263130a6d6321966d20b",
}

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


class Essence(kopf.AnnotationsDiffBaseStorage):
    """kopf's default diff-base storage (annotations, its prefix and key),
    building the same essence from a body without what it would delete."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[kopf.FieldSpec] | None = None
    ) -> kopf.BodyEssence:
        # What kopf's build keeps of metadata and status: labels, annotations
        # and the fields its handlers name (``extra_fields``), dotted or not.
        fields = [_path(f) for f in extra_fields or ()]
        raw: dict[str, Any] = dict(body)
        meta = raw.get("metadata") or {}
        kept = {"labels", "annotations"} | {f[1] for f in fields if len(f) > 1 and f[0] == "metadata"}
        light = {**raw, "metadata": {k: v for k, v in meta.items() if k in kept}}
        if not any(f[:1] == ("status",) for f in fields):
            light.pop("status", None)
        return super().build(body=kopf.Body(cast(kopf.RawBody, light)), extra_fields=extra_fields)


def _path(field: kopf.FieldSpec) -> tuple[str, ...]:
    """A field as kopf parses one: dotted, a sequence of keys, or None."""
    if field is None:
        return ()
    return tuple(field.split(".")) if isinstance(field, str) else tuple(field)


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


def changed(functions: dict[str, Callable[..., Any]]) -> list[str]:
    """The names of ``functions`` whose source differs from what the fixes
    were written for (``WRITTEN_FOR``), or cannot be read."""
    return [name for name, fn in functions.items() if _digest(fn) != WRITTEN_FOR.get(name)]


def _digest(fn: Callable[..., Any]) -> str | None:
    try:
        return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()
    except (OSError, TypeError):
        return None


def apply() -> None:
    if differ := changed(_KOPF):
        raise InvalidInput(
            "kopf",
            f"the installed kopf changed {', '.join(differ)}, which hooklane/operator/kopf_fixes.py "
            f"replaces, reads the private state of or calls, as kopf 1.45 wrote them: {_REVIEW}",
        )
    aiotoggles.ToggleSet.__init__ = _toggle_set_init  # type: ignore[method-assign]
    aiotasks.Scheduler._can_spawn = _can_spawn  # type: ignore[method-assign]
    aiotoggles.ToggleSet.make_toggle = _make_toggle  # type: ignore[method-assign]
    aiotoggles.ToggleSet.drop_toggle = _drop_toggle  # type: ignore[method-assign]
    aiotoggles.ToggleSet.drop_toggles = _drop_toggles  # type: ignore[method-assign]
