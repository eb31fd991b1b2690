-- Hooklane's schema as it is after every migration, in one readable file.
--
-- The migrations in migrations/ are what build and upgrade a database
-- (`hooklane migrate`); this file is what they add up to, to read, and
-- tests/db/test_schema.py checks that loading it gives the catalog the
-- migrations give. A migration changes this file in the same commit.
-- Statements live in queries.sql; each index below names the ones it serves.
-- (`hooklane_migrations`, the record of applied migrations, is created by
-- `hooklane migrate` itself, not by a migration.)

-- ---------------------------------------------------------------------------
-- Configuration

-- One row. Workers read the partition count from here so that every replica
-- and the operator agree on it; it is fixed at install time.
CREATE TABLE hooklane_config (
    singleton       boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    partition_count integer NOT NULL DEFAULT 32 CHECK (partition_count BETWEEN 1 AND 4096)
);
INSERT INTO hooklane_config DEFAULT VALUES;

-- ---------------------------------------------------------------------------
-- Endpoints: one row per WebhookEndpoint, each a queue of its own.

CREATE TABLE endpoints (
    -- Identity: the Kubernetes object's namespace and name. The tenant
    -- decides which events the endpoint receives.
    id                   bigserial PRIMARY KEY,
    namespace            text NOT NULL,
    name                 text NOT NULL,
    tenant               text NOT NULL,
    -- The spec: where and how to deliver.
    url                  text NOT NULL,
    max_concurrency      integer NOT NULL DEFAULT 4 CHECK (max_concurrency BETWEEN 1 AND 256),
    event_types          text[] NOT NULL DEFAULT '{}',
    timeout_seconds      integer NOT NULL DEFAULT 5 CHECK (timeout_seconds BETWEEN 1 AND 60),
    paused               boolean NOT NULL DEFAULT false,
    -- Signing: the Standard Webhooks secret (whsec_...), as text or sealed
    -- (`enc:v1:<key id>:<base64>`, hooklane/secrets.py). NULL while the
    -- referenced Secret is missing or malformed: such an endpoint is never
    -- reserved, so nothing is ever sent unsigned. The replaced secret signs
    -- too until previous_secret_until, so that receivers switch keys
    -- without refusing a delivery.
    secret               text,
    previous_secret      text,
    previous_secret_until timestamptz,
    -- Lifecycle: 'deactivated' by a 410 or by failing for days, until
    -- reactivated by hand.
    state                text NOT NULL DEFAULT 'active'
                         CHECK (state IN ('active', 'deactivated')),
    deactivated_at       timestamptz,
    deactivated_reason   text,
    -- Stable hash of namespace/name modulo hooklane_config.partition_count;
    -- the worker holding the partition's advisory lock serves the endpoint.
    partition            integer NOT NULL,
    -- Circuit breaker, shared by every worker.
    consecutive_failures integer NOT NULL DEFAULT 0,
    failing_since        timestamptz,
    paused_until         timestamptz,
    last_error           text,
    last_delivered_at    timestamptz,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    -- spec.delivery (migration 0011). The rate limit: starts per second
    -- and the bucket's size, kept in the deliveries it grants (rate_tat).
    rate_per_second      integer CHECK (rate_per_second BETWEEN 1 AND 10000),
    rate_burst           integer NOT NULL DEFAULT 1 CHECK (rate_burst BETWEEN 1 AND 10000),
    -- Adaptive concurrency: the limit in force (NULL: max_concurrency),
    -- when complete last raised and lowered it, and until when a
    -- Retry-After holds the whole endpoint.
    adaptive_concurrency boolean NOT NULL DEFAULT false,
    effective_concurrency integer CHECK (effective_concurrency >= 1),
    concurrency_raised_at timestamptz,
    concurrency_lowered_at timestamptz,
    throttled_until      timestamptz,
    -- Retry limits of its own (NULL: the settings').
    max_attempts         integer CHECK (max_attempts BETWEEN 1 AND 20),
    max_age_seconds      double precision CHECK (max_age_seconds > 0 AND max_age_seconds <= 259200),
    -- Extra headers and TLS material, resolved from their Secrets and
    -- sealed like the signing secret (hooklane/delivery.py: RequestTerms).
    request_terms        text,
    -- When the head of an ordering key dies (migration 0026): 'hold' the
    -- key until the head is resent or discarded, or 'skip' it and go on.
    ordering_on_dead     text NOT NULL DEFAULT 'hold',
    UNIQUE (namespace, name),
    CONSTRAINT endpoints_previous_secret_check
        CHECK ((previous_secret IS NULL) = (previous_secret_until IS NULL)),
    CONSTRAINT endpoints_ordering_on_dead_check CHECK (ordering_on_dead IN ('hold', 'skip'))
);

-- publish: the active endpoints of one tenant
CREATE INDEX endpoints_tenant ON endpoints (tenant) WHERE state = 'active';
-- sweep_ready: the endpoints of some partitions
CREATE INDEX endpoints_partition ON endpoints (partition) WHERE state = 'active';
-- deactivate_failing: endpoints failing for a long time
CREATE INDEX endpoints_failing_since ON endpoints (failing_since) WHERE failing_since IS NOT NULL;

-- ---------------------------------------------------------------------------
-- Events: what publishers stored. An event is (tenant, id): another
-- tenant's id is another event.

CREATE TABLE events (
    id           text NOT NULL,
    tenant       text NOT NULL,
    type         text NOT NULL,
    data         jsonb NOT NULL,
    coalesce_key text,
    -- how many deliveries this event fanned out to; 0 means it matched no
    -- endpoint and is kept (and counted) rather than dropped
    fanout       integer NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- The transaction that stored the event (migration 0005; 1 for events
    -- stored before it): list_events pages by (xact, id) and returns only
    -- events of transactions below the oldest one still running, so that no
    -- event can commit later behind a receiver's cursor.
    xact         xid8 NOT NULL DEFAULT pg_current_xact_id(),
    -- The W3C traceparent the event was published under (migration 0010;
    -- NULL: none), for the attempts' spans and the receiver's header.
    traceparent  text,
    -- What the catalogue's check found (migration 0023): the version the
    -- event validated against (NULL: not checked, the mode was off) and,
    -- under 'warn', why it validated against none (NULL: it did, or it was
    -- not checked).
    schema_version integer,
    schema_problem text,
    -- Whether the type was deprecated when the event was published
    -- (migration 0024; NULL: it was not, or the type is not in the
    -- catalogue).
    schema_deprecated boolean,
    -- The ordering key it was published with (migration 0026; NULL: none),
    -- and its place among the tenant's events of the key, in commit order.
    ordering_key text,
    ordering_position bigint,
    -- publish (ON CONFLICT), event_conflict, reserve (the event of each
    -- delivery), purge_events (the delete)
    PRIMARY KEY (tenant, id)
);

-- The traceparent's rule, as migration 0010 adds it: NOT VALID there (the
-- column was new, NULL in every row), and so here too, for the two to agree.
ALTER TABLE events ADD CONSTRAINT events_traceparent_format
    CHECK (traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
           AND substr(traceparent, 4, 32) <> repeat('0', 32)
           AND substr(traceparent, 37, 16) <> repeat('0', 16)) NOT VALID;

-- purge_events: events past retention, oldest first
CREATE INDEX events_created_at ON events (created_at);
-- list_events, replay_since: one tenant's events in the order of the
-- transactions that stored them; the time range is checked on the included
-- created_at, so that a page is found by an index-only scan
CREATE INDEX events_tenant_xact ON events (tenant, xact, id) INCLUDE (created_at);
-- published_since (migration 0019): every tenant's events committed since
-- a worker's last probe, by the transactions that stored them
CREATE INDEX events_xact ON events (xact);
-- unrouted_events: events that matched no endpoint, kept and counted
CREATE INDEX events_unrouted ON events (created_at) WHERE fanout = 0;
-- event_type_counts: the events a warning marked, by time
CREATE INDEX events_schema_problem ON events (created_at) WHERE schema_problem IS NOT NULL;
-- event_type_counts: the events of deprecated types, by type and time;
-- only those are in it
CREATE INDEX events_schema_deprecated ON events (type, created_at) WHERE schema_deprecated;

-- ---------------------------------------------------------------------------
-- Deliveries: one row per (event, endpoint), from 'pending' to 'delivered',
-- 'dead' (until resent) or 'discarded' (never sent; last_error says why).

CREATE TABLE deliveries (
    id              bigserial PRIMARY KEY,
    endpoint_id     bigint NOT NULL REFERENCES endpoints (id) ON DELETE CASCADE,
    -- The event, by both parts. The tenant is the event's, not the
    -- endpoint's: the two differ once an endpoint moves to another tenant,
    -- which is how reservation and complete recognise what must never be
    -- sent.
    event_tenant    text NOT NULL,
    event_id        text NOT NULL,
    coalesce_key    text,
    state           text NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'sending', 'delivered', 'dead', 'discarded')),
    -- Attempts: incremented by each reservation, and the fence that keeps a
    -- late result from a worker that lost the delivery from overwriting
    -- newer state. attempted_by is the worker that reserved it last
    -- (HOOKLANE_WORKER_ID; NULL if never reserved, or reserved by a worker
    -- of a release before migration 0004).
    attempts        integer NOT NULL DEFAULT 0,
    attempted_by    text,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    reserved_at     timestamptz,
    -- when the worker that reserved it has certainly given up on the call
    -- (reserved_at + the endpoint's timeout + grace); rescue_expired uses it
    lease_expires_at timestamptz,
    -- Outcome. created_at is when the delivery was last queued: its
    -- creation, or its latest resend (resend_dead), from which the workers
    -- count its age (max age, the oldest pending age). A resend keeps the
    -- first creation in first_created_at (migration 0018; NULL: not resent
    -- since that migration), which people and API clients see as created
    -- (endpoint_deliveries, delivery_of).
    created_at      timestamptz NOT NULL DEFAULT now(),
    first_created_at timestamptz,
    delivered_at    timestamptz,
    last_status     integer,
    -- the failure class of the last attempt when it got no HTTP answer
    -- (migration 0010; hooklane/results.py FailureClass)
    last_failure    text,
    last_error      text,
    -- The endpoint's rate-limit bucket after this delivery's start, set by
    -- the reservation that granted it (migration 0011; NULL: not rate
    -- limited, or no longer telling): the endpoint's bucket is its latest
    -- delivery's. complete clears it once a later start or the clock has
    -- passed it.
    rate_tat        timestamptz,
    -- An ordered delivery's key and its number among the key's deliveries
    -- to this endpoint (migration 0026; NULL: unordered).
    ordering_key    text,
    ordering_seq    bigint,
    CONSTRAINT deliveries_event_fkey FOREIGN KEY (event_tenant, event_id)
        REFERENCES events (tenant, id) ON DELETE CASCADE
);

