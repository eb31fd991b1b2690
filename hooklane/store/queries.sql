-- Every statement Hooklane runs against its own tables, one named block each.
-- A block starts with "-- name: NAME", then lines saying what it does, its
-- parameters and the index it relies on. hooklane/store/queries.py loads
-- this file once; Python code calls the statements by name only, and passes
-- their parameters by name only.
--
-- A parameter is written %(name)s, as procrastinate writes them, and may
-- be used more than once; a cast follows it (%(ids)s::bigint[]). A literal
-- percent sign is written %%, as in the modulo operator (%%) and format()'s
-- %%s. The loader turns the names into asyncpg's $1..$n, which this file
-- never writes itself.
--
-- The rules that make an endpoint ready are SQL functions: hooklane_wake_v2
-- (migration 0009: tell the partition's owner that endpoints may have work)
-- and hooklane_deliverable (migration 0004). A statement calls the first in
-- a CTE that its final SELECT joins (`FROM x, woken`): a CTE without an
-- INSERT, UPDATE or DELETE of its own runs only if read.

-- name: migration_lock
-- Wait for the lock that serialises `hooklane migrate` runs (an init
-- container or a Helm hook per release may run several at once), held by
-- this session until migration_unlock.
-- Parameters: key, the lock's. Index: none (advisory).
SELECT pg_advisory_lock(%(key)s);

-- name: migration_unlock
-- Release the migration lock. Parameters: key, the lock's. Index: none.
SELECT pg_advisory_unlock(%(key)s);

-- name: create_migration_table
-- The migrations applied so far, one row each; created by the first run.
-- Parameters: none. Index: its primary key.
CREATE TABLE IF NOT EXISTS hooklane_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: applied_migrations
-- The versions applied. Parameters: none. Index: primary key.
SELECT version FROM hooklane_migrations;

-- name: record_migration
-- Note a migration as applied, in the transaction that applied it.
-- Parameters: version, name. Index: primary key.
INSERT INTO hooklane_migrations (version, name) VALUES (%(version)s, %(name)s);

-- name: partition_count
-- The partition count every worker and the operator share.
-- Parameters: none. Index: primary key of the one-row hooklane_config.
SELECT partition_count FROM hooklane_config;

-- name: lock_endpoint_secret
-- The stored signing secret of an endpoint, its row locked until the upsert
-- that follows in the same transaction, so that two concurrent updates
-- cannot both take the same secret for the previous one. NO KEY: a publish
-- holds a key-share lock on the endpoints it queued for until its
-- application's transaction ends, and must not hold this up.
-- Parameters: namespace, name. Index: the unique (namespace, name)
-- constraint.
SELECT secret FROM endpoints WHERE namespace = %(namespace)s AND name = %(name)s FOR NO KEY UPDATE;

-- name: upsert_endpoint
-- Create or update an endpoint by its (namespace, name) identity. The
-- partition is a stable hash of that identity, computed once at creation.
-- A deactivated endpoint stays deactivated: reactivate_endpoint is explicit.
-- An updated endpoint is woken: the change (unpaused, a secret at last, a
-- higher limit) may make its kept deliveries reservable, and the owner hears
-- of it at commit, so the worker judges the new row. A new endpoint has
-- nothing to wake for: creating thousands of them must not wake a worker
-- thousands of times.
-- An endpoint that moves to another tenant must never send the old tenant's
-- events to whoever now owns the receiver: its pending and dead deliveries
-- of any other tenant are discarded, with the reason
-- (hooklane_tenant_discard). (Those still in an open publish, or in flight,
-- are discarded by reservation and by complete.)
-- Runs after lock_endpoint_secret in the same transaction, so `before` is
-- the row as it is now.
-- Parameters: namespace, name, tenant, url, secret (as stored; NULL when
-- the Secret is missing), max_concurrency, event_types, timeout_seconds,
-- paused, replaced_secret (the secret being replaced, as stored; NULL when
-- the secret did not change: the previous one is kept as it was),
-- grace_seconds (how long the replaced secret still signs); the delivery
-- terms: rate_per_second (NULL: none), rate_burst, adaptive_concurrency,
-- max_attempts and max_age_seconds (NULL: the settings'), request_terms
-- (sealed; NULL: none). Turning adaptive concurrency off forgets its state.
-- Index: the unique (namespace, name) constraint; deliveries_queue and
-- deliveries_dead for the discard.
WITH before AS (
    SELECT id, tenant FROM endpoints WHERE namespace = %(namespace)s AND name = %(name)s
),
upserted AS (
INSERT INTO endpoints (namespace, name, tenant, url, secret, max_concurrency,
                       event_types, timeout_seconds, paused, partition, rate_per_second, rate_burst,
                       adaptive_concurrency, max_attempts, max_age_seconds, request_terms)
VALUES (%(namespace)s, %(name)s, %(tenant)s, %(url)s, %(secret)s, %(max_concurrency)s,
        %(event_types)s, %(timeout_seconds)s, %(paused)s,
        (hashtext(%(namespace)s || '/' || %(name)s)::bigint & 2147483647)
          %% (SELECT partition_count FROM hooklane_config),
        %(rate_per_second)s, %(rate_burst)s, %(adaptive_concurrency)s, %(max_attempts)s,
        %(max_age_seconds)s, %(request_terms)s)
ON CONFLICT (namespace, name) DO UPDATE
SET tenant          = EXCLUDED.tenant,
    url             = EXCLUDED.url,
    secret          = EXCLUDED.secret,
    previous_secret = coalesce(%(replaced_secret)s::text, endpoints.previous_secret),
    previous_secret_until = CASE WHEN %(replaced_secret)s::text IS NULL THEN endpoints.previous_secret_until
                                 ELSE now() + make_interval(secs => %(grace_seconds)s::float8) END,
    max_concurrency = EXCLUDED.max_concurrency,
    event_types     = EXCLUDED.event_types,
    timeout_seconds = EXCLUDED.timeout_seconds,
    paused          = EXCLUDED.paused,
    rate_per_second = EXCLUDED.rate_per_second,
    rate_burst      = EXCLUDED.rate_burst,
    adaptive_concurrency = EXCLUDED.adaptive_concurrency,
    effective_concurrency = CASE WHEN EXCLUDED.adaptive_concurrency THEN endpoints.effective_concurrency END,
    concurrency_raised_at = CASE WHEN EXCLUDED.adaptive_concurrency THEN endpoints.concurrency_raised_at END,
    concurrency_lowered_at = CASE WHEN EXCLUDED.adaptive_concurrency THEN endpoints.concurrency_lowered_at END,
    throttled_until = CASE WHEN EXCLUDED.adaptive_concurrency THEN endpoints.throttled_until END,
    max_attempts    = EXCLUDED.max_attempts,
    max_age_seconds = EXCLUDED.max_age_seconds,
    request_terms   = EXCLUDED.request_terms,
    updated_at      = now()
RETURNING id, partition, tenant, (xmax = 0) AS created
),
discarded AS (
    UPDATE deliveries d
    SET state = 'discarded',
        last_error = hooklane_tenant_discard(d.event_tenant, u.tenant)
    FROM upserted u, before b
    WHERE b.id = u.id
      AND b.tenant <> u.tenant
      AND d.endpoint_id = u.id
      AND d.state IN ('pending', 'dead')
      AND hooklane_tenant_discard(d.event_tenant, u.tenant) IS NOT NULL
    RETURNING d.id
),
woken AS (
    SELECT hooklane_wake_v2(array_agg(u.id), array_agg(u.partition), array_agg(NULL::timestamptz))
    FROM upserted u WHERE NOT u.created
)
SELECT u.id, u.partition, u.created,
       (SELECT b.tenant FROM before b WHERE b.tenant <> u.tenant) AS previous_tenant,
       (SELECT count(*) FROM discarded) AS discarded
FROM upserted u, woken;

-- name: secrets_to_reseal
-- Endpoints with a secret or request terms not sealed with the active key:
-- plaintext from before a key was set, or sealed with a key being retired;
-- and previous secrets past their overlap, which are dropped. A batch after
-- a given id.
-- Parameters: sealed_prefix (the prefix of a value sealed with the active
-- key, 'enc:v1:<key id>:'), after_id (the last id of the previous batch, 0
-- first), batch_size.
-- Index: primary key of endpoints, walked in order (the filter is checked
-- on every row: a full pass, run by `hooklane migrate` only).
SELECT id, namespace, name, secret, previous_secret,
       previous_secret_until > now() AS previous_valid, request_terms
FROM endpoints
WHERE id > %(after_id)s
  AND (NOT starts_with(secret, %(sealed_prefix)s)
       OR NOT starts_with(previous_secret, %(sealed_prefix)s)
       OR previous_secret_until <= now()
       OR NOT starts_with(request_terms, %(sealed_prefix)s))
ORDER BY id
LIMIT %(batch_size)s;

-- name: reseal_secrets
-- Store re-sealed secrets, each only if the row still holds what was read
-- (an upsert meanwhile sealed its own).
-- Parameters, arrays of equal length: ids, read_secrets (as read),
-- secrets (re-sealed), read_previous (previous secrets as read),
-- previous_secrets (re-sealed; NULL: dropped), read_terms (request terms
-- as read), terms (re-sealed).
-- Index: primary key of endpoints.
UPDATE endpoints ep
SET secret = r.secret,
    previous_secret = r.previous_secret,
    previous_secret_until = CASE WHEN r.previous_secret IS NOT NULL THEN ep.previous_secret_until END,
    request_terms = r.terms
FROM unnest(%(ids)s::bigint[], %(read_secrets)s::text[], %(secrets)s::text[],
            %(read_previous)s::text[], %(previous_secrets)s::text[], %(read_terms)s::text[],
            %(terms)s::text[])
     AS r(id, read_secret, secret, read_previous, previous_secret, read_terms, terms)
WHERE ep.id = r.id
  AND ep.secret IS NOT DISTINCT FROM r.read_secret
  AND ep.previous_secret IS NOT DISTINCT FROM r.read_previous
  AND ep.request_terms IS NOT DISTINCT FROM r.read_terms;

-- name: stored_endpoints
-- What Postgres holds of every endpoint's spec and secret, for the
-- operator's start: a resource whose spec and Secret match its row needs no
-- upsert, so a restart writes only what changed while it was down.
-- Parameters: none. Index: none, one sequential read of the table (10,000
-- endpoints are ~2 MB of rows), cheaper than one probe per resource.
SELECT namespace, name, tenant, url, secret, max_concurrency, event_types,
       timeout_seconds, paused, rate_per_second, rate_burst, adaptive_concurrency, max_attempts,
       max_age_seconds, request_terms
FROM endpoints;

-- name: reactivate_endpoint
-- Bring a deactivated endpoint back and close its circuit; its kept pending
-- deliveries are sent again from the next reservation on. Only a
-- deactivated one: the circuit of an active endpoint is the worker's, and
-- stays as it is. One row: whether the endpoint exists, and whether it was
-- reactivated (false for one in another state).
-- Parameters: namespace, name. Index: unique (namespace, name).
WITH reactivated AS (
    UPDATE endpoints
    SET state = 'active', deactivated_at = NULL, deactivated_reason = NULL,
        consecutive_failures = 0, failing_since = NULL, paused_until = NULL,
        updated_at = now()
    WHERE namespace = %(namespace)s AND name = %(name)s AND state = 'deactivated'
    RETURNING id, partition
),
woken AS (
    SELECT hooklane_wake_v2(array_agg(id), array_agg(partition), array_agg(NULL::timestamptz))
    FROM reactivated
)
SELECT EXISTS (SELECT FROM endpoints WHERE namespace = %(namespace)s AND name = %(name)s) AS found,
       EXISTS (SELECT FROM reactivated) AS reactivated
FROM woken;

-- name: delete_endpoint
-- Remove an endpoint. Its deliveries, pending and dead alike, go with it (the
-- foreign key cascades); the events stay, listable for reconciliation until
-- retention drops them.
-- The worker owning it drops it from its ready list at its next visit.
-- Parameters: namespace, name. Index: unique (namespace, name);
-- deliveries_endpoint for the cascade.
DELETE FROM endpoints
WHERE namespace = %(namespace)s AND name = %(name)s
RETURNING id;

-- name: publish
-- The outbox write: hooklane_try_publish_v1 (migration 0012), which every
-- caller in every language calls, holds its rules and its statement. It
-- refuses in its result rather than raising, so a refusal leaves the
-- caller's transaction usable.
-- Parameters: id (NULL: one is made), tenant, type, data (jsonb text),
-- coalesce_key, traceparent (W3C; NULL: none). Every Python caller runs
-- it (hooklane/publish/): CAST rather than ::, which SQLAlchemy's text()
-- would read as part of a parameter's name.
-- Index: the function's (endpoints_tenant; primary key of events;
-- deliveries_coalesce).
SELECT event_id, stored, fanout, error_code, error_field, error_message
FROM hooklane_try_publish_v1(%(tenant)s, %(type)s, CAST(%(data)s AS jsonb), %(id)s, %(coalesce_key)s,
                             %(traceparent)s);

-- name: publish_many
-- Many events published in one statement, as publish publishes one, in
-- the arrays' order: the function runs once per row of the outer unnest (a
-- nested loop over a function scan), and each call sees what the earlier
-- ones stored, so that of two events under one id the first is stored and
-- the second compared with it. Returns the refused events only, by their
-- position (1-based). The ingest API's group commit: one round trip for a
-- whole group.
-- Parameters: ids, tenants, types, data (jsonb text), coalesce_keys,
-- traceparents, arrays of equal length.
-- Index: the function's, per event.
SELECT x.position, p.error_code, p.error_field, p.error_message
FROM unnest(%(ids)s::text[], %(tenants)s::text[], %(types)s::text[], %(data)s::text[],
            %(coalesce_keys)s::text[], %(traceparents)s::text[])
       WITH ORDINALITY AS x(id, tenant, type, data, coalesce_key, traceparent, position)
