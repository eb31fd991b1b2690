"""The ``hooklane`` command."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import uvloop

from hooklane import __version__, store, tracing
from hooklane.bounded_yaml import MAX_MANIFEST_BYTES, load_yaml, load_yaml_documents
from hooklane.catalogue import MAX_SCHEMA_BYTES, is_type_name, load_manifests, resource_name_for
from hooklane.catalogue_openapi import export_title, openapi_document
from hooklane.checks import check_name, check_namespace
from hooklane.delivery import RequestTerms, SecretProblem, resolve, secrets_of
from hooklane.errors import (
    DatabaseUnreachable,
    DataRefused,
    InvalidInput,
    SchemaMissing,
    StoreError,
    printable,
    shown,
)
from hooklane.files import decode_utf8, read_bounded
from hooklane.guard import literal_never_allowed
from hooklane.health import EndpointHealth, concurrency_text
from hooklane.publish import MAX_DATA_BYTES, publish
from hooklane.selfservice import Limits, over_bounds, self_service_name
from hooklane.settings import Settings
from hooklane.signing import parse_secret
from hooklane.spec import EndpointSpec, check_tenant, load_manifest
from hooklane.store.cursor import event_position
from hooklane.times import parse_time, rfc3339, rfc3339_seconds
from hooklane.traceparent import parse_traceparent
from hooklane.views import detail_json

logger = logging.getLogger("hooklane")

# A whsec_ secret is well under 100 bytes; the limit only bounds a wrong file.
MAX_SECRET_BYTES = 4096
# Room for indentation around the event's data, itself at most MAX_DATA_BYTES.
MAX_DATA_INPUT_BYTES = 4 * MAX_DATA_BYTES
# Who discarded, as a discarded delivery's last_error records it.
_CLI_ACTOR = "hooklane endpoint discard"
# What `hooklane status` shows unless told: the worst endpoints, a screenful.
_LISTED = 50


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hooklane",
        description="Webhook delivery with a queue per endpoint. The database is HOOKLANE_DATABASE_URL.",
    )
    parser.add_argument("--version", action="version", version=f"hooklane {__version__}")
    parser.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="DEBUG, INFO, WARNING or ERROR",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    migrate = sub.add_parser("migrate", help="apply the database migrations (idempotent)")
    migrate.add_argument(
        "--catalogue-mode",
        choices=store.MODES,
        help="then set every tenant's default catalogue mode (the chart's catalogue.mode)",
    )
    sub.add_parser("worker", help="deliver: reserve, send, record; SIGTERM drains then exits")
    status = sub.add_parser(
        "status",
        help="per-endpoint queue, in flight, oldest pending age, circuit: the most delayed first",
    )
    _listing_options(status)
    sub.add_parser("api", help="serve the HTTP API: ingest, admin API, dashboard (HOOKLANE_API_PORT)")
    sub.add_parser(
        "operator",
        help="run the Kubernetes operator (kopf); `hooklane operator --help` for its options",
        add_help=False,
    )

    pub = sub.add_parser("publish", help="publish one event")
    pub.add_argument("--tenant", required=True)
    pub.add_argument("--type", required=True, help="dotted event type, e.g. order.updated")
    pub.add_argument(
        "--data",
        required=True,
        help="the event's data: a JSON object, @FILE to read it from FILE, or - for stdin",
    )
    pub.add_argument("--id", help="event id; publishing the same id twice stores it once")
    pub.add_argument("--coalesce-key", help="replaces a still-pending delivery with the same key")
    pub.add_argument(
        "--ordering-key",
        help="each endpoint gets the events of this key one at a time, in the order they committed",
    )
    pub.add_argument("--traceparent", help="the W3C trace context the event joins (00-TRACEID-SPANID-FLAGS)")

    publisher = sub.add_parser(
        "publisher", help="which tenants a database role may publish for (the publish functions' scope)"
    )
    psub = publisher.add_subparsers(dest="publisher_command", required=True, metavar="ACTION")
    for action, text in (
        ("grant", "let a role publish for these tenants, with EXECUTE on the publish functions"),
        ("revoke", "take tenants from a role's scope (all of them, and EXECUTE, unless --tenant)"),
    ):
        p = psub.add_parser(action, help=text)
        p.add_argument("role", help="the database role, as the application's connection logs in")
        chosen = p.add_mutually_exclusive_group(required=action == "grant")
        chosen.add_argument("--tenant", action="append", help="a tenant (repeatable)")
        chosen.add_argument("--all-tenants", action="store_true", help="every tenant, present and future")
    psub.add_parser("list", help="every role with a scope or with EXECUTE, and its tenants")

    catalogue = sub.add_parser(
        "catalogue", help="the event catalogue: how published events are checked, its OpenAPI export"
    )
    csub = catalogue.add_subparsers(dest="catalogue_command", required=True, metavar="ACTION")
    mode = csub.add_parser(
        "mode",
        help="check published events against the catalogue: off, warn or enforce (none: print the modes)",
    )
    mode.add_argument(
        "mode", nargs="?", choices=store.MODES, help="off, warn (store and mark) or enforce (refuse)"
    )
    whose = mode.add_mutually_exclusive_group()
    whose.add_argument("--tenant", help="this tenant's mode")
    whose.add_argument("--default", action="store_true", help="every tenant's without a mode of its own")
    export = csub.add_parser("openapi", help="the catalogue as an OpenAPI 3.1 document, for receivers")
    export.add_argument("-o", "--output", metavar="FILE", help="write it to FILE rather than standard output")

    endpoint = sub.add_parser("endpoint", help="endpoints in local mode (without Kubernetes)")
    esub = endpoint.add_subparsers(dest="endpoint_command", required=True, metavar="ACTION")
    apply = esub.add_parser("apply", help="create or update an endpoint from a WebhookEndpoint manifest")
    apply.add_argument("-f", "--filename", required=True, help="the manifest (YAML), or - for stdin")
    apply.add_argument("--secret-file", required=True, help="file holding the whsec_ signing secret")
    apply.add_argument(
        "--secrets-file",
        help="v1 Secret manifests (YAML, --- between them) that spec.delivery's headers and tls refer to",
    )
    _listing_options(esub.add_parser("list", help="list endpoints, the most delayed first"))
    esub.add_parser(
        "over-bounds",
        help="tenants' own endpoints beyond HOOKLANE_PORTAL_MAX_CONCURRENCY or _MAX_TIMEOUT_SECONDS",
    )
    for action, text in (
        ("reactivate", "reactivate a deactivated endpoint"),
        ("resend", "resend an endpoint's dead deliveries"),
        ("discard", "give up for good on an endpoint's dead deliveries"),
        ("replay", "send again every stored event of the endpoint's tenant and types since a time"),
    ):
        p = esub.add_parser(action, help=text)
        p.add_argument("endpoint", help="NAMESPACE/NAME, or NAME in namespace default")
        if action in ("resend", "discard"):
            p.add_argument(
                "--delivery", type=_delivery_id, action="append", help="only this delivery id (repeatable)"
            )
        if action == "replay":
            p.add_argument("--since", required=True, help="RFC 3339 time with a timezone")

    eventtype = sub.add_parser(
        "eventtype", help="the event catalogue's types in local mode (without Kubernetes)"
    )
    etsub = eventtype.add_subparsers(dest="eventtype_command", required=True, metavar="ACTION")
    et_apply = etsub.add_parser(
        "apply",
        help="create or update event types from WebhookEventType manifests (--- between them)",
    )
    et_apply.add_argument(
        "-f",
        "--filename",
        required=True,
        help="the manifests (YAML), or - for stdin; schema files they refer to are read relative to it",
    )
    etsub.add_parser("list", help="every event type of the catalogue, by name")
    et_delete = etsub.add_parser(
        "delete", help="remove an event type applied in local mode, with its versions"
    )
    et_delete.add_argument("name", help="the event type, as events carry it (order.paid)")

    delivery = sub.add_parser("delivery", help="one delivery and its attempts")
    dlsub = delivery.add_subparsers(dest="delivery_command", required=True, metavar="ACTION")
    show = dlsub.add_parser("show", help="a delivery, its endpoint and every attempt made of it")
    show.add_argument("id", type=_delivery_id, help="the delivery's id")
    show.add_argument("--json", action="store_true", help="print it as the admin API answers it")

    events = sub.add_parser("events", help="a tenant's events, for reconciliation")
    evsub = events.add_subparsers(dest="events_command", required=True, metavar="ACTION")
    ev_list = evsub.add_parser(
        "list",
        help="one JSON line per event, in a stable order; the next page's cursor on stderr",
    )
    ev_list.add_argument("--tenant", required=True)
    ev_list.add_argument("--since", required=True, help="RFC 3339 time with a timezone")
    ev_list.add_argument("--until", help="RFC 3339 time with a timezone (default: no end)")
    ev_list.add_argument("--limit", type=int, default=store.MAX_PAGE, help=f"at most {store.MAX_PAGE}")
    ev_list.add_argument("--cursor", help="the cursor a previous page printed: continue after it")

    dev = sub.add_parser("dev", help="local tooling: throwaway PostgreSQL, test control plane")
    dsub = dev.add_subparsers(dest="dev_command", required=True, metavar="TOOL")
    dsub.add_parser("postgres", help="run a throwaway PostgreSQL in the foreground; prints its URL")
    dsub.add_parser("controlplane", help="run kube-apiserver and etcd (envtest); prints the kubeconfig path")
    dsub.add_parser("demo", help="the main job on this machine: many endpoints, one slow", add_help=False)
    return parser


def _listing_options(parser: argparse.ArgumentParser) -> None:
    """The filters and the page of ``status`` and ``endpoint list``."""
    parser.add_argument("--tenant", help="only this tenant's endpoints")
    parser.add_argument(
        "--phase", help="only endpoints in this phase: Active, Paused, Probing or Deactivated"
    )
    parser.add_argument(
        "--not-delivering",
        action="store_true",
        help="only endpoints nothing is sent to now (deactivated, paused, circuit open, unsigned)",
    )
    parser.add_argument("--name-prefix", help="only endpoints whose name starts with this")
    parser.add_argument(
        "--limit",
        type=int,
        default=_LISTED,
        help=f"show this many, the most delayed first (default {_LISTED}, at most {store.MAX_PAGE})",
    )
    parser.add_argument("--cursor", help="the cursor a previous listing printed: continue after it")


# Commands whose options belong to another parser: the rest of argv is theirs.
_PASS_THROUGH = {("operator", None), ("dev", "demo")}


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = _main(argv)
        # Flushed here rather than at exit, where a closed pipe could not be handled.
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader went away (`hooklane status | head -1`): stop quietly with
        # the status of a process killed by SIGPIPE, as other command-line
        # tools do. stdout now leads nowhere, so the final flush cannot fail.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if rest and (args.command, getattr(args, "dev_command", None)) not in _PASS_THROUGH:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    logging.basicConfig(
        level=args.log_level,
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
        tracing.configure(f"hooklane-{args.command}")
        try:
            return uvloop.run(_COMMANDS[args.command](args, settings))
        finally:
            tracing.shutdown()
    except InvalidInput as exc:
        print(f"hooklane: {exc}", file=sys.stderr)
        return 2
    except DatabaseUnreachable as exc:
        print(f"hooklane: cannot reach the database: {exc}", file=sys.stderr)
        return 1
    except SchemaMissing:
        print(
            "hooklane: the database has no Hooklane schema, or an older one: run `hooklane migrate` first",
            file=sys.stderr,
        )
        return 1
    except DataRefused as exc:
        # A value of the command's (a time, a text) that Postgres refused:
        # the caller's to change, as for InvalidInput.
        print(f"hooklane: the database refused a value of this command: {exc}", file=sys.stderr)
        return 2
    except StoreError as exc:
        print(f"hooklane: the database refused: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


@asynccontextmanager
async def _database(settings: Settings) -> AsyncIterator[asyncpg.Connection]:
    """The command's connection, raising Hooklane's errors only, which
    :func:`main` turns into one line each."""
    conn = await store.connect(settings.database_url)
    try:
        yield conn
    finally:
        await conn.close()


async def _migrate(args: argparse.Namespace, settings: Settings) -> int:
    async with _database(settings) as conn:
        applied = await store.migrate(conn)
        print(f"applied {len(applied)} migration(s)" if applied else "database is up to date")
        if settings.encryption_key is not None:
            resealed = await store.reseal_secrets(conn, settings.encryption_key)
            print(
                f"{resealed} endpoint(s) with signing secrets sealed with key {settings.encryption_key.active}"
            )
        if args.catalogue_mode is not None:
            await store.set_catalogue_mode(conn, store.DEFAULT_TENANT, args.catalogue_mode)
            print(f"catalogue mode of every tenant without one of its own: {args.catalogue_mode}")
    return 0


async def _worker(args: argparse.Namespace, settings: Settings) -> int:
    from hooklane.worker import probes
    from hooklane.worker.runner import Worker, collect_less

    worker = Worker(settings)
    collect_less()
    probe_server = None
    port = settings.metrics_port_of("worker")
    if port:
        try:
            probe_server = await probes.serve(worker.ready, settings.metrics_host, port)
        except OSError as exc:
            raise InvalidInput(
                "HOOKLANE_METRICS_PORT",
                f"cannot serve metrics on {settings.metrics_host}:{port}: "
                f"{os.strerror(exc.errno) if exc.errno else exc}",
            ) from None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    try:
        await worker.run()
    finally:
        if probe_server is not None:
            await probe_server.cleanup()
    return 0


async def _publish(args: argparse.Namespace, settings: Settings) -> int:
    data = _data(args.data)
    parent = None if args.traceparent is None else str(parse_traceparent(args.traceparent, "--traceparent"))
    # Traced, the event joins the command's span, a child of --traceparent.
    with tracing.internal("publish", parent=parent):
        async with _database(settings) as conn, conn.transaction():
            event_id = await publish(
                conn,
                tenant=args.tenant,
                type=args.type,
                data=data,
                id=args.id,
                coalesce_key=args.coalesce_key,
                traceparent=None if tracing.enabled() else parent,
                ordering_key=args.ordering_key,
            )
            # The command's own transaction: the workers probe at once.
            await store.hint_published(conn)
    print(event_id)
    return 0


async def _publisher(args: argparse.Namespace, settings: Settings) -> int:
    """``hooklane publisher``: the tenants each application role may
    publish for, as the publish functions check them (docs/publishing.md)."""
    action = args.publisher_command
    if action == "list":
        async with _database(settings) as conn:
            scopes = await store.publisher_scopes(conn)
        _print_table(
            ["ROLE", "TENANTS", "EXECUTE"],
            [
                [
                    s.role,
                    ",".join("*" if t is None else t for t in s.tenants) or "- (refused for every tenant)",
                    "/".join(f"v{v}" for v, held in enumerate(s.execute, 1) if held) or "-",
                ]
                for s in scopes
            ],
        )
        return 0
    tenants: list[str | None] | None = None
    if args.all_tenants:
        tenants = [None]
    elif args.tenant:
        tenants = [check_tenant(t, "--tenant") for t in args.tenant]
    role = printable(args.role)
    async with _database(settings) as conn:
        if action == "grant":
            assert tenants is not None
            added = await store.grant_publisher(conn, args.role, tenants)
            print(f"{role} may publish for {_tenants_text(tenants)} ({added} new)")
            return 0
        removed, remaining = await store.revoke_publisher(conn, args.role, tenants)
    left = f"{remaining} left" if remaining else "none left, EXECUTE revoked"
    print(f"{removed} of {role}'s tenants revoked ({left})")
    return 0


async def _catalogue(args: argparse.Namespace, settings: Settings) -> int:
    if args.catalogue_command == "openapi":
        return await _catalogue_openapi(args, settings)
    return await _catalogue_mode(args, settings)


async def _catalogue_openapi(args: argparse.Namespace, settings: Settings) -> int:
    """``hooklane catalogue openapi``: the document ``GET
    /v1/catalogue/openapi.json`` answers, from the database."""
    async with _database(settings) as conn:
        entries = await store.catalogue_entries(conn)
    text = json.dumps(openapi_document(entries, title=export_title(settings.portal_name)), indent=2)
    if args.output is None:
        print(text)
        return 0
    try:
        await asyncio.to_thread(Path(args.output).write_text, text + "\n", encoding="utf-8")
    except OSError as exc:
        raise InvalidInput("--output", f"cannot be written: {exc.strerror or exc}") from None
    print(f"{len(entries)} event types written to {printable(args.output)}", file=sys.stderr)
    return 0


async def _catalogue_mode(args: argparse.Namespace, settings: Settings) -> int:
    """``hooklane catalogue mode``: how published events are checked against the
    event catalogue (docs/catalogue.md)."""
    tenant = None if args.tenant is None else check_tenant(args.tenant, "--tenant")
    async with _database(settings) as conn:
        if args.mode is None:
            if tenant is not None:
                mode, own = await store.catalogue_mode_of(conn, tenant)
                print(f"{printable(tenant)}: {mode}" + ("" if own else " (the default)"))
                return 0
            modes = await store.catalogue_modes(conn)
            if not any(m.tenant == store.DEFAULT_TENANT for m in modes):
                modes.insert(0, store.TenantMode(store.DEFAULT_TENANT, "off"))
            _print_table(["TENANT", "MODE"], [[m.tenant or "(default)", m.mode] for m in modes])
            return 0
        if tenant is None and not args.default:
            raise InvalidInput("--tenant", "or --default is required: whose mode is set")
        await store.set_catalogue_mode(conn, tenant or store.DEFAULT_TENANT, args.mode)
        if args.mode == "enforce" and await store.catalogue_type_count(conn) == 0:
            print(
                "hooklane: note: the catalogue holds no type yet, so every event of these tenants is "
                "refused until one is applied (hooklane eventtype apply, or a WebhookEventType)",
                file=sys.stderr,
            )
    whose = "every tenant without a mode of its own" if tenant is None else printable(tenant)
    print(f"published events of {whose} are checked: {args.mode}")
    return 0


def _tenants_text(tenants: list[str | None]) -> str:
    return "every tenant" if None in tenants else ", ".join(printable(str(t)) for t in tenants)


async def _endpoint(args: argparse.Namespace, settings: Settings) -> int:
    action = args.endpoint_command
    if action == "apply":
        return await _endpoint_apply(args, settings)
    if action == "list":
        healths = await _listed(args, settings)
        _print_table(
            ["NAMESPACE", "NAME", "TENANT", "URL", "MAX", "STATE", "FAILURES", "PAUSED UNTIL"],
            [
                [
                    h.namespace,
                    h.name,
                    h.tenant,
                    h.url,
                    concurrency_text(h),
                    h.standing,
                    h.consecutive_failures,
                    rfc3339_seconds(h.paused_until) or "-",
                ]
                for h in healths
            ],
        )
        return 0
    if action == "over-bounds":
        return await _over_bounds(settings)
    namespace, name = _endpoint_name(args.endpoint)
    endpoint = f"{namespace}/{name}"
    since = parse_time(args.since, "--since") if action == "replay" else None
    async with _database(settings) as conn:
        if action == "reactivate":
            reactivation = await store.reactivate_endpoint(conn, namespace, name)
            if reactivation is store.Reactivation.NOT_DEACTIVATED:
                print(
                    f"hooklane: {endpoint} is not deactivated: nothing to reactivate, its circuit is left as it is",
                    file=sys.stderr,
                )
                return 1
            done = None if reactivation is store.Reactivation.NO_ENDPOINT else f"{endpoint} reactivated"
        elif action == "resend":
            count = await store.resend_dead(conn, namespace, name, args.delivery)
            done = None if count is None else f"{count} dead deliveries of {endpoint} queued again"
        elif action == "discard":
            discarded = await store.discard_dead(conn, namespace, name, args.delivery, _CLI_ACTOR)
            done = None if discarded is None else f"{discarded.count} dead deliveries of {endpoint} discarded"
        else:
            assert since is not None
            count = await store.replay_since(conn, namespace, name, since)
            done = None if count is None else f"{count} events queued again for {endpoint}"
    if done is None:
        print(f"{namespace}/{name} not found", file=sys.stderr)
        return 1
    print(done)
    return 0


async def _eventtype(args: argparse.Namespace, settings: Settings) -> int:
    """Event types in local mode: written as source 'local', which the
    operator's WebhookEventTypes never overwrite or delete (nor these them)."""
    action = args.eventtype_command
    if action == "apply":
        return await _eventtype_apply(args, settings)
    if action == "list":
        async with _database(settings) as conn:
            types = await store.applied_event_types(conn)
        _print_table(
            ["NAME", "GROUP", "LATEST", "VERSIONS", "DEPRECATED", "ARCHIVED", "SOURCE"],
            [
                [
                    t.name,
                    t.group or "-",
                    t.latest or "-",
                    t.versions,
                    t.deprecated_since or "-",
                    "yes" if t.archived else "no",
                    t.source,
                ]
                for t in types
            ],
        )
        return 0
    name = args.name
    if not is_type_name(name):
        raise InvalidInput("name", f"must be an event type like 'order.paid', not {shown(name)}")
    async with _database(settings) as conn:
        removed = await store.delete_event_type(conn, name, store.EventTypeSource.LOCAL)
    if removed.found:
        print(f"webhookeventtype {name} deleted")
        return 0
    if removed.held_by is not None:
        print(
            f"hooklane: {name} was applied from Kubernetes (a WebhookEventType): "
            f"delete it there (kubectl delete webhookeventtype {resource_name_for(name)})",
            file=sys.stderr,
        )
        return 2
    print(f"hooklane: no event type {name}", file=sys.stderr)
    return 1


