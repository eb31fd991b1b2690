"""Catch up on the events a webhook receiver missed, from Hooklane's tenant API.

Pages through the tenant's events (GET /v1/tenant/events) from a saved
position, hands each one to the receiver's handler in the order Hooklane
stored them, and saves the position only once every event before it was
handled: a crash, a failing handler or Ctrl-C repeats from the saved
position and never skips an event. Python 3.9 or later, standard library
only. Replace handle() with your webhook receiver's own handler.

    HOOKLANE_URL=https://hooklane.example.com HOOKLANE_TENANT_TOKEN=hlps_... \\
      python3 catch_up.py --state catch-up.json --since 2026-03-01T00:00:00Z

--since (RFC 3339) is for the first run; later runs continue from the state
file. Exits 0 once caught up, 1 with a message saying what to do otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import email.utils
import http.client
import ipaddress
import json
import os
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

LISTING = "/v1/tenant/events"
LIMIT = 100
# An event's data is at most 256 KiB; JSON escapes can make it three times
# longer in the answer. A longer answer is refused, not read into memory.
EVENT_BYTES = 1024 * 1024
TIMEOUT_SECONDS = 30  # to connect, and between two reads
ANSWER_SECONDS = 300  # to read a whole answer
TRIES = 5
# The longest Retry-After waited for; a longer one ends the run.
MAX_WAIT_SECONDS = 300
STATE_BYTES = 1024 * 1024
UTC = timezone.utc  # noqa: UP017 (datetime.UTC is Python 3.11's)


def handle(event: dict[str, Any]) -> None:
    """Your webhook receiver's handler; this one prints the event. ``event``
    is what a delivery's body holds (and what docs/receivers.md's verify()
    returns): id (the delivery's webhook-id), type, timestamp and data.
    Call the same function your endpoint does, which skips an id it has
    already processed: a delivery may bring the same event too."""
    print(json.dumps(event), flush=True)


class Stop(Exception):
    """Ends the run with a message for whoever runs it."""


def catch_up(
    base: str,
    token: str,
    state_path: str,
    since: str | None,
    limit: int,
    handler: Callable[[dict[str, Any]], None],
) -> int:
    """Hand every event after the saved position to ``handler``; how many."""
    state = load_state(state_path, since)
    handled = set(state["handled"])
    count = 0
    while True:
        query = {"since": state["since"], "limit": str(limit)}
        if state["cursor"] is not None:
            query["cursor"] = state["cursor"]
        events, cursor = get_page(base, token, query, limit)
        for event in events:
            if event["id"] in handled:
                continue  # handled before a crash, after the saved cursor
            try:
                handler(delivered(event))
            except Exception as exc:
                raise Stop(
                    f"handling event {event['id']} failed ({type(exc).__name__}: {printable(str(exc))}); "
                    "the next run starts again from it, without handling the ones before it twice"
                ) from None
            handled.add(event["id"])
            state["handled"].append(event["id"])
            save_state(state_path, state)
            count += 1
        # Every event before the cursor is handled: only now is it saved.
        state = {"since": state["since"], "cursor": cursor, "handled": []}
        handled.clear()
        save_state(state_path, state)
        if len(events) < limit:
            return count


def delivered(event: dict[str, Any]) -> dict[str, Any]:
    """A listed event as a delivery's body has it."""
    created = datetime.fromisoformat(event["created_at"].replace("Z", "+00:00"))
    if created.tzinfo is None:
        raise ValueError("no time zone")
    timestamp = created.astimezone(UTC).isoformat(timespec="milliseconds")
    return {
        "id": event["id"],
        "type": event["type"],
        "timestamp": timestamp.replace("+00:00", "Z"),
        "data": event["data"],
    }


# --- the state file --------------------------------------------------------------


def load_state(path: str, since: str | None) -> dict[str, Any]:
    """The saved position: the listing's since, the cursor, and the ids
    handled after the cursor."""
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read(STATE_BYTES + 1)
    except FileNotFoundError:
        if since is None:
            raise Stop(f"{path} does not exist yet: give --since (RFC 3339) for the first run") from None
        return {"since": since, "cursor": None, "handled": []}
    except (OSError, ValueError) as exc:
        raise Stop(f"cannot read {path}: {exc}") from None
    if since is not None:
        raise Stop(
            f"{path} already holds a position: leave --since out to continue from it, "
            "or remove the file to start again from --since"
        )
    try:
        state = json.loads(text)
    except ValueError:
        state = None
    if not (
        isinstance(state, dict)
        and set(state) == {"since", "cursor", "handled"}
        and isinstance(state["since"], str)
        and (state["cursor"] is None or isinstance(state["cursor"], str))
        and isinstance(state["handled"], list)
        and all(isinstance(i, str) for i in state["handled"])
    ):
        raise Stop(f"{path} is not a state file of this script: restore it, or remove it and give --since")
    return state


def save_state(path: str, state: dict[str, Any]) -> None:
    """Replace the state file whole, so that a crash leaves the old state
    or the new one; an old one only repeats events."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, temporary = tempfile.mkstemp(dir=folder, prefix=".catch-up-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                json.dump(state, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
    except OSError as exc:
        raise Stop(f"cannot save the position in {path}: {exc}") from None


# --- the API ----------------------------------------------------------------------


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    # A redirect would carry the token to another address: it is an error.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def get_page(base: str, token: str, query: dict[str, str], limit: int) -> tuple[list[dict[str, Any]], str]:
    """One page of the listing: its events and the cursor after them.
    Retries an outage, waiting as long as the API's Retry-After asks."""
    url = f"{base}{LISTING}?{urllib.parse.urlencode(query)}"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    attempt = 0
    while True:
        attempt += 1
        try:
            with _OPENER.open(request, timeout=TIMEOUT_SECONDS) as answer:
                body = read(answer, limit * EVENT_BYTES + 64 * 1024)
            return page_of(body, limit, query.get("cursor"))
        except urllib.error.HTTPError as refusal:
            with refusal:
                wait, reason = refused(refusal, base)
        except (OSError, http.client.HTTPException) as exc:
            wait, reason = None, f"cannot reach {base}: {printable(str(getattr(exc, 'reason', exc)))}"
        if wait is None:
            wait = min(2.0**attempt, 30.0)
        elif wait > MAX_WAIT_SECONDS:
            raise Stop(f"{reason} and asks to wait {wait:.0f} s: run again after that")
        if attempt == TRIES:
            raise Stop(f"{reason}; gave up after {attempt} tries: run again later")
        print(f"catch_up: {reason}; trying again in {wait:g} s", file=sys.stderr)
        time.sleep(wait)


def refused(refusal: urllib.error.HTTPError, base: str) -> tuple[float | None, str]:
    """For an answer worth trying again, how long to wait (None: back off)
    and why; stops on any other."""
    status = refusal.code
    detail = problem(refusal)
    if status == 429 or status >= 500:
        return retry_after(refusal.headers.get("Retry-After")), f"the API is unavailable (HTTP {status})"
    if status == 401:
        raise Stop(
            "the tenant token was refused (HTTP 401): it has expired, was ended, or is no tenant token. "
            "Ask your platform for a new one and set HOOKLANE_TENANT_TOKEN to it"
        )
    if status == 403:
        raise Stop(f"the tenant token may not list events (HTTP 403): {detail}")
    if status == 404:
        raise Stop(f"{base}{LISTING} does not exist (HTTP 404): check HOOKLANE_URL")
    if 300 <= status < 400:
        location = printable(refusal.headers.get("Location") or "")
        raise Stop(
            f"the API redirects to {location!r} (HTTP {status}), which would carry the token there: "
            "set HOOKLANE_URL to the address to use"
        )
    raise Stop(f"the API refused the listing (HTTP {status}): {detail}")


def problem(refusal: urllib.error.HTTPError) -> str:
    """The words of the API's error answer, for people."""
    try:
        body = json.loads(refusal.read(64 * 1024))
    except (OSError, ValueError, http.client.HTTPException, RecursionError):
        return "no detail"
    if not isinstance(body, dict):
        return "no detail"
    field, detail = body.get("field"), body.get("detail")
    words = printable(str(detail)) if isinstance(detail, str) else "no detail"
    return f"{printable(field)} {words}" if isinstance(field, str) else words


def retry_after(value: str | None) -> float | None:
    """Seconds to wait by a Retry-After header; None when there is none
    that makes sense."""
    value = (value or "").strip()
    if value.isascii() and value.isdigit() and len(value) <= 9:
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, (when - datetime.now(UTC)).total_seconds())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def read(answer: http.client.HTTPResponse, most: int) -> bytes:
    """The answer's body, refusing one longer than ``most`` bytes or slower
    than ANSWER_SECONDS."""
    deadline = time.monotonic() + ANSWER_SECONDS
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = answer.read(64 * 1024)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > most:
            raise Stop(f"the API's answer is longer than {most} bytes: is HOOKLANE_URL Hooklane's API?")
        if time.monotonic() > deadline:
            raise Stop(f"the API's answer took longer than {ANSWER_SECONDS} s: run again later")
        chunks.append(chunk)


