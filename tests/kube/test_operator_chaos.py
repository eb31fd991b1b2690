"""Chaos for the operator (issue 7): ``hooklane operator`` SIGKILLed, the API
server restarted and PostgreSQL restarted, each several times while
WebhookEndpoints are created, edited and deleted.

After every fault the endpoints table must match the resources exactly (no
row lost, none orphaned, every spec field right), every resource must carry
its status (phase, observedGeneration, Ready), and none may be stuck in
deletion. Everything is real and on loopback: the operator runs as a
process, exactly as deployed; the module has a kube-apiserver + etcd and a
PostgreSQL of its own, because it restarts them.

Each test prints one row of figures (faults, changes, lost/stuck, time to
converge after each fault); the module prints the table at its end, and
appends it to the file named by ``HOOKLANE_CHAOS_REPORT`` when set. The
random choices come from ``HOOKLANE_CHAOS_SEED`` when set, else a fresh seed
that the failure message shows, so a failing run can be replayed.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import json
import os
import random
import re
import shutil
import signal
import ssl
import statistics
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
import yaml

from hooklane import store
from hooklane.crd import GROUP, PLURAL, VERSION
from hooklane.dev.controlplane import ControlPlaneError
from hooklane.dev.postgres import LocalPostgres
from hooklane.operator.handlers import FINALIZER
from hooklane.spec import API_VERSION, KIND
from testsupport.fixtures import SECRET
from testsupport.kube_fixtures import Operator, RestartableControlPlane

pytestmark = pytest.mark.chaos

GROUP_PATH = f"/apis/{GROUP}/{VERSION}"
SECRET_NAME = "chaos-signing"
FIELD_MANAGER = "hooklane-chaos"
# About this many resources live at any moment; every burst creates, edits
# and deletes around it.
POPULATION = 30
# A healthy convergence takes seconds (see the figures); this leaves room
# for a loaded CI machine, and catches a deletion stuck for one of kopf's
# 60 s waits (the operator sets cancellation_polling to 1 s to avoid them).
CONVERGE_TIMEOUT = 30.0
# Status passes once a second: 30 resources stay cheap on two shared cores,
# and the sync handler writes observedGeneration itself anyway.
STATUS_SECONDS = "1"
# A restarted API server once left the resources' watch open and silent (CI,
# 2026-12-02: five changes unserved 30 s later, no error logged); kopf drops
# such a watch after this much silence, so that it is resumed well within
# CONVERGE_TIMEOUT. 70 s, the default, would outlast it.
WATCH_IDLE_SECONDS = "10"
# kopf logs this when it gives a handler up for good: nothing may be.
GAVE_UP = re.compile(r"failed permanently")
# A handler error that is not a kopf.TemporaryError is retried only after
# kopf's default back-off of 60 s: counted, as it shows in convergence time.
UNTYPED = re.compile(r"failed with an exception")

_PR_SET_PDEATHSIG = 1


# --------------------------------------------------------------------------
# Figures


@dataclass
class Figures:
    """What one scenario measured, for docs/reliability.md."""

    scenario: str
    seed: int
    faults: int = 0
    creates: int = 0
    updates: int = 0
    deletes: int = 0
    operator_exits: int = 0
    lost: int = 0
    stuck: int = 0
    orphans: int = 0
    # Handler failures kopf retries after 60 s instead of 5 (see UNTYPED).
    untyped_errors: int = 0
    # Seconds from the end of each fault (operator restarted, API server
    # ready, Postgres accepting connections) to convergence.
    converge: list[float] = field(default_factory=list)
    # Seconds each fault lasted (operator down, API server unreachable,
    # Postgres restarting).
    outage: list[float] = field(default_factory=list)

    @property
    def changes(self) -> int:
        return self.creates + self.updates + self.deletes

    HEADER = (
        "| scenario | faults | resources changed (create/update/delete) | lost | stuck in deletion "
        "| orphan rows | operator exits | untyped handler errors | outage per fault, s "
        "| converge after fault: median / max, s | each, s |\n|---|---|---|---|---|---|---|---|---|---|---|"
    )

    def row(self) -> str:
        each = ", ".join(f"{t:.1f}" for t in self.converge)
        outage = f"{min(self.outage):.1f}-{max(self.outage):.1f}" if self.outage else "-"
        converge = (
            f"{statistics.median(self.converge):.1f} / {max(self.converge):.1f}" if self.converge else "-"
        )
        return (
            f"| {self.scenario} | {self.faults} | {self.changes} ({self.creates}/{self.updates}/{self.deletes}) "
            f"| {self.lost} | {self.stuck} | {self.orphans} | {self.operator_exits} | {self.untyped_errors} "
            f"| {outage} "
            f"| {converge} | {each} |"
        )


@pytest.fixture(scope="module")
def chaos_report(request: pytest.FixtureRequest) -> Iterator[list[Figures]]:
    """Collects each scenario's figures; shown (and saved) once at the end."""
    rows: list[Figures] = []
    yield rows
    if not rows:
        return
    table = "\n".join([Figures.HEADER, *(f.row() for f in rows)])
    seeds = ", ".join(f"{f.scenario}: {f.seed}" for f in rows)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        # Teardown output is captured like the tests'; this is for the terminal.
        with capture.global_and_fixture_disabled():
            reporter.write_line("")
            reporter.write_line(f"operator chaos figures (seeds {seeds}):")
            for line in table.splitlines():
                reporter.write_line(line)
    target = os.environ.get("HOOKLANE_CHAOS_REPORT")
    if target:
        with open(target, "a") as out:
            out.write(f"<!-- seeds {seeds} -->\n{table}\n\n")