async def _eventtype_apply(args: argparse.Namespace, settings: Settings) -> int:
    raw = read_bounded(args.filename, "--filename", MAX_MANIFEST_BYTES, stdin=True)
    # Schema files are named relative to the manifest (to the working
    # directory for stdin, whose dirname is "").
    specs = load_manifests(raw, "--filename", _schema_file, args.filename)
    refused = 0
    async with _database(settings) as conn:
        for spec in specs:
            applied = await store.apply_event_type(conn, spec, store.EventTypeSource.LOCAL)
            if applied.held_by is not None:
                refused += 1
                print(
                    f"hooklane: {spec.name} was applied from Kubernetes (a WebhookEventType): "
                    "left as it is; change it there",
                    file=sys.stderr,
                )
                continue
            done = "created" if applied.created else "configured"
            print(f"webhookeventtype {spec.name} {done} (latest version {spec.latest})")
            if applied.removed_versions:
                print(
                    f"  versions no longer listed, removed: {', '.join(map(str, applied.removed_versions))}"
                )
    return 2 if refused else 0


def _schema_file(target: str, here: str) -> tuple[Any, str]:
    """A schema file a manifest refers to, by a path relative to the file
    holding the reference; YAML or JSON."""
    path = os.path.normpath(os.path.join(os.path.dirname(here), target))
    raw = read_bounded(path, target, MAX_SCHEMA_BYTES)
    return load_yaml(raw, target), path


