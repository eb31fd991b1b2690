"""End to end on a real single-node Kubernetes (hack/cluster): the image built
by hack/image, the chart installed by helm, real pods delivering to a real
receiver on the host, against a throwaway PostgreSQL the pods reach through
the node address.

The tests run in file order and share one release: install, deliver, scale,
kill and roll, upgrade, publish through the API's Service, uninstall. Each
can be selected alone (`-k scaling`): the module's fixtures make what it
needs (the release, the namespaces, the signing Secret), and no test reads
what an earlier one left.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import asyncpg
import pytest
from standardwebhooks.webhooks import Webhook

import hooklane
from hooklane import store
from hooklane.dev.postgres import LocalPostgres
from testsupport.fixtures import wait_for
from testsupport.kube_fixtures import WHE_COLUMNS
from testsupport.receivers import Answer, Receiver

ROOT = Path(__file__).resolve().parents[2]
RELEASE = "hooklane"
SYSTEM = "hooklane-system"  # where the chart goes
SHOP = "shop"  # where a user keeps their endpoints
SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
WORKERS = "app.kubernetes.io/instance=hooklane,app.kubernetes.io/component=worker"
OPERATOR = "app.kubernetes.io/instance=hooklane,app.kubernetes.io/component=operator"
API = "app.kubernetes.io/instance=hooklane,app.kubernetes.io/component=api"
# The producers' token, given to the chart in values (it makes the Secret);
# limited to the tenant the API test publishes for.
INGEST_TOKEN = "e2e-" + secrets.token_urlsafe(24)
API_TENANT = "via-api"


@dataclass(frozen=True)
class Cluster:
    kubeconfig: str
    node_ip: str
    pod_cidr: str
    bin_dir: Path
    helm_binary: Path
    env: dict[str, str]

    def run(self, tool: str, *args: str, stdin: str | None = None) -> str:
        """kubectl or helm against this cluster; a failure shows its stderr."""
        argv = [str(self.helm_binary if tool == "helm" else self.bin_dir / tool), *args]
        done = subprocess.run(
            argv, input=stdin, check=False, capture_output=True, text=True, env=self.env, timeout=900
        )
        if done.returncode:
            raise AssertionError(f"{' '.join(argv[:4])} … exited {done.returncode}:\n{done.stderr[-4000:]}")
        return done.stdout

    async def kubectl(self, *args: str, stdin: str | None = None) -> str:
        # In a thread: the receivers answer from this event loop, and a
        # blocked loop would time deliveries out (and have them sent again).
        return await asyncio.to_thread(self.run, "kubectl", *args, stdin=stdin)

    async def helm(self, *args: str) -> str:
        return await asyncio.to_thread(self.run, "helm", *args)


def _why_no_cluster() -> str | None:
    """The machine cannot run a node at all (not a failure of ours): say why.
    Anything else that stops the cluster is a test failure."""
    if os.geteuid() != 0:
        return "hack/cluster needs root (mounts, network namespaces, cgroups, iptables)"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlayfs, which containerd's snapshotter needs"
    if not shutil.which("ip") or not shutil.which("iptables"):
        return "iproute2 and iptables are needed for the pod network"
    return None


def _last_line(argv: list[str], what: str) -> str:
    started = time.monotonic()
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=3600)
    if done.returncode:
        pytest.fail(f"{what} failed ({done.returncode}):\n{done.stderr[-6000:]}", pytrace=False)
    print(f"{what}: {time.monotonic() - started:.1f} s")
    return done.stdout.strip().splitlines()[-1]


def _env_file(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key.removeprefix("export ").strip(): value.strip().strip("'\"") for key, value in pairs}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    reason = _why_no_cluster()
    if reason:
        pytest.skip(f"no cluster on this machine: {reason}")
    tools = Path(_last_line([str(ROOT / "hack/tools/build")], "hack/tools/build"))
    # A cluster someone brought up (to look at a failure, say) stays up.
    found_up = (
        subprocess.run([str(ROOT / "hack/cluster/status")], check=False, capture_output=True).returncode == 0
    )
    kubeconfig = _last_line([str(ROOT / "hack/cluster/up")], "hack/cluster/up")
    try:
        state = _env_file(Path(kubeconfig).parent / "env")
        env = {
            **os.environ,
            "KUBECONFIG": kubeconfig,
            "HELM_PLUGINS": str(tools / "helm-plugins"),
            **{
                k: str(Path(kubeconfig).parent / "helm" / k)
                for k in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")
            },
        }
        yield Cluster(
            kubeconfig=kubeconfig,
            node_ip=state["HOOKLANE_CLUSTER_NODE_IP"],
            pod_cidr=state["HOOKLANE_CLUSTER_POD_CIDR"],
            bin_dir=Path(state["HOOKLANE_CLUSTER_BIN"]),
            helm_binary=tools / "helm",
            env=env,
        )
    finally:
        if not found_up:
            subprocess.run([str(ROOT / "hack/cluster/down")], check=False, capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def image(cluster: Cluster) -> str:
    """Built (or found) by hack/image, which loads it into the node because
    the cluster is up."""
    return _last_line([str(ROOT / "hack/image")], "hack/image")


@pytest.fixture(scope="module")
def database(cluster: Cluster) -> Iterator[tuple[str, str]]:
    """(DSN for the pods, DSN for this test process)."""
    password = secrets.token_hex(12)
    with LocalPostgres(remote={cluster.node_ip: cluster.pod_cidr}, password=password) as pg:
        subprocess.run(
            [
                str(pg.bindir / "createdb"),
                "-h",
                "127.0.0.1",
                "-p",
                str(pg.port),
                "-U",
                "postgres",
                "hooklane",
            ],
            check=True,
            capture_output=True,
        )
        yield (
            f"postgresql://postgres:{password}@{cluster.node_ip}:{pg.port}/hooklane",
            f"postgresql://postgres@127.0.0.1:{pg.port}/hooklane",
        )


@pytest.fixture(scope="module")
def release(cluster: Cluster, image: str, database: tuple[str, str]) -> dict[str, str]:
    """``helm install`` as the README tells users to, with the DSN in a
    Secret; returns the --set values so upgrades can reuse them."""
    pods_dsn, _ = database
    repository, tag = image.rsplit(":", 1)
    cluster.run("kubectl", "create", "namespace", SYSTEM)
    cluster.run("kubectl", "create", "namespace", SHOP)
    cluster.run(
        "kubectl",
        "-n",
        SYSTEM,
        "create",
        "secret",
        "generic",
        "hooklane-database",
        f"--from-literal=url={pods_dsn}",
    )
    values = {
        "image.repository": repository,
        "image.tag": tag,
        "image.pullPolicy": "IfNotPresent",
        "database.existingSecret": "hooklane-database",
        "worker.replicas": "2",
        "api.tokens.ingest[0]": f"{INGEST_TOKEN} tenants={API_TENANT}",
        # The receivers live on the host, behind the node address; everything
        # else stays refused, as in production.
        "config.HOOKLANE_ALLOWED_NETWORKS": f"{cluster.node_ip}/32",
        # Short drains and polls keep the rollout tests quick.
        "worker.drainSeconds": "20",
        "config.HOOKLANE_POLL_SECONDS": "0.2",
        "config.HOOKLANE_OPERATOR_STATUS_SECONDS": "2",
    }
    started = time.monotonic()
    cluster.run(
        "helm",
        "install",
        RELEASE,
        str(ROOT / "charts/hooklane"),
        "--namespace",
        SYSTEM,
        *_set(values),
        "--wait",
        "--timeout",
        "6m",
    )
    print(f"helm install --wait: {time.monotonic() - started:.1f} s")
    return values


@pytest.fixture(scope="module")
def signing(cluster: Cluster, release: dict[str, str]) -> str:
    """The name of the Secret in SHOP holding SECRET, which every endpoint
    of these tests signs with; applied, so that making it again is a no-op."""
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "signing", "namespace": SHOP},
        "stringData": {"secret": SECRET},
    }
    cluster.run("kubectl", "apply", "-f", "-", stdin=json.dumps(secret))
    return "signing"


def _set(values: dict[str, str]) -> list[str]:
    """Settings go to the pods as strings; the chart's own values are typed."""
    return [f"--set{'-string' if k.startswith('config.') else ''}={k}={v}" for k, v in values.items()]


