"""Token lists that could be read two ways are refused, never misread
(issue 18): a comma used to separate entries, so `TOKEN acme,globex-eu`
made `globex-eu` a token valid for every tenant. One entry per line,
`TOKEN` or `TOKEN tenants=t1,t2`, and nothing else. ``hooklane api``
refusing to start on one: tests/processes/test_api_tokens.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hooklane.api.tokens import TokenSource
from hooklane.errors import InvalidInput
from hooklane.settings import Settings
from hooklane.tokens import Grant, Tokens
from testsupport.api_tokens import OTHER, TENANT_LIKE_A_TOKEN, TOKEN

SHAPE = "an entry is `TOKEN` (any tenant) or `TOKEN tenants=t1,t2` (those tenants only), one per line"


@pytest.mark.parametrize(
    ("text", "grants"),
    [
        (TOKEN, {TOKEN: Grant(None)}),
        (f"{TOKEN} tenants=acme", {TOKEN: Grant(frozenset({"acme"}))}),
        (
            f"{TOKEN} tenants=acme,{TENANT_LIKE_A_TOKEN}",
            {TOKEN: Grant(frozenset({"acme", TENANT_LIKE_A_TOKEN})), TENANT_LIKE_A_TOKEN: None},
        ),
        (
            f"# producers\n\n  {TOKEN}\t tenants=acme \r\n{OTHER}\n",
            {TOKEN: Grant(frozenset({"acme"})), OTHER: Grant(None)},
        ),
        # The same token twice with the same grant is harmless.
        (f"{TOKEN} tenants=b,a\n{TOKEN} tenants=a,b", {TOKEN: Grant(frozenset({"a", "b"}))}),
    ],
    ids=["any tenant", "one tenant", "a tenant like a token", "comments, spaces, CRLF", "same twice"],
)
def test_the_syntax_grants_what_it_says(text: str, grants: dict[str, Grant | None]) -> None:
    tokens = Tokens.parse(text, "HOOKLANE_API_TOKENS")
    for token, grant in grants.items():
        assert tokens.check(token) == grant


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        # The issue: tenants written comma-separated, the way HOOKLANE_ALLOWED_NETWORKS is.
        (f"{TOKEN} acme,{TENANT_LIKE_A_TOKEN}", 1, "only `tenants=t1,t2` may follow a token"),
        # The former syntax: tenants separated by spaces...
        (f"{TOKEN} acme {TENANT_LIKE_A_TOKEN}", 1, "only `tenants=t1,t2` may follow a token"),
        (f"{TOKEN} acme", 1, "only `tenants=t1,t2` may follow a token"),
        # ...and entries by commas, with or without spaces around them.
        (f"{TOKEN},{OTHER}", 1, "a comma cannot be part of a token"),
        (f"{TOKEN}, {OTHER}", 1, "a comma cannot be part of a token"),
        (f"{OTHER}\n{TOKEN} ,{TENANT_LIKE_A_TOKEN}", 2, "only `tenants=t1,t2` may follow a token"),
        (f"{TOKEN},", 1, "a comma cannot be part of a token"),
        (f",{TOKEN}", 1, "a comma cannot be part of a token"),
        # tenants= itself, spelt wrong or empty.
        (f"{TOKEN} tenants=", 1, "`tenants=` is empty"),
        (f"{TOKEN} tenants=acme,", 1, "tenant 2 of `tenants=` is empty"),
        (f"{TOKEN} tenants=,acme", 1, "tenant 1 of `tenants=` is empty"),
        (f"{TOKEN} tenants=acme,,globex", 1, "tenant 2 of `tenants=` is empty"),
        (f"{TOKEN} tenants= acme", 1, "only `tenants=t1,t2` may follow a token"),
        (f"{TOKEN} tenants=acme tenants=globex", 1, "only `tenants=t1,t2` may follow a token"),
        (f"{TOKEN} tenants=acme, globex", 1, "only `tenants=t1,t2` may follow a token"),
        (f"{TOKEN} tenant=acme", 1, "only `tenants=t1,t2` may follow a token"),
        (f"{TOKEN} TENANTS=acme", 1, "only `tenants=t1,t2` may follow a token"),
        (f"{TOKEN} # a comment after a token", 1, "only `tenants=t1,t2` may follow a token"),
        (f"{TOKEN} tenants=acme,{'x' * 254}", 1, "tenant 2 of `tenants=` is not a tenant name"),
        (f"{TOKEN} tenants=ac\x01me", 1, "tenant 1 of `tenants=` is not a tenant name"),
        # One token, two grants: which one holds would not show.
        (f"{TOKEN}\n{OTHER}\n{TOKEN} tenants=acme", 3, "the same token as line 1 with other tenants"),
        (f"{TOKEN} tenants=acme\n{TOKEN} tenants=globex", 2, "the same token as line 1 with other tenants"),
        # The token itself.
        ("short-token", 1, "a token is 16 to 512 of the characters"),
        (f"{TOKEN}é", 1, "a token is 16 to 512 of the characters"),
    ],
)
def test_what_could_be_misread_is_refused_with_the_line_and_the_fix(text: str, line: int, words: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        Tokens.parse(text, "HOOKLANE_API_TOKENS")
    assert refused.value.field == "HOOKLANE_API_TOKENS"
    assert refused.value.message.startswith(f"line {line}: {words}"), refused.value.message
    # No word of the line is quoted: any of them may be a token.
    for word in (TOKEN, OTHER, TENANT_LIKE_A_TOKEN, "acme", "globex", "short-token"):
        assert word not in str(refused.value)


def test_a_refusal_of_the_former_syntax_says_what_to_write() -> None:
    with pytest.raises(InvalidInput) as refused:
        Tokens.parse(f"{TOKEN} acme globex", "HOOKLANE_API_TOKENS")
    assert SHAPE in refused.value.message
    assert "write `T1,T2` as two lines and `TOKEN t1 t2` as `TOKEN tenants=t1,t2`" in refused.value.message


def test_an_admin_token_takes_no_tenants() -> None:
    """An admin token acts for every tenant: `tenants=` would be a limit
    that is none."""
    with pytest.raises(InvalidInput) as refused:
        Settings.from_env({"HOOKLANE_ADMIN_TOKENS": f"{TOKEN} tenants=acme"})
    assert refused.value.field == "HOOKLANE_ADMIN_TOKENS"
    assert "line 1: an admin token acts for every tenant" in refused.value.message
    assert len(Settings.from_env({"HOOKLANE_ADMIN_TOKENS": f"{TOKEN}\n{OTHER}"}).admin_tokens) == 2


@pytest.mark.parametrize(
    "variable", ["HOOKLANE_API_TOKENS", "HOOKLANE_ADMIN_TOKENS"], ids=["ingest", "admin"]
)
def test_the_variables_are_read_one_entry_per_line(variable: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        Settings.from_env({variable: f"{TOKEN},{OTHER}"})
    assert refused.value.field == variable
    assert refused.value.message.startswith("line 1: a comma cannot be part of a token")


def _admin_file_source(path: Path) -> TokenSource:
    settings = Settings.from_env({"HOOKLANE_ADMIN_TOKENS_FILE": str(path)})
    return TokenSource(settings.admin_tokens, settings.admin_tokens_file, "HOOKLANE_ADMIN_TOKENS_FILE")


def test_files_are_held_to_the_same_rules(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"# rotated 2026-03-01\n{OTHER}\n{TOKEN} acme,{TENANT_LIKE_A_TOKEN}\n")
    with pytest.raises(InvalidInput) as refused:
        TokenSource(Tokens(), str(path), "HOOKLANE_API_TOKENS_FILE")
    assert refused.value.field == "HOOKLANE_API_TOKENS_FILE"
    assert refused.value.message.startswith("line 3: only `tenants=t1,t2` may follow a token")

    # An admin token file takes no tenants either.
    path.write_text(f"{TOKEN} tenants=acme\n")
    with pytest.raises(InvalidInput) as refused:
        _admin_file_source(path)
    assert refused.value.message.startswith("line 1: an admin token acts for every tenant")


def test_a_token_in_the_variable_and_the_file_with_other_grants_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"{OTHER}\n{TOKEN} tenants=acme\n")
    inline = Tokens.parse(TOKEN, "HOOKLANE_API_TOKENS")
    with pytest.raises(InvalidInput) as refused:
        TokenSource(inline, str(path), "HOOKLANE_API_TOKENS_FILE")
    assert refused.value.field == "HOOKLANE_API_TOKENS_FILE"
    assert refused.value.message == (
        "line 2: the same token as HOOKLANE_API_TOKENS line 1 with other tenants: give each token once"
    )
    path.write_text(f"{OTHER}\n{TOKEN}\n")
    assert TokenSource(inline, str(path), "HOOKLANE_API_TOKENS_FILE").current().check(TOKEN) == Grant(None)


def test_a_misread_rotation_keeps_the_tokens_read_before(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"{TOKEN} tenants=acme\n")
    source = TokenSource(Tokens(), str(path), "HOOKLANE_API_TOKENS_FILE")
    replacement = tmp_path / "tokens.new"
    replacement.write_text(f"{TOKEN} acme,{TENANT_LIKE_A_TOKEN}\n")
    os.replace(replacement, path)
    assert source.current().check(TOKEN) == Grant(frozenset({"acme"}))
    assert source.current().check(TENANT_LIKE_A_TOKEN) is None
    (record,) = [r for r in caplog.records if "keeping the tokens read before" in r.getMessage()]
    assert "HOOKLANE_API_TOKENS_FILE: line 1: only `tenants=t1,t2`" in record.getMessage()
    assert TOKEN not in record.getMessage() and TENANT_LIKE_A_TOKEN not in record.getMessage()