@pytest.fixture
def seed() -> int:
    return int(os.environ.get("HOOKLANE_CHAOS_SEED") or random.randrange(2**32))


# --------------------------------------------------------------------------
# PostgreSQL of the module's own


class ChaosPostgres(LocalPostgres):
    """A durable LocalPostgres that can also stay down for a while:
    ``restart(mode)`` is over as soon as the server is back, and the chaos
    wants an outage long enough for handlers to fail and wait out their
    retry. Durable, because a crash (-m immediate) of the fast throwaway
    server loses commits it had acknowledged (synchronous_commit=off), and
    the operator would be blamed for Postgres forgetting."""

    def __init__(self) -> None:
        super().__init__(durable=True)

    def _pg_ctl(self, *args: str) -> None:
        self._run(
            str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-l", str(self.dir / "server.log"), *args
        )

    def stop_server(self, mode: str) -> None:
        """Stop it, keeping its data (``stop()`` removes everything)."""
        self._pg_ctl("-m", mode, "-w", "stop")

    def start_again(self) -> None:
        # pg_ctl start does not reuse the options of the last run (restart
        # does, from postmaster.opts): read them back from there.
        argv = [a.strip('"') for a in (self.datadir / "postmaster.opts").read_text().split()[1:]]
        options = [a for i, a in enumerate(argv) if a != "-D" and (i == 0 or argv[i - 1] != "-D")]
        self._pg_ctl("-o", " ".join(options), "-w", "-t", "60", "start")
        self._wait_ready()


@pytest.fixture(scope="module")
def chaos_pg() -> Iterator[ChaosPostgres]:
    """Not the session's pg_server: other tests share that one, and this
    module restarts its server."""
    with ChaosPostgres() as pg:

        async def migrate() -> None:
            conn = await asyncpg.connect(pg.dsn)
            try:
                await store.migrate(conn)
            finally:
                await conn.close()

        # On a thread of its own: asyncio.run on this one would unset the
        # event loop pytest-asyncio may already have made current.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, migrate()).result()
        yield pg


# --------------------------------------------------------------------------
# The Kubernetes API, without a kubectl process per call