async def _ready_pods(cluster: Cluster, selector: str) -> list[str]:
    pods = json.loads(await cluster.kubectl("-n", SYSTEM, "get", "pods", "-l", selector, "-o", "json"))[
        "items"
    ]
    return [
        p["metadata"]["name"]
        for p in pods
        if p["metadata"].get("deletionTimestamp") is None
        and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
    ]


async def _until(predicate, timeout: float) -> object:
    return await wait_for(predicate, timeout=timeout, interval=0.5)


async def _connect(database: tuple[str, str]) -> asyncpg.Connection:
    return await store.connect(database[1])


async def _apply_endpoint(
    cluster: Cluster, signing: str, name: str, url: str, tenant: str, max_concurrency: int = 4
) -> None:
    manifest = {
        "apiVersion": "hooklane.io/v1alpha1",
        "kind": "WebhookEndpoint",
        "metadata": {"name": name, "namespace": SHOP},
        "spec": {
            "url": url,
            "tenant": tenant,
            "secretRef": {"name": signing, "key": "secret"},
            "maxConcurrency": max_concurrency,
        },
    }
    await cluster.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))


async def _synced(cluster: Cluster, db: asyncpg.Connection, name: str) -> None:
    """The operator stored the endpoint and its secret, and reported it Active."""
    await _until(
        lambda: db.fetchval(
            "SELECT count(*) = 1 FROM endpoints WHERE namespace = $1 AND name = $2 AND secret IS NOT NULL",
            SHOP,
            name,
        ),
        timeout=60,
    )
    await _until(
        lambda: _phase_is(cluster, name, "Active"),
        timeout=60,
    )


