"""Token lists: what each token may do, and checking one.

A token list is text, in a setting or a file alike: one entry per line,
either ``TOKEN`` (any tenant) or ``TOKEN tenants=t1,t2`` (those tenants
only); a line whose first character (after spaces) is ``#`` is a comment.
Nothing else is taken: a line that could be read two ways (the comma that
used to separate entries, tenants separated by spaces) is refused at start
with its line number and the fix, because a misread entry can turn a
tenant's name into a token valid for every tenant. Several tokens may be
valid at once, which is how they are rotated: add the new one, move the
producers, remove the old one.

A presented token is compared with every configured one, each by the
SHA-256 of both in constant time, so that neither a token's characters nor
its length nor its position in the list shows in the answer's timing.

The settings read token lists, and the HTTP API checks by them
(hooklane/api/tokens.py reads the token files and the header).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, field

from hooklane.errors import InvalidInput
from hooklane.spec import check_tenant

# RFC 6750's b64token characters; 16 at least, so that a token is never a
# guessable word.
_TOKEN = re.compile(r"[A-Za-z0-9._~+/=-]{16,512}")
_TENANTS = "tenants="
# What every refusal of a line's shape ends with: the whole syntax, and what
# an entry of the former syntax becomes in it. No refusal quotes a word
# of the line: any of them may be a token.
_SYNTAX = (
    "an entry is `TOKEN` (any tenant) or `TOKEN tenants=t1,t2` (those tenants only), one per line;"
    " a comma no longer separates entries and a space no longer separates tenants:"
    " write `T1,T2` as two lines and `TOKEN t1 t2` as `TOKEN tenants=t1,t2`"
)


@dataclass(frozen=True)
class Grant:
    """What a valid token allows: publishing for ``tenants``, or for any
    tenant when None."""

    tenants: frozenset[str] | None = None

    def allows(self, tenant: str) -> bool:
        return self.tenants is None or tenant in self.tenants


@dataclass(frozen=True)
class _Entry:
    digest: bytes
    grant: Grant
    # "HOOKLANE_API_TOKENS line 3": where a conflicting duplicate is.
    where: str


@dataclass(frozen=True)
class Tokens:
    """A set of valid tokens. Its repr never shows one.

    ``tenants_allowed`` is False for admin tokens, which act for every
    tenant: a ``tenants=`` there would look like a limit that is none, and
    is refused; a file read for this list is held to the same rule."""

    entries: tuple[_Entry, ...] = field(default=(), repr=False)
    tenants_allowed: bool = True

    def __len__(self) -> int:
        return len(self.entries)

    def __add__(self, other: Tokens) -> Tokens:
        """Both lists; ``InvalidInput`` when a token is in both with other
        grants, since which of them holds would not show."""
        mine = {entry.digest: entry for entry in self.entries}
        for entry in other.entries:
            before = mine.get(entry.digest)
            if before is not None and before.grant != entry.grant:
                source, _, line = entry.where.partition(" ")
                raise InvalidInput(
                    source,
                    f"{line}: the same token as {before.where} with other tenants: give each token once",
                )
        return Tokens(self.entries + other.entries, self.tenants_allowed and other.tenants_allowed)

    @classmethod
    def parse(cls, text: str, source: str, *, tenants_allowed: bool = True) -> Tokens:
        """Read a token list; ``InvalidInput`` names ``source`` and the
        line, never the token."""
        entries: dict[bytes, _Entry] = {}
        for number, line in enumerate(text.split("\n"), start=1):
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            try:
                token, grant = _entry(words, tenants_allowed)
            except ValueError as exc:
                raise InvalidInput(source, f"line {number}: {exc}") from None
            entry = _Entry(_digest(token), grant, f"{source} line {number}")
            before = entries.setdefault(entry.digest, entry)
            if before.grant != grant:
                raise InvalidInput(
                    source,
                    f"line {number}: the same token as {before.where.removeprefix(source + ' ')}"
                    " with other tenants: give each token once",
                )
        return cls(tuple(entries.values()), tenants_allowed)

    def check(self, token: str) -> Grant | None:
        """The grant of ``token``, None when it is not valid."""
        presented = _digest(token)
        found = None
        for entry in self.entries:
            # Every entry is compared: stopping at a match would tell how far down the list it is.
            if hmac.compare_digest(entry.digest, presented):
                found = entry.grant
        return found


def _entry(words: list[str], tenants_allowed: bool) -> tuple[str, Grant]:
    """The token and grant of one line's words; ValueError says what is
    wrong without quoting a word."""
    token, rest = words[0], words[1:]
    if "," in token:
        raise ValueError(f"a comma cannot be part of a token; {_SYNTAX}")
    if not _TOKEN.fullmatch(token):
        raise ValueError("a token is 16 to 512 of the characters A-Z a-z 0-9 . _ ~ + / = -")
    if not rest:
        return token, Grant(None)
    if len(rest) > 1 or not rest[0].startswith(_TENANTS):
        raise ValueError(f"only `tenants=t1,t2` may follow a token, once; {_SYNTAX}")
    if not tenants_allowed:
        raise ValueError("an admin token acts for every tenant: give it alone, without `tenants=`")
    return token, Grant(frozenset(_tenants(rest[0].removeprefix(_TENANTS))))


def _tenants(listed: str) -> list[str]:
    if not listed:
        raise ValueError(
            "`tenants=` is empty: name at least one tenant, or give the token alone for every tenant"
        )
    tenants = listed.split(",")
    for position, tenant in enumerate(tenants, start=1):
        if not tenant:
            raise ValueError(f"tenant {position} of `tenants=` is empty: two commas, or one at an end")
        try:
            check_tenant(tenant, "tenant")
        except InvalidInput:
            # Not the check's own message, which quotes the value: a word of
            # a line that went wrong may be a token.
            raise ValueError(
                f"tenant {position} of `tenants=` is not a tenant name (1 to 253 characters, no control characters)"
            ) from None
    return tenants


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