class Api:
    """HTTPS with the control plane's admin client certificate, through one
    aiohttp session: the churn and the convergence polls make hundreds of
    calls, and a kubectl process each would eat the two shared cores."""

    RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})

    def __init__(self, kubeconfig: Path, folder: Path) -> None:
        config = yaml.safe_load(kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        self.server: str = cluster["server"]
        cert, key = folder / "chaos-client.crt", folder / "chaos-client.key"
        cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
        key.write_bytes(base64.b64decode(user["client-key-data"]))
        key.chmod(0o600)
        self._ssl = ssl.create_default_context(
            cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
        )
        self._ssl.load_cert_chain(str(cert), str(key))
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Api:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._session is not None
        await self._session.close()

    async def call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, Any]:
        """One attempt: (HTTP status, decoded body). Connection failures raise."""
        assert self._session is not None
        data = json.dumps(body) if body is not None else None
        headers = {"Content-Type": content_type} if data else {}
        async with self._session.request(
            method, self.server + path, data=data, headers=headers, ssl=self._ssl
        ) as resp:
            return resp.status, await resp.json(content_type=None)

    async def until_done(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        ok: frozenset[int],
        content_type: str = "application/json",
        timeout: float = 120.0,
    ) -> Any:
        """Retry through an unreachable or restarting API server. Only for
        idempotent calls (apply, delete, get): a request cut off mid-way may
        or may not have taken effect, and is simply sent again."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                status, payload = await self.call(method, path, body, content_type)
                if status in ok:
                    return payload
                if status not in self.RETRY_STATUSES:
                    raise AssertionError(f"{method} {path}: HTTP {status}: {payload}")
            except (TimeoutError, aiohttp.ClientError):
                pass
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"{method} {path}: API server unreachable for {timeout:.0f} s")
            await asyncio.sleep(0.2)

    async def apply_endpoint(self, namespace: str, name: str, spec: dict[str, Any]) -> None:
        """Server-side apply: creates or updates, and sending it twice is a no-op."""
        doc = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }
        await self.until_done(
            "PATCH",
            f"{GROUP_PATH}/namespaces/{namespace}/{PLURAL}/{name}?fieldManager={FIELD_MANAGER}&force=true",
            doc,
            ok=frozenset({200, 201}),
            content_type="application/apply-patch+yaml",
        )

    async def delete_endpoint(self, namespace: str, name: str) -> None:
        # 404 is success too: a retried delete may find it already finalised.
        await self.until_done(
            "DELETE",
            f"{GROUP_PATH}/namespaces/{namespace}/{PLURAL}/{name}",
            ok=frozenset({200, 202, 404}),
        )

    async def endpoints(self, namespace: str) -> list[dict[str, Any]]:
        status, payload = await self.call("GET", f"{GROUP_PATH}/namespaces/{namespace}/{PLURAL}")
        if status != 200:
            raise aiohttp.ClientError(f"list returned HTTP {status}")
        return payload["items"]

    async def create_secret(self, namespace: str) -> None:
        doc = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET_NAME},
            "type": "Opaque",
            "data": {"secret": base64.b64encode(SECRET.encode()).decode()},
        }
        # 409: a retried create whose first answer was lost.
        await self.until_done(
            "POST", f"/api/v1/namespaces/{namespace}/secrets", doc, ok=frozenset({201, 409})
        )


# --------------------------------------------------------------------------
# The operator as a process, restartable like a Deployment's Pod


@pytest.fixture
def operators(
    restartable_control_plane: RestartableControlPlane,
    chaos_pg: ChaosPostgres,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[Callable[[str], Operator]]:
    """Start an operator for a namespace; every one started is stopped at
    the end, pass or fail, and its log tail printed (shown on failure). The
    whole logs are kept in ``HOOKLANE_CHAOS_LOGS`` when it names a folder."""
    started: list[Operator] = []
    env = {
        # The test's own HOOKLANE_CHAOS_* knobs are no operator settings (it
        # would warn about each).
        **{k: v for k, v in os.environ.items() if not k.startswith("HOOKLANE_CHAOS_")},
        "KUBECONFIG": str(restartable_control_plane.kubeconfig),
        "HOOKLANE_DATABASE_URL": chaos_pg.dsn,
        "HOOKLANE_OPERATOR_STATUS_SECONDS": STATUS_SECONDS,
        "HOOKLANE_OPERATOR_WATCH_IDLE_SECONDS": WATCH_IDLE_SECONDS,
    }

    def start(namespace: str) -> Operator:
        op = Operator(
            tmp_path / f"operator-{len(started)}.log", ["--standalone", "--namespace", namespace], env
        )
        started.append(op)
        return op

    try:
        yield start
    finally:
        for op in started:
            op.stop()
        for op in started[-3:]:
            print(f"--- {op.log.name} (exit {op.proc.returncode}) ---\n{op.output()[-5000:]}")
        if keep := os.environ.get("HOOKLANE_CHAOS_LOGS"):
            Path(keep).mkdir(parents=True, exist_ok=True)
            for op in started:
                shutil.copy(op.log, Path(keep) / f"{request.node.name}-{uuid.uuid4().hex[:6]}-{op.log.name}")


@pytest.fixture
async def api(restartable_control_plane: RestartableControlPlane, tmp_path: Path) -> AsyncIterator[Api]:
    async with Api(restartable_control_plane.kubeconfig, tmp_path) as client:
        yield client


@pytest.fixture
async def namespace(
    restartable_control_plane: RestartableControlPlane, api: Api, request: pytest.FixtureRequest
) -> str:
    """A namespace per scenario holding the signing Secret every endpoint
    refers to. Never deleted: no controller manager would finish it."""
    stem = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].rstrip("-")
    name = f"{stem}-{uuid.uuid4().hex[:6]}"
    restartable_control_plane.create_namespace(name)
    await api.create_secret(name)
    return name


# --------------------------------------------------------------------------
# Churn: what the resources should be, and changing them


class Churn:
    """Creates, edits and deletes WebhookEndpoints and keeps the model of
    what each one's spec now is. Names are never reused, so a late apply can
    never land on a resource that is still finalising."""

    def __init__(self, api: Api, namespace: str, rng: random.Random, figures: Figures) -> None:
        self.api = api
        self.namespace = namespace
        self.rng = rng
        self.figures = figures
        self.model: dict[str, dict[str, Any]] = {}
        self._serial = 0

    def _spec(self) -> dict[str, Any]:
        self._serial += 1
        return {
            # A fresh URL on every write, so every edit changes the spec
            # (and its generation); port 9 (discard) is never called here.
            "url": f"http://127.0.0.1:9/hooks/{self._serial}",
            "tenant": self.rng.choice(["acme", "globex", "initech"]),
            "secretRef": {"name": SECRET_NAME, "key": "secret"},
            "maxConcurrency": self.rng.randint(1, 16),
            "eventTypes": self.rng.choice([["order.*"], [], ["invoice.paid", "order.*"]]),
            "timeoutSeconds": self.rng.randint(1, 30),
            "paused": self.rng.random() < 0.2,
        }

    async def create(self) -> None:
        name = f"ep-{self._serial:04d}"
        spec = self._spec()
        await self.api.apply_endpoint(self.namespace, name, spec)
        self.model[name] = spec
        self.figures.creates += 1

    async def update(self) -> None:
        name = self.rng.choice(sorted(self.model))
        spec = {**self.model[name], **self._spec()}
        # Keep some fields as they were: partial edits are the common case.
        for key in self.rng.sample(["tenant", "maxConcurrency", "eventTypes", "timeoutSeconds", "paused"], 2):
            spec[key] = self.model[name][key]
        await self.api.apply_endpoint(self.namespace, name, spec)
        self.model[name] = spec
        self.figures.updates += 1

    async def delete(self) -> None:
        name = self.rng.choice(sorted(self.model))
        # Out of the model before the call: once sent, it is meant to go.
        del self.model[name]
        await self.api.delete_endpoint(self.namespace, name)
        self.figures.deletes += 1

    async def populate(self) -> None:
        for _ in range(POPULATION):
            await self.create()

    async def burst(self, changes: int) -> None:
        """``changes`` random changes a few tens of milliseconds apart,
        keeping the population around POPULATION."""
        for _ in range(changes):
            if len(self.model) < POPULATION - 5:
                op = self.create
            elif len(self.model) > POPULATION + 5:
                op = self.delete
            else:
                op = self.rng.choices([self.create, self.update, self.delete], weights=[1, 2, 1])[0]
            await op()
            await asyncio.sleep(self.rng.uniform(0.0, 0.08))


# --------------------------------------------------------------------------
# Convergence


@dataclass
class Divergence:
    """Every way the resources, their status and the table disagree with
    the model. Empty everywhere means converged."""

    missing_rows: list[str] = field(default_factory=list)  # resource without its row: lost
    wrong_rows: list[str] = field(default_factory=list)  # row with a stale spec: lost update
    orphan_rows: list[str] = field(default_factory=list)  # row without a resource
    stuck: list[str] = field(default_factory=list)  # resource still Terminating
    lost_resources: list[str] = field(default_factory=list)  # in the model, not in the API
    unexpected: list[str] = field(default_factory=list)  # in the API, not in the model
    no_status: list[str] = field(default_factory=list)  # status missing or stale
    unreachable: str | None = None

    def empty(self) -> bool:
        return self.unreachable is None and not any(
            (
                self.missing_rows,
                self.wrong_rows,
                self.orphan_rows,
                self.stuck,
                self.lost_resources,
                self.unexpected,
                self.no_status,
            )
        )

    def __str__(self) -> str:
        if self.unreachable:
            return f"unreachable: {self.unreachable}"
        parts = {k: v for k, v in self.__dict__.items() if v}
        return "; ".join(f"{k}: {sorted(v)[:8]}{' ...' if len(v) > 8 else ''}" for k, v in parts.items())


def _status_problem(item: dict[str, Any], spec: dict[str, Any]) -> str | None:
    meta, status = item["metadata"], item.get("status") or {}
    generation = meta.get("generation")
    if FINALIZER not in (meta.get("finalizers") or []):
        return "no finalizer"
    if status.get("observedGeneration") != generation:
        return f"observedGeneration {status.get('observedGeneration')} != {generation}"
    expected_phase = "Paused" if spec["paused"] else "Active"
    if status.get("phase") != expected_phase:
        return f"phase {status.get('phase')} != {expected_phase}"
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    if not ready or ready.get("status") != "True" or ready.get("observedGeneration") != generation:
        return f"Ready {ready}"
    return None


def _row_matches(row: asyncpg.Record, spec: dict[str, Any]) -> bool:
    return (
        row["tenant"] == spec["tenant"]
        and row["url"] == spec["url"]
        and row["secret"] == SECRET
        and row["max_concurrency"] == spec["maxConcurrency"]
        and list(row["event_types"]) == spec["eventTypes"]
        and row["timeout_seconds"] == spec["timeoutSeconds"]
        and row["paused"] == spec["paused"]
    )


async def divergence(api: Api, dsn: str, namespace: str, model: dict[str, dict[str, Any]]) -> Divergence:
    found = Divergence()
    try:
        items = await api.endpoints(namespace)
    except (TimeoutError, aiohttp.ClientError) as exc:
        found.unreachable = f"API server: {exc!r}"
        return found
    try:
        # A fresh connection each time: the test's own view of Postgres must
        # not depend on a connection that a restart broke.
        conn = await asyncpg.connect(dsn, timeout=3)
        try:
            rows = {
                r["name"]: r
                for r in await conn.fetch("SELECT * FROM endpoints WHERE namespace = $1", namespace)
            }
        finally:
            await conn.close()
    except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        found.unreachable = f"Postgres: {exc!r}"
        return found

    live = {}
    for item in items:
        name = item["metadata"]["name"]
        if item["metadata"].get("deletionTimestamp"):
            found.stuck.append(name)
        else:
            live[name] = item
    for name, spec in model.items():
        if name not in live:
            found.lost_resources.append(name)
            continue
        if live[name]["spec"] != spec:
            found.lost_resources.append(f"{name} (spec in the API differs)")
        if name not in rows:
            found.missing_rows.append(name)
        elif not _row_matches(rows[name], spec):
            found.wrong_rows.append(name)
        if (problem := _status_problem(live[name], spec)) is not None:
            found.no_status.append(f"{name}: {problem}")
    found.unexpected = [n for n in live if n not in model]
    found.orphan_rows = [n for n in rows if n not in model]
    return found


async def converge(
    api: Api,
    dsn: str,
    churn: Churn,
    since: float,
    check: Callable[[], None],
    timeout: float = CONVERGE_TIMEOUT,
) -> float:
    """Poll until the model, the API and Postgres agree; return the seconds
    since ``since`` (a loop.time()). ``check`` runs each round to fail fast
    (an operator that exited)."""
    loop = asyncio.get_running_loop()
    last = Divergence()
    while loop.time() - since < timeout:
        check()
        last = await divergence(api, dsn, churn.namespace, churn.model)
        if last.empty():
            return loop.time() - since
        await asyncio.sleep(0.1)
    churn.figures.lost = len(last.missing_rows) + len(last.wrong_rows) + len(last.lost_resources)
    churn.figures.stuck = len(last.stuck)
    churn.figures.orphans = len(last.orphan_rows)
    raise AssertionError(f"not converged {timeout:.0f} s after the fault (seed {churn.figures.seed}): {last}")


def _handling(output: str) -> bool:
    return "Handler 'sync'" in output or "resources compared with Postgres" in output


async def wait_until(predicate: Callable[[], Awaitable[bool] | bool], timeout: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if not isinstance(value, bool):
            value = await value
        if value:
            return
        if loop.time() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        await asyncio.sleep(0.1)


def _rode_through(op: Operator, figures: Figures) -> Callable[[], None]:
    def check() -> None:
        if not op.alive():
            figures.operator_exits += 1
            raise AssertionError(f"the operator exited with {op.proc.returncode}:\n{op.output()[-3000:]}")

    return check


def _nothing_given_up(ops: list[Operator], figures: Figures) -> None:
    for op in ops:
        output = op.output()
        match = GAVE_UP.search(output)
        assert match is None, f"{op.log.name}: {match.group(0)}:\n{output[-3000:]}"
        figures.untyped_errors += len(UNTYPED.findall(output))


# --------------------------------------------------------------------------
# Scenarios


KILLS = 4


async def test_operator_sigkilled_while_reconciling(
    api: Api,
    namespace: str,
    chaos_pg: ChaosPostgres,
    operators: Callable[[str], Operator],
    seed: int,
    chaos_report: list[Figures],
) -> None:
    """A Deployment's Pod killed (OOM, node loss) mid-work, KILLS times:
    no cleanup runs, kopf's progress annotations may be half-written, and
    changes, deletions included, keep arriving while no operator runs."""
    figures = Figures("operator SIGKILLed while reconciling", seed)
    rng = random.Random(seed)
    churn = Churn(api, namespace, rng, figures)
    loop = asyncio.get_running_loop()
    incarnations = [operators(namespace)]
    await churn.populate()

    for _ in range(KILLS):
        op = incarnations[-1]
        # Once this incarnation handles resources (its startup alone takes
        # a second or two), changes start, and it dies a random moment into
        # them, with handlers in flight; the changes go on while it is down.
        # A restarted one upserts nothing unchanged: its first status pass
        # compares every resource with Postgres and says so.
        await wait_until(lambda op=op: _handling(op.output()), 60, "operator handling resources")
        burst = asyncio.create_task(churn.burst(12))
        await asyncio.sleep(rng.uniform(0.1, 0.6))
        op.kill()
        killed = loop.time()
        await burst
        # Down for a moment, as a Pod's replacement is scheduled.
        await asyncio.sleep(rng.uniform(0.0, 1.0))
        incarnations.append(operators(namespace))
        restarted = loop.time()
        figures.faults += 1
        figures.outage.append(restarted - killed)
        figures.converge.append(
            await converge(api, chaos_pg.dsn, churn, restarted, _rode_through(incarnations[-1], figures))
        )

    _nothing_given_up(incarnations, figures)
    chaos_report.append(figures)
    print(Figures.HEADER, figures.row(), sep="\n")


APISERVER_RESTARTS = 3


async def _settled_population(
    label: str,
    api: Api,
    namespace: str,
    chaos_pg: ChaosPostgres,
    operators: Callable[[str], Operator],
    seed: int,
) -> tuple[Figures, random.Random, Churn, Operator, Callable[[], None]]:
    """An operator for ``namespace`` and a population of endpoints it has
    converged on: the state each fault scenario starts from."""
    figures = Figures(label, seed)
    rng = random.Random(seed)
    churn = Churn(api, namespace, rng, figures)
    op = operators(namespace)
    rode_through = _rode_through(op, figures)
    await churn.populate()
    await converge(api, chaos_pg.dsn, churn, asyncio.get_running_loop().time(), rode_through)
    return figures, rng, churn, op, rode_through


async def test_apiserver_restarted_under_the_operator(
    api: Api,
    namespace: str,
    chaos_pg: ChaosPostgres,
    restartable_control_plane: RestartableControlPlane,
    operators: Callable[[str], Operator],
    seed: int,
    chaos_report: list[Figures],
) -> None:
    """kube-apiserver stopped (SIGTERM, then SIGKILL, alternately) and
    started again on the same port and etcd while the operator works. Its
    watches and patches fail meanwhile; it must not exit, and must catch up.

    A SIGTERMed API server drains for a minute, holding on to requests it
    had; here it is SIGKILLed when the new one starts, as a kubelet whose
    grace period ran out would. Left to drain, it can hold a status pass's
    request, and a deletion then waits a minute for that pass to end: the
    defect test_a_deletion_during_a_database_stall_... pins down directly.
    """
    cp = restartable_control_plane
    figures, rng, churn, op, rode_through = await _settled_population(
        "kube-apiserver restarted", api, namespace, chaos_pg, operators, seed
    )
    loop = asyncio.get_running_loop()

    def ready() -> Awaitable[bool]:
        if (why := cp.apiserver_exited()) is not None:
            raise AssertionError(f"kube-apiserver {why}:\n{cp.log_tail('kube-apiserver')}")
        return asyncio.to_thread(cp.apiserver_ready)

    try:
        for n in range(APISERVER_RESTARTS):
            # The burst's calls retry through the outage, so changes land
            # before, and right after, the restart.
            burst = asyncio.create_task(churn.burst(12))
            await asyncio.sleep(rng.uniform(0.1, 0.5))
            stopped = loop.time()
            cp.stop_apiserver(signal.SIGKILL if n % 2 else signal.SIGTERM)
            await wait_until(lambda: not cp.apiserver_listening(), 30, "kube-apiserver stopped listening")
            await asyncio.sleep(rng.uniform(1.0, 4.0))
            cp.kill_stopped_apiservers()
            cp.start_apiserver()
            await wait_until(ready, 120, "kube-apiserver ready again")
            back = loop.time()
            await burst
            rode_through()
            figures.faults += 1
            figures.outage.append(back - stopped)
            figures.converge.append(await converge(api, chaos_pg.dsn, churn, back, rode_through))
    finally:
        # A failure mid-outage must not leave the module's API server down
        # for the scenario after this one.
        if cp.apiserver_exited():
            with contextlib.suppress(ControlPlaneError):
                cp.start_apiserver()
            await wait_until(ready, 120, "kube-apiserver ready")

    _nothing_given_up([op], figures)
    chaos_report.append(figures)
    print(Figures.HEADER, figures.row(), sep="\n")


# (how, seconds down between stop and start): pg_ctl restart in both modes,
# and a stop long enough for handlers to fail and wait out their retry.
POSTGRES_FAULTS = [("fast", 0.0), ("immediate", 0.0), ("immediate", 3.0), ("fast", 0.0)]


async def test_postgres_restarted_under_the_operator(
    api: Api,
    namespace: str,
    chaos_pg: ChaosPostgres,
    operators: Callable[[str], Operator],
    seed: int,
    chaos_report: list[Figures],
) -> None:
    """Postgres restarted (pg_ctl -m fast / immediate) while the operator
    upserts and deletes: every pooled connection breaks, statements in
    flight fail. It must not exit, and must catch up."""
    figures, rng, churn, op, rode_through = await _settled_population(
        "PostgreSQL restarted", api, namespace, chaos_pg, operators, seed
    )
    loop = asyncio.get_running_loop()

    for mode, down in POSTGRES_FAULTS:
        # The restart lands in the middle of the changes, while handlers
        # write to Postgres.
        burst = asyncio.create_task(churn.burst(12))
        await asyncio.sleep(rng.uniform(0.1, 0.5))
        stopped = loop.time()
        # pg_ctl blocks until the server is down and up again; off the loop
        # so that the churn goes on meanwhile.
        if down:
            await asyncio.to_thread(chaos_pg.stop_server, mode)
            await asyncio.sleep(down)
            await asyncio.to_thread(chaos_pg.start_again)
        else:
            await asyncio.to_thread(chaos_pg.restart, mode)
        back = loop.time()
        await burst
        rode_through()
        figures.faults += 1
        figures.outage.append(back - stopped)
        figures.converge.append(await converge(api, chaos_pg.dsn, churn, back, rode_through))

    _nothing_given_up([op], figures)
    chaos_report.append(figures)
    print(Figures.HEADER, figures.row(), sep="\n")


# Two defects the chaos runs found, each pinned by a deterministic
# reproduction.
async def test_a_deletion_during_a_database_stall_is_not_held_for_a_minute(
    api: Api,
    namespace: str,
    chaos_pg: ChaosPostgres,
    operators: Callable[[str], Operator],
    seed: int,
) -> None:
    """Postgres stalls for three seconds (a lock, a slow failover) and a
    resource is deleted meanwhile. Once Postgres answers, the deletion
    should finish within a status interval or two."""
    figures = Figures("Postgres stall", seed)
    churn = Churn(api, namespace, random.Random(seed), figures)
    loop = asyncio.get_running_loop()
    op = operators(namespace)
    for _ in range(3):
        await churn.create()
    await converge(api, chaos_pg.dsn, churn, loop.time(), _rode_through(op, figures))

    conn = await asyncpg.connect(chaos_pg.dsn)
    try:
        stall = conn.transaction()
        await stall.start()
        # Every statement on endpoints now waits, the status passes' too.
        await conn.execute("LOCK TABLE endpoints IN ACCESS EXCLUSIVE MODE")
        await wait_until(lambda: _waiting_on_the_lock(chaos_pg.dsn), 30, "a status pass waiting on the lock")
        await churn.delete()
        await wait_until(
            lambda: _waiting_on_the_lock(chaos_pg.dsn, "DELETE FROM endpoints"), 30, "the deletion waiting"
        )
        await stall.rollback()
    finally:
        await conn.close()
    await converge(api, chaos_pg.dsn, churn, loop.time(), _rode_through(op, figures), timeout=10)


async def _waiting_on_the_lock(dsn: str, statement: str = "") -> bool:
    """Some statement of the operator's (one holding ``statement``) waits on a lock."""
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND datname = current_database() AND pid <> pg_backend_pid() AND position($1 in query) > 0",
            statement,
        )
    finally:
        await conn.close()


