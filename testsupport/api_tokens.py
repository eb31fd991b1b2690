"""What tests/processes/test_api_tokens.py and tests/unit/test_api_tokens.py
share."""

from __future__ import annotations

TOKEN = "9tq0oZ7qkY8v1H5XyV4m2sT3bQ0cR6eJ"


OTHER = "Q1w2E3r4T5y6U7i8O9p0A1s2D3f4G5h6"


# A tenant's name that is also a valid token: the case.
TENANT_LIKE_A_TOKEN = "globex-corporation-eu"
