"""The README's local mode, run as a newcomer runs it: the code blocks it
marks are typed line by line into one shell, in a folder holding
`examples/endpoint.yaml`, against a fresh database and a receiver on
loopback, with the `hooklane` command on the PATH.

What the test changes is only what it must to share the machine: the
receiver's port in the manifest's URL (9000 in the repository) and the
ports the commands listen on by default or as the block says (8080, 9100,
9101), each moved to a free one. A command's default port is asked of the
code, and two that are equal move to the same free port, so two commands
that would collide on a user's machine collide here too."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import aiohttp
import asyncpg
import psutil
from standardwebhooks.webhooks import Webhook

from hooklane.dev.postgres import free_port
from hooklane.settings import METRICS_PORTS, Settings
from testsupport.fixtures import wait_for
from testsupport.receivers import Answer

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MARK = "<!-- tests/processes/test_readme.py runs this block line by line, as written -->"
MANIFEST = ROOT / "examples" / "endpoint.yaml"
RECEIVER_PORT = 9000
DONE = "__readme_line_done__"


def marked_blocks() -> list[list[str]]:
    """The lines of each block the README marks, continuation lines joined."""
    blocks = re.findall(rf"^{re.escape(MARK)}\n```sh\n(.*?)^```", README.read_text(), flags=re.S | re.M)
    return [block.replace("\\\n", "").splitlines() for block in blocks]


def _as_typed(line: str, ports: dict[int, int]) -> str:
    """``line`` as the test types it: without its optional groups
    (`[--delivery ID ...]`, which a user leaves out), and with the
    addresses of this machine's default ports moved."""
    line = re.sub(r"\s\[-[^\]]*\]", "", line)
    return re.sub(r"\b127\.0\.0\.1:(\d+)", lambda m: f"127.0.0.1:{ports.get(int(m[1]), m[1])}", line)


# The `hooklane` a user has installed (hooklane.cli:main), run from this
# checkout, with the ports it would listen on moved by the test's map.
_SHIM = """\
import json, os, sys
sys.path.insert(0, {root!r})
from hooklane import cli
from hooklane.settings import METRICS_PORTS, Settings
ports = json.loads(os.environ["README_TEST_PORTS"])
command = sys.argv[1] if len(sys.argv) > 1 else ""
if command in METRICS_PORTS:
    defaults = {{"HOOKLANE_METRICS_PORT": METRICS_PORTS[command]}}
    if command == "api":
        defaults["HOOKLANE_API_PORT"] = Settings.api_port
    for variable, default in defaults.items():
        port = str(os.environ.get(variable, default))
        os.environ[variable] = str(ports.get(port, port))
sys.exit(cli.main())
"""