async def _over_bounds(settings: Settings) -> int:
    """The endpoints tenants made in the portal's namespace that hold more
    than the platform's current bounds let a tenant choose: kept as they
    are (an edit may keep or lower them), listed here for the platform to
    decide."""
    async with _database(settings) as conn:
        found = await store.over_limits(
            conn,
            settings.portal_namespace,
            settings.portal_max_concurrency,
            settings.portal_max_timeout_seconds,
        )
    rows = [
        [
            settings.portal_namespace,
            row.name,
            row.tenant,
            ", ".join(
                f"{over.field} {over.value} > {over.bound}"
                for over in over_bounds(Limits(row.max_concurrency, row.timeout_seconds), settings)
            ),
        ]
        for row in found
        if self_service_name(settings, row.tenant, settings.portal_namespace, row.name) is not None
    ]
    if not rows:
        print(
            f"no tenant's endpoint in {settings.portal_namespace} is beyond max_concurrency"
            f" {settings.portal_max_concurrency} or timeout_seconds {settings.portal_max_timeout_seconds}"
        )
        return 0
    _print_table(["NAMESPACE", "NAME", "TENANT", "BEYOND"], rows)
    return 0


async def _endpoint_apply(args: argparse.Namespace, settings: Settings) -> int:
    spec = load_manifest(
        read_bounded(args.filename, "--filename", MAX_MANIFEST_BYTES, stdin=True), "--filename"
    )
    refusal = literal_never_allowed(urlsplit(spec.url).hostname or "", settings.allowed_networks)
    if refusal is not None:
        raise InvalidInput("spec.url", f"{refusal} (HOOKLANE_ALLOWED_NETWORKS does not list it)")
    raw = read_bounded(args.secret_file, "--secret-file", MAX_SECRET_BYTES, stdin=True)
    secret = decode_utf8(raw, "--secret-file").strip()
    parse_secret(secret)
    terms = _request_terms(spec, args.secrets_file)
    async with _database(settings) as conn:
        result = await store.upsert_endpoint(
            conn,
            spec,
            secret,
            terms=terms,
            keyring=settings.encryption_key,
            grace_seconds=settings.secret_grace_seconds,
        )
    print(f"webhookendpoint {spec.namespace}/{spec.name} {'created' if result.created else 'configured'}")
    if result.previous_tenant is not None:
        print(
            f"tenant changed from {printable(result.previous_tenant)} to {printable(spec.tenant)}: "
            f"{result.discarded} pending or dead deliveries of the old tenant's events discarded"
        )
    if result.rotated:
        print(f"signing secret rotated: the previous one also signs for {settings.secret_grace_seconds:g} s")
    return 0


