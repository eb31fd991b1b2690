"""The tenant-change discard migration 0008 writes once as a function
(hooklane_tenant_discard), which upsert_endpoint, the reservation and
complete call. It is covered by behaviour as well: tests/db/test_tenancy.py
expects one message from upsert_endpoint and from the reservation."""

from __future__ import annotations


async def test_the_tenant_discard_names_both_tenants_and_only_when_they_differ(db):
    rows = await db.fetch(
        "SELECT hooklane_tenant_discard(e, t) FROM (VALUES ('acme', 'acme'), ('acme', 'globex')) AS x(e, t)"
    )
    assert [r[0] for r in rows] == [None, "discarded: the endpoint's tenant changed from acme to globex"]
