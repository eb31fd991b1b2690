"""pytest fixtures for tests against a real kube-apiserver.

The repository's conftest.py loads them; the tests taking them are in
tests/kube/ (or a heavier tier's folder). One control plane (etcd +
kube-apiserver, CRDs installed) serves the whole session; the first run on
a machine builds the binaries, which takes minutes (see
hack/envtest/README.md).
"""

from __future__ import annotations

import asyncio
import base64
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml

from hooklane.crd import PRINTER_COLUMNS
from hooklane.dev.controlplane import ControlPlane, ControlPlaneError
from testsupport import timings

# What `kubectl get whe` shows: the name, then the CRD's printer columns,
# which kubectl heads in capitals.
WHE_COLUMNS = ["NAME", *(column["name"].upper() for column in PRINTER_COLUMNS)]
_PR_SET_PDEATHSIG = 1


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    with ControlPlane() as cp:
        yield cp


@pytest.fixture(scope="session")
def kubeconfig(control_plane: ControlPlane) -> Path:
    return control_plane.kubeconfig


@pytest.fixture
def kube_namespace(control_plane: ControlPlane, request: pytest.FixtureRequest) -> str:
    """A new namespace per test, named after the test for easier debugging.

    Never deleted: with no controller manager a deleted namespace stays
    Terminating forever, and the control plane is thrown away anyway.
    """
    stem = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:50].rstrip("-")
    name = f"{stem}-{uuid.uuid4().hex[:8]}"
    control_plane.create_namespace(name)
    return name


class RestartableControlPlane(ControlPlane):
    """A control plane whose kube-apiserver can be stopped and started again
    on the same port against the same etcd, so every object survives, as in
    a control-plane upgrade. For the chaos tests; the session's shared
    ``control_plane`` is never restarted under other tests.

    On SIGTERM kube-apiserver stops listening at once but keeps the
    connections it has (watches, requests in flight) for a minute before it
    exits. ``kill_stopped_apiservers`` ends that drain early, as a kubelet
    does when the grace period runs out; a new API server may also be
    started while an old one still drains, as a replacement instance behind
    a load balancer would be.

    Built on ControlPlane's internals (the argv it spawned with, its process
    table); a public ``ControlPlane.restart(name)`` would be the lasting home.
    """

    APISERVER = "kube-apiserver"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._argv: dict[str, list[str]] = {}
        # Stopped API servers that may still be draining.
        self._old: list[subprocess.Popen[bytes]] = []

    def _spawn(self, name: str, argv: list[str]) -> None:
        self._argv[name] = argv
        super()._spawn(name, argv)

    def stop_apiserver(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Signal the API server and return at once; see apiserver_listening."""
        proc = self._procs.pop(self.APISERVER)
        self._old.append(proc)
        proc.send_signal(sig)

    def kill_stopped_apiservers(self) -> None:
        """SIGKILL the API servers stopped earlier that still drain."""
        for proc in self._old:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def apiserver_listening(self) -> bool:
        port = int(self.server.rsplit(":", 1)[1])
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            return False

    def start_apiserver(self) -> None:
        """Spawn the API server again with the argv it first had (same port,
        certificates and etcd) once the port is free; returns at once, see
        apiserver_ready."""
        if self.APISERVER in self._procs or self.apiserver_listening():
            raise ControlPlaneError("kube-apiserver is still serving")
        assert self.dir is not None
        # _spawn truncates the log; keep each run's for post-mortems.
        log = self.dir / f"{self.APISERVER}.log"
        if log.exists():
            log.rename(self.dir / f"{self.APISERVER}.{len(self._old)}.log")
        self._spawn(self.APISERVER, self._argv[self.APISERVER])
        # The watchdog SIGKILLs every pid in this file if pytest is killed:
        # keep only the live ones, so that it never hits a reused pid.
        live = [p for p in [*self._old, *self._procs.values()] if p.poll() is None]
        (self.dir / "pids").write_text("".join(f"{p.pid}\n" for p in live))

    def apiserver_ready(self) -> bool:
        """/readyz answers 200. Blocks for up to 5 s: call it off the loop."""
        return self._get("/readyz") == 200

    def apiserver_exited(self) -> str | None:
        """Why no API server runs (stopped, or the exit code of a crash);
        None while one does."""
        proc = self._procs.get(self.APISERVER)
        if proc is None:
            return "stopped"
        if proc.poll() is not None:
            return f"exited with code {proc.returncode}"
        return None

    def stop(self) -> None:
        # Draining servers hold nothing worth a graceful end.
        self.kill_stopped_apiservers()
        self._old.clear()
        super().stop()


@pytest.fixture(scope="module")
def restartable_control_plane() -> Iterator[RestartableControlPlane]:
    """A control plane of the module's own, CRDs installed, that the module
    may restart parts of. Stopped, whatever state it is in, at module end."""
    with RestartableControlPlane() as cp:
        yield cp


def _die_with_parent() -> None:
    # An aborted pytest run must not leave operators behind on a CI machine.
    # Linux sends it when the forking *thread* ends: operators are started
    # from the test's event loop, on the main thread.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Operator:
    """``hooklane operator`` as a process, its log in a file."""

    def __init__(self, log: Path, argv: list[str], env: dict[str, str]) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "hooklane.cli", "operator", *argv],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL: no cleanup, no finally, exactly as an OOM kill or a lost node."""
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


ROTATED = "whsec_" + base64.b64encode(b"rotated-signing-key-32-bytes-xx!").decode()


@pytest.fixture
def start_operator(
    kubeconfig: Path, dsn: str, kube_namespace: str, tmp_path: Path
) -> Iterator[Callable[..., Operator]]:
    running: list[Operator] = []
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "HOOKLANE_DATABASE_URL": dsn,
        **timings.environment(timings.OPERATOR),
    }

    def start(*argv: str, kubeconfig: Path | None = None) -> Operator:
        run_env = {**env, "KUBECONFIG": str(kubeconfig)} if kubeconfig else env
        op = Operator(
            tmp_path / f"operator-{len(running)}.log",
            [*(argv or ("--standalone",)), "--namespace", kube_namespace],
            run_env,
        )
        running.append(op)
        return op

    yield start
    for op in running:
        op.stop()
        # Shown by pytest only when the test failed.
        print(f"--- {op.log.name} (exit {op.proc.returncode}) ---\n{op.output()[-6000:]}")


