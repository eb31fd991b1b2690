"""The API's error answers: one mapping from errors to answers, and one JSON
shape for every refusal.

``{"error": code, "detail": words, "field": name}``: ``code`` is stable
for programs, ``detail`` is for people, ``field`` names the input at fault
when there is one. :func:`classify` decides what an error means for the
caller (a :class:`Problem`); the JSON routes answer it with
:func:`json_problem`, the dashboard's pages render the same problem in
HTML (:func:`answers_in` names a page's renderer).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import web

from hooklane.errors import DataRefused, InvalidInput, StoreError, TransientStoreError

# How long a refused request is told to wait: the database is usually back
# within seconds (a restart, a failover), and producers retry anyway.
RETRY_AFTER_SECONDS = 2
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class Refused(Exception):
    """A request refused with ``status`` before it reached the database."""

    def __init__(self, status: int, code: str, detail: str, field: str | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.field = field


@dataclass(frozen=True)
class Problem:
    """What the caller is told: ``status``, the stable ``code``, the words,
    the field at fault; ``retry_after`` for a 503. ``log_level`` and
    ``log_text`` say what the API's log says of it (None: the caller's
    mistake, not the operator's concern)."""

    status: int
    code: str
    detail: str
    field: str | None = None
    retry_after: int | None = None
    log_level: int | None = None
    log_text: str = ""


def classify(exc: BaseException, method: str, ingest: bool) -> Problem | None:
    """The answer for ``exc`` raised by a handler of a ``method`` request
    (an ``ingest`` one: events, which a retry may publish again); None for
    an error that is a bug, left to aiohttp's 500.

    A data exception is the caller's value at fault (422), never an outage;
    an outage is 503 with ``Retry-After``, worded for what may have
    happened: a write whose answer did not come may have been made."""
    if isinstance(exc, Refused):
        return Problem(exc.status, exc.code, exc.detail, exc.field)
    if isinstance(exc, InvalidInput):
        return Problem(422, "invalid", exc.message, exc.field)
    if isinstance(exc, DataRefused):
        return Problem(
            422,
            "invalid",
            f"the database refused a value of this request: {exc}",
            log_level=logging.WARNING,
            log_text=f"the database refused a value: {exc}",
        )
    # The group committer raises a StoreError only for a transaction that
    # stored nothing (an unknown outcome is answered by ingest itself, with
    # the ids); a timeout, the middleware's backstop, is an unknown outcome.
    stored_nothing = ingest and isinstance(exc, StoreError)
    if isinstance(exc, TransientStoreError | TimeoutError):
        return unavailable(
            method, ingest, logging.WARNING, f"database unavailable: {exc or 'timed out'}", stored_nothing
        )
    if isinstance(exc, StoreError):
        return unavailable(method, ingest, logging.ERROR, f"the database refused: {exc}", stored_nothing)
    return None


def unavailable(
    method: str, ingest: bool, log_level: int, log_text: str, stored_nothing: bool = False
) -> Problem:
    """The 503 of a request the database did not answer. Unless it is known
    that nothing was stored, the API cannot know whether a write was made
    when it gave up waiting: it never says that nothing was, and says what
    repeats safely."""
    if method in _SAFE_METHODS:
        outcome = "try again"
    elif stored_nothing:
        outcome = "nothing was stored, try again"
    elif ingest:
        outcome = (
            "the events may or may not have been stored: publish them again with the same ids, "
            "which stores each one once"
        )
    else:
        outcome = "the change may or may not have been made: repeating the request is safe"
    return Problem(
        503,
        "unavailable",
        f"the database cannot be reached or did not answer in time; {outcome}",
        retry_after=RETRY_AFTER_SECONDS,
        log_level=log_level,
        log_text=log_text,
    )


def problem(
    status: int,
    code: str,
    detail: str,
    field: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    body: dict[str, str] = {"error": code, "detail": detail}
    if field is not None:
        body["field"] = field
    return web.json_response(body, status=status, headers=headers)


def json_problem(_request: web.Request, found: Problem) -> web.Response:
    headers = {} if found.retry_after is None else {"Retry-After": str(found.retry_after)}
    return problem(found.status, found.code, found.detail, found.field, headers)


Render = Callable[[web.Request, Problem], web.Response]
H = TypeVar("H")
_RENDER = "render_problem"


def answers_in(render: Render) -> Callable[[H], H]:
    """Mark a handler whose problems ``render`` answers (HTML pages) rather
    than :func:`json_problem`."""

    def mark(handler: H) -> H:
        setattr(handler, _RENDER, render)
        return handler

    return mark


def renderer(request: web.Request) -> Render:
    render: Render = getattr(request.match_info.handler, _RENDER, json_problem)
    return render
