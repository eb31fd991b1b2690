"""Everything Hooklane keeps in Postgres, behind named statements.

The worker, the operator, the CLI and the publish call all go through here;
the SQL itself lives in ``queries.sql`` and the schema in ``migrations/``.
"""

from hooklane.store.connection import acquire, connect, create_pool
from hooklane.store.endpoints import (
    delete_endpoint,
    endpoint_queues,
    list_endpoints,
    reactivate_endpoint,
    reseal_secrets,
    upsert_endpoint,
)
from hooklane.store.events import insert_event, list_events, purge_events
from hooklane.store.migrations import migrate

__all__ = [
    "acquire",
    "connect",
    "create_pool",
    "delete_endpoint",
    "endpoint_queues",
    "insert_event",
    "list_endpoints",
    "list_events",
    "migrate",
    "purge_events",
    "reactivate_endpoint",
    "reseal_secrets",
    "upsert_endpoint",
]
