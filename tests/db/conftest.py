"""The db tier (pyproject.toml's markers): one PostgreSQL (the session's)
and loopback servers in this process: needs the Postgres server binaries."""

from tests.tiers import folder

pytest_itemcollected = folder("db")
