"""Where a tenant's own endpoints are written (docs/self-service.md): one
writer per ``HOOKLANE_PORTAL_ENDPOINTS`` mode, so that each mode keeps one
source of truth.

- ``local``: Postgres, through ``store.upsert_endpoint`` as ``hooklane
  endpoint apply`` writes.
- ``kubernetes``: ``WebhookEndpoint`` resources and their Secrets in the
  portal's namespace, through the Kubernetes API; the operator stays the
  only writer of their rows, and ``kubectl get whe`` and GitOps see them.

What a tenant may ask for, and the resource's name, are decided in
:mod:`hooklane.selfservice`; here they are stored. An endpoint that is not
the tenant's, or not in the portal's namespace, answers exactly as one that
does not exist (False or None), so that no answer tells a tenant about
another's endpoints.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import asyncpg

from hooklane import kube, store
from hooklane.api.errors import Refused
from hooklane.api.shares import Connect
from hooklane.checks import check_name
from hooklane.delivery import RequestTerms
from hooklane.errors import InvalidInput
from hooklane.selfservice import (
    EndpointForm,
    Limits,
    chosen_name,
    filled,
    manifest,
    spec_for,
    spec_patch,
    tenant_key,
)
from hooklane.settings import Settings
from hooklane.signing import SECRET_PREFIX
from hooklane.spec import API_VERSION, KIND, SPEC, EndpointSpec

logger = logging.getLogger(__name__)

# The labels of what the portal writes: the resources it may change (and
# count) are those it made, for that tenant (spec.tenant is checked too).
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "hooklane-portal"
TENANT_LABEL = "hooklane.io/tenant-key"
# A call to the Kubernetes API that takes longer is given up: a tenant's
# request waits on it.
KUBE_TIMEOUT_SECONDS = 10.0
_SECRET_BYTES = 32
_T = TypeVar("_T")


@dataclass(frozen=True)
class Created:
    namespace: str
    name: str
    # The signing secret: shown to the tenant once, never again.
    secret: str


class EndpointWriter(Protocol):
    """A tenant's endpoints, written where the mode keeps them. ``name`` is
    the resource's (``selfservice.resource_name``), ``form.name`` the one
    the tenant chose. ``InvalidInput`` names the form field at fault;
    ``Refused`` is 409 for a name taken or the bound reached, 503 when the
    store behind cannot be reached."""

    async def create(self, tenant: str, form: EndpointForm) -> Created: ...

    async def update(self, tenant: str, namespace: str, name: str, form: EndpointForm) -> bool: ...

    async def delete(self, tenant: str, namespace: str, name: str) -> bool: ...

    async def set_paused(self, tenant: str, namespace: str, name: str, paused: bool) -> bool: ...

    async def rotate_secret(self, tenant: str, namespace: str, name: str) -> str | None: ...


def make_writer(settings: Settings, connect: Connect) -> EndpointWriter | None:
    """The writer of ``settings.portal_endpoints``; None when tenants may
    not manage endpoints. ``connect`` gives connections of the API's pool
    (the tenants' share): in both modes they hold the lock that keeps
    concurrent creates within the bound."""
    if settings.portal_endpoints == "local":
        return LocalWriter(settings, connect)
    if settings.portal_endpoints == "kubernetes":
        return KubernetesWriter(settings, connect, kube.Client(KUBE_TIMEOUT_SECONDS, "portal", _unavailable))
    return None


def new_secret() -> str:
    """A Standard Webhooks signing secret: ``whsec_`` and 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(_SECRET_BYTES)).decode("ascii")


def _portal_name(settings: Settings, tenant: str, namespace: str, name: str) -> str | None:
    """The name ``tenant`` chose for ``namespace/name``, when the portal
    could have made it for this tenant; None otherwise, decided from the
    request alone (and the name is then never put in a URL)."""
    if namespace != settings.portal_namespace:
        return None
    try:
        check_name(name, "name")
    except InvalidInput:
        return None
    return chosen_name(tenant, name)


def _edited(settings: Settings, tenant: str, name: str, form: EndpointForm, held: Limits) -> EndpointSpec:
    spec = spec_for(tenant, form, settings, held)
    if spec.name != name:
        raise InvalidInput("name", f"is the endpoint's own and cannot change ({chosen_name(tenant, name)!r})")
    return spec


def _exists(form: EndpointForm) -> Refused:
    return Refused(409, "exists", f"you have an endpoint named {form.name!r} already", "name")


