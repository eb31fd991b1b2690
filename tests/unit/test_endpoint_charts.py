"""The endpoint charts' geometry (hooklane/charts.py): buckets in, SVG out.
Whatever the counts and durations, the drawing is well-formed XML, holds
no NaN or infinity, keeps every mark inside its frame, and says what it
shows in words; an empty history says so. From the database and in a
page: tests/db/test_endpoint_charts.py."""

from __future__ import annotations

import itertools
import math
import re
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hooklane import charts
from hooklane.charts import HEIGHT, LEFT, PLOT_HEIGHT, TOP, WIDTH, Bucket, Span
from hooklane.errors import InvalidInput

SVG = "{http://www.w3.org/2000/svg}"
NOW = datetime(2026, 12, 7, 14, 37, 12, tzinfo=UTC)


def test_the_span_is_24_hours_unless_the_link_says_7_days() -> None:
    assert charts.check_span(None) is Span.DAY
    assert charts.check_span("") is Span.DAY
    assert charts.check_span("7d") is Span.WEEK
    with pytest.raises(InvalidInput) as refused:
        charts.check_span("1y<script>")
    assert refused.value.field == "span"
    assert refused.value.message == "must be 24h or 7d, not '1y<script>'"


def test_buckets_are_utc_hours_and_days_the_last_holding_now() -> None:
    hours = charts.bucket_starts(Span.DAY, NOW)
    assert len(hours) == 24
    assert hours[-1] == datetime(2026, 12, 7, 14, tzinfo=UTC)
    assert hours[0] == datetime(2026, 12, 6, 15, tzinfo=UTC)
    assert all(b - a == timedelta(hours=1) for a, b in itertools.pairwise(hours))
    days = charts.bucket_starts(Span.WEEK, NOW)
    assert days == [datetime(2026, 12, d, tzinfo=UTC) for d in range(1, 8)]


def test_fill_puts_what_was_found_in_its_place_and_leaves_the_rest_empty() -> None:
    found = [
        Bucket(datetime(2026, 12, 7, 9, tzinfo=UTC), delivered=3, p50=0.1, p99=0.2),
        # The clock turned an hour between two statements: not of this span.
        Bucket(datetime(2026, 12, 7, 15, tzinfo=UTC), delivered=1),
    ]
    filled = charts.fill(Span.DAY, NOW, found)
    assert [b.start for b in filled] == charts.bucket_starts(Span.DAY, NOW)
    assert [b.total for b in filled] == [0] * 18 + [3] + [0] * 5


def test_durations_and_buckets_read_as_a_person_says_them() -> None:
    assert charts.duration_text(0.0) == "0 ms"
    assert charts.duration_text(0.0123456) == "12.3 ms"
    assert charts.duration_text(0.30000000000000004) == "300 ms"
    assert charts.duration_text(1.5) == "1.5 s"
    assert charts.duration_text(-1) == "0 ms"
    assert charts.bucket_text(Span.DAY, NOW.replace(minute=0, second=0)) == "14:00 UTC, Mon 7 Dec"
    assert charts.bucket_text(Span.WEEK, datetime(2026, 12, 1, tzinfo=UTC)) == "Tue 1 Dec"


def test_an_empty_history_draws_an_honest_nothing() -> None:
    drawn = charts.endpoint_charts(Span.WEEK, NOW, [])
    assert drawn.outcomes.summary == "Attempts per day over the last 7 days: no attempts."
    assert drawn.latency.summary == "Latency per day over the last 7 days: no timed attempts."
    for chart, words in ((drawn.outcomes, "No attempts"), (drawn.latency, "No timed attempts")):
        svg = ET.fromstring(chart.svg)
        assert svg.get("aria-label") == chart.summary
        assert [t.text for t in svg.iter(SVG + "text") if t.get("class") == "nothing"] == [
            f"{words} in the last 7 days"
        ]
        assert not list(svg.iter(SVG + "rect")) and not list(svg.iter(SVG + "circle"))