CROSS JOIN LATERAL hooklane_try_publish_v1(x.tenant, x.type, x.data::jsonb, x.id, x.coalesce_key,
                                           x.traceparent) AS p
WHERE p.error_code IS NOT NULL
ORDER BY x.position;

-- name: pending_endpoints
-- The endpoints of the given partitions that have pending deliveries and
-- are deliverable (hooklane_deliverable), each with its head (the earliest
-- next_attempt_at of its pending deliveries from where it is read): what a
-- worker's ready list starts from when it takes partitions, and what its
-- sweep compares it with now and then, a safety net for deliveries the
-- list was never told of (written by hand, or notified while no worker
-- listened; a publish's are found by the probe, published_since). Each queue is read from `since` (NULL: from its start),
-- but those of the partitions in `whole` from their start: read from the
-- start, a queue walks the dead entries of everything its endpoint sent
-- while a horizon is held, so the sweep reads from its last run on, and
-- only a few partitions from the start at a time. Never per round. One
-- row: the database's time the queues were read at, and the endpoints,
-- partitions and heads, in endpoint order.
-- Parameters: partitions, since, whole (partitions read from the start).
-- Index: endpoints_partition; deliveries_queue, its first live entry per
-- endpoint from where it is read.
SELECT now() AS checked_at,
       coalesce(array_agg(ep.id ORDER BY ep.id), '{}') AS endpoint_ids,
       coalesce(array_agg(ep.partition ORDER BY ep.id), '{}') AS partitions,
       coalesce(array_agg(h.head ORDER BY ep.id), '{}') AS heads
FROM endpoints ep
CROSS JOIN LATERAL (
    SELECT min(d.next_attempt_at) AS head
    FROM deliveries d
    WHERE d.endpoint_id = ep.id
      AND d.state = 'pending'
      AND d.next_attempt_at >= CASE WHEN ep.partition = ANY(%(whole)s::int[]) THEN '-infinity'
                                    ELSE coalesce(%(since)s::timestamptz, '-infinity') END
) h
WHERE ep.partition = ANY(%(partitions)s::int[])
  AND hooklane_deliverable(ep)
  AND h.head IS NOT NULL;

-- name: published_since
-- What was published since a worker's last probe, which tells it what
-- publishes no longer notify (migration 0019): the endpoints with pending
-- deliveries of the events whose transactions committed after `since` (the
-- snapshot the last probe returned), each with its partition and the
-- earliest next_attempt_at of those deliveries, and the statement's own
-- snapshot, for the next probe. A transaction not visible in `since`
-- started after it (its id at or above the snapshot's xmax) or was running
-- then (in its xip list): the two ranges read are exactly those, so that a
-- transaction committing late, after later ones, is found once it commits,
-- and nothing the last probe saw is read again, however long another
-- session holds the horizon back (a transaction running all along is in
-- every xip list: its own uncommitted events are read each time). `events`
-- counts every event found, for the probe's pace. NULL `since`: the
-- snapshot alone (the first probe). Every partition: the worker keeps those
-- it owns when the answer comes, as it may have taken one while the probe
-- ran. One row.
-- Parameters: since (a pg_snapshot as text, or NULL).
-- Index: the function's (events_xact; deliveries_event; primary key of
-- endpoints).
SELECT snapshot, events, endpoint_ids, partitions, dues
FROM hooklane_published_since_v1(%(since)s::text);

-- name: hint_published
-- Tell the workers to probe now (published_since): the API's group commit
-- sends it once per group, from its own transaction, so that what it
-- stored is delivered without waiting for the probe's next turn. Workers
-- of earlier versions ignore the payload, which names no partition.
-- Parameters: none. Index: none.
SELECT pg_notify('hooklane_ready', 'published');

-- name: rescue_expired
-- Give back to the queue the deliveries whose lease ran out: their worker
-- died or lost its connection mid-call. The lease outlives the whole-call
-- deadline, so the call has certainly ended; the receiver may still have got
-- it (at least once). Reads, per endpoint of the partitions, only the leases
-- that ended from `since` on (NULL: all of them, for partitions just
-- taken): an earlier run of the same owner rescued the rest, and the dead
-- entries a held horizon keeps lie before that. One row: the database's
-- time the leases were judged at, the next run's `since` (with a margin),
-- and the rescued deliveries' endpoints, partitions and due times, for the
-- worker's ready list. Each rescued attempt is recorded in
-- delivery_attempts as a retry of failure class lease_expired, with no
-- duration. Runs only under the partitions' advisory locks.
-- The plan is forced, as the planner's estimates of a partial index that
-- a held horizon fills with dead entries cannot be trusted: the leases are
-- probed per endpoint (OFFSET 0 keeps the probe a parameterised index scan
-- from `since`, not one scan of every lease in the index), and the update
-- finds each row by primary key (its state compared with the probe's, not
-- with a constant, matches no partial index). Left to itself, the planner
-- scanned every entry deliveries_leased ever got: over 100 ms every
-- HOOKLANE_MAINTENANCE_SECONDS on the connection the reservation waits on,
-- ten minutes into a held horizon (docs/benchmarks.md, section 10).
-- Parameters: partitions (owned), since. Index: endpoints_partition;
-- deliveries_leased per endpoint, from `since`; primary key of deliveries.
WITH expired AS MATERIALIZED (
    SELECT f.id, f.state, f.attempts, ep.partition
    FROM endpoints ep
    CROSS JOIN LATERAL (
        SELECT f.id, f.state, f.attempts
        FROM deliveries f
        WHERE f.endpoint_id = ep.id
          AND f.state = 'sending'
          AND f.lease_expires_at < now()
          AND f.lease_expires_at >= coalesce(%(since)s::timestamptz, '-infinity')
        OFFSET 0
    ) f
    WHERE ep.partition = ANY(%(partitions)s::int[])
),
rescued AS (
    UPDATE deliveries d
    SET state = 'pending', next_attempt_at = now(), lease_expires_at = NULL,
        last_status = NULL, last_failure = 'lease_expired',
        last_error = 'lease expired: the worker lost the delivery'
    FROM expired x
    WHERE d.id = x.id
      AND d.state = x.state
      AND d.attempts = x.attempts
    RETURNING d.id, d.endpoint_id, x.partition, d.next_attempt_at, d.attempts, d.event_tenant,
              d.event_id, d.attempted_by, d.reserved_at, d.last_failure, d.last_error
),
-- The attempt whose result never came, so that the history has no gap.
-- Runs whether or not it is read, as every data-modifying WITH does.
logged AS (
    INSERT INTO delivery_attempts (delivery_id, attempt, endpoint_id, event_tenant, event_id,
                                   attempted_by, started_at, outcome, failure, error, next_attempt_at)
    SELECT r.id, r.attempts, r.endpoint_id, r.event_tenant, r.event_id, r.attempted_by,
           coalesce(r.reserved_at, now()), 'retry', r.last_failure, r.last_error, r.next_attempt_at
    FROM rescued r
)
SELECT now() AS checked_at,
       coalesce(array_agg(r.endpoint_id), '{}') AS endpoint_ids,
       coalesce(array_agg(r.partition), '{}') AS partitions,
       coalesce(array_agg(r.next_attempt_at), '{}') AS dues
FROM rescued r;

-- name: reserve
-- Reserve due deliveries of the candidates, the endpoints whose time has
-- come in the worker's ready list, each read from its floor (the earliest
-- next_attempt_at a pending delivery of it may have; NULL: from the
-- start): the steps are in hooklane_reserve_v7 (migration 0020), one round
-- trip. A candidate with a cap gets at most that many (and its free
-- slots); those not apart up to `limit` in all, taken tenant first, then
-- endpoint: every tenant's first before any tenant's second, and within a
-- tenant the first of each endpoint before the second of any. With a
-- tenant ceiling, a tenant's live leases (whichever worker holds them) and
-- what the round grants never exceed it: the round takes an advisory lock
-- per tenant of its candidates first. Runs only under the partitions'
-- advisory locks, and reserves only for endpoints of the owned partitions.
-- A due delivery of another tenant's event than its endpoint's is
-- discarded, never returned. Each reserved delivery records the worker's
-- id in attempted_by.
-- `previous_secret` is the replaced signing secret while it still signs,
-- else NULL. `max_concurrency` is the endpoint's limit in force (its
-- effective concurrency when adaptive). `start_at`: when the call may
-- start, on the server's clock, so that a rate-limited endpoint's starts
-- keep to its rate (now() for the others); `request_terms` (sealed; NULL:
-- none), `max_attempts`, `max_age_seconds` (NULL: the settings') and
-- `rate_per_second` (NULL: none) are the endpoint's own terms.
-- The rows with a NULL id are one verdict per candidate, for the ready
-- list: deliverable, paused_until (when a start may be granted again: the
-- circuit's pause, a Retry-After's hold, the rate limit), head (its
-- earliest pending delivery from the floor on, NULL: none), at_limit (every
-- slot held by a live lease, or its tenant's at the ceiling), leases_end
-- (when the first live lease ends: its tenant's, when only the ceiling
-- holds it), tenant (the endpoint's, while its tenant is at the ceiling;
-- else NULL) and answered_at (the server's clock as it answered, which the
-- worker's wait for `start_at` counts from).
-- Parameters: partitions (owned), candidates, floors, caps and apart
-- (arrays of the same length; caps NULL, or a NULL cap: none; apart NULL:
-- none, true for the worker's slow candidates, served from its budget of
-- long calls), limit (how many not apart at most), lease_grace_seconds (beyond the endpoint's timeout),
-- worker_id, lookahead_seconds (how far ahead a rate-limited endpoint's
-- starts are granted), tenant_ceiling (NULL: none).
-- Index: primary key of endpoints, deliveries_leased,
-- deliveries_tenant_leased, deliveries_rate, deliveries_queue from each
-- floor, primary key of events (see the function), whatever the
-- statistics say: the worker's sessions plan without sequential or bitmap
-- scans (WORKER_SESSION).
SELECT * FROM hooklane_reserve_v7(%(partitions)s::int[], %(candidates)s::bigint[],
                                  %(floors)s::timestamptz[], %(caps)s::int[],
                                  %(apart)s::boolean[], %(limit)s,
                                  %(lease_grace_seconds)s, %(worker_id)s, %(lookahead_seconds)s,
                                  %(tenant_ceiling)s::int);

-- name: complete
-- Record a batch of results in one statement, and fold them into each
-- endpoint's circuit. Each row is fenced by (state, attempts): a late result
-- from a worker whose delivery was rescued and reserved again changes
-- nothing. A success closes the circuit; failures add up, and from the
-- threshold on every failure (re)opens it for step x (failures past the
-- threshold + 1), capped. A 410 deactivates the endpoint. An endpoint's row
-- is written only when one of these, or its last error, changes, or when
-- its last delivery time is `delivered_step_seconds` old or more. A failure
-- of a delivery whose endpoint moved to another tenant while it was in
-- flight is discarded rather than retried or dead: it was reserved under
-- the old tenant, and must never be sent or resent under the new one.
-- Returns each touched endpoint as it is after: its circuit, whether it is
-- deliverable, `retried_head` (the earliest retry this batch queued for it,
-- for the worker's ready list), `opened` (this call opened its circuit: its
-- failures were below the threshold before and are at or past it now,
-- however many this batch added) and `deactivated` (this call deactivated
-- it): what the worker logs. Retries of endpoints outside `partitions` (the
-- recording worker's) are notified to their owner.
-- Each result that passes the fence also leaves its attempt in
-- delivery_attempts (migration 0010); one that does not leaves none.
-- Parameters: ids, attempts (the fence), outcomes ('delivered', 'retry',
-- 'dead'), retry_ins (delays in seconds), statuses (HTTP; NULL when no
-- response), errors, failures (the class when no response), started_ats,
-- durations (seconds), retry_afters (the Retry-After honoured, seconds),
-- trace_ids, arrays of equal length; worker_id (the recording worker);
-- threshold (failures that open the circuit), step_seconds and cap_seconds
-- (of the pause); partitions (owned); delivered_step_seconds;
-- adapt_step_seconds (between two raises of an adaptive endpoint's limit, and
-- its hold when overloaded at a limit of 1).
-- Also returns, per endpoint, throttled_until (a Retry-After's hold),
-- effective_concurrency (the limit in force) and lowered (this call lowered
-- it).
-- The steps are in hooklane_complete_v5 (migration 0011), one round trip, with
-- a plan kept per session that looks each result's row up by primary key.
-- Index: primary keys of deliveries and endpoints (see the function); the
-- attempts are appended to today's partition.
SELECT id, partition, namespace, name, state, paused_until, consecutive_failures, deliverable,
       retried_head, opened, deactivated, throttled_until, effective_concurrency, lowered
FROM hooklane_complete_v5(%(ids)s::bigint[], %(attempts)s::int[], %(outcomes)s::text[],
                          %(retry_ins)s::float8[], %(statuses)s::int[], %(errors)s::text[],
                          %(failures)s::text[], %(started_ats)s::timestamptz[],
                          %(durations)s::float8[], %(retry_afters)s::float8[],
                          %(trace_ids)s::text[], %(worker_id)s,
                          %(threshold)s, %(step_seconds)s, %(cap_seconds)s,
                          %(partitions)s::int[], %(delivered_step_seconds)s,
                          %(adapt_step_seconds)s);

-- name: deactivate_failing
-- Deactivate endpoints that have failed without a success for too long. Their
-- pending deliveries are kept until resent or discarded.
-- Parameters: after_seconds (of failing). Index: endpoints_failing_since.
UPDATE endpoints
SET state = 'deactivated',
    deactivated_at = now(),
    deactivated_reason = 'failing since ' || failing_since::text,
    updated_at = now()
WHERE state = 'active'
  AND failing_since < now() - make_interval(secs => %(after_seconds)s)
RETURNING id, namespace, name, tenant, url;

-- name: endpoint_statistics
-- How many rows of `endpoints` were inserted, updated or deleted since it
-- was last analysed (by autovacuum or by analyze_endpoints), how many rows
-- the planner believes it holds (0 until it was first analysed or
-- vacuumed), and whether this session's role may analyse it (owns it; a
-- role that does not would only get a warning from ANALYZE, every time).
-- The counts come from the statistics system, which sees another
-- session's changes a second or so after its transaction ends.
-- Parameters: none. Index: none (the statistics views).
SELECT coalesce(s.n_mod_since_analyze, 0) AS changed, greatest(c.reltuples, 0)::float8 AS rows,
       pg_has_role(c.relowner, 'MEMBER') AS may_analyze
FROM pg_class c
LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = 'endpoints'::regclass;

-- name: xmin_horizon
-- The oldest of what holds back this database's xmin horizon, by xid age:
-- VACUUM keeps every row deleted or updated after it (a dead row) until it
-- lets go. One row always: `visible`, whether this role sees every
-- session's transaction (pg_read_all_stats, or pg_monitor, or a
-- superuser); then the holder, all NULL when nothing holds the horizon:
-- - `backend`, a session of this database with a transaction id or a
--   snapshot (backend_xid, backend_xmin of pg_stat_activity), this session
--   excepted (its own snapshot, of this statement) and autovacuum's
--   workers too (no role; VACUUM ignores their xmin); walsenders are
--   `standby`. Another role's session shows its pid, role, application
--   and xmin to every role, but its state and transaction start only to
--   one that is `visible`.
-- - `prepared_transaction` of this database (pg_prepared_xacts): `name` is
--   its gid, `usename` its owner.
-- - `replication_slot` holding an xmin (pg_replication_slots): `name` is
--   the slot, `state` active or inactive, `pid` its walsender's. A logical
--   slot's catalog_xmin holds back only the system catalogs, not these.
-- - `standby`, the hot_standby_feedback of a standby streaming without a
--   slot (pg_stat_replication).
-- Slots and standbys hold back every database of the server.
-- `xmin` is the transaction id held (a backend's older of its xid and its
-- snapshot's xmin), `xid_age` how many transactions ago it began,
-- `seconds` how long ago its transaction began where Postgres keeps that
-- (a visible backend's xact_start, a prepared transaction's prepared
-- time); NULL otherwise.
-- Parameters: none. Index: none (statistics and replication views, read
-- from shared memory).
SELECT pg_has_role('pg_read_all_stats', 'MEMBER') AS visible, h.*
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (
    SELECT u.*, age(u.xmin) AS xid_age
    FROM (
        SELECT 'backend' AS kind, a.pid, a.usename::text AS usename, a.application_name, a.state,
               NULL::text AS name,
               CASE WHEN a.backend_xid IS NULL THEN a.backend_xmin
                    WHEN a.backend_xmin IS NULL THEN a.backend_xid
                    WHEN age(a.backend_xid) >= age(a.backend_xmin) THEN a.backend_xid
                    ELSE a.backend_xmin
               END AS xmin,
               extract(epoch FROM now() - a.xact_start)::float8 AS seconds
        FROM pg_stat_activity a
        WHERE a.datname = current_database()
          AND (a.backend_xid IS NOT NULL OR a.backend_xmin IS NOT NULL)
          AND a.pid <> pg_backend_pid()
          AND a.usesysid IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM pg_stat_replication r WHERE r.pid = a.pid)
        UNION ALL
        SELECT 'prepared_transaction', NULL, p.owner::text, NULL, NULL, p.gid, p.transaction,
               extract(epoch FROM now() - p.prepared)::float8
        FROM pg_prepared_xacts p
        WHERE p.database = current_database()
        UNION ALL
        SELECT 'replication_slot', s.active_pid, NULL, NULL,
               CASE WHEN s.active THEN 'active' ELSE 'inactive' END, s.slot_name::text, s.xmin, NULL
        FROM pg_replication_slots s
        WHERE s.xmin IS NOT NULL
        UNION ALL
        SELECT 'standby', r.pid, r.usename::text, r.application_name, r.state, NULL, r.backend_xmin, NULL
        FROM pg_stat_replication r
        WHERE r.backend_xmin IS NOT NULL
    ) AS u
    ORDER BY age(u.xmin) DESC, u.seconds DESC NULLS LAST
    LIMIT 1
) AS h ON true;

-- name: table_statistics
-- Live and dead rows of each of Hooklane's tables, when VACUUM last ran on
-- it by hand and by autovacuum, and how many times autovacuum has since
-- the statistics were last reset. A name resolves as the other statements
-- resolve it (search_path); a table that does not exist has no row, and
-- the application's tables, in the same schema or not, are not read.
-- Counts come from the statistics system: estimates, a second or so
-- behind the transactions that made them.
-- Parameters: tables, the names of Hooklane's tables (store/horizon.py
-- reads them from schema.sql).
-- Index: none (pg_stat_user_tables, by the tables' oids).
SELECT t.name, s.n_live_tup AS live, s.n_dead_tup AS dead, s.last_autovacuum, s.last_vacuum,
       s.autovacuum_count AS autovacuums
FROM unnest(%(tables)s::text[]) AS t(name)
JOIN pg_stat_user_tables s ON s.relid = to_regclass(t.name)
ORDER BY t.name;

-- name: analyze_endpoints
-- Bring the planner's statistics of `endpoints` up to date (a sample of up
-- to 30,000 rows). Takes a lock that only VACUUM, ANALYZE and schema
-- changes of the table conflict with.
-- Parameters: none. Index: none.
ANALYZE endpoints;

-- name: attempt_partitions
-- One step of keeping delivery_attempts' daily partitions: create the
-- first missing one from today to `ahead` days on, or drop the first past
-- retention, or delete what the default partition holds past it
-- (hooklane_attempt_partitions, migration 0010). A row saying what was
-- done, none when nothing was left to do. Run outside a transaction, a
-- step each: the locks a step takes end with it.
-- Parameters: ahead (days), keep_seconds, skip (partitions found busy in
-- this pass). Index: none (the catalog; the default partition is read
-- whole, and is empty unless maintenance stopped).
SELECT action, partition_name, rows_deleted
FROM hooklane_attempt_partitions(%(ahead)s, %(keep_seconds)s, %(skip)s::text[]);

-- name: purge_events
-- Drop events past retention together with their finished deliveries; an
-- event that a pending or dead delivery still needs stays until it is sent
-- or discarded. One batch: the `batch_size` oldest events past retention
-- after the cursor (created_at, tenant, id), each deleted if it is
-- finished; returns how many it looked at and deleted, and where the next
-- batch starts. Batched so that a large purge never holds locks for long,
-- and paged by the cursor so that each batch starts where the last ended,
-- not at the dead index entries the batches before it left.
-- Parameters: retention_seconds, after_at, after_tenant, after_id (the
-- cursor; a time before any event for the first batch), batch_size.
-- Index: events_created_at, walked from the cursor's time; deliveries_event
-- for the check (a probe per event: OFFSET 0 keeps the planner from
-- turning it into an anti-join over a scan of every delivery, which it
-- chose at 10 million rows, once per batch) and the cascade.
WITH candidates AS MATERIALIZED (
    SELECT e.tenant, e.id, e.created_at,
           NOT EXISTS (SELECT 1 FROM deliveries d
                       WHERE d.event_tenant = e.tenant
                         AND d.event_id = e.id
                         AND d.state IN ('pending', 'sending', 'dead')
                       OFFSET 0) AS finished
    FROM events e
    WHERE e.created_at < now() - make_interval(secs => %(retention_seconds)s)
      AND e.created_at >= %(after_at)s
      AND (e.created_at, e.tenant, e.id) > (%(after_at)s, %(after_tenant)s, %(after_id)s)
    ORDER BY e.created_at, e.tenant, e.id
    LIMIT %(batch_size)s
),
deleted AS (
    DELETE FROM events e
    USING candidates c
    WHERE c.finished AND e.tenant = c.tenant AND e.id = c.id
    RETURNING 1
),
last AS (
    SELECT c.created_at, c.tenant, c.id FROM candidates c
    ORDER BY c.created_at DESC, c.tenant DESC, c.id DESC
    LIMIT 1
)
SELECT (SELECT count(*) FROM candidates) AS scanned,
       (SELECT count(*) FROM deleted) AS deleted,
       last.created_at AS next_at, last.tenant AS next_tenant, last.id AS next_id
FROM (SELECT 1) one LEFT JOIN last ON true;

-- name: resend_dead
-- Explicit resend of dead deliveries of one endpoint (all of them, or the
-- given ids): they start a new life, attempts and age from zero. Their age
-- is created_at, which the workers and the reservation functions read, so
-- it starts anew; the first creation, which people are shown, is kept in
-- first_created_at (by the first resend: a later one finds it there). One
-- page at a time: the endpoint's dead deliveries after a delivery id, in id
-- order, at most page_size of them, so that however many are dead no
-- statement holds more than a page (store.resend_dead runs the pages, each
-- committing on its own). One row, how many were resent, how many dead ones
-- the page held and its last id, if the endpoint exists (with that tenant,
-- when one is given); none if it does not, which stops the resend. Not
-- locked: deliveries a page resends as the endpoint moves to another
-- tenant keep the old tenant, and the workers discard them
-- (hooklane_tenant_discard), as a lock would have them wait on each
-- reservation round instead. Only the endpoint's own tenant's: a worker of
-- version 2 (rolling upgrade) records a failure after a tenant change as
-- dead, not discarded.
-- Parameters: namespace, name, tenant (NULL: whoever's), ids (of
-- deliveries; NULL for all), after (the last delivery id of the previous
-- page, 0 for the first), page_size.
-- Index: the unique (namespace, name) constraint; deliveries_dead, walked
-- in order from the position.
WITH endpoint AS (
    SELECT id, partition, tenant FROM endpoints
    WHERE namespace = %(namespace)s AND name = %(name)s
      AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
),
page AS (
    SELECT d.id
    FROM deliveries d, endpoint ep
    WHERE d.endpoint_id = ep.id
      AND d.state = 'dead'
      AND d.id > %(after)s
      AND (%(ids)s::bigint[] IS NULL OR d.id = ANY(%(ids)s::bigint[]))
    ORDER BY d.id
    LIMIT %(page_size)s
),
resent AS (
    UPDATE deliveries d
    SET state = 'pending', attempts = 0, next_attempt_at = now(),
        first_created_at = coalesce(d.first_created_at, d.created_at), created_at = now(),
        last_error = NULL, last_status = NULL, last_failure = NULL
    FROM page p, endpoint ep
    WHERE d.id = p.id
      AND d.state = 'dead'
      AND d.event_tenant = ep.tenant
    RETURNING d.id, ep.id AS endpoint_id, ep.partition
),
woken AS (
    SELECT hooklane_wake_v2(array_agg(r.endpoint_id), array_agg(r.partition), array_agg(now()))
    FROM (SELECT DISTINCT endpoint_id, partition FROM resent) r
)
SELECT (SELECT count(*) FROM resent) AS done,
       (SELECT count(*) FROM page) AS scanned,
       (SELECT max(p.id) FROM page p) AS last
FROM endpoint, woken;

-- name: list_events
-- A page of one tenant's events created in a time range, for receivers'
-- reconciliation, in the order of the transactions that stored them
-- (xact, id), after the cursor's position. Only events of transactions below
-- the oldest one still running (the snapshot's xmin) are returned: every
-- transaction there has ended, so no event can commit later at a position a
-- reader already passed. An event becomes listable once every transaction
-- older than its own has ended.
-- Parameters: tenant, cursor_xact (as text) and cursor_id ('0' and '' for
-- the first page), since (created from), until (created until, or NULL),
-- limit.
-- Index: events_tenant_xact, index-only (the time range is checked on its
-- included created_at); primary key of events for the rows of the page.
WITH page AS (
    SELECT tenant, xact, id
    FROM events
    WHERE tenant = %(tenant)s
      AND (xact, id) > (%(cursor_xact)s::text::xid8, %(cursor_id)s::text)
      AND xact < pg_snapshot_xmin(pg_current_snapshot())
      AND created_at >= %(since)s
      AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s)
    ORDER BY xact, id
    LIMIT %(limit)s
)
SELECT e.id, e.type, e.data::text AS data, e.created_at, e.fanout, e.xact::text AS xact
FROM page p
JOIN events e ON e.tenant = p.tenant AND e.id = p.id
ORDER BY p.xact, p.id;

-- name: endpoint_health
-- Per endpoint: its spec and circuit, queue (pending, in flight, dead),
-- the workers sending its deliveries (NULL when none; a worker of 0.1.0
-- records no name), and oldest pending age, with the database's clock
-- (`observed_at`) that the age was measured at and the endpoint's state is
-- decided at (hooklane/health.py), most delayed first. `hooklane status`,
-- `hooklane endpoint list`, the operator's status, the worker's
-- per-endpoint gauges and the admin API all read it. In flight: the
-- deliveries whose lease is live (a lease that ended is a call its worker
-- has given up on). Each count is a probe per endpoint, so that it reads
-- only that endpoint's entries, from where they can be live: the pending
-- from the floor the worker's ready list holds for the endpoint, if given
-- (`floor_ids`, `floors`), and the leases not yet ended; a horizon held
-- elsewhere keeps dead entries before those. With `listed`, the floors
-- are a ready list's whole: a deliverable endpoint it leaves out has
-- nothing pending that its worker knows of (the sweep finds what a lost
-- notification left), and is not probed, since from its start its queue
-- holds the dead entry of every delivery it sent while the horizon is
-- held. The endpoints no ready list holds (paused by hand, deactivated,
-- unsigned) are read from the start: they send nothing.
-- Parameters: partitions, or NULL for all; namespace and name of one
-- endpoint, or NULL for all; floor_ids and floors (arrays of the same
-- length; NULL, or an endpoint left out: from the start, or unless
-- deliverable, with listed, not at all).
-- Index: endpoints_partition; the unique (namespace, name) constraint for
-- one endpoint; deliveries_queue from each floor, deliveries_leased and
-- deliveries_dead, each probed per endpoint.
SELECT ep.id, ep.namespace, ep.name, ep.tenant, ep.url, ep.state, ep.paused,
       ep.secret IS NOT NULL AS signed, ep.max_concurrency, ep.consecutive_failures,
       hooklane_concurrency(ep) AS effective_concurrency, ep.adaptive_concurrency,
       ep.rate_per_second, ep.rate_burst, ep.throttled_until,
       ep.paused_until, ep.last_error, ep.last_delivered_at, ep.deactivated_reason,
       q.pending, extract(epoch FROM now() - q.oldest) AS oldest_pending_age,
       f.in_flight, f.sending_on, x.dead,
       now() AS observed_at, now() AS counted_at
FROM endpoints ep
LEFT JOIN unnest(%(floor_ids)s::bigint[], %(floors)s::timestamptz[]) AS fl(id, low) ON fl.id = ep.id
CROSS JOIN LATERAL (
    SELECT count(*) AS pending, min(d.created_at) AS oldest
    FROM deliveries d
    WHERE d.endpoint_id = ep.id
      AND d.state = 'pending'
      AND d.next_attempt_at >= coalesce(
            fl.low,
            CASE WHEN %(listed)s::boolean AND hooklane_deliverable(ep) THEN 'infinity'::timestamptz
                 ELSE '-infinity' END)
) q
CROSS JOIN LATERAL (
    SELECT count(*) AS in_flight,
           array_agg(DISTINCT d.attempted_by ORDER BY d.attempted_by)
             FILTER (WHERE d.attempted_by IS NOT NULL) AS sending_on
    FROM deliveries d
    WHERE d.endpoint_id = ep.id
      AND d.state = 'sending'
      AND d.lease_expires_at > now()
) f
CROSS JOIN LATERAL (
    SELECT count(*) AS dead FROM deliveries d WHERE d.endpoint_id = ep.id AND d.state = 'dead'
) x
WHERE (%(partitions)s::int[] IS NULL OR ep.partition = ANY(%(partitions)s::int[]))
  AND (%(namespace)s::text IS NULL OR (ep.namespace = %(namespace)s AND ep.name = %(name)s))
ORDER BY oldest_pending_age DESC NULLS LAST, ep.namespace, ep.name;

-- name: endpoint_page
-- A page of endpoints with their health (the columns of endpoint_health,
-- plus oldest_pending_at and counted_at), in endpoint_health's order:
-- oldest pending delivery first (most delayed), endpoints with nothing
-- pending last, then namespace and name. Keyset paging on
-- (oldest_pending_at, namespace, name) with NULLS LAST: the page starts
-- after the cursor's position.
-- The pending count and oldest are the last gauge pass's of the worker
-- owning the endpoint's partition while that is fresh (queue_summaries;
-- `counted_at` says when), and counted here for an endpoint no fresh
-- summary holds: read from the start of its queue, a count walks the dead
-- entry of every delivery the endpoint sent while a horizon is held,
-- which a gauge pass reads past from its ready list's floors.
-- Filters: tenant; name prefix; phase as hooklane/endpoint_state.py decides
-- it at now() (hooklane_phase; tests/test_api_admin.py checks that they
-- agree); not delivering: hooklane_not_delivering (deactivated, paused by
-- hand, unsigned, or its circuit open: nothing is sent to it now, or only
-- a probe).
-- Parameters: tenant or NULL, name_prefix or NULL, phase (Active, Paused,
-- Probing, Deactivated) or NULL, not_delivering (only those);
-- cursor_oldest_pending_at (NULL: among endpoints with nothing pending),
-- cursor_namespace (NULL: the first page) and cursor_name; limit (how many
-- rows).
-- Index: none for queue_summaries, read whole once (a row per partition,
-- hooklane_queue_counts); deliveries_queue, probed for
-- the endpoints no fresh summary holds; then,
-- for the page's rows only, deliveries_leased from now on (in flight: a
-- live lease, as endpoint_health counts it, and none of the ended leases a
-- held horizon keeps) and deliveries_dead.
-- endpoints itself is read whole (10,000 rows, a few ms): the order is
-- the queue's, which no index of endpoints holds.
WITH chosen AS (
    SELECT ep.id, ep.namespace, ep.name, ep.tenant, ep.url, ep.state, ep.paused,
           ep.secret IS NOT NULL AS signed, ep.max_concurrency, ep.consecutive_failures,
           hooklane_concurrency(ep) AS effective_concurrency, ep.adaptive_concurrency,
           ep.rate_per_second, ep.rate_burst, ep.throttled_until,
           ep.paused_until, ep.last_error, ep.last_delivered_at, ep.deactivated_reason
    FROM endpoints ep
    WHERE (%(tenant)s::text IS NULL OR ep.tenant = %(tenant)s)
      AND (%(name_prefix)s::text IS NULL OR starts_with(ep.name, %(name_prefix)s))
      AND (%(phase)s::text IS NULL OR hooklane_phase(ep) = %(phase)s)
      AND (NOT %(not_delivering)s::boolean OR hooklane_not_delivering(ep))
),
-- A full join, which no plan runs as a nested loop (materialized: the
-- filter below would make it a left join, and a nested loop over the
-- counts once per endpoint took 40 s at 10,000 endpoints on the estimates
-- of a small table rewritten every few seconds).
summarised AS MATERIALIZED (
    SELECT c.*, sm.endpoint_id AS counted_id, sm.pending AS counted_pending,
           sm.oldest_pending_at AS counted_oldest, sm.counted_at
    FROM chosen c
    FULL JOIN hooklane_queue_counts() sm ON sm.endpoint_id = c.id
),
counted AS (
    SELECT s.id, s.namespace, s.name, s.tenant, s.url, s.state, s.paused, s.signed,
           s.max_concurrency, s.consecutive_failures, s.effective_concurrency,
           s.adaptive_concurrency, s.rate_per_second, s.rate_burst, s.throttled_until,
           s.paused_until, s.last_error, s.last_delivered_at, s.deactivated_reason,
           coalesce(s.counted_pending, q.pending) AS pending,
           CASE WHEN s.counted_id IS NULL THEN q.oldest_pending_at ELSE s.counted_oldest END
             AS oldest_pending_at,
           coalesce(s.counted_at, now()) AS counted_at
    FROM summarised s
    CROSS JOIN LATERAL (
        SELECT count(*) AS pending, min(d.created_at) AS oldest_pending_at
        FROM deliveries d
        WHERE s.counted_id IS NULL AND d.endpoint_id = s.id AND d.state = 'pending'
    ) q
    WHERE s.id IS NOT NULL
),
page AS (
    SELECT *
    FROM counted c
    WHERE %(cursor_namespace)s::text IS NULL
       OR (%(cursor_oldest_pending_at)s::timestamptz IS NULL
           AND c.oldest_pending_at IS NULL
           AND (c.namespace, c.name) > (%(cursor_namespace)s, %(cursor_name)s::text))
       OR (%(cursor_oldest_pending_at)s IS NOT NULL
           AND (c.oldest_pending_at IS NULL OR c.oldest_pending_at > %(cursor_oldest_pending_at)s
                OR (c.oldest_pending_at = %(cursor_oldest_pending_at)s
                    AND (c.namespace, c.name) > (%(cursor_namespace)s, %(cursor_name)s))))
    ORDER BY c.oldest_pending_at NULLS LAST, c.namespace, c.name
    LIMIT %(limit)s
)
SELECT p.*,
       extract(epoch FROM now() - p.oldest_pending_at) AS oldest_pending_age,
       f.in_flight, f.sending_on,
       (SELECT count(*) FROM deliveries d WHERE d.endpoint_id = p.id AND d.state = 'dead') AS dead,
       now() AS observed_at
FROM page p
CROSS JOIN LATERAL (
    SELECT count(*) AS in_flight,
           array_agg(DISTINCT d.attempted_by ORDER BY d.attempted_by)
             FILTER (WHERE d.attempted_by IS NOT NULL) AS sending_on
    FROM deliveries d
    WHERE d.endpoint_id = p.id AND d.state = 'sending' AND d.lease_expires_at > now()
) f
ORDER BY p.oldest_pending_at NULLS LAST, p.namespace, p.name;

-- name: endpoint_totals
-- The totals over the endpoints endpoint_page's filters choose: how many,
-- how many not delivering, and their pending, in-flight and dead
-- deliveries. Counts only, no per-endpoint health: the dashboard's header.
-- Pending as endpoint_page counts it (a fresh gauge pass's count, or the
-- queue's own for an endpoint no fresh summary holds); in flight, the
-- live leases, as endpoint_health counts them.
-- Parameters: tenant or NULL, name_prefix or NULL, phase or NULL,
-- not_delivering (only those), as in endpoint_page.
-- Index: none for queue_summaries, read whole once
-- (hooklane_queue_counts); deliveries_queue probed per
-- endpoint no fresh summary holds, deliveries_leased probed per endpoint
-- from now on (not past the ended leases a held horizon keeps);
-- deliveries_dead read once (index-only where the visibility map allows),
-- hash-joined to the chosen endpoints.
WITH chosen AS MATERIALIZED (
    SELECT c.id, c.not_delivering, sm.pending AS summarised
    FROM (SELECT ep.id, hooklane_not_delivering(ep) AS not_delivering
          FROM endpoints ep
          WHERE (%(tenant)s::text IS NULL OR ep.tenant = %(tenant)s)
            AND (%(name_prefix)s::text IS NULL OR starts_with(ep.name, %(name_prefix)s))
            AND (%(phase)s::text IS NULL OR hooklane_phase(ep) = %(phase)s)
            AND (NOT %(not_delivering)s::boolean OR hooklane_not_delivering(ep))) c
    -- As in endpoint_page: a full join, never a nested loop. Its rows of
    -- counts no chosen endpoint matched (filtered out, or deleted) have a
    -- NULL id, which every total below leaves out.
    FULL JOIN hooklane_queue_counts() sm ON sm.endpoint_id = c.id
)
SELECT (SELECT count(id) FROM chosen) AS endpoints,
       (SELECT count(*) FROM chosen WHERE not_delivering) AS not_delivering,
       (SELECT coalesce(sum(coalesce(
                  c.summarised,
                  (SELECT count(*) FROM deliveries d
                   WHERE d.endpoint_id = c.id AND d.state = 'pending'))), 0)
        FROM chosen c WHERE c.id IS NOT NULL)::bigint AS pending,
       (SELECT coalesce(sum(
                  (SELECT count(*) FROM deliveries d
                   WHERE d.endpoint_id = c.id AND d.state = 'sending'
                     AND d.lease_expires_at > now())), 0)
        FROM chosen c WHERE c.id IS NOT NULL)::bigint AS in_flight,
       (SELECT count(*) FROM deliveries d JOIN chosen c ON c.id = d.endpoint_id
        WHERE d.state = 'dead') AS dead;

-- name: write_queue_summaries
-- What a worker's gauge pass counted of its partitions' queues, for the
-- endpoint listings (endpoint_page, endpoint_totals): one row per
-- partition, every endpoint of it the pass read with its pending count and
-- oldest pending creation, fresh for `fresh_seconds`. A pass that counted
-- before the row's last writer (a worker that has since lost the
-- partition, running late) leaves the row as it is.
-- Parameters: partitions (those the pass counted), counted_at (the
-- database's clock at its count), fresh_seconds; endpoint_ids, pending and
-- oldest_pending_at (arrays of the same length).
-- Index: the primary key of endpoints per id; queue_summaries' primary key
-- for the conflict.
INSERT INTO queue_summaries AS s
    (partition, counted_at, fresh_until, endpoint_ids, pending, oldest_pending_at)
SELECT p.partition, %(counted_at)s::timestamptz,
       %(counted_at)s::timestamptz + make_interval(secs => %(fresh_seconds)s::float8),
       coalesce(array_agg(c.id ORDER BY c.id) FILTER (WHERE c.id IS NOT NULL), '{}'),
       coalesce(array_agg(c.pending ORDER BY c.id) FILTER (WHERE c.id IS NOT NULL), '{}'),
       coalesce(array_agg(c.oldest ORDER BY c.id) FILTER (WHERE c.id IS NOT NULL), '{}')
FROM unnest(%(partitions)s::int[]) AS p(partition)
LEFT JOIN (unnest(%(endpoint_ids)s::bigint[], %(pending)s::bigint[],
                  %(oldest_pending_at)s::timestamptz[]) AS c(id, pending, oldest)
           JOIN endpoints ep ON ep.id = c.id)
       ON ep.partition = p.partition
GROUP BY p.partition
ON CONFLICT (partition) DO UPDATE
SET counted_at = EXCLUDED.counted_at, fresh_until = EXCLUDED.fresh_until,
    endpoint_ids = EXCLUDED.endpoint_ids, pending = EXCLUDED.pending,
    oldest_pending_at = EXCLUDED.oldest_pending_at
WHERE s.counted_at < EXCLUDED.counted_at;

-- name: endpoint_deliveries
-- A page of an endpoint's deliveries, newest first, after the cursor's id,
-- optionally of some states only, created in a time range, and whose last
-- attempt answered a status in a range or failed with a class; each with
-- its event's type, its first creation (created_at, as delivery_of) and
-- when it was last queued (queued_at: its creation or its latest resend).
-- One row with a NULL id when the endpoint has none there, no row when
-- there is no such endpoint.
-- Parameters: namespace, name, states (NULL for all), since (first created
-- from, or NULL), until (first created until, or NULL), status_min and
-- status_max (the last status within, or NULL), failure (the last failure
-- class, or NULL), before_id (below this id, or NULL), limit.
-- Index: the unique (namespace, name) constraint; deliveries_endpoint
-- (deliveries_dead does as well for dead ones only); primary key of events.
-- The status and failure filters are read off the rows that index walks,
-- newest first: a rare match costs a walk down the endpoint's history, as
-- far as `since` says (the attempts listing is bounded by time instead).
SELECT ep.id AS endpoint_id, p.*
FROM endpoints ep
LEFT JOIN LATERAL (
    SELECT d.id, d.event_id, e.type AS event_type, d.state, d.attempts, d.attempted_by,
           coalesce(d.first_created_at, d.created_at) AS created_at, d.created_at AS queued_at,
           CASE WHEN d.state = 'pending' THEN d.next_attempt_at END AS next_attempt_at,
           d.delivered_at, d.last_status, d.last_failure, d.last_error
    FROM deliveries d
    JOIN events e ON e.tenant = d.event_tenant AND e.id = d.event_id
    WHERE d.endpoint_id = ep.id
      AND (%(states)s::text[] IS NULL OR d.state = ANY(%(states)s::text[]))
      AND (%(since)s::timestamptz IS NULL OR coalesce(d.first_created_at, d.created_at) >= %(since)s)
      AND (%(until)s::timestamptz IS NULL OR coalesce(d.first_created_at, d.created_at) < %(until)s)
      AND (%(status_min)s::integer IS NULL OR d.last_status BETWEEN %(status_min)s AND %(status_max)s)
      AND (%(failure)s::text IS NULL OR d.last_failure = %(failure)s)
      AND (%(before_id)s::bigint IS NULL OR d.id < %(before_id)s)
    ORDER BY d.id DESC
    LIMIT %(limit)s
) p ON true
WHERE ep.namespace = %(namespace)s AND ep.name = %(name)s
ORDER BY p.id DESC;

-- name: delivery_of
-- One delivery with its endpoint, tenant and event type, by id; when
-- `namespace` and `name` are given, only if it is that endpoint's. No row
-- when there is none. created_at is its first creation, which a resend
-- keeps in first_created_at; queued_at when it was last queued (its
-- creation, or its latest resend: what its age counts from).
-- Parameters: id, namespace (or NULL), name (or NULL).
-- Index: primary keys of deliveries, endpoints and events.
SELECT d.id, d.event_id, e.type AS event_type, d.event_tenant AS tenant, d.state, d.attempts,
       d.attempted_by, coalesce(d.first_created_at, d.created_at) AS created_at, d.created_at AS queued_at,
       CASE WHEN d.state = 'pending' THEN d.next_attempt_at END AS next_attempt_at,
       d.delivered_at, d.last_status, d.last_failure, d.last_error,
       ep.namespace, ep.name
FROM deliveries d
JOIN endpoints ep ON ep.id = d.endpoint_id
JOIN events e ON e.tenant = d.event_tenant AND e.id = d.event_id
WHERE d.id = %(id)s
  AND (%(namespace)s::text IS NULL OR (ep.namespace = %(namespace)s AND ep.name = %(name)s));

-- name: delivery_attempts_of
-- A delivery's attempts in the order they were recorded, at most `limit`,
-- each with the event it carried (a coalesced delivery's earlier attempts
-- carried earlier events).
-- Parameters: delivery_id, limit.
-- Index: delivery_attempts_delivery of each partition: a probe per day
-- kept (about 34), as no time bounds a delivery's history (a resend, days
-- after, starts its age anew and keeps the attempts before it).
SELECT a.attempt, a.event_id, a.attempted_by, a.started_at, a.duration_seconds, a.outcome,
       a.status, a.failure, a.error, a.retry_after_seconds, a.next_attempt_at, a.trace_id,
       a.recorded_at
FROM delivery_attempts a
WHERE a.delivery_id = %(delivery_id)s
ORDER BY a.recorded_at, a.attempt
LIMIT %(limit)s;

-- name: endpoint_attempts
-- A page of an endpoint's attempts recorded in [since, until), newest
-- first, after the cursor's (recorded_at, delivery_id, attempt), of some
-- outcomes, statuses or failure classes only; each with its delivery's
-- event. One row with NULL columns but endpoint_id when the endpoint has
-- none there, no row when there is no such endpoint.
-- Parameters: namespace, name, since, until, outcomes (NULL for all),
-- status_min and status_max (NULL for any), failure (or NULL), after_at,
-- after_delivery, after_attempt (the cursor; NULL for the first page),
-- limit.
-- Index: the unique (namespace, name) constraint; delivery_attempts_endpoint
-- of each partition, walked from `until` (or the cursor) down to `since`:
-- the time range prunes the partitions outside it and bounds the walk.
SELECT ep.id AS endpoint_id, p.*
FROM endpoints ep
LEFT JOIN LATERAL (
    SELECT a.delivery_id, a.event_id, a.attempt, a.attempted_by, a.started_at,
           a.duration_seconds, a.outcome, a.status, a.failure, a.error,
           a.retry_after_seconds, a.next_attempt_at, a.trace_id, a.recorded_at
    FROM delivery_attempts a
    WHERE a.endpoint_id = ep.id
      AND a.recorded_at >= %(since)s
      AND a.recorded_at < %(until)s
      -- The cursor's bound without an OR, so that a generic plan walks
      -- the index from it too (the first page's 'infinity' bounds nothing).
      AND a.recorded_at <= coalesce(%(after_at)s::timestamptz, 'infinity')
      AND (a.recorded_at, a.delivery_id, a.attempt)
          < (coalesce(%(after_at)s::timestamptz, 'infinity'),
             coalesce(%(after_delivery)s::bigint, 0), coalesce(%(after_attempt)s::integer, 0))
      AND (%(outcomes)s::text[] IS NULL OR a.outcome = ANY(%(outcomes)s::text[]))
      AND (%(status_min)s::integer IS NULL OR a.status BETWEEN %(status_min)s AND %(status_max)s)
      AND (%(failure)s::text IS NULL OR a.failure = %(failure)s)
    ORDER BY a.recorded_at DESC, a.delivery_id DESC, a.attempt DESC
    LIMIT %(limit)s
) p ON true
WHERE ep.namespace = %(namespace)s AND ep.name = %(name)s
ORDER BY p.recorded_at DESC, p.delivery_id DESC, p.attempt DESC;

-- name: discard_dead
-- Give up for good on dead deliveries of one endpoint (all of them, or the
-- given ids): 'discarded' is never sent, and no resend brings it back.
-- last_error says who discarded it and keeps the error it died of. One
-- page at a time, as resend_dead: the endpoint's dead deliveries after a
-- delivery id, at most page_size (store.discard_dead runs the pages). One
-- row, how many were discarded, how many dead ones the page held and its
-- last id, if the endpoint exists; none if it does not.
-- Parameters: namespace, name, ids (of deliveries; NULL for all), by (who
-- discards, e.g. 'the admin API', 'hooklane endpoint discard'), after (the
-- last delivery id of the previous page, 0 for the first), page_size.
-- Index: the unique (namespace, name) constraint; deliveries_dead, walked
-- in order from the position.
WITH endpoint AS (
    SELECT id FROM endpoints WHERE namespace = %(namespace)s AND name = %(name)s
),
page AS (
    SELECT d.id
    FROM deliveries d, endpoint ep
    WHERE d.endpoint_id = ep.id
      AND d.state = 'dead'
      AND d.id > %(after)s
      AND (%(ids)s::bigint[] IS NULL OR d.id = ANY(%(ids)s::bigint[]))
    ORDER BY d.id
    LIMIT %(page_size)s
),
discarded AS (
    UPDATE deliveries d
    SET state = 'discarded',
        last_error = format('discarded by %%s (dead of: %%s)', %(by)s::text,
                            coalesce(d.last_error, 'no error recorded'))
    FROM page p
    WHERE d.id = p.id
      AND d.state = 'dead'
    RETURNING d.id
)
SELECT (SELECT count(*) FROM discarded) AS done,
       (SELECT count(*) FROM page) AS scanned,
       (SELECT max(p.id) FROM page p) AS last
FROM endpoint;

-- name: endpoint_tenant
-- The tenant of one endpoint, which replay_since then takes as a value.
-- Parameters: namespace, name. Index: the unique (namespace, name)
-- constraint.
SELECT tenant FROM endpoints WHERE namespace = %(namespace)s AND name = %(name)s;

-- name: replay_since
-- Send again, page by page, the stored events of the endpoint's tenant
-- created since a time whose type the endpoint receives
-- (hooklane_type_matches, publish's rule), whether or not they had a
-- delivery to it: those published while it was deactivated (publish skips
-- it then) or before it existed are caught up too. A new pending delivery
-- of the same event id each (receivers deduplicate on webhook-id, the event
-- id), in the order the events were stored, for events with no delivery to
-- the endpoint pending or in flight now. Only the events of the tenant
-- given, and only while it is the endpoint's: other tenants' events are
-- never replayed: its tenant is checked again on every page, and a page
-- that finds it moved returns nothing, which stops the replay (deliveries
-- a page queues as the move commits keep the old tenant, and the workers
-- discard them: hooklane_tenant_discard). Wakes the endpoint. One page is at most `page_size` of
-- the tenant's events since the time, in (xact, id) order after the cursor;
-- the caller runs the next page from the position returned until a page
-- comes back short, so that no statement inserts more than `page_size` deliveries
-- however long the range (store.replay_since). One row, how many were
-- queued, how many events the page held and its last position, if the
-- endpoint exists with that tenant; none if not.
-- Parameters: namespace, name, tenant (the endpoint's, given as a value,
-- from endpoint_tenant, so that the planner estimates the tenant's events
-- from the statistics of `events` rather than as any tenant's), since,
-- cursor_xact (as text) and cursor_id ('0' and '' for the first page),
-- page_size.
-- Index: the unique (namespace, name) constraint; for the page,
-- events_tenant_xact walked in order, index-only (created_at is checked on
-- the index entries, as in list_events: a tenant's events from before the
-- time are walked over once, on the first pages), or for a short range
-- events_created_at, or for a small tenant the primary key of events,
-- whichever the planner finds cheaper; primary key of events for each
-- event's type; deliveries_event for the pending check.
WITH endpoint AS (
    SELECT id, partition, tenant, event_types
    FROM endpoints
    WHERE namespace = %(namespace)s AND name = %(name)s AND tenant = %(tenant)s
),
page AS (
    SELECT e.tenant, e.xact, e.id
    FROM events e
    WHERE e.tenant = %(tenant)s
      AND (e.xact, e.id) > (%(cursor_xact)s::text::xid8, %(cursor_id)s::text)
      AND e.created_at >= %(since)s
    ORDER BY e.xact, e.id
    LIMIT %(page_size)s
),
replayed AS (
    INSERT INTO deliveries (endpoint_id, event_tenant, event_id)
    SELECT ep.id, ep.tenant, e.id
    FROM page p
    JOIN events e ON e.tenant = p.tenant AND e.id = p.id
    CROSS JOIN endpoint ep
    WHERE hooklane_type_matches(ep.event_types, e.type)
      AND NOT EXISTS (SELECT 1 FROM deliveries o
                      WHERE o.event_tenant = ep.tenant
                        AND o.event_id = e.id
                        AND o.endpoint_id = ep.id
                        AND o.state IN ('pending', 'sending'))
    ORDER BY p.xact, p.id
    RETURNING endpoint_id
),
woken AS (
    SELECT hooklane_wake_v2(array_agg(ep.id), array_agg(ep.partition), array_agg(now()))
    FROM endpoint ep
    WHERE EXISTS (SELECT FROM replayed)
),
last AS (
    SELECT p.xact, p.id FROM page p ORDER BY p.xact DESC, p.id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM replayed) AS replayed,
       (SELECT count(*) FROM page) AS scanned,
       (SELECT l.xact::text FROM last l) AS xact,
       (SELECT l.id FROM last l) AS id
FROM endpoint, woken;

-- name: unrouted_counts
-- Events kept although no endpoint matched them, per tenant and type, with
-- the oldest and newest.
-- Parameters: none. Index: events_unrouted.
SELECT tenant, type, count(*) AS events, min(created_at) AS oldest, max(created_at) AS newest
FROM events
WHERE fanout = 0
GROUP BY tenant, type
ORDER BY tenant, type;

-- name: unrouted_events
-- Events kept although no endpoint matched them.
-- Parameters: none. Index: events_unrouted.
SELECT count(*) FROM events WHERE fanout = 0;

-- name: live_workers
-- Workers alive right now: each holds its member advisory lock on its
-- partition-lock connection for as long as it lives, so a worker that dies
-- or loses its connection drops out at once.
-- With it, the statement's snapshot, which costs nothing more: the commit
-- probe skips its idle turn when no transaction ended since its last
-- snapshot (hooklane/worker/commits.py), and the rebalancer asks every
-- second anyway.
-- Parameters: member_class (of the locks). Index: none (pg_locks is in memory).
SELECT count(*) AS n, pg_current_snapshot()::text AS snapshot
FROM pg_locks
WHERE locktype = 'advisory'
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND classid = %(member_class)s::int::oid
  AND objsubid = 2
  AND granted;

-- name: try_lock
-- Take an advisory lock for this session if it is free.
-- Parameters: lock_class, key. Index: none.
SELECT pg_try_advisory_lock(%(lock_class)s::int, %(key)s::int) AS locked;

-- name: unlock
-- Release an advisory lock this session holds.
-- Parameters: lock_class, key. Index: none.
SELECT pg_advisory_unlock(%(lock_class)s::int, %(key)s::int) AS released;

-- name: endpoint_health_changed
-- The operator's status pass: endpoint_health's rows, each with `digest`
-- (a hash of everything its status shows, the oldest pending age in steps
-- of `age_step` seconds up to ten steps and of a tenth beyond), of only the
-- endpoints whose digest differs from the one the operator reflected last
-- (or that it has not reflected yet); plus, with a NULL id and their
-- `known_id`, the endpoints it knew that are gone. An idle pass returns
-- nothing, whatever the number of endpoints.
-- Parameters: ids and digests (arrays of the same length) the operator
-- reflected last; age_step in seconds (its status interval).
-- Index: as endpoint_health (the join visits only pending, sending and
-- dead deliveries); the primary key for the known ids.
WITH health AS (
    SELECT ep.id, ep.namespace, ep.name, ep.tenant, ep.url, ep.state, ep.paused,
           ep.secret IS NOT NULL AS signed, ep.max_concurrency, ep.consecutive_failures,
           hooklane_concurrency(ep) AS effective_concurrency, ep.adaptive_concurrency,
           ep.rate_per_second, ep.rate_burst, ep.throttled_until,
           ep.paused_until, ep.last_error, ep.last_delivered_at, ep.deactivated_reason,
           count(d.id) FILTER (WHERE d.state = 'pending') AS pending,
           extract(epoch FROM now() - min(d.created_at) FILTER (WHERE d.state = 'pending'))
             AS oldest_pending_age,
           count(d.id) FILTER (WHERE d.state = 'sending') AS in_flight,
           array_agg(DISTINCT d.attempted_by ORDER BY d.attempted_by)
             FILTER (WHERE d.state = 'sending' AND d.attempted_by IS NOT NULL) AS sending_on,
           count(d.id) FILTER (WHERE d.state = 'dead') AS dead,
           now() AS observed_at, now() AS counted_at
    FROM endpoints ep
    LEFT JOIN deliveries d
           ON d.endpoint_id = ep.id AND d.state IN ('pending', 'sending', 'dead')
    GROUP BY ep.id
), digested AS (
    SELECT h.*,
           md5(row(h.tenant, h.url, h.state, h.paused, h.signed, h.max_concurrency,
                   h.effective_concurrency,
                   h.consecutive_failures, h.paused_until, h.paused_until > h.observed_at,
                   h.last_error, h.last_delivered_at, h.deactivated_reason,
                   h.pending, h.in_flight, h.dead,
                   CASE WHEN h.oldest_pending_age IS NULL THEN -1
                        WHEN h.oldest_pending_age < 10 * %(age_step)s::float8
                          THEN floor(h.oldest_pending_age / %(age_step)s::float8)
                        ELSE 10 + floor(ln(h.oldest_pending_age / (10 * %(age_step)s::float8)) / ln(1.1))
                   END)::text) AS digest
    FROM health h
)
SELECT d.*, known.id AS known_id
FROM digested d
FULL JOIN unnest(%(ids)s::bigint[], %(digests)s::text[]) AS known(id, digest) ON known.id = d.id
WHERE d.id IS NULL OR known.digest IS DISTINCT FROM d.digest;

-- Tenant portal (hooklane/store/portal.py; migration 0013).

-- name: create_portal_grant
-- Keep a new link or session by its token's digest, and purge up to a
-- hundred expired grants on the way, so that the table holds about the
-- live ones without a job of its own.
-- Parameters: digest, kind, tenant, access, seconds. Index: the primary
-- key for the insert; portal_grants_expiry for the purge.
WITH purged AS (
    DELETE FROM portal_grants
    WHERE digest IN (SELECT digest FROM portal_grants
                     WHERE expires_at < now() ORDER BY expires_at LIMIT 100)
)
INSERT INTO portal_grants (digest, kind, tenant, access, expires_at)
VALUES (%(digest)s, %(kind)s, %(tenant)s, %(access)s,
        now() + make_interval(secs => %(seconds)s::float8))
RETURNING expires_at;

-- name: redeem_portal_link
-- A link, once: deleted as the session it opens is kept. Of two
-- redemptions at once the second waits on the row and then finds it gone.
-- Parameters: link, session, seconds. Index: the primary key.
WITH used AS (
    DELETE FROM portal_grants
    WHERE digest = %(link)s AND kind = 'link' AND expires_at > now()
    RETURNING tenant, access
)
INSERT INTO portal_grants (digest, kind, tenant, access, expires_at)
SELECT %(session)s, 'session', tenant, access, now() + make_interval(secs => %(seconds)s::float8)
FROM used
RETURNING tenant, access, expires_at;

-- name: portal_session
-- The grant of a live session or tenant token.
-- Parameters: digest. Index: the primary key.
SELECT tenant, access, expires_at FROM portal_grants
WHERE digest = %(digest)s AND kind = 'session' AND expires_at > now();

-- name: end_portal_session
-- Parameters: digest. Index: the primary key.
DELETE FROM portal_grants WHERE digest = %(digest)s AND kind = 'session';

-- name: tenant_endpoint
-- The endpoint if it is the tenant's, else nothing: every tenant route
-- starts here, so that another tenant's endpoint reads as none at all.
-- Parameters: namespace, name, tenant. Index: the unique (namespace, name)
-- constraint.
SELECT id FROM endpoints
WHERE namespace = %(namespace)s AND name = %(name)s AND tenant = %(tenant)s;

-- name: lock_tenant_endpoint
-- tenant_endpoint for a change: the share lock holds the endpoint with this
-- tenant until the change commits (moving it to another tenant, an update,
-- waits), so that a repair never reaches the next owner's deliveries.
-- Parameters: namespace, name, tenant. Index: the unique (namespace, name)
-- constraint.
SELECT id FROM endpoints
WHERE namespace = %(namespace)s AND name = %(name)s AND tenant = %(tenant)s
FOR SHARE;

-- name: send_test_event
-- A test event for one endpoint only (type hooklane.test, the endpoint's
-- tenant), delivered like any other, whatever event types the endpoint
-- receives; it is listed for reconciliation like any other event too.
-- Parameters: endpoint_id, id, data. Index: endpoints' primary key; the
-- events' primary key for the insert.
WITH ep AS (
    SELECT id, partition, tenant FROM endpoints WHERE id = %(endpoint_id)s
), event AS (
    INSERT INTO events (id, tenant, type, data, fanout)
    SELECT %(id)s, ep.tenant, 'hooklane.test', %(data)s::jsonb, 1 FROM ep
    RETURNING id
), queued AS (
    INSERT INTO deliveries (endpoint_id, event_tenant, event_id)
    SELECT ep.id, ep.tenant, event.id FROM ep, event
    RETURNING id
), woken AS (
    SELECT hooklane_wake_v2(array_agg(ep.id), array_agg(ep.partition), array_agg(now())) FROM ep
)
SELECT (SELECT id FROM queued) AS delivery_id FROM woken;

-- Self-service endpoints in local mode (hooklane/api/endpoint_writers.py).

-- name: lock_tenant_creates
-- Wait until no other transaction creates an endpoint of this tenant, and
-- hold that until this one ends: two creates at once cannot both count
-- below the bound and both insert. A statement of its own: a statement's
-- snapshot is taken before it waits, so the count must be the next one.
-- Parameters: lock_class, tenant. Index: none (advisory).
SELECT pg_advisory_xact_lock(%(lock_class)s::int, hashtext(%(tenant)s));

-- name: endpoint_limits
-- An endpoint's concurrency limit and deadline, for the tenant API to
-- report one of a tenant's endpoints beyond the platform's current bounds.
-- Parameters: namespace, name. Index: the unique (namespace, name)
-- constraint.
SELECT max_concurrency, timeout_seconds
FROM endpoints
WHERE namespace = %(namespace)s AND name = %(name)s;

-- name: over_limits
-- The endpoints of one namespace beyond a concurrency limit or a deadline:
-- `hooklane endpoint over-bounds` lists the tenants' endpoints beyond the
-- platform's current bounds (which of them the portal made is decided in
-- Python, from the name and tenant).
-- Parameters: namespace, max_concurrency, timeout_seconds. Index: the
-- unique (namespace, name) constraint, the namespace's entries read in full
-- (run by hand: 10,000 endpoints are one read of a few MB).
SELECT name, tenant, max_concurrency, timeout_seconds
FROM endpoints
WHERE namespace = %(namespace)s
  AND (max_concurrency > %(max_concurrency)s OR timeout_seconds > %(timeout_seconds)s)
ORDER BY name;

-- name: tenant_endpoint_count
-- How many endpoints a tenant has in one namespace, deactivated ones too.
-- Parameters: namespace, tenant. Index: the unique (namespace, name)
-- constraint, the namespace's entries read in full (endpoints_tenant
-- leaves out the deactivated ones): one read per create, tens of
-- thousands of entries at most.
SELECT count(*) FROM endpoints WHERE namespace = %(namespace)s AND tenant = %(tenant)s;

-- name: stored_endpoint
-- One endpoint as stored_endpoints reads them: the portal's edit form, and
-- (after lock_endpoint_secret locked the row) the rest of what an edit, a
-- pause or a rotation writes back unchanged.
-- Parameters: namespace, name. Index: the unique (namespace, name)
-- constraint.
SELECT namespace, name, tenant, url, secret, max_concurrency, event_types,
       timeout_seconds, paused, rate_per_second, rate_burst, adaptive_concurrency, max_attempts,
       max_age_seconds, request_terms
FROM endpoints
WHERE namespace = %(namespace)s AND name = %(name)s;

-- Operational notifications (hooklane/store/notifications.py; migration 0014).

-- name: note_notices
-- What the notifications pass noticed since its last run, kept in
-- endpoint_notices and made due (now, or once the interval since the
-- kind's last notice has passed): circuits that opened (a failing episode,
-- by its failing_since, not noticed yet), deactivations (by their
-- deactivated_at) and endpoints with dead attempts recorded in the window.
-- Reads only what changed: the circuits whose pause ends after `since`
-- (each opening sets it ahead of its own time, so every circuit opened
-- since is there, with those still paused), the deactivations after it,
-- and the dead attempts between it and the cut. The window starts at
-- `since` (the last run's cut), never more than `lookback_seconds` back,
-- and ends at the cut, `settle_seconds` before now: an attempt recorded
-- by a transaction that commits late is still counted (take_notices
-- counts up to the same cut). The notifications tenant's own endpoints are
-- never noticed: their failures do not notify through themselves. A
-- transition noticed already is not noted again, so that a second run
-- over the same window (another worker, or an overlap) changes nothing;
-- the upsert takes its row locks in key order. One row: the cut, the next
-- run's `since`, and how many of each kind were noted.
-- Parameters: tenant (the notifications tenant), since (NULL: none),
-- lookback_seconds, settle_seconds, interval_seconds.
-- Index: endpoints_paused_until, endpoints_deactivated_at, and
-- delivery_attempts_dead (index only, the partitions of the window only),
-- each from `since`; primary key of endpoints (the tenant of an endpoint
-- with dead attempts, and each new one's, held); primary key of
-- endpoint_notices.
WITH bounds AS MATERIALIZED (
    SELECT greatest(coalesce(%(since)s::timestamptz, '-infinity'),
                    now() - make_interval(secs => %(lookback_seconds)s::float8)) AS since,
           now() - make_interval(secs => %(settle_seconds)s::float8) AS cut
),
changed AS (
    SELECT ep.id AS endpoint_id, 'paused' AS kind, ep.failing_since AS seen, ep.tenant
    FROM endpoints ep
    WHERE ep.paused_until > (SELECT since FROM bounds)
      AND ep.failing_since IS NOT NULL
    UNION ALL
    SELECT ep.id, 'deactivated', ep.deactivated_at, ep.tenant
    FROM endpoints ep
    WHERE ep.state = 'deactivated'
      AND ep.deactivated_at > (SELECT since FROM bounds)
    UNION ALL
    -- The tenant by primary key, per endpoint: a join would be planned
    -- from the range's estimate, a third of every dead attempt, and read
    -- every endpoint.
    SELECT dead.endpoint_id, 'deliveries_dead', NULL,
           (SELECT ep.tenant FROM endpoints ep WHERE ep.id = dead.endpoint_id)
    FROM (SELECT DISTINCT a.endpoint_id
          FROM delivery_attempts a
          WHERE a.outcome = 'dead'
            AND a.recorded_at > (SELECT since FROM bounds)
            AND a.recorded_at <= (SELECT cut FROM bounds)) dead
),
news AS MATERIALIZED (
    SELECT c.endpoint_id, c.kind, c.seen
    FROM changed c
    -- Probed by primary key per endpoint (OFFSET 0 keeps it a nested
    -- loop), not hashed from a read of every notice.
    LEFT JOIN LATERAL (
        SELECT n.seen, n.due_at
        FROM endpoint_notices n
        WHERE n.endpoint_id = c.endpoint_id AND n.kind = c.kind
        OFFSET 0
    ) n ON true
    WHERE c.tenant <> %(tenant)s
      AND CASE WHEN c.kind = 'deliveries_dead' THEN n.due_at IS NULL
               ELSE n.seen IS DISTINCT FROM c.seen END
),
-- The endpoint of each, held (a key share, as the foreign key's check
-- takes) before the insert: one deleted meanwhile is left out, where the
-- check would fail the whole statement.
held AS (
    SELECT x.endpoint_id, x.kind, x.seen
    FROM news x
    CROSS JOIN LATERAL (
        SELECT FROM endpoints ep WHERE ep.id = x.endpoint_id FOR KEY SHARE
    ) ep
),
noted AS (
    INSERT INTO endpoint_notices AS n (endpoint_id, kind, seen, transitions, counted_until, due_at)
    SELECT x.endpoint_id, x.kind, x.seen,
           CASE WHEN x.kind = 'deliveries_dead' THEN 0 ELSE 1 END,
           CASE WHEN x.kind = 'deliveries_dead' THEN b.since END,
           now()
    FROM held x, bounds b
    ORDER BY x.endpoint_id, x.kind
    ON CONFLICT (endpoint_id, kind) DO UPDATE
    SET seen = EXCLUDED.seen,
        transitions = n.transitions + EXCLUDED.transitions,
        due_at = coalesce(n.due_at,
                          greatest(now(), n.notified_at + make_interval(secs => %(interval_seconds)s::float8)))
    -- Read again after waiting for a concurrent run's row: what it noted
    -- is not noted twice.
    WHERE CASE WHEN n.kind = 'deliveries_dead' THEN n.due_at IS NULL
               ELSE n.seen IS DISTINCT FROM EXCLUDED.seen END
    RETURNING n.kind
)
SELECT (SELECT cut FROM bounds) AS cut,
       count(*) FILTER (WHERE kind = 'paused') AS paused,
       count(*) FILTER (WHERE kind = 'deactivated') AS deactivated,
       count(*) FILTER (WHERE kind = 'deliveries_dead') AS deliveries_dead
FROM noted;

-- name: take_notices
-- The notices due, at most `limit`, soonest first, each with what it
-- tells: the endpoint as it is now, the transitions noticed since the
-- kind's last notice, and for dead deliveries how many dead attempts were
-- recorded since the last one counted up to the cut (`settle_seconds`
-- before now, as note_notices) and the latest one's error. A notice is
-- told only while still true (the circuit of the episode noticed still
-- open, the deactivation noticed still in force, a dead delivery counted)
-- and while the endpoint is not the notifications tenant's: one that no
-- longer is is cleared, its transitions kept for the next. Each row taken
-- is locked and cleared (no longer due; told now, its counts restarted),
-- and rows another run holds are skipped: of runs at once, each notice
-- goes to one. The caller publishes what this returns in the same
-- transaction, so that a notice is cleared if and only if it is published.
-- Parameters: tenant (the notifications tenant), settle_seconds, limit.
-- Index: endpoint_notices_due; primary key of endpoints;
-- delivery_attempts_endpoint_dead, one endpoint's from its last count (the
-- partitions of that range only).
WITH due AS MATERIALIZED (
    SELECT n.endpoint_id, n.kind, n.seen, n.transitions, n.counted_until, n.notified_at
    FROM endpoint_notices n
    WHERE n.due_at <= now()
    ORDER BY n.due_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
facts AS MATERIALIZED (
    SELECT d.endpoint_id, d.kind, d.seen, d.transitions, d.counted_until, d.notified_at,
           ep.namespace, ep.name, ep.tenant, ep.consecutive_failures, ep.failing_since,
           ep.paused_until, ep.last_error, ep.deactivated_at, ep.deactivated_reason,
           coalesce(dead.count, 0) AS dead, last.error AS dead_error, last.status AS dead_status,
           last.failure AS dead_failure, last.recorded_at AS last_dead_at, w.cut,
           ep.tenant <> %(tenant)s
             AND CASE d.kind
                   WHEN 'paused' THEN ep.paused_until IS NOT NULL AND ep.failing_since = d.seen
                   WHEN 'deactivated' THEN ep.state = 'deactivated' AND ep.deactivated_at = d.seen
                   ELSE dead.count > 0 END AS told
    FROM due d
    CROSS JOIN (SELECT now() - make_interval(secs => %(settle_seconds)s::float8) AS cut) w
    -- By primary key per notice (OFFSET 0 keeps it a nested loop), not a
    -- hash of every endpoint.
    CROSS JOIN LATERAL (
        SELECT ep.namespace, ep.name, ep.tenant, ep.state, ep.consecutive_failures, ep.failing_since,
               ep.paused_until, ep.last_error, ep.deactivated_at, ep.deactivated_reason
        FROM endpoints ep
        WHERE ep.id = d.endpoint_id
        OFFSET 0
    ) ep
    LEFT JOIN LATERAL (
        SELECT count(*) AS count
        FROM delivery_attempts a
        WHERE d.kind = 'deliveries_dead'
          AND a.endpoint_id = d.endpoint_id AND a.outcome = 'dead'
          AND a.recorded_at > d.counted_until AND a.recorded_at <= w.cut
    ) dead ON true
    LEFT JOIN LATERAL (
        SELECT a.error, a.status, a.failure, a.recorded_at
        FROM delivery_attempts a
        WHERE d.kind = 'deliveries_dead'
          AND a.endpoint_id = d.endpoint_id AND a.outcome = 'dead'
          AND a.recorded_at > d.counted_until AND a.recorded_at <= w.cut
        ORDER BY a.recorded_at DESC
        LIMIT 1
    ) last ON true
),
-- Runs whether or not it is read, as every data-modifying WITH does.
-- By key, not by the ctid `due` locked: a row a concurrent note_notices
-- changed after this statement's snapshot is locked at a version the
-- snapshot does not see, which the key join reaches and a ctid does not.
taken AS (
    UPDATE endpoint_notices n
    SET due_at = NULL,
        notified_at = CASE WHEN f.told THEN now() ELSE n.notified_at END,
        transitions = CASE WHEN f.told THEN 0 ELSE n.transitions END,
        counted_until = CASE WHEN n.kind = 'deliveries_dead' THEN f.cut ELSE n.counted_until END
    FROM facts f
    WHERE n.endpoint_id = f.endpoint_id AND n.kind = f.kind
)
SELECT f.endpoint_id, f.kind, f.namespace, f.name, f.tenant, f.seen, f.transitions, f.counted_until,
       f.notified_at, f.consecutive_failures, f.failing_since, f.paused_until, f.last_error,
       f.deactivated_at, f.deactivated_reason, f.dead, f.dead_error, f.dead_status, f.dead_failure,
       f.last_dead_at, f.cut, now() AS noticed_at
FROM facts f
WHERE f.told
ORDER BY f.endpoint_id, f.kind;

-- name: publisher_role_exists
-- Whether a database role of this name exists: `hooklane publisher grant`
-- refuses a misspelt one rather than scoping nobody.
-- Parameters: role. Index: pg_authid's on the name.
SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = %(role)s);

-- name: publisher_execute_statement
-- The statement granting (grant true) or revoking EXECUTE on every version
-- of the publish functions to or from a role, its name quoted: GRANT takes
-- no parameter.
-- Parameters: role, grant. Index: pg_proc's on the name.
SELECT format('%%s EXECUTE ON FUNCTION %%s %%s %%I',
              CASE WHEN %(grant)s::boolean THEN 'GRANT' ELSE 'REVOKE' END,
              string_agg(p.oid::regprocedure::text, ', ' ORDER BY p.proname),
              CASE WHEN %(grant)s::boolean THEN 'TO' ELSE 'FROM' END, %(role)s::text)
FROM pg_proc p
WHERE p.pronamespace = current_schema()::regnamespace
  AND p.proname ~ '^hooklane_(try_)?publish_v[0-9]+$';

-- name: grant_publisher_scopes
-- Let a role publish for these tenants (NULL in the array: every tenant);
-- those it had already are kept as they were. Returns how many are new.
-- Parameters: role, tenants. Index: publisher_scopes_role_tenant (ON
-- CONFLICT).
WITH added AS (
    INSERT INTO publisher_scopes (role, tenant)
    SELECT %(role)s, t FROM unnest(%(tenants)s::text[]) AS t
    ON CONFLICT (role, coalesce(tenant, '')) DO NOTHING
    RETURNING 1
)
SELECT count(*) FROM added;

-- name: revoke_publisher_scopes
-- Take tenants from a role's scope (NULL in the array: its every-tenant
-- scope), or its whole scope (all_scopes). Returns how many it took and
-- how many the role has left.
-- Parameters: role, tenants, all_scopes. Index: publisher_scopes_role_tenant.
WITH removed AS (
    DELETE FROM publisher_scopes
    WHERE role = %(role)s
      AND (%(all_scopes)s::boolean
           OR coalesce(tenant, '') = ANY (SELECT coalesce(t, '') FROM unnest(%(tenants)s::text[]) AS t))
    RETURNING tenant
)
SELECT (SELECT count(*) FROM removed) AS removed,
       (SELECT count(*) FROM publisher_scopes WHERE role = %(role)s)
           - (SELECT count(*) FROM removed) AS remaining;

-- name: publisher_scopes
-- Every role that may publish or holds EXECUTE on the publish functions:
-- its tenants (a NULL among them: every tenant), and whether it holds
-- EXECUTE on v1 and on v2. The owner, its members and superusers are left
-- out: they publish for every tenant without a scope.
-- Parameters: none. Index: none (a scan of a table of a few rows per role,
-- and of pg_roles).
WITH owner AS (
    SELECT proowner AS oid FROM pg_proc
    WHERE oid = 'hooklane_try_publish_v1(text, text, jsonb, text, text, text)'::regprocedure
),
roles AS (
    SELECT r.rolname AS role,
           has_function_privilege(r.oid, 'hooklane_try_publish_v1(text, text, jsonb, text, text, text)',
                                  'EXECUTE') AS execute_v1,
           has_function_privilege(r.oid, 'hooklane_try_publish_v2(text, text, text, text, text, text)',
                                  'EXECUTE') AS execute_v2
    FROM pg_roles r, owner
    WHERE NOT pg_has_role(r.oid, owner.oid, 'MEMBER')
)
SELECT coalesce(s.role, r.role) AS role,
       coalesce(s.tenants, '{}') AS tenants,
       coalesce(r.execute_v1, false) AS execute_v1,
       coalesce(r.execute_v2, false) AS execute_v2
FROM (SELECT role, array_agg(tenant ORDER BY tenant NULLS FIRST) AS tenants
      FROM publisher_scopes GROUP BY role) AS s
FULL JOIN (SELECT * FROM roles WHERE execute_v1 OR execute_v2) AS r ON r.role = s.role
ORDER BY 1;
