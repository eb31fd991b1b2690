"""The connections of ``hooklane api``'s HTTP port, bounded.

aiohttp's server keeps a connection that never sends a whole request head
for an hour (its keep-alive timeout), and takes as many connections as the
process has file descriptors: about a thousand idle sockets, without any
token, were enough to make every real publish fail. Here:

- a connection that has not sent a complete request head (request line and
  headers) within ``api_header_timeout_seconds`` of connecting, or of its
  previous answer, is closed;
- past ``api_max_connections`` open connections, a new one is answered 503
  and closed at once, before aiohttp sees it, so that the connections
  already open, and new ones once there is room, keep working;
- what is shed is counted (``hooklane_api_connections_shed_total``) and
  logged, once at once and then at most every ``LOG_INTERVAL_SECONDS``;
- at start the soft limit of open files is raised to the hard one, and the
  API refuses to start when the connections, the pool and a margin would
  not fit in it.

What this relies on from aiohttp's internals, kept small on purpose and
covered by tests/processes/test_api_connections.py: a site (:class:`BoundedSite`)
registers itself with ``BaseSite.start`` and keeps its asyncio server in
``self._server``, as aiohttp's own sites do; a ``RequestHandler`` is made
with ``RequestHandler(server, loop=..., **kwargs)`` as ``Server.__call__``
makes it; it reads ``server.request_factory`` when it is made and calls it
once per request head it parsed; and ``finish_response`` returns once an
answer is written.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from collections import Counter
from typing import Any, cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from hooklane import metrics
from hooklane.errors import InvalidInput

logger = logging.getLogger(__name__)

# File descriptors besides the connections and the pool: the listening
# sockets, the metrics port's connections, token and log files, the event
# loop's own, and the sockets accepted only to be shed (asyncio accepts up
# to the listen backlog in one go, before any is closed).
FD_MARGIN = 256
BACKLOG = 128
# A shed connection is logged at once, and the ones after it together, at
# most once per this interval: a flood of them must not flood the log.
LOG_INTERVAL_SECONDS = 10.0

HEADER_TIMEOUT = "header_timeout"
IDLE = "idle"
LIMIT = "limit"


def open_files_needed(max_connections: int, pool_size: int) -> int:
    return max_connections + pool_size + FD_MARGIN


def raise_open_files_limit(max_connections: int, pool_size: int) -> int:
    """Raise RLIMIT_NOFILE's soft limit to the hard one and return it;
    ``InvalidInput`` when the connections, the pool and the margin cannot
    fit in it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = open_files_needed(max_connections, pool_size)
    if soft == resource.RLIM_INFINITY:
        return soft
    # An unlimited hard limit cannot be a soft one on Linux (fs.nr_open caps it).
    target = hard if hard != resource.RLIM_INFINITY else max(soft, needed)
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            logger.warning("cannot raise the open files limit from %d to %d: %s", soft, target, exc)
        else:
            logger.info("open files limit raised from %d to %d", soft, target)
            soft = target
    if soft < needed:
        raise InvalidInput(
            "HOOKLANE_API_MAX_CONNECTIONS",
            f"{max_connections} connections, {pool_size} to the database and {FD_MARGIN} other files need"
            f" {needed} open files, but this process may open {soft} (RLIMIT_NOFILE): lower"
            " HOOKLANE_API_MAX_CONNECTIONS, or raise the hard limit (`ulimit -Hn`, the container"
            " runtime's nofile limit)",
        )
    return soft


