"""What a request handler finds on the application and on its request."""

from __future__ import annotations

import asyncio

from aiohttp import web

from hooklane.api.actions import Scope
from hooklane.api.endpoint_writers import EndpointWriter
from hooklane.api.shares import PoolShares
from hooklane.api.tokens import TokenSource
from hooklane.settings import Settings
from hooklane.store.grants import TenantGrant
from hooklane.tokens import Grant

SETTINGS = web.AppKey("settings", Settings)
# The API's pool, in shares per audience: handlers take connections
# through them (hooklane.api.auth.connection).
SHARES = web.AppKey("shares", PoolShares)
INGEST_TOKENS = web.AppKey("ingest_tokens", TokenSource)
ADMIN_TOKENS = web.AppKey("admin_tokens", TokenSource)
# Where tenants' own endpoints are written; None while self-service is off.
WRITER: web.AppKey[EndpointWriter | None] = web.AppKey("writer")
# Set on SIGTERM: /readyz fails, so that the Service stops sending here.
DRAINING = web.AppKey("draining", asyncio.Event)

_GRANT = web.RequestKey("grant", Grant)
_STARTED = web.RequestKey("started", float)
_SCOPE = web.RequestKey("scope", Scope)


def grant(request: web.Request) -> Grant:
    """The grant of the token the request was authenticated with."""
    return request[_GRANT]


def set_grant(request: web.Request, value: Grant) -> None:
    request[_GRANT] = value


def scope(request: web.Request) -> Scope:
    """Whom the request acts for, as its credentials said (:mod:`.auth`)."""
    return request[_SCOPE]


def set_scope(request: web.Request, value: Scope) -> None:
    request[_SCOPE] = value


def tenant_grant(request: web.Request) -> TenantGrant:
    """The tenant session the request was authenticated with."""
    grant = scope(request).grant
    assert grant is not None, "a tenant's route"
    return grant


def started(request: web.Request) -> float:
    """When the API began handling the request, on the event loop's clock:
    the clock the request's deadlines are set on."""
    return request.get(_STARTED, asyncio.get_running_loop().time())


def set_started(request: web.Request) -> None:
    request[_STARTED] = asyncio.get_running_loop().time()


def deadline(request: web.Request) -> float:
    """When the request must have its answer, on the event loop's clock:
    ``api_ack_timeout_seconds`` after it began."""
    return started(request) + request.config_dict[SETTINGS].api_ack_timeout_seconds


# Of a repair's time, what is kept to answer: it stops starting pages
# before its deadline by this share of the ack timeout (and by twice its
# slowest page), so that it answers how far it got rather than a 503.
_ANSWER_SHARE = 0.1


def repair_stop(request: web.Request) -> float:
    """When a paged repair stops starting pages, on the event loop's clock."""
    return deadline(request) - _ANSWER_SHARE * request.config_dict[SETTINGS].api_ack_timeout_seconds
