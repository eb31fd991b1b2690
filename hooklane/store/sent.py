"""What a delivery's request carried, rebuilt from what is stored for the
delivery pages: the body byte for byte as the worker sends it, and what
its headers were made of."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

from hooklane.delivery import RequestTerms
from hooklane.errors import InvalidInput
from hooklane.secrets import Keyring, terms_owner, unseal
from hooklane.signing import event_body
from hooklane.store.queries import QUERIES


@dataclass(frozen=True)
class SentRequest:
    """A delivery's request as its latest attempt sent it, or as its next
    will: ``body``, and of the headers what may be shown. ``extra_headers``:
    the endpoint's own, each with its value, or None for a value that may
    be a credential, which never leaves this module (None for them all:
    its terms cannot be opened with the keys at hand). ``last_started_at``
    and ``last_trace_id``: of the latest attempt that carried this event
    (None: none yet)."""

    event_id: str
    traceparent: str | None
    extra_headers: tuple[tuple[str, str | None], ...] | None
    last_started_at: datetime | None
    last_trace_id: str | None
    body: bytes
    # An ordered delivery's key and number (None: unordered).
    ordering: tuple[str, int] | None = None


async def delivery_payload(
    conn: asyncpg.Connection,
    delivery_id: int,
    endpoint: tuple[str, str] | None,
    keyring: Keyring | None,
) -> SentRequest | None:
    """What delivery ``delivery_id`` sends; None if there is none (or, with
    ``endpoint`` (namespace, name), none of that endpoint's). A coalesced
    delivery carries its latest event, as its next attempt will."""
    namespace, name = endpoint if endpoint is not None else (None, None)
    row = await conn.fetchrow(*QUERIES["delivery_payload"](id=delivery_id, namespace=namespace, name=name))
    if row is None:
        return None
    return SentRequest(
        row["event_id"],
        row["traceparent"],
        _extra_headers(row["request_terms"], row["namespace"], row["name"], keyring),
        row["last_started_at"],
        row["last_trace_id"],
        event_body(row["event_id"], row["type"], row["created_at"], row["data"]),
        None if row["ordering_key"] is None else (row["ordering_key"], row["ordering_seq"]),
    )


# Credentials whatever their source: a manifest may write one as a value.
_CREDENTIALS = frozenset({"authorization", "proxy-authorization", "cookie"})


def _extra_headers(
    sealed: str | None, namespace: str, name: str, keyring: Keyring | None
) -> tuple[tuple[str, str | None], ...] | None:
    """The endpoint's own headers, without the values read from a Secret
    (all of them for terms stored before that was kept) or naming a
    credential."""
    if sealed is None:
        return ()
    try:
        terms = RequestTerms.from_json(unseal(keyring, sealed, terms_owner(namespace, name)))
    except InvalidInput:
        return None
    secret = terms.secret_headers
    return tuple(
        (header, None if secret is None or header in secret or header.lower() in _CREDENTIALS else value)
        for header, value in terms.headers
    )
