"""The plugins of every test run: the tiers' checks (tests/tiers.py) and
the fixtures tests share (testsupport/)."""

pytest_plugins = [
    "tests.tiers",
    "testsupport.fixtures",
    "testsupport.kube_fixtures",
    "testsupport.chart",
    "testsupport.dashboard",
    "testsupport.selfservice",
    "testsupport.api_admin",
    "testsupport.bench_smoke",
    "testsupport.destination_guard",
    "testsupport.tracing",
]
