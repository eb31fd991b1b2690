"""Every Prometheus metric Hooklane exports, in one place.

Per-endpoint series carry the endpoint's namespace and name, never its URL.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import choose_encoder

from hooklane.results import ResultOutcome

DELIVERIES = Counter("hooklane_deliveries_total", "Delivery attempts by outcome.", ["outcome"])
_CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
DELIVERY_DURATION = Histogram(
    "hooklane_delivery_duration_seconds", "Whole-call duration of delivery attempts.", buckets=_CALL_BUCKETS
)
# The same calls by what they did (ResultOutcome), so that the slow ones of
# each outcome stand apart; when the worker is traced, each bucket's
# exemplar names the trace of a call in it (OpenMetrics exposition only).
ATTEMPT_DURATION = Histogram(
    "hooklane_attempt_duration_seconds",
    "Whole-call duration of delivery attempts, by outcome (delivered, retry, dead).",
    ["outcome"],
    buckets=_CALL_BUCKETS,
)
# Made once: each attempt then observes without the labels' lookup, and
# every outcome has its series from the start.
ATTEMPT_DURATION_BY = {outcome: ATTEMPT_DURATION.labels(outcome) for outcome in ResultOutcome}
IN_FLIGHT = Gauge("hooklane_worker_in_flight", "Deliveries this worker process has in flight.")
# The two classes of hooklane/worker/slots.py: quick slots hold calls
# until HOOKLANE_LONG_CALL_SECONDS, the long budget those that run longer.
CALLS_IN_FLIGHT = Gauge(
    "hooklane_worker_calls_in_flight", "Calls in flight in this worker, by slot class.", ["class"]
)
CALLS_IN_FLIGHT_QUICK = CALLS_IN_FLIGHT.labels("quick")
CALLS_IN_FLIGHT_LONG = CALLS_IN_FLIGHT.labels("long")
CALL_CAPACITY = Gauge(
    "hooklane_worker_call_capacity", "Calls this worker may have in flight, by slot class.", ["class"]
)
CALLS_WENT_LONG = Counter(
    "hooklane_worker_calls_went_long_total",
    "Calls that ran past HOOKLANE_LONG_CALL_SECONDS and moved to the long budget.",
)
SLOW_ENDPOINTS_WAITING = Gauge(
    "hooklane_worker_slow_endpoints_waiting",
    "Slow endpoints with a delivery due, waiting for room in the long budget.",
)
# Bounded: the TOP_TENANTS tenants with the most calls in flight here.
TOP_TENANTS = 10
TENANT_CALLS_IN_FLIGHT = Gauge(
    "hooklane_worker_tenant_calls_in_flight",
    f"Calls in flight in this worker per tenant, for its {TOP_TENANTS} busiest tenants only.",
    ["tenant"],
)
RESERVATION_DURATION = Histogram(
    "hooklane_reservation_duration_seconds",
    "Time of one reservation round trip.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
PARTITIONS_OWNED = Gauge("hooklane_worker_partitions_owned", "Partitions this worker owns.")
RESCUED = Counter("hooklane_deliveries_rescued_total", "Deliveries requeued after their worker lost them.")

ENDPOINT_PENDING = Gauge(
    "hooklane_endpoint_pending", "Pending deliveries per endpoint.", ["namespace", "name"]
)
ENDPOINT_IN_FLIGHT = Gauge(
    "hooklane_endpoint_in_flight", "Deliveries in flight per endpoint.", ["namespace", "name"]
)
ENDPOINT_OLDEST_PENDING_AGE = Gauge(
    "hooklane_endpoint_oldest_pending_age_seconds",
    "Age of the oldest pending delivery per endpoint: what its receiver feels.",
    ["namespace", "name"],
)
ENDPOINT_DEAD = Gauge(
    "hooklane_endpoint_dead_deliveries", "Dead deliveries kept per endpoint.", ["namespace", "name"]
)
ENDPOINT_EFFECTIVE_CONCURRENCY = Gauge(
    "hooklane_endpoint_effective_concurrency",
    "Concurrency limit in force of an adaptive endpoint its receiver's overload signals lowered"
    " below maxConcurrency.",
    ["namespace", "name"],
)
ENDPOINTS_PAUSED = Gauge(
    "hooklane_endpoints_paused",
    "Endpoints to which nothing is sent: circuit open and pausing, paused by hand, or deactivated.",
    ["reason"],
)
ENDPOINTS_PROBING = Gauge(
    "hooklane_endpoints_probing",
    "Endpoints whose circuit is open but its pause over: their next delivery is a probe.",
)
EVENTS_UNROUTED = Gauge("hooklane_events_unrouted", "Events kept although they matched no endpoint.")

# The database's xmin horizon and Hooklane's tables (jobs.HorizonWatch): the
# owner of partition 0 reports them; the others show 0, or no series.
HORIZON_AGE = Gauge(
    "hooklane_xmin_horizon_age_seconds",
    "How long the oldest transaction, snapshot, prepared transaction, replication slot or standby "
    "holding back the database's xmin horizon has held it: no dead row younger can be vacuumed.",
)
HORIZON_XID_AGE = Gauge(
    "hooklane_xmin_horizon_age_xids",
    "Transactions begun since the one the oldest holder of the xmin horizon holds.",
)
# One series at most, of the holder that stayed put for a pass: its labels
# change with every holder, so the series never outlives the holder.
HORIZON_HOLDER = Gauge(
    "hooklane_xmin_horizon_holder",
    "The oldest holder of the xmin horizon, in its labels (always 1): kind (backend, "
    "prepared_transaction, replication_slot, standby), pid, usename, application_name, state, and "
    "name (a slot's, a prepared transaction's gid).",
    ["kind", "pid", "usename", "application_name", "state", "name"],
)
HORIZON_VISIBLE = Gauge(
    "hooklane_xmin_horizon_visible",
    "1 if the worker's database role sees every session's transaction (pg_read_all_stats); "
    "0 if other roles' sessions show no state or age.",
)
TABLE_LIVE_ROWS = Gauge("hooklane_table_live_rows", "Live rows of a Hooklane table (estimate).", ["table"])
TABLE_DEAD_ROWS = Gauge(
    "hooklane_table_dead_rows", "Dead rows of a Hooklane table not vacuumed yet (estimate).", ["table"]
)
TABLE_LAST_AUTOVACUUM = Gauge(
    "hooklane_table_last_autovacuum_timestamp_seconds",
    "When autovacuum last vacuumed a Hooklane table; no series if never.",
    ["table"],
)
TABLE_LAST_VACUUM = Gauge(
    "hooklane_table_last_vacuum_timestamp_seconds",
    "When a Hooklane table was last vacuumed by hand (VACUUM); no series if never.",
    ["table"],
)
TABLE_AUTOVACUUMS = Gauge(
    "hooklane_table_autovacuum_count",
    "Times autovacuum vacuumed a Hooklane table since Postgres' statistics were last reset.",
    ["table"],
)
PER_TABLE = (TABLE_LIVE_ROWS, TABLE_DEAD_ROWS, TABLE_LAST_AUTOVACUUM, TABLE_LAST_VACUUM, TABLE_AUTOVACUUMS)

PER_ENDPOINT = (
    ENDPOINT_PENDING,
    ENDPOINT_IN_FLIGHT,
    ENDPOINT_OLDEST_PENDING_AGE,
    ENDPOINT_DEAD,
    ENDPOINT_EFFECTIVE_CONCURRENCY,
)

# HOOKLANE_METRICS_ENDPOINTS=tenant: the same, summed per tenant of this
# worker's partitions (the oldest age is the tenant's oldest).
TENANT_PENDING = Gauge("hooklane_tenant_pending", "Pending deliveries per tenant.", ["tenant"])
TENANT_IN_FLIGHT = Gauge("hooklane_tenant_in_flight", "Deliveries in flight per tenant.", ["tenant"])
TENANT_OLDEST_PENDING_AGE = Gauge(
    "hooklane_tenant_oldest_pending_age_seconds",
    "Age of the oldest pending delivery among a tenant's endpoints.",
    ["tenant"],
)
TENANT_DEAD = Gauge("hooklane_tenant_dead_deliveries", "Dead deliveries kept per tenant.", ["tenant"])
PER_TENANT = (TENANT_PENDING, TENANT_IN_FLIGHT, TENANT_OLDEST_PENDING_AGE, TENANT_DEAD)
ENDPOINTS_EXPORTED = Gauge(
    "hooklane_endpoints_exported",
    "Endpoints of this worker's partitions with per-endpoint series (HOOKLANE_METRICS_ENDPOINTS), "
    "and how many it has in all.",
    ["kind"],
)

DESTINATIONS_DENIED = Counter(
    "hooklane_destinations_denied_total",
    "Delivery attempts refused before connecting: the address is not allowed (HOOKLANE_ALLOWED_NETWORKS).",
)

# `hooklane api`. `route` is the route's template (/v1/admin/endpoints/{namespace}/{name}),
# never the path a client sent, so that the series stay few.
API_REQUESTS = Counter(
    "hooklane_api_requests_total", "HTTP requests answered by the API.", ["route", "method", "status"]
)
API_ACK = Histogram(
    "hooklane_api_ack_seconds",
    "From an ingest request's arrival to its 202, sent once its events are committed.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
API_EVENTS_ACCEPTED = Counter(
    "hooklane_api_events_accepted_total", "Events committed by the ingest API (duplicates included)."
)
API_COMMIT_EVENTS = Histogram(
    "hooklane_api_commit_events",
    "Events per ingest transaction: how many concurrent requests one group commit acknowledged.",
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000),
)
API_EVENTS_REFUSED = Counter(
    "hooklane_api_events_refused_total",
    "Ingest requests refused, by reason (a refused batch counts once).",
    ["reason"],
)

API_COMMIT_RETRIES = Counter(
    "hooklane_api_commit_retries_total",
    "Ingest transactions Postgres aborted to break a lock cycle (deadlock) or a serialization "
    "conflict, and tried again.",
    ["reason"],
)
API_CONNECTIONS_OPEN = Gauge(
    "hooklane_api_connections_open",
    "Connections open to the API's port (HOOKLANE_API_MAX_CONNECTIONS at most).",
)
API_CONNECTIONS_SHED = Counter(
    "hooklane_api_connections_shed_total",
    "Connections the API closed by itself, by reason: limit (HOOKLANE_API_MAX_CONNECTIONS reached, answered 503),"
    " header_timeout (no complete request head within HOOKLANE_API_HEADER_TIMEOUT_SECONDS),"
    " idle (a keep-alive connection unused as long).",
    ["reason"],
)
for _reason in ("limit", "header_timeout", "idle"):
    API_CONNECTIONS_SHED.labels(_reason)
# By share of the pool (hooklane/api/shares.py): ingest, admin (the admin
# API and the dashboard), tenant (the tenant API and the portal).
API_POOL_WAIT = Histogram(
    "hooklane_api_pool_wait_seconds",
    "Time an API request waited for a Postgres connection, its share's place (HOOKLANE_API_POOL_TENANT_MAX,"
    " HOOKLANE_API_POOL_INGEST_RESERVED) and the pool's, by share: ingest, admin, tenant.",
    ["share"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
for _share in ("ingest", "admin", "tenant"):
    API_POOL_WAIT.labels(_share)


async def exposition(request: web.Request) -> web.Response:
    """``GET /metrics`` of the worker's and the API's metrics ports: in
    OpenMetrics when the scraper's Accept asks for it (Prometheus does when
    its exemplar storage is on), the only format that carries exemplars;
    in Prometheus' text format otherwise."""
    try:
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
    except (TypeError, ValueError):
        # prometheus_client compares a version parameter it could not
        # parse (``version=zz``): a scraper's typo gets the text format.
        encode, content_type = generate_latest, CONTENT_TYPE_LATEST
    return web.Response(body=encode(REGISTRY), headers={"Content-Type": content_type})
