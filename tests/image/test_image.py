"""The container image (Dockerfile, built by hack/image), run for real with
podman: every role's entry point, as uid 10001 on a read-only root filesystem
(with /tmp writable, as the Dockerfile asks), against a real PostgreSQL on
loopback (the containers share the host's network).

The image is built once per session by ``hack/image --no-load``; it is
skipped when its tag (a hash of the build context) exists already, so a
session on an unchanged tree only pays for the containers. The first run on
a machine also builds the Debian base with debootstrap (a few minutes)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from hooklane import store
from testsupport import timings
from testsupport.fixtures import LOOPBACK, add_endpoint, wait_for
from testsupport.receivers import Answer

ROOT = Path(__file__).resolve().parents[2]
# Debian's runc (crun refuses hybrid cgroups), and ulimits within the hard
# nofile limit of machines where podman's default is out of reach.
PODMAN = ["podman", "--runtime", "/usr/sbin/runc"]
LIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
# How the image is meant to run: read-only root, a writable /tmp (an emptyDir
# in Kubernetes), the host's network so loopback DSNs and receivers work.
RUN = ["run", *LIMITS, "--read-only", "--tmpfs", "/tmp:rw,mode=1777,size=64m", "--network", "host"]
UID = 10001
ROLES = ["migrate", "worker", "status", "publish", "operator", "endpoint"]


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [*PODMAN, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"podman {' '.join(args)} exited {result.returncode}\n"
            f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        )
    return result


@pytest.fixture(scope="session")
def image() -> str:
    """The image reference hack/image prints on its last line."""
    if os.geteuid() != 0:
        pytest.skip("the image tests need root: hack/image uses rootful podman and debootstrap")
    if not shutil.which("podman") and not shutil.which("apt-get"):
        pytest.skip("podman is not installed and there is no apt-get to install it")
    started = time.monotonic()
    build = subprocess.run(
        [str(ROOT / "hack/image"), "--no-load"], cwd=ROOT, capture_output=True, text=True, timeout=1800
    )
    if build.returncode != 0:
        pytest.fail(f"hack/image failed ({build.returncode}):\n{build.stderr[-6000:]}")
    ref = build.stdout.strip().splitlines()[-1]
    print(f"hack/image: {ref} in {time.monotonic() - started:.1f} s")
    # Built fine but cannot run anything at all: this machine cannot run
    # containers with podman (not a fault of the image).
    probe = podman(*RUN, "--rm", "--entrypoint", "/bin/true", ref, check=False)
    if probe.returncode != 0:
        pytest.skip(f"podman cannot run containers on this machine: {probe.stderr.strip()[-500:]}")
    return ref


@pytest.fixture
def containers() -> Iterator[list[str]]:
    """Names of detached containers, removed after the test whatever happens."""
    names: list[str] = []
    yield names
    for name in names:
        podman("rm", "--force", "--time", "0", name, check=False)


def hooklane(image: str, *args: str, env: dict[str, str] | None = None, timeout: float = 60):
    """``hooklane ARGS`` in a fresh container, through the image's entry point."""
    flags = [f"--env={k}={v}" for k, v in (env or {}).items()]
    return podman(*RUN, "--rm", *flags, image, *args, timeout=timeout, check=False)


def shell(image: str, script: str) -> subprocess.CompletedProcess[str]:
    return podman(*RUN, "--rm", "--entrypoint", "/bin/sh", image, "-c", script)


def test_tag_labels_and_config(image: str) -> None:
    version = re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M)[1]
    assert re.fullmatch(rf"localhost/hooklane:{re.escape(version)}-[0-9a-f]{{12}}", image), image
    info = json.loads(podman("image", "inspect", image).stdout)[0]
    labels = info["Labels"]
    assert labels["org.opencontainers.image.title"] == "hooklane"
    assert labels["org.opencontainers.image.version"] == version
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.source"].startswith("https://")
    assert labels["org.opencontainers.image.description"]
    config = info["Config"]
    assert config["Entrypoint"] == ["tini", "--", "hooklane"]
    assert config["User"] == f"{UID}:{UID}"
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["HOME"] == env["TMPDIR"] == "/tmp"


def test_help_for_the_command_and_every_role(image: str) -> None:
    top = hooklane(image)  # CMD is --help
    assert top.returncode == 0, top.stderr
    assert top.stdout.startswith("usage: hooklane")
    for role in ROLES:
        out = hooklane(image, role, "--help")
        assert out.returncode == 0, (role, out.stderr)
        assert out.stdout.startswith(f"usage: hooklane {role}"), (role, out.stdout)


def test_non_root_read_only_and_precompiled(image: str) -> None:
    out = shell(
        image,
        "id -u; id -g; touch /opt/hooklane/x 2>/dev/null && echo root-writable || echo root-read-only; "
        "touch /tmp/x && echo tmp-writable",
    ).stdout.split()
    assert out == [str(UID), str(UID), "root-read-only", "tmp-writable"]
    # Nothing is written at run time: every module the roles import has its
    # bytecode in the image already (with a read-only root and
    # PYTHONDONTWRITEBYTECODE, a missing one would be compiled at every start).
    script = (
        "import importlib.util, os, sys; "
        "import hooklane.cli, hooklane.worker.runner, hooklane.operator.main; "
        "files = [m.__file__ for m in list(sys.modules.values()) if (getattr(m, '__file__', None) or '').endswith('.py')]; "
        "print(len(files), [f for f in files if not os.path.exists(importlib.util.cache_from_source(f))])"
    )
    out = podman(*RUN, "--rm", "--entrypoint", "python3", image, "-c", script).stdout.split(" ", 1)
    assert int(out[0]) > 100 and out[1].strip() == "[]", out


