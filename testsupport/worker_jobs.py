"""What tests/db/test_worker_jobs.py and tests/unit/test_worker_jobs.py
share."""

from __future__ import annotations

import pytest


def said(caplog: pytest.LogCaptureFixture) -> list[tuple[str, object]]:
    return [(r.getMessage(), r.__dict__.get("action")) for r in caplog.records]
