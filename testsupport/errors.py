"""What tests/db/test_errors.py and tests/unit/test_errors.py share."""

from __future__ import annotations

import asyncpg

exc = asyncpg.exceptions