def _request_terms(spec: EndpointSpec, secrets_file: str | None) -> RequestTerms | None:
    """spec.delivery's headers and TLS, their Secrets read from
    ``secrets_file``: a reference it cannot resolve is refused, as nothing
    would be delivered with it."""
    secrets: dict[str, dict[str, str]] = {}
    if secrets_file is not None:
        raw = read_bounded(secrets_file, "--secrets-file", MAX_MANIFEST_BYTES, stdin=False)
        secrets = secrets_of(load_yaml_documents(raw, "--secrets-file"), spec.namespace, "--secrets-file")
    elif spec.delivery.secret_names():
        raise InvalidInput("--secrets-file", "is required: spec.delivery refers to Secrets")
    try:
        return resolve(spec.delivery, spec.namespace, secrets.get)
    except SecretProblem as exc:
        raise InvalidInput("--secrets-file", exc.message) from None


async def _listed(args: argparse.Namespace, settings: Settings) -> list[EndpointHealth]:
    """The page of endpoints ``args`` ask for. When more match than it
    holds, stderr says how many and how to see the next ones, so that
    the table on stdout stays a table."""
    chosen = store.EndpointFilter(
        tenant=None if args.tenant is None else check_tenant(args.tenant, "--tenant"),
        name_prefix=store.check_name_prefix(args.name_prefix, "--name-prefix"),
        phase=store.check_phase(args.phase, "--phase"),
        not_delivering=args.not_delivering,
    )
    limit = store.check_page(args.limit, "--limit")
    store.endpoint_position(args.cursor, "--cursor")
    async with _database(settings) as conn:
        page = await store.endpoint_page(conn, chosen, cursor=args.cursor, limit=limit)
        totals = await store.endpoint_totals(conn, chosen) if page.cursor is not None else None
    if page.cursor is not None and totals is not None:
        print(
            f"hooklane: {len(page.endpoints)} shown of {totals.endpoints} endpoints"
            f"{' matching' if chosen != store.EndpointFilter() else ''}, the most delayed first; "
            f"the next ones: --cursor {page.cursor}",
            file=sys.stderr,
        )
    return page.endpoints


