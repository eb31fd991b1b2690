"""One error vocabulary at the store boundary: which driver errors are
transient. That the store's connections raise Hooklane's types only is
tests/db/test_errors.py's."""

from __future__ import annotations

import asyncpg
import kopf
import pytest

from hooklane.errors import (
    DatabaseUnreachable,
    DataRefused,
    InvalidInput,
    SchemaMissing,
    StoreError,
    TransientStoreError,
)
from hooklane.operator.handlers import RETRY_DELAY_SECONDS, kopf_error
from hooklane.store.connection import store_error
from testsupport.errors import exc


@pytest.mark.parametrize(
    ("driver", "kind"),
    [
        (exc.CheckViolationError("new row violates check constraint"), StoreError),
        (exc.UniqueViolationError("duplicate key value"), StoreError),
        # a data exception (SQLSTATE class 22): the caller's value, never an outage
        (exc.DivisionByZeroError("division by zero"), DataRefused),
        (exc.DatetimeFieldOverflowError("date/time field value out of range"), DataRefused),
        (exc.CharacterNotInRepertoireError('invalid byte sequence for encoding "UTF8": 0x00'), DataRefused),
        (exc.DataError("invalid input syntax"), DataRefused),
        # refused by asyncpg before sending: an InterfaceError, but no lost connection
        (exc._base.DataError("invalid input for query argument $1: (date value out of range)"), DataRefused),
        (exc.DeadlockDetectedError("deadlock detected"), TransientStoreError),
        (exc.SerializationError("could not serialize access"), TransientStoreError),
        (exc.LockNotAvailableError("canceling statement due to lock timeout"), TransientStoreError),
        (exc.UndefinedTableError('relation "endpoints" does not exist'), SchemaMissing),
        (exc.ConnectionDoesNotExistError("connection was closed"), DatabaseUnreachable),
        (exc.AdminShutdownError("terminating connection"), DatabaseUnreachable),
        (exc.InternalClientError("cannot switch to state 15"), DatabaseUnreachable),
        (asyncpg.InterfaceError("the pool is closing"), DatabaseUnreachable),
        (ConnectionRefusedError(111, "Connection refused"), DatabaseUnreachable),
        (TimeoutError(), DatabaseUnreachable),
    ],
)
def test_driver_errors_become_one_kind_each(driver, kind):
    error = store_error(driver)
    assert type(error) is kind
    assert error.transient == issubclass(kind, TransientStoreError)
    assert str(error) == (str(driver) or type(driver).__name__)


def test_postgres_errors_keep_their_sqlstate():
    assert store_error(exc.CheckViolationError("x")).sqlstate == "23514"
    assert store_error(exc.DeadlockDetectedError("x")).sqlstate == "40P01"
    assert store_error(OSError("x")).sqlstate is None


def test_any_failure_to_connect_is_unreachable():
    for driver in (
        exc.InvalidPasswordError("password authentication failed"),
        exc.InvalidCatalogNameError("x"),
    ):
        assert store_error(driver) is not None and not store_error(driver).transient
        assert type(store_error(driver, connecting=True)) is DatabaseUnreachable


def test_other_errors_are_not_the_stores():
    for other in (ValueError("x"), RuntimeError("x"), InvalidInput("id", "x"), DatabaseUnreachable("x")):
        assert store_error(other) is None


def test_error_text_from_the_server_cannot_move_a_cursor():
    assert str(store_error(exc.CheckViolationError("bad \x1b[2J row"))) == "bad \\x1b[2J row"


def test_the_operator_retries_transient_errors_only():
    retried = kopf_error(DatabaseUnreachable("connection refused"))
    assert isinstance(retried, kopf.TemporaryError) and retried.delay == RETRY_DELAY_SECONDS
    assert isinstance(kopf_error(TransientStoreError("deadlock detected", "40P01")), kopf.TemporaryError)
    assert isinstance(kopf_error(SchemaMissing("no table")), kopf.TemporaryError)
    refused = kopf_error(StoreError("new row violates check constraint", "23514"))
    assert isinstance(refused, kopf.PermanentError) and "violates check constraint" in str(refused)


# --- real Postgres ------------------------------------------------------------
