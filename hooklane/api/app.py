"""The aiohttp application of ``hooklane api``, and running it.

Two middlewares wrap every route: the outer one gives the request its
deadline, turns every refusal into the answer of :mod:`.errors` and counts
the request; the inner one (:mod:`.auth`) checks credentials and resolves
the request's scope. The routes of each audience are added by their own
module (``ingest``, ``admin``, ``tenant``, ``dashboard``, ``portal``); a
handler several audiences share is added once for each.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from importlib import resources

import asyncpg
from aiohttp import web

from hooklane import metrics, store
from hooklane.api import admin, catalogue, dashboard, ingest, portal, server, tenant
from hooklane.api.auth import Audience, Handler, audience, audience_of, authenticate, count, token_sources
from hooklane.api.context import (
    ADMIN_TOKENS,
    DRAINING,
    INGEST_TOKENS,
    SETTINGS,
    SHARES,
    WRITER,
    deadline,
    set_started,
)
from hooklane.api.endpoint_writers import make_writer
from hooklane.api.errors import RETRY_AFTER_SECONDS, Refused, classify, problem, renderer
from hooklane.api.shares import PoolShares, Share, share_sizes
from hooklane.api.tokens import TokenSource
from hooklane.errors import InvalidInput
from hooklane.settings import Settings

logger = logging.getLogger(__name__)

_OPENAPI = resources.files("hooklane.api").joinpath("openapi.json").read_bytes()


def make_app(
    settings: Settings, pool: asyncpg.Pool, ingest_tokens: TokenSource, admin_tokens: TokenSource
) -> web.Application:
    app = web.Application(
        middlewares=[_observe, authenticate],
        # aiohttp refuses (413) a body that grows past this while it is
        # read: the case a Content-Length check cannot catch (chunked).
        client_max_size=settings.api_max_body_bytes,
    )
    app[SETTINGS] = settings
    shares = PoolShares(pool, settings.api_pool_size, share_sizes(settings))
    app[SHARES] = shares
    app[INGEST_TOKENS] = ingest_tokens
    app[ADMIN_TOKENS] = admin_tokens
    app[DRAINING] = asyncio.Event()
    app[WRITER] = make_writer(settings, shares.connect(Share.TENANT))
    app.router.add_get("/openapi.json", _openapi)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    ingest.add_routes(app)
    admin.add_routes(app)
    catalogue.add_routes(app)
    dashboard.add_routes(app)
    tenant.add_routes(app)
    portal.add_routes(app)
    return app


@audience(Audience.OPEN)
async def _openapi(_request: web.Request) -> web.Response:
    return web.Response(body=_OPENAPI, content_type="application/json")


@audience(Audience.OPEN)
async def _healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


@audience(Audience.OPEN)
async def _readyz(request: web.Request) -> web.Response:
    # Readiness does not follow the database: with Postgres down every
    # replica would leave the Service, and producers would meet refused
    # connections instead of a 503 that tells them when to retry.
    if request.app[DRAINING].is_set():
        return web.Response(status=503, text="draining\n")
    return web.Response(text="ready\n")


@web.middleware
async def _observe(request: web.Request, handler: Handler) -> web.StreamResponse:
    set_started(request)
    try:
        response = await _answer(request, handler)
    except web.HTTPException as exc:
        # A redirect, raised rather than returned.
        count(request, exc.status)
        raise
    except asyncio.CancelledError:
        # The client went away before its answer; nginx's word for it.
        count(request, 499)
        raise
    count(request, response.status)
    return response


async def _answer(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The handler's answer by the request's deadline, every error answered
    through the one mapping of :mod:`.errors`: JSON, or the page's HTML."""
    try:
        async with asyncio.timeout_at(_cutoff(request)) as timer:
            return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _http_error(exc)
    except Exception as exc:
        error: Exception = exc
        if timer.expired() and not _body_arrived(request):
            # The client, not the database, kept it past its deadline.
            error = Refused(408, "timeout", "the body did not arrive before the request's deadline")
        found = classify(error, request.method, audience_of(request) is Audience.INGEST)
        if found is None:
            raise
        if found.log_level is not None:
            logger.log(found.log_level, "%s %s: %s", request.method, request.path, found.log_text)
        return renderer(request)(request, found)


