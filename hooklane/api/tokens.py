"""Bearer tokens of the HTTP API: the token of a request's header, and
the token lists it checks by, from a setting and a file re-read when it
changes. The syntax of a list and the check itself are in
hooklane/tokens.py.
"""

from __future__ import annotations

import logging
import os

from hooklane.errors import InvalidInput, shown
from hooklane.files import decode_utf8, read_bounded
from hooklane.tokens import Tokens

logger = logging.getLogger(__name__)

# A token file is a handful of lines; the limit only bounds a wrong path.
MAX_TOKEN_FILE_BYTES = 256 * 1024


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
            raw = read_bounded(self._path, self._variable, MAX_TOKEN_FILE_BYTES)
            read = Tokens.parse(
                decode_utf8(raw, self._variable),
                self._variable,
                tenants_allowed=self._inline.tenants_allowed,
            )
            self._tokens = self._inline + read
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
