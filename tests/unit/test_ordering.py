"""The order checks the ordering tests and the chaos suite apply to what a
receiver got (testsupport/receivers.py): they must catch what breaks it."""

from __future__ import annotations

from testsupport.receivers import ORDERING_KEY, ORDERING_SEQUENCE, Received, numbers_by_key, order_broken


def _got(key: str | None, seq: int | None) -> Received:
    headers = {} if key is None else {ORDERING_KEY: key, ORDERING_SEQUENCE: str(seq)}
    return Received("/a", headers, b"{}", 0.0)


def test_numbers_are_read_per_key_in_arrival_order():
    got = [_got("k1", 1), _got(None, None), _got("k2", 1), _got("k1", 2), _got("k1", 2)]
    assert numbers_by_key(got) == {"k1": [1, 2, 2], "k2": [1]}


def test_a_repeat_of_the_latest_is_in_order_and_an_earlier_one_is_not():
    assert order_broken({"k": [1, 2, 2, 3, 5]}) == []
    assert order_broken({"k": [1, 2, 3, 2], "j": [1]}) == ["k: 2 after 3 in [1, 2, 3, 2]"]
    assert order_broken({"k": [2, 1]}) == ["k: 1 after 2 in [2, 1]"]
