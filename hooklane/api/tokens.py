"""Bearer tokens of the HTTP API: what each may do, and checking one.

A token list is text: entries separated by commas or new lines (a file
holds one per line), each a token optionally followed by the tenants it may
publish for, separated by spaces; ``#`` starts a comment line in a file.
Several tokens may be valid at once, which is how they are rotated: add the
new one, move the producers, remove the old one.

A presented token is compared with every configured one, each by the
SHA-256 of both in constant time, so that neither a token's characters nor
its length nor its position in the list shows in the answer's timing.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
from dataclasses import dataclass, field

from hooklane.errors import InvalidInput, shown
from hooklane.manifest import check_tenant

logger = logging.getLogger(__name__)

# RFC 6750's b64token characters; 16 at least, so that a token is never a
# guessable word.
_TOKEN = re.compile(r"[A-Za-z0-9._~+/=-]{16,512}")
# A token file is a handful of lines; the limit only bounds a wrong path.
MAX_TOKEN_FILE_BYTES = 256 * 1024


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


@dataclass(frozen=True)
class Tokens:
    """A set of valid tokens. Its repr never shows one."""

    entries: tuple[_Entry, ...] = field(default=(), repr=False)

    def __len__(self) -> int:
        return len(self.entries)

    def __add__(self, other: Tokens) -> Tokens:
        return Tokens(self.entries + other.entries)

    @classmethod
    def parse(cls, text: str, source: str) -> Tokens:
        """Read a token list; ``InvalidInput`` names ``source`` and the
        entry's position, never the token."""
        entries = []
        for position, line in enumerate(re.split(r"[,\n]", text), start=1):
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            token, tenants = words[0], words[1:]
            if not _TOKEN.fullmatch(token):
                raise InvalidInput(
                    source,
                    f"entry {position}: a token is 16 to 512 of the characters A-Z a-z 0-9 . _ ~ + / = -",
                )
            for tenant in tenants:
                try:
                    check_tenant(tenant, "tenant")
                except InvalidInput as exc:
                    raise InvalidInput(
                        source, f"entry {position}: tenant {shown(tenant)} {exc.message}"
                    ) from None
            entries.append(_Entry(_digest(token), Grant(frozenset(tenants) if tenants else None)))
        return cls(tuple(entries))

    def check(self, token: str) -> Grant | None:
        """The grant of ``token``, None when it is not valid."""
        presented = _digest(token)
        found = None
        for entry in self.entries:
            # Every entry is compared: stopping at a match would tell how far down the list it is.
            if hmac.compare_digest(entry.digest, presented):
                found = entry.grant
        return found


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer ...`` header, None when the
    header is missing or of another scheme."""
    if authorization is None:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


class TokenSource:
    """Tokens from a setting and, optionally, a file read again whenever it
    changes: a Kubernetes Secret mounted as a volume is updated in place,
    and a rotation must reach running processes without a restart.

    A file that becomes unreadable or invalid keeps the tokens read before,
    with an error logged: locking every producer out is worse than honouring
    a token for a little longer."""

    def __init__(self, inline: Tokens, path: str | None, variable: str) -> None:
        self._inline = inline
        self._path = path
        self._variable = variable
        self._seen: tuple[int, int, int] | None = None
        self._tokens = inline
        if path is not None:
            self._load(_stat(path, variable), strict=True)

    @property
    def configured(self) -> bool:
        return len(self._tokens) > 0 or self._path is not None

    def current(self) -> Tokens:
        if self._path is not None:
            try:
                seen = _stat(self._path, self._variable)
            except InvalidInput as exc:
                if self._seen is not None:
                    logger.error("%s; keeping the tokens read before", exc)
                    self._seen = None
            else:
                if seen != self._seen:
                    self._load(seen, strict=False)
        return self._tokens

    def _load(self, seen: tuple[int, int, int], *, strict: bool) -> None:
        assert self._path is not None
        try:
            self._tokens = self._inline + Tokens.parse(_read(self._path, self._variable), self._variable)
        except InvalidInput as exc:
            if strict:
                raise
            logger.error("%s; keeping the tokens read before", exc)
        self._seen = seen


def _stat(path: str, variable: str) -> tuple[int, int, int]:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InvalidInput(variable, f"cannot read {shown(path)}: {exc.strerror}") from None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _read(path: str, variable: str) -> str:
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_TOKEN_FILE_BYTES + 1)
    except OSError as exc:
        raise InvalidInput(variable, f"cannot read {shown(path)}: {exc.strerror}") from None
    if len(raw) > MAX_TOKEN_FILE_BYTES:
        raise InvalidInput(variable, f"{shown(path)} is larger than {MAX_TOKEN_FILE_BYTES} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(variable, f"{shown(path)} is not UTF-8") from None
