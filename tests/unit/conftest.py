"""The unit tier (pyproject.toml's markers): pure and fast: no Postgres, no
process, no network, no Go (`hack/test -m unit`)."""

from tests.tiers import folder

pytest_itemcollected = folder("unit")
