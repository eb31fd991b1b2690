"""``hooklane operator``: options, settings, then kopf."""

from __future__ import annotations

import argparse
import secrets

import kopf

from hooklane.errors import InvalidInput
from hooklane.operator import eventtypes, handlers
from hooklane.settings import Settings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hooklane operator",
        description="Sync WebhookEndpoint resources into Postgres (HOOKLANE_DATABASE_URL) "
        "and write their queue health back onto their status, and WebhookEventType resources "
        "(cluster-scoped, watched in every mode) into the event catalogue. See docs/operator.md.",
    )
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        metavar="NAMESPACE",
        help="watch this namespace (repeatable; kopf glob patterns allowed)",
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument(
        "--standalone", action="store_true", help="no peering: for a single replica, local runs and tests"
    )
    peering.add_argument(
        "--peering",
        metavar="NAME",
        help="KopfPeering (namespaced) or ClusterKopfPeering (-A) object that "
        "keeps one replica active at a time; it must exist",
    )
    parser.add_argument(
        "--liveness", metavar="URL", help="serve a liveness probe, e.g. http://0.0.0.0:8080/healthz"
    )
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    config = Settings.from_env()
    if not config.database_url:
        raise InvalidInput("HOOKLANE_DATABASE_URL", "is not set: point it at the PostgreSQL database")
    registry = kopf.OperatorRegistry()
    handlers.register(registry, config)
    eventtypes.register(registry)
    kopf.run(
        registry=registry,
        memo=kopf.Memo(config=config),
        clusterwide=args.all_namespaces,
        namespaces=args.namespace or (),
        standalone=args.standalone,
        peering_name=args.peering,
        # kopf pauses every replica when peers share a priority, and the
        # highest one otherwise wins: a random priority per process leaves
        # exactly one replica active, and a restarted replica may take over.
        priority=secrets.randbelow(2**31 - 1) + 1,
        liveness_endpoint=args.liveness,
    )
    return 0
