"""The API's tokens (hooklane/api/tokens.py). The check that runs before any
body is read or any database is touched (hooklane/api/auth.py) is
tests/db/test_api_auth.py's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hooklane.api.auth import token_sources
from hooklane.api.tokens import TokenSource, bearer
from hooklane.errors import InvalidInput
from hooklane.settings import Settings
from hooklane.tokens import Grant, Tokens
from testsupport.api_auth import ADMIN, LIMITED, TOKEN

# --------------------------------------------------------------------------
# Tokens: parsing, checking, grants


def test_parse_reads_tokens_grants_and_comments() -> None:
    tokens = Tokens.parse(
        f"# producers\n{TOKEN}\n\n  # scoped\n{LIMITED}   tenants=acme,globex\r\n", "HOOKLANE_API_TOKENS"
    )
    assert len(tokens) == 2
    assert tokens.check(TOKEN) == Grant(None)
    assert tokens.check(LIMITED) == Grant(frozenset({"acme", "globex"}))
    assert tokens.check("not-a-valid-token-at-all") is None
    assert tokens.check(TOKEN[:-1]) is None
    assert tokens.check("") is None


def test_grants_limit_tenants() -> None:
    assert Grant(None).allows("anyone")
    limited = Grant(frozenset({"acme"}))
    assert limited.allows("acme")
    assert not limited.allows("globex")


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("short", 1),
        (f"{TOKEN}\né-é-é-é-é-é-é-é-é-é-é-é", 2),
        (f"{TOKEN}\n{LIMITED} tenants=acme,\x01bad", 2),
    ],
)
def test_parse_refuses_bad_entries_without_quoting_the_token(text: str, line: int) -> None:
    with pytest.raises(InvalidInput) as refused:
        Tokens.parse(text, "HOOKLANE_API_TOKENS")
    assert refused.value.field == "HOOKLANE_API_TOKENS"
    assert refused.value.message.startswith(f"line {line}: ")
    for secret in (TOKEN, LIMITED, "short"):
        assert secret not in str(refused.value)


def test_repr_never_shows_a_token() -> None:
    assert TOKEN not in repr(Tokens.parse(TOKEN, "x"))


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (f"Bearer {TOKEN}", TOKEN),
        (f"bearer   {TOKEN}  ", TOKEN),
        (f"Basic {TOKEN}", None),
        ("Bearer", None),
        ("Bearer ", None),
        (None, None),
    ],
)
def test_bearer(header: str | None, token: str | None) -> None:
    assert bearer(header) == token


def test_a_token_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"{TOKEN}\n")
    source = TokenSource(Tokens.parse(ADMIN, "inline"), str(path), "HOOKLANE_API_TOKENS_FILE")
    assert source.current().check(TOKEN) is not None
    assert source.current().check(ADMIN) is not None

    # A rotation: the Secret's file is replaced by one with the new token.
    replacement = tmp_path / "tokens.new"
    replacement.write_text(f"{LIMITED} tenants=acme\n")
    os.replace(replacement, path)
    assert source.current().check(TOKEN) is None
    assert source.current().check(LIMITED) == Grant(frozenset({"acme"}))
    # The inline tokens stay.
    assert source.current().check(ADMIN) is not None


def test_a_token_file_turning_bad_keeps_the_tokens_read_before(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"{TOKEN}\n")
    source = TokenSource(Tokens(), str(path), "HOOKLANE_API_TOKENS_FILE")
    path.write_text("too short\n")
    assert source.current().check(TOKEN) is not None
    path.unlink()
    assert source.current().check(TOKEN) is not None
    path.write_text(f"{LIMITED}\n")
    assert source.current().check(LIMITED) is not None
    assert source.current().check(TOKEN) is None


def test_a_token_file_unreadable_at_start_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput) as refused:
        TokenSource(Tokens(), str(tmp_path / "missing"), "HOOKLANE_API_TOKENS_FILE")
    assert refused.value.field == "HOOKLANE_API_TOKENS_FILE"


def test_the_api_needs_an_ingest_token() -> None:
    with pytest.raises(InvalidInput) as refused:
        token_sources(Settings(database_url="postgresql://x/y"))
    assert refused.value.field == "HOOKLANE_API_TOKENS"
    ingest, admin = token_sources(
        Settings(database_url="postgresql://x/y", api_tokens=Tokens.parse(TOKEN, "t"))
    )
    assert ingest.configured and not admin.configured


# --------------------------------------------------------------------------
# Over HTTP, with the database out of reach: a refusal needs neither the
# body nor a database round trip (a request that got past the check would
# be answered 503 here).
