"""Every statement of queries.sql prepares on a real Postgres with as many
parameters as it names."""

from __future__ import annotations

from hooklane.store.queries import QUERIES


async def test_every_statement_prepares_with_as_many_parameters_as_it_names(db):
    for name, query in QUERIES.items():
        statement = await db.prepare(query.sql)
        assert len(statement.get_parameters()) == len(query.params), name
