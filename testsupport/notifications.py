"""What tests/db/test_notifications.py and tests/unit/test_notifications.py
share."""

from __future__ import annotations

OPS = "ops"
