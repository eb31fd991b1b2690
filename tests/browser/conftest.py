"""The browser tier (pyproject.toml's markers): also drives Debian's
chromium through Playwright (the dashboard and the portal)."""

from tests.tiers import folder

pytest_itemcollected = folder("browser")
