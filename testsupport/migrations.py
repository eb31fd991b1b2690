"""What tests/db/test_migrations.py and tests/unit/test_migrations.py share."""

from __future__ import annotations

from pathlib import Path

# Drops that wait for the next release (CONTRIBUTING.md, "Releasing").
AFTER_NEXT_RELEASE = Path(__file__).parent.parent / "hooklane" / "store" / "after_next_release"