def _limit(settings: Settings) -> Refused:
    return Refused(
        409,
        "endpoint_limit",
        f"a tenant may have at most {settings.portal_max_endpoints} endpoints: delete one first",
    )


@dataclass(frozen=True)
class _Held:
    """An endpoint's row, locked, as an upsert would write it back."""

    spec: EndpointSpec
    secret: str | None
    terms: RequestTerms | None


class LocalWriter:
    """Rows in Postgres, written by the call ``hooklane endpoint apply``
    makes. Every change reads the row first, locked, and writes it back
    whole, so that what the form does not set (paused, spec.delivery set
    by the platform, the secret) stays as it was."""

    def __init__(self, settings: Settings, connect: Connect) -> None:
        self._settings = settings
        self._connect = connect

    async def create(self, tenant: str, form: EndpointForm) -> Created:
        spec = spec_for(tenant, form, self._settings)
        secret = new_secret()
        async with self._connect() as conn, conn.transaction():
            await store.lock_tenant_creates(conn, tenant)
            if await self._held(conn, spec.namespace, spec.name) is not None:
                raise _exists(form)
            if (
                await store.tenant_endpoint_count(conn, spec.namespace, tenant)
                >= self._settings.portal_max_endpoints
            ):
                raise _limit(self._settings)
            await self._upsert(conn, spec, secret, None)
        return Created(spec.namespace, spec.name, secret)

    async def update(self, tenant: str, namespace: str, name: str, form: EndpointForm) -> bool:
        async def edit(conn: asyncpg.Connection, held: _Held) -> bool:
            limits = Limits(held.spec.max_concurrency, held.spec.timeout_seconds)
            spec = _edited(self._settings, tenant, name, form, limits)
            kept = dataclasses.replace(spec, paused=held.spec.paused, delivery=held.spec.delivery)
            await self._upsert(conn, kept, held.secret, held.terms)
            return True

        return await self._change(tenant, namespace, name, edit) or False

    async def delete(self, tenant: str, namespace: str, name: str) -> bool:
        async def remove(conn: asyncpg.Connection, _held: _Held) -> bool:
            return await store.delete_endpoint(conn, namespace, name)

        return await self._change(tenant, namespace, name, remove) or False

    async def set_paused(self, tenant: str, namespace: str, name: str, paused: bool) -> bool:
        async def pause(conn: asyncpg.Connection, held: _Held) -> bool:
            await self._upsert(conn, dataclasses.replace(held.spec, paused=paused), held.secret, held.terms)
            return True

        return await self._change(tenant, namespace, name, pause) or False

    async def rotate_secret(self, tenant: str, namespace: str, name: str) -> str | None:
        secret = new_secret()

        async def rotate(conn: asyncpg.Connection, held: _Held) -> str:
            # upsert_endpoint keeps the replaced secret signing for the grace.
            await self._upsert(conn, held.spec, secret, held.terms)
            return secret

        return await self._change(tenant, namespace, name, rotate)

    async def _change(
        self,
        tenant: str,
        namespace: str,
        name: str,
        change: Callable[[asyncpg.Connection, _Held], Awaitable[_T]],
    ) -> _T | None:
        """``change`` applied to the endpoint if it is the tenant's, in the
        transaction that holds its row locked; None if it is not."""
        if _portal_name(self._settings, tenant, namespace, name) is None:
            return None
        async with self._connect() as conn, conn.transaction():
            held = await self._held(conn, namespace, name)
            if held is None or held.spec.tenant != tenant:
                return None
            return await change(conn, held)

    async def _held(self, conn: asyncpg.Connection, namespace: str, name: str) -> _Held | None:
        try:
            stored = await store.stored_endpoint(
                conn, namespace, name, self._settings.encryption_key, lock=True
            )
            if stored is None:
                return None
            return _Held(stored.spec(namespace, name), stored.secret, stored.request_terms())
        except InvalidInput as exc:
            # The platform's keys, not the tenant's input: HOOKLANE_ENCRYPTION_KEY
            # lacks the key the row was sealed with.
            logger.error("%s/%s cannot be changed: %s", namespace, name, exc, extra={"action": "portal"})
            raise Refused(
                503, "unavailable", "this endpoint cannot be changed right now: the platform has been told"
            ) from None

    async def _upsert(
        self, conn: asyncpg.Connection, spec: EndpointSpec, secret: str | None, terms: RequestTerms | None
    ) -> None:
        await store.upsert_endpoint(
            conn,
            spec,
            secret,
            terms=terms,
            keyring=self._settings.encryption_key,
            grace_seconds=self._settings.secret_grace_seconds,
        )


