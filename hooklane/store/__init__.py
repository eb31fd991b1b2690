"""Everything Hooklane keeps in Postgres, behind named statements.

The worker, the operator, the CLI and the publish call all go through here,
as ``store.<name>``; the SQL itself lives in ``queries.sql``, the schema in
``migrations/`` (and, whole, in ``schema.sql``).
"""

from hooklane.store.connection import (
    API_SESSION,
    CONNECTION_LOST,
    WORKER_SESSION,
    acquire,
    connect,
    create_pool,
)
from hooklane.store.cursor import delivery_position
from hooklane.store.deliveries import (
    MAX_DELIVERY_ID,
    STATES,
    DeliveryPage,
    DeliveryView,
    Result,
    Unrouted,
    check_delivery_id,
    check_states,
    complete,
    deactivate_failing,
    discard_dead,
    endpoint_deliveries,
    partition_count,
    replay_since,
    rescue_expired,
    resend_dead,
    reserve,
    sweep_ready,
    unrouted_counts,
    unrouted_events,
)
from hooklane.store.endpoints import (
    Upserted,
    delete_endpoint,
    endpoint_health,
    list_endpoints,
    reactivate_endpoint,
    reseal_secrets,
    upsert_endpoint,
)
from hooklane.store.events import (
    MAX_PAGE,
    EventPage,
    EventRow,
    StoredEvent,
    check_page,
    insert_event,
    insert_events,
    list_events,
    purge_events,
)
from hooklane.store.locks import live_workers, try_lock, unlock
from hooklane.store.migrations import available as available_migrations
from hooklane.store.migrations import migrate
from hooklane.store.queries import parse as parse_queries

__all__ = [
    "API_SESSION",
    "CONNECTION_LOST",
    "MAX_DELIVERY_ID",
    "MAX_PAGE",
    "STATES",
    "WORKER_SESSION",
    "DeliveryPage",
    "DeliveryView",
    "EventPage",
    "EventRow",
    "Result",
    "StoredEvent",
    "Unrouted",
    "Upserted",
    "acquire",
    "available_migrations",
    "check_delivery_id",
    "check_page",
    "check_states",
    "complete",
    "connect",
    "create_pool",
    "deactivate_failing",
    "delete_endpoint",
    "delivery_position",
    "discard_dead",
    "endpoint_deliveries",
    "endpoint_health",
    "insert_event",
    "insert_events",
    "list_endpoints",
    "list_events",
    "live_workers",
    "migrate",
    "parse_queries",
    "partition_count",
    "purge_events",
    "reactivate_endpoint",
    "replay_since",
    "rescue_expired",
    "reseal_secrets",
    "resend_dead",
    "reserve",
    "sweep_ready",
    "try_lock",
    "unlock",
    "unrouted_counts",
    "unrouted_events",
    "upsert_endpoint",
]
