"""What tests/db/test_tracing.py and tests/processes/test_tracing.py share."""

from __future__ import annotations

import asyncio
import os

import pytest

from hooklane import tracing
from testsupport.otlp import Collector


def producer_span() -> tuple[str, str, str]:
    """A producer's span of its own trace: trace id, span id, traceparent."""
    trace_id, span_id = os.urandom(16).hex(), os.urandom(8).hex()
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


@pytest.fixture
async def collector():
    async with Collector() as c:
        yield c


@pytest.fixture
async def traced(collector):
    """Tracing on in this process (the in-process API and worker),
    exporting to ``collector``; shut down (everything exported) after."""
    tracing.start("hooklane-test", endpoint=collector.url)
    yield collector
    # The exporter posts from the SDK's thread to the collector served by
    # this loop: flushing from the loop itself would wait on itself.
    await asyncio.to_thread(tracing.shutdown)
