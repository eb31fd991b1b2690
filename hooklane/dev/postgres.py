"""A throwaway PostgreSQL server for the local stack, the demo and the tests.

PostgreSQL refuses to run as root; when we are root the cluster is created
and run as the ``postgres`` system user (Debian's packages create it).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from hooklane.dev.watchdog import Watchdog

_SERVER_OPTIONS = [
    "-c",
    "max_connections=200",
    "-c",
    "shared_buffers=256MB",
    # Off by default; the tests hold a prepared transaction to see it
    # reported as a holder of the xmin horizon (worker/jobs.py: HorizonWatch).
    "-c",
    "max_prepared_transactions=4",
]
# Durability is not the point of a throwaway server, speed is; unless a test
# crashes the server on purpose and counts what survived.
_FAST_OPTIONS = [
    "-c",
    "fsync=off",
    "-c",
    "synchronous_commit=off",
    "-c",
    "full_page_writes=off",
]


def find_bindir() -> Path:
    """The directory of initdb/pg_ctl: $PG_BINDIR, the newest Debian
    install, or whatever is on PATH."""
    if os.environ.get("PG_BINDIR"):
        return Path(os.environ["PG_BINDIR"])
    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
    if debian:
        return Path(debian[-1])
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    raise RuntimeError("PostgreSQL server binaries not found: install postgresql or set PG_BINDIR")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalPostgres:
    """``with LocalPostgres() as pg: pg.dsn`` — a server on 127.0.0.1 that is
    gone, data and all, when the block ends.

    ``remote`` maps extra addresses to listen on to the client networks
    allowed to connect there with ``password``: pods on a test cluster reach
    the host only through its node address, never through loopback."""

    def __init__(
        self,
        port: int | None = None,
        *,
        durable: bool = False,
        remote: dict[str, str] | None = None,
        password: str = "",
    ) -> None:
        if remote and not password:
            raise ValueError("remote clients need a password")
        self.port = port or free_port()
        self.durable = durable
        self.remote = remote or {}
        self.password = password
        self.bindir = find_bindir()
        self.dir = Path(tempfile.mkdtemp(prefix="hooklane-pg-"))
        self.datadir = self.dir / "data"
        self._as_user: list[str] = []
        self._watchdog: Watchdog | None = None
        if os.geteuid() == 0:
            postgres = pwd.getpwnam("postgres")
            os.chown(self.dir, postgres.pw_uid, postgres.pw_gid)
            self._as_user = ["runuser", "-u", "postgres", "--"]

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        subprocess.run(
            [*self._as_user, *args],
            check=True,
            cwd=self.dir,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )

    def start(self) -> LocalPostgres:
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.datadir),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C.UTF-8",
        )
        if self.remote:
            with open(self.datadir / "pg_hba.conf", "a") as hba:
                hba.writelines(f"host all all {network} scram-sha-256\n" for network in self.remote.values())
        self._pg_ctl_start()
        if self.password:
            self._run(
                str(self.bindir / "psql"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                "ALTER ROLE postgres PASSWORD '{}'".format(self.password.replace("'", "''")),
            )
        # pg_ctl runs the server detached from us: if we are killed, the
        # watchdog stops it and removes its files.
        self._watchdog = Watchdog(
            'dir=$1; shift; "$@" -D "$0" -m immediate stop; rm -rf "$dir"',
            str(self.datadir),
            str(self.dir),
            *self._as_user,
            str(self.bindir / "pg_ctl"),
        )
        return self

    def _pg_ctl_start(self) -> None:
        listen = ",".join(["127.0.0.1", *self.remote])
        options = " ".join(
            [
                f"-p {self.port}",
                f"-h {listen}",
                f"-k {self.dir}",
                *_SERVER_OPTIONS,
                *([] if self.durable else _FAST_OPTIONS),
            ]
        )
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.datadir),
            "-l",
            str(self.dir / "server.log"),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "start",
        )
        self._wait_ready()

    def pause(self, mode: str = "fast") -> None:
        """An outage: the server stops, dropping every connection, and
        refuses connections until ``resume``; its data stays. ``mode`` is
        pg_ctl's shutdown mode: ``fast`` (clean), or ``immediate`` (a crash:
        recovery replays the WAL on start)."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", mode, "-w", "stop")

    def resume(self) -> None:
        """Start the server ``pause`` stopped, on the same port and options."""
        self._pg_ctl_start()

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"PostgreSQL did not start; see {self.dir / 'server.log'}")

    def restart(self, mode: str = "fast") -> None:
        """Stop and start the server, dropping every connection (``mode`` as
        for ``pause``)."""
        self.pause(mode)
        self.resume()

    def stop(self) -> None:
        if self._watchdog is not None:
            self._watchdog.disarm()
            self._watchdog = None
        if self.datadir.exists():
            subprocess.run(
                [
                    *self._as_user,
                    str(self.bindir / "pg_ctl"),
                    "-D",
                    str(self.datadir),
                    "-m",
                    "immediate",
                    "stop",
                ],
                cwd=self.dir,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