async def _phase_is(cluster: Cluster, name: str, phase: str) -> bool:
    return await cluster.kubectl("-n", SHOP, "get", "whe", name, "-o", "jsonpath={.status.phase}") == phase


def _verified(received) -> list[dict]:
    """Every delivery checked with the Standard Webhooks reference verifier."""
    return [Webhook(SECRET).verify(r.body, r.headers) for r in received]


def _partition_holders(db: asyncpg.Connection):
    """Client address of each backend holding a partition lock: one per
    worker pod (pids inside containers are all alike)."""
    return db.fetch(
        """SELECT a.client_addr::text AS pod, count(*) AS n
           FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
           WHERE l.locktype = 'advisory' AND l.classid = $1::int::oid AND l.objsubid = 2 AND l.granted
           GROUP BY a.client_addr""",
        0x686C70,
    )


async def test_helm_install_migrates_then_runs_the_operator_and_two_workers(cluster, release, database):
    db = await _connect(database)
    try:
        # The pre-install hook ran the migrations before any worker started.
        assert await db.fetchval("SELECT partition_count FROM hooklane_config") > 0
    finally:
        await db.close()
    assert len(await _ready_pods(cluster, OPERATOR)) == 1
    assert len(await _ready_pods(cluster, WORKERS)) == 2
    assert len(await _ready_pods(cluster, API)) == 2
    operator = json.loads(await cluster.kubectl("-n", SYSTEM, "get", "pods", "-l", OPERATOR, "-o", "json"))[
        "items"
    ][0]
    spec = operator["spec"]
    # Only the chart's RBAC: the operator runs as the chart's ServiceAccount.
    assert spec["serviceAccountName"] == f"{RELEASE}-operator"
    security = spec["containers"][0]["securityContext"]
    assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
    assert security["capabilities"]["drop"] == ["ALL"]


