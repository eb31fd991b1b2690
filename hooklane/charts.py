"""The charts of an endpoint's page (issue 41): its attempts by outcome and
their latency, per hour over the last 24 hours or per day over the last 7,
drawn as inline SVG on the server.

Pure geometry: buckets in, markup out. Nothing here reads the database or
runs in the browser: the pages' CSP allows no script or style of another
origin and no inline style, so every colour is a class of the stylesheet
(dashboard.css) and every value is in the markup itself, a ``<title>`` to
hover and an ``aria-label`` that says what the chart shows in words. The
drawing scales with its box (a ``viewBox``, no fixed size): a phone shows
the whole chart, smaller.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from html import escape

from hooklane.errors import InvalidInput, shown


class Span(StrEnum):
    """What a page's charts cover, as its ``span`` query parameter says."""

    DAY = "24h"
    WEEK = "7d"


@dataclass(frozen=True)
class SpanTerms:
    """A span's buckets: ``count`` of ``width`` each, the last one holding
    now; ``name``, ``per`` and ``over``: how the page says so."""

    width: timedelta
    count: int
    name: str
    per: str
    over: str


SPANS = {
    Span.DAY: SpanTerms(timedelta(hours=1), 24, "24 hours", "hour", "the last 24 hours"),
    Span.WEEK: SpanTerms(timedelta(days=1), 7, "7 days", "day", "the last 7 days"),
}


def check_span(text: str | None) -> Span:
    """The ``span`` query parameter; left out: the last 24 hours."""
    if not text:
        return Span.DAY
    try:
        return Span(text)
    except ValueError:
        raise InvalidInput("span", f"must be 24h or 7d, not {shown(text)}") from None


def bucket_starts(span: Span, now: datetime) -> list[datetime]:
    """The starts of the span's buckets, oldest first, the last one holding
    ``now``. Buckets are aligned on the Unix epoch: UTC hours and days,
    as the query's ``date_bin`` cuts them."""
    terms = SPANS[span]
    width = terms.width.total_seconds()
    last = math.floor(now.timestamp() / width) * width
    return [datetime.fromtimestamp(last - (terms.count - 1 - i) * width, UTC) for i in range(terms.count)]


@dataclass(frozen=True)
class Bucket:
    """The attempts recorded in one bucket: how many of each outcome (as
    delivery_attempts.outcome records them), and the median and 99th
    percentile of the timed ones' durations, in seconds (None: none was
    timed, such as a lease that ran out)."""

    start: datetime
    delivered: int = 0
    retry: int = 0
    dead: int = 0
    discarded: int = 0
    p50: float | None = None
    p99: float | None = None

    @property
    def total(self) -> int:
        return self.delivered + self.retry + self.dead + self.discarded


# The outcomes stacked in a bar, from the bottom: each one's field of
# Bucket, its class (the stylesheet's colour) and its words.
OUTCOMES = (
    ("delivered", "delivered"),
    ("retry", "failed and retried"),
    ("dead", "failed for good (dead)"),
    ("discarded", "discarded"),
)


def fill(span: Span, now: datetime, found: Iterable[Bucket]) -> list[Bucket]:
    """Every bucket of the span, oldest first: those ``found`` (the query
    gives only the buckets that hold attempts), empty ones between them.
    A bucket outside the span (the clock turned an hour between two
    statements) is left out."""
    by_start = {b.start: b for b in found}
    return [by_start.get(start, Bucket(start)) for start in bucket_starts(span, now)]


# The drawing's own units (the viewBox): the stylesheet makes it as wide as
# its box, and the text scales with it.
WIDTH = 480.0
HEIGHT = 200.0
LEFT = 50.0
RIGHT = 8.0
TOP = 10.0
BOTTOM = 26.0
PLOT_WIDTH = WIDTH - LEFT - RIGHT
PLOT_HEIGHT = HEIGHT - TOP - BOTTOM
BAR_SHARE = 0.7