def test_bars_stack_the_outcomes_and_the_hover_says_the_counts() -> None:
    start = charts.bucket_starts(Span.DAY, NOW)[-1]
    drawn = charts.outcome_chart(
        Span.DAY, charts.fill(Span.DAY, NOW, [Bucket(start, delivered=30, retry=8, dead=2)])
    )
    svg = ET.fromstring(drawn.svg)
    bars = [r for r in svg.iter(SVG + "rect") if r.get("class", "").startswith("bar ")]
    assert [r.get("class") for r in bars] == ["bar delivered", "bar retry", "bar dead"]
    heights = [float(r.get("height", "")) for r in bars]
    # 40 on an axis up to 40 (steps of 10): the bar fills the plot's height.
    assert heights == pytest.approx(
        [PLOT_HEIGHT * 30 / 40, PLOT_HEIGHT * 8 / 40, PLOT_HEIGHT * 2 / 40], abs=0.2
    )
    # Stacked: each starts where the one below ends.
    assert float(bars[0].get("y", "")) == pytest.approx(float(bars[1].get("y", "")) + heights[1], abs=0.2)
    titles = [t.text or "" for t in svg.iter(SVG + "title")]
    assert len(titles) == 24
    assert titles[-1] == "14:00 UTC, Mon 7 Dec: 30 delivered, 8 failed and retried, 2 failed for good (dead)"
    assert drawn.summary == (
        "Attempts per hour over the last 24 hours: 30 delivered, 8 failed and retried,"
        " 2 failed for good (dead), 0 discarded. Most in one hour: 40 (14:00 UTC, Mon 7 Dec)."
    )
    ticks = [t.text for t in svg.iter(SVG + "text") if t.get("class") == "tick y"]
    assert ticks == ["0", "10", "20", "30", "40"]
    hours = [t.text for t in svg.iter(SVG + "text") if t.get("class") == "tick x"]
    assert hours == ["15:00", "18:00", "21:00", "00:00", "03:00", "06:00", "09:00", "12:00"]


def test_a_bucket_without_a_timed_attempt_breaks_the_latency_lines() -> None:
    starts = charts.bucket_starts(Span.WEEK, NOW)
    found = [Bucket(starts[i], delivered=1, p50=0.1 * (i + 1), p99=0.5 * (i + 1)) for i in (0, 1, 2, 4, 5)]
    # Counted but untimed (a lease that ran out): no point, a gap.
    found.append(Bucket(starts[3], retry=1))
    drawn = charts.latency_chart(Span.WEEK, charts.fill(Span.WEEK, NOW, found))
    svg = ET.fromstring(drawn.svg)
    lines = [(p.get("class"), len((p.get("points") or "").split())) for p in svg.iter(SVG + "polyline")]
    assert lines == [("line p50", 3), ("line p50", 2), ("line p99", 3), ("line p99", 2)]
    assert len(list(svg.iter(SVG + "circle"))) == 10
    assert drawn.summary == (
        "Latency per day over the last 7 days: median between 100 ms and 600 ms;"
        " the highest 99th percentile 3 s (Sun 6 Dec)."
    )


counts = st.integers(min_value=0, max_value=10**9)
durations = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.floats(0, 1e6))


@st.composite
def histories(draw: st.DrawFn) -> tuple[Span, list[Bucket]]:
    span = draw(st.sampled_from(list(Span)))
    starts = charts.bucket_starts(span, NOW)
    chosen = draw(st.lists(st.sampled_from(starts), unique=True))
    found = [
        Bucket(
            start, draw(counts), draw(counts), draw(counts), draw(counts), draw(durations), draw(durations)
        )
        for start in chosen
    ]
    return span, found


def _numbers(element: ET.Element) -> list[float]:
    values = [element.get(a) for a in ("x", "y", "width", "height", "cx", "cy", "x1", "x2", "y1", "y2")]
    points = re.split(r"[ ,]", element.get("points") or "")
    return [float(v) for v in [*values, *points] if v]


@given(histories())
def test_whatever_the_history_the_drawing_stays_in_its_frame(history: tuple[Span, list[Bucket]]) -> None:
    span, found = history
    drawn = charts.endpoint_charts(span, NOW, found)
    for chart in (drawn.outcomes, drawn.latency):
        assert not re.search(r"\bnan\b|\binf", chart.svg, re.I), chart.svg
        svg = ET.fromstring(chart.svg)
        assert svg.get("viewBox") == f"0 0 {WIDTH:g} {HEIGHT:g}"
        assert svg.get("aria-label") == chart.summary
        for element in svg.iter():
            numbers = _numbers(element)
            assert all(math.isfinite(n) for n in numbers), ET.tostring(element)
            for name in ("x", "cx", "x1", "x2"):
                if element.get(name) is not None:
                    assert 0 <= float(element.get(name, "")) <= WIDTH
            for name in ("y", "cy", "y1", "y2"):
                if element.get(name) is not None:
                    assert 0 <= float(element.get(name, "")) <= HEIGHT
            if element.tag == SVG + "rect":
                x, y = float(element.get("x", "")), float(element.get("y", ""))
                w, h = float(element.get("width", "")), float(element.get("height", ""))
                assert w > 0 and h >= 0
                assert LEFT <= x <= x + w <= WIDTH
                assert TOP - 0.05 <= y <= y + h <= TOP + PLOT_HEIGHT + 0.05
            if element.tag == SVG + "polyline":
                assert all(0 <= n <= WIDTH for n in numbers)
        # A hover for every bucket, whatever it holds.
        assert len(list(svg.iter(SVG + "title"))) == (len(drawn.buckets) if "<title>" in chart.svg else 0)
    total = sum(b.total for b in drawn.buckets)
    assert ("no attempts." in drawn.outcomes.summary) == (total == 0)
