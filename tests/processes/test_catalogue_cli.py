"""``hooklane catalogue openapi``, run as a real process: the document the
API's ``GET /v1/catalogue/openapi.json`` answers (tests/db/test_catalogue_api.py),
printed or written to a file, and a file it cannot write refused in words."""

from __future__ import annotations

import json

from openapi_spec_validator import validate

from hooklane import store
from hooklane.catalogue_openapi import export_title, openapi_document
from testsupport.catalogue import add_order_types
from testsupport.cli import hooklane


async def test_the_export_is_printed_or_written_to_a_file(dsn, db, tmp_path):
    await add_order_types(db)
    printed = hooklane(dsn, "catalogue", "openapi", HOOKLANE_PORTAL_NAME="Acme")
    assert printed.returncode == 0, printed.stderr
    document = json.loads(printed.stdout)
    validate(document)
    assert document == openapi_document(await store.catalogue_entries(db), title=export_title("Acme"))
    assert "order.paid@1" in document["webhooks"]

    target = tmp_path / "events.json"
    written = hooklane(dsn, "catalogue", "openapi", "-o", str(target), HOOKLANE_PORTAL_NAME="Acme")
    assert written.returncode == 0, written.stderr
    assert json.loads(target.read_text()) == document
    assert written.stdout == "" and "4 event types written to" in written.stderr

    refused = hooklane(dsn, "catalogue", "openapi", "-o", str(tmp_path / "missing" / "x.json"))
    assert refused.returncode == 2
    assert refused.stderr.startswith("hooklane: --output: cannot be written: No such file or directory")
    assert "Traceback" not in refused.stderr
