"""Publishing scopes (migration 0015, docs/publishing.md): a role with
EXECUTE on the publish functions publishes only for the tenants its scope
names, checked against the role its connection logged in as; refused, it
learns nothing of the tenant; ``hooklane publisher`` manages the scopes,
and the upgrade kept every role that could publish publishing."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from hooklane import store
from testsupport.cli import hooklane
from testsupport.fixtures import add_endpoint
from testsupport.receivers import Answer

TRY = "SELECT * FROM hooklane_try_publish_v1($1, $2, $3::jsonb, $4, $5, $6)"
TRY_TEXT = "SELECT * FROM hooklane_try_publish_v2($1, $2, $3, $4, $5, $6)"
TRY_ORDERED = "SELECT * FROM hooklane_try_publish_v3($1, $2, $3::jsonb, $4, $5, $6, $7)"
TRY_ORDERED_TEXT = "SELECT * FROM hooklane_try_publish_v4($1, $2, $3, $4, $5, $6, $7)"


@pytest.fixture
async def owner(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(dsn)
    yield conn
    await conn.close()


@pytest.fixture
async def app_role(owner: asyncpg.Connection, dsn: str) -> AsyncIterator[tuple[str, str]]:
    """A login role of the application's, dropped afterwards (roles are the
    whole server's): its name and a URL that logs in as it."""
    role = f"app_{uuid.uuid4().hex[:12]}"
    await owner.execute(f"CREATE ROLE {role} LOGIN")
    try:
        yield role, dsn.replace("postgresql://postgres@", f"postgresql://{role}@")
    finally:
        await owner.execute(f"DROP OWNED BY {role}")
        await owner.execute(f"DROP ROLE {role}")


def _answer(row: asyncpg.Record) -> tuple:
    return tuple(row.values())


async def test_an_unscoped_role_learns_nothing_of_another_tenant(owner, app_role, receiver):
    role, app_dsn = app_role
    await add_endpoint(owner, "globex", receiver.on("globex", Answer(204)), tenant="globex")
    stored = await owner.fetchrow(TRY, "globex", "order.created", '{"n": 1}', "g-1", "k", None)
    assert stored["fanout"] == 1
    await store.grant_publisher(owner, role, ["acme"])
    app = await asyncpg.connect(app_dsn)
    try:
        # An id globex has, with its content or another; an id it has not;
        # a coalesce key it uses: one answer, naming the tenant.
        answers = {
            _answer(await app.fetchrow(query, "globex", "order.created", data, event_id, "k", None))
            for query in (TRY, TRY_TEXT)
            for data, event_id in (
                ('{"n": 1}', "g-1"),
                ('{"n": 2}', "g-1"),
                ('{"n": 1}', "g-2"),
                ("{}", None),
            )
        }
        assert answers == {
            (
                None,
                None,
                None,
                "WH403",
                "tenant",
                f"role {role} may not publish for tenant globex: its publishing scope does not include it "
                "(hooklane publisher grant)",
            )
        }
        with pytest.raises(asyncpg.PostgresError) as refused:
            await app.fetchval("SELECT hooklane_publish_v1('globex', 'order.created', '{}')")
        assert (refused.value.sqlstate, refused.value.column_name) == ("WH403", "tenant")
        # Its own tenant, through both versions.
        mine = await app.fetchrow(TRY, "acme", "order.created", "{}", "a-1", None, None)
        assert (mine["event_id"], mine["stored"]) == ("a-1", True)
        assert await app.fetchval("SELECT hooklane_publish_v2('acme', 'order.created', '{}', 'a-2')") == "a-2"
    finally:
        await app.close()
    # Globex's pending delivery is still its own event's.
    assert await owner.fetchval("SELECT event_id FROM deliveries") == "g-1"
    assert await owner.fetchval("SELECT count(*) FROM events WHERE tenant = 'globex'") == 1


async def test_every_tenant_and_revoking(owner, app_role):
    role, app_dsn = app_role
    assert await store.grant_publisher(owner, role, [None]) == 1
    assert await store.grant_publisher(owner, role, [None, "acme"]) == 1
    app = await asyncpg.connect(app_dsn)
    try:
        assert (await app.fetchrow(TRY, "globex", "a", "{}", None, None, None))["stored"]
        assert await store.revoke_publisher(owner, role, [None]) == (1, 1)
        assert (await app.fetchrow(TRY, "globex", "a", "{}", None, None, None))["error_code"] == "WH403"
        assert (await app.fetchrow(TRY, "acme", "a", "{}", None, None, None))["stored"]
        assert await store.revoke_publisher(owner, role, None) == (1, 0)
        # No scope left: EXECUTE went with it.
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await app.fetchrow(TRY, "acme", "a", "{}", None, None, None)
    finally:
        await app.close()


async def test_the_cli_grants_lists_and_revokes(dsn, app_role):
    role, _ = app_role
    done = hooklane(dsn, "publisher", "grant", role, "--tenant", "acme", "--tenant", "globex")
    assert (done.returncode, done.stdout) == (0, f"{role} may publish for acme, globex (2 new)\n")
    listed = hooklane(dsn, "publisher", "list")
    assert listed.returncode == 0
    assert [line.split() for line in listed.stdout.splitlines()] == [
        ["ROLE", "TENANTS", "EXECUTE"],
        [role, "acme,globex", "v1/v2/v3/v4"],
    ]
    done = hooklane(dsn, "publisher", "revoke", role, "--tenant", "globex")
    assert (done.returncode, done.stdout) == (0, f"1 of {role}'s tenants revoked (1 left)\n")
    done = hooklane(dsn, "publisher", "revoke", role)
    assert (done.returncode, done.stdout) == (
        0,
        f"1 of {role}'s tenants revoked (none left, EXECUTE revoked)\n",
    )
    assert hooklane(dsn, "publisher", "list").stdout.splitlines()[1:] == []
    missing = hooklane(dsn, "publisher", "grant", "no_such_role", "--all-tenants")
    assert (missing.returncode, missing.stderr) == (
        2,
        "hooklane: role: no database role is named no_such_role\n",
    )
    bad = hooklane(dsn, "publisher", "grant", role, "--tenant", "a\x01")
    assert bad.returncode == 2 and bad.stderr.startswith("hooklane: --tenant: "), bad.stderr
    assert hooklane(dsn, "publisher", "grant", role).returncode == 2


