"""Where a worker's time goes, from py-spy's collapsed stacks (--format raw).

Prints the share of samples by the frame a sample is *in* (self), and by
chosen areas of the worker found anywhere on the stack (inclusive): sending
over HTTP, reserving, recording results, signing, building bodies, the
event loop itself.

Run: ``python -m bench.profile_summary docs/profiles/worker-1w.txt``
"""

from __future__ import annotations

import argparse
import re
from collections import Counter

# Inclusive areas: a sample counts for the first area whose pattern matches a
# frame of its stack, innermost first, so nested areas do not double count.
AREAS = [
    ("signing (hmac/base64)", re.compile(r"\bsign \(hooklane/signing|hmac|base64")),
    ("building the body", re.compile(r"event_body")),
    ("classify / results", re.compile(r"\bclassify\b|_result \(hooklane/worker/runner")),
    ("reserve (asyncpg + decode)", re.compile(r"_reserve_loop|reserve \(hooklane/store")),
    (
        "record results (complete)",
        re.compile(r"\brecord \(hooklane/worker/runner|complete \(hooklane/store|_record_loop"),
    ),
    (
        "aiohttp client (send)",
        re.compile(r"aiohttp/(client|connector|client_reqrep|streams|http_writer|client_proto)"),
    ),
    ("timeouts / timers", re.compile(r"timeout|call_at|call_later")),
    ("metrics", re.compile(r"prometheus_client")),
    ("gauges / maintenance", re.compile(r"hooklane/worker/jobs")),
]
_LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")


def read(path: str) -> list[tuple[list[str], int]]:
    stacks = []
    with open(path) as f:
        for line in f:
            m = _LINE.match(line.rstrip("\n"))
            if m:
                stacks.append((m["stack"].split(";"), int(m["count"])))
    return stacks


def summarise(stacks: list[tuple[list[str], int]], top: int) -> str:
    total = sum(c for _, c in stacks) or 1
    own: Counter[str] = Counter()
    areas: Counter[str] = Counter()
    for frames, count in stacks:
        own[re.sub(r":\d+\)", ")", frames[-1])] += count
        for frame in reversed(frames):
            area = next((name for name, pattern in AREAS if pattern.search(frame)), None)
            if area:
                areas[area] += count
                break
        else:
            areas["other (event loop, asyncio, selectors)"] += count
    lines = [f"{total} samples", "", "by area (inclusive, innermost match):"]
    lines += [f"  {100 * c / total:5.1f}%  {name}" for name, c in areas.most_common()]
    lines += ["", f"top {top} frames (self):"]
    lines += [f"  {100 * c / total:5.1f}%  {name}" for name, c in own.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    print(summarise(read(args.path), args.top))


if __name__ == "__main__":
    main()