async def test_an_endpoint_applied_with_kubectl_gets_signed_deliveries(cluster, release, database, signing):
    db = await _connect(database)
    try:
        async with Receiver(host=cluster.node_ip) as receiver:
            await _apply_endpoint(
                cluster, signing, "orders", receiver.on("orders", Answer(204)), tenant="acme"
            )
            await _synced(cluster, db, "orders")
            for i in range(20):
                await hooklane.publish(db, tenant="acme", type="order.created", data={"i": i})
            await _until(lambda: len(receiver.at("orders")) >= 20, timeout=60)
            payloads = _verified(receiver.at("orders"))
        assert sorted(p["data"]["i"] for p in payloads) == list(range(20))
        await _until(
            lambda: db.fetchval(
                "SELECT count(*) = 20 FROM deliveries d JOIN endpoints e ON e.id = d.endpoint_id"
                " WHERE e.name = 'orders' AND d.state = 'delivered'"
            ),
            timeout=30,
        )
    finally:
        await db.close()
    table = await cluster.kubectl("-n", SHOP, "get", "whe", "orders")
    header, row = table.splitlines()[:2]
    assert header.split() == WHE_COLUMNS
    assert row.split()[:5] == ["orders", "acme", receiver.url("orders"), "4", "Active"]
    logs = await cluster.kubectl("-n", SYSTEM, "logs", "-l", OPERATOR, "--tail=-1")
    # A refusal reads "Forbidden" or carries status 403 (kopf writes
    # "status=403"); a bare "403" also matches log timestamps' milliseconds.
    assert not re.search(r"Forbidden|status=403|'code': 403", logs), logs[-3000:]


async def test_scaling_workers_rebalances_partitions_and_keeps_limits_exact(
    cluster, release, database, signing
):
    db = await _connect(database)
    try:
        async with Receiver(host=cluster.node_ip) as receiver:
            limits = {f"scale-{i}": 1 + i % 3 for i in range(6)}
            for name, limit in limits.items():
                await _apply_endpoint(
                    cluster, signing, name, receiver.on(name, Answer(204, delay=0.3)), "scaling", limit
                )
            for name in limits:
                await _synced(cluster, db, name)
            for i in range(30):
                await hooklane.publish(db, tenant="scaling", type="stock.changed", data={"i": i})
            await cluster.kubectl("-n", SYSTEM, "scale", "deployment", f"{RELEASE}-worker", "--replicas=3")
            await _until(lambda: _count_is(_ready_pods(cluster, WORKERS), 3), timeout=120)
            # Three pods hold some partitions before the last of them have
            # moved to the newcomer: every partition is held once, by three.
            total = await db.fetchval("SELECT partition_count FROM hooklane_config")
            await _until(lambda: _holders_are(db, 3, total), timeout=60)
            for i in range(30, 60):
                await hooklane.publish(db, tenant="scaling", type="stock.changed", data={"i": i})
            await cluster.kubectl("-n", SYSTEM, "scale", "deployment", f"{RELEASE}-worker", "--replicas=2")
            await _until(lambda: _count_is(_ready_pods(cluster, WORKERS), 2), timeout=120)
            await _until(lambda: all(len(receiver.at(name)) >= 60 for name in limits), timeout=180)
            await _until(lambda: _holders_are(db, 2, total), timeout=60)
            for name, limit in limits.items():
                ids = Counter(r.headers["webhook-id"] for r in receiver.at(name))
                assert len(ids) == 60 and set(ids.values()) == {1}, f"{name}: lost or repeated"
                assert receiver.peak["/" + name] <= limit, f"{name}: {receiver.peak['/' + name]} > {limit}"
    finally:
        await db.close()


async def _count_is(items, n: int) -> bool:
    return len(await items) == n


