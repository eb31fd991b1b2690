"""JSON text exactly as PostgreSQL prints a ``jsonb`` value (``jsonb::text``).

An event's data is stored as ``jsonb`` and a receiver gets ``data::text``,
which is not the producer's JSON: object keys are ordered (shorter first in
UTF-8 bytes, then bytewise), a space follows every ``:`` and ``,``, and
numbers are ``numeric``, printed in plain notation with every digit (``1e308``
comes back as 309 digits, ``5e-324`` as a 326-character decimal). Rendering
it here lets the publish check measure what will be sent, byte for byte.

Strings come out as Postgres's ``escape_json`` writes them, which is what
``json.dumps(..., ensure_ascii=False)`` writes too: ``\\"``, ``\\\\``, ``\\b``,
``\\f``, ``\\n``, ``\\r``, ``\\t``, other C0 controls as ``\\u00xx``, and
everything else (DEL, C1 controls, non-ASCII) as it is."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from json.encoder import encode_basestring
from typing import Any


def jsonb_text(value: Any) -> str:
    """``value`` as ``SELECT $1::jsonb::text`` prints it when ``$1`` is the
    value's JSON text (``json.dumps``). ``value`` is a tree as
    ``hooklane.publish`` checks it: string keys, finite floats, no NUL, no
    lone surrogate, at most ``checks.MAX_DEPTH`` deep."""
    parts: list[str] = []
    _render(value, parts.append)
    return "".join(parts)


def number_text(value: float) -> str:
    """How ``numeric`` prints the float's JSON text (its shortest repr):
    plain notation with as many decimals as the repr has (``1e-07`` is
    ``0.0000001``, ``1e+16`` is ``10000000000000000``, ``1.0`` stays), and no
    negative zero."""
    text = float.__repr__(value)
    if text == "-0.0":
        return "0.0"
    if "e" not in text:
        return text
    return format(Decimal(text), "f")


def _key_order(key: str) -> tuple[int, str]:
    # Comparing str compares code points, which orders as UTF-8 bytes do.
    return (len(key) if key.isascii() else len(key.encode()), key)


def _render(value: Any, out: Callable[[str], object]) -> None:
    # One pass, sorting as it goes: as fast as reordering the tree for
    # json.dumps would be, and floats need this anyway.
    kind = type(value)
    if kind is str:
        out(encode_basestring(value))
    elif kind is dict:
        out("{")
        for i, key in enumerate(sorted(value, key=_key_order)):
            out(f", {encode_basestring(key)}: " if i else f"{encode_basestring(key)}: ")
            _render(value[key], out)
        out("}")
    elif kind is list or kind is tuple:
        out("[")
        for i, element in enumerate(value):
            if i:
                out(", ")
            _render(element, out)
        out("]")
    elif value is None:
        out("null")
    elif value is True:
        out("true")
    elif value is False:
        out("false")
    elif kind is int:
        out(int.__repr__(value))
    elif kind is float:
        out(number_text(value))
    # Subclasses (an IntEnum, an OrderedDict), read as json.dumps reads them.
    elif isinstance(value, str):
        out(encode_basestring(value))
    elif isinstance(value, dict):
        _render(dict(value.items()), out)
    elif isinstance(value, int):
        out(int.__repr__(value))
    elif isinstance(value, float):
        out(number_text(value))
    else:
        _render(list(value), out)