@dataclass(frozen=True)
class Chart:
    """One chart: its ``title`` (a heading), ``svg`` (markup, every text in
    it escaped) and ``summary``, the same in words (the SVG's aria-label)."""

    title: str
    svg: str
    summary: str


@dataclass(frozen=True)
class Charts:
    """An endpoint's charts over a span: the buckets they are drawn from
    (the page shows them as a table too), attempts by outcome, latency."""

    span: Span
    terms: SpanTerms
    buckets: list[Bucket]
    outcomes: Chart
    latency: Chart


def step_for(most: float) -> float:
    """A round step (1, 2 or 5 times a power of ten) with which at most
    four steps reach ``most``: the axis' gridlines."""
    if not math.isfinite(most) or most <= 0:
        return 1.0
    # A value too small for its quarter to be a float (a subnormal) still
    # gets a step.
    rough = max(most / 4, 1e-12)
    power = 10.0 ** math.floor(math.log10(rough))
    for multiple in (1.0, 2.0, 5.0, 10.0):
        if multiple * power >= rough:
            return multiple * power
    return 10.0 * power  # pragma: no cover - the loop's last multiple always fits


def axis_top(most: float, whole: bool) -> tuple[float, float]:
    """The axis' top and step for values up to ``most``; ``whole``: counts,
    whose steps are whole numbers."""
    step = step_for(most)
    if whole:
        step = max(1.0, math.ceil(step))
    steps = max(1, math.ceil(most / step - 1e-9)) if most > 0 else 1
    return steps * step, step


def duration_text(seconds: float) -> str:
    """A latency as an axis or a hover says it: ``850 ms``, ``1.5 s``."""
    seconds = max(seconds, 0.0)
    if seconds < 1:
        return f"{_round(seconds * 1000)} ms"
    return f"{_round(seconds)} s"


def _round(value: float) -> str:
    # Three significant digits at most, without a float's noise (0.30000000000000004).
    return f"{float(f'{value:.3g}'):g}"


def _count_text(n: int) -> str:
    return f"{n:,}"


def bucket_text(span: Span, start: datetime) -> str:
    """A bucket as a hover and the table name it: ``14:00 UTC``, ``Mon 7 Dec``."""
    if span is Span.DAY:
        return f"{start:%H:00} UTC, {start:%a} {start.day} {start:%b}"
    return f"{start:%a} {start.day} {start:%b}"


def _tick_text(span: Span, start: datetime) -> str | None:
    # Every third hour, every day: labels that fit the bars under them.
    if span is Span.DAY:
        return f"{start:%H}:00" if start.hour % 3 == 0 else None
    return f"{start:%a} {start.day}"


def _n(value: float) -> str:
    return f"{value:.1f}"


def _y(value: float, top: float) -> float:
    # The plot's bottom for 0, its top for ``top``; never outside.
    share = min(max(value / top, 0.0), 1.0) if top > 0 else 0.0
    return TOP + PLOT_HEIGHT - share * PLOT_HEIGHT


def _frame(span: Span, starts: Sequence[datetime], top: float, step: float, label: str) -> list[str]:
    """The gridlines and their values, the bucket labels under the plot,
    and the axes."""
    parts = []
    ticks = round(top / step)
    for i in range(ticks + 1):
        value = step * i
        y = _y(value, top)
        parts.append(
            f'<line class="grid" x1="{_n(LEFT)}" x2="{_n(WIDTH - RIGHT)}" y1="{_n(y)}" y2="{_n(y)}"/>'
        )
        text = _count_text(round(value)) if label == "count" else duration_text(value)
        parts.append(f'<text class="tick y" x="{_n(LEFT - 4)}" y="{_n(y + 3.5)}">{escape(text)}</text>')
    width = PLOT_WIDTH / len(starts)
    for i, start in enumerate(starts):
        tick = _tick_text(span, start)
        if tick is not None:
            x = LEFT + (i + 0.5) * width
            parts.append(f'<text class="tick x" x="{_n(x)}" y="{_n(HEIGHT - 8)}">{escape(tick)}</text>')
    bottom = TOP + PLOT_HEIGHT
    parts.append(
        f'<line class="axis" x1="{_n(LEFT)}" x2="{_n(WIDTH - RIGHT)}" y1="{_n(bottom)}" y2="{_n(bottom)}"/>'
    )
    parts.append(f'<line class="axis" x1="{_n(LEFT)}" x2="{_n(LEFT)}" y1="{_n(TOP)}" y2="{_n(bottom)}"/>')
    return parts