async def test_the_upgrade_keeps_every_role_that_could_publish_publishing(fresh_dsn):
    """Before 0015 EXECUTE was all a role needed, for every tenant: after
    it, such a role has every tenant in its scope and EXECUTE on v2; a role
    granted nothing has neither."""
    granted, bystander = (f"app_{uuid.uuid4().hex[:12]}" for _ in range(2))
    conn = await asyncpg.connect(fresh_dsn)
    try:
        await store.migrate(conn, target=14)
        for role in (granted, bystander):
            await conn.execute(f"CREATE ROLE {role} LOGIN")
        await conn.execute(
            f"GRANT EXECUTE ON FUNCTION hooklane_try_publish_v1, hooklane_publish_v1 TO {granted}"
        )
        assert [m.version for m in await store.migrate(conn, target=15)] == [15]
        scopes = {s.role: s for s in await store.publisher_scopes(conn)}
        # v3 and v4 come with migration 0026.
        assert scopes == {granted: store.PublisherScope(granted, (None,), (True, True, False, False))}
        app = await asyncpg.connect(fresh_dsn.replace("postgresql://postgres@", f"postgresql://{granted}@"))
        try:
            assert (await app.fetchrow(TRY_TEXT, "any-tenant", "a", "{}", None, None, None))["stored"]
        finally:
            await app.close()
    finally:
        for role in (granted, bystander):
            await conn.execute(f"DROP OWNED BY {role}")
            await conn.execute(f"DROP ROLE {role}")
        await conn.close()


async def test_a_granted_role_publishes_with_an_ordering_key(owner, app_role, receiver):
    """``hooklane publisher grant`` grants v3 and v4 with the rest, and
    revoking takes them too; their scope is checked as v1's."""
    role, app_dsn = app_role
    await add_endpoint(owner, "orders", receiver.on("orders", Answer(204)))
    await store.grant_publisher(owner, role, ["acme"])
    app = await asyncpg.connect(app_dsn)
    try:
        for query, event_id in ((TRY_ORDERED, "o-1"), (TRY_ORDERED_TEXT, "o-2")):
            row = await app.fetchrow(query, "acme", "order.created", "{}", event_id, None, None, "order-7")
            assert (row["event_id"], row["stored"]) == (event_id, True)
            row = await app.fetchrow(query, "globex", "order.created", "{}", None, None, None, "order-7")
            assert (row["error_code"], row["error_field"]) == ("WH403", "tenant")
        assert (
            await app.fetchval(
                "SELECT hooklane_publish_v3('acme', 'order.created', '{}', 'o-3', ordering_key => 'order-7')"
            )
            == "o-3"
        )
        assert await store.revoke_publisher(owner, role, None) == (1, 0)
        for query in (TRY_ORDERED, TRY_ORDERED_TEXT):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await app.fetchrow(query, "acme", "order.created", "{}", None, None, None, "order-7")
    finally:
        await app.close()
    seqs = await owner.fetch("SELECT event_id, ordering_seq FROM deliveries ORDER BY ordering_seq")
    assert [tuple(r) for r in seqs] == [("o-1", 1), ("o-2", 2), ("o-3", 3)]


async def test_a_role_granted_before_ordering_keys_may_name_one_after_the_upgrade(fresh_dsn):
    """Migration 0026 grants v3 and v4 to every role holding EXECUTE on v1;
    a role granted nothing gets nothing."""
    granted, bystander = (f"app_{uuid.uuid4().hex[:12]}" for _ in range(2))
    conn = await asyncpg.connect(fresh_dsn)
    try:
        await store.migrate(conn, target=25)
        for role in (granted, bystander):
            await conn.execute(f"CREATE ROLE {role} LOGIN")
        await store.grant_publisher(conn, granted, ["acme"])
        assert [m.version for m in await store.migrate(conn, target=26)] == [26]
        scopes = {s.role: s for s in await store.publisher_scopes(conn)}
        assert scopes == {granted: store.PublisherScope(granted, ("acme",), (True,) * 4)}
        for role, allowed in ((granted, True), (bystander, False)):
            app = await asyncpg.connect(fresh_dsn.replace("postgresql://postgres@", f"postgresql://{role}@"))
            try:
                if allowed:
                    row = await app.fetchrow(TRY_ORDERED, "acme", "a", "{}", "e-1", None, None, "k")
                    assert (row["stored"], row["error_code"]) == (True, None)
                else:
                    with pytest.raises(asyncpg.InsufficientPrivilegeError):
                        await app.fetchrow(TRY_ORDERED_TEXT, "acme", "a", "{}", None, None, None, "k")
            finally:
                await app.close()
        assert await conn.fetchval("SELECT ordering_key FROM events WHERE id = 'e-1'") == "k"
    finally:
        for role in (granted, bystander):
            await conn.execute(f"DROP OWNED BY {role}")
            await conn.execute(f"DROP ROLE {role}")
        await conn.close()