@pytest.fixture
def kube(control_plane: ControlPlane, kube_namespace: str) -> Kube:
    return Kube(control_plane, kube_namespace)


class Kube:
    """kubectl in the test's namespace, off the event loop so that the
    receivers and the in-process worker keep running meanwhile."""

    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        self.cp = cp
        self.namespace = namespace

    async def run(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        done = await asyncio.to_thread(self.cp.kubectl, "-n", self.namespace, *args, stdin=stdin, check=check)
        return done.stdout

    async def apply(self, doc: dict[str, Any]) -> None:
        await self.run("apply", "-f", "-", stdin=json.dumps(doc))

    async def get(self, name: str = "orders-acme") -> dict[str, Any] | None:
        out = await self.run("get", "whe", name, "-o", "json", "--ignore-not-found")
        return json.loads(out) if out.strip() else None

    async def condition(self, type_: str, name: str = "orders-acme") -> dict[str, Any] | None:
        body = await self.get(name)
        conditions = (body or {}).get("status", {}).get("conditions", [])
        return next((c for c in conditions if c["type"] == type_), None)

    async def events(self, name: str = "orders-acme") -> list[str]:
        out = await self.run("get", "events", "--field-selector", f"involvedObject.name={name}", "-o", "json")
        return [e["reason"] for e in json.loads(out)["items"]]

    async def columns(self, name: str = "orders-acme") -> dict[str, str]:
        lines = (await self.run("get", "webhookendpoints", name)).splitlines()
        return dict(zip(lines[0].split(), lines[1].split(), strict=True))


def endpoint(url: str, **spec: Any) -> dict[str, Any]:
    doc = example("endpoint.yaml")
    doc["spec"].update(url=url, **spec)
    return doc


def secret(value: str, name: str = "acme-webhook-secret") -> dict[str, Any]:
    doc = example("secret.yaml")
    doc["metadata"]["name"] = name
    doc["stringData"]["secret"] = value
    return doc


async def row(db: asyncpg.Connection, name: str = "orders-acme") -> asyncpg.Record | None:
    return await db.fetchrow("SELECT * FROM endpoints WHERE name = $1", name)


ROOT = Path(__file__).resolve().parents[1]


EXAMPLES = ROOT / "examples"


def example(name: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / name).read_text())