async def _holders(db, workers: int):
    rows = await _partition_holders(db)
    return rows if len(rows) == workers else None


async def _holders_are(db, workers: int, total: int) -> bool:
    rows = await _holders(db, workers)
    return rows is not None and sum(r["n"] for r in rows) == total


async def test_a_deleted_pod_and_a_rollout_drain_without_losing_or_repeating(
    cluster, release, database, signing
):
    db = await _connect(database)
    try:
        async with Receiver(host=cluster.node_ip) as receiver:
            await _apply_endpoint(
                cluster, signing, "slow", receiver.on("slow", Answer(204, delay=4.0)), "rolling", 8
            )
            await _synced(cluster, db, "slow")
            for i in range(16):
                await hooklane.publish(db, tenant="rolling", type="invoice.paid", data={"i": i})
            await _until(
                lambda: db.fetchval("SELECT count(*) > 0 FROM deliveries WHERE state = 'sending'"), timeout=60
            )
            victim = (await _ready_pods(cluster, WORKERS))[0]
            await cluster.kubectl("-n", SYSTEM, "delete", "pod", victim, "--wait=false")
            await cluster.kubectl("-n", SYSTEM, "rollout", "restart", f"deployment/{RELEASE}-worker")
            await cluster.kubectl(
                "-n", SYSTEM, "rollout", "status", f"deployment/{RELEASE}-worker", "--timeout=300s"
            )
            await _until(lambda: len(receiver.at("slow")) >= 16, timeout=180)
            await _until(
                lambda: db.fetchval(
                    "SELECT count(*) = 16 FROM deliveries d JOIN endpoints e ON e.id = d.endpoint_id"
                    " WHERE e.name = 'slow' AND d.state = 'delivered'"
                ),
                timeout=60,
            )
            ids = Counter(r.headers["webhook-id"] for r in receiver.at("slow"))
            attempts = await db.fetch(
                "SELECT d.attempts FROM deliveries d JOIN endpoints e ON e.id = d.endpoint_id WHERE e.name = 'slow'"
            )
    finally:
        await db.close()
    assert len(ids) == 16 and set(ids.values()) == {1}, ids
    # Recorded once: a drained delivery is not counted again by its rescuer.
    assert [r["attempts"] for r in attempts] == [1] * 16


async def test_helm_upgrade_rolls_the_workers_with_the_new_value(cluster, release, database, signing):
    await cluster.helm(
        "upgrade",
        RELEASE,
        str(ROOT / "charts/hooklane"),
        "--namespace",
        SYSTEM,
        "--reuse-values",
        "--set-string=config.HOOKLANE_WORKER_CONCURRENCY=64",
        "--wait",
        "--timeout",
        "5m",
    )
    pods = json.loads(await cluster.kubectl("-n", SYSTEM, "get", "pods", "-l", WORKERS, "-o", "json"))[
        "items"
    ]
    live = [p for p in pods if p["metadata"].get("deletionTimestamp") is None]
    assert len(live) == 2
    for pod in live:
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
        assert env.get("HOOKLANE_WORKER_CONCURRENCY") == "64"
    db = await _connect(database)
    try:
        async with Receiver(host=cluster.node_ip) as receiver:
            await _apply_endpoint(
                cluster, signing, "after-upgrade", receiver.on("after", Answer(204)), "upgraded"
            )
            await _synced(cluster, db, "after-upgrade")
            await hooklane.publish(db, tenant="upgraded", type="plan.changed", data={})
            await _until(lambda: len(receiver.at("after")) == 1, timeout=60)
    finally:
        await db.close()


async def _post_event(url: str, event: dict, token: str | None) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = aiohttp.ClientTimeout(total=30, connect=10, sock_read=30)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.post(url, json=event, headers=headers) as response,
    ):
        return response.status, await response.json()


