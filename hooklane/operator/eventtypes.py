"""kopf handlers: WebhookEventType resources into the event catalogue.

A type is few rows written rarely, so the handling is plain: create,
update of the spec and the operator's start (resume) check the spec whole
(hooklane/catalogue.py) and store the type with every version it lists in
one transaction, removing the versions it no longer lists; deletion waits
on the finalizer until the rows are gone. The outcome is the Ready
condition, with the field named when the spec is invalid, and the stored
type and its latest version in status (the printer columns read them).

The rows are the resource's only where the operator wrote them (source
'kubernetes'): a type of the same name that `hooklane eventtype apply`
stored is neither overwritten nor deleted, and the condition says so; the
handler tries again every minute, so the resource is stored once the local
type is deleted."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import kopf

from hooklane import catalogue, store
from hooklane.crd import EVENTTYPE_PLURAL, GROUP, VERSION
from hooklane.errors import InvalidInput, StoreError
from hooklane.operator.handlers import kopf_error
from hooklane.operator.reflect import READY, Condition, Reason

# How often a resource whose name a local type holds is tried again.
LOCAL_RETRY_SECONDS = 60.0


def register(registry: kopf.OperatorRegistry) -> None:
    resource = (GROUP, VERSION, EVENTTYPE_PLURAL)
    kopf.on.resume(*resource, id="resume", registry=registry)(sync)
    kopf.on.create(*resource, id="sync", registry=registry)(sync)
    kopf.on.update(*resource, id="sync", field="spec", registry=registry)(sync)
    kopf.on.delete(*resource, registry=registry)(delete)


async def sync(
    *,
    name: str,
    body: kopf.Body,
    meta: kopf.Meta,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger: kopf.Logger,
    old: Any = None,
    **_: Any,
) -> None:
    generation = meta.get("generation")
    spec = body.get("spec")
    try:
        checked = catalogue.parse_spec(name, spec)
    except InvalidInput as exc:
        # Retrying cannot help; what was stored before stays in the catalogue.
        _report(patch, status, generation, Condition(False, Reason.INVALID_SPEC, str(exc)))
        return
    try:
        async with store.acquire(memo.pool) as conn, conn.transaction():
            renamed = _stored_name(name, old)
            if renamed is not None and renamed != checked.name:
                # spec.name changed (only its case can): the old type goes,
                # in the transaction that stores the new one.
                await store.delete_event_type(conn, renamed, store.EventTypeSource.KUBERNETES)
            applied = await store.apply_event_type(conn, checked, store.EventTypeSource.KUBERNETES)
    except StoreError as exc:
        if exc.transient:
            raise kopf_error(exc) from exc
        message = f"Postgres refused the type: {exc}"
        _report(patch, status, generation, Condition(False, Reason.STORE_REFUSED, message))
        return
    if applied.held_by is not None:
        message = (
            f"{checked.name} was applied with `hooklane eventtype apply` (local mode), which this"
            f" resource does not overwrite: delete it there (hooklane eventtype delete {checked.name})"
        )
        _report(patch, status, generation, Condition(False, Reason.DECLARED_LOCALLY, message))
        raise kopf.TemporaryError(message, delay=LOCAL_RETRY_SECONDS)
    written = ", ".join(map(str, applied.written_versions)) or "none"
    removed = ", ".join(map(str, applied.removed_versions)) or "none"
    logger.info(f"stored as {checked.name}: versions written {written}, removed {removed}")
    message = f"stored as {checked.name}, versions {', '.join(str(v.version) for v in checked.versions)}"
    _report(patch, status, generation, Condition(True, Reason.SYNCED, message), checked)


async def delete(*, name: str, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """The type and its versions go from the catalogue (publishes of it then
    count as unknown); a local type of the same name stays."""
    type_name = _stored_name(name, body.get("spec"))
    if type_name is None:
        return
    try:
        async with store.acquire(memo.pool) as conn:
            removed = await store.delete_event_type(conn, type_name, store.EventTypeSource.KUBERNETES)
    except StoreError as exc:
        raise kopf_error(exc) from exc
    if removed.found:
        logger.info(f"{type_name} removed from the catalogue")
    elif removed.held_by is not None:
        logger.info(f"{type_name} is a local type (hooklane eventtype apply): left in the catalogue")


def _stored_name(name: str, spec: Any) -> str | None:
    """The type a spec names, if it is one the catalogue may hold."""
    if spec is None:
        return None
    type_name = spec.get("name") if isinstance(spec, dict) else None
    type_name = type_name if isinstance(type_name, str) else name
    return type_name if catalogue.is_type_name(type_name) else None


def _report(
    patch: kopf.Patch,
    status: kopf.Status,
    generation: int | None,
    condition: Condition,
    stored: catalogue.EventTypeSpec | None = None,
) -> None:
    old = next((c for c in status.get("conditions") or [] if c.get("type") == READY), None)
    patch.status["conditions"] = [condition.status(READY, old, generation, datetime.now(UTC))]
    patch.status["observedGeneration"] = generation
    if stored is not None:
        patch.status["type"] = stored.name
        patch.status["latestVersion"] = stored.latest