@dataclass
class Shell:
    """One `sh` that a user types into; its background jobs stay in its
    process group, which the test ends as `kill %1 %2` would."""

    process: subprocess.Popen
    log: IO[str]
    ports: dict[int, int]

    def type(self, line: str) -> tuple[int, str]:
        """Runs ``line``; its exit status and what it printed on stdout."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{line}\necho {DONE} $?\n")
        self.process.stdin.flush()
        out = []
        for got in self.process.stdout:
            # After what the line printed, ended by a newline or not (curl's).
            printed, marker, status = got.partition(DONE)
            out.append(printed)
            if marker:
                return int(status), "".join(out)
        raise AssertionError(f"the shell ended at {line!r}:\n{self.output()}")

    def output(self) -> str:
        """What the shell and its commands wrote on stderr."""
        self.log.flush()
        return Path(self.log.name).read_text()


@contextlib.contextmanager
def user_shell(tmp_path: Path, dsn: str, receiver_port: int) -> Iterator[Shell]:
    home = tmp_path / "home"
    (home / "examples").mkdir(parents=True)
    manifest = MANIFEST.read_text()
    url = f"127.0.0.1:{RECEIVER_PORT}/"
    assert manifest.count(url) == 1, "the manifest's receiver moved: update this test"
    (home / "examples" / "endpoint.yaml").write_text(manifest.replace(url, f"127.0.0.1:{receiver_port}/"))
    ports = {port: free_port() for port in {*METRICS_PORTS.values(), Settings.api_port}}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "hooklane").write_text(f"#!{sys.executable}\n" + _SHIM.format(root=str(ROOT)))
    (bin_dir / "hooklane").chmod(0o755)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HOOKLANE_", "PYTHON"))}
    env.update(
        PATH=f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}",
        HOOKLANE_DATABASE_URL=dsn,
        README_TEST_PORTS=json.dumps({str(k): v for k, v in ports.items()}),
    )
    with (tmp_path / "shell.log").open("w+") as log:
        process = subprocess.Popen(
            ["sh"],
            cwd=home,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,
        )
        try:
            yield Shell(process, log, ports)
        finally:
            _end(process)


def _end(shell: subprocess.Popen) -> None:
    """SIGTERM to the shell and its jobs (the worker and the API drain),
    then wait until each has exited; SIGKILL to those left after 30 s."""
    jobs = [p for p in psutil.process_iter() if _in_group(p, shell.pid)]
    os.killpg(shell.pid, signal.SIGTERM)
    shell.wait()
    _, alive = psutil.wait_procs(jobs, timeout=30)
    for job in alive:
        job.kill()


def _in_group(process: psutil.Process, group: int) -> bool:
    try:
        return os.getpgid(process.pid) == group
    except ProcessLookupError:
        return False


async def _answers(url: str, job: psutil.Process, line: str, shell: Shell) -> bool:
    if not job.is_running() or job.status() == psutil.STATUS_ZOMBIE:
        raise AssertionError(f"{line} exited:\n{shell.output()}")
    try:
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            return response.status == 200
    except aiohttp.ClientError:
        return False


async def _started(shell: Shell, line: str) -> None:
    """The job the line put in the background answers on each port its
    comment names (`on :9100`), moved as the test moved it."""
    command, _, comment = line.partition("#")
    named = [int(port) for port in re.findall(r":(\d{2,5})\b", comment)]
    assert named, f"say in the comment where {command.strip()!r} listens"
    _, pid = await asyncio.to_thread(shell.type, "echo $!")
    job = psutil.Process(int(pid))
    for port in named:
        assert port in shell.ports, f"{command.strip()!r}: nothing listens on :{port} by default"
        url = f"http://127.0.0.1:{shell.ports[port]}/healthz"
        await wait_for(lambda url=url: _answers(url, job, command.strip(), shell), timeout=60, interval=0.2)


async def _run(shell: Shell, block: list[str]) -> list[str]:
    """Types each line; a line that fails fails the test. What each printed."""
    printed = []
    for line in block:
        typed = _as_typed(line, shell.ports)
        if not typed.strip():
            continue
        # Ending the shell (the fixture does) frees a line that never ends.
        status, out = await asyncio.wait_for(asyncio.to_thread(shell.type, typed), timeout=120)
        assert status == 0, f"{typed!r} exited {status}:\n{out}\n{shell.output()[-3000:]}"
        printed.append(out)
        if typed.split("#")[0].rstrip().endswith("&"):
            await _started(shell, typed)
    return printed


async def test_the_readme_local_mode_delivers_signed_events_as_written(fresh_dsn, receiver, tmp_path):
    blocks = marked_blocks()
    assert len(blocks) == 2, (
        f"README.md marks {len(blocks)} blocks with {MARK}, not the quick start and the endpoints'"
    )
    quick_start, endpoints = blocks
    receiver.on("hooks/acme", Answer(204))
    with user_shell(tmp_path, fresh_dsn, receiver.port) as shell:
        printed = await _run(shell, quick_start)
        await wait_for(lambda: len(receiver.at("hooks/acme")) >= 2, timeout=60)
        secret = (tmp_path / "home" / "acme.secret").read_text().strip()
        events = [
            Webhook(secret).verify(r.body, {k.lower(): v for k, v in r.headers.items()})
            for r in receiver.at("hooks/acme")
        ]
        assert sorted(e["data"]["id"] for e in events) == [7, 8]
        assert any("default/orders-acme" in out for out in printed), printed
        # The block of the endpoint's commands, each in the case its comment
        # names: reactivate is for a deactivated endpoint.
        db = await asyncpg.connect(fresh_dsn)
        try:
            await db.execute("UPDATE endpoints SET state = 'deactivated'")
            await _run(shell, endpoints)
            assert await db.fetchval("SELECT state FROM endpoints") == "active"
        finally:
            await db.close()