async def _status(args: argparse.Namespace, settings: Settings) -> int:
    healths = await _listed(args, settings)
    _print_table(
        [
            "ENDPOINT",
            "TENANT",
            "STATE",
            "PENDING",
            "IN FLIGHT",
            "DEAD",
            "SENDING ON",
            "MAX",
            "OLDEST PENDING",
            "FAILURES",
            "PAUSED UNTIL",
            "LAST ERROR",
        ],
        [
            [
                f"{h.namespace}/{h.name}",
                h.tenant,
                h.standing,
                h.pending,
                h.in_flight,
                h.dead,
                ",".join(h.sending_on or ["-"]),
                concurrency_text(h),
                _age(h.oldest_pending_age),
                h.consecutive_failures,
                rfc3339_seconds(h.paused_until) or "-",
                (h.last_error or "")[:60],
            ]
            for h in healths
        ],
    )
    if healths:
        async with _database(settings) as conn:
            held = await store.held_key_counts(conn, [h.id for h in healths])
        _print_held_keys(held, healths[0].observed_at)
    return 0


def _print_held_keys(held: list[store.HeldKeyCount], now: datetime) -> None:
    """Of the endpoints listed, those whose ordered deliveries wait behind
    a dead delivery of their key: nothing more of such a key is sent until
    that delivery is resent or discarded (docs/operations.md)."""
    if not held:
        return
    print()
    _print_table(
        ["HELD KEYS OF", "TENANT", "KEYS HELD", "OLDEST HELD SINCE"],
        [
            [
                f"{h.namespace}/{h.name}",
                h.tenant,
                h.keys_held,
                f"{rfc3339_seconds(h.oldest_held_since)} ({_age((now - h.oldest_held_since).total_seconds())})",
            ]
            for h in held
        ],
    )


