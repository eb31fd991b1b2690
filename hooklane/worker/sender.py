"""The HTTP side of a delivery: one pooled aiohttp session per process."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohappyeyeballs import AddrInfoType
from aiohttp.abc import ResolveResult
from aiohttp.connector import Connection
from aiohttp.tracing import Trace

from hooklane import metrics
from hooklane.guard import DestinationNotAllowed, Network, dialled_address, is_allowed
from hooklane.results import FailureClass
from hooklane.signing import CONTENT_TYPE, USER_AGENT, request_headers, sign
from hooklane.worker.rules import Attempt
from hooklane.worker.terms import NONE, Terms

logger = logging.getLogger(__name__)

# Bytes of a response the client may buffer before it stops reading the
# socket; the body is never read, so this bounds what a huge answer costs.
_READ_BUFFER = 16 * 1024


def failure_class(
    exc: Exception, timeout_seconds: float, lost: BaseException | None = None, unread: bytes = b""
) -> tuple[FailureClass, str]:
    """What a tenant may read about a call that got no HTTP answer: one of a
    few classes, and its line, never the exception's text. aiohttp quotes
    the bytes it could not parse, and telling refused from reset from
    closed (or a name that does not resolve) would make the delivery log a
    port scanner.

    A connection failure may be only the first symptom of a TLS alert, so
    the sender asks again with what came after it: ``lost``, the error the
    call's connection ended with, and ``unread``, the bytes the receiver
    sent on a new TLS connection that its TLS layer never read."""
    # First: TimeoutError is an OSError, and aiohttp's are ClientErrors too.
    if isinstance(exc, asyncio.TimeoutError):
        return FailureClass.TIMEOUT, f"timeout: no response within {timeout_seconds:g} s"
    # A receiver refusing a TLS 1.3 client's certificate does so after the
    # client's handshake is done, with an alert, while the client is
    # already sending its request. uvloop reads the alert and closes the
    # transport at once, handing the SSL error only to the connection's
    # end: aiohttp's write fails meanwhile ("Can not write request body")
    # with nothing of the alert in its chain. A receiver that resets after
    # its alert fails that write before the alert is even read.
    if _tls_failed(exc) or _tls_failed(lost) or is_tls13_alert(unread):
        return FailureClass.TLS_ERROR, "TLS error"
    # A status line or headers that do not parse, and everything else the
    # receiver answered that is not HTTP.
    if isinstance(exc, (aiohttp.ClientResponseError, aiohttp.ClientPayloadError)):
        return FailureClass.INVALID_RESPONSE, "invalid response"
    if isinstance(exc, (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError)):
        return FailureClass.INVALID_URL, "invalid URL"
    return FailureClass.CONNECTION_FAILED, "connection failed"


def _tls_failed(exc: BaseException | None) -> bool:
    """A TLS failure anywhere in the chain: a refused client certificate
    comes back after the handshake (TLS 1.3), as the read's error."""
    while exc is not None:
        if isinstance(exc, (ssl.SSLError, aiohttp.ClientSSLError)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


# A TLS 1.3 record as the wire shows it after the handshake: every record
# claims to be application data of TLS 1.2 (RFC 8446 section 5.2).
_TLS13_RECORD = b"\x17\x03\x03"
# An encrypted alert: its two bytes, the inner content type and the 16-byte
# tag of every TLS 1.3 cipher suite OpenSSL offers by default.
_TLS13_ALERT_LENGTH = 2 + 1 + 16


def is_tls13_alert(unread: bytes) -> bool:
    """Whether bytes a new TLS connection left unread are one encrypted
    alert and nothing else. They cannot be decrypted once the transport is
    gone, but nothing else a receiver sends before answering is a single
    record of that size, and an alert is the last thing a refusing receiver
    sends. A padded alert is not recognised: the attempt stays a connection
    failure."""
    return (
        len(unread) == len(_TLS13_RECORD) + 2 + _TLS13_ALERT_LENGTH
        and unread.startswith(_TLS13_RECORD)
        and int.from_bytes(unread[3:5]) == _TLS13_ALERT_LENGTH
    )


@dataclass
class _Call:
    """What a call in progress learned of its connection: the future
    aiohttp resolves when the connection ends (with its error, if any), and
    for a new TLS connection a duplicate of its socket, to read what the
    transport left unread when the call fails."""

    closed: asyncio.Future[None] | None = None
    duplicate: socket.socket | None = None

    def unread(self) -> bytes:
        """What the receiver sent that nobody read, without waiting."""
        if self.duplicate is None:
            return b""
        try:
            return self.duplicate.recv(_UNREAD_LIMIT, socket.MSG_DONTWAIT)
        except OSError:
            return b""

    def close(self) -> None:
        if self.duplicate is not None:
            self.duplicate.close()


# More than an alert record, so that a longer read is not mistaken for one.
_UNREAD_LIMIT = 64

# The call the current task is making (Sender.send): set around the request
# so that the connector, which aiohttp gives no handle on the call, can say
# which connection it got.
_CALL: ContextVar[_Call | None] = ContextVar("hooklane_call", default=None)


def _retrieved(closed: asyncio.Future[None]) -> None:
    """Marks a connection's end as seen: most end unobserved, and asyncio
    logs an ended future's error that nobody retrieved."""
    if not closed.cancelled():
        closed.exception()


async def _connection_end(closed: asyncio.Future[None], within: float) -> BaseException | None:
    """The error the connection ended with; None when it ended cleanly or
    has not ended within ``within`` seconds."""
    if within > 0:
        await asyncio.wait((closed,), timeout=within)
    if not closed.done() or closed.cancelled():
        return None
    return closed.exception()


def _duplicate(transport: asyncio.BaseTransport) -> socket.socket | None:
    """A second descriptor of the transport's socket, which outlives the
    transport's closing it: what the kernel still holds for it stays
    readable."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return None
    return socket.fromfd(sock.fileno(), sock.family, sock.type)


def _check(host: str, allowed_networks: Sequence[Network]) -> None:
    if not is_allowed(dialled_address(host), allowed_networks):
        raise DestinationNotAllowed(host)


class GuardedConnector(aiohttp.TCPConnector):
    """A connector that dials only allowed addresses (hooklane/guard.py).

    ``_resolve_host`` is where aiohttp turns a URL's host into the addresses
    it will dial: IP literals (which never reach a resolver), names through
    the resolver, and names from its DNS cache alike. Every address there is
    checked, and one denied address refuses the whole host: a name that
    answers with a public and a private address is not delivered to at all,
    and a rebinding name is caught on whichever connection it rebinds for.

    The socket factory checks again, address by address, as each socket is
    made: ``_resolve_host`` is aiohttp's internal method, and if a release
    renamed it or added a path around it, deliveries would fail with a
    vaguer reason rather than reach a denied address."""

    def __init__(self, allowed_networks: Sequence[Network], **kwargs: Any) -> None:
        super().__init__(socket_factory=lambda info: guarded_socket(info, allowed_networks), **kwargs)
        self._allowed_networks = allowed_networks

    async def _resolve_host(
        self, host: str, port: int, traces: Sequence[Trace] | None = None
    ) -> list[ResolveResult]:
        resolved = await super()._resolve_host(host, port, traces=traces)
        for result in resolved:
            _check(result["host"], self._allowed_networks)
        return resolved

    async def connect(
        self, req: aiohttp.ClientRequest, traces: list[Trace], timeout: aiohttp.ClientTimeout
    ) -> Connection:
        """A pooled or new connection, of which the call being made keeps
        what ``failure_class`` may ask about."""
        conn = await super().connect(req, traces, timeout)
        call = _CALL.get()
        closed = None if conn.protocol is None else conn.protocol.closed
        if call is not None and closed is not None:
            # None removed: the connection's first call. Refusing a client
            # certificate is done on a new connection, never a reused one.
            new = closed.remove_done_callback(_retrieved) == 0
            closed.add_done_callback(_retrieved)
            call.closed = closed
            if new and req.is_ssl() and conn.transport is not None:
                call.duplicate = _duplicate(conn.transport)
        return conn


def guarded_socket(info: AddrInfoType, allowed_networks: Sequence[Network]) -> socket.socket:
    """The socket for one address about to be dialled, if it is allowed."""
    family, type_, proto, _, address = info
    _check(address[0], allowed_networks)
    return socket.socket(family=family, type=type_, proto=proto)


def _denied(exc: BaseException | None) -> DestinationNotAllowed | None:
    """The guard's refusal somewhere in the chain aiohttp wrapped it in."""
    while exc is not None:
        if isinstance(exc, DestinationNotAllowed):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


class Sender:
    def __init__(self, allowed_networks: Sequence[Network]) -> None:
        """``allowed_networks``: where deliveries may go beyond globally
        routable addresses (``HOOKLANE_ALLOWED_NETWORKS``). Required, so that
        nothing that sends can forget it."""
        # No pool-wide or per-host cap: concurrency is decided by reservation
        # (per endpoint) and by the worker (per process); a connector limit
        # would add a queue whose wait eats into the whole-call deadline.
        connector = GuardedConnector(allowed_networks, limit=0, limit_per_host=0, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(
            connector=connector,
            # Never HTTP(S)_PROXY from the environment: a proxy would dial the
            # receiver on Hooklane's behalf, out of the guard's sight.
            trust_env=False,
            auto_decompress=False,
            read_bufsize=_READ_BUFFER,
            cookie_jar=aiohttp.DummyCookieJar(),
            headers={"User-Agent": USER_AGENT, "Content-Type": CONTENT_TYPE},
        )

    async def send(
        self,
        url: str,
        key: bytes | Sequence[bytes],
        msg_id: str,
        body: bytes,
        timeout_seconds: float,
        traceparent: str | None = None,
        terms: Terms = NONE,
        ordering: tuple[str, int] | None = None,
    ) -> Attempt:
        """POST one signed delivery, with a signature per key (the current
        one, and the replaced one while a rotation overlaps), and the W3C
        ``traceparent`` header when there is one; with the endpoint's
        ``terms``: its headers (which cannot name any of Hooklane's), its TLS
        context and server name; an ordered delivery's key and number
        (``ordering``) as headers. The deadline covers the whole call:
        connect, TLS, send and the response's status line and headers."""
        timestamp = int(time.time())
        headers = request_headers(
            terms.headers.items(),
            msg_id,
            timestamp,
            sign(key, msg_id, timestamp, body),
            traceparent,
            ordering,
        )
        # Set every phase deliberately: only ``total`` bounds the call, and
        # the others' defaults differ across aiohttp versions.
        timeout = aiohttp.ClientTimeout(
            total=timeout_seconds, connect=None, sock_connect=None, sock_read=None
        )
        call = _Call()
        started = time.monotonic()
        token = _CALL.set(call)
        try:
            async with self._session.post(
                url,
                data=body,
                headers=headers,
                allow_redirects=False,
                timeout=timeout,
                ssl=True if terms.ssl_context is None else terms.ssl_context,
                server_hostname=terms.server_name,
            ) as response:
                status, retry_after = response.status, response.headers.get("Retry-After")
                # The body is never read: closing drops the connection unless
                # the response was already complete, in which case it is kept.
                if not response.content.is_eof():
                    response.close()
                return Attempt(status, retry_after)
        except (aiohttp.ClientError, OSError) as exc:  # OSError includes TimeoutError
            denied = _denied(exc)
            if denied is not None:
                # Our refusal, of the address the tenant's own URL led to:
                # naming it tells them what to fix, and probes nothing.
                metrics.DESTINATIONS_DENIED.inc()
                logger.warning(
                    "call for event %s refused: %s", msg_id, denied, extra={"action": "send", "event": msg_id}
                )
                return Attempt(None, error=str(denied), failure=FailureClass.DESTINATION_NOT_ALLOWED)
            failure, line = failure_class(exc, timeout_seconds)
            if failure is FailureClass.CONNECTION_FAILED and call.closed is not None:
                # Within the call's deadline: a TLS alert's connection end is
                # a few loop turns away, and a call that has none says so
                # no later than a timeout would have.
                remaining = timeout_seconds - (time.monotonic() - started)
                lost = await _connection_end(call.closed, remaining)
                failure, line = failure_class(exc, timeout_seconds, lost, call.unread())
            # The detail is for operators only. A response error's text would
            # repeat the request, signature and URL (whose query may hold the
            # receiver's token); its message is what did not parse. repr keeps
            # a receiver's control bytes from forging log lines.
            detail = exc.message if isinstance(exc, aiohttp.ClientResponseError) else str(exc)
            logger.info(
                "call for event %s failed, recorded as %r: %s %.500r",
                msg_id,
                line,
                type(exc).__name__,
                detail,
                extra={"action": "send", "event": msg_id},
            )
            return Attempt(None, error=line, failure=failure)
        finally:
            _CALL.reset(token)
            call.close()

    async def close(self) -> None:
        await self._session.close()