def _svg(kind: str, summary: str, parts: Iterable[str]) -> str:
    return (
        f'<svg class="chart chart-{kind}" viewBox="0 0 {WIDTH:g} {HEIGHT:g}" role="img"'
        f' aria-label="{escape(summary)}" preserveAspectRatio="xMidYMid meet"'
        f' xmlns="http://www.w3.org/2000/svg">' + "".join(parts) + "</svg>"
    )


def _nothing(text: str) -> str:
    return (
        f'<text class="nothing" x="{_n(LEFT + PLOT_WIDTH / 2)}" y="{_n(TOP + PLOT_HEIGHT / 2)}">'
        f"{escape(text)}</text>"
    )


def _hit(x: float, width: float, title: str) -> str:
    # The whole column answers the hover, however short its bar (or none).
    return (
        f'<rect class="hit" x="{_n(x)}" y="{_n(TOP)}" width="{_n(width)}" height="{_n(PLOT_HEIGHT)}">'
        f"<title>{escape(title)}</title></rect>"
    )


def outcome_chart(span: Span, buckets: Sequence[Bucket]) -> Chart:
    """Stacked bars: each bucket's attempts by outcome."""
    terms = SPANS[span]
    title = f"Attempts per {terms.per}"
    totals = {key: sum(getattr(b, key) for b in buckets) for key, _ in OUTCOMES}
    everything = sum(totals.values())
    if everything == 0:
        summary = f"{title} over {terms.over}: no attempts."
        top, step = 1.0, 1.0
        parts = [
            *_frame(span, [b.start for b in buckets], top, step, "count"),
            _nothing(f"No attempts in {terms.over}"),
        ]
        return Chart(title, _svg("outcomes", summary, parts), summary)
    busiest = max(buckets, key=lambda b: b.total)
    summary = (
        f"{title} over {terms.over}: "
        + ", ".join(f"{_count_text(totals[key])} {words}" for key, words in OUTCOMES)
        + f". Most in one {terms.per}: {_count_text(busiest.total)} ({bucket_text(span, busiest.start)})."
    )
    top, step = axis_top(busiest.total, whole=True)
    parts = _frame(span, [b.start for b in buckets], top, step, "count")
    width = PLOT_WIDTH / len(buckets)
    for i, b in enumerate(buckets):
        x = LEFT + i * width
        bar_x = x + width * (1 - BAR_SHARE) / 2
        parts.append('<g class="bucket">')
        below = 0
        for key, _ in OUTCOMES:
            n = getattr(b, key)
            if n == 0:
                continue
            y_top, y_bottom = _y(below + n, top), _y(below, top)
            parts.append(
                f'<rect class="bar {key}" x="{_n(bar_x)}" y="{_n(y_top)}"'
                f' width="{_n(width * BAR_SHARE)}" height="{_n(y_bottom - y_top)}"/>'
            )
            below += n
        words = ", ".join(f"{_count_text(getattr(b, key))} {w}" for key, w in OUTCOMES if getattr(b, key))
        parts.append(_hit(x, width, f"{bucket_text(span, b.start)}: {words or 'no attempts'}"))
        parts.append("</g>")
    return Chart(title, _svg("outcomes", summary, parts), summary)