class Connections:
    """The bounds of one listener, the count of its open connections and
    the log of what it sheds."""

    def __init__(self, header_timeout: float, max_connections: int, retry_after: int) -> None:
        self.header_timeout = header_timeout
        self.max_connections = max_connections
        self.open = 0
        body = json.dumps(
            {
                "error": "unavailable",
                "detail": "too many connections are open to this API process; try again",
            }
        ).encode()
        self.refusal = (
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            + f"Retry-After: {retry_after}\r\nContent-Length: {len(body)}\r\n".encode()
            + b"Connection: close\r\n\r\n"
            + body
        )
        self._unlogged: Counter[str] = Counter()
        self._flush: asyncio.TimerHandle | None = None

    def admit(self) -> bool:
        if self.open >= self.max_connections:
            return False
        self.open += 1
        metrics.API_CONNECTIONS_OPEN.inc()
        return True

    def left(self) -> None:
        self.open -= 1
        metrics.API_CONNECTIONS_OPEN.dec()

    def shed(self, reason: str, peer: Any) -> None:
        metrics.API_CONNECTIONS_SHED.labels(reason).inc()
        if reason == IDLE:
            # A client's pooled connection left unused: ordinary, not news.
            return
        if self._flush is not None:
            self._unlogged[reason] += 1
            return
        logger.warning("connection from %s %s", _address(peer), self._why(reason))
        self._flush = asyncio.get_running_loop().call_later(LOG_INTERVAL_SECONDS, self._log_unlogged)

    def _log_unlogged(self) -> None:
        self._flush = None
        if not self._unlogged:
            return
        logger.warning(
            "%d more connections shed in the last %g s: %s",
            sum(self._unlogged.values()),
            LOG_INTERVAL_SECONDS,
            "; ".join(f"{count} {self._why(reason)}" for reason, count in sorted(self._unlogged.items())),
        )
        self._unlogged.clear()
        self._flush = asyncio.get_running_loop().call_later(LOG_INTERVAL_SECONDS, self._log_unlogged)

    def _why(self, reason: str) -> str:
        if reason == LIMIT:
            return (
                f"closed at once: {self.max_connections} connections are open (HOOKLANE_API_MAX_CONNECTIONS)"
            )
        return (
            f"closed: no complete request head within {self.header_timeout:g} s"
            " (HOOKLANE_API_HEADER_TIMEOUT_SECONDS)"
        )

    def close(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None


def _address(peer: Any) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        host, port = peer[0], peer[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return "an unknown address"


class _Handler(RequestHandler):
    """aiohttp's connection handler, with a deadline on each request head
    and a place under the limit of connections."""

    def __init__(self, server: web.Server, connections: Connections, **kwargs: Any) -> None:
        super().__init__(server, **kwargs)
        self._connections = connections
        self._deadline: asyncio.TimerHandle | None = None
        self._admitted = False
        # Between a parsed request head and its answer written: no deadline.
        self._busy = False
        # Bytes came since the previous answer (or the connection): a head has begun.
        self._heard = False
        self._answered = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._connections.admit():
            # Never handed to aiohttp: no task, no parser fed, the socket
            # closed once the answer is written.
            # A stream transport (uvloop's is no asyncio.WriteTransport subclass).
            stream = cast(asyncio.Transport, transport)
            stream.write(self._connections.refusal)
            stream.close()
            self._connections.shed(LIMIT, stream.get_extra_info("peername"))
            return
        self._admitted = True
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._admitted:
            return
        self._admitted = False
        self._disarm()
        self._connections.left()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._busy and data:
            self._heard = True
        super().data_received(data)

    def request_started(self) -> None:
        self._busy = True
        self._disarm()

    async def finish_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().finish_response(*args, **kwargs)
        finally:
            self._busy = False
            self._heard = False
            self._answered = True
            self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._deadline = asyncio.get_running_loop().call_later(self._connections.header_timeout, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if self._busy or self.transport is None:
            return
        # Nothing at all since an answer is a client's idle keep-alive
        # connection; anything else has not finished a head in time.
        idle = self._answered and not self._heard
        self._connections.shed(IDLE if idle else HEADER_TIMEOUT, self.transport.get_extra_info("peername"))
        self.force_close()


def _mark_requests(server: web.Server) -> None:
    """Tell each bounded handler when a request head of its is complete:
    ``server.request_factory`` is called once per parsed head."""
    make = server.request_factory
    if getattr(make, "hooklane_marks", False):
        return

    def request_factory(message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> web.BaseRequest:
        if isinstance(protocol, _Handler):
            protocol.request_started()
        return make(message, payload, protocol, writer, task)

    request_factory.hooklane_marks = True  # type: ignore[attr-defined]
    server.request_factory = request_factory


class BoundedSite(web.BaseSite):
    """A TCP listener whose connections are bounded by ``connections``."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, connections: Connections) -> None:
        super().__init__(runner, backlog=BACKLOG)
        self._host = host
        self._port = port
        self._connections = connections

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        _mark_requests(server)
        loop = asyncio.get_running_loop()

        def handler() -> asyncio.Protocol:
            # The access log is off, as the runner's own handlers would have it.
            return _Handler(server, self._connections, loop=loop, access_log=None)

        self._server = await loop.create_server(handler, self._host, self._port, backlog=self._backlog)
