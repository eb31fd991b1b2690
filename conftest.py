"""The plugins of every test run: the tiers' checks (tests/tiers.py) and
the fixtures tests share (testsupport/)."""

pytest_plugins = [
    "tests.tiers",
    "testsupport.fixtures",
    "testsupport.kube_fixtures",
    "testsupport.chart",
    "testsupport.dashboard",
    "testsupport.selfservice",
]