def page_of(body: bytes, limit: int, cursor: str | None) -> tuple[list[dict[str, Any]], str]:
    """The events and next cursor of a page, checked."""
    try:
        page = json.loads(body)
    except (ValueError, RecursionError):
        page = None
    if not isinstance(page, dict) or not isinstance(page.get("events"), list):
        raise Stop("the API's answer is not a page of events: is HOOKLANE_URL Hooklane's API?")
    events, after = page["events"], page.get("next_cursor")
    if not (isinstance(after, str) and 0 < len(after) <= 1024) or len(events) > limit:
        raise Stop("the API's page of events is malformed: run again later, or tell your platform")
    if events and after == cursor:
        raise Stop("the API's page of events did not move its cursor: tell your platform")
    for event in events:
        if not (
            isinstance(event, dict)
            and isinstance(event.get("id"), str)
            and event["id"]
            and isinstance(event.get("type"), str)
            and isinstance(event.get("created_at"), str)
            and "data" in event
        ):
            raise Stop("the API's page holds a malformed event: run again later, or tell your platform")
        try:
            delivered(event)
        except (ValueError, OverflowError):
            raise Stop(
                f"event {printable(event['id'])} has no valid created_at: tell your platform"
            ) from None
    return events, after


# --- the command line ------------------------------------------------------------


