"""The errors Hooklane raises at its boundaries."""

from __future__ import annotations

import reprlib
from typing import Any


class HooklaneError(Exception):
    """Base of every error Hooklane raises on purpose."""


class InvalidInput(HooklaneError, ValueError):
    """Input refused before anything was stored. ``field`` names the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class StoreError(HooklaneError):
    """Postgres refused a store call, or the call did not reach it.

    Raised in place of the driver's errors, which the store translates where
    it talks to asyncpg (:mod:`hooklane.store.connection`). A plain
    ``StoreError`` is an answer: the same call gets the same refusal (a
    constraint violation, a statement at fault), so retrying cannot help.
    ``sqlstate`` is Postgres' error code, when it answered."""

    transient = False

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class DataRefused(StoreError):
    """Postgres (or the driver, before sending) refused a value of the call:
    a data exception (SQLSTATE class 22), such as a time out of range or a
    NUL in a text. The caller's input is at fault, not the database: the
    HTTP API answers 422 and the CLI exits 2, never "try again"."""


class TransientStoreError(StoreError):
    """A store call that may succeed if made again: Postgres aborted the
    statement (deadlock, serialization failure, lock timeout) or could not be
    reached."""

    transient = True


class OutcomeUnknown(TransientStoreError):
    """A COMMIT was sent and its answer did not come back (in time, or at
    all): the transaction may or may not have committed. Retrying with the
    same event ids is safe, as an id is stored once."""


class DatabaseUnreachable(TransientStoreError):
    """No connection to Hooklane's database could be made, or it was lost."""


class SchemaMissing(TransientStoreError):
    """The database has no Hooklane schema yet: ``hooklane migrate`` has not
    run. Transient, because the worker and the operator may start before the
    migration does, and wait for it."""


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 60
_SHORT.maxlevel = 2


def shown(value: Any) -> str:
    """A refused value as a message may quote it: short, and with control
    characters escaped, whatever its size, depth or type."""
    try:
        return _SHORT.repr(value)
    except ValueError:
        # repr() refuses integers of more than 4300 digits.
        return f"a {type(value).__name__} too large to print"


def printable(text: str) -> str:
    """``text`` with every non-printable character escaped as repr() would,
    so that what reaches a terminal cannot move its cursor or recolour it."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class CatalogueRefused(InvalidInput):
    """The event catalogue's check at publish refused the event
    (docs/catalogue.md): its type is not in the catalogue or is archived
    (``field`` 'type'), or its data matches no version of the type's
    schema (``field`` 'data', the message naming the path inside the data
    and the schema's rule). Nothing of it was stored, and the caller's
    transaction is still usable."""

    @property
    def reason(self) -> str:
        """The refusal's reason as table catalogue_refusals records it:
        'schema', 'archived' or 'unknown' (the function's wording of each,
        migration 0024)."""
        if self.field == "data":
            return "schema"
        return "archived" if " is archived in the event catalogue" in self.message else "unknown"


class EventConflict(InvalidInput):
    """An event id the tenant already published, with different content.
    Nothing was stored, and the caller's transaction is still usable."""

    def __init__(self, event_id: str, tenant: str) -> None:
        super().__init__(
            "id",
            f"{shown(event_id)} was already published by tenant {shown(tenant)} with different "
            "content (type, data, coalesce_key or ordering_key); an id names one event",
        )
        self.event_id = event_id
        self.tenant = tenant
