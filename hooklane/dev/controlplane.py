"""A throwaway Kubernetes control plane: etcd and kube-apiserver, nothing else.

It is the envtest idea without envtest's downloads: the binaries come from
``hack/envtest/build`` (built from Go modules, cached per machine) or from
``KUBEBUILDER_ASSETS``. The API server gets its own CA, a client-certificate
admin in ``system:masters`` and RBAC, so clients talk to it exactly as they
would to a real cluster; the CRDs in ``crds/`` are installed and Established
before :meth:`ControlPlane.start` returns.

No controller manager runs: namespaces never finish deleting, garbage
collection never happens, Deployments create no Pods.

    with ControlPlane() as cp:
        subprocess.run(["kubectl", "--kubeconfig", cp.kubeconfig, "get", "whe", "-A"])

``python -m hooklane.dev.controlplane`` runs one in the foreground and prints
the kubeconfig path as its last line.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from hooklane.dev.watchdog import Watchdog

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "envtest" / "build"
CRD_DIR = REPO_ROOT / "crds"

# Building on a 2-core CI machine is slow and the first start after a build
# reads cold binaries from disk; envtest's 20 s default is not enough here.
DEFAULT_START_TIMEOUT = 120.0
STOP_GRACE = 10.0


class ControlPlaneError(RuntimeError):
    pass


def find_binaries() -> Path:
    """Folder holding ``etcd`` and ``kube-apiserver``, building them if needed."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        # Honoured here too, so an installed hooklane works without the repo.
        folder = Path(assets)
    else:
        if not BUILD_SCRIPT.exists():
            raise ControlPlaneError(
                f"{BUILD_SCRIPT} not found: set KUBEBUILDER_ASSETS to a folder "
                "with etcd and kube-apiserver, or run from a hooklane checkout"
            )
        # stderr is inherited so a 10+ minute first build shows its progress.
        done = subprocess.run([str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False)
        if done.returncode != 0:
            raise ControlPlaneError(f"{BUILD_SCRIPT} failed with exit code {done.returncode}")
        folder = Path(done.stdout.strip().splitlines()[-1])
    for name in ("etcd", "kube-apiserver"):
        if not os.access(folder / name, os.X_OK):
            raise ControlPlaneError(f"no executable {name} in {folder}")
    return folder


def _free_ports(count: int) -> list[int]:
    # All sockets stay open until every port is chosen, so the ports differ.
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _openssl(*args: str) -> None:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ControlPlaneError(f"openssl {args[0]} failed: {done.stderr.strip()}")


def _write_pki(pki: Path) -> None:
    """CA, API server serving cert, admin client cert and service-account keys."""
    pki.mkdir(mode=0o700)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "365",
        "-subj",
        "/CN=hooklane-dev-ca",
        "-keyout",
        str(pki / "ca.key"),
        "-out",
        str(pki / "ca.crt"),
    )

    def issue(name: str, subject: str, extensions: str) -> None:
        ext = pki / f"{name}.ext"
        ext.write_text(extensions)
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            subject,
            "-keyout",
            str(pki / f"{name}.key"),
            "-out",
            str(pki / f"{name}.csr"),
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            str(pki / f"{name}.csr"),
            "-days",
            "365",
            "-CA",
            str(pki / "ca.crt"),
            "-CAkey",
            str(pki / "ca.key"),
            "-CAcreateserial",
            "-extfile",
            str(ext),
            "-out",
            str(pki / f"{name}.crt"),
        )

    issue(
        "apiserver",
        "/CN=kube-apiserver",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    # The organisation becomes the group: system:masters bypasses RBAC.
    issue("admin", "/O=system:masters/CN=hooklane-admin", "extendedKeyUsage=clientAuth\n")
    _openssl("genrsa", "-out", str(pki / "sa.key"), "2048")
    _openssl("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))


def _b64file(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


class ControlPlane:
    """etcd and kube-apiserver on free loopback ports, in a temporary folder.
    If this process is killed before ``stop()``, a watchdog kills them and
    removes the folder."""

    def __init__(
        self,
        *,
        crd_dir: Path | None = CRD_DIR,
        start_timeout: float = DEFAULT_START_TIMEOUT,
    ) -> None:
        self.crd_dir = crd_dir
        self.start_timeout = start_timeout
        self.dir: Path | None = None
        self.server = ""
        self.kubeconfig = Path()
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._ssl: ssl.SSLContext | None = None
        self._watchdog: Watchdog | None = None

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        binaries = find_binaries()
        self.dir = Path(tempfile.mkdtemp(prefix="hooklane-controlplane-"))
        # An aborted pytest run must not leave an apiserver eating a CI core.
        self._watchdog = Watchdog('kill -KILL $(cat "$0/pids") 2>/dev/null; rm -rf "$0"', str(self.dir))
        try:
            self._start(binaries, self.dir)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, binaries: Path, root: Path) -> None:
        pki = root / "pki"
        _write_pki(pki)
        etcd_port, peer_port, api_port = _free_ports(3)
        self.server = f"https://127.0.0.1:{api_port}"

        etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self._spawn(
            "etcd",
            [
                str(binaries / "etcd"),
                f"--data-dir={root / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                # Test data is disposable; fsync only slows every write down.
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        self._wait("etcd", lambda: self._etcd_healthy(etcd_url))

        self._spawn(
            "kube-apiserver",
            [
                str(binaries / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                f"--cert-dir={pki}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--secure-port={api_port}",
                "--bind-address=127.0.0.1",
                # Without it the server looks for a default route and dies on
                # machines that have none.
                "--advertise-address=127.0.0.1",
                "--service-cluster-ip-range=10.0.0.0/24",
                f"--service-account-issuer={self.server}/",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--authorization-mode=RBAC",
                # The default ServiceAccount is created by a controller that does
                # not run here, so admission would refuse every Pod.
                "--disable-admission-plugins=ServiceAccount",
                "--allow-privileged=true",
            ],
        )
        self._ssl = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self._ssl.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        self._wait("kube-apiserver", lambda: self._get("/readyz") == 200)
        # The default namespace is created by a loop inside the apiserver
        # that may trail /readyz by a moment.
        self._wait("kube-apiserver", lambda: self._get("/api/v1/namespaces/default") == 200)

        self.kubeconfig = root / "kubeconfig"
        self._write_kubeconfig(pki)
        if self.crd_dir is not None:
            self._install_crds(self.crd_dir)

    def _spawn(self, name: str, argv: list[str]) -> None:
        assert self.dir is not None
        with open(self.dir / f"{name}.log", "wb") as log:
            self._procs[name] = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Own session: a terminal's Ctrl-C reaches only us, and stop()
                # shuts the children down in order.
                start_new_session=True,
            )
        with open(self.dir / "pids", "a") as pids:
            print(self._procs[name].pid, file=pids)

    def log_tail(self, name: str, lines: int = 30) -> str:
        assert self.dir is not None
        try:
            text = (self.dir / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _wait(self, name: str, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            for proc_name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise ControlPlaneError(
                        f"{proc_name} exited with code {proc.returncode}:\n{self.log_tail(proc_name)}"
                    )
            if ready():
                return
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"{name} not ready after {self.start_timeout:.0f} s:\n{self.log_tail(name)}"
                )
            time.sleep(0.25)

    @staticmethod
    def _etcd_healthy(url: str) -> bool:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                return json.load(resp).get("health") == "true"
        except (OSError, ValueError):
            return False

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> int:
        """HTTP status of an admin request; 0 when the server is unreachable."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.server + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"} if data else {},
        )
        try:
            with urllib.request.urlopen(req, context=self._ssl, timeout=5) as resp:
                return resp.status
        except urllib.error.HTTPError as err:
            return err.code
        except (OSError, ssl.SSLError):
            return 0

    def _get(self, path: str) -> int:
        return self._request("GET", path)

    def _write_kubeconfig(self, pki: Path) -> None:
        # JSON is YAML, and kubectl, the kubernetes client and kopf all read
        # it; embedded data keeps the file valid without the pki folder.
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "hooklane-dev",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": _b64file(pki / "ca.crt"),
                    },
                }
            ],
            "users": [
                {
                    "name": "hooklane-admin",
                    "user": {
                        "client-certificate-data": _b64file(pki / "admin.crt"),
                        "client-key-data": _b64file(pki / "admin.key"),
                    },
                }
            ],
            "contexts": [
                {
                    "name": "hooklane-dev",
                    "context": {
                        "cluster": "hooklane-dev",
                        "user": "hooklane-admin",
                        "namespace": "default",
                    },
                }
            ],
            "current-context": "hooklane-dev",
        }
        self.kubeconfig.write_text(json.dumps(config, indent=2) + "\n")
        self.kubeconfig.chmod(0o600)

    def _install_crds(self, crd_dir: Path) -> None:
        if not any(crd_dir.glob("*.yaml")):
            return
        self.kubectl("apply", "--server-side", "-f", str(crd_dir))
        self.kubectl(
            "wait",
            "--for=condition=Established",
            f"--timeout={self.start_timeout:.0f}s",
            "-f",
            str(crd_dir),
        )

    def kubectl(
        self, *args: str, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this control plane; output is captured as text."""
        done = subprocess.run(
            ["kubectl", f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
        )
        if check and done.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done

    def create_namespace(self, name: str) -> None:
        status = self._request(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        )
        if status != 201:
            raise ControlPlaneError(f"creating namespace {name} returned HTTP {status}")

    def dead(self) -> str | None:
        """Name of a process that has exited, if any."""
        return next((name for name, p in self._procs.items() if p.poll() is not None), None)

    def stop(self) -> None:
        # The apiserver first, so it never sees etcd vanish under it.
        for name in ("kube-apiserver", "etcd"):
            proc = self._procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._watchdog is not None:
            self._watchdog.disarm()
            self._watchdog = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hooklane.dev.controlplane",
        description="Run etcd and kube-apiserver with the hooklane CRDs installed, "
        "until interrupted. The last line printed is the kubeconfig path.",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_START_TIMEOUT,
        help="seconds to wait for the servers to become ready (default %(default)s)",
    )
    args = parser.parse_args(argv)

    def on_signal(signum: int, frame: object) -> None:
        # Unwinding through the with-block stops the servers, whether they
        # are still starting or already serving; a second signal must not
        # interrupt that cleanup.
        for sig in signals:
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, on_signal) for s in signals}
    try:
        with ControlPlane(start_timeout=args.timeout) as cp:
            print(f"control plane ready: {cp.server} (logs in {cp.dir}); Ctrl-C stops it", file=sys.stderr)
            print(cp.kubeconfig, flush=True)
            while (name := cp.dead()) is None:
                time.sleep(1.0)
            print(f"{name} exited unexpectedly:\n{cp.log_tail(name)}", file=sys.stderr)
            return 1
    except KeyboardInterrupt:
        return 0
    except ControlPlaneError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