-- reserve (hooklane_reserve_v7): each endpoint's queue, in the order it
-- is tried; complete (the head of each touched endpoint's queue);
-- pending_endpoints, upsert_endpoint (the discard), endpoint_health (the
-- pending count), delete_endpoint's cascade, and 0.1.0's reservation
CREATE INDEX deliveries_queue
    ON deliveries (endpoint_id, next_attempt_at, id)
    WHERE state = 'pending';

-- reserve (hooklane_reserve_v7): each endpoint's deliveries in flight by when their lease ends (migration
-- 0009), so that counting the live leases against its concurrency reads
-- only those, not an entry per delivery it sent while a held horizon keeps
-- them; rescue_expired: the leases of each endpoint that ended since its
-- last run; endpoint_health. (A second partial index on the same rows
-- tempts the planner into scanning every in-flight row to count one
-- endpoint's.)
CREATE INDEX deliveries_leased
    ON deliveries (endpoint_id, lease_expires_at)
    WHERE state = 'sending';

-- reserve (hooklane_reserve_v7, migration 0020): a tenant's calls in
-- flight by when their leases end, counted up to the tenant ceiling, for
-- the tenants of a round's candidates. By the event's tenant, which is the
-- endpoint's for every delivery the reservation grants (it discards
-- another tenant's). `attempts > 0`, true of every delivery in flight, is
-- stated by the tenant counts alone, so that no other statement on the
-- leases can scan this second partial index on them whole (above).
CREATE INDEX deliveries_tenant_leased
    ON deliveries (event_tenant, lease_expires_at)
    WHERE state = 'sending' AND attempts > 0;

-- reserve (hooklane_reserve_v7, migration 0011): a rate-limited
-- endpoint's bucket, its latest granted start, read newest first
CREATE INDEX deliveries_rate ON deliveries (endpoint_id, rate_tat DESC) WHERE rate_tat IS NOT NULL;

-- publish: at most one pending delivery per entity and endpoint
-- (coalescing); an ordered delivery keeps no coalesce key of its own
CREATE UNIQUE INDEX deliveries_coalesce
    ON deliveries (endpoint_id, coalesce_key)
    WHERE state = 'pending' AND coalesce_key IS NOT NULL;

-- publish (the tail a coalesce key replaces), hooklane_ordering_advance_v1
-- (the head and the next pending of a key): the ordered deliveries only
CREATE UNIQUE INDEX deliveries_ordering ON deliveries (endpoint_id, ordering_key, ordering_seq)
    WHERE ordering_key IS NOT NULL;


-- resend_dead, discard_dead, endpoint_health (the dead count),
-- upsert_endpoint (the discard): an endpoint's dead deliveries
CREATE INDEX deliveries_dead
    ON deliveries (endpoint_id, id)
    WHERE state = 'dead';

-- purge_events: the deliveries of one event (the check and the cascade);
-- replay_since (what is pending or in flight of an event)
CREATE INDEX deliveries_event ON deliveries (event_tenant, event_id);

-- endpoint_deliveries: an endpoint's deliveries of every state, newest
-- first (migration 0005). One more entry per delivery written
-- or changed; without it, listing a quiet endpoint's delivered rows would
-- read the whole table.
CREATE INDEX deliveries_endpoint ON deliveries (endpoint_id, id);

-- ---------------------------------------------------------------------------
-- Ordering keys (migration 0026): per endpoint and key, the last number
-- given and the head, the one delivery of the key that may be due; per
-- tenant and key, the events' place in commit order.

-- One row per tenant and key: the key's events numbered across every
-- endpoint (events.ordering_position), in the order their transactions
-- committed, taken under this row's lock. A replay queues a key's events
-- again in this order, whatever endpoints they went to.
CREATE TABLE ordering_positions (
    tenant        text NOT NULL,
    key           text NOT NULL,
    last_position bigint NOT NULL,
    -- The key's last publish: forgotten with ordering_keys' rows
    -- (purge_ordering_keys), once its events are past retention.
    touched_at    timestamptz NOT NULL DEFAULT now(),
    -- publish (the upsert)
    PRIMARY KEY (tenant, key)
);

-- purge_ordering_keys: the keys by their last publish
CREATE INDEX ordering_positions_touched_at ON ordering_positions (touched_at);

CREATE TABLE ordering_keys (
    endpoint_id bigint NOT NULL REFERENCES endpoints (id) ON DELETE CASCADE,
    key         text NOT NULL,
    last_seq    bigint NOT NULL,
    head_seq    bigint,
    -- When the head died and the endpoint holds (ordering_on_dead 'hold'):
    -- the key waits until the head is resent or discarded.
    held_since  timestamptz,
    -- Heads that died and were skipped (ordering_on_dead 'skip').
    skipped     bigint NOT NULL DEFAULT 0,
    -- The key's last publish: a key idle past the events' retention, with
    -- nothing outstanding, is forgotten (purge_ordering_keys) and numbered
    -- from 1 again if it comes back.
    touched_at  timestamptz NOT NULL DEFAULT now(),
    -- publish (the upsert), hooklane_ordering_advance_v1 (the lock)
    PRIMARY KEY (endpoint_id, key)
);

-- ordering_keys_held, endpoint_health: an endpoint's keys held back
CREATE INDEX ordering_keys_held ON ordering_keys (endpoint_id, held_since) WHERE held_since IS NOT NULL;

-- purge_ordering_keys: the keys with nothing outstanding, by their last
-- publish
CREATE INDEX ordering_keys_idle ON ordering_keys (touched_at) WHERE head_seq IS NULL;

-- hooklane_ordering_sweep_v2: the keys with something outstanding, walked
-- from a cursor; hooklane_ordering_sweep_v1 and endpoint_ordering, an
-- endpoint's (its first column)
CREATE INDEX ordering_keys_outstanding_keys ON ordering_keys (endpoint_id, key) WHERE head_seq IS NOT NULL;

-- ---------------------------------------------------------------------------
-- The attempt history (migration 0010).

-- One row per attempt that ended. Append-only, partitioned by the day it
-- was recorded (UTC), so that retention drops a whole day at a constant
-- cost (hooklane_attempt_partitions). The default partition catches rows
-- no daily partition covers, should maintenance not have created it ahead
-- (the worker creates three days ahead): recording a result never fails
-- for want of a partition. No foreign key: a day is dropped whatever its
-- deliveries do, and a delivery deleted with its event leaves rows nobody
-- can reach (endpoint and delivery ids are never reused) until their day
-- is dropped.
CREATE TABLE delivery_attempts (
    delivery_id         bigint NOT NULL,
    -- The attempt's number in the delivery's current life (a resend starts
    -- a new one from 1): the fence it was reserved with.
    attempt             integer NOT NULL,
    endpoint_id         bigint NOT NULL,
    event_tenant        text NOT NULL,
    event_id            text NOT NULL,
    -- HOOKLANE_WORKER_ID of the worker that made the call.
    attempted_by        text,
    -- When the call started (the worker's clock) and how long it took;
    -- NULL for a lease that ran out, whose call nobody timed.
    started_at          timestamptz NOT NULL,
    duration_seconds    double precision,
    -- What the attempt did to the delivery: 'delivered', 'retry' (queued
    -- again at next_attempt_at), 'dead', or 'discarded' (its endpoint moved
    -- to another tenant while it was in flight).
    outcome             text NOT NULL CHECK (outcome IN ('delivered', 'retry', 'dead', 'discarded')),
    -- The HTTP status, or NULL with the failure class when no answer came.
    status              integer,
    failure             text,
    error               text,
    -- The receiver's Retry-After, in seconds, when it asked for one and the
    -- next attempt waited for it.
    retry_after_seconds double precision,
    next_attempt_at     timestamptz,
    -- The trace id (32 hex digits) of the traceparent the receiver got: the
    -- attempt's span's when the worker is traced, else the event's own;
    -- NULL when it got none.
    trace_id            text,
    recorded_at         timestamptz NOT NULL DEFAULT now()
) PARTITION BY RANGE (recorded_at);

CREATE TABLE delivery_attempts_default PARTITION OF delivery_attempts DEFAULT;

-- delivery_attempts_of: a delivery's attempts, in order
CREATE INDEX delivery_attempts_delivery ON delivery_attempts (delivery_id, recorded_at);
-- endpoint_attempts: an endpoint's attempts over a time range, newest
-- first; endpoint_chart: their outcomes and durations per hour or day,
-- read from the index alone (migration 0025).
CREATE INDEX delivery_attempts_endpoint_chart ON delivery_attempts (endpoint_id, recorded_at)
    INCLUDE (outcome, duration_seconds);

-- ---------------------------------------------------------------------------
-- 0.1.0's ready index (migration 0002), kept for its workers during a
-- rolling upgrade and dropped with its reservation after the next release
-- (hooklane/store/after_next_release/). Nothing of a later version reads
-- or writes these: its workers keep the ready list in memory
-- (hooklane/worker/ready.py).

-- 0.1.0's publishes, endpoint changes and resends append a wakeup for each
-- endpoint they queue a delivery for; its reservation takes them.
CREATE TABLE wakeups (
    id          bigserial PRIMARY KEY,
    endpoint_id bigint NOT NULL,
    partition   integer NOT NULL
);

-- hooklane_absorb_wakeups: the wakeups of the partitions a worker owns
CREATE INDEX wakeups_partition ON wakeups (partition);

-- The endpoints of each partition that may have work, and from when, kept
-- by 0.1.0's reservation, complete and sweep. Primary key: all three.
CREATE TABLE ready_endpoints (
    endpoint_id bigint PRIMARY KEY,
    partition   integer NOT NULL,
    ready_at    timestamptz NOT NULL
);

-- 0.1.0's reservation: the longest-waiting ready endpoints of owned
-- partitions
CREATE INDEX ready_endpoints_ready_at ON ready_endpoints (ready_at, partition);

-- ---------------------------------------------------------------------------
-- Functions. A released function is never redefined: a change is a new
-- function with the next version suffix, and the old one is dropped a
-- release after the last code calling it (CONTRIBUTING.md, "Changing SQL
-- functions"). Their bodies are those of the migrations that made them.

-- The rules every statement shares (migration 0004).

-- May deliveries go to the endpoint at all: active, not paused by hand,
-- signed. Inlined into sweep_ready and the reservation, so that partial
-- indexes on state = 'active' still match.
CREATE FUNCTION hooklane_deliverable(ep endpoints) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT ep.state = 'active' AND NOT ep.paused AND ep.secret IS NOT NULL
$$;

-- The concurrency limit in force (migration 0011): an adaptive endpoint's
-- effective concurrency, within max_concurrency. Reserve and complete.
CREATE FUNCTION hooklane_concurrency(ep endpoints) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT least(coalesce(ep.effective_concurrency, ep.max_concurrency), ep.max_concurrency)
$$;

-- The phase of an endpoint at the transaction's time (migration 0007), as
-- hooklane/endpoint_state.py decides it: Deactivated; Paused (by hand, or
-- its circuit open until paused_until); Probing (the pause is over, probes
-- go out); else Active. endpoint_page and endpoint_totals filter on it;
-- a single expression, inlined into them.
CREATE FUNCTION hooklane_phase(ep endpoints) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN ep.state = 'deactivated' THEN 'Deactivated'
                WHEN ep.paused THEN 'Paused'
                WHEN ep.paused_until IS NULL THEN 'Active'
                WHEN ep.paused_until > now() THEN 'Paused'
                ELSE 'Probing' END
$$;

-- Whether nothing but a probe goes to the endpoint now: not deliverable
-- (deactivated, paused by hand, unsigned) or its circuit open. Migration
-- 0007; the listings' "not delivering" filter.
CREATE FUNCTION hooklane_not_delivering(ep endpoints) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT NOT hooklane_deliverable(ep) OR ep.paused_until IS NOT NULL
$$;

-- Why a delivery is discarded (migration 0008): its event is of another
-- tenant than its endpoint's, which moved since; NULL while it is the
-- endpoint's own. upsert_endpoint, the reservation and complete discard
-- by it. Inlined into its callers.
CREATE FUNCTION hooklane_tenant_discard(event_tenant text, endpoint_tenant text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN event_tenant <> endpoint_tenant
                THEN format('discarded: the endpoint''s tenant changed from %s to %s',
                            event_tenant, endpoint_tenant) END
$$;

-- Whether endpoints with these event-type patterns receive an event of this
-- type (migration 0006): none means all, '*' all, 'order.*' the types under
-- 'order.', else the type itself. The one rule of publish and
-- replay_since. PL/pgSQL: a LANGUAGE sql body would need a sub-select,
-- which is never inlined, and cost two to three times as much per endpoint.
CREATE FUNCTION hooklane_type_matches(patterns text[], type text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    pattern text;
BEGIN
    IF cardinality(patterns) = 0 THEN
        RETURN true;
    END IF;
    FOREACH pattern IN ARRAY patterns LOOP
        IF pattern = '*' OR pattern = type
           OR (right(pattern, 2) = '.*' AND starts_with(type, left(pattern, -1))) THEN
            RETURN true;
        END IF;
    END LOOP;
    RETURN false;
END;
$$;

-- What was published since a worker's last probe (queries.sql:
-- published_since, which says what it answers). A function, so that its
-- statement is planned once per session (plan_cache_mode): the workers'
-- sessions plan every statement anew (WORKER_SESSION), which took 0.34 ms
-- a probe against 0.06 ms to run it on a quiet database, and a worker
-- probes every 5 ms while events come. The deliveries of each event are read by
-- their event (OFFSET 0 keeps it a nested loop of index probes, whatever
-- the statistics say of the events found), never by a scan of every
-- pending delivery: their state is tested above the OFFSET, out of the
-- probe's reach, as the partial index deliveries_queue (state 'pending')
-- would otherwise serve it too, and a plan made while the tables were
-- empty chose it, scanning every pending delivery once per event found
-- (37 s for a probe finding 16,500 events).
-- Index: events_xact; deliveries_event; primary key of endpoints.
CREATE FUNCTION hooklane_published_since_v1(since text)
RETURNS TABLE (snapshot text, events bigint, endpoint_ids bigint[], partitions integer[],
               dues timestamptz[])
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY
    WITH fresh AS MATERIALIZED (
        SELECT e.tenant, e.id FROM events e
        WHERE e.xact >= pg_snapshot_xmax(since::pg_snapshot)
        UNION ALL
        SELECT e.tenant, e.id FROM events e
        WHERE e.xact = ANY (ARRAY(SELECT pg_snapshot_xip(since::pg_snapshot)))
    ),
    woken AS (
        SELECT d.endpoint_id, ep.partition, min(d.next_attempt_at) AS due
        FROM fresh f
        CROSS JOIN LATERAL (
            SELECT q.endpoint_id, q.next_attempt_at, q.state FROM deliveries q
            WHERE q.event_tenant = f.tenant AND q.event_id = f.id
            OFFSET 0
        ) d
        JOIN endpoints ep ON ep.id = d.endpoint_id
        WHERE d.state = 'pending'
        GROUP BY d.endpoint_id, ep.partition
    )
    SELECT pg_current_snapshot()::text,
           (SELECT count(*) FROM fresh),
           coalesce(array_agg(w.endpoint_id ORDER BY w.endpoint_id), '{}'),
           coalesce(array_agg(w.partition ORDER BY w.endpoint_id), '{}'),
           coalesce(array_agg(w.due ORDER BY w.endpoint_id), '{}')
    FROM woken w;
END;
$$;

-- From version 9 (migration 0009) on, the ready list lives in the worker
-- (hooklane/worker/ready.py); these notify it and hand it verdicts.

-- Tell the owner of each endpoint that it may have work, from `dues`: the
-- earliest time a delivery it got may be due (the next_attempt_at it was
-- written with), or NULL when no delivery was written (the endpoint
-- changed). One notification per partition and due time, listing up to 300
-- endpoints, so a payload stays under Postgres's 8,000 bytes: "<partition>
-- <due in microseconds since the epoch, or -> <id>,<id>,...". Postgres
-- delivers it at commit, and folds the same payload repeated within a
-- transaction. A notification costs no row. Only Hooklane's own
-- transactions call it (resends, replays, endpoint changes, retries): a
-- notifying transaction holds PostgreSQL's one notify lock from its
-- pre-commit until its commit is flushed, so publishes, which run in the
-- application's transactions, stopped calling it (migration 0019).
CREATE FUNCTION hooklane_wake_v2(endpoint_ids bigint[], partitions integer[], dues timestamptz[])
RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    IF endpoint_ids IS NOT NULL THEN
        PERFORM pg_notify('hooklane_ready',
                          w.partition || ' '
                          || coalesce((extract(epoch FROM w.due) * 1000000)::bigint::text, '-') || ' '
                          || string_agg(w.endpoint_id::text, ',' ORDER BY w.endpoint_id))
        FROM (SELECT e.endpoint_id, e.partition, e.due,
                     (row_number() OVER (PARTITION BY e.partition, e.due ORDER BY e.endpoint_id) - 1) / 300
                       AS chunk
              FROM (SELECT DISTINCT u.endpoint_id, u.partition, u.due
                    FROM unnest(endpoint_ids, partitions, dues) AS u(endpoint_id, partition, due)) e) w
        GROUP BY w.partition, w.due, w.chunk;
    END IF;
END;
$$;

-- The reservation: `reserve` in queries.sql. The worker names the
-- candidates (endpoints of its partitions whose ready time has come,
-- longest waiting first) and each one's floor: the earliest
-- next_attempt_at a pending delivery of it may have (NULL: unknown, scan
-- from the start). Returns the reserved deliveries (id not NULL) and then
-- one verdict row per candidate (id NULL). Each delivery carries its
-- start on this server's clock (`start_at`), each verdict the clock as it
-- answers (`answered_at`), which the worker's wait counts from. Caps of
-- rows per candidate, candidates apart (the worker's slow calls, which
-- `max_rows` does not count), the other rows taken tenant first, then
-- endpoint, and an optional ceiling on each tenant's calls in flight, kept
-- exactly across workers by an advisory lock per tenant (migration 0020
-- says how). Migrations 0011 and 0016, which made its earlier versions,
-- say why each step is written as it is.
CREATE FUNCTION hooklane_reserve_v7(owned integer[], candidates bigint[], floors timestamptz[],
                                    caps integer[], apart boolean[], max_rows integer,
                                    lease_grace double precision, worker text,
                                    lookahead double precision, tenant_ceiling integer)
RETURNS TABLE (id bigint, attempts integer, created_at timestamptz, endpoint_id bigint,
               namespace text, name text, url text, secret text, timeout_seconds integer,
               event_id text, type text, data text, event_created_at timestamptz,
               previous_secret text, max_concurrency integer,
               deliverable boolean, paused_until timestamptz, head timestamptz,
               at_limit boolean, leases_end timestamptz, tenant text, traceparent text,
               start_at timestamptz, request_terms text, max_attempts integer,
               max_age_seconds double precision, answered_at timestamptz, rate_per_second integer)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    lock_key integer;
    locked integer[] := '{}';
BEGIN
    -- The tenants' locks, before anything is counted: a statement after
    -- them sees every round that held one before. Class 0x686C74 ("hlt"),
    -- beside the partitions' "hlp", the workers' "hlm" and the tenant
    -- creates' "hle"; two tenants of one hash share a lock, and only wait
    -- on each other. Released as the round's transaction ends.
    -- Index: primary key of endpoints.
    IF tenant_ceiling IS NOT NULL THEN
        FOR lock_key IN
            SELECT DISTINCT hashtext(ep.tenant)
            FROM endpoints ep
            WHERE ep.id = ANY(candidates) AND ep.partition = ANY(owned)
            ORDER BY 1
        LOOP
            PERFORM pg_advisory_xact_lock(x'686C74'::integer, lock_key);
            locked := locked || lock_key;
        END LOOP;
    END IF;

    -- As hooklane_reserve_v6's (migration 0016), with the caps, the tenants' ceiling and
    -- order. An endpoint whose tenant was not locked (it moved to another
    -- tenant since) waits for the next round.
    -- Index: deliveries_leased for the count; deliveries_tenant_leased for
    -- the tenant's; deliveries_rate for the bucket; deliveries_queue from
    -- each floor; primary key of events.
    RETURN QUERY
    WITH candidate AS (
        SELECT c.endpoint_id, coalesce(c.low, '-infinity') AS low, c.cap,
               coalesce(c.apart, false) AS apart
        FROM unnest(candidates, floors, caps, apart) AS c(endpoint_id, low, cap, apart)
    ),
    slots AS MATERIALIZED (
        SELECT ep.id, ep.tenant, c.low, c.cap, c.apart, ep.rate_per_second::float8 AS rate,
               (ep.rate_burst - 1)::float8 / ep.rate_per_second AS tolerance,
               hooklane_concurrency(ep) - (SELECT count(*)
                                           FROM (SELECT f.lease_expires_at FROM deliveries f
                                                 WHERE f.endpoint_id = ep.id AND f.state = 'sending'
                                                   AND f.lease_expires_at > now()
                                                 ORDER BY f.lease_expires_at OFFSET 0) f) AS free,
               CASE WHEN ep.rate_per_second IS NOT NULL
                    THEN greatest(now(), (SELECT t.rate_tat FROM deliveries t
                                          WHERE t.endpoint_id = ep.id AND t.rate_tat IS NOT NULL
                                          ORDER BY t.rate_tat DESC LIMIT 1)) END AS tat
        FROM candidate c
        -- Each candidate's row by its key, as the verdicts read it: the
        -- conditions are kept out of the scan's reach (an outer join,
        -- filtered above it through coalesce). Given to the scan, they
        -- let a plan made on a new install's statistics read every active
        -- endpoint (endpoints_tenant: the state is one of them) into a
        -- hash to meet a hundred candidates, as hooklane_reserve_v6's (migration 0016) does.
        LEFT JOIN endpoints ep ON ep.id = c.endpoint_id
        WHERE coalesce(ep.partition = ANY(owned)
                       AND hooklane_deliverable(ep)
                       AND (ep.paused_until IS NULL OR ep.paused_until <= now())
                       AND (ep.throttled_until IS NULL OR ep.throttled_until <= now())
                       AND (tenant_ceiling IS NULL OR hashtext(ep.tenant) = ANY(locked)), false)
    ),
    -- What each tenant may still start: its ceiling less its live leases,
    -- counted in their index's order up to the ceiling, no further.
    room AS MATERIALIZED (
        SELECT t.tenant,
               tenant_ceiling - (SELECT count(*)
                                 FROM (SELECT f.lease_expires_at FROM deliveries f
                                       WHERE f.event_tenant = t.tenant AND f.state = 'sending'
                                         AND f.attempts > 0 AND f.lease_expires_at > now()
                                       ORDER BY f.lease_expires_at LIMIT tenant_ceiling) f) AS left_
        FROM (SELECT DISTINCT s.tenant FROM slots s) t
        WHERE tenant_ceiling IS NOT NULL
    ),
    granted AS (
        SELECT s.id, s.tenant, s.low, s.cap, s.apart, s.rate, s.tolerance, s.tat,
               least(CASE WHEN s.rate IS NULL THEN greatest(s.free, 0)
                          ELSE least(greatest(s.free, 0),
                                     greatest(floor((extract(epoch FROM now() - s.tat)::float8 + lookahead
                                                     + s.tolerance) * s.rate)::bigint + 1, 0)) END,
                     CASE WHEN s.cap IS NOT NULL THEN greatest(s.cap, 0) END) AS allowed
        FROM slots s
    ),
    queued AS (
        SELECT q.id, q.state, s.tenant, s.apart, s.rate, s.tolerance, s.tat,
               row_number() OVER (PARTITION BY s.id ORDER BY q.next_attempt_at, q.id) AS pos
        FROM granted s
        CROSS JOIN LATERAL (
            -- SKIP LOCKED: as hooklane_reserve_v6's (migration 0016).
            SELECT d.id, d.state, d.next_attempt_at
            FROM deliveries d
            WHERE d.endpoint_id = s.id
              AND d.state = 'pending'
              AND d.next_attempt_at >= s.low
              AND d.next_attempt_at <= now()
            ORDER BY d.next_attempt_at, d.id
            LIMIT s.allowed
            FOR UPDATE SKIP LOCKED
        ) q
    ),
    -- Each row's place within its tenant (its endpoint's first rows before
    -- their seconds, as endpoints interleave), among all of the tenant's
    -- rows and among those counted in max_rows, in one pass. The ceiling keeps a
    -- tenant's first rows, apart or not; it cuts a tenant's last ones, so
    -- the places of those it keeps stand.
    kept AS (
        SELECT q.*
        FROM (SELECT q.*,
                     count(*) OVER w AS place,
                     count(*) FILTER (WHERE NOT q.apart) OVER w AS counted_place
              FROM queued q
              WINDOW w AS (PARTITION BY q.tenant ORDER BY q.pos, q.id ROWS UNBOUNDED PRECEDING)) q
        LEFT JOIN room r ON r.tenant = q.tenant
        WHERE tenant_ceiling IS NULL OR q.place <= r.left_
    ),
    -- The rows counted in max_rows by their place among their tenant's
    -- (every tenant's first before any tenant's second), up to max_rows;
    -- every row apart, which its cap bounds.
    taken AS (
        (SELECT k.id, k.state, k.rate, k.tolerance, k.tat, k.pos
         FROM kept k WHERE NOT k.apart
         ORDER BY k.counted_place, k.id LIMIT max_rows)
        UNION ALL
        SELECT k.id, k.state, k.rate, k.tolerance, k.tat, k.pos FROM kept k WHERE k.apart
    ),
    chosen AS (
        SELECT q.id, q.state,
               CASE WHEN q.rate IS NULL THEN now()
                    ELSE greatest(now(), q.tat + make_interval(secs => (q.pos - 1) / q.rate
                                                                       - q.tolerance)) END AS start_at,
               q.tat + make_interval(secs => q.pos / q.rate) AS rate_tat
        FROM taken q
    ),
    -- The rows to update, found by primary key from the array: joined to
    -- `chosen` alone, a plan made on a nearly empty table's statistics
    -- read the whole key to meet the rows of both branches of `taken`.
    ids AS (
        SELECT array_agg(s.id) AS ids FROM chosen s
    ),
    reserved AS (
        UPDATE deliveries d
        SET state = CASE WHEN hooklane_tenant_discard(d.event_tenant, ep.tenant) IS NULL
                         THEN 'sending' ELSE 'discarded' END,
            attempts = CASE WHEN hooklane_tenant_discard(d.event_tenant, ep.tenant) IS NULL
                            THEN d.attempts + 1 ELSE d.attempts END,
            reserved_at = now(),
            attempted_by = CASE WHEN hooklane_tenant_discard(d.event_tenant, ep.tenant) IS NULL
                                THEN worker ELSE d.attempted_by END,
            lease_expires_at = CASE WHEN hooklane_tenant_discard(d.event_tenant, ep.tenant) IS NULL
                                    THEN s.start_at + make_interval(secs => ep.timeout_seconds
                                                                            + lease_grace)
                               END,
            rate_tat = CASE WHEN hooklane_tenant_discard(d.event_tenant, ep.tenant) IS NULL
                            THEN coalesce(s.rate_tat, d.rate_tat) ELSE d.rate_tat END,
            last_error = coalesce(hooklane_tenant_discard(d.event_tenant, ep.tenant), d.last_error)
        FROM chosen s, endpoints ep, events e
        WHERE d.id = ANY((SELECT i.ids FROM ids i)::bigint[])
          AND d.id = s.id
          AND d.state = s.state
          AND ep.id = d.endpoint_id
          AND e.tenant = d.event_tenant
          AND e.id = d.event_id
        RETURNING d.id, d.attempts, d.created_at, d.endpoint_id,
                  ep.namespace, ep.name, ep.url, ep.secret, ep.timeout_seconds,
                  e.id AS event_id, e.type, e.data::text AS data, e.created_at AS event_created_at,
                  CASE WHEN ep.previous_secret_until > now() THEN ep.previous_secret END
                    AS previous_secret,
                  hooklane_concurrency(ep) AS max_concurrency, d.state, e.tenant, e.traceparent,
                  s.start_at, ep.request_terms, ep.max_attempts, ep.max_age_seconds,
                  ep.rate_per_second
    )
    SELECT r.id, r.attempts, r.created_at, r.endpoint_id, r.namespace, r.name, r.url, r.secret,
           r.timeout_seconds, r.event_id, r.type, r.data, r.event_created_at, r.previous_secret,
           r.max_concurrency, NULL::boolean, NULL::timestamptz, NULL::timestamptz, NULL::boolean,
           NULL::timestamptz, r.tenant, r.traceparent, r.start_at, r.request_terms, r.max_attempts,
           r.max_age_seconds, NULL::timestamptz, r.rate_per_second
    FROM reserved r
    WHERE r.state = 'sending';

    -- The verdicts, as hooklane_reserve_v6's (migration 0016); an endpoint is also at its
    -- limit while its tenant's live leases are at the ceiling, until the
    -- first of them ends (`leases_end`, unless its own slots are all held:
    -- then the first of its own), and its verdict then names its tenant,
    -- so that a worker may look again when a call of that tenant's ends.
    -- Each tenant's leases are counted once.
    -- Index: primary key of endpoints; deliveries_queue from each floor;
    -- deliveries_leased for the live leases; deliveries_tenant_leased for
    -- the tenant's; deliveries_rate.
    RETURN QUERY
    WITH tenant_leases AS MATERIALIZED (
        SELECT t.tenant, l.n >= tenant_ceiling AS full_, l.ends
        FROM (SELECT DISTINCT ep.tenant FROM endpoints ep
              WHERE ep.id = ANY(candidates) AND ep.partition = ANY(owned)
                AND tenant_ceiling IS NOT NULL) t
        CROSS JOIN LATERAL (
            SELECT count(*) AS n, min(f.lease_expires_at) AS ends
            FROM (SELECT f.lease_expires_at
                  FROM deliveries f
                  WHERE f.event_tenant = t.tenant
                    AND f.state = 'sending'
                    AND f.attempts > 0
                    AND f.lease_expires_at > now()
                  ORDER BY f.lease_expires_at LIMIT tenant_ceiling) f
        ) l
    )
    SELECT NULL::bigint, NULL::integer, NULL::timestamptz, c.endpoint_id,
           NULL::text, NULL::text, NULL::text, NULL::text, NULL::integer,
           NULL::text, NULL::text, NULL::text, NULL::timestamptz, NULL::text,
           hooklane_concurrency(ep), k.ok,
           greatest(ep.paused_until, ep.throttled_until,
                    b.tat - make_interval(secs => lookahead / 2
                                          + (ep.rate_burst - 1)::float8 / ep.rate_per_second)),
           h.head, coalesce(l.n >= hooklane_concurrency(ep), false) OR coalesce(k.ok AND tl.full_, false),
           CASE WHEN coalesce(l.n >= hooklane_concurrency(ep), false) OR NOT coalesce(k.ok AND tl.full_, false)
                THEN l.ends ELSE tl.ends END,
           CASE WHEN k.ok AND tl.full_ THEN ep.tenant END, NULL::text,
           NULL::timestamptz, NULL::text, NULL::integer, NULL::float8, clock_timestamp(), NULL::integer
    FROM unnest(candidates, floors) AS c(endpoint_id, low)
    LEFT JOIN endpoints ep ON ep.id = c.endpoint_id
    CROSS JOIN LATERAL (
        SELECT coalesce(ep.partition = ANY(owned) AND hooklane_deliverable(ep), false) AS ok
    ) k
    LEFT JOIN tenant_leases tl ON tl.tenant = ep.tenant
    LEFT JOIN LATERAL (
        SELECT min(d.next_attempt_at) AS head
        FROM deliveries d
        WHERE k.ok
          AND d.endpoint_id = c.endpoint_id
          AND d.state = 'pending'
          AND d.next_attempt_at >= coalesce(c.low, '-infinity')
    ) h ON true
    LEFT JOIN LATERAL (
        SELECT count(*) AS n, min(f.lease_expires_at) AS ends
        FROM (SELECT f.lease_expires_at
              FROM deliveries f
              WHERE k.ok
                AND f.endpoint_id = c.endpoint_id
                AND f.state = 'sending'
                AND f.lease_expires_at > now()
              ORDER BY f.lease_expires_at OFFSET 0) f
    ) l ON true
    LEFT JOIN LATERAL (
        SELECT t.rate_tat AS tat
        FROM deliveries t
        WHERE k.ok
          AND ep.rate_per_second IS NOT NULL
          AND t.endpoint_id = c.endpoint_id
          AND t.rate_tat IS NOT NULL
        ORDER BY t.rate_tat DESC
        LIMIT 1
    ) b ON true;
END;
$$;

-- Record a batch of results (version 10; adaptive concurrency from
-- version 11): `complete` in queries.sql. As hooklane_complete_v2
-- (migration 0006), less the ready list: the worker owning each
-- endpoint decides when it is ready from what this returns. An endpoint's
-- row is written only when something of it changes (its failures, circuit,
-- lifecycle, last error), or when its last delivery time is at least
-- `delivered_step` seconds old: a healthy endpoint's row gets one version
-- per step rather than one per batch. A retry of an endpoint of a partition
-- the recording worker does not own (`owned`: it lost it while the call was
-- out) is notified to its owner. Each result that passes the fence leaves
-- its attempt in delivery_attempts in the same statement; a late result
-- of a worker that lost the delivery leaves none. An adaptive endpoint's
-- limit and hold follow the receiver's overload signals (adapt_step: the
-- seconds between two raises, and the hold at a limit of 1).
CREATE FUNCTION hooklane_complete_v5(ids bigint[], fences integer[], outcomes text[],
                                     retry_ins double precision[], statuses integer[], errors text[],
                                     failures text[], started_ats timestamptz[],
                                     durations double precision[], retry_afters double precision[],
                                     trace_ids text[], worker text,
                                     threshold integer, step_seconds double precision,
                                     cap_seconds double precision, owned integer[],
                                     delivered_step double precision, adapt_step double precision)
RETURNS TABLE (id bigint, partition integer, namespace text, name text, state text,
               paused_until timestamptz, consecutive_failures integer, deliverable boolean,
               retried_head timestamptz, opened boolean, deactivated boolean,
               throttled_until timestamptz, effective_concurrency integer, lowered boolean)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH fenced AS MATERIALIZED (
        SELECT r.id, r.attempts, r.outcome, r.retry_in, r.status, r.error, r.failure, r.started_at,
               r.duration, r.retry_after, r.trace_id, d.state
        FROM unnest(ids, fences, outcomes, retry_ins, statuses, errors, failures, started_ats, durations,
                    retry_afters, trace_ids)
             AS r(id, attempts, outcome, retry_in, status, error, failure, started_at, duration,
                  retry_after, trace_id)
        CROSS JOIN LATERAL (SELECT d.state, d.attempts FROM deliveries d WHERE d.id = r.id OFFSET 0) d
        WHERE d.state = 'sending' AND d.attempts = r.attempts
    ),
    recorded AS (
        UPDATE deliveries d
        SET state = CASE WHEN r.outcome <> 'delivered'
                              AND hooklane_tenant_discard(d.event_tenant, ep.tenant) IS NOT NULL
                         THEN 'discarded'
                         WHEN r.outcome = 'retry' THEN 'pending'
                         ELSE r.outcome END,
            next_attempt_at = CASE WHEN r.outcome = 'retry'
                                   THEN now() + make_interval(secs => r.retry_in)
                                   ELSE d.next_attempt_at END,
            delivered_at = CASE WHEN r.outcome = 'delivered' THEN now() END,
            lease_expires_at = NULL,
            -- A bucket that later starts moved on, or that is full again
            -- (its time has passed), says nothing more: it leaves
            -- deliveries_rate, which then holds about the starts in flight
            -- and each endpoint's latest, not one entry per start ever made.
            -- The probe is the reservation's, newest first from
            -- deliveries_rate (a bare EXISTS of a later one was planned as
            -- a scan of the endpoint's every delivery).
            rate_tat = CASE WHEN d.rate_tat IS NULL OR d.rate_tat <= now() THEN NULL
                            WHEN (SELECT t.rate_tat FROM deliveries t
                                  WHERE t.endpoint_id = d.endpoint_id AND t.rate_tat IS NOT NULL
                                  ORDER BY t.rate_tat DESC LIMIT 1) > d.rate_tat THEN NULL
                            ELSE d.rate_tat END,
            last_status = r.status,
            last_failure = r.failure,
            last_error = CASE WHEN r.outcome <> 'delivered'
                                   AND hooklane_tenant_discard(d.event_tenant, ep.tenant) IS NOT NULL
                              THEN format('%s (%s)', hooklane_tenant_discard(d.event_tenant, ep.tenant),
                                          r.error)
                              ELSE r.error END
        FROM fenced r, endpoints ep
        WHERE d.id = r.id
          AND d.state = r.state
          AND d.attempts = r.attempts
          AND ep.id = d.endpoint_id
        RETURNING d.id, d.endpoint_id, d.state, d.next_attempt_at, d.attempts, d.event_tenant, d.event_id,
                  d.last_error, r.outcome, r.status, r.error, r.failure, r.started_at, r.duration,
                  r.retry_after, r.trace_id, d.reserved_at
    ),
    -- Runs whether or not it is read, as every data-modifying WITH does.
    logged AS (
        INSERT INTO delivery_attempts (delivery_id, attempt, endpoint_id, event_tenant, event_id,
                                       attempted_by, started_at, duration_seconds, outcome, status,
                                       failure, error, retry_after_seconds, next_attempt_at, trace_id)
        SELECT rec.id, rec.attempts, rec.endpoint_id, rec.event_tenant, rec.event_id, worker,
               rec.started_at, rec.duration,
               CASE WHEN rec.state = 'pending' THEN 'retry' ELSE rec.state END,
               rec.status, rec.failure, rec.last_error, rec.retry_after,
               CASE WHEN rec.state = 'pending' THEN rec.next_attempt_at END, rec.trace_id
        FROM recorded rec
    ),
    per_endpoint AS (
        SELECT rec.endpoint_id,
               bool_or(rec.outcome = 'delivered') AS succeeded,
               count(*) FILTER (WHERE rec.outcome <> 'delivered') AS failures,
               bool_or(rec.status = 410) AS gone,
               (array_agg(rec.error ORDER BY rec.id DESC)
                  FILTER (WHERE rec.outcome <> 'delivered'))[1] AS error,
               min(rec.next_attempt_at) FILTER (WHERE rec.state = 'pending') AS retried_head,
               -- The receiver's overload signals, for adaptive concurrency:
               -- false, not NULL, for a batch without one (a success has
               -- no failure class, and NOT NULL would never raise); the
               -- latest reservation among the calls that gave one; the
               -- longest Retry-After they asked for.
               coalesce(bool_or(rec.status IN (429, 503) OR rec.failure = 'timeout'), false)
                 AS overloaded,
               max(rec.reserved_at) FILTER (WHERE rec.status IN (429, 503) OR rec.failure = 'timeout')
                 AS overload_reserved_at,
               max(rec.retry_after) FILTER (WHERE rec.status IN (429, 503)) AS hold
        FROM recorded rec
        GROUP BY rec.endpoint_id
    ),
    -- Each touched endpoint as it is before this statement, its row locked
    -- (in id order) until the transaction ends, so that no other
    -- transaction changes it between this read and the update.
    locked AS MATERIALIZED (
        SELECT ep.id, ep.partition, ep.namespace, ep.name, ep.state, ep.paused,
               ep.secret IS NOT NULL AS signed, ep.consecutive_failures, ep.failing_since,
               ep.paused_until, ep.last_error, ep.last_delivered_at, ep.deactivated_at,
               ep.deactivated_reason, ep.adaptive_concurrency, ep.effective_concurrency,
               hooklane_concurrency(ep) AS concurrency, ep.max_concurrency, ep.concurrency_raised_at,
               ep.concurrency_lowered_at, ep.throttled_until
        FROM per_endpoint pe
        JOIN endpoints ep ON ep.id = pe.endpoint_id
        ORDER BY ep.id
        FOR NO KEY UPDATE OF ep
    ),
    -- Adaptive concurrency: an overload signal lowers the limit to 0.7 of
    -- itself (at least 1), once per generation of calls: only a call
    -- reserved after the last lowering lowers it again, as those in flight
    -- before answer for the limit that was. At 1, an overload signal
    -- without a Retry-After holds the endpoint for adapt_step, so that a
    -- receiver refusing everything gets a call a step, not one per answer.
    -- A batch with a success and no signal raises the limit by one,
    -- adapt_step after any change, up to maxConcurrency. A Retry-After on
    -- a 429 or 503 holds the endpoint as long as it asks.
    adapted AS (
        SELECT b.id,
               b.adaptive_concurrency AND pe.overloaded AND b.concurrency > 1
                 AND pe.overload_reserved_at > coalesce(b.concurrency_lowered_at, '-infinity')
                 AS lower,
               b.adaptive_concurrency AND pe.overloaded AND b.concurrency = 1
                 AND coalesce(pe.hold, 0) = 0 AS floored,
               b.adaptive_concurrency AND NOT pe.overloaded AND pe.succeeded
                 AND b.concurrency < b.max_concurrency
                 AND coalesce(greatest(b.concurrency_raised_at, b.concurrency_lowered_at)
                                <= now() - make_interval(secs => adapt_step), true) AS raise
        FROM locked b
        JOIN per_endpoint pe ON pe.endpoint_id = b.id
    ),
    judged AS (
        SELECT b.*, pe.retried_head, a.lower,
               CASE WHEN a.lower THEN greatest(1, floor(b.concurrency * 0.7))::integer
                    WHEN a.raise THEN b.concurrency + 1
                    ELSE b.effective_concurrency END AS new_effective,
               CASE WHEN a.raise THEN now() ELSE b.concurrency_raised_at END AS new_raised_at,
               CASE WHEN a.lower THEN now() ELSE b.concurrency_lowered_at END AS new_lowered_at,
               CASE WHEN b.adaptive_concurrency AND pe.hold > 0
                    THEN greatest(b.throttled_until, now() + make_interval(secs => pe.hold))
                    WHEN a.floored
                    THEN greatest(b.throttled_until, now() + make_interval(secs => adapt_step))
                    ELSE b.throttled_until END AS new_throttled_until,
               CASE WHEN pe.succeeded THEN 0 ELSE (b.consecutive_failures + pe.failures)::integer END
                 AS new_failures,
               CASE WHEN pe.succeeded THEN NULL ELSE coalesce(b.failing_since, now()) END
                 AS new_failing_since,
               CASE WHEN pe.succeeded THEN NULL
                    WHEN b.consecutive_failures + pe.failures >= threshold
                    THEN now() + make_interval(secs => least(
                             cap_seconds,
                             step_seconds * (b.consecutive_failures + pe.failures - threshold + 1)))
                    ELSE b.paused_until END AS new_paused_until,
               coalesce(pe.error, b.last_error) AS new_last_error,
               CASE WHEN pe.succeeded
                         AND (b.last_delivered_at IS NULL
                              OR b.last_delivered_at <= now() - make_interval(secs => delivered_step))
                    THEN now() ELSE b.last_delivered_at END AS new_last_delivered_at,
               CASE WHEN pe.gone THEN 'deactivated' ELSE b.state END AS new_state,
               CASE WHEN pe.gone AND b.state = 'active' THEN now() ELSE b.deactivated_at END
                 AS new_deactivated_at,
               CASE WHEN pe.gone AND b.state = 'active' THEN 'the receiver answered 410 Gone'
                    ELSE b.deactivated_reason END AS new_deactivated_reason
        FROM locked b
        JOIN per_endpoint pe ON pe.endpoint_id = b.id
        JOIN adapted a ON a.id = b.id
    ),
    -- Runs whether or not it is read, as every data-modifying WITH does.
    written AS (
        UPDATE endpoints ep
        SET consecutive_failures = j.new_failures,
            failing_since = j.new_failing_since,
            paused_until = j.new_paused_until,
            last_error = j.new_last_error,
            last_delivered_at = j.new_last_delivered_at,
            state = j.new_state,
            deactivated_at = j.new_deactivated_at,
            deactivated_reason = j.new_deactivated_reason,
            effective_concurrency = j.new_effective,
            concurrency_raised_at = j.new_raised_at,
            concurrency_lowered_at = j.new_lowered_at,
            throttled_until = j.new_throttled_until
        FROM judged j
        WHERE ep.id = j.id
          AND (j.new_failures, j.new_failing_since, j.new_paused_until, j.new_last_error,
               j.new_last_delivered_at, j.new_state, j.new_deactivated_at, j.new_deactivated_reason,
               j.new_effective, j.new_raised_at, j.new_lowered_at, j.new_throttled_until)
              IS DISTINCT FROM
              (j.consecutive_failures, j.failing_since, j.paused_until, j.last_error,
               j.last_delivered_at, j.state, j.deactivated_at, j.deactivated_reason,
               j.effective_concurrency, j.concurrency_raised_at, j.concurrency_lowered_at,
               j.throttled_until)
    ),
    woken AS (
        SELECT hooklane_wake_v2(array_agg(j.id), array_agg(j.partition), array_agg(j.retried_head))
        FROM judged j
        WHERE j.retried_head IS NOT NULL
          AND NOT j.partition = ANY(owned)
    )
    SELECT j.id, j.partition, j.namespace, j.name, j.new_state, j.new_paused_until, j.new_failures,
           j.new_state = 'active' AND NOT j.paused AND j.signed, j.retried_head,
           j.consecutive_failures < threshold AND j.new_failures >= threshold,
           j.state = 'active' AND j.new_state = 'deactivated', j.new_throttled_until,
           least(coalesce(j.new_effective, j.max_concurrency), j.max_concurrency), j.lower
    FROM judged j, woken;
END;
$$;

-- One step of keeping delivery_attempts' daily partitions: create the
-- first missing one up to `ahead` days on, or drop the first past
-- `keep_seconds`, or purge the default partition past it; 'busy' when its
-- lock was not had within lock_timeout (`skip` it in the pass's next
-- call). One row per step done, none when nothing was left. Why it is
-- written so: docs/state-machine.md.
CREATE FUNCTION hooklane_attempt_partitions(ahead integer, keep_seconds double precision, skip text[])
RETURNS TABLE (action text, partition_name text, rows_deleted bigint)
LANGUAGE plpgsql
SET lock_timeout = '500ms'
AS $$
#variable_conflict use_column
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
    cutoff timestamptz := CASE WHEN keep_seconds = 'infinity' THEN '-infinity'
                               ELSE now() - make_interval(secs => keep_seconds) END;
    day date;
    low timestamptz;
    high timestamptz;
    table_name text;
    old text;
    purged bigint;
BEGIN
    FOR i IN 0..ahead LOOP
        day := today + i;
        low := day::timestamp AT TIME ZONE 'UTC';
        high := (day + 1)::timestamp AT TIME ZONE 'UTC';
        table_name := 'delivery_attempts_' || to_char(day, 'YYYYMMDD');
        CONTINUE WHEN table_name = ANY(skip);
        CONTINUE WHEN to_regclass(quote_ident(table_name)) IS NOT NULL;
        CONTINUE WHEN EXISTS (SELECT FROM delivery_attempts_default a
                              WHERE a.recorded_at >= low AND a.recorded_at < high);
        BEGIN
            EXECUTE format('CREATE TABLE %I (LIKE delivery_attempts INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                           table_name);
            -- The bound as a constraint first, so that attaching need not
            -- scan the table (empty anyway) to prove it.
            EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (recorded_at >= %L AND recorded_at < %L)',
                           table_name, table_name || '_bound', low, high);
            EXECUTE format('ALTER TABLE delivery_attempts ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                           table_name, low, high);
            EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', table_name, table_name || '_bound');
            action := 'created';
        EXCEPTION WHEN lock_not_available THEN
            action := 'busy';
        END;
        partition_name := table_name;
        RETURN NEXT;
        RETURN;
    END LOOP;

    SELECT c.relname INTO old
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'delivery_attempts'::regclass
      AND c.relname ~ '^delivery_attempts_[0-9]{8}$'
      AND NOT c.relname = ANY(skip)
      -- never one the loop above makes, whatever keep_seconds says: a step
      -- would undo the one before it, for ever
      AND to_date(substr(c.relname, 19), 'YYYYMMDD') < today
      AND (to_date(substr(c.relname, 19), 'YYYYMMDD') + 1)::timestamp AT TIME ZONE 'UTC' <= cutoff
    ORDER BY c.relname
    LIMIT 1;
    IF old IS NOT NULL THEN
        BEGIN
            EXECUTE format('DROP TABLE %I', old);
            action := 'dropped';
        EXCEPTION WHEN lock_not_available THEN
            action := 'busy';
        END;
        partition_name := old;
        RETURN NEXT;
        RETURN;
    END IF;

    DELETE FROM delivery_attempts_default a WHERE a.recorded_at < cutoff;
    GET DIAGNOSTICS purged = ROW_COUNT;
    IF purged > 0 THEN
        action := 'purged';
        partition_name := 'delivery_attempts_default';
        rows_deleted := purged;
        RETURN NEXT;
    END IF;
END;
$$;

-- Today's partition of delivery_attempts and the next three days', as the migration made them;
-- the worker's maintenance keeps making them ahead (a step a call).
SELECT hooklane_attempt_partitions(3, 'infinity', '{}') FROM generate_series(0, 3);

-- The reservation the 0.1.0 release calls (migrations 0002 and 0003), kept
-- for its workers during a rolling upgrade; no code of this release calls
-- it. Its drop is hooklane/store/after_next_release/drop_release_0_1_0.sql,
-- the first migration after the next release.

CREATE FUNCTION hooklane_absorb_wakeups(owned integer[]) RETURNS void
LANGUAGE sql AS $$
    WITH taken AS (
        DELETE FROM wakeups
        WHERE partition = ANY(owned)
        RETURNING endpoint_id, partition
    )
    INSERT INTO ready_endpoints (endpoint_id, partition, ready_at)
    SELECT DISTINCT endpoint_id, partition, now() FROM taken
    ON CONFLICT (endpoint_id) DO UPDATE
    SET ready_at = least(ready_endpoints.ready_at, EXCLUDED.ready_at);
$$;

CREATE FUNCTION hooklane_rerate(candidates bigint[]) RETURNS void
LANGUAGE sql AS $$
    WITH verdict AS (
        SELECT c.endpoint_id,
               CASE
                   WHEN ep.id IS NULL OR ep.state <> 'active' OR ep.paused
                        OR ep.secret IS NULL OR h.head IS NULL THEN NULL
                   WHEN ep.paused_until > now() THEN greatest(ep.paused_until, h.head)
                   WHEN f.n >= ep.max_concurrency THEN 'infinity'::timestamptz
                   ELSE greatest(h.head, now())
               END AS ready_at
        FROM unnest(candidates) AS c(endpoint_id)
        LEFT JOIN endpoints ep ON ep.id = c.endpoint_id
        CROSS JOIN LATERAL (SELECT min(d.next_attempt_at) AS head FROM deliveries d
                            WHERE d.endpoint_id = c.endpoint_id AND d.state = 'pending') h
        CROSS JOIN LATERAL (SELECT count(*) AS n FROM deliveries d
                            WHERE d.endpoint_id = c.endpoint_id AND d.state = 'sending') f
    ),
    idle AS (
        DELETE FROM ready_endpoints r
        USING verdict v
        WHERE r.endpoint_id = v.endpoint_id AND v.ready_at IS NULL
    )
    UPDATE ready_endpoints r
    SET ready_at = v.ready_at
    FROM verdict v
    WHERE r.endpoint_id = v.endpoint_id AND v.ready_at IS NOT NULL;
$$;

CREATE FUNCTION hooklane_reserve(owned integer[], max_rows integer, lease_grace double precision)
RETURNS TABLE (id bigint, attempts integer, created_at timestamptz, endpoint_id bigint,
               namespace text, name text, url text, secret text, timeout_seconds integer,
               event_id text, type text, data text, event_created_at timestamptz,
               previous_secret text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    candidates bigint[];
BEGIN
    PERFORM hooklane_absorb_wakeups(owned);

    -- Step 2: the endpoints that have waited longest, locked until the
    -- reservation commits so that a result recorded meanwhile (which makes
    -- its endpoint ready again) waits for step 4's verdict instead of being
    -- overwritten by it. Rows a result is updating right now are skipped:
    -- they will be ready on the next round.
    -- Index: ready_endpoints_ready_at.
    SELECT array_agg(r.endpoint_id) INTO candidates
    FROM (SELECT endpoint_id
          FROM ready_endpoints
          WHERE ready_at <= now()
            AND partition = ANY(owned)
          ORDER BY ready_at
          LIMIT max_rows
          FOR UPDATE SKIP LOCKED) r;
    IF candidates IS NULL THEN
        RETURN;
    END IF;

    -- Step 3: due deliveries of the candidates, never more per endpoint than
    -- its free concurrency, ordered by position within each endpoint's queue
    -- so that endpoints interleave: the first of each before the second of
    -- any. Those of another tenant's event are discarded in the same
    -- statement; they took a slot of this round only, and the endpoint stays
    -- ready for the next.
    -- Index: deliveries_in_flight for the count; deliveries_queue for the
    -- first rows of each endpoint's queue; primary key of events.
    RETURN QUERY
    WITH slots AS (
        SELECT ep.id,
               ep.max_concurrency - (SELECT count(*) FROM deliveries f
                                     WHERE f.endpoint_id = ep.id AND f.state = 'sending') AS free
        FROM endpoints ep
        WHERE ep.id = ANY(candidates)
          AND ep.state = 'active'
          AND NOT ep.paused
          AND ep.secret IS NOT NULL
          AND (ep.paused_until IS NULL OR ep.paused_until <= now())
    ),
    queued AS (
        SELECT c.id, row_number() OVER (PARTITION BY s.id ORDER BY c.next_attempt_at, c.id) AS pos
        FROM slots s
        CROSS JOIN LATERAL (
            -- SKIP LOCKED: a pending row is locked by a publish coalescing
            -- into it, in an application transaction that may stay open
            -- for long; the reservation takes the next one rather than
            -- wait (and hold up the worker) until it commits.
            SELECT d.id, d.next_attempt_at
            FROM deliveries d
            WHERE d.endpoint_id = s.id
              AND d.state = 'pending'
              AND d.next_attempt_at <= now()
            ORDER BY d.next_attempt_at, d.id
            LIMIT greatest(s.free, 0)
            FOR UPDATE SKIP LOCKED
        ) c
    ),
    chosen AS (
        SELECT q.id FROM queued q ORDER BY q.pos, q.id LIMIT max_rows
    ),
    reserved AS (
        UPDATE deliveries d
        SET state = CASE WHEN d.event_tenant = ep.tenant THEN 'sending' ELSE 'discarded' END,
            attempts = CASE WHEN d.event_tenant = ep.tenant THEN d.attempts + 1 ELSE d.attempts END,
            reserved_at = now(),
            lease_expires_at = CASE WHEN d.event_tenant = ep.tenant
                                    THEN now() + make_interval(secs => ep.timeout_seconds + lease_grace)
                               END,
            last_error = CASE WHEN d.event_tenant = ep.tenant THEN d.last_error
                              ELSE format('discarded: the endpoint''s tenant changed from %s to %s',
                                          d.event_tenant, ep.tenant)
                         END
        FROM chosen s, endpoints ep, events e
        WHERE d.id = s.id
          AND d.state = 'pending'
          AND ep.id = d.endpoint_id
          AND e.tenant = d.event_tenant
          AND e.id = d.event_id
        RETURNING d.id, d.attempts, d.created_at, d.endpoint_id,
                  ep.namespace, ep.name, ep.url, ep.secret, ep.timeout_seconds,
                  e.id AS event_id, e.type, e.data::text AS data, e.created_at AS event_created_at,
                  CASE WHEN ep.previous_secret_until > now() THEN ep.previous_secret END
                    AS previous_secret,
                  d.state
    )
    SELECT r.id, r.attempts, r.created_at, r.endpoint_id, r.namespace, r.name, r.url, r.secret,
           r.timeout_seconds, r.event_id, r.type, r.data, r.event_created_at, r.previous_secret
    FROM reserved r
    WHERE r.state = 'sending';

    PERFORM hooklane_rerate(candidates);
END;
$$;

-- ---------------------------------------------------------------------------
-- Publishing (migrations 0012 and 0015): the contract every language
-- calls (docs/publishing.md).

-- The tenants each database role may publish for, by the name the
-- connection logged in as (session_user). A NULL tenant: every tenant.
-- The owner of the publish functions (Hooklane's role), its members and
-- superusers need none: they can write the tables themselves. Managed by
-- `hooklane publisher`; the migration gave every role that held EXECUTE on
-- the v1 functions every tenant.
CREATE TABLE publisher_scopes (
    role       text NOT NULL CHECK (length(role) BETWEEN 1 AND 63),
    tenant     text CHECK (length(tenant) BETWEEN 1 AND 253),
    granted_at timestamptz NOT NULL DEFAULT now()
);
-- hooklane_try_publish_v1's scope check (one role's scope for one tenant
-- or for all, '' standing for NULL, which no tenant is), the CLI's grant
-- (ON CONFLICT) and list.
CREATE UNIQUE INDEX publisher_scopes_role_tenant ON publisher_scopes (role, coalesce(tenant, ''));

-- Why a publish is refused, if it is: the first rule the arguments break,
-- as the argument's name and the reason; NULLs when none is. Reads no
-- table. hooklane.publish.check_event holds the same rules, checked before
-- any SQL for messages that quote the value and the path in the data;
-- tests/db/test_publish_function.py feeds both the same inputs.
CREATE FUNCTION hooklane_publish_refusal_v1(tenant text, type text, data jsonb, id text,
                                            coalesce_key text, traceparent text,
                                            OUT field text, OUT message text)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
-- Every publish pays for these, so no pattern has a bounded repetition
-- ({1,255} took 30 us a call, a tenth of the whole publish: lengths are
-- compared instead). Each rule costs no more than its limit allows,
-- whatever the argument: a text's bytes are compared before its
-- characters are counted (octet_length reads a header; length reads the
-- text), no pattern runs on a text longer than its limit, no walk of the
-- data recurses past level 64, and the data is printed whole only once
-- its binary size and its numbers bound the printed size
-- (bench/publish_function.py).
DECLARE
    printed text;
    candidates jsonb;
    numbers_refused boolean;
BEGIN
    -- The C0 and C1 controls of hooklane/checks.py (Postgres text holds
    -- no NUL, nor a lone surrogate).
    IF tenant IS NULL THEN
        field := 'tenant'; message := 'is required';
    ELSIF octet_length(tenant) > 4 * 253 OR length(tenant) NOT BETWEEN 1 AND 253 THEN
        field := 'tenant'; message := 'must be a string of 1 to 253 characters';
    ELSIF tenant ~ '[\x01-\x1f\x7f-\x9f]' THEN
        field := 'tenant'; message := 'must not contain control characters';
    ELSIF type IS NULL OR octet_length(type) > 4 * 255 OR length(type) > 255
          OR type !~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$' THEN
        field := 'type'; message := 'must be a dotted event type like ''order.updated''';
    ELSIF data IS NULL OR jsonb_typeof(data) <> 'object' THEN
        field := 'data'; message := 'must be a JSON object';
    ELSIF id IS NOT NULL AND (octet_length(id) > 255 OR id !~ '^[A-Za-z0-9_.:-]+$') THEN
        field := 'id'; message := 'must be 1 to 255 characters of letters, digits and _.:-';
    ELSIF coalesce_key IS NOT NULL
          AND (octet_length(coalesce_key) > 4 * 255 OR length(coalesce_key) NOT BETWEEN 1 AND 255) THEN
        field := 'coalesce_key'; message := 'is required: a string of 1 to 255 characters';
    ELSIF coalesce_key ~ '[\x01-\x1f\x7f-\x9f]' THEN
        field := 'coalesce_key'; message := 'must not contain control characters';
    -- jsonb's binary form is at most 4 times its printed text (an array
    -- of 1s: a 4-byte entry and an aligned 8-byte numeric per ", 1"), so
    -- a binary over 8 times the limit prints over the limit: refused
    -- unprinted and unwalked. `#> '{}'` is the data decompressed, as a
    -- value read from a table may come compressed.
    ELSIF pg_column_size(data #> '{}') > 8 * 262144 THEN
        field := 'data'; message := 'is larger than 262144 bytes';
    -- Receivers' parsers recurse: an array or object 64 levels down (the
    -- data itself is level 0) is refused, as hooklane.checks.MAX_DEPTH.
    -- Level 64 exactly: any deeper one has an ancestor there, and the walk
    -- goes no further down ({64 to last} recursed to the bottom, and
    -- overflowed the stack at ~11,000 levels).
    ELSIF jsonb_path_exists(data, 'strict $.**{64} ? (@.type() == "object" || @.type() == "array")') THEN
        field := 'data'; message := 'nests deeper than 64 levels';
    END IF;
    IF field IS NOT NULL THEN
        RETURN;
    END IF;
    -- Integers every receiver reads back exactly: 64 bits, signed or
    -- unsigned. A number jsonb prints without a fraction is one, however
    -- the producer wrote it (1e20 is printed as 21 digits). The numbers
    -- whose text may be many times their binary are among those beyond
    -- 2^63 (1e131071: 131,072 digits) and those within 1e-19 of zero
    -- (0e-16383, 1e-16383: 16,385 characters); any other prints in at
    -- most its own stored digits and 21 more. Those are collected in one
    -- walk (.abs() of a non-number is no match), then printed one by one
    -- until one is an integer out of range or together they pass the
    -- size limit.
    candidates := jsonb_path_query_array(data, 'strict $.** ? (@.abs() > 9223372036854775807 '
                                                 '|| @.abs() < 1e-19)');
    IF candidates <> '[]' THEN
        SELECT n.out_of_range INTO numbers_refused
        FROM (
            SELECT strpos(p.text, '.') = 0
                   AND (c.number::numeric < -9223372036854775808
                        OR c.number::numeric > 18446744073709551615) AS out_of_range,
                   sum(octet_length(p.text)) OVER (ROWS UNBOUNDED PRECEDING) AS bytes
            FROM jsonb_array_elements(candidates) AS c(number),
                 LATERAL (SELECT c.number::text) AS p(text)
        ) AS n
        WHERE n.out_of_range OR n.bytes > 262144
        LIMIT 1;
        IF numbers_refused THEN
            field := 'data'; message := 'has an integer outside the 64-bit range';
        ELSIF NOT numbers_refused THEN
            field := 'data'; message := 'is larger than 262144 bytes';
        END IF;
    END IF;
    IF field IS NOT NULL THEN
        RETURN;
    END IF;
    -- What is sent: a receiver gets data::text as the body's "data". At
    -- most a few times the binary now, 2 MiB at most.
    printed := data::text;
    IF octet_length(printed) > 262144 THEN
        field := 'data'; message := 'is larger than 262144 bytes';
    ELSIF traceparent IS NOT NULL
          AND (octet_length(traceparent) <> 55 OR traceparent !~ '^00-[0-9a-f]+-[0-9a-f]+-[0-9a-f]+$'
               OR substr(traceparent, 36, 1) <> '-' OR substr(traceparent, 53, 1) <> '-') THEN
        field := 'traceparent';
        message := 'must be a W3C traceparent: 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>, lowercase';
    ELSIF substr(traceparent, 4, 32) = repeat('0', 32) THEN
        field := 'traceparent'; message := 'has an all-zero trace id, which W3C Trace Context forbids';
    ELSIF substr(traceparent, 37, 16) = repeat('0', 16) THEN
        field := 'traceparent'; message := 'has an all-zero parent span id, which W3C Trace Context forbids';
    END IF;
END;
$$;

-- The outbox write (docs/publishing.md): the arguments, then the caller's
-- scope (session_user), then the event and a delivery per matching active
-- endpoint of its tenant, a refusal reported in the result rather than
-- raised. SECURITY DEFINER with its search_path pinned, EXECUTE revoked
-- from PUBLIC (below). Why it is written so: docs/state-machine.md.
-- The event catalogue's check (migration 0024, docs/catalogue.md) comes
-- after the scope: an archived type is refused in every mode; under
-- 'warn' or 'enforce' an unknown type, or data that validates against
-- none of the type's versions (hooklane_catalogue_problem_v1, created
-- with the first such mode), is marked or refused, each refusal a row of
-- catalogue_refusals.
-- Index: endpoints_tenant; primary key of events; deliveries_coalesce for
-- the ON CONFLICT of a keyed publish; publisher_scopes_role_tenant; the
-- primary keys of catalogue_modes and catalogue_types.
CREATE FUNCTION hooklane_try_publish_v1(tenant text, type text, data jsonb, id text DEFAULT NULL,
                                        coalesce_key text DEFAULT NULL, traceparent text DEFAULT NULL,
                                        OUT event_id text, OUT stored boolean, OUT fanout integer,
                                        OUT error_code text, OUT error_field text, OUT error_message text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
BEGIN
    SELECT * INTO event_id, stored, fanout, error_code, error_field, error_message
    FROM hooklane_try_publish_v3($1, $2, $3, $4, $5, $6, NULL);
END;
$$;

-- hooklane_try_publish_v1 with the data as JSON text, which it parses
-- itself: every input, whatever its text, is answered in the row. The
-- parse runs in a subtransaction (the EXCEPTION block), the only way
-- PostgreSQL 15 has to try a conversion; it writes nothing, so it is given
-- no transaction id of its own and costs none of what subtransactions cost
-- under load (pg_subtrans lookups, the 64-per-backend cache). A text over
-- 16 times the limit is refused before it is parsed: room for any
-- indentation and \u escapes of data that prints within it.
CREATE FUNCTION hooklane_try_publish_v2(tenant text, type text, data text, id text DEFAULT NULL,
                                        coalesce_key text DEFAULT NULL, traceparent text DEFAULT NULL,
                                        OUT event_id text, OUT stored boolean, OUT fanout integer,
                                        OUT error_code text, OUT error_field text, OUT error_message text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    parsed jsonb;
    problem text;
    detail text;
    refusal record;
BEGIN
    IF octet_length(data) > 16 * 262144 THEN
        problem := 'is more than 4194304 bytes of JSON text';
    ELSE
        BEGIN
            parsed := data::jsonb;
        EXCEPTION
            WHEN statement_too_complex THEN
                problem := 'nests deeper than 64 levels';
            WHEN data_exception OR program_limit_exceeded THEN
                GET STACKED DIAGNOSTICS problem = MESSAGE_TEXT, detail = PG_EXCEPTION_DETAIL;
                problem := 'is not JSON that PostgreSQL can store: '
                           || problem || coalesce(' (' || nullif(detail, '') || ')', '');
        END;
    END IF;
    IF problem IS NOT NULL THEN
        -- The rules of the arguments checked before the data's still come
        -- first.
        refusal := hooklane_publish_refusal_v1($1, $2, '{}', NULL, NULL, NULL);
        error_code := 'WH422';
        error_field := coalesce(refusal.field, 'data');
        error_message := coalesce(refusal.message, problem);
        RETURN;
    END IF;
    SELECT * INTO event_id, stored, fanout, error_code, error_field, error_message
    FROM hooklane_try_publish_v1($1, $2, parsed, $4, $5, $6);
END;
$$;

-- The schema the function and the tables were created in: the first of the
-- migration's search_path.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION hooklane_try_publish_v1(text, text, jsonb, text, text, text) '
                   'SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION hooklane_try_publish_v2(text, text, text, text, text, text) '
                   'SET search_path = %I, pg_temp', current_schema());
END;
$$;

-- hooklane_try_publish_v1, raising its refusal: SQLSTATE WH422 or WH409,
-- the message "<argument>: <reason>", and the argument's name in the
-- error's column field. Returns the event id. A refusal raised inside a
-- transaction aborts it, as any error does: a caller that wants to go on
-- calls it inside a savepoint, or calls hooklane_try_publish_v1.
CREATE FUNCTION hooklane_publish_v1(tenant text, type text, data jsonb, id text DEFAULT NULL,
                                    coalesce_key text DEFAULT NULL, traceparent text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    r record;
BEGIN
    r := hooklane_try_publish_v1($1, $2, $3, $4, $5, $6);
    IF r.error_code IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = r.error_code, COLUMN = r.error_field,
            MESSAGE = format('%s: %s', r.error_field, r.error_message);
    END IF;
    RETURN r.event_id;
END;
$$;

-- hooklane_try_publish_v2, raising its refusal, as hooklane_publish_v1
-- raises v1's.
CREATE FUNCTION hooklane_publish_v2(tenant text, type text, data text, id text DEFAULT NULL,
                                    coalesce_key text DEFAULT NULL, traceparent text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    r record;
BEGIN
    r := hooklane_try_publish_v2($1, $2, $3, $4, $5, $6);
    IF r.error_code IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = r.error_code, COLUMN = r.error_field,
            MESSAGE = format('%s: %s', r.error_field, r.error_message);
    END IF;
    RETURN r.event_id;
END;
$$;

-- Publishing is granted, not given: `hooklane publisher grant` grants
-- EXECUTE on these to the application's role and names its tenants
-- (docs/publishing.md). The owner keeps it.
REVOKE EXECUTE ON FUNCTION hooklane_try_publish_v1(text, text, jsonb, text, text, text),
                           hooklane_publish_v1(text, text, jsonb, text, text, text),
                           hooklane_try_publish_v2(text, text, text, text, text, text),
                           hooklane_publish_v2(text, text, text, text, text, text) FROM PUBLIC;

-- hooklane_publish_refusal_v1's rules, with the ordering key's.
CREATE FUNCTION hooklane_publish_refusal_v2(tenant text, type text, data jsonb, id text,
                                            coalesce_key text, traceparent text, ordering_key text,
                                            OUT field text, OUT message text)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    SELECT r.field, r.message INTO field, message
    FROM hooklane_publish_refusal_v1(tenant, type, data, id, coalesce_key, traceparent) r;
    IF field IS NOT NULL OR ordering_key IS NULL THEN
        RETURN;
    -- It travels as a header (hooklane-ordering-key), which HTTP keeps to
    -- visible ASCII and spaces: nothing a receiver's framework could read
    -- otherwise than it was written.
    ELSIF octet_length(ordering_key) NOT BETWEEN 1 AND 255 OR ordering_key !~ '^[\x20-\x7e]+$' THEN
        field := 'ordering_key'; message := 'must be 1 to 255 printable ASCII characters (letters, digits, punctuation, spaces)';
    END IF;
END;
$$;

-- The outbox write, as hooklane_try_publish_v1 (migration 0024), with an
-- optional ordering key. Index: endpoints_tenant; primary key of events;
-- deliveries_coalesce for the ON CONFLICT of a keyed unordered publish;
-- publisher_scopes_role_tenant; the primary keys of catalogue_modes,
-- catalogue_types and ordering_keys; deliveries_ordering for the tail a
-- coalesce key replaces.
CREATE FUNCTION hooklane_try_publish_v3(tenant text, type text, data jsonb, id text DEFAULT NULL,
                                        coalesce_key text DEFAULT NULL, traceparent text DEFAULT NULL,
                                        ordering_key text DEFAULT NULL,
                                        OUT event_id text, OUT stored boolean, OUT fanout integer,
                                        OUT error_code text, OUT error_field text, OUT error_message text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_column
DECLARE
    -- The arguments share their names with columns of events: the
    -- statements below read columns by those names, and these copies.
    p_tenant text := $1;
    p_type text := $2;
    p_data jsonb := $3;
    p_key text := $5;
    p_traceparent text := $6;
    p_order text := $7;
    refusal record;
    differs boolean;
    check_mode text;
    type_archived boolean;
    type_deprecated boolean;
    checked record;
    p_version integer;
    p_problem text;
    refused_reason text;
    key_endpoints bigint[];
    key_seqs bigint[];
    key_heads bigint[];
    moved bigint[];
BEGIN
    refusal := hooklane_publish_refusal_v2(p_tenant, p_type, p_data, $4, p_key, p_traceparent, p_order);
    IF refusal.field IS NOT NULL THEN
        error_code := 'WH422'; error_field := refusal.field; error_message := refusal.message;
        RETURN;
    END IF;
    -- Index: publisher_scopes_role_tenant.
    IF NOT pg_has_role(session_user, current_user, 'MEMBER')
       AND NOT EXISTS (SELECT FROM publisher_scopes s
                       WHERE s.role = session_user AND coalesce(s.tenant, '') IN ('', p_tenant)) THEN
        error_code := 'WH403'; error_field := 'tenant';
        error_message := format('role %s may not publish for tenant %s: its publishing scope does not '
                                'include it (hooklane publisher grant)', session_user, p_tenant);
        RETURN;
    END IF;
    -- The event catalogue's check (migration 0024). Index: the primary
    -- keys of catalogue_modes and catalogue_types.
    SELECT m.mode INTO check_mode
    FROM catalogue_modes m
    WHERE m.tenant IN (p_tenant, '')
    ORDER BY m.tenant DESC
    LIMIT 1;
    SELECT t.archived, t.deprecated_since <= current_date INTO type_archived, type_deprecated
    FROM catalogue_types t
    WHERE t.name = p_type;
    IF type_archived THEN
        error_field := 'type'; refused_reason := 'archived';
        error_message := format('%s is archived in the event catalogue: it is no longer published', p_type);
    ELSIF coalesce(check_mode, 'off') = 'off' THEN
        NULL;
    ELSIF type_archived IS NULL THEN
        -- Not in the catalogue (archived is NOT NULL in every row).
        error_field := 'type'; refused_reason := 'unknown';
        error_message := format('%s is not in the event catalogue (hooklane eventtype apply, or a '
                                'WebhookEventType resource, adds it)', p_type);
    ELSE
        -- hooklane_catalogue_problem_v1 exists once a mode other than
        -- 'off' was set (hooklane/store/catalogue_check.sql). The data goes
        -- as text: the jsonb transform would make every number a Decimal,
        -- which JSON Schema's "integer" refuses.
        checked := hooklane_catalogue_problem_v1(p_type, p_data::text);
        p_version := checked.version;
        IF checked.problem IS NOT NULL THEN
            error_field := 'data'; refused_reason := 'schema'; error_message := checked.problem;
        END IF;
    END IF;
    IF refused_reason IS NOT NULL THEN
        IF refused_reason = 'archived' OR check_mode = 'enforce' THEN
            INSERT INTO catalogue_refusals (tenant, type, reason, message)
            VALUES (p_tenant, p_type, refused_reason, error_message);
            error_code := 'WH422';
            RETURN;
        END IF;
        -- 'warn': stored, and marked.
        p_problem := format('%s: %s', error_field, error_message);
        error_field := NULL; error_message := NULL;
    END IF;
    event_id := coalesce($4, 'msg_' || replace(gen_random_uuid()::text, '-', ''));
    IF p_order IS NULL THEN
        WITH matched AS (
            SELECT ep.id, ep.partition
            FROM endpoints ep
            WHERE ep.tenant = p_tenant
              AND ep.state = 'active'
              AND hooklane_type_matches(ep.event_types, p_type)
        ),
        event AS (
            INSERT INTO events (id, tenant, type, data, coalesce_key, fanout, traceparent,
                                schema_version, schema_problem, schema_deprecated)
            SELECT hooklane_try_publish_v3.event_id, p_tenant, p_type, p_data, p_key, count(*), p_traceparent,
                   p_version, p_problem, nullif(type_deprecated, false)
            FROM matched
            ON CONFLICT (tenant, id) DO NOTHING
            RETURNING fanout
        ),
        -- Without a key: no row of deliveries_coalesce to conflict with.
        queued AS (
            INSERT INTO deliveries (endpoint_id, event_tenant, event_id, coalesce_key)
            SELECT m.id, p_tenant, hooklane_try_publish_v3.event_id, NULL FROM matched m
            WHERE p_key IS NULL AND EXISTS (SELECT FROM event)
        ),
        coalesced AS (
            INSERT INTO deliveries (endpoint_id, event_tenant, event_id, coalesce_key)
            SELECT m.id, p_tenant, hooklane_try_publish_v3.event_id, p_key FROM matched m
            WHERE p_key IS NOT NULL AND EXISTS (SELECT FROM event)
            ON CONFLICT (endpoint_id, coalesce_key)
                WHERE state = 'pending' AND coalesce_key IS NOT NULL
            DO UPDATE SET event_tenant = EXCLUDED.event_tenant, event_id = EXCLUDED.event_id
        )
        SELECT e.fanout INTO fanout FROM event e;
    ELSE
        -- The event, and the key's row of each endpoint it goes to, locked
        -- in endpoint order (as every publisher and worker takes them, so
        -- that none waits on another in a cycle) and numbered. A row
        -- another transaction holds is waited for until it commits: its
        -- deliveries then come first.
        WITH matched AS (
            SELECT ep.id
            FROM endpoints ep
            WHERE ep.tenant = p_tenant
              AND ep.state = 'active'
              AND hooklane_type_matches(ep.event_types, p_type)
        ),
        -- The key's place in the tenant's commit order, first of the
        -- key's rows (every publisher of the key takes it first).
        placed AS (
            INSERT INTO ordering_positions AS o (tenant, key, last_position)
            VALUES (p_tenant, p_order, 1)
            ON CONFLICT (tenant, key) DO UPDATE
            SET last_position = o.last_position + 1, touched_at = now()
            RETURNING o.last_position
        ),
        event AS (
            INSERT INTO events (id, tenant, type, data, coalesce_key, fanout, traceparent,
                                schema_version, schema_problem, schema_deprecated, ordering_key,
                                ordering_position)
            SELECT hooklane_try_publish_v3.event_id, p_tenant, p_type, p_data, p_key, count(*), p_traceparent,
                   p_version, p_problem, nullif(type_deprecated, false), p_order,
                   (SELECT p.last_position FROM placed p)
            FROM matched
            ON CONFLICT (tenant, id) DO NOTHING
            RETURNING fanout
        ),
        numbered AS (
            INSERT INTO ordering_keys AS k (endpoint_id, key, last_seq, head_seq)
            SELECT m.id, p_order, 1, 1 FROM matched m
            WHERE EXISTS (SELECT FROM event)
            ORDER BY m.id
            ON CONFLICT (endpoint_id, key) DO UPDATE
            SET last_seq = k.last_seq + 1, head_seq = coalesce(k.head_seq, k.last_seq + 1),
                touched_at = now()
            RETURNING k.endpoint_id, k.last_seq, k.head_seq
        )
        SELECT e.fanout,
               (SELECT array_agg(n.endpoint_id ORDER BY n.endpoint_id) FROM numbered n),
               (SELECT array_agg(n.last_seq ORDER BY n.endpoint_id) FROM numbered n),
               (SELECT array_agg(n.head_seq ORDER BY n.endpoint_id) FROM numbered n)
        INTO fanout, key_endpoints, key_seqs, key_heads
        FROM event e;
        IF key_endpoints IS NOT NULL THEN
            -- A new statement, so a new snapshot (read committed): it sees
            -- the deliveries of the transactions the rows were waited on.
            -- A pending delivery of the coalesce key that is the key's
            -- last takes the event and the new number; every other
            -- endpoint gets a delivery, due only if it is the key's head.
            WITH k AS MATERIALIZED (
                SELECT * FROM unnest(key_endpoints, key_seqs, key_heads) AS k(endpoint_id, seq, head)
            ),
            tail AS (
                UPDATE deliveries d
                SET event_tenant = p_tenant, event_id = hooklane_try_publish_v3.event_id,
                    ordering_seq = k.seq
                FROM k
                WHERE p_key IS NOT NULL
                  AND d.endpoint_id = k.endpoint_id
                  AND d.ordering_key = p_order
                  AND d.ordering_seq = k.seq - 1
                  AND d.state = 'pending'
                  AND EXISTS (SELECT FROM events e
                              WHERE e.tenant = d.event_tenant AND e.id = d.event_id
                                AND e.coalesce_key = p_key)
                RETURNING d.endpoint_id, k.head = k.seq - 1 AS was_head
            ),
            queued AS (
                INSERT INTO deliveries (endpoint_id, event_tenant, event_id, coalesce_key, ordering_key,
                                        ordering_seq, next_attempt_at)
                SELECT k.endpoint_id, p_tenant, hooklane_try_publish_v3.event_id, NULL, p_order, k.seq,
                       CASE WHEN k.head = k.seq THEN now() ELSE 'infinity' END
                FROM k
                WHERE NOT EXISTS (SELECT FROM tail t WHERE t.endpoint_id = k.endpoint_id)
            )
            SELECT array_agg(t.endpoint_id) FILTER (WHERE t.was_head) INTO moved FROM tail t;
            IF moved IS NOT NULL THEN
                UPDATE ordering_keys k SET head_seq = k.last_seq
                WHERE k.endpoint_id = ANY(moved) AND k.key = p_order;
            END IF;
        END IF;
    END IF;
    stored := fanout IS NOT NULL;
    IF stored THEN
        RETURN;
    END IF;
    -- A new statement, so a new snapshot (read committed): it sees the
    -- event another transaction committed while the insert waited on it.
    SELECT NOT (e.type = p_type AND e.data = p_data AND e.coalesce_key IS NOT DISTINCT FROM p_key
                AND e.ordering_key IS NOT DISTINCT FROM p_order)
    INTO differs
    FROM events e
    WHERE e.tenant = p_tenant AND e.id = hooklane_try_publish_v3.event_id;
    IF differs THEN
        error_code := 'WH409'; error_field := 'id';
        error_message := format('%s was already published by this tenant with different content '
                                '(type, data, coalesce_key or ordering_key); an id names one event',
                                hooklane_try_publish_v3.event_id);
        event_id := NULL;
        stored := NULL;
    END IF;
END;
$$;

-- hooklane_try_publish_v3 with the data as JSON text, as
-- hooklane_try_publish_v2 is v1's.
CREATE FUNCTION hooklane_try_publish_v4(tenant text, type text, data text, id text DEFAULT NULL,
                                        coalesce_key text DEFAULT NULL, traceparent text DEFAULT NULL,
                                        ordering_key text DEFAULT NULL,
                                        OUT event_id text, OUT stored boolean, OUT fanout integer,
                                        OUT error_code text, OUT error_field text, OUT error_message text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    parsed jsonb;
    problem text;
    detail text;
    refusal record;
BEGIN
    IF octet_length(data) > 16 * 262144 THEN
        problem := 'is more than 4194304 bytes of JSON text';
    ELSE
        BEGIN
            parsed := data::jsonb;
        EXCEPTION
            WHEN statement_too_complex THEN
                problem := 'nests deeper than 64 levels';
            WHEN data_exception OR program_limit_exceeded THEN
                GET STACKED DIAGNOSTICS problem = MESSAGE_TEXT, detail = PG_EXCEPTION_DETAIL;
                problem := 'is not JSON that PostgreSQL can store: '
                           || problem || coalesce(' (' || nullif(detail, '') || ')', '');
        END;
    END IF;
    IF problem IS NOT NULL THEN
        -- The rules of the arguments checked before the data's still come
        -- first.
        refusal := hooklane_publish_refusal_v1($1, $2, '{}', NULL, NULL, NULL);
        error_code := 'WH422';
        error_field := coalesce(refusal.field, 'data');
        error_message := coalesce(refusal.message, problem);
        RETURN;
    END IF;
    SELECT * INTO event_id, stored, fanout, error_code, error_field, error_message
    FROM hooklane_try_publish_v3($1, $2, parsed, $4, $5, $6, $7);
END;
$$;

-- hooklane_try_publish_v3 and _v4, raising their refusals as
-- hooklane_publish_v1 raises v1's.
CREATE FUNCTION hooklane_publish_v3(tenant text, type text, data jsonb, id text DEFAULT NULL,
                                    coalesce_key text DEFAULT NULL, traceparent text DEFAULT NULL,
                                    ordering_key text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    r record;
BEGIN
    r := hooklane_try_publish_v3($1, $2, $3, $4, $5, $6, $7);
    IF r.error_code IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = r.error_code, COLUMN = r.error_field,
            MESSAGE = format('%s: %s', r.error_field, r.error_message);
    END IF;
    RETURN r.event_id;
END;
$$;

CREATE FUNCTION hooklane_publish_v4(tenant text, type text, data text, id text DEFAULT NULL,
                                    coalesce_key text DEFAULT NULL, traceparent text DEFAULT NULL,
                                    ordering_key text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    r record;
BEGIN
    r := hooklane_try_publish_v4($1, $2, $3, $4, $5, $6, $7);
    IF r.error_code IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = r.error_code, COLUMN = r.error_field,
            MESSAGE = format('%s: %s', r.error_field, r.error_message);
    END IF;
    RETURN r.event_id;
END;
$$;

REVOKE EXECUTE ON FUNCTION hooklane_try_publish_v3(text, text, jsonb, text, text, text, text),
                           hooklane_publish_v3(text, text, jsonb, text, text, text, text),
                           hooklane_try_publish_v4(text, text, text, text, text, text, text),
                           hooklane_publish_v4(text, text, text, text, text, text, text) FROM PUBLIC;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION hooklane_try_publish_v3(text, text, jsonb, text, text, text, text) '
                   'SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION hooklane_try_publish_v4(text, text, text, text, text, text, text) '
                   'SET search_path = %I, pg_temp', current_schema());
END;
$$;

-- hooklane_reserve_v7 (migration 0020), each delivery with its ordering
-- key and number (NULL for an unordered one and for the verdicts), which
-- the receiver gets as headers, read from the row the reservation updates:
-- a join after it, in a statement of its own snapshot, missed a delivery
-- committed after that snapshot was taken and locked by the reservation
-- (FOR UPDATE reads the newest version), which then went out without its
-- headers. A verdict's head is NULL when all that is pending from the
-- floor waits behind its keys ('infinity'), as when nothing is: a key
-- moving on wakes the endpoint.
-- Index: as hooklane_reserve_v7's.
CREATE FUNCTION hooklane_reserve_v8(owned integer[], candidates bigint[], floors timestamptz[],
                                    caps integer[], apart boolean[], max_rows integer,
                                    lease_grace double precision, worker text,
                                    lookahead double precision, tenant_ceiling integer)
RETURNS TABLE (id bigint, attempts integer, created_at timestamptz, endpoint_id bigint,
               namespace text, name text, url text, secret text, timeout_seconds integer,
               event_id text, type text, data text, event_created_at timestamptz,
               previous_secret text, max_concurrency integer,
               deliverable boolean, paused_until timestamptz, head timestamptz,
               at_limit boolean, leases_end timestamptz, tenant text, traceparent text,
               start_at timestamptz, request_terms text, max_attempts integer,
               max_age_seconds double precision, answered_at timestamptz, rate_per_second integer,
               ordering_key text, ordering_seq bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    lock_key integer;
    locked integer[] := '{}';
BEGIN
    -- The tenants' locks, before anything is counted: a statement after
    -- them sees every round that held one before. Class 0x686C74 ("hlt"),
    -- beside the partitions' "hlp", the workers' "hlm" and the tenant
    -- creates' "hle"; two tenants of one hash share a lock, and only wait
    -- on each other. Released as the round's transaction ends.
    -- Index: primary key of endpoints.
    IF tenant_ceiling IS NOT NULL THEN
        FOR lock_key IN
            SELECT DISTINCT hashtext(ep.tenant)
            FROM endpoints ep
            WHERE ep.id = ANY(candidates) AND ep.partition = ANY(owned)
            ORDER BY 1
        LOOP
            PERFORM pg_advisory_xact_lock(x'686C74'::integer, lock_key);
            locked := locked || lock_key;
        END LOOP;
    END IF;

    -- As hooklane_reserve_v6's (migration 0016), with the caps, the tenants' ceiling and
    -- order. An endpoint whose tenant was not locked (it moved to another
    -- tenant since) waits for the next round.
    -- Index: deliveries_leased for the count; deliveries_tenant_leased for
    -- the tenant's; deliveries_rate for the bucket; deliveries_queue from
    -- each floor; primary key of events.
    RETURN QUERY
    WITH candidate AS (
        SELECT c.endpoint_id, coalesce(c.low, '-infinity') AS low, c.cap,
               coalesce(c.apart, false) AS apart
        FROM unnest(candidates, floors, caps, apart) AS c(endpoint_id, low, cap, apart)
    ),
    slots AS MATERIALIZED (
        SELECT ep.id, ep.tenant, c.low, c.cap, c.apart, ep.rate_per_second::float8 AS rate,
               (ep.rate_burst - 1)::float8 / ep.rate_per_second AS tolerance,
               hooklane_concurrency(ep) - (SELECT count(*)
                                           FROM (SELECT f.lease_expires_at FROM deliveries f
                                                 WHERE f.endpoint_id = ep.id AND f.state = 'sending'
                                                   AND f.lease_expires_at > now()
                                                 ORDER BY f.lease_expires_at OFFSET 0) f) AS free,
               CASE WHEN ep.rate_per_second IS NOT NULL
                    THEN greatest(now(), (SELECT t.rate_tat FROM deliveries t
                                          WHERE t.endpoint_id = ep.id AND t.rate_tat IS NOT NULL
                                          ORDER BY t.rate_tat DESC LIMIT 1)) END AS tat
        FROM candidate c
        -- Each candidate's row by its key, as the verdicts read it: the
        -- conditions are kept out of the scan's reach (an outer join,
        -- filtered above it through coalesce). Given to the scan, they
        -- let a plan made on a new install's statistics read every active
        -- endpoint (endpoints_tenant: the state is one of them) into a
        -- hash to meet a hundred candidates, as hooklane_reserve_v6's (migration 0016) does.
        LEFT JOIN endpoints ep ON ep.id = c.endpoint_id
        WHERE coalesce(ep.partition = ANY(owned)
                       AND hooklane_deliverable(ep)
                       AND (ep.paused_until IS NULL OR ep.paused_until <= now())
                       AND (ep.throttled_until IS NULL OR ep.throttled_until <= now())
                       AND (tenant_ceiling IS NULL OR hashtext(ep.tenant) = ANY(locked)), false)
    ),
    -- What each tenant may still start: its ceiling less its live leases,
    -- counted in their index's order up to the ceiling, no further.
    room AS MATERIALIZED (
        SELECT t.tenant,
               tenant_ceiling - (SELECT count(*)
                                 FROM (SELECT f.lease_expires_at FROM deliveries f
                                       WHERE f.event_tenant = t.tenant AND f.state = 'sending'
                                         AND f.attempts > 0 AND f.lease_expires_at > now()
                                       ORDER BY f.lease_expires_at LIMIT tenant_ceiling) f) AS left_
        FROM (SELECT DISTINCT s.tenant FROM slots s) t
        WHERE tenant_ceiling IS NOT NULL
    ),
    granted AS (
        SELECT s.id, s.tenant, s.low, s.cap, s.apart, s.rate, s.tolerance, s.tat,
               least(CASE WHEN s.rate IS NULL THEN greatest(s.free, 0)
                          ELSE least(greatest(s.free, 0),
                                     greatest(floor((extract(epoch FROM now() - s.tat)::float8 + lookahead
                                                     + s.tolerance) * s.rate)::bigint + 1, 0)) END,
                     CASE WHEN s.cap IS NOT NULL THEN greatest(s.cap, 0) END) AS allowed
        FROM slots s
    ),
    queued AS (
        SELECT q.id, q.state, s.tenant, s.apart, s.rate, s.tolerance, s.tat,
               row_number() OVER (PARTITION BY s.id ORDER BY q.next_attempt_at, q.id) AS pos
        FROM granted s
        CROSS JOIN LATERAL (
            -- SKIP LOCKED: as hooklane_reserve_v6's (migration 0016).
            SELECT d.id, d.state, d.next_attempt_at
            FROM deliveries d
            WHERE d.endpoint_id = s.id
              AND d.state = 'pending'
              AND d.next_attempt_at >= s.low
              AND d.next_attempt_at <= now()
            ORDER BY d.next_attempt_at, d.id
            LIMIT s.allowed
            FOR UPDATE SKIP LOCKED
        ) q
    ),
    -- Each row's place within its tenant (its endpoint's first rows before
    -- their seconds, as endpoints interleave), among all of the tenant's
    -- rows and among those counted in max_rows, in one pass. The ceiling keeps a
    -- tenant's first rows, apart or not; it cuts a tenant's last ones, so
    -- the places of those it keeps stand.
    kept AS (
        SELECT q.*
        FROM (SELECT q.*,
                     count(*) OVER w AS place,
                     count(*) FILTER (WHERE NOT q.apart) OVER w AS counted_place
              FROM queued q
              WINDOW w AS (PARTITION BY q.tenant ORDER BY q.pos, q.id ROWS UNBOUNDED PRECEDING)) q
        LEFT JOIN room r ON r.tenant = q.tenant
        WHERE tenant_ceiling IS NULL OR q.place <= r.left_
    ),
    -- The rows counted in max_rows by their place among their tenant's
    -- (every tenant's first before any tenant's second), up to max_rows;
    -- every row apart, which its cap bounds.
    taken AS (
        (SELECT k.id, k.state, k.rate, k.tolerance, k.tat, k.pos
         FROM kept k WHERE NOT k.apart
         ORDER BY k.counted_place, k.id LIMIT max_rows)
        UNION ALL
        SELECT k.id, k.state, k.rate, k.tolerance, k.tat, k.pos FROM kept k WHERE k.apart
    ),
    chosen AS (
        SELECT q.id, q.state,
               CASE WHEN q.rate IS NULL THEN now()
                    ELSE greatest(now(), q.tat + make_interval(secs => (q.pos - 1) / q.rate
                                                                       - q.tolerance)) END AS start_at,
               q.tat + make_interval(secs => q.pos / q.rate) AS rate_tat
        FROM taken q
    ),
    -- The rows to update, found by primary key from the array: joined to
    -- `chosen` alone, a plan made on a nearly empty table's statistics
    -- read the whole key to meet the rows of both branches of `taken`.
    ids AS (
        SELECT array_agg(s.id) AS ids FROM chosen s
    ),
    reserved AS (
        UPDATE deliveries d
        SET state = CASE WHEN hooklane_tenant_discard(d.event_tenant, ep.tenant) IS NULL
                         THEN 'sending' ELSE 'discarded' END,
            attempts = CASE WHEN hooklane_tenant_discard(d.event_tenant, ep.tenant) IS NULL
                            THEN d.attempts + 1 ELSE d.attempts END,
            reserved_at = now(),
            attempted_by = CASE WHEN hooklane_tenant_discard(d.event_tenant, ep.tenant) IS NULL
                                THEN worker ELSE d.attempted_by END,
            lease_expires_at = CASE WHEN hooklane_tenant_discard(d.event_tenant, ep.tenant) IS NULL
                                    THEN s.start_at + make_interval(secs => ep.timeout_seconds
                                                                            + lease_grace)
                               END,
            rate_tat = CASE WHEN hooklane_tenant_discard(d.event_tenant, ep.tenant) IS NULL
                            THEN coalesce(s.rate_tat, d.rate_tat) ELSE d.rate_tat END,
            last_error = coalesce(hooklane_tenant_discard(d.event_tenant, ep.tenant), d.last_error)
        FROM chosen s, endpoints ep, events e
        WHERE d.id = ANY((SELECT i.ids FROM ids i)::bigint[])
          AND d.id = s.id
          AND d.state = s.state
          AND ep.id = d.endpoint_id
          AND e.tenant = d.event_tenant
          AND e.id = d.event_id
        RETURNING d.id, d.attempts, d.created_at, d.endpoint_id,
                  ep.namespace, ep.name, ep.url, ep.secret, ep.timeout_seconds,
                  e.id AS event_id, e.type, e.data::text AS data, e.created_at AS event_created_at,
                  CASE WHEN ep.previous_secret_until > now() THEN ep.previous_secret END
                    AS previous_secret,
                  hooklane_concurrency(ep) AS max_concurrency, d.state, e.tenant, e.traceparent,
                  s.start_at, ep.request_terms, ep.max_attempts, ep.max_age_seconds,
                  ep.rate_per_second, d.ordering_key, d.ordering_seq
    )
    SELECT r.id, r.attempts, r.created_at, r.endpoint_id, r.namespace, r.name, r.url, r.secret,
           r.timeout_seconds, r.event_id, r.type, r.data, r.event_created_at, r.previous_secret,
           r.max_concurrency, NULL::boolean, NULL::timestamptz, NULL::timestamptz, NULL::boolean,
           NULL::timestamptz, r.tenant, r.traceparent, r.start_at, r.request_terms, r.max_attempts,
           r.max_age_seconds, NULL::timestamptz, r.rate_per_second, r.ordering_key, r.ordering_seq
    FROM reserved r
    WHERE r.state = 'sending';

    -- The verdicts, as hooklane_reserve_v6's (migration 0016); an endpoint is also at its
    -- limit while its tenant's live leases are at the ceiling, until the
    -- first of them ends (`leases_end`, unless its own slots are all held:
    -- then the first of its own), and its verdict then names its tenant,
    -- so that a worker may look again when a call of that tenant's ends.
    -- Each tenant's leases are counted once.
    -- Index: primary key of endpoints; deliveries_queue from each floor;
    -- deliveries_leased for the live leases; deliveries_tenant_leased for
    -- the tenant's; deliveries_rate.
    RETURN QUERY
    WITH tenant_leases AS MATERIALIZED (
        SELECT t.tenant, l.n >= tenant_ceiling AS full_, l.ends
        FROM (SELECT DISTINCT ep.tenant FROM endpoints ep
              WHERE ep.id = ANY(candidates) AND ep.partition = ANY(owned)
                AND tenant_ceiling IS NOT NULL) t
        CROSS JOIN LATERAL (
            SELECT count(*) AS n, min(f.lease_expires_at) AS ends
            FROM (SELECT f.lease_expires_at
                  FROM deliveries f
                  WHERE f.event_tenant = t.tenant
                    AND f.state = 'sending'
                    AND f.attempts > 0
                    AND f.lease_expires_at > now()
                  ORDER BY f.lease_expires_at LIMIT tenant_ceiling) f
        ) l
    )
    SELECT NULL::bigint, NULL::integer, NULL::timestamptz, c.endpoint_id,
           NULL::text, NULL::text, NULL::text, NULL::text, NULL::integer,
           NULL::text, NULL::text, NULL::text, NULL::timestamptz, NULL::text,
           hooklane_concurrency(ep), k.ok,
           greatest(ep.paused_until, ep.throttled_until,
                    b.tat - make_interval(secs => lookahead / 2
                                          + (ep.rate_burst - 1)::float8 / ep.rate_per_second)),
           nullif(h.head, 'infinity'), coalesce(l.n >= hooklane_concurrency(ep), false) OR coalesce(k.ok AND tl.full_, false),
           CASE WHEN coalesce(l.n >= hooklane_concurrency(ep), false) OR NOT coalesce(k.ok AND tl.full_, false)
                THEN l.ends ELSE tl.ends END,
           CASE WHEN k.ok AND tl.full_ THEN ep.tenant END, NULL::text,
           NULL::timestamptz, NULL::text, NULL::integer, NULL::float8, clock_timestamp(), NULL::integer,
           NULL::text, NULL::bigint
    FROM unnest(candidates, floors) AS c(endpoint_id, low)
    LEFT JOIN endpoints ep ON ep.id = c.endpoint_id
    CROSS JOIN LATERAL (
        SELECT coalesce(ep.partition = ANY(owned) AND hooklane_deliverable(ep), false) AS ok
    ) k
    LEFT JOIN tenant_leases tl ON tl.tenant = ep.tenant
    LEFT JOIN LATERAL (
        SELECT min(d.next_attempt_at) AS head
        FROM deliveries d
        WHERE k.ok
          AND d.endpoint_id = c.endpoint_id
          AND d.state = 'pending'
          AND d.next_attempt_at >= coalesce(c.low, '-infinity')
    ) h ON true
    LEFT JOIN LATERAL (
        SELECT count(*) AS n, min(f.lease_expires_at) AS ends
        FROM (SELECT f.lease_expires_at
              FROM deliveries f
              WHERE k.ok
                AND f.endpoint_id = c.endpoint_id
                AND f.state = 'sending'
                AND f.lease_expires_at > now()
              ORDER BY f.lease_expires_at OFFSET 0) f
    ) l ON true
    LEFT JOIN LATERAL (
        SELECT t.rate_tat AS tat
        FROM deliveries t
        WHERE k.ok
          AND ep.rate_per_second IS NOT NULL
          AND t.endpoint_id = c.endpoint_id
          AND t.rate_tat IS NOT NULL
        ORDER BY t.rate_tat DESC
        LIMIT 1
    ) b ON true;
END;
$$;

-- Move keys on: for each (endpoint, key) given whose head has settled
-- (delivered, discarded, gone, or dead under the endpoint's
-- ordering_on_dead 'skip'), the next pending delivery of the key becomes
-- due and the head; a head dead under 'hold' holds the key (held_since)
-- until it is resent or discarded. A key whose row a publishing
-- transaction holds is not waited for: it is returned as busy (due NULL),
-- to be moved on once that transaction ends (the worker tries again; its
-- sweep catches what a crash left). Returns the promoted deliveries'
-- endpoints with their due time, and the busy keys. Promoted endpoints
-- outside `owned` (NULL: all) are notified to their owner.
-- Index: primary keys of ordering_keys and endpoints; deliveries_ordering
-- for the head and the next pending of each key.
CREATE FUNCTION hooklane_ordering_advance_v1(endpoint_ids bigint[], keys text[], owned integer[])
RETURNS TABLE (endpoint_id bigint, partition integer, key text, due timestamptz)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    got_endpoints bigint[];
    got_keys text[];
BEGIN
    -- In the publishers' order: endpoint, then key.
    SELECT array_agg(k.endpoint_id ORDER BY k.endpoint_id, k.key), array_agg(k.key ORDER BY k.endpoint_id, k.key)
    INTO got_endpoints, got_keys
    FROM (SELECT k.endpoint_id, k.key
          FROM ordering_keys k
          WHERE (k.endpoint_id, k.key) IN (SELECT DISTINCT u.e, u.k FROM unnest(endpoint_ids, keys) AS u(e, k))
          ORDER BY k.endpoint_id, k.key
          FOR UPDATE OF k SKIP LOCKED) k;
    -- A new statement, so a new snapshot (read committed): it sees what the
    -- transactions that held the rows before committed.
    RETURN QUERY
    WITH keyed AS MATERIALIZED (
        SELECT k.endpoint_id, k.key, k.head_seq, k.held_since, h.state AS head_state,
               ep.ordering_on_dead, ep.partition
        FROM unnest(got_endpoints, got_keys) AS g(endpoint_id, key)
        JOIN ordering_keys k ON k.endpoint_id = g.endpoint_id AND k.key = g.key
        JOIN endpoints ep ON ep.id = k.endpoint_id
        LEFT JOIN deliveries h ON h.endpoint_id = k.endpoint_id AND h.ordering_key = k.key
                              AND h.ordering_seq = k.head_seq
        WHERE k.head_seq IS NOT NULL
    ),
    moving AS (
        SELECT kk.endpoint_id, kk.key, kk.partition, kk.head_state, n.id AS next_id, n.ordering_seq AS next_seq
        FROM keyed kk
        LEFT JOIN LATERAL (
            SELECT n.id, n.ordering_seq
            FROM deliveries n
            WHERE n.endpoint_id = kk.endpoint_id
              AND n.ordering_key = kk.key
              AND n.ordering_seq > kk.head_seq
              AND n.state = 'pending'
            ORDER BY n.ordering_seq
            LIMIT 1
        ) n ON true
        WHERE kk.head_state IS NULL
           OR kk.head_state IN ('delivered', 'discarded')
           OR (kk.head_state = 'dead' AND kk.ordering_on_dead = 'skip')
    ),
    promoted AS (
        UPDATE deliveries d
        SET next_attempt_at = now()
        FROM moving m
        WHERE d.id = m.next_id
          AND d.state = 'pending'
        RETURNING d.endpoint_id, m.partition, m.key, d.next_attempt_at
    ),
    -- Runs whether or not it is read, as every data-modifying WITH does.
    advanced AS (
        UPDATE ordering_keys k
        SET head_seq = m.next_seq, held_since = NULL,
            skipped = k.skipped + CASE WHEN m.head_state = 'dead' THEN 1 ELSE 0 END
        FROM moving m
        WHERE k.endpoint_id = m.endpoint_id AND k.key = m.key
    ),
    -- A dead head under 'hold' holds its key; a head pending or in flight
    -- (resent) does not. Disjoint from `moving`.
    held AS (
        UPDATE ordering_keys k
        SET held_since = CASE WHEN kk.head_state = 'dead' THEN now() END
        FROM keyed kk
        WHERE k.endpoint_id = kk.endpoint_id AND k.key = kk.key
          AND (kk.head_state IN ('pending', 'sending')
               OR (kk.head_state = 'dead' AND kk.ordering_on_dead = 'hold'))
          AND (k.held_since IS NULL) = (kk.head_state = 'dead')
    ),
    woken AS (
        SELECT hooklane_wake_v2(array_agg(p.endpoint_id), array_agg(p.partition), array_agg(p.next_attempt_at))
        FROM promoted p
        WHERE owned IS NULL OR NOT p.partition = ANY(owned)
    )
    SELECT p.endpoint_id, p.partition, p.key, p.next_attempt_at FROM promoted p, woken
    UNION ALL
    SELECT u.e, NULL::integer, u.k, NULL::timestamptz
    FROM (SELECT DISTINCT u.e, u.k FROM unnest(endpoint_ids, keys) AS u(e, k)) u
    WHERE EXISTS (SELECT FROM ordering_keys k WHERE k.endpoint_id = u.e AND k.key = u.k)
      AND NOT EXISTS (SELECT FROM unnest(got_endpoints, got_keys) AS g(e, k) WHERE g.e = u.e AND g.k = u.k);
END;
$$;

-- Record a batch of results: hooklane_complete_v5, then the keys of the
-- batch's ordered deliveries (ordered_endpoints and ordered_keys, one pair
-- per delivery, as the reservation gave them) moved on in the same
-- transaction (hooklane_ordering_advance_v1). Each endpoint's row as v5's,
-- its retried_head the earlier of its retry and a delivery promoted, and
-- `ordering_busy` the keys a publishing transaction held (NULL: none). A
-- promoted endpoint that v5 returned no row for (its result was fenced
-- off) is notified to its owner.
CREATE FUNCTION hooklane_complete_v6(ids bigint[], fences integer[], outcomes text[],
                                     retry_ins double precision[], statuses integer[], errors text[],
                                     failures text[], started_ats timestamptz[],
                                     durations double precision[], retry_afters double precision[],
                                     trace_ids text[], worker text,
                                     threshold integer, step_seconds double precision,
                                     cap_seconds double precision, owned integer[],
                                     delivered_step double precision, adapt_step double precision,
                                     ordered_endpoints bigint[], ordered_keys text[])
RETURNS TABLE (id bigint, partition integer, namespace text, name text, state text,
               paused_until timestamptz, consecutive_failures integer, deliverable boolean,
               retried_head timestamptz, opened boolean, deactivated boolean,
               throttled_until timestamptz, effective_concurrency integer, lowered boolean,
               ordering_busy text[])
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    c_id bigint[]; c_partition integer[]; c_namespace text[]; c_name text[]; c_state text[];
    c_paused_until timestamptz[]; c_failures integer[]; c_deliverable boolean[];
    c_retried_head timestamptz[]; c_opened boolean[]; c_deactivated boolean[];
    c_throttled_until timestamptz[]; c_effective integer[]; c_lowered boolean[];
    a_endpoints bigint[]; a_partitions integer[]; a_keys text[]; a_dues timestamptz[];
BEGIN
    IF coalesce(cardinality(ordered_endpoints), 0) = 0 THEN
        RETURN QUERY
        SELECT c.*, NULL::text[]
        FROM hooklane_complete_v5(ids, fences, outcomes, retry_ins, statuses, errors, failures, started_ats,
                                  durations, retry_afters, trace_ids, worker, threshold, step_seconds,
                                  cap_seconds, owned, delivered_step, adapt_step) c;
        RETURN;
    END IF;
    SELECT array_agg(c.id), array_agg(c.partition), array_agg(c.namespace), array_agg(c.name),
           array_agg(c.state), array_agg(c.paused_until), array_agg(c.consecutive_failures),
           array_agg(c.deliverable), array_agg(c.retried_head), array_agg(c.opened),
           array_agg(c.deactivated), array_agg(c.throttled_until), array_agg(c.effective_concurrency),
           array_agg(c.lowered)
    INTO c_id, c_partition, c_namespace, c_name, c_state, c_paused_until, c_failures, c_deliverable,
         c_retried_head, c_opened, c_deactivated, c_throttled_until, c_effective, c_lowered
    FROM hooklane_complete_v5(ids, fences, outcomes, retry_ins, statuses, errors, failures, started_ats,
                              durations, retry_afters, trace_ids, worker, threshold, step_seconds,
                              cap_seconds, owned, delivered_step, adapt_step) c;
    SELECT array_agg(a.endpoint_id), array_agg(a.partition), array_agg(a.key), array_agg(a.due)
    INTO a_endpoints, a_partitions, a_keys, a_dues
    FROM hooklane_ordering_advance_v1(ordered_endpoints, ordered_keys, owned) a;
    PERFORM hooklane_wake_v2(array_agg(a.e), array_agg(a.p), array_agg(a.due))
    FROM unnest(a_endpoints, a_partitions, a_dues) AS a(e, p, due)
    WHERE a.due IS NOT NULL AND a.p = ANY(owned) AND NOT a.e = ANY(coalesce(c_id, '{}'))
    HAVING count(*) > 0;
    RETURN QUERY
    SELECT r.id, r.partition, r.namespace, r.name, r.state, r.paused_until, r.consecutive_failures,
           r.deliverable, least(r.retried_head, p.due), r.opened, r.deactivated, r.throttled_until,
           r.effective_concurrency, r.lowered, b.keys
    FROM unnest(c_id, c_partition, c_namespace, c_name, c_state, c_paused_until, c_failures, c_deliverable,
                c_retried_head, c_opened, c_deactivated, c_throttled_until, c_effective, c_lowered)
         AS r(id, partition, namespace, name, state, paused_until, consecutive_failures, deliverable,
              retried_head, opened, deactivated, throttled_until, effective_concurrency, lowered)
    LEFT JOIN (SELECT a.e, min(a.due) AS due FROM unnest(a_endpoints, a_dues) AS a(e, due)
               WHERE a.due IS NOT NULL GROUP BY a.e) p ON p.e = r.id
    LEFT JOIN (SELECT a.e, array_agg(a.k ORDER BY a.k) AS keys FROM unnest(a_endpoints, a_keys, a_dues) AS a(e, k, due)
               WHERE a.due IS NULL GROUP BY a.e) b ON b.e = r.id;
END;
$$;

-- The keys of the owned partitions whose head settled without its key
-- moving on (a worker that died between the two, a key a publisher held
-- when its head was recorded, a head discarded by an endpoint's change),
-- up to `max_keys` of them, moved on as hooklane_ordering_advance_v1 does.
-- Index: endpoints_partition; ordering_keys_outstanding_keys per
-- endpoint; deliveries_ordering for each head.
CREATE FUNCTION hooklane_ordering_sweep_v1(owned integer[], max_keys integer)
RETURNS TABLE (endpoint_id bigint, partition integer, key text, due timestamptz)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    s_endpoints bigint[];
    s_keys text[];
BEGIN
    SELECT array_agg(s.endpoint_id), array_agg(s.key) INTO s_endpoints, s_keys
    FROM (
        SELECT k.endpoint_id, k.key
        FROM endpoints ep
        JOIN ordering_keys k ON k.endpoint_id = ep.id AND k.head_seq IS NOT NULL
        LEFT JOIN deliveries h ON h.endpoint_id = k.endpoint_id AND h.ordering_key = k.key
                              AND h.ordering_seq = k.head_seq
        WHERE ep.partition = ANY(owned)
          AND (h.state IS NULL OR h.state IN ('delivered', 'discarded')
               OR (h.state = 'dead' AND (ep.ordering_on_dead = 'skip' OR k.held_since IS NULL))
               OR (h.state IN ('pending', 'sending') AND k.held_since IS NOT NULL))
        LIMIT max_keys
    ) s;
    IF s_endpoints IS NOT NULL THEN
        RETURN QUERY SELECT * FROM hooklane_ordering_advance_v1(s_endpoints, s_keys, owned);
    END IF;
END;
$$;

-- The outstanding keys of the owned partitions after (after_endpoint,
-- after_key) in (endpoint, key) order, `page` of them at most (NULLs:
-- from the first), those among them whose head settled without the key
-- moving on moved on as hooklane_ordering_advance_v1 does: the same keys
-- as hooklane_ordering_sweep_v1 finds. next_endpoint and next_key: the
-- page's last key, where the next call goes on from; NULL once the walk
-- reached the end, so the next call starts over. Returns the deliveries
-- made due (woken_*: each one's endpoint, partition, key and due time);
-- a key a publisher holds stays as it is until the walk comes back to it.
-- Index: ordering_keys_outstanding_keys from the cursor on; primary key
-- of endpoints (the partition) and deliveries_ordering (the head), per key.
CREATE FUNCTION hooklane_ordering_sweep_v2(owned integer[], after_endpoint bigint, after_key text, page integer,
                                           OUT next_endpoint bigint, OUT next_key text,
                                           OUT woken_endpoints bigint[], OUT woken_partitions integer[],
                                           OUT woken_keys text[], OUT woken_dues timestamptz[])
LANGUAGE plpgsql
AS $$
DECLARE
    walked integer;
    s_endpoints bigint[];
    s_keys text[];
BEGIN
    -- Keys are 1 to 255 printable characters, so every key sorts after ''
    -- and every endpoint id (a bigserial) after -1.
    WITH page_keys AS MATERIALIZED (
        SELECT k.endpoint_id, k.key, k.head_seq, k.held_since, ep.ordering_on_dead
        FROM ordering_keys k
        JOIN endpoints ep ON ep.id = k.endpoint_id
        WHERE k.head_seq IS NOT NULL AND ep.partition = ANY(owned)
          AND (k.endpoint_id, k.key) > (coalesce(after_endpoint, -1), coalesce(after_key, ''))
        ORDER BY k.endpoint_id, k.key
        LIMIT page
    )
    SELECT count(*),
           (array_agg(w.endpoint_id ORDER BY w.endpoint_id DESC, w.key DESC))[1],
           (array_agg(w.key ORDER BY w.endpoint_id DESC, w.key DESC))[1],
           array_agg(w.endpoint_id) FILTER (WHERE s.stale),
           array_agg(w.key) FILTER (WHERE s.stale)
    INTO walked, next_endpoint, next_key, s_endpoints, s_keys
    FROM page_keys w
    LEFT JOIN deliveries h ON h.endpoint_id = w.endpoint_id AND h.ordering_key = w.key
                          AND h.ordering_seq = w.head_seq
    CROSS JOIN LATERAL (
        SELECT h.state IS NULL OR h.state IN ('delivered', 'discarded')
               OR (h.state = 'dead' AND (w.ordering_on_dead = 'skip' OR w.held_since IS NULL))
               OR (h.state IN ('pending', 'sending') AND w.held_since IS NOT NULL) AS stale
    ) s;
    IF walked < page THEN
        next_endpoint := NULL;
        next_key := NULL;
    END IF;
    IF s_endpoints IS NOT NULL THEN
        SELECT array_agg(a.endpoint_id), array_agg(a.partition), array_agg(a.key), array_agg(a.due)
        INTO woken_endpoints, woken_partitions, woken_keys, woken_dues
        FROM hooklane_ordering_advance_v1(s_endpoints, s_keys, owned) a
        WHERE a.due IS NOT NULL;
    END IF;
END;
$$;

-- Queue again, behind their keys, the given pending deliveries of
-- ordered events (resent, or queued again by a replay): the head of its
-- key, resent, is due at once and its key no longer held; any other gets
-- the key's next number, in id order, and waits behind the key's
-- outstanding deliveries, or is due at once, as the key's head, if none
-- is. So a delivery skipped or replayed reaches the receiver with a number
-- above every one it already got. Waits for the keys' rows (an admin
-- action, not the worker's loop). Returns the deliveries made due, with
-- their endpoints and partitions, to be woken.
-- Index: primary keys of deliveries and ordering_keys; deliveries_ordering
-- (the unique numbers).
CREATE FUNCTION hooklane_ordering_requeue_v1(ids bigint[])
RETURNS TABLE (endpoint_id bigint, partition integer, due timestamptz)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
BEGIN
    INSERT INTO ordering_keys AS k (endpoint_id, key, last_seq)
    SELECT DISTINCT d.endpoint_id, d.ordering_key, 0
    FROM deliveries d
    WHERE d.id = ANY(ids) AND d.ordering_key IS NOT NULL
    ORDER BY 1, 2
    ON CONFLICT (endpoint_id, key) DO NOTHING;
    PERFORM
    FROM ordering_keys k
    WHERE (k.endpoint_id, k.key) IN (SELECT d.endpoint_id, d.ordering_key FROM deliveries d
                                     WHERE d.id = ANY(ids) AND d.ordering_key IS NOT NULL)
    ORDER BY k.endpoint_id, k.key
    FOR UPDATE OF k;
    RETURN QUERY
    WITH given AS MATERIALIZED (
        SELECT d.id, d.endpoint_id, d.ordering_key AS key, k.head_seq, k.last_seq,
               coalesce(d.ordering_seq = k.head_seq, false) AS is_head
        FROM deliveries d
        JOIN ordering_keys k ON k.endpoint_id = d.endpoint_id AND k.key = d.ordering_key
        WHERE d.id = ANY(ids) AND d.state = 'pending'
    ),
    numbered AS (
        SELECT g.id, g.endpoint_id, g.key,
               g.last_seq + row_number() OVER (PARTITION BY g.endpoint_id, g.key ORDER BY g.id) AS seq
        FROM given g
        WHERE NOT g.is_head
    ),
    placed AS (
        UPDATE deliveries d
        SET ordering_seq = coalesce(n.seq, d.ordering_seq),
            next_attempt_at = CASE WHEN g.is_head OR (g.head_seq IS NULL AND n.seq = g.last_seq + 1)
                                   THEN now() ELSE 'infinity' END
        FROM given g
        LEFT JOIN numbered n ON n.id = g.id
        WHERE d.id = g.id
        RETURNING d.endpoint_id, d.next_attempt_at
    ),
    -- Runs whether or not it is read, as every data-modifying WITH does.
    keyed AS (
        UPDATE ordering_keys k
        SET last_seq = k.last_seq + c.added,
            head_seq = CASE WHEN c.added > 0 THEN coalesce(k.head_seq, k.last_seq + 1) ELSE k.head_seq END,
            held_since = CASE WHEN c.head_resent THEN NULL ELSE k.held_since END
        FROM (SELECT g.endpoint_id, g.key, count(*) FILTER (WHERE NOT g.is_head) AS added,
                     bool_or(g.is_head) AS head_resent
              FROM given g GROUP BY g.endpoint_id, g.key) c
        WHERE k.endpoint_id = c.endpoint_id AND k.key = c.key
    )
    SELECT p.endpoint_id, ep.partition, p.next_attempt_at
    FROM placed p
    JOIN endpoints ep ON ep.id = p.endpoint_id
    WHERE p.next_attempt_at < 'infinity';
END;
$$;

-- Tenant portal (docs/portal.md): the signed links the admin API hands out
-- and the sessions (or tenant tokens) they open. Only the SHA-256 of a
-- token is kept, so that a read of this table (a backup, a replica, a
-- support query) gives no one a way in.
CREATE TABLE portal_grants (
    digest     bytea PRIMARY KEY CHECK (octet_length(digest) = 32),
    -- a link is good for one redemption; a session for requests until it expires
    kind       text NOT NULL CHECK (kind IN ('link', 'session')),
    tenant     text NOT NULL,
    access     text NOT NULL CHECK (access IN ('read', 'resend', 'manage')),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
-- create_portal_grant: the expired grants it purges, oldest first.
CREATE INDEX portal_grants_expiry ON portal_grants (expires_at);

-- ---------------------------------------------------------------------------
-- Operational notifications (migration 0014; docs/operations.md,
-- "Operational notifications"): an endpoint's circuit opening, its
-- deactivation and its dead deliveries, published as events to the
-- notifications tenant by the worker holding partition 0.

-- What that worker noticed of each endpoint, per kind of notice, and when
-- it last told: each transition is told once, each kind at most once per
-- HOOKLANE_NOTIFICATION_INTERVAL_SECONDS per endpoint, and the dead
-- deliveries in between are counted into the next notice. Written by
-- note_notices and take_notices only when something is noticed or told,
-- never per delivery; the primary key is their upsert's and update's, and
-- the cascade's from delete_endpoint.
CREATE TABLE endpoint_notices (
    endpoint_id   bigint NOT NULL REFERENCES endpoints (id) ON DELETE CASCADE,
    kind          text NOT NULL CHECK (kind IN ('paused', 'deactivated', 'deliveries_dead')),
    -- The last transition noticed, which a notice names: the failing
    -- episode whose circuit opened (the endpoint's failing_since), or the
    -- deactivation (its deactivated_at). NULL for dead deliveries.
    seen          timestamptz,
    -- Openings or deactivations noticed since the last notice.
    transitions   integer NOT NULL DEFAULT 0,
    -- Dead deliveries: counted up to here; the next notice counts the
    -- dead attempts recorded after it.
    counted_until timestamptz,
    notified_at   timestamptz,
    -- When the next notice goes (the last one's time plus the interval at
    -- the soonest); NULL: nothing to tell.
    due_at        timestamptz,
    PRIMARY KEY (endpoint_id, kind)
);

-- take_notices: the notices due, soonest first.
CREATE INDEX endpoint_notices_due ON endpoint_notices (due_at) WHERE due_at IS NOT NULL;

-- note_notices: circuits that opened or paused again since the last pass
-- (every opening sets paused_until ahead of its own time). A change of
-- paused_until is no longer a HOT update: once per opening or failed probe.
CREATE INDEX endpoints_paused_until ON endpoints (paused_until) WHERE paused_until IS NOT NULL;
-- note_notices: endpoints deactivated since the last pass.
CREATE INDEX endpoints_deactivated_at ON endpoints (deactivated_at) WHERE state = 'deactivated';

-- note_notices: the dead attempts recorded since the last pass, and whose
-- (an index-only scan of the partitions of that range).
CREATE INDEX delivery_attempts_dead ON delivery_attempts (recorded_at) INCLUDE (endpoint_id)
    WHERE outcome = 'dead';
-- take_notices: one endpoint's dead attempts since its last notice.
CREATE INDEX delivery_attempts_endpoint_dead ON delivery_attempts (endpoint_id, recorded_at)
    WHERE outcome = 'dead';

-- ---------------------------------------------------------------------------
-- Queue summaries (migration 0017): the endpoint listings' pending counts as
-- the workers' gauge passes counted them (queries.sql: endpoint_page,
-- endpoint_totals, write_queue_summaries).

-- One row per partition, written by the worker owning it at each gauge
-- pass (a few rows a second for the whole install, never per delivery):
-- each endpoint of the partition with its pending deliveries and the
-- creation of the oldest, as the pass counted them.
CREATE TABLE queue_summaries (
    partition         integer PRIMARY KEY,
    -- The database's clock when the pass counted.
    counted_at        timestamptz NOT NULL,
    -- Until when a listing may show these counts: a few gauge periods of
    -- the worker that wrote them, after which (its worker gone) the
    -- listings count the queues themselves again.
    fresh_until       timestamptz NOT NULL,
    endpoint_ids      bigint[] NOT NULL,
    pending           bigint[] NOT NULL,
    oldest_pending_at timestamptz[] NOT NULL,
    CHECK (cardinality(endpoint_ids) = cardinality(pending)
           AND cardinality(endpoint_ids) = cardinality(oldest_pending_at))
);

-- The counts of the fresh summaries, a row per endpoint they hold.
CREATE FUNCTION hooklane_queue_counts()
RETURNS TABLE (endpoint_id bigint, pending bigint, oldest_pending_at timestamptz,
               counted_at timestamptz)
LANGUAGE sql
STABLE
AS $$
    SELECT u.endpoint_id, u.pending, u.oldest_pending_at, s.counted_at
    FROM queue_summaries s
    CROSS JOIN LATERAL unnest(s.endpoint_ids, s.pending, s.oldest_pending_at)
                       AS u(endpoint_id, pending, oldest_pending_at)
    WHERE s.fresh_until > now()
$$;

-- ---------------------------------------------------------------------------
-- The event catalogue (migration 0023, docs/catalogue.md): the platform's
-- event types, a JSON Schema per version, and how publishes are checked.

-- One row per event type of the catalogue, by its name (the pattern of
-- an event's type). Cluster-wide, as the resource is: a type means the same
-- thing for every tenant.
CREATE TABLE catalogue_types (
    name             text PRIMARY KEY
                     CHECK (length(name) BETWEEN 1 AND 255
                            AND name ~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$'),
    description      text NOT NULL DEFAULT '' CHECK (length(description) <= 4096),
    type_group       text CHECK (length(type_group) BETWEEN 1 AND 255),
    -- Deprecated from that day on: still accepted, and counted.
    deprecated_since date,
    -- Archived: refused at publish whatever the mode, kept to be shown.
    archived         boolean NOT NULL DEFAULT false,
    -- Who wrote it: 'kubernetes' (the operator, from a WebhookEventType)
    -- or 'local' (the CLI); neither overwrites or deletes the other's.
    source           text NOT NULL CHECK (source IN ('kubernetes', 'local')),
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- One JSON Schema (draft 2020-12) per version of a type, numbered from 1;
-- the highest is the latest. The schema is stored bundled: every $ref it
-- had outside itself was resolved when it was applied, so that a publish
-- never fetches anything. The example validates against it (checked at
-- apply).
CREATE TABLE catalogue_versions (
    type     text NOT NULL REFERENCES catalogue_types (name) ON DELETE CASCADE,
    version  integer NOT NULL CHECK (version BETWEEN 1 AND 1000),
    schema   jsonb NOT NULL CHECK (jsonb_typeof(schema) IN ('object', 'boolean')),
    example  jsonb NOT NULL CHECK (jsonb_typeof(example) = 'object'),
    -- md5 of the schema's text: the publish check's cache key for the
    -- compiled validator, so that an applied change is never missed.
    digest   text NOT NULL,
    PRIMARY KEY (type, version)
);

-- How published events are checked against the catalogue, per tenant;
-- the row of tenant '' (which no tenant is: a tenant has 1 to 253
-- characters) holds the mode of every tenant without a row of its own.
-- No row at all: 'off'.
CREATE TABLE catalogue_modes (
    tenant text PRIMARY KEY CHECK (length(tenant) <= 253),
    mode   text NOT NULL CHECK (mode IN ('off', 'warn', 'enforce'))
);

-- The publishes the check refused, one row each, written in the
-- publisher's transaction (so a refusal its transaction rolled back leaves
-- none, as nothing else of it does) and purged with the events.
CREATE TABLE catalogue_refusals (
    refused_at timestamptz NOT NULL DEFAULT now(),
    tenant     text NOT NULL,
    type       text NOT NULL,
    -- 'unknown', 'archived' or 'schema'
    reason     text NOT NULL CHECK (reason IN ('unknown', 'archived', 'schema')),
    message    text NOT NULL
);
-- purge_catalogue_refusals: past retention, oldest first; event_type_counts:
-- the last day's
CREATE INDEX catalogue_refusals_refused_at ON catalogue_refusals (refused_at);