async def _events(args: argparse.Namespace, settings: Settings) -> int:
    """``hooklane events list``: one JSON object per line on stdout, then
    ``cursor: C`` on stderr, C the ``--cursor`` of the next page (also when
    the page is empty: asked again later, it returns what committed since)."""
    since = parse_time(args.since, "--since")
    until = None if args.until is None else parse_time(args.until, "--until")
    # Checked here to name the option, and before connecting.
    event_position(args.cursor, "--cursor")
    async with _database(settings) as conn:
        page = await store.list_events(
            conn, args.tenant, since, until, limit=store.check_page(args.limit, "--limit"), cursor=args.cursor
        )
    for event in page.events:
        line = {
            "id": event.id,
            "type": event.type,
            "created_at": rfc3339(event.created_at),
            "fanout": event.fanout,
            "data": json.loads(event.data),
        }
        print(json.dumps(line, ensure_ascii=False))
    print(f"cursor: {page.cursor}", file=sys.stderr)
    return 0


async def _delivery(args: argparse.Namespace, settings: Settings) -> int:
    """``hooklane delivery show``: what a support engineer asks first about
    one delivery (where it went, what each attempt got back)."""
    async with _database(settings) as conn:
        detail = await store.delivery_detail(conn, args.id)
    if detail is None:
        print(f"delivery {args.id} not found", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(detail_json(detail), ensure_ascii=False, indent=2))
        return 0
    d = detail.delivery
    _print_fields(
        [
            ("delivery", d.id),
            ("endpoint", f"{detail.namespace}/{detail.name}"),
            ("tenant", detail.tenant),
            ("event", f"{d.event_id} ({d.event_type})"),
            ("state", d.state),
            ("created", rfc3339_seconds(d.created_at)),
            *([("queued again", rfc3339_seconds(d.queued_again_at))] if d.queued_again_at else []),
            ("next attempt", rfc3339_seconds(d.next_attempt_at) or "-"),
            ("delivered", rfc3339_seconds(d.delivered_at) or "-"),
            ("attempts", d.attempts),
            ("last status", d.last_status or "-"),
            ("last failure", d.last_failure or "-"),
            ("last error", d.last_error or "-"),
        ]
    )
    print()
    _print_table(
        ["ATTEMPT", "STARTED", "DURATION", "OUTCOME", "STATUS", "ERROR", "WORKER"],
        [
            [
                a.attempt,
                rfc3339_seconds(a.started_at),
                "-" if a.duration_seconds is None else f"{a.duration_seconds:.3f}s",
                a.outcome,
                a.status or a.failure or "-",
                (a.error or "-")[:60],
                a.attempted_by or "-",
            ]
            for a in detail.attempts
        ],
    )
    if detail.attempts_truncated:
        print(
            f"hooklane: only the first {store.MAX_ATTEMPTS_SHOWN} attempts are shown: it has more",
            file=sys.stderr,
        )
    return 0


