"""The processes tier (pyproject.toml's markers): also starts processes
(hooklane's commands, workers, the API, a Postgres of its own, a shell, the
publishing examples: Go, Node.js, psql)."""

from tests.tiers import folder

pytest_itemcollected = folder("processes")
