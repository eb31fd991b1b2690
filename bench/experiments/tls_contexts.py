"""A worker's TLS contexts (issue 23): each endpoint with a client
certificate has a context of its own in every worker. What one costs to
build and to keep, by how it trusts the system's CAs: **loaded**, the
whole bundle file read into each context (``ssl.create_default_context()``,
how the worker built them before), or **looked up**, the hashed directory
named and each CA read as a handshake needs it (``hooklane.tls``, now).

Each way runs in a process of its own, which builds ``n`` contexts for one
client certificate and keeps them all: the build time per context, and the
growth of the process's resident memory over ``n``. ``SSL_CERT_FILE`` is
unset in those processes (set, it makes ``hooklane.tls`` load the file, as
the operator who set it asked).

Run: ``python -m bench.experiments.tls_contexts --preset full`` (full | quick | smoke)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import sys
import time
from asyncio.subprocess import PIPE

from bench.common import bench_parser, machine, run_and_report
from hooklane import tls
from testsupport import certs

PRESETS = {"smoke": (20,), "quick": (100, 500), "full": (100, 1000, 2000)}
WAYS = ("loaded", "looked up")


def _loaded(cert_pem: str, key_pem: str) -> ssl.SSLContext:
    context = ssl.create_default_context()
    with tls.in_memory(cert_pem) as cert, tls.in_memory(key_pem) as key:
        context.load_cert_chain(cert, key)
    return context


def _looked_up(cert_pem: str, key_pem: str) -> ssl.SSLContext:
    context = tls.client_context(None, cert_pem, key_pem)
    assert context is not None
    return context


def _resident() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(way: str, n: int) -> dict:
    """In this process: ``n`` contexts built the one way, all kept."""
    client = certs.client(certs.Authority())
    build = _loaded if way == "loaded" else _looked_up
    build(client.cert, client.key)  # the first loads OpenSSL's tables
    before, started = _resident(), time.perf_counter()
    kept = [build(client.cert, client.key) for _ in range(n)]
    elapsed = time.perf_counter() - started
    grown = _resident() - before
    return {
        "way": way,
        "contexts": len(kept),
        "ms_per_context": elapsed / n * 1000,
        "kib_per_context": grown / n / 1024,
        "mib_in_all": grown / 2**20,
        "cas_loaded_per_context": kept[0].cert_store_stats()["x509_ca"],
        "hashed_directory": tls.hashed_directory(),
    }


async def main_async(args: argparse.Namespace) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "SSL_CERT_FILE"}
    runs = []
    for n in PRESETS[args.preset]:
        for way in WAYS:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bench.experiments.tls_contexts",
                "--measure",
                way,
                str(n),
                env=env,
                stdout=PIPE,
            )
            out, _ = await proc.communicate()
            assert proc.returncode == 0, f"{way} x {n}: exit {proc.returncode}"
            runs.append(json.loads(out))
    return {"preset": args.preset, "machine": machine(), "runs": runs}


def main() -> None:
    if sys.argv[1:2] == ["--measure"]:
        print(json.dumps(measure(sys.argv[2], int(sys.argv[3]))))
        return
    parser = bench_parser("a worker's TLS contexts, the system's CAs loaded or looked up", PRESETS)
    parser.add_argument("--json", help="write the full results here")
    run_and_report(main_async, parser.parse_args())


if __name__ == "__main__":
    main()