# The latency lines: each one's field of Bucket, its class and its words.
LINES = (("p50", "median (p50)"), ("p99", "99th percentile (p99)"))


def latency_chart(span: Span, buckets: Sequence[Bucket]) -> Chart:
    """Lines: each bucket's median and 99th percentile of the attempts'
    durations; a bucket without a timed attempt breaks the line."""
    terms = SPANS[span]
    title = f"Latency per {terms.per}"
    timed = [b for b in buckets if b.p50 is not None and b.p99 is not None]
    starts = [b.start for b in buckets]
    if not timed:
        summary = f"{title} over {terms.over}: no timed attempts."
        parts = [
            *_frame(span, starts, 0.001, 0.001, "seconds"),
            _nothing(f"No timed attempts in {terms.over}"),
        ]
        return Chart(title, _svg("latency", summary, parts), summary)
    slowest = max(timed, key=lambda b: _finite(b.p99))
    medians = [_finite(b.p50) for b in timed]
    low, high = duration_text(min(medians)), duration_text(max(medians))
    summary = (
        f"{title} over {terms.over}: median {low if low == high else f'between {low} and {high}'};"
        f" the highest 99th percentile {duration_text(_finite(slowest.p99))}"
        f" ({bucket_text(span, slowest.start)})."
    )
    # A millisecond at least: a shorter axis would only draw noise.
    top, step = axis_top(max(_finite(slowest.p99), 0.001), whole=False)
    parts = _frame(span, starts, top, step, "seconds")
    width = PLOT_WIDTH / len(buckets)
    for key, _ in LINES:
        for run in _runs(buckets, key):
            points = " ".join(f"{_n(LEFT + (i + 0.5) * width)},{_n(_y(v, top))}" for i, v in run)
            if len(run) > 1:
                parts.append(f'<polyline class="line {key}" points="{points}"/>')
    for i, b in enumerate(buckets):
        x = LEFT + i * width
        parts.append('<g class="bucket">')
        for key, _ in LINES:
            value = getattr(b, key)
            if value is not None:
                parts.append(
                    f'<circle class="dot {key}" cx="{_n(x + width / 2)}" cy="{_n(_y(_finite(value), top))}" r="2.5"/>'
                )
        words = (
            f"median {duration_text(_finite(b.p50))}, 99th percentile {duration_text(_finite(b.p99))}"
            if b.p50 is not None and b.p99 is not None
            else "no timed attempts"
        )
        parts.append(_hit(x, width, f"{bucket_text(span, b.start)}: {words}"))
        parts.append("</g>")
    return Chart(title, _svg("latency", summary, parts), summary)


# Longer than any call lasts (the whole-call timeout is bounded far below):
# a bound that keeps the axis' arithmetic finite whatever a row holds.
LONGEST_SECONDS = 1e9


def _finite(value: float | None) -> float:
    # What the database gave, made safe to draw: never NaN, never negative.
    if value is None or not math.isfinite(value):
        return 0.0
    return min(max(value, 0.0), LONGEST_SECONDS)


def _runs(buckets: Sequence[Bucket], key: str) -> list[list[tuple[int, float]]]:
    """The line's unbroken stretches: consecutive buckets with a value."""
    runs: list[list[tuple[int, float]]] = []
    current: list[tuple[int, float]] = []
    for i, b in enumerate(buckets):
        value = getattr(b, key)
        if value is None:
            if current:
                runs.append(current)
            current = []
        else:
            current.append((i, _finite(value)))
    if current:
        runs.append(current)
    return runs


def endpoint_charts(span: Span, now: datetime, found: Iterable[Bucket]) -> Charts:
    """The charts of an endpoint's page, from the buckets its query found
    (``now``: the database's clock, that the buckets end at)."""
    buckets = fill(span, now, found)
    return Charts(span, SPANS[span], buckets, outcome_chart(span, buckets), latency_chart(span, buckets))
