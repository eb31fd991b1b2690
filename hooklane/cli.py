"""The ``hooklane`` command."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

import uvloop
import yaml

from hooklane import store
from hooklane.errors import InvalidInput
from hooklane.manifest import parse_manifest
from hooklane.publish import publish
from hooklane.settings import Settings
from hooklane.signing import parse_secret
from hooklane.store import deliveries

logger = logging.getLogger("hooklane")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hooklane",
        description="Webhook delivery with a queue per endpoint. The database is HOOKLANE_DATABASE_URL.",
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("migrate", help="apply the database migrations (idempotent)")
    sub.add_parser("worker", help="deliver: reserve, send, record; SIGTERM drains then exits")
    sub.add_parser("status", help="per-endpoint queue, in flight, oldest pending age, circuit")
    sub.add_parser(
        "operator",
        help="run the Kubernetes operator (kopf); `hooklane operator --help` for its options",
        add_help=False,
    )

    pub = sub.add_parser("publish", help="publish one event")
    pub.add_argument("--tenant", required=True)
    pub.add_argument("--type", required=True, help="dotted event type, e.g. order.updated")
    pub.add_argument("--data", required=True, help="the event's data: a JSON object")
    pub.add_argument("--id", help="event id; publishing the same id twice stores it once")
    pub.add_argument("--coalesce-key", help="replaces a still-pending delivery with the same key")

    endpoint = sub.add_parser("endpoint", help="endpoints in local mode (without Kubernetes)")
    esub = endpoint.add_subparsers(dest="endpoint_command", required=True, metavar="ACTION")
    apply = esub.add_parser("apply", help="create or update an endpoint from a WebhookEndpoint manifest")
    apply.add_argument("-f", "--filename", required=True, help="the manifest (YAML), or - for stdin")
    apply.add_argument("--secret-file", required=True, help="file holding the whsec_ signing secret")
    esub.add_parser("list", help="list endpoints")
    for action, text in (
        ("reactivate", "reactivate a deactivated endpoint"),
        ("resend", "resend an endpoint's dead deliveries"),
    ):
        p = esub.add_parser(action, help=text)
        p.add_argument("endpoint", help="NAMESPACE/NAME, or NAME in namespace default")
        if action == "resend":
            p.add_argument("--delivery", type=int, action="append", help="only this delivery id (repeatable)")

    dev = sub.add_parser("dev", help="local tooling: throwaway PostgreSQL, test control plane")
    dsub = dev.add_subparsers(dest="dev_command", required=True, metavar="TOOL")
    dsub.add_parser("postgres", help="run a throwaway PostgreSQL in the foreground; prints its URL")
    dsub.add_parser("controlplane", help="run kube-apiserver and etcd (envtest); prints the kubeconfig path")
    dsub.add_parser("demo", help="the main job on this machine: many endpoints, one slow", add_help=False)
    return parser


# Commands whose options belong to another parser: the rest of argv is theirs.
_PASS_THROUGH = {("operator", None), ("dev", "demo")}


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if rest and (args.command, getattr(args, "dev_command", None)) not in _PASS_THROUGH:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        if args.command == "dev":
            return _dev(args, rest)
        if args.command == "operator":
            from hooklane.operator.main import main as operator_main

            return operator_main(rest)
        settings = Settings.from_env()
        return uvloop.run(_COMMANDS[args.command](args, settings))
    except InvalidInput as exc:
        print(f"hooklane: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


async def _migrate(args: argparse.Namespace, settings: Settings) -> int:
    async with store.connection(settings.database_url) as conn:
        applied = await store.migrate(conn)
    print(f"applied {len(applied)} migration(s)" if applied else "database is up to date")
    return 0


async def _worker(args: argparse.Namespace, settings: Settings) -> int:
    from hooklane.worker.runner import Worker

    if settings.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(settings.metrics_port, settings.metrics_host)
    worker = Worker(settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    await worker.run()
    return 0


async def _publish(args: argparse.Namespace, settings: Settings) -> int:
    try:
        data = json.loads(args.data)
    except json.JSONDecodeError as exc:
        raise InvalidInput("--data", f"is not valid JSON: {exc}") from None
    async with store.connection(settings.database_url) as conn, conn.transaction():
        event_id = await publish(
            conn, tenant=args.tenant, type=args.type, data=data, id=args.id, coalesce_key=args.coalesce_key
        )
    print(event_id)
    return 0


async def _endpoint(args: argparse.Namespace, settings: Settings) -> int:
    action = args.endpoint_command
    if action == "apply":
        return await _endpoint_apply(args, settings)
    async with store.connection(settings.database_url) as conn:
        if action == "list":
            _print_table(
                ["NAMESPACE", "NAME", "TENANT", "URL", "MAX", "STATE", "FAILURES", "PAUSED UNTIL"],
                [
                    [r["namespace"], r["name"], r["tenant"], r["url"], r["max_concurrency"],
                     _state(r), r["consecutive_failures"], _time(r["paused_until"])]
                    for r in await store.list_endpoints(conn)
                ],
            )
            return 0
        namespace, name = _endpoint_name(args.endpoint)
        if action == "reactivate":
            found = await store.reactivate_endpoint(conn, namespace, name)
            print(f"{namespace}/{name} reactivated" if found else f"{namespace}/{name} not found")
            return 0 if found else 1
        count = await deliveries.resend_dead(conn, namespace, name, args.delivery)
        print(f"{count} dead deliveries of {namespace}/{name} queued again")
        return 0


async def _endpoint_apply(args: argparse.Namespace, settings: Settings) -> int:
    text = sys.stdin.read() if args.filename == "-" else _read_file(args.filename, "--filename")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidInput("--filename", f"is not valid YAML: {exc}") from None
    spec = parse_manifest(doc)
    secret = _read_file(args.secret_file, "--secret-file").strip()
    parse_secret(secret)
    async with store.connection(settings.database_url) as conn:
        result = await store.upsert_endpoint(conn, spec, secret)
    print(f"webhookendpoint {spec.namespace}/{spec.name} {'created' if result.created else 'configured'}")
    return 0


async def _status(args: argparse.Namespace, settings: Settings) -> int:
    async with store.connection(settings.database_url) as conn:
        rows = await store.endpoint_queues(conn)
    _print_table(
        ["ENDPOINT", "TENANT", "STATE", "PENDING", "IN FLIGHT", "MAX", "OLDEST PENDING", "FAILURES", "PAUSED UNTIL", "LAST ERROR"],
        [
            [f"{r['namespace']}/{r['name']}", r["tenant"], _state(r), r["pending"], r["in_flight"],
             r["max_concurrency"], _age(r["oldest_pending_age"]), r["consecutive_failures"],
             _time(r["paused_until"]), (r["last_error"] or "")[:60]]
            for r in rows
        ],
    )
    return 0


_COMMANDS = {
    "migrate": _migrate,
    "worker": _worker,
    "publish": _publish,
    "endpoint": _endpoint,
    "status": _status,
}


def _dev(args: argparse.Namespace, rest: list[str]) -> int:
    if args.dev_command == "demo":
        from hooklane.dev.demo import main as demo_main

        return demo_main(rest)
    if args.dev_command == "controlplane":
        from hooklane.dev.controlplane import main as controlplane_main

        return controlplane_main([])
    from hooklane.dev.postgres import LocalPostgres

    stop = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    with LocalPostgres() as pg:
        print(pg.dsn, flush=True)
        signal.sigwait(stop)
    return 0


def _read_file(path: str, option: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise InvalidInput(option, f"cannot read {path}: {exc.strerror}") from None


def _endpoint_name(value: str) -> tuple[str, str]:
    namespace, _, name = value.rpartition("/")
    return namespace or "default", name


def _state(row: Any) -> str:
    if row["state"] == "deactivated":
        return "Deactivated"
    if row["paused"]:
        return "Paused (manual)"
    if row["paused_until"] is not None and row["paused_until"] > datetime.now(timezone.utc):
        return "Paused (circuit)"
    return "Active"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _time(value: datetime | None) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") if value else "-"


def _print_table(headers: list[str], rows: list[list[Any]]) -> None:
    cells = [headers, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


if __name__ == "__main__":
    sys.exit(main())
