-- Hooklane schema, version 1: endpoints, events and one delivery row per
-- (event, endpoint). Each endpoint is a queue of its own; the partial indexes
-- below are what make that cheap.

CREATE TABLE hooklane_config (
    -- One row. Workers read the partition count from here so that every
    -- replica and the operator agree on it; it is fixed at install time.
    singleton       boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    partition_count integer NOT NULL DEFAULT 32 CHECK (partition_count BETWEEN 1 AND 4096)
);
INSERT INTO hooklane_config DEFAULT VALUES;

CREATE TABLE endpoints (
    id                   bigserial PRIMARY KEY,
    namespace            text NOT NULL,
    name                 text NOT NULL,
    tenant               text NOT NULL,
    url                  text NOT NULL,
    -- Standard Webhooks secret (whsec_...). NULL while the referenced Secret
    -- is missing or malformed: such an endpoint is never reserved, so nothing
    -- is ever sent unsigned.
    secret               text,
    max_concurrency      integer NOT NULL DEFAULT 4 CHECK (max_concurrency BETWEEN 1 AND 256),
    event_types          text[] NOT NULL DEFAULT '{}',
    timeout_seconds      integer NOT NULL DEFAULT 5 CHECK (timeout_seconds BETWEEN 1 AND 60),
    paused               boolean NOT NULL DEFAULT false,
    state                text NOT NULL DEFAULT 'active'
                         CHECK (state IN ('active', 'deactivated')),
    deactivated_at       timestamptz,
    deactivated_reason   text,
    -- stable hash of namespace/name modulo hooklane_config.partition_count
    partition            integer NOT NULL,
    -- Circuit breaker, shared by every worker.
    consecutive_failures integer NOT NULL DEFAULT 0,
    failing_since        timestamptz,
    paused_until         timestamptz,
    last_error           text,
    last_delivered_at    timestamptz,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    UNIQUE (namespace, name)
);

-- publish: the endpoints of one tenant
CREATE INDEX endpoints_tenant ON endpoints (tenant) WHERE state = 'active';
-- reserve: the endpoints of the partitions a worker owns
CREATE INDEX endpoints_partition ON endpoints (partition) WHERE state = 'active';
-- deactivate_failing: endpoints failing for a long time
CREATE INDEX endpoints_failing_since ON endpoints (failing_since) WHERE failing_since IS NOT NULL;

CREATE TABLE events (
    id           text PRIMARY KEY,
    tenant       text NOT NULL,
    type         text NOT NULL,
    data         jsonb NOT NULL,
    coalesce_key text,
    -- how many deliveries this event fanned out to; 0 means it matched no
    -- endpoint and is kept (and counted) rather than dropped
    fanout       integer NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- list_events: reconciliation by time range; purge_events: retention
CREATE INDEX events_created_at ON events (created_at);
CREATE INDEX events_tenant_created_at ON events (tenant, created_at);
-- unrouted_events: events that matched no endpoint, kept and counted
CREATE INDEX events_unrouted ON events (created_at) WHERE fanout = 0;

CREATE TABLE deliveries (
    id              bigserial PRIMARY KEY,
    endpoint_id     bigint NOT NULL REFERENCES endpoints (id) ON DELETE CASCADE,
    event_id        text NOT NULL REFERENCES events (id) ON DELETE CASCADE,
    coalesce_key    text,
    state           text NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'sending', 'delivered', 'dead')),
    -- incremented by each reservation; doubles as the fence that keeps a late
    -- result from a worker that lost the delivery from overwriting newer state
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    reserved_at     timestamptz,
    -- when the worker that reserved it has certainly given up on the call
    -- (reserved_at + the endpoint's timeout + grace); rescue uses it
    lease_expires_at timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz,
    last_status     integer,
    last_error      text
);

-- reserve: each endpoint's queue, in the order it is tried
CREATE INDEX deliveries_queue
    ON deliveries (endpoint_id, next_attempt_at, id)
    WHERE state = 'pending';

-- reserve: deliveries in flight, to count each endpoint's concurrency;
-- rescue_expired: all of them, a set bounded by the workers' concurrency.
-- (A second partial index on the same rows tempts the planner into scanning
-- every in-flight row to count one endpoint's.)
CREATE INDEX deliveries_in_flight
    ON deliveries (endpoint_id)
    WHERE state = 'sending';

-- publish: at most one pending delivery per entity and endpoint (coalescing)
CREATE UNIQUE INDEX deliveries_coalesce
    ON deliveries (endpoint_id, coalesce_key)
    WHERE state = 'pending' AND coalesce_key IS NOT NULL;

-- list_dead / resend: dead deliveries of an endpoint
CREATE INDEX deliveries_dead
    ON deliveries (endpoint_id, id)
    WHERE state = 'dead';

-- purge_events: the deliveries of one event
CREATE INDEX deliveries_event ON deliveries (event_id);