# Ingest answers by the deadline itself (a request whose events are in a
# transaction waits for its outcome until then): the root timer is only a
# backstop behind it.
_INGEST_BACKSTOP_SECONDS = 1.0


def _cutoff(request: web.Request) -> float:
    if audience_of(request) is Audience.INGEST:
        return deadline(request) + _INGEST_BACKSTOP_SECONDS
    return deadline(request)


def _body_arrived(request: web.Request) -> bool:
    return not request.can_read_body or request.content.is_eof()


_HTTP_CODES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    415: "unsupported_media_type",
}
_KEPT_HEADERS = ("allow", "retry-after", "www-authenticate")


def _http_error(exc: web.HTTPException) -> web.Response:
    # aiohttp's own refusals (no route, wrong method, a body past
    # client_max_size) come as plain text: answer them in the same JSON.
    headers = {k: v for k, v in exc.headers.items() if k.lower() in _KEPT_HEADERS}
    detail = exc.text if exc.text and not exc.text.startswith(f"{exc.status}:") else exc.reason
    return problem(exc.status, _HTTP_CODES.get(exc.status, "refused"), detail, headers=headers)


async def run(settings: Settings) -> int:
    """``hooklane api``: serve until SIGTERM or SIGINT; then fail readiness
    for ``api_drain_seconds``, stop taking requests, finish those under way
    and return 0."""
    ingest_tokens, admin_tokens = token_sources(settings)
    server.raise_open_files_limit(settings.api_max_connections, settings.api_pool_size)
    # No connection is made yet: the API starts, and answers 503, while the
    # database is away.
    pool = await store.create_pool(
        settings.database_url, min_size=0, max_size=settings.api_pool_size, server_settings=store.API_SESSION
    )
    app = make_app(settings, pool, ingest_tokens, admin_tokens)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=settings.api_ack_timeout_seconds + 5)
    connections = server.Connections(
        settings.api_header_timeout_seconds, settings.api_max_connections, RETRY_AFTER_SECONDS
    )
    metrics_app = web.Application()
    metrics_app.router.add_get("/metrics", metrics.exposition)
    # Liveness is probed here, not on the API's port: a flood that keeps
    # that port at its connection limit must make the pod unready (its
    # /readyz is refused), never get it restarted.
    metrics_app.router.add_get("/healthz", _healthz)
    # The metrics port is no producer's: aiohttp's own keep-alive timer,
    # which runs from the connection until a whole head came, is its bound.
    metrics_runner = web.AppRunner(
        metrics_app, access_log=None, keepalive_timeout=settings.api_header_timeout_seconds
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await runner.setup()
        await metrics_runner.setup()
        await _listen(
            server.BoundedSite(runner, settings.api_host, settings.api_port, connections), "HOOKLANE_API_PORT"
        )
        if settings.metrics_port_of("api"):
            await _listen(
                web.TCPSite(metrics_runner, settings.metrics_host, settings.metrics_port_of("api")),
                "HOOKLANE_METRICS_PORT",
            )
        logger.info(
            "hooklane api listening on %s:%d (%d connections at most); admin API and dashboard %s",
            settings.api_host,
            settings.api_port,
            settings.api_max_connections,
            "on" if admin_tokens.configured else "off (no HOOKLANE_ADMIN_TOKENS)",
        )
        await stop.wait()
        app[DRAINING].set()
        # Time for the Service to stop sending here before the socket closes.
        await asyncio.sleep(settings.api_drain_seconds)
    finally:
        await runner.cleanup()
        await metrics_runner.cleanup()
        await pool.close()
        connections.close()
    logger.info("hooklane api stopped")
    return 0


async def _listen(site: web.BaseSite, variable: str) -> None:
    try:
        await site.start()
    except OSError as exc:
        raise InvalidInput(variable, f"cannot listen on {site.name}: {exc.strerror}") from None
