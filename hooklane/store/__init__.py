"""Everything Hooklane keeps in Postgres, behind named statements.

The worker, the operator, the CLI and the publish call all go through here,
as ``store.<name>``; the SQL itself lives in ``queries.sql``, the schema in
``migrations/`` (and, whole, in ``schema.sql``).
"""

from hooklane.store.connection import (
    CONNECTION_LOST,
    WORKER_SESSION,
    acquire,
    connect,
    create_pool,
)
from hooklane.store.deliveries import (
    Result,
    complete,
    deactivate_failing,
    dead_counts,
    partition_count,
    rescue_expired,
    resend_dead,
    reserve,
    sweep_ready,
    unrouted_events,
)
from hooklane.store.endpoints import (
    Upserted,
    delete_endpoint,
    endpoint_queues,
    list_endpoints,
    reactivate_endpoint,
    reseal_secrets,
    upsert_endpoint,
)
from hooklane.store.events import insert_event, list_events, purge_events
from hooklane.store.locks import live_workers, try_lock, unlock
from hooklane.store.migrations import available as available_migrations
from hooklane.store.migrations import migrate
from hooklane.store.queries import parse as parse_queries

__all__ = [
    "CONNECTION_LOST",
    "WORKER_SESSION",
    "Result",
    "Upserted",
    "acquire",
    "available_migrations",
    "complete",
    "connect",
    "create_pool",
    "deactivate_failing",
    "dead_counts",
    "delete_endpoint",
    "endpoint_queues",
    "insert_event",
    "list_endpoints",
    "list_events",
    "live_workers",
    "migrate",
    "parse_queries",
    "partition_count",
    "purge_events",
    "reactivate_endpoint",
    "rescue_expired",
    "reseal_secrets",
    "resend_dead",
    "reserve",
    "sweep_ready",
    "try_lock",
    "unlock",
    "unrouted_events",
    "upsert_endpoint",
]