def test_no_compilers_or_installers(image: str) -> None:
    out = shell(image, "for c in gcc cc c++ g++ make pip pip3; do command -v $c; done; true").stdout
    assert out.strip() == "", f"found in the image: {out.split()}"
    assert shell(image, "command -v tini").stdout.strip() == "/usr/bin/tini"


async def test_migrate_then_status(image: str, pg_server) -> None:
    """An empty database: migrate applies every migration read from the
    installed package's data, then finds nothing to do; status prints."""
    name = f"image_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(
        host=pg_server.host, port=pg_server.port, user="postgres", database="postgres"
    )
    await admin.execute(f"CREATE DATABASE {name}")
    try:
        env = {"HOOKLANE_DATABASE_URL": f"postgresql://postgres@{pg_server.host}:{pg_server.port}/{name}"}
        migrations = store.available_migrations()
        first = await asyncio.to_thread(hooklane, image, "migrate", env=env)
        assert first.returncode == 0, first.stderr
        assert first.stdout.strip() == f"applied {len(migrations)} migration(s)"
        conn = await asyncpg.connect(host=pg_server.host, port=pg_server.port, user="postgres", database=name)
        try:
            versions = [
                r[0] for r in await conn.fetch("SELECT version FROM hooklane_migrations ORDER BY version")
            ]
            assert versions == [m.version for m in migrations]
            tables = {
                r[0] for r in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            }
            assert {"endpoints", "events", "deliveries"} <= tables
        finally:
            await conn.close()
        again = await asyncio.to_thread(hooklane, image, "migrate", env=env)
        assert (again.returncode, again.stdout.strip()) == (0, "database is up to date"), again.stderr
        status = await asyncio.to_thread(hooklane, image, "status", env=env)
        assert status.returncode == 0, status.stderr
        assert status.stdout.split()[:3] == ["ENDPOINT", "TENANT", "STATE"]
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.close()


async def test_worker_drains_on_sigterm_through_tini(image: str, dsn: str, db, receiver, containers) -> None:
    """publish from the image, a worker in the image delivers it to a slow
    receiver; `podman stop` (SIGTERM to PID 1, tini, passed on to hooklane)
    while the call is in flight: the worker drains it, records it and exits 0
    long before podman would kill it."""
    await add_endpoint(db, "slow", receiver.on("/slow", Answer(delay=3)))
    env = {
        "HOOKLANE_DATABASE_URL": dsn,
        "HOOKLANE_ALLOWED_NETWORKS": LOOPBACK,
        "HOOKLANE_METRICS_PORT": "0",
        **timings.environment(timings.WORKER),
    }
    name = f"hooklane-test-worker-{uuid.uuid4().hex[:8]}"
    containers.append(name)
    flags = [f"--env={k}={v}" for k, v in env.items()]
    await asyncio.to_thread(podman, *RUN, "--detach", "--name", name, *flags, image, "worker")

    pid1 = await asyncio.to_thread(podman, "exec", name, "cat", "/proc/1/cmdline")
    assert pid1.stdout.split("\0")[:4] == ["tini", "--", "hooklane", "worker"]

    published = await asyncio.to_thread(
        hooklane, image, "publish", "--tenant", "acme", "--type", "order.paid", "--data", '{"id": 7}', env=env
    )
    assert published.returncode == 0, published.stderr
    assert published.stdout.strip()  # the event id
    await wait_for(lambda: receiver.at("/slow"), timeout=30)

    started = time.monotonic()
    await asyncio.to_thread(podman, "stop", "--time", "30", name, timeout=60)
    stopped_after = time.monotonic() - started
    state = json.loads((await asyncio.to_thread(podman, "inspect", name)).stdout)[0]["State"]
    logs = await asyncio.to_thread(podman, "logs", name)
    output = logs.stdout + logs.stderr
    assert state["ExitCode"] == 0, output
    assert stopped_after < 15, f"stopped after {stopped_after:.1f} s (killed at 30)\n{output}"
    assert "draining 1 deliveries in flight" in output, output
    assert "worker stopped" in output, output
    # The call in flight finished and was recorded, not abandoned to its lease.
    rows = await db.fetch("SELECT state, attempts, last_status FROM deliveries")
    assert [tuple(r) for r in rows] == [("delivered", 1, 200)]
    assert len(receiver.at("/slow")) == 1


def test_the_image_holds_the_code_of_this_tree(image):
    """The tag hashes the tree; the layers must match it too (a build cache
    that ignored a changed wheel once shipped the previous code)."""
    listing = podman(
        *RUN,
        "--rm",
        "--entrypoint",
        "/opt/hooklane/bin/python",
        image,
        "-c",
        "import hashlib, pathlib, hooklane; root = pathlib.Path(hooklane.__file__).parent; "
        "print('\\n'.join(f'{p.relative_to(root)} {hashlib.sha256(p.read_bytes()).hexdigest()}' "
        "for p in sorted(root.rglob('*')) if p.suffix in ('.py', '.sql')))",
    ).stdout.split("\n")
    package = ROOT / "hooklane"
    # Kept out of the wheel: hooklane/dev, test tooling, and the drops that
    # wait for the next release (CONTRIBUTING.md, "Releasing").
    left_out = {("dev",), ("store", "after_next_release")}
    expected = [
        f"{p.relative_to(package)} {hashlib.sha256(p.read_bytes()).hexdigest()}"
        for p in sorted(package.rglob("*"))
        if p.suffix in (".py", ".sql")
        and not any(p.relative_to(package).parts[: len(out)] == out for out in left_out)
    ]
    assert [line for line in listing if line] == expected
