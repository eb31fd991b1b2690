"""``check_event`` measures ``hooklane.jsonb.jsonb_text``'s text: what a
receiver gets is what was checked, byte for byte (issue 18, item 1). That
the text is Postgres's ``jsonb::text`` is tests/db/test_jsonb_text.py's."""

from __future__ import annotations

import json
from collections import OrderedDict
from enum import IntEnum
from typing import Any

import pytest

from hooklane.errors import InvalidInput
from hooklane.jsonb import jsonb_text
from hooklane.publish import MAX_DATA_BYTES, check_event


def test_subclasses_print_as_json_reads_them():
    class Level(IntEnum):
        HIGH = 3

    class Name(str):
        def __str__(self) -> str:
            return "not this"

    data = {"level": Level.HIGH, "name": Name("x"), "o": OrderedDict([("bb", 1), ("a", 2)])}
    assert jsonb_text(data) == '{"o": {"a": 2, "bb": 1}, "name": "x", "level": 3}'


def _padded(shape: Any, size: int) -> dict[str, Any]:
    """``{"v": shape, "pad": "xx…"}`` whose jsonb text is ``size`` bytes."""
    data = {"v": shape, "pad": ""}
    data["pad"] = "x" * (size - len(jsonb_text(data).encode()))
    return data


# Shapes that are small as compact JSON or as the early bound counts them,
# and large as jsonb prints them.
SHAPES = {
    "zeros": [0] * 80_000,
    "tiny floats": [5e-324] * 790,
    "short keys": {f"{i:x}": [] for i in range(20_000)},
    "controls": ["\x01" * 6] * 6_000,
    "non-ascii": ["é😀"] * 20_000,
    "empty containers": [[{}], []] * 20_000,
}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_the_limit_is_measured_on_the_text_sent(shape):
    at_limit = _padded(shape, MAX_DATA_BYTES)
    assert len(check_event(tenant="a", type="t", data=at_limit).encode()) == MAX_DATA_BYTES
    with pytest.raises(InvalidInput) as refused:
        check_event(tenant="a", type="t", data=_padded(shape, MAX_DATA_BYTES + 1))
    assert refused.value.field == "data" and "larger than" in refused.value.message


def test_many_tiny_floats_under_the_limit_as_written_are_refused():
    # 7 bytes each as the producer wrote them, 326 as jsonb prints them: 12 MB.
    data = {"readings": [5e-324] * 37_000}
    assert len(json.dumps(data, separators=(",", ":")).encode()) < MAX_DATA_BYTES
    with pytest.raises(InvalidInput) as refused:
        check_event(tenant="a", type="t", data=data)
    assert refused.value.field == "data" and "larger than" in refused.value.message
