"""Files whose paths a user gives (a manifest, a secret, a token list): read
at most a bound, so that a wrong path (a log, a device) costs nothing and
is refused with the option or variable that named it."""

from __future__ import annotations

import sys

from hooklane.errors import InvalidInput, shown


def read_bounded(path: str, field: str, limit: int, *, stdin: bool = False) -> bytes:
    """The bytes of the file at ``path`` (with ``stdin``, "-" is standard
    input), refused past ``limit`` without reading further; ``InvalidInput``
    names ``field``."""
    try:
        if stdin and path == "-":
            raw = sys.stdin.buffer.read(limit + 1)
        else:
            with open(path, "rb") as file:
                raw = file.read(limit + 1)
    except OSError as exc:
        raise InvalidInput(field, f"cannot read {shown(path)}: {exc.strerror}") from None
    if len(raw) > limit:
        raise InvalidInput(field, f"is larger than {limit} bytes")
    return raw


def decode_utf8(raw: bytes, field: str) -> str:
    """``raw`` as text; ``InvalidInput`` names ``field`` and the first byte
    that is not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(field, f"is not UTF-8 (byte {exc.start})") from None
