"""The Helm chart (charts/hooklane) through the real tools: helm lint and
template, the values schema, the helm-unittest suites and the
PrometheusRule under promtool. Installs against a real kube-apiserver are
tests/kube/test_chart.py's, what needs no tool tests/unit/test_chart.py's.

``hack/tools/build`` builds helm, the helm-unittest plugin and promtool from
their Go modules the first time (minutes), then reuses them; a failed build
fails these tests rather than skipping them. The operator running with the
chart's RBAC is tests/kube/test_operator.py::test_the_chart_rbac_is_enough."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from hooklane.settings import Settings
from hooklane.tokens import Grant, Tokens
from testsupport.chart import CHART, EVERYTHING, REQUIRED, ROOT

PROMTOOL_TESTS = CHART / "tests" / "prometheus"
SCHEMA_ERROR = "values don't meet the specifications of the schema(s)"


def by_kind(docs: list[dict[str, Any]]) -> Counter[str]:
    return Counter(doc["kind"] for doc in docs)


def one(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, (kind, name_suffix, [d["metadata"]["name"] for d in found])
    return found[0]


def pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]
        for d in docs
        if d["kind"] in ("Deployment", "Job")
    }


# --- Chart.yaml, lint, package ------------------------------------------------


@pytest.mark.parametrize("values", [REQUIRED, ["-f", str(EVERYTHING)]], ids=["defaults", "everything"])
def test_lint_is_clean(tools, values):
    done = tools.helm("lint", str(CHART), "--strict", *values)
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


def test_package_holds_the_crd_files_and_no_tests(tools, tmp_path):
    tools.helm("package", str(CHART), "--destination", str(tmp_path))
    (package,) = tmp_path.glob("hooklane-*.tgz")
    with tarfile.open(package) as tar:
        members = {m.name: m for m in tar.getmembers()}
        for crd in (ROOT / "crds").glob("*.yaml"):
            member = members[f"hooklane/crds/{crd.name}"]
            assert member.isfile()  # the link's target, not a link
            assert tar.extractfile(member).read() == crd.read_bytes()
    assert not [name for name in members if name.startswith("hooklane/tests/")]
    # And the package renders like the folder.
    rendered = tools.helm("template", "hooklane", str(package), "--include-crds", *REQUIRED).stdout
    assert "name: webhookendpoints.hooklane.io" in rendered


# --- Rendering ------------------------------------------------------------------


def test_defaults_render_the_operator_workers_api_and_migration(tools):
    docs = tools.render(*REQUIRED)
    assert by_kind(docs) == {
        "ServiceAccount": 4,  # operator, worker, api, migrate (a hook)
        "ClusterRole": 1,
        "ClusterRoleBinding": 1,
        "ClusterKopfPeering": 1,
        "Deployment": 3,
        "Service": 3,  # worker metrics, api, api metrics
        "PodDisruptionBudget": 2,
        "Secret": 1,  # the API's tokens
        "Job": 1,
    }
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == "hooklane"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering"):
            assert doc["metadata"]["namespace"] == "hooklane"

    operator = one(docs, "Deployment", "-operator")
    assert operator["spec"]["replicas"] == 1
    assert operator["spec"]["template"]["spec"]["containers"][0]["args"] == [
        "operator",
        "--all-namespaces",
        "--peering=hooklane",
        "--liveness=http://0.0.0.0:8080/healthz",
    ]
    assert one(docs, "ClusterKopfPeering")["metadata"]["name"] == "hooklane"
    worker = one(docs, "Deployment", "-worker")
    assert worker["spec"]["replicas"] == 2
    assert worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > 70
    job = one(docs, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    # Then every tenant's default catalogue mode, the chart's catalogue.mode.
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["migrate", "--catalogue-mode", "off"]
    api = one(docs, "Deployment", "-api")
    assert api["spec"]["replicas"] == 2
    assert api["spec"]["template"]["spec"]["containers"][0]["args"] == ["api"]
    assert one(docs, "Service", "-api")["spec"]["ports"] == [
        {"name": "http", "port": 80, "targetPort": "http"}
    ]


def test_include_crds_adds_the_repositorys_crds(tools):
    docs = tools.render("--include-crds", *REQUIRED)
    crds = {d["metadata"]["name"]: d for d in docs if d["kind"] == "CustomResourceDefinition"}
    expected = {
        d["metadata"]["name"]: d
        for path in sorted((ROOT / "crds").glob("*.yaml"))
        for d in yaml.safe_load_all(path.read_text())
    }
    assert crds == expected


@pytest.mark.parametrize("values", [REQUIRED, ["-f", str(EVERYTHING)]], ids=["defaults", "everything"])
def test_every_pod_is_locked_down_and_reads_its_settings_once(tools, values):
    specs = pod_specs(tools.render(*values))
    assert len(specs) == 4
    for name, spec in specs.items():
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in spec["volumes"], name
        (container,) = spec["containers"]
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False, name
        assert context["readOnlyRootFilesystem"] is True, name
        assert container["resources"]["requests"] and container["resources"]["limits"], name
        env = [e["name"] for e in container["env"]]
        assert len(env) == len(set(env)), (name, env)
        assert env[0] == "HOOKLANE_DATABASE_URL", name
    # Only the operator talks to the Kubernetes API, and the API when it
    # writes tenants' endpoints there (everything.yaml: portal.endpoints).
    talking = ("-operator", "-api") if values != REQUIRED else ("-operator",)
    assert [n for n, s in specs.items() if s.get("automountServiceAccountToken") is not False] == [
        n for n in specs if n.endswith(talking)
    ]


def test_every_option_renders(tools):
    docs = tools.render("-f", str(EVERYTHING))
    assert by_kind(docs) == {
        "ServiceAccount": 4,
        "ClusterRole": 1,
        "ClusterRoleBinding": 1,
        "Role": 3,  # the operator's in shop and billing, the API's in billing (portal)
        "RoleBinding": 3,
        "KopfPeering": 2,
        "Deployment": 3,
        "Service": 3,
        "PodDisruptionBudget": 2,
        "HorizontalPodAutoscaler": 1,
        "ServiceMonitor": 2,
        "PrometheusRule": 1,
        "NetworkPolicy": 3,
        "Ingress": 1,
        "Job": 1,
    }
    assert {d["metadata"]["name"] for d in docs} <= {
        "hooklane-e2e",
        "hooklane-e2e-operator",
        "hooklane-e2e-worker",
        "hooklane-e2e-worker-metrics",
        "hooklane-e2e-api",
        "hooklane-e2e-api-metrics",
        "hooklane-e2e-migrate",
    }
    assert {
        d["metadata"]["namespace"] for d in docs if d["kind"] in ("Role", "RoleBinding", "KopfPeering")
    } == {
        "shop",
        "billing",
    }
    worker = one(docs, "Deployment", "-worker")
    assert "replicas" not in worker["spec"]  # the HPA's
    spec = worker["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] == 136  # ceil(120.5) + 15
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    assert env["HOOKLANE_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "pg-app", "key": "uri"}
    assert env["HOOKLANE_ENCRYPTION_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "hooklane-keys",
        "key": "ring",
    }
    assert env["HOOKLANE_ALLOWED_NETWORKS"]["value"] == "10.0.0.0/8,fd00::/8"
    assert env["HOOKLANE_EVENT_RETENTION_SECONDS"]["value"] == "2592000"
    assert env["HOOKLANE_METRICS_PORT"]["value"] == "9200"
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert spec["containers"][0]["image"] == "registry.example.com/hooklane:0.2.0-rc.1"
    operator_args = one(docs, "Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert operator_args[1:3] == ["--namespace=shop", "--namespace=billing"]
    api_env = {
        e["name"]: e.get("value")
        for e in one(docs, "Deployment", "-api")["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    portal = Settings.from_env({k: v for k, v in api_env.items() if k.startswith("HOOKLANE_PORTAL_")})
    assert (portal.portal_endpoints, portal.portal_namespace, portal.portal_max_endpoints) == (
        "kubernetes",
        "billing",
        25,
    )
    assert portal.portal_event_types == ("order.*", "invoice.paid")
    assert portal.portal_url_hosts == ("hooks.example.com", "*.receivers.example.net")
    assert portal.portal_https_only is False
    assert (portal.portal_max_concurrency, portal.portal_max_timeout_seconds) == (8, 10)


def _refused(tools, *options: str) -> str:
    """Render the chart with these options, expecting helm to refuse; its stderr."""
    done = tools.helm("template", "hooklane", str(CHART), *options, check=False)
    assert done.returncode != 0
    return done.stderr


def test_without_a_database_secret_nothing_renders(tools):
    assert "database.existingSecret is required" in _refused(tools, *REQUIRED[2:])


def test_without_an_ingest_token_nothing_renders(tools):
    stderr = _refused(tools, *REQUIRED[:2], "--set", "api.tokens.admin[0]=admin-token-0123456789")
    assert "api.tokens.ingest or api.tokens.existingSecret.ingest is required while api.enabled" in stderr


def test_without_the_api_no_token_is_needed(tools):
    docs = tools.render(*REQUIRED[:2], "--set", "api.enabled=false")
    assert not [d["metadata"]["name"] for d in docs if "-api" in d["metadata"]["name"]]
    assert by_kind(docs)["Deployment"] == 2


def test_the_token_file_is_what_the_api_reads(tools):
    """The chart's Secret holds the entries as `hooklane api` parses a token
    file: each token with the tenants it was given, nothing else."""
    (secret,) = tools.render(
        *REQUIRED[:2],
        "--set",
        # --set splits a list at commas: the one between tenants is escaped.
        "api.tokens.ingest={ingest-token-0123456789,scoped-token-0123456789 tenants=acme\\,globex}",
        "--show-only",
        "templates/api-tokens-secret.yaml",
    )
    tokens = Tokens.parse(secret["stringData"]["ingest"], "ingest")
    assert len(tokens) == 2
    assert tokens.check("ingest-token-0123456789") == Grant(None)
    assert tokens.check("scoped-token-0123456789") == Grant(frozenset({"acme", "globex"}))
    assert tokens.check("acme") is None


@pytest.mark.parametrize(
    "setting, error",
    [
        ("worker.replicas=two", "at '/worker/replicas': got string, want integer"),
        ("operator.replicas=true", "at '/operator/replicas': got boolean, want integer"),
        (
            "metrics.serviceMonitor.enabled=yes",
            "at '/metrics/serviceMonitor/enabled': got string, want boolean",
        ),
        ("worker.replica=3", "at '/worker': additional properties 'replica' not allowed"),
        ("workers.replicas=3", "at '': additional properties 'workers' not allowed"),
        ("metrics.prometheusRule.threshold=60", "additional properties 'threshold' not allowed"),
        ("worker.podAntiAffinity=sometimes", "at '/worker/podAntiAffinity': value must be one of"),
        ("config.ALLOWED_NETWORKS=10.0.0.0/8", "'ALLOWED_NETWORKS' does not match pattern"),
        ("config.HOOKLANE_WORKER_CONCURRENCY[0]=1", "at '/config/HOOKLANE_WORKER_CONCURRENCY': got array"),
        ("extraEnv[0].value=x", "at '/extraEnv/0': missing property 'name'"),
        ("operator.watchNamespaces[0]=shop-*", "at '/operator/watchNamespaces/0'"),
        ("metrics.port=0", "at '/metrics/port': minimum"),
        ("api.replicas=two", "at '/api/replicas': got string, want integer"),
        ("api.tokens.ingest[1]=short", "at '/api/tokens/ingest/1': 'short' does not match pattern"),
        ("api.tokens.ingest[1]=a-token-with-a-comma\\,0123", "at '/api/tokens/ingest/1'"),
        ("api.tokens.ingest[1]=scoped-token-0123456789 acme", "at '/api/tokens/ingest/1'"),
        ("api.tokens.admin[0]=admin-token-0123456789 acme", "at '/api/tokens/admin/0'"),
        ("api.tokens.existingSecret.ingest=Producers", "at '/api/tokens/existingSecret/ingest'"),
        ("api.tokens.existingSecret.ingset=producers", "additional properties 'ingset' not allowed"),
        ("api.config.API_POOL_SIZE=20", "'API_POOL_SIZE' does not match pattern"),
        ("api.service.type=ExternalName", "at '/api/service/type': value must be one of"),
        ("api.ingress.paths[0]=v1/events", "at '/api/ingress/paths/0'"),
        ("api.ingress.host=Hooks.Example.com", "at '/api/ingress/host'"),
        ("api.drainSeconds=600", "at '/api/drainSeconds': maximum"),
        ("api.maxConnections=0", "at '/api/maxConnections': minimum"),
        ("api.headerTimeoutSeconds=0", "at '/api/headerTimeoutSeconds'"),
        ("metrics.prometheusRule.apiErrorRatio=5", "at '/metrics/prometheusRule/apiErrorRatio'"),
        ("metrics.prometheusRule.apiAckP99Seconds=0", "at '/metrics/prometheusRule/apiAckP99Seconds'"),
        ("metrics.prometheusRule.horizonAgeSeconds=0", "at '/metrics/prometheusRule/horizonAgeSeconds'"),
        ("metrics.prometheusRule.deadRowsMin=-1", "at '/metrics/prometheusRule/deadRowsMin': minimum"),
        ("networkPolicy.apiFrom=anyone", "at '/networkPolicy/apiFrom': got string, want array"),
        ("portal.endpoints=on", "at '/portal/endpoints': value must be one of"),
        ("portal.namespace=Tenants", "at '/portal/namespace'"),
        ("portal.maxEndpoints=-1", "at '/portal/maxEndpoints': minimum"),
        ("portal.maxConcurrency=257", "at '/portal/maxConcurrency': maximum"),
        ("portal.maxTimeoutSeconds=0", "at '/portal/maxTimeoutSeconds': minimum"),
        ("portal.eventTypes[0]=order.*.x", "at '/portal/eventTypes/0'"),
        ("portal.urlHosts[0]=Hooks.Example.com", "at '/portal/urlHosts/0'"),
        ("portal.urlHosts[0]=hooks..example.com", "at '/portal/urlHosts/0'"),
        ("portal.httpsOnly=no", "at '/portal/httpsOnly': got string, want boolean"),
    ],
)
def test_the_schema_refuses_wrong_types_and_unknown_keys(tools, setting, error):
    stderr = _refused(tools, *REQUIRED, "--set", setting)
    assert SCHEMA_ERROR in stderr and error in stderr, stderr


@pytest.mark.parametrize(
    "setting, value",
    [
        ("config.HOOKLANE_DRAIN_SECONDS=20", "worker.drainSeconds"),
        ("config.HOOKLANE_DATABASE_URL=postgresql://x", "database.existingSecret"),
        ("extraEnv[0].name=HOOKLANE_METRICS_PORT", "metrics.port"),
        ("extraEnv[0].name=HOOKLANE_ENCRYPTION_KEY", "encryptionKey.existingSecret"),
        ("config.HOOKLANE_API_PORT=9000", "api.port"),
        ("api.config.HOOKLANE_API_DRAIN_SECONDS=1", "api.drainSeconds"),
        ("config.HOOKLANE_API_HEADER_TIMEOUT_SECONDS=1", "api.headerTimeoutSeconds"),
        ("api.config.HOOKLANE_API_TOKENS_FILE=/t", "api.tokens.ingest"),
        ("extraEnv[0].name=HOOKLANE_ADMIN_TOKENS", "api.tokens.admin"),
        ("api.config.HOOKLANE_PORTAL_ENDPOINTS=local", "portal.endpoints"),
        ("config.HOOKLANE_PORTAL_URL_HOSTS=example.com", "portal.urlHosts"),
    ],
)
def test_settings_the_chart_owns_are_refused_elsewhere(tools, setting, value):
    stderr = _refused(tools, *REQUIRED, "--set", setting)
    assert f"is set by the chart from {value}: set that value instead of config or extraEnv" in stderr


# --- helm-unittest --------------------------------------------------------------


def test_helm_unittest_suites_pass_and_cover_every_template(tools):
    suites = sorted((CHART / "tests").glob("*_test.yaml"))
    covered = {t for s in suites for t in yaml.safe_load(s.read_text())["templates"]}
    templates = {f"templates/{p.name}" for p in (CHART / "templates").iterdir() if not p.name.startswith("_")}
    assert templates - covered == set()
    done = tools.helm("unittest", "--strict", str(CHART))
    assert f"Test Suites: {len(suites)} passed, {len(suites)} total" in done.stdout, done.stdout


# --- PrometheusRule under promtool ---------------------------------------------


@pytest.fixture
def rules_dir(tools, tmp_path) -> Path:
    """The chart's rules as promtool reads them, beside copies of the
    promtool tests, which name them rules.yaml."""
    (rule,) = tools.render(
        "--show-only",
        "templates/prometheusrule.yaml",
        "--set",
        "metrics.prometheusRule.enabled=true",
        *REQUIRED,
    )
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
    for test in PROMTOOL_TESTS.glob("*_test.yaml"):
        shutil.copy(test, tmp_path)
    return tmp_path


def test_promtool_accepts_the_rules(tools, rules_dir):
    done = tools.run("promtool", "check", "rules", str(rules_dir / "rules.yaml"))
    assert "SUCCESS: 10 rules found" in done.stdout, done.stdout


def test_every_alert_is_shown_to_fire_and_to_stay_quiet(tools, rules_dir):
    alerts = {
        r["alert"]
        for g in yaml.safe_load((rules_dir / "rules.yaml").read_text())["groups"]
        for r in g["rules"]
    }
    fires, quiet = set(), set()
    for test_file in PROMTOOL_TESTS.glob("*_test.yaml"):
        for test in yaml.safe_load(test_file.read_text())["tests"]:
            for case in test["alert_rule_test"]:
                (fires if case["exp_alerts"] else quiet).add(case["alertname"])
    assert fires == alerts and quiet == alerts
    tests = sorted(p.name for p in rules_dir.glob("*_test.yaml"))
    done = subprocess.run(
        [str(tools.folder / "promtool"), "test", "rules", *tests],
        cwd=rules_dir,
        env=tools.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


# --- The operator's RBAC -----------------------------------------------------------

# What the operator may do, and nothing else: no get, create, update or delete
# on anything but the Events it posts, and Secrets read-only.
ALLOWED_VERBS = {
    "webhookendpoints": {"list", "watch", "patch"},
    "webhookendpoints/status": {"patch"},
    "webhookeventtypes": {"list", "watch", "patch"},
    "webhookeventtypes/status": {"patch"},
    "secrets": {"list", "watch"},
    "events": {"create"},
    "clusterkopfpeerings": {"list", "watch", "patch"},
    "kopfpeerings": {"list", "watch", "patch"},
    "customresourcedefinitions": {"list", "watch"},
    "namespaces": {"list", "watch"},
}


def grants(*roles: dict[str, Any]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for role in roles:
        for rule in role["rules"]:
            for resource in rule["resources"]:
                out.setdefault(resource, set()).update(rule["verbs"])
    return out


def test_operator_rbac_across_the_cluster(tools):
    docs = tools.render("--show-only", "templates/operator-rbac.yaml", *REQUIRED)
    assert [d["kind"] for d in docs] == ["ClusterRole", "ClusterRoleBinding"]
    assert grants(docs[0]) == {
        k: v for k, v in ALLOWED_VERBS.items() if k not in ("kopfpeerings", "namespaces")
    }
    assert docs[1]["subjects"] == [
        {"kind": "ServiceAccount", "name": "hooklane-operator", "namespace": "hooklane"}
    ]


def test_operator_rbac_for_some_namespaces(tools):
    docs = tools.render(
        "--show-only",
        "templates/operator-rbac.yaml",
        "--set",
        "operator.watchNamespaces={shop,billing}",
        *REQUIRED,
    )
    cluster_role = one(docs, "ClusterRole")
    assert grants(cluster_role) == {
        "webhookeventtypes": {"list", "watch", "patch"},
        "webhookeventtypes/status": {"patch"},
        "customresourcedefinitions": {"list", "watch"},
        "namespaces": {"list", "watch"},
    }
    roles = [d for d in docs if d["kind"] == "Role"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["billing", "shop"]
    for role in roles:
        assert grants(role) == {
            k: v
            for k, v in ALLOWED_VERBS.items()
            if k
            not in (
                "clusterkopfpeerings",
                "customresourcedefinitions",
                "namespaces",
                "webhookeventtypes",
                "webhookeventtypes/status",
            )
        }
    bindings = [d for d in docs if d["kind"] == "RoleBinding"]
    assert {(b["metadata"]["namespace"], b["roleRef"]["kind"], b["roleRef"]["name"]) for b in bindings} == {
        ("shop", "Role", "hooklane-operator"),
        ("billing", "Role", "hooklane-operator"),
    }


# --- Against a real kube-apiserver ---------------------------------------------------