async def test_an_event_posted_through_the_api_service_arrives_signed(cluster, release, database, signing):
    """A producer's path: POST to the API's Service with the token from the
    chart's values, 202 once stored, then a worker delivers it, signed. The
    host is the node, so kube-proxy routes its connection to the ClusterIP
    (no DNS in this cluster: the Service's address, not its name)."""
    address = await cluster.kubectl(
        "-n", SYSTEM, "get", "service", f"{RELEASE}-api", "-o", "jsonpath={.spec.clusterIP}"
    )
    url = f"http://{address}/v1/events"
    event = {"tenant": API_TENANT, "type": "order.created", "data": {"via": "api"}}
    db = await _connect(database)
    try:
        async with Receiver(host=cluster.node_ip) as receiver:
            await _apply_endpoint(
                cluster, signing, "via-api", receiver.on("via-api", Answer(204)), tenant=API_TENANT
            )
            await _synced(cluster, db, "via-api")
            status, body = await _post_event(url, event, token=None)
            assert status == 401, body
            # The token is limited to its tenant.
            status, body = await _post_event(url, {**event, "tenant": "acme"}, INGEST_TOKEN)
            assert status == 403, body
            status, body = await _post_event(url, event, INGEST_TOKEN)
            assert status == 202, body
            # Acknowledged means committed: the event is there already.
            assert await db.fetchval("SELECT count(*) FROM events WHERE id = $1", body["id"]) == 1
            await _until(lambda: len(receiver.at("via-api")) >= 1, timeout=60)
            (payload,) = _verified(receiver.at("via-api"))
            (delivery,) = receiver.at("via-api")
    finally:
        await db.close()
    assert delivery.headers["webhook-id"] == body["id"]
    assert payload["data"] == {"via": "api"}


async def test_helm_uninstall_keeps_the_crd_and_the_endpoints(cluster, release, database, signing):
    db = await _connect(database)
    try:
        # One endpoint of its own at least, whatever else ran before.
        await _apply_endpoint(cluster, signing, "kept", f"http://{cluster.node_ip}:9/kept", "kept")
        await _synced(cluster, db, "kept")
        delivered = await db.fetchval("SELECT count(*) FROM deliveries WHERE state = 'delivered'")
        before = await cluster.kubectl("-n", SHOP, "get", "whe", "-o", "jsonpath={.items[*].metadata.name}")
        await cluster.helm("uninstall", RELEASE, "--namespace", SYSTEM, "--wait", "--timeout", "5m")
        # Helm never deletes what it installed from crds/: deleting the CRD
        # would delete every WebhookEndpoint in the cluster with it.
        await cluster.kubectl("get", "crd", "webhookendpoints.hooklane.io")
        names = (
            await cluster.kubectl("-n", SHOP, "get", "whe", "-o", "jsonpath={.items[*].metadata.name}")
        ).split()
        assert names == before.split() and "kept" in names
        # The database keeps every endpoint and what was delivered to it.
        assert await db.fetchval("SELECT count(*) FROM endpoints") == len(names)
        assert await db.fetchval("SELECT count(*) FROM deliveries WHERE state = 'delivered'") == delivered
    finally:
        await db.close()
    # Pods go after their Deployments, once drained.
    await cluster.kubectl(
        "-n",
        SYSTEM,
        "wait",
        "--for=delete",
        "pods",
        "-l",
        f"app.kubernetes.io/instance={RELEASE}",
        "--timeout=120s",
    )
    left = await cluster.kubectl(
        "-n",
        SYSTEM,
        "get",
        "deployments,pods,serviceaccounts,services,jobs,poddisruptionbudgets,secrets",
        "-l",
        f"app.kubernetes.io/instance={RELEASE}",
        "-o",
        "name",
    )
    assert left.strip() == ""
    cluster_wide = await cluster.kubectl(
        "get", "clusterroles,clusterrolebindings", "-l", f"app.kubernetes.io/instance={RELEASE}", "-o", "name"
    )
    assert cluster_wide.strip() == ""
