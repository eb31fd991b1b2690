"""Each drop waiting for the next release is named by the release step
(CONTRIBUTING.md, "Releasing")."""

from __future__ import annotations

import re
from pathlib import Path

from testsupport.migrations import AFTER_NEXT_RELEASE


def test_each_drop_after_the_next_release_is_named_by_the_release_step():
    files = sorted(AFTER_NEXT_RELEASE.iterdir())
    assert files, "nothing waits for the next release: delete the folder and its release step"
    releasing = (
        (Path(__file__).resolve().parents[2] / "CONTRIBUTING.md").read_text().split("### Releasing")[1]
    )
    queries = (AFTER_NEXT_RELEASE.parent / "queries.sql").read_text()
    for path in files:
        assert re.fullmatch(r"[a-z0-9_]+\.sql", path.name), path.name
        assert f"hooklane/store/after_next_release/{path.name}" in releasing, path.name
        # What it drops is what only an older release runs.
        dropped = re.findall(r"^DROP (?:FUNCTION|TABLE) (\w+)", path.read_text(), flags=re.MULTILINE)
        assert dropped, path.name
        assert not [name for name in dropped if re.search(rf"\b{name}\b", queries)], path.name
