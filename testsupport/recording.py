"""Every answer the in-process API gives a test, written to a JSON Lines
file, so that a refactoring of the API can show its answers unchanged:

    RECORD_API_ANSWERS=before.jsonl hack/test tests/db/test_portal.py
    ... change the code ...
    RECORD_API_ANSWERS=after.jsonl hack/test tests/db/test_portal.py
    python -m testsupport.recording before.jsonl after.jsonl [before-again.jsonl]

Values that differ from run to run (ids, times, tokens, secrets, ports)
are replaced by placeholders (again as a recording is read, so that a
placeholder added later applies to it); the comparison reads
each test's answers as a set, since a test may send requests concurrently.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from collections import Counter
from typing import Any

from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

ENV = "RECORD_API_ANSWERS"

_VOLATILE = [
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<uuid>"),
    (re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?([+-]\d\d(:\d\d)?|Z)?( UTC)?"), "<time>"),
    (re.compile(r"whsec_[A-Za-z0-9+/=]+"), "whsec_<secret>"),
    (re.compile(r"msg_[0-9a-f]{32}"), "msg_<id>"),
    (re.compile(r"(hl[a-z]*_)[A-Za-z0-9_-]{16,}"), r"\1<token>"),
    (re.compile(r"127\.0\.0\.1:\d+"), "127.0.0.1:<port>"),
    # A worker's name: its host and process id.
    (re.compile(re.escape(socket.gethostname()) + r"-\d+"), "<worker>"),
    # Durations and ages measured to the microsecond.
    (re.compile(r"\b\d+\.\d{4,}\b"), "<float>"),
    # Cursors: positions that hold times and ids.
    (re.compile(r'("(?:next_)?cursor": ")[A-Za-z0-9_-]+'), r"\1<cursor>"),
    (re.compile(r"\b((?:replay_)?cursor|after|before)=[A-Za-z0-9_%-]+"), r"\1=<cursor>"),
    (re.compile(r'(name="(?:replay_)?cursor" value=")[A-Za-z0-9_-]+'), r"\1<cursor>"),
    (re.compile(r"-[0-9a-f]{8}\b"), "-<hex>"),
    (re.compile(r"\b\d+(\.\d+)? (ms|s|min|h|seconds?|minutes?|hours?)\b"), "<duration>"),
]


def normalised(text: str) -> str:
    for pattern, placeholder in _VOLATILE:
        text = pattern.sub(placeholder, text)
    return text


def install(path: str) -> None:
    """Make every ``TestClient`` request append its answer to ``path``."""
    sent = TestClient._request

    async def recorded(self: TestClient, method: str, url: Any, **kwargs: Any) -> ClientResponse:  # type: ignore[type-arg]
        response = await sent(self, method, url, **kwargs)
        body = (await response.read()).decode("utf-8", "replace")
        record = {
            "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0],
            "request": normalised(f"{method} {url}"),
            "status": response.status,
            "type": response.content_type,
            "location": normalised(response.headers.get("Location", "")),
            "body": normalised(body),
        }
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(record, sort_keys=True) + "\n")
        return response

    TestClient._request = recorded  # type: ignore[method-assign]


def _answers(path: str) -> dict[str, Counter[str]]:
    by_test: dict[str, Counter[str]] = {}
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            # Again, so that a placeholder added since applies to it too.
            answer = {k: normalised(v) if isinstance(v, str) else v for k, v in record.items() if k != "test"}
            by_test.setdefault(record["test"], Counter())[json.dumps(answer, sort_keys=True)] += 1
    return by_test


def _differing(old: dict[str, Counter[str]], new: dict[str, Counter[str]]) -> set[str]:
    return {test for test in old.keys() | new.keys() if old.get(test) != new.get(test)}


def main(before: str, after: str, *again: str) -> int:
    """Print each test's answers found in one recording only; 1 if any.
    ``again``: more recordings of the tree ``before`` was recorded on;
    the tests they answer differently by themselves (a deadline's pages,
    the order of concurrent requests) are named and left out."""
    old, new = _answers(before), _answers(after)
    unstable = set().union(*(_differing(old, _answers(path)) for path in again))
    for test in sorted(unstable):
        print(f"unstable, left out: {test}")
    changed = sorted(_differing(old, new) - unstable)
    for test in changed:
        was, now = old.get(test, Counter()), new.get(test, Counter())
        print(f"== {test}")
        print("".join(f"- {answer}\n" for answer in was - now), end="")
        print("".join(f"+ {answer}\n" for answer in now - was), end="")
    compared = len((old.keys() | new.keys()) - unstable)
    print(f"{len(changed)} of {compared} tests answered differently")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
