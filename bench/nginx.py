"""nginx answering 204 on loopback: a receiver that is never the bottleneck.

Debian's nginx (``apt-get install nginx-light``), configured in a temp dir,
one worker process (the machine has two cores and the sender needs one).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

CONFIG = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
{user}
events {{ worker_connections 8192; }}
http {{
    access_log off;
    # Keep sender connections open for the whole run: a reconnect per
    # request would measure TCP setup, not delivery.
    keepalive_requests 10000000;
    keepalive_timeout 120s;
    client_body_buffer_size 64k;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{ return 204; }}
    }}
}}
"""


def available() -> bool:
    return shutil.which("nginx") is not None or Path("/usr/sbin/nginx").exists()


class Nginx:
    def __init__(self, port: int) -> None:
        self.port = port
        self.dir = Path(tempfile.mkdtemp(prefix="hooklane-nginx-"))
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Nginx:
        # As root, nginx's workers drop to www-data (Debian's nginx user).
        user = "user www-data;" if os.geteuid() == 0 else ""
        (self.dir / "nginx.conf").write_text(CONFIG.format(dir=self.dir, port=self.port, user=user))
        os.chmod(self.dir, 0o755)
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        self.proc = subprocess.Popen(
            [
                binary,
                "-c",
                str(self.dir / "nginx.conf"),
                "-p",
                str(self.dir),
                "-e",
                str(self.dir / "error.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"nginx exited: {self.proc.stderr.read().decode()}") from None
                time.sleep(0.05)
        raise RuntimeError("nginx did not start listening")

    def pids(self) -> list[int]:
        """The master and its workers, for CPU accounting."""
        import psutil

        if self.proc is None:
            return []
        master = psutil.Process(self.proc.pid)
        return [master.pid, *(c.pid for c in master.children())]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Nginx:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