def printable(text: str) -> str:
    """``text`` safe to print: no control characters, at most 300 of them."""
    return "".join(c if c.isprintable() else "?" for c in text[:300])


def api_url(value: str | None, allow_http: bool) -> str:
    """HOOKLANE_URL, checked: https, or http to this machine only (the token
    would travel in the clear) unless allowed."""
    if not value:
        raise Stop("set HOOKLANE_URL to Hooklane's API, e.g. https://hooklane.example.com")
    try:
        url = urllib.parse.urlsplit(value)
        valid = bool(url.hostname) and url.port != 0 and not (url.query or url.fragment)
    except ValueError:  # a port out of range, a bracketed host that is no IPv6 address
        valid = False
    if not valid or url.scheme not in ("http", "https"):
        raise Stop(f"HOOKLANE_URL is not an http(s) address of Hooklane's API: {printable(value)!r}")
    if url.username is not None:
        raise Stop("HOOKLANE_URL must not hold credentials: the token is HOOKLANE_TENANT_TOKEN")
    if url.scheme == "http" and not (allow_http or _loopback(url.hostname or "")):
        raise Stop("HOOKLANE_URL is http: use https, or --allow-http on a network you trust")
    return value.rstrip("/")


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tenant_token(value: str | None) -> str:
    if not value:
        raise Stop("set HOOKLANE_TENANT_TOKEN to the tenant token your platform gives you")
    if len(value) > 1024 or not all("!" <= c <= "~" for c in value):
        raise Stop("HOOKLANE_TENANT_TOKEN is not a token: it holds spaces or characters no token has")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Catch up on the events a webhook receiver missed.")
    parser.add_argument("--state", required=True, help="the file that keeps the position between runs")
    parser.add_argument("--since", help="where the first run starts: an RFC 3339 time")
    parser.add_argument("--limit", type=int, default=LIMIT, help=f"events a page, 1 to 1000 ({LIMIT})")
    parser.add_argument("--allow-http", action="store_true", help="allow an http HOOKLANE_URL elsewhere")
    args = parser.parse_args(argv)
    if not 1 <= args.limit <= 1000:
        parser.error("--limit must be 1 to 1000")
    try:
        base = api_url(os.environ.get("HOOKLANE_URL"), args.allow_http)
        token = tenant_token(os.environ.get("HOOKLANE_TENANT_TOKEN"))
        count = catch_up(base, token, args.state, args.since, args.limit, handle)
    except Stop as stop:
        print(f"catch_up: {stop}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("catch_up: interrupted; the next run continues from the saved position", file=sys.stderr)
        return 130
    print(f"catch_up: caught up, {count} events handled; the position is in {args.state}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
