"""hooklane.operator.kopf_fixes: kopf's start with thousands of resources,
as its queueing does it (a toggle per listed resource, each handler waiting
until none is left), without the N² wakeups; and the essence kopf compares
a resource by, built without copying what it leaves out."""

from __future__ import annotations

import ast
import asyncio
import copy
from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path

import kopf
import pytest
from kopf._cogs.aiokits import aiotasks, aiotoggles

import hooklane
from hooklane.errors import InvalidInput
from hooklane.operator import kopf_fixes

RESOURCES = 500


async def test_the_first_listing_wakes_each_waiting_handler_about_once():
    kopf_fixes.apply()
    indexed = aiotoggles.ToggleSet(all)
    checks = 0
    is_on = indexed.is_on

    def counted() -> bool:
        nonlocal checks
        checks += 1
        return is_on()

    indexed.is_on = counted  # type: ignore[method-assign]
    released: list[int] = []
    dropped = 0

    async def handler(number: int, toggle: aiotoggles.Toggle) -> None:
        nonlocal dropped
        await asyncio.sleep(0)
        await indexed.drop_toggle(toggle)
        dropped += 1
        await indexed.wait_for(True)
        released.append(dropped)

    tasks = []
    for number in range(RESOURCES):
        toggle = await indexed.make_toggle(name=str(number))
        tasks.append(asyncio.create_task(handler(number, toggle)))
        await asyncio.sleep(0)
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)

    # Every handler ran only once every resource was indexed.
    assert released == [RESOURCES] * RESOURCES
    # kopf as released checks the state ~N²/2 times (125,000 here).
    assert checks < 10 * RESOURCES


async def test_a_single_toggle_still_wakes_its_waiters():
    kopf_fixes.apply()
    paused = aiotoggles.ToggleSet(any)
    toggle = await paused.make_toggle(name="peering")
    waiter = asyncio.create_task(toggle.wait_for(True))
    set_waiter = asyncio.create_task(paused.wait_for(True))
    await asyncio.sleep(0)
    await toggle.turn_to(True)
    await asyncio.wait_for(asyncio.gather(waiter, set_waiter), timeout=5)
    assert paused.is_on()
    await paused.drop_toggle(toggle)
    assert paused.is_off()


BODY = {
    "apiVersion": "hooklane.io/v1alpha1",
    "kind": "WebhookEndpoint",
    "metadata": {
        "name": "orders",
        "namespace": "shop",
        "uid": "0b0e",
        "generation": 3,
        "finalizers": ["hooklane.io/endpoint"],
        "labels": {"team": "payments"},
        "annotations": {
            "kopf.zalando.org/last-handled-configuration": '{"spec":{"url":"https://a.example/"}}',
            "kubectl.kubernetes.io/last-applied-configuration": "{}",
            "hooklane.io/reactivate": "1",
        },
        "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {"f:url": {}}}}],
    },
    "spec": {"url": "https://a.example/", "tenant": "shop", "secretRef": {"name": "s", "key": "k"}},
    "status": {"phase": "Active", "conditions": [{"type": "Ready", "status": "True"}]},
}


@pytest.mark.parametrize(
    "extra_fields",
    [
        None,
        [("metadata", "annotations", "hooklane.io/reactivate")],
        [("status", "phase")],
        [("metadata", "finalizers"), "spec.url"],
        [("metadata", "labels", "team"), ("status",)],
    ],
)
def test_the_essence_kopf_compares_is_the_one_kopf_builds(extra_fields: list[kopf.FieldSpec] | None) -> None:
    expected = kopf.AnnotationsDiffBaseStorage().build(
        body=kopf.Body(copy.deepcopy(BODY)), extra_fields=extra_fields
    )
    body = copy.deepcopy(BODY)
    assert kopf_fixes.Essence().build(body=kopf.Body(body), extra_fields=extra_fields) == expected
    assert body == BODY


def test_the_essence_is_stored_where_kopf_stores_it_by_default() -> None:
    default = kopf.OperatorSettings().persistence.diffbase_storage
    assert isinstance(default, kopf.AnnotationsDiffBaseStorage)
    assert vars(kopf_fixes.Essence()) == vars(default)


async def test_while_the_first_listing_is_indexed_every_resource_gets_a_worker() -> None:
    # kopf's own shape: each worker indexes its resource, then waits until
    # every resource is indexed. A limit in force now would never end.
    kopf_fixes.apply()
    indexed = aiotoggles.ToggleSet(all)
    scheduler = aiotasks.Scheduler(limit=2)
    handled = 0

    async def worker(toggle: aiotoggles.Toggle) -> None:
        nonlocal handled
        await indexed.drop_toggle(toggle)
        await indexed.wait_for(True)
        handled += 1

    try:
        for number in range(10):
            await scheduler.spawn(worker(await indexed.make_toggle(name=str(number))))
        await asyncio.wait_for(scheduler.wait(), timeout=10)
    finally:
        await scheduler.close()
    assert handled == 10


async def test_once_every_index_is_filled_the_worker_limit_holds() -> None:
    kopf_fixes.apply()
    indexed = aiotoggles.ToggleSet(all)
    await indexed.drop_toggle(await indexed.make_toggle(name="listed"))
    scheduler = aiotasks.Scheduler(limit=2)
    release = asyncio.Event()
    running = most = 0

    async def worker() -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await release.wait()
        running -= 1

    try:
        for _ in range(10):
            await scheduler.spawn(worker())
        # The spawner's wake-ups after the last spawn take a few turns of
        # the loop: past these, any third worker would have started,
        # however slow the machine.
        for _ in range(20):
            await asyncio.sleep(0)
        assert running == 2
        release.set()
        await asyncio.wait_for(scheduler.wait(), timeout=10)
    finally:
        await scheduler.close()
    assert most == 2


def test_the_fixes_refuse_a_kopf_whose_functions_changed(monkeypatch):
    """Against kopf 1.45 (pinned) nothing differs; a function of another
    kopf is named, and the operator does not start."""
    assert kopf_fixes.changed(kopf_fixes._KOPF) == []

    def make_toggle(self, __val=False, *, name=None):  # another kopf's
        return None

    monkeypatch.setitem(kopf_fixes._KOPF, "ToggleSet.make_toggle", make_toggle)
    with pytest.raises(InvalidInput, match=r"^kopf: the installed kopf changed ToggleSet\.make_toggle,"):
        kopf_fixes.apply()


def test_a_kopf_that_moved_what_the_fixes_use_is_refused_at_import(monkeypatch):
    monkeypatch.delattr(aiotasks.Scheduler, "_can_spawn")
    spec = spec_from_file_location("kopf_fixes_elsewhere", kopf_fixes.__file__)
    assert spec is not None and spec.loader is not None
    with pytest.raises(InvalidInput, match=r"^kopf: the installed kopf lacks what hooklane operator uses"):
        spec.loader.exec_module(module_from_spec(spec))


def test_only_kopf_fixes_imports_kopf_internals():
    """kopf's private modules (``kopf._*``) are imported in one module,
    whose digests check them at start; the others take them from it."""
    package = Path(hooklane.__file__).parent
    importers = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            if any(name.startswith("kopf._") for name in names):
                importers.add(path.relative_to(package).as_posix())
    assert importers == {"operator/kopf_fixes.py"}
