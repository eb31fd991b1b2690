"""What tests/db/test_api_guarantees.py and
tests/processes/test_api_guarantees.py share."""

from __future__ import annotations

import base64

# Accepted by datetime.fromisoformat, but beyond its range once in UTC.
OVERFLOWING_TIMES = ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00")


NUL_CURSOR = base64.urlsafe_b64encode(b"e1:5:a\x00b").decode().rstrip("=")