async def test_rows_postgres_forgot_are_stored_again(
    api: Api,
    namespace: str,
    chaos_pg: ChaosPostgres,
    operators: Callable[[str], Operator],
    seed: int,
) -> None:
    """Postgres may lose writes it acknowledged: a failover to a replica
    that lagged, a restore from backup, a crash of a server run with
    synchronous_commit=off. The resources are the source of truth, so the
    operator should store such endpoints again, not report them Synced."""
    figures = Figures("Postgres forgot rows", seed)
    churn = Churn(api, namespace, random.Random(seed), figures)
    loop = asyncio.get_running_loop()
    op = operators(namespace)
    for _ in range(6):
        await churn.create()
    await converge(api, chaos_pg.dsn, churn, loop.time(), _rode_through(op, figures))

    names = sorted(churn.model)
    conn = await asyncpg.connect(chaos_pg.dsn)
    try:
        # What a lagging replica would not have: one endpoint entirely, and
        # the last edit of another.
        await conn.execute("DELETE FROM endpoints WHERE namespace = $1 AND name = $2", namespace, names[0])
        await conn.execute(
            "UPDATE endpoints SET url = 'http://127.0.0.1:9/before' WHERE namespace = $1 AND name = $2",
            namespace,
            names[1],
        )
    finally:
        await conn.close()
    await converge(api, chaos_pg.dsn, churn, loop.time(), _rode_through(op, figures), timeout=8)
