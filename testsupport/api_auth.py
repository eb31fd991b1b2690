"""What tests/db/test_api_auth.py and tests/unit/test_api_auth.py share."""

from __future__ import annotations

TOKEN = "9tq0oZ7qkY8v1H5XyV4m2sT3bQ0cR6eJ"


LIMITED = "Q1w2E3r4T5y6U7i8O9p0A1s2D3f4G5h6"


ADMIN = "admin-token-0123456789abcdef"