async def _api(args: argparse.Namespace, settings: Settings) -> int:
    from hooklane.api.app import run

    return await run(settings)


_COMMANDS = {
    "api": _api,
    "migrate": _migrate,
    "worker": _worker,
    "publish": _publish,
    "publisher": _publisher,
    "catalogue": _catalogue,
    "endpoint": _endpoint,
    "eventtype": _eventtype,
    "status": _status,
    "events": _events,
    "delivery": _delivery,
}


def _dev(args: argparse.Namespace, rest: list[str]) -> int:
    # The wheel leaves hooklane.dev out: it reads crds/ and hack/ beside it.
    if importlib.util.find_spec("hooklane.dev") is None:
        print(
            "hooklane: `hooklane dev` needs a source checkout (clone the repository, then pip install -e .)",
            file=sys.stderr,
        )
        return 2
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


def _data(value: str) -> Any:
    """``--data``: inline JSON, @FILE, or - for stdin (no shell argument
    limit on those)."""
    if value == "-" or value.startswith("@"):
        raw = read_bounded(value.removeprefix("@"), "--data", MAX_DATA_INPUT_BYTES, stdin=True)
        text = decode_utf8(raw, "--data")
    else:
        # Arguments that are not UTF-8 reach Python as lone surrogates.
        text = decode_utf8(value.encode("utf-8", "surrogatepass"), "--data")
    try:
        return json.loads(text)
    except RecursionError:
        raise InvalidInput("--data", "nests too deeply") from None
    except ValueError as exc:
        raise InvalidInput("--data", f"is not valid JSON: {exc}") from None


def _delivery_id(text: str) -> int:
    try:
        return store.check_delivery_id(text)
    except InvalidInput:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a delivery id") from None


def _endpoint_name(value: str) -> tuple[str, str]:
    namespace, slash, name = value.rpartition("/")
    try:
        return (check_namespace(namespace, "endpoint") if slash else "default"), check_name(name, "endpoint")
    except InvalidInput:
        raise InvalidInput(
            "endpoint", f"must be NAMESPACE/NAME or NAME, lowercase DNS-style names, not {shown(value)}"
        ) from None


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _print_fields(fields: list[tuple[str, Any]]) -> None:
    """One ``name  value`` line each, the values aligned."""
    width = max(len(name) for name, _ in fields)
    for name, value in fields:
        print(f"{name.ljust(width)}  {printable(str(value))}")


def _print_table(headers: list[str], rows: list[list[Any]]) -> None:
    # Names, URLs and errors may hold escape sequences meant for the terminal.
    cells = [headers, *[[printable(str(c)) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip())


if __name__ == "__main__":
    sys.exit(main())