def _unavailable() -> Refused:
    return Refused(
        503,
        "unavailable",
        "the Kubernetes API cannot be reached or did not answer in time; the change may or may not have"
        " been made: look at your endpoints before repeating it",
    )


class KubernetesWriter:
    """``WebhookEndpoint`` resources and their Secrets in the portal's
    namespace. The Secret is owned by its resource (an ownerReference), so
    Kubernetes deletes it with the resource. The operator turns both into
    the row, as for any resource: a change of spec (paused included) and a
    change of Secret (a rotation) each reach it."""

    def __init__(self, settings: Settings, connect: Connect, client: kube.Client) -> None:
        self._settings = settings
        self._connect = connect
        self._client = client
        self._namespace = settings.portal_namespace

    async def create(self, tenant: str, form: EndpointForm) -> Created:
        spec = spec_for(tenant, form, self._settings)
        doc = manifest(tenant, filled(form, self._settings), self._namespace)
        doc["metadata"]["labels"] = _labels(tenant)
        # A Secret of its own each time: the one of a deleted endpoint of
        # this name may linger until the garbage collector gets to it.
        doc["spec"]["secretRef"]["name"] = f"{spec.name}-{secrets.token_hex(4)}"
        secret = new_secret()
        # The API's replicas share Postgres: its lock keeps concurrent creates
        # of one tenant, whichever replica serves them, from both counting
        # below the bound. The list is a consistent read.
        async with self._connect() as conn, conn.transaction():
            await store.lock_tenant_creates(conn, tenant)
            if await self._count(tenant) >= self._settings.portal_max_endpoints:
                raise _limit(self._settings)
            status, created = await self._client.call("POST", kube.endpoints_path(self._namespace), doc)
            if status == 409:
                raise _exists(form)
            _check(status, created, f"create webhookendpoint {spec.name}")
            try:
                await self._create_secret(created, secret)
            except Refused:
                # Without its Secret nothing would be signed: undone, so that
                # the tenant may try again (by uid: only this one). Should
                # that fail too, a rotation makes the Secret.
                with contextlib.suppress(Refused):
                    await self._delete(spec.name, created["metadata"]["uid"])
                raise
        return Created(self._namespace, spec.name, secret)

    async def update(self, tenant: str, namespace: str, name: str, form: EndpointForm) -> bool:
        found = await self._owned(tenant, namespace, name)
        if found is None:
            return False
        spec = _edited(self._settings, tenant, name, form, _limits(found))
        return await self._patch(found, tenant, spec_patch(spec))

    async def delete(self, tenant: str, namespace: str, name: str) -> bool:
        found = await self._owned(tenant, namespace, name)
        return found is not None and await self._delete(name, found["metadata"]["uid"])

    async def set_paused(self, tenant: str, namespace: str, name: str, paused: bool) -> bool:
        found = await self._owned(tenant, namespace, name)
        return found is not None and await self._patch(found, tenant, {"paused": paused})

    async def rotate_secret(self, tenant: str, namespace: str, name: str) -> str | None:
        found = await self._owned(tenant, namespace, name)
        if found is None:
            return None
        secret = new_secret()
        ref = found["spec"]["secretRef"]
        # Only the Secret this resource owns: its secretRef may have been
        # pointed elsewhere by hand.
        owner_uid = {
            "op": "test",
            "path": "/metadata/ownerReferences/0/uid",
            "value": found["metadata"]["uid"],
        }
        value = {"op": "add", "path": f"/data/{_pointer(ref['key'])}", "value": _b64(secret)}
        status, answer = await self._client.call(
            "PATCH", kube.secrets_path(self._namespace, ref["name"]), [owner_uid, value], patch=True
        )
        if status == 404:
            # Its create failed half-way: made now, as the create would have.
            await self._create_secret(found, secret)
            return secret
        if status == 422:
            raise Refused(
                409, "conflict", "this endpoint's signing secret is not one the portal made: ask the platform"
            )
        _check(status, answer, f"patch secret {ref['name']}")
        return secret

    async def _count(self, tenant: str) -> int:
        status, listed = await self._client.call(
            "GET",
            kube.endpoints_path(self._namespace),
            query={"labelSelector": f"{MANAGED_BY_LABEL}={MANAGED_BY},{TENANT_LABEL}={tenant_key(tenant)}"},
        )
        _check(status, listed, "list webhookendpoints")
        return sum(1 for item in listed.get("items", ()) if _mine(item, tenant) and not _deleting(item))

    async def _owned(self, tenant: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The resource, if the portal made it for ``tenant`` and it is not
        on its way out; None otherwise."""
        if _portal_name(self._settings, tenant, namespace, name) is None:
            return None
        status, found = await self._client.call("GET", kube.endpoints_path(self._namespace, name))
        if status == 404:
            return None
        _check(status, found, f"get webhookendpoint {name}")
        return found if _mine(found, tenant) and not _deleting(found) else None

    async def _patch(self, found: dict[str, Any], tenant: str, fields: Mapping[str, Any]) -> bool:
        """Set spec ``fields`` of ``found``, the tenant's resource. A JSON
        patch whose tests repeat the ownership checks, so that a resource
        given to someone else since it was read is left alone."""
        name = found["metadata"]["name"]
        tests = [
            {"op": "test", "path": "/metadata/uid", "value": found["metadata"]["uid"]},
            {"op": "test", "path": f"/metadata/labels/{_pointer(TENANT_LABEL)}", "value": tenant_key(tenant)},
            {"op": "test", "path": "/spec/tenant", "value": tenant},
        ]
        # add: replaces a field, or sets one the resource left out.
        changes = [{"op": "add", "path": f"/spec/{key}", "value": value} for key, value in fields.items()]
        status, answer = await self._client.call(
            "PATCH", kube.endpoints_path(self._namespace, name), tests + changes, patch=True
        )
        if status in (404, 422):
            # Gone, or a test failed: no longer this tenant's.
            return False
        _check(status, answer, f"patch webhookendpoint {name}")
        return True

    async def _delete(self, name: str, uid: str) -> bool:
        # Background: the Secret it owns is deleted after it, by Kubernetes.
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": "Background",
            "preconditions": {"uid": uid},
        }
        status, answer = await self._client.call(
            "DELETE", kube.endpoints_path(self._namespace, name), options
        )
        if status in (404, 409):
            # Gone already, or another resource under this name.
            return False
        _check(status, answer, f"delete webhookendpoint {name}")
        return True

    async def _create_secret(self, owner: dict[str, Any], secret: str) -> None:
        meta = owner["metadata"]
        ref = owner["spec"]["secretRef"]
        doc = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {
                "name": ref["name"],
                "namespace": self._namespace,
                "labels": meta["labels"],
                "ownerReferences": [
                    {"apiVersion": API_VERSION, "kind": KIND, "name": meta["name"], "uid": meta["uid"]}
                ],
            },
            "data": {ref["key"]: _b64(secret)},
        }
        status, answer = await self._client.call("POST", kube.secrets_path(self._namespace), doc)
        if status == 409:
            raise Refused(409, "conflict", f"a Secret named {ref['name']!r} exists already: ask the platform")
        _check(status, answer, f"create secret {ref['name']}")


def _limits(found: dict[str, Any]) -> Limits:
    """The limits of a resource as read (the API server fills in the
    CRD's defaults; the spec's, should one be missing all the same)."""
    spec = found["spec"]
    return Limits(
        spec.get("maxConcurrency", SPEC.properties["maxConcurrency"].default),
        spec.get("timeoutSeconds", SPEC.properties["timeoutSeconds"].default),
    )


def _labels(tenant: str) -> dict[str, str]:
    return {MANAGED_BY_LABEL: MANAGED_BY, TENANT_LABEL: tenant_key(tenant)}


def _mine(item: dict[str, Any], tenant: str) -> bool:
    # The label narrows the list; spec.tenant decides, so that two tenants
    # whose keys agree by chance still never share an endpoint.
    labels = item.get("metadata", {}).get("labels") or {}
    wanted = _labels(tenant).items()
    return (
        all(labels.get(key) == value for key, value in wanted)
        and item.get("spec", {}).get("tenant") == tenant
    )


def _deleting(item: dict[str, Any]) -> bool:
    return bool(item.get("metadata", {}).get("deletionTimestamp"))


def _check(status: int, answer: dict[str, Any], what: str) -> None:
    """Nothing for a success; otherwise the refusal the tenant gets, and,
    for what the platform must fix (permissions, an API server refusing
    what the parser took), a log line for its operators."""
    if 200 <= status < 300:
        return
    message = answer.get("message", "")
    if status == 409:
        raise Refused(409, "conflict", f"the endpoint changed meanwhile: {message}")
    logger.error("Kubernetes API: %s: %d %s", what, status, message, extra={"action": "portal"})
    raise _unavailable()


def _pointer(key: str) -> str:
    """``key`` as one step of a JSON pointer (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def _b64(text: str) -> str:
    return base64.b64encode(text.encode("ascii")).decode("ascii")
