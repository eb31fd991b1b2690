"""The HTTP side of a delivery: one pooled aiohttp session per process."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from datetime import datetime, timezone

import aiohttp

from hooklane.signing import sign
from hooklane.worker.rules import Attempt

logger = logging.getLogger(__name__)

USER_AGENT = "Hooklane/0.1 (+https://www.standardwebhooks.com/)"
# Bytes of a response the client may buffer before it stops reading the
# socket; the body is never read, so this bounds what a huge answer costs.
_READ_BUFFER = 16 * 1024


def event_body(event_id: str, event_type: str, created_at: datetime, data_json: str) -> bytes:
    """The JSON body a receiver gets. ``data_json`` is already JSON text from
    Postgres and is spliced in as is rather than parsed and dumped again."""
    timestamp = created_at.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return (
        '{"id":%s,"type":%s,"timestamp":%s,"data":%s}'
        % (json.dumps(event_id), json.dumps(event_type), json.dumps(timestamp), data_json)
    ).encode()


def failure_class(exc: Exception, timeout_seconds: float) -> str:
    """What a tenant may read about a call that got no HTTP answer: one of a
    few classes, never the exception's text. aiohttp quotes the bytes it
    could not parse, and telling refused from reset from closed (or a name
    that does not resolve) would make the delivery log a port scanner."""
    # First: TimeoutError is an OSError, and aiohttp's are ClientErrors too.
    if isinstance(exc, asyncio.TimeoutError):
        return f"timeout: no response within {timeout_seconds:g} s"
    if isinstance(exc, (ssl.SSLError, aiohttp.ClientSSLError)):
        return "TLS error"
    # A status line or headers that do not parse, and everything else the
    # receiver answered that is not HTTP.
    if isinstance(exc, (aiohttp.ClientResponseError, aiohttp.ClientPayloadError)):
        return "invalid response"
    if isinstance(exc, (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError)):
        return "invalid URL"
    return "connection failed"


class Sender:
    def __init__(self) -> None:
        # No pool-wide or per-host cap: concurrency is decided by reservation
        # (per endpoint) and by the worker (per process); a connector limit
        # would add a queue whose wait eats into the whole-call deadline.
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            read_bufsize=_READ_BUFFER,
            cookie_jar=aiohttp.DummyCookieJar(),
            headers={"User-Agent": USER_AGENT, "Content-Type": "application/json"},
        )

    async def send(
        self, url: str, key: bytes, msg_id: str, body: bytes, timeout_seconds: float
    ) -> Attempt:
        """POST one signed delivery. The deadline covers the whole call:
        connect, TLS, send and the response's status line and headers."""
        timestamp = int(time.time())
        headers = {
            "webhook-id": msg_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(key, msg_id, timestamp, body),
        }
        # Set every phase deliberately: only ``total`` bounds the call, and
        # the others' defaults differ across aiohttp versions.
        timeout = aiohttp.ClientTimeout(
            total=timeout_seconds, connect=None, sock_connect=None, sock_read=None
        )
        try:
            async with self._session.post(
                url, data=body, headers=headers, allow_redirects=False, timeout=timeout
            ) as response:
                status, retry_after = response.status, response.headers.get("Retry-After")
                # The body is never read: closing drops the connection unless
                # the response was already complete, in which case it is kept.
                if not response.content.is_eof():
                    response.close()
                return Attempt(status, retry_after)
        except (aiohttp.ClientError, OSError) as exc:  # OSError includes TimeoutError
            failure = failure_class(exc, timeout_seconds)
            # The detail is for operators only. A response error's text would
            # repeat the request, signature and URL (whose query may hold the
            # receiver's token); its message is what did not parse. repr keeps
            # a receiver's control bytes from forging log lines.
            detail = exc.message if isinstance(exc, aiohttp.ClientResponseError) else str(exc)
            logger.info(
                "call for event %s failed, recorded as %r: %s %.500r",
                msg_id,
                failure,
                type(exc).__name__,
                detail,
                extra={"action": "send", "event": msg_id},
            )
            return Attempt(None, error=failure)

    async def close(self) -> None:
        await self._session.close()
