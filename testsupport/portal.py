"""What tests/db/test_portal.py and tests/unit/test_portal.py share."""

from __future__ import annotations

PLATFORM = "https://app.example.com"


# A host the destination guard lets through in these tests (loopback).
OWN_URL = "http://127.0.0.1:9/own"
