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
-- Create or update an endpoint by (namespace, name), waking it when an
-- update may make its deliveries reservable; discards the deliveries of
-- another tenant's events (hooklane_tenant_discard), and on a change of
-- tenant lets go of the old tenant's ordering keys (released, below).
-- After lock_endpoint_secret, in the same transaction.
-- Parameters: namespace, name, tenant, url, secret, max_concurrency,
-- event_types, timeout_seconds, paused, replaced_secret, grace_seconds,
-- rate_per_second, rate_burst, adaptive_concurrency, max_attempts,
-- max_age_seconds, request_terms, ordering_on_dead.
-- Index: the unique (namespace, name) constraint; deliveries_queue and
-- deliveries_dead for the discard; the primary key of ordering_keys (its
-- endpoint_id prefix: a change of tenant is rare) for the keys let go.
WITH before AS (
    SELECT id, tenant FROM endpoints WHERE namespace = %(namespace)s AND name = %(name)s
),
upserted AS (
INSERT INTO endpoints (namespace, name, tenant, url, secret, max_concurrency,
                       event_types, timeout_seconds, paused, partition, rate_per_second, rate_burst,
                       adaptive_concurrency, max_attempts, max_age_seconds, request_terms,
                       ordering_on_dead)
VALUES (%(namespace)s, %(name)s, %(tenant)s, %(url)s, %(secret)s, %(max_concurrency)s,
        %(event_types)s, %(timeout_seconds)s, %(paused)s,
        (hashtext(%(namespace)s || '/' || %(name)s)::bigint & 2147483647)
          %% (SELECT partition_count FROM hooklane_config),
        %(rate_per_second)s, %(rate_burst)s, %(adaptive_concurrency)s, %(max_attempts)s,
        %(max_age_seconds)s, %(request_terms)s, %(ordering_on_dead)s)
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
    ordering_on_dead = EXCLUDED.ordering_on_dead,
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
-- The old tenant's keys: their deliveries are discarded above (one in
-- flight settles as it may), so none is held or outstanding, and nothing of
-- the old tenant's shows (skipped) to the new one. A row is kept, not
-- deleted, for last_seq: a publish of the key numbers on after it, where
-- numbering from 1 again would collide in deliveries_ordering with the
-- settled deliveries and go backwards at the receiver.
released AS (
    UPDATE ordering_keys k
    SET head_seq = NULL, held_since = NULL, skipped = 0
    FROM upserted u, before b
    WHERE b.id = u.id
      AND b.tenant <> u.tenant
      AND k.endpoint_id = u.id
      AND (k.head_seq IS NOT NULL OR k.skipped <> 0)
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
       max_age_seconds, request_terms, ordering_on_dead
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
-- The outbox write: hooklane_try_publish_v3 (migration 0026), refusing in
-- its result rather than raising.
-- Parameters: id (NULL: one is made), tenant, type, data (jsonb text),
-- coalesce_key, traceparent (NULL: none), ordering_key (NULL: unordered).
-- Index: the function's (endpoints_tenant; primary key of events;
-- deliveries_coalesce; primary key of ordering_keys; deliveries_ordering).
SELECT event_id, stored, fanout, error_code, error_field, error_message
FROM hooklane_try_publish_v3(%(tenant)s, %(type)s, CAST(%(data)s AS jsonb), %(id)s, %(coalesce_key)s,
                             %(traceparent)s, %(ordering_key)s);

-- name: publish_many
-- Publish many events in one statement, as publish does one, in the
-- arrays' order (WITH ORDINALITY, and the lateral call made row by row in
-- it: the events of one ordering key take its numbers in that order);
-- returns the refused ones by position (1-based): the ingest API's group
-- commit and the notifications.
-- Parameters: ids, tenants, types, data (jsonb text), coalesce_keys,
-- traceparents, ordering_keys, arrays of equal length.
-- Index: the function's, per event.
SELECT x.position, p.error_code, p.error_field, p.error_message
FROM unnest(%(ids)s::text[], %(tenants)s::text[], %(types)s::text[], %(data)s::text[],
            %(coalesce_keys)s::text[], %(traceparents)s::text[], %(ordering_keys)s::text[])
       WITH ORDINALITY AS x(id, tenant, type, data, coalesce_key, traceparent, ordering_key, position)
CROSS JOIN LATERAL hooklane_try_publish_v3(x.tenant, x.type, x.data::jsonb, x.id, x.coalesce_key,
                                           x.traceparent, x.ordering_key) AS p
WHERE p.error_code IS NOT NULL
ORDER BY x.position;

-- name: purge_ordering_keys
-- Forget one batch of ordering keys with nothing outstanding whose last
-- publish is past retention (the events'), oldest first, once no delivery
-- of the key is left: retention took the delivered ones, and a dead one
-- stays until resent or discarded, its number unique among the key's. A
-- key that still has one waits another retention (its touched_at moved
-- on), so that the next batches reach the keys behind it. Returns how
-- many were looked at and how many deleted. A key published again starts
-- its numbering at 1 (docs/receivers.md).
-- Parameters: retention_seconds, batch_size.
-- The tenants' rows of keys not published for as long are forgotten with
-- them: their events are past retention too.
-- Index: ordering_keys_idle, from its start; deliveries_ordering per key;
-- ordering_positions_touched_at, from its start.
WITH candidates AS MATERIALIZED (
    SELECT o.ctid AS row_id,
           EXISTS (SELECT FROM deliveries d
                   WHERE d.endpoint_id = o.endpoint_id AND d.ordering_key = o.key
                     AND d.ordering_key IS NOT NULL) AS kept
    FROM ordering_keys o
    WHERE o.head_seq IS NULL
      AND o.touched_at < now() - make_interval(secs => %(retention_seconds)s)
    ORDER BY o.touched_at
    LIMIT %(batch_size)s
),
gone AS (
    DELETE FROM ordering_keys k
    USING candidates c
    WHERE k.ctid = c.row_id AND NOT c.kept
      AND k.head_seq IS NULL
      AND k.touched_at < now() - make_interval(secs => %(retention_seconds)s)
    RETURNING 1
),
-- Runs whether or not it is read, as every data-modifying WITH does.
deferred AS (
    UPDATE ordering_keys k
    SET touched_at = now()
    FROM candidates c
    WHERE k.ctid = c.row_id AND c.kept
),
positions AS (
    DELETE FROM ordering_positions o
    WHERE o.ctid IN (SELECT p.ctid FROM ordering_positions p
                     WHERE p.touched_at < now() - make_interval(secs => %(retention_seconds)s)
                     ORDER BY p.touched_at
                     LIMIT %(batch_size)s)
      AND o.touched_at < now() - make_interval(secs => %(retention_seconds)s)
    RETURNING 1
)
SELECT greatest((SELECT count(*) FROM candidates), (SELECT count(*) FROM positions)) AS scanned,
       (SELECT count(*) FROM gone) AS deleted;

-- name: purge_catalogue_refusals
-- Delete one batch of the catalogue's refusals past retention (the events'
-- retention: they are counted beside the events), oldest first; returns
-- how many.
-- Parameters: retention_seconds, batch_size.
-- Index: catalogue_refusals_refused_at, from its start.
WITH gone AS (
    DELETE FROM catalogue_refusals r
    WHERE r.ctid IN (SELECT o.ctid FROM catalogue_refusals o
                     WHERE o.refused_at < now() - make_interval(secs => %(retention_seconds)s)
                     ORDER BY o.refused_at
                     LIMIT %(batch_size)s)
    RETURNING 1
)
SELECT count(*) AS deleted FROM gone;

-- name: catalogue_check_installed
-- Whether hooklane_catalogue_problem_v1 exists (catalogue_check.sql ran):
-- a mode other than 'off' needs it.
-- Parameters: none. Index: pg_proc's on the name and arguments.
SELECT to_regprocedure('hooklane_catalogue_problem_v1(text, text)') IS NOT NULL;

-- name: server_major_version
-- The PostgreSQL server's major version, for the name of the PL/Python
-- package it needs (postgresql-plpython3-<major>).
-- Parameters: none. Index: none (a setting).
SELECT current_setting('server_version_num')::integer / 10000;

-- name: set_catalogue_mode
-- How a tenant's published events are checked against the catalogue
-- (tenant '': every tenant without a mode of its own).
-- Parameters: tenant, mode. Index: primary key of catalogue_modes (ON
-- CONFLICT).
INSERT INTO catalogue_modes (tenant, mode)
VALUES (%(tenant)s, %(mode)s)
ON CONFLICT (tenant) DO UPDATE SET mode = EXCLUDED.mode;

-- name: catalogue_modes
-- Every mode set, the default ('') first.
-- Parameters: none. Index: primary key of catalogue_modes (a table of a
-- row per tenant with a mode of its own).
SELECT tenant, mode FROM catalogue_modes ORDER BY tenant;

-- name: catalogue_mode_of
-- The mode a tenant's publishes are checked under, as
-- hooklane_try_publish_v1 reads it: its own row, else the default's, else
-- 'off'; and whether it is its own.
-- Parameters: tenant. Index: primary key of catalogue_modes.
SELECT coalesce((SELECT m.mode FROM catalogue_modes m WHERE m.tenant IN (%(tenant)s, '')
                 ORDER BY m.tenant DESC LIMIT 1), 'off') AS mode,
       EXISTS (SELECT FROM catalogue_modes m WHERE m.tenant = %(tenant)s) AS own;

-- name: catalogue_type_count
-- How many types the catalogue holds, archived ones included: `hooklane
-- catalogue mode enforce` warns when none is (every event would be refused).
-- Parameters: none. Index: primary key of catalogue_types (a count of a
-- table of a row per type).
SELECT count(*) FROM catalogue_types;

-- name: record_catalogue_refusals
-- The catalogue's refusals of an API batch refused whole: rolling back to
-- the batch's savepoint undid the rows the publish function wrote, and
-- the API's transaction goes on, so it writes them again.
-- Parameters: tenants, types, reasons, messages, arrays of equal length.
-- Index: none read (an insert; catalogue_refusals_refused_at is
-- maintained).
INSERT INTO catalogue_refusals (tenant, type, reason, message)
SELECT * FROM unnest(%(tenants)s::text[], %(types)s::text[], %(reasons)s::text[], %(messages)s::text[]);

-- name: pending_endpoints
-- The deliverable endpoints of the partitions with pending deliveries,
-- each with its head, read from `since` (NULL: the start) except the
-- partitions in `whole`: a worker taking partitions, and its sweep. One
-- row: checked_at and the endpoints, partitions and heads. A delivery
-- waiting behind its ordering key ('infinity') is no head: its key's
-- moving on wakes the endpoint.
-- Parameters: partitions, since, whole.
-- Index: endpoints_partition; deliveries_queue from where each is read.
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
      AND d.next_attempt_at < 'infinity'
) h
WHERE ep.partition = ANY(%(partitions)s::int[])
  AND hooklane_deliverable(ep)
  AND h.head IS NOT NULL;

-- name: published_since
-- The endpoints with pending deliveries of the events committed since the
-- snapshot `since` (NULL: the snapshot alone), with their partitions and
-- dues, the number of events and the next snapshot: the commit probe. An
-- endpoint whose new deliveries all wait behind their ordering keys
-- ('infinity') is not woken: its keys' moving on wakes it.
-- Parameters: since (a pg_snapshot as text, or NULL).
-- Index: the function's (events_xact; deliveries_event; primary key of
-- endpoints).
SELECT p.snapshot, p.events,
       coalesce(array_agg(w.endpoint_id ORDER BY w.endpoint_id) FILTER (WHERE w.due < 'infinity'), '{}')
         AS endpoint_ids,
       coalesce(array_agg(w.partition ORDER BY w.endpoint_id) FILTER (WHERE w.due < 'infinity'), '{}')
         AS partitions,
       coalesce(array_agg(w.due ORDER BY w.endpoint_id) FILTER (WHERE w.due < 'infinity'), '{}') AS dues
FROM hooklane_published_since_v1(%(since)s::text) p
LEFT JOIN LATERAL unnest(p.endpoint_ids, p.partitions, p.dues) AS w(endpoint_id, partition, due) ON true
GROUP BY p.snapshot, p.events;

-- name: hint_published
-- Tell the workers to probe now (published_since): the API's group commit
-- sends it once per group, from its own transaction, so that what it
-- stored is delivered without waiting for the probe's next turn. Workers
-- of earlier versions ignore the payload, which names no partition.
-- Parameters: none. Index: none.
SELECT pg_notify('hooklane_ready', 'published');

-- name: rescue_expired
-- Give back to the queue the deliveries of the partitions whose lease ran
-- out from `since` on (NULL: all), each recorded as a lease_expired retry.
-- One row: when judged, the next `since`, and the endpoints, partitions and
-- dues rescued. Under the partitions' advisory locks.
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
-- Reserve due deliveries of the candidates from their floors, tenant first
-- then endpoint, within caps and an optional tenant ceiling, and a verdict
-- row (NULL id) per candidate: hooklane_reserve_v8 (migration 0026: v7's,
-- with each delivery's ordering key and number). Under the partitions'
-- advisory locks.
-- Parameters: partitions (owned), candidates, floors, caps, apart, limit,
-- lease_grace_seconds, worker_id, lookahead_seconds, tenant_ceiling.
-- Index: primary key of endpoints, deliveries_leased,
-- deliveries_tenant_leased, deliveries_rate, deliveries_queue from each
-- floor, primary key of events (see the function).
SELECT * FROM hooklane_reserve_v8(%(partitions)s::int[], %(candidates)s::bigint[],
                                  %(floors)s::timestamptz[], %(caps)s::int[],
                                  %(apart)s::boolean[], %(limit)s,
                                  %(lease_grace_seconds)s, %(worker_id)s, %(lookahead_seconds)s,
                                  %(tenant_ceiling)s::int);

-- name: complete
-- Record a batch of results, fenced by (state, attempts), with their
-- attempts, and fold them into each endpoint's circuit and limit, then
-- move on the keys of its ordered deliveries: hooklane_complete_v6
-- (migration 0026). Returns each touched endpoint.
-- Parameters (arrays of equal length): ids, attempts, outcomes, retry_ins,
-- statuses, errors, failures, started_ats, durations, retry_afters,
-- trace_ids; then worker_id, threshold, step_seconds, cap_seconds,
-- partitions (owned), delivered_step_seconds, adapt_step_seconds; then
-- ordered_endpoints and ordered_keys (one pair per ordered delivery).
-- Index: primary keys of deliveries, endpoints and ordering_keys,
-- deliveries_ordering (see the functions); the attempts go to today's
-- partition.
SELECT id, partition, namespace, name, state, paused_until, consecutive_failures, deliverable,
       retried_head, opened, deactivated, throttled_until, effective_concurrency, lowered,
       ordering_busy
FROM hooklane_complete_v6(%(ids)s::bigint[], %(attempts)s::int[], %(outcomes)s::text[],
                          %(retry_ins)s::float8[], %(statuses)s::int[], %(errors)s::text[],
                          %(failures)s::text[], %(started_ats)s::timestamptz[],
                          %(durations)s::float8[], %(retry_afters)s::float8[],
                          %(trace_ids)s::text[], %(worker_id)s,
                          %(threshold)s, %(step_seconds)s, %(cap_seconds)s,
                          %(partitions)s::int[], %(delivered_step_seconds)s,
                          %(adapt_step_seconds)s, %(ordered_endpoints)s::bigint[],
                          %(ordered_keys)s::text[]);

-- name: ordering_sweep
-- Move on the keys of the owned partitions whose head settled without
-- their key moving (a key a publisher held when its head was recorded, a
-- worker that died, an endpoint whose policy became 'skip'), walking the
-- outstanding keys a page after the cursor (after_endpoint, after_key;
-- NULLs: from the first): hooklane_ordering_sweep_v2 (migration 0027).
-- Under the partitions' advisory locks. Returns where the next page
-- starts (NULL: the walk is over) and each delivery made due, as its
-- endpoint, partition, key and due time.
-- Parameters: partitions (owned), after_endpoint, after_key, page.
-- Index: ordering_keys_outstanding_keys from the cursor, endpoints' primary
-- key, deliveries_ordering (see the function).
SELECT next_endpoint, next_key, woken_endpoints, woken_partitions, woken_keys, woken_dues
FROM hooklane_ordering_sweep_v2(%(partitions)s::int[], %(after_endpoint)s::bigint, %(after_key)s::text,
                                %(page)s::int);

-- name: ordering_advance
-- Move on the given keys (endpoint, key) whose head settled outside the
-- worker's recording (discarded by hand), or while a publisher held them,
-- notifying the owner of each endpoint given a due delivery:
-- hooklane_ordering_advance_v1 (migration 0026). Keys still held come back
-- with a NULL due.
-- Parameters: endpoint_ids, keys.
-- Index: primary keys of ordering_keys and endpoints, deliveries_ordering.
SELECT endpoint_id, partition, key, due
FROM hooklane_ordering_advance_v1(%(endpoint_ids)s::bigint[], %(keys)s::text[], NULL);

-- name: ordering_requeue
-- Queue resent or replayed deliveries of ordered events behind their keys
-- (a resent head is due at once): hooklane_ordering_requeue_v1 (migration
-- 0026). In the transaction that set them pending.
-- Parameters: ids.
-- Index: primary keys of deliveries and ordering_keys, deliveries_ordering.
SELECT endpoint_id, partition, due FROM hooklane_ordering_requeue_v1(%(ids)s::bigint[]);

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
-- The oldest holder of this database's xmin horizon (a backend, a
-- prepared transaction, a replication slot or a standby), by xid age; one
-- row always, all NULL but `visible` when nothing holds it.
-- Parameters: none. Index: none (statistics and replication views).
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
-- Live and dead rows of each of Hooklane's tables and their vacuums, from
-- the statistics system.
-- Parameters: tables (store/horizon.py reads them from schema.sql).
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
-- Delete one batch of events past retention, after the cursor, with their
-- finished deliveries; returns how many were looked at and deleted, and
-- the next cursor.
-- Parameters: retention_seconds, after_at, after_tenant, after_id,
-- batch_size.
-- Index: events_created_at from the cursor; deliveries_event per event.
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
-- Resend one page of an endpoint's dead deliveries (all, or `ids`) after
-- a delivery id: a new life, first_created_at kept. One row per page if the
-- endpoint exists (with `tenant`, when given), with the ids of the
-- deliveries of ordered events it set pending (`ordered`), which wait for
-- ordering_requeue, in the same transaction, to place them behind their
-- keys.
-- Parameters: namespace, name, tenant, ids, after, page_size.
-- Index: the unique (namespace, name) constraint; deliveries_dead from the
-- position.
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
    SET state = 'pending', attempts = 0,
        next_attempt_at = CASE WHEN d.ordering_key IS NULL THEN now() ELSE 'infinity' END,
        first_created_at = coalesce(d.first_created_at, d.created_at), created_at = now(),
        last_error = NULL, last_status = NULL, last_failure = NULL
    FROM page p, endpoint ep
    WHERE d.id = p.id
      AND d.state = 'dead'
      AND d.event_tenant = ep.tenant
    RETURNING d.id, ep.id AS endpoint_id, ep.partition, d.ordering_key
),
woken AS (
    SELECT hooklane_wake_v2(array_agg(r.endpoint_id), array_agg(r.partition), array_agg(now()))
    FROM (SELECT DISTINCT endpoint_id, partition FROM resent) r
)
SELECT (SELECT count(*) FROM resent) AS done,
       (SELECT count(*) FROM page) AS scanned,
       (SELECT max(p.id) FROM page p) AS last,
       (SELECT array_agg(r.id) FROM resent r WHERE r.ordering_key IS NOT NULL) AS ordered
FROM endpoint, woken;

-- name: list_events
-- A page of one tenant's events created in [since, until), in (xact, id)
-- order after the cursor, of transactions below the snapshot's xmin only.
-- Parameters: tenant, cursor_xact, cursor_id, since, until, limit.
-- Index: events_tenant_xact, index-only; primary key of events for the
-- page's rows.
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
-- Per endpoint: spec, circuit, queue (pending, in flight, dead), sending
-- workers, oldest pending age and keys held (ordered delivery), with
-- `observed_at`, most delayed first; pending counted from the ready
-- list's floors when given.
-- Parameters: partitions, namespace, name (NULL: all); floor_ids, floors,
-- listed.
-- Index: endpoints_partition or the unique (namespace, name) constraint;
-- deliveries_queue from each floor, deliveries_leased, deliveries_dead,
-- ordering_keys_held, each per endpoint.
SELECT ep.id, ep.namespace, ep.name, ep.tenant, ep.url, ep.state, ep.paused,
       ep.secret IS NOT NULL AS signed, ep.max_concurrency, ep.consecutive_failures,
       hooklane_concurrency(ep) AS effective_concurrency, ep.adaptive_concurrency,
       ep.rate_per_second, ep.rate_burst, ep.throttled_until,
       ep.paused_until, ep.last_error, ep.last_delivered_at, ep.deactivated_reason, ep.ordering_on_dead,
       q.pending, extract(epoch FROM now() - q.oldest) AS oldest_pending_age,
       f.in_flight, f.sending_on, x.dead,
       (SELECT count(*) FROM ordering_keys k
        WHERE k.endpoint_id = ep.id AND k.held_since IS NOT NULL) AS held_keys,
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
-- A page of endpoints with their health, most delayed first, keyset-paged
-- on (oldest_pending_at, namespace, name); pending from fresh
-- queue_summaries (hooklane_queue_counts) where there are some. Filters:
-- tenant, name prefix, phase (hooklane_phase), hooklane_not_delivering.
-- Parameters: tenant, name_prefix, phase, not_delivering,
-- cursor_oldest_pending_at, cursor_namespace, cursor_name, limit.
-- Index: deliveries_queue for endpoints no fresh summary holds; for the
-- page, deliveries_leased, deliveries_dead and ordering_keys_held.
WITH chosen AS (
    SELECT ep.id, ep.namespace, ep.name, ep.tenant, ep.url, ep.state, ep.paused,
           ep.secret IS NOT NULL AS signed, ep.max_concurrency, ep.consecutive_failures,
           hooklane_concurrency(ep) AS effective_concurrency, ep.adaptive_concurrency,
           ep.rate_per_second, ep.rate_burst, ep.throttled_until,
           ep.paused_until, ep.last_error, ep.last_delivered_at, ep.deactivated_reason,
           ep.ordering_on_dead
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
           s.paused_until, s.last_error, s.last_delivered_at, s.deactivated_reason, s.ordering_on_dead,
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
       (SELECT count(*) FROM ordering_keys k
        WHERE k.endpoint_id = p.id AND k.held_since IS NOT NULL) AS held_keys,
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
-- Totals over the endpoints endpoint_page's filters choose: how many, how
-- many not delivering, their pending, in-flight and dead deliveries.
-- Parameters: tenant, name_prefix, phase, not_delivering.
-- Index: deliveries_queue and deliveries_leased per endpoint;
-- deliveries_dead read once (hooklane_queue_counts for the summaries).
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

-- name: endpoint_chart
-- The charts of an endpoint's page (hooklane/charts.py): its attempts in
-- each of the last `buckets` buckets of `bucket_seconds`, cut on the Unix
-- epoch (UTC hours and days), the last one holding now(), counted by
-- outcome, with the median and the 99th percentile of the timed ones'
-- durations (a lease that ran out has none, which percentile_cont leaves
-- out). A row per bucket, oldest first; none when there is no such
-- endpoint. One statement for both charts of a page; each bucket is a
-- range of its own, aggregated as it is read: no sort of the whole span
-- (which spilt to disk for a busy endpoint's week), only each bucket's
-- durations for their percentiles.
-- Parameters: namespace, name, bucket_seconds, buckets.
-- Index: the unique (namespace, name) constraint;
-- delivery_attempts_endpoint_chart, a range per bucket, in the partition
-- of its day (pruned at execution), read from the index alone where the
-- visibility map allows: docs/benchmarks.md, section 19.
WITH span AS (
    SELECT make_interval(secs => %(bucket_seconds)s::float8) AS width,
           date_bin(make_interval(secs => %(bucket_seconds)s::float8), now(),
                    timestamptz '1970-01-01 00:00:00+00') AS last
)
SELECT ep.id AS endpoint_id, b.bucket, c.*
FROM endpoints ep
CROSS JOIN span s
CROSS JOIN LATERAL generate_series(s.last - (%(buckets)s::int - 1) * s.width, s.last, s.width) AS b(bucket)
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE a.outcome = 'delivered') AS delivered,
           count(*) FILTER (WHERE a.outcome = 'retry') AS retry,
           count(*) FILTER (WHERE a.outcome = 'dead') AS dead,
           count(*) FILTER (WHERE a.outcome = 'discarded') AS discarded,
           percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY a.duration_seconds) AS latency
    FROM delivery_attempts a
    WHERE a.endpoint_id = ep.id
      AND a.recorded_at >= b.bucket
      AND a.recorded_at < b.bucket + s.width
) c
WHERE ep.namespace = %(namespace)s AND ep.name = %(name)s
ORDER BY b.bucket;

-- name: write_queue_summaries
-- Store what a worker's gauge pass counted: a queue_summaries row per
-- partition, fresh for `fresh_seconds`, unless a later count wrote it.
-- Parameters: partitions, counted_at, fresh_seconds; endpoint_ids,
-- pending and oldest_pending_at (arrays of the same length).
-- Index: primary key of endpoints; queue_summaries' primary key.
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
-- A page of an endpoint's deliveries, newest first, before `before_id`,
-- filtered by states, time, last status and failure class. A NULL-id row
-- when it has none there, no row when there is no such endpoint. An
-- ordered delivery with its key and number; one waiting behind its key
-- (next_attempt_at 'infinity', migration 0026) has no next attempt.
-- Parameters: namespace, name, states, since, until, status_min,
-- status_max, failure, before_id, limit.
-- Index: the unique (namespace, name) constraint; deliveries_endpoint;
-- primary key of events.
SELECT ep.id AS endpoint_id, p.*
FROM endpoints ep
LEFT JOIN LATERAL (
    SELECT d.id, d.event_id, e.type AS event_type, d.state, d.attempts, d.attempted_by,
           coalesce(d.first_created_at, d.created_at) AS created_at, d.created_at AS queued_at,
           CASE WHEN d.state = 'pending' AND d.next_attempt_at < 'infinity' THEN d.next_attempt_at END
             AS next_attempt_at,
           d.delivered_at, d.last_status, d.last_failure, d.last_error, d.ordering_key, d.ordering_seq
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
-- creation, or its latest resend: what its age counts from). Its ordering
-- key and number, as endpoint_deliveries.
-- Parameters: id, namespace (or NULL), name (or NULL).
-- Index: primary keys of deliveries, endpoints and events.
SELECT d.id, d.event_id, e.type AS event_type, d.event_tenant AS tenant, d.state, d.attempts,
       d.attempted_by, coalesce(d.first_created_at, d.created_at) AS created_at, d.created_at AS queued_at,
       CASE WHEN d.state = 'pending' AND d.next_attempt_at < 'infinity' THEN d.next_attempt_at END
         AS next_attempt_at,
       d.delivered_at, d.last_status, d.last_failure, d.last_error, d.ordering_key, d.ordering_seq,
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

-- name: delivery_payload
-- What a delivery's request carried, for the delivery pages: its event's
-- id, type, creation and data as the reservation reads them
-- (hooklane_reserve_v7: data::text, which the worker splices into the body
-- as is), the trace context it was published under, the endpoint's sealed
-- request terms (its extra headers), and of its latest attempt on this
-- event when it started (the webhook-timestamp it was sent with) and the
-- trace id the receiver got; an ordered delivery's key and number. When
-- `namespace` and `name` are given, only if it is that endpoint's. No row
-- when there is none.
-- Parameters: id, namespace (or NULL), name (or NULL).
-- Index: primary keys of deliveries, endpoints and events;
-- delivery_attempts_delivery of each partition for the latest attempt.
SELECT e.id AS event_id, e.type, e.created_at, e.data::text AS data, e.traceparent,
       ep.request_terms, ep.namespace, ep.name, last.started_at AS last_started_at,
       last.trace_id AS last_trace_id, d.ordering_key, d.ordering_seq
FROM deliveries d
JOIN endpoints ep ON ep.id = d.endpoint_id
JOIN events e ON e.tenant = d.event_tenant AND e.id = d.event_id
LEFT JOIN LATERAL (
    SELECT a.started_at, a.trace_id
    FROM delivery_attempts a
    WHERE a.delivery_id = d.id AND a.event_id = d.event_id
    ORDER BY a.recorded_at DESC, a.attempt DESC
    LIMIT 1
) last ON true
WHERE d.id = %(id)s
  AND (%(namespace)s::text IS NULL OR (ep.namespace = %(namespace)s AND ep.name = %(name)s));

-- name: event_type_counts
-- Per event type, across tenants: the events kept although no endpoint
-- matched them (unrouted) since `since` and in all (as long as they are
-- retained); the publishes the catalogue's check refused since `since`,
-- by reason; and the events it stored marked since `since`: under 'warn'
-- (schema_problem), or of a deprecated type. The types with the most
-- since `since` first, then the most unrouted in all, then by name;
-- `limit` of them after `offset` (a page), each row with the number of
-- types there are (`types`).
-- Parameters: since, limit, offset.
-- Index: events_unrouted, a partial index holding the unrouted events
-- only (so its whole is read: as many entries as unrouted events are
-- retained, however many routed ones there are); catalogue_refusals_refused_at
-- for the refusals since `since` (the range only); events_schema_problem
-- and events_schema_deprecated, partial, for the marked events (the range
-- of each, combined by a BitmapOr).
WITH unrouted AS (
    SELECT e.type, count(*) AS total, count(*) FILTER (WHERE e.created_at >= %(since)s) AS recent
    FROM events e
    WHERE e.fanout = 0
    GROUP BY e.type
), refused AS (
    SELECT r.type,
           count(*) FILTER (WHERE r.reason = 'unknown') AS unknown,
           count(*) FILTER (WHERE r.reason = 'archived') AS archived,
           count(*) FILTER (WHERE r.reason = 'schema') AS schema
    FROM catalogue_refusals r
    WHERE r.refused_at >= %(since)s
    GROUP BY r.type
), marked AS (
    SELECT e.type,
           count(*) FILTER (WHERE e.schema_problem IS NOT NULL) AS warned,
           count(*) FILTER (WHERE e.schema_deprecated) AS deprecated
    FROM events e
    WHERE (e.schema_problem IS NOT NULL AND e.created_at >= %(since)s)
       OR (e.schema_deprecated AND e.created_at >= %(since)s)
    GROUP BY e.type
), counted AS (
    SELECT t.type,
           coalesce(u.recent, 0) AS unrouted_recent, coalesce(u.total, 0) AS unrouted_total,
           coalesce(r.unknown, 0) AS refused_unknown, coalesce(r.archived, 0) AS refused_archived,
           coalesce(r.schema, 0) AS refused_schema,
           coalesce(m.warned, 0) AS warned_recent, coalesce(m.deprecated, 0) AS deprecated_recent
    FROM (SELECT type FROM unrouted UNION SELECT type FROM refused UNION SELECT type FROM marked) t
    LEFT JOIN unrouted u ON u.type = t.type
    LEFT JOIN refused r ON r.type = t.type
    LEFT JOIN marked m ON m.type = t.type
)
SELECT c.*, count(*) OVER () AS types
FROM counted c
ORDER BY c.unrouted_recent + c.refused_unknown + c.refused_archived + c.refused_schema
         + c.warned_recent + c.deprecated_recent DESC,
         c.unrouted_total DESC, c.type
LIMIT %(limit)s OFFSET %(offset)s;

-- name: endpoint_attempts
-- A page of an endpoint's attempts recorded in [since, until), newest
-- first, after the cursor, filtered by outcome, status and failure class.
-- Parameters: namespace, name, since, until, outcomes, status_min,
-- status_max, failure, after_at, after_delivery, after_attempt, limit.
-- Each with its delivery's ordering key and number (NULL: unordered, or
-- the delivery gone).
-- Index: the unique (namespace, name) constraint;
-- delivery_attempts_endpoint_chart from `until` down to `since`; the
-- primary key of deliveries for each attempt of the page.
SELECT ep.id AS endpoint_id, p.*
FROM endpoints ep
LEFT JOIN LATERAL (
    SELECT a.delivery_id, a.event_id, a.attempt, a.attempted_by, a.started_at,
           a.duration_seconds, a.outcome, a.status, a.failure, a.error,
           a.retry_after_seconds, a.next_attempt_at, a.trace_id, a.recorded_at,
           (SELECT d.ordering_key FROM deliveries d WHERE d.id = a.delivery_id) AS ordering_key,
           (SELECT d.ordering_seq FROM deliveries d WHERE d.id = a.delivery_id) AS ordering_seq
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
-- Discard for good one page of an endpoint's dead deliveries (all, or
-- `ids`) after a delivery id, noting `by` in last_error. One row per page
-- if the endpoint exists, with the keys of the ordered ones discarded
-- (ordered_endpoints, ordered_keys), for ordering_advance to move on in the
-- same transaction.
-- Parameters: namespace, name, ids, by, after, page_size.
-- Index: the unique (namespace, name) constraint; deliveries_dead from the
-- position.
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
    RETURNING d.id, d.endpoint_id, d.ordering_key
)
SELECT (SELECT count(*) FROM discarded) AS done,
       (SELECT count(*) FROM page) AS scanned,
       (SELECT max(p.id) FROM page p) AS last,
       (SELECT array_agg(x.endpoint_id) FROM discarded x WHERE x.ordering_key IS NOT NULL)
         AS ordered_endpoints,
       (SELECT array_agg(x.ordering_key) FROM discarded x WHERE x.ordering_key IS NOT NULL)
         AS ordered_keys
FROM endpoint;

-- name: endpoint_tenant
-- The tenant of one endpoint, which replay_since then takes as a value.
-- Parameters: namespace, name. Index: the unique (namespace, name)
-- constraint.
SELECT tenant FROM endpoints WHERE namespace = %(namespace)s AND name = %(name)s;

-- name: replay_since
-- Queue again, one page in (xact, id) order after the cursor, the events
-- of the endpoint's tenant since a time whose type it receives
-- (hooklane_type_matches) and that it has nothing pending or in flight
-- for; wakes it. One row per page if the endpoint exists with that tenant,
-- with the ids of the deliveries of ordered events it queued (`ordered`).
-- Parameters: namespace, name, tenant, since, cursor_xact, cursor_id,
-- page_size.
-- Index: the unique (namespace, name) constraint; events_tenant_xact,
-- events_created_at or the primary key of events; deliveries_event.
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
-- An ordered event's delivery waits (at 'infinity') for ordering_requeue,
-- in the same transaction, to place it behind its key.
replayed AS (
    INSERT INTO deliveries (endpoint_id, event_tenant, event_id, ordering_key, next_attempt_at)
    SELECT ep.id, ep.tenant, e.id, e.ordering_key,
           CASE WHEN e.ordering_key IS NULL THEN now() ELSE 'infinity' END
    FROM page p
    JOIN events e ON e.tenant = p.tenant AND e.id = p.id
    CROSS JOIN endpoint ep
    WHERE hooklane_type_matches(ep.event_types, e.type)
      AND NOT EXISTS (SELECT 1 FROM deliveries o
                      WHERE o.event_tenant = ep.tenant
                        AND o.event_id = e.id
                        AND o.endpoint_id = ep.id
                        AND o.state IN ('pending', 'sending'))
    -- A key's events in the order they committed (the ids, in this order,
    -- are what ordering_requeue numbers them by); the transaction ids
    -- follow the order transactions began.
    ORDER BY e.ordering_key, e.ordering_position, p.xact, p.id
    RETURNING id, endpoint_id, ordering_key
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
       (SELECT l.id FROM last l) AS id,
       (SELECT array_agg(r.id ORDER BY r.id) FROM replayed r WHERE r.ordering_key IS NOT NULL) AS ordered
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

-- name: catalogue_page
-- A page of the event catalogue's types by name, after the previous page's
-- last name (NULL: from the first), of one group and with a name prefix
-- when asked.
-- Parameters: after, type_group, name_prefix, limit.
-- Index: catalogue_types_pkey (the keyset by name; the group and the prefix
-- filter that scan: a catalogue holds hundreds of types, not millions).
SELECT name, description, type_group, deprecated_since, archived
FROM catalogue_types
WHERE (%(after)s::text IS NULL OR name > %(after)s::text)
  AND (%(type_group)s::text IS NULL OR type_group = %(type_group)s::text)
  AND (%(name_prefix)s::text IS NULL OR starts_with(name, %(name_prefix)s::text))
ORDER BY name
LIMIT %(limit)s;

-- name: catalogue_type
-- One type of the event catalogue by its name.
-- Parameters: name. Index: catalogue_types_pkey.
SELECT name, description, type_group, deprecated_since, archived
FROM catalogue_types
WHERE name = %(name)s;

-- name: catalogue_versions_of
-- Every version of the given types, each type's oldest first.
-- Parameters: types. Index: catalogue_versions_pkey.
SELECT type, version, schema::text AS schema, example::text AS example
FROM catalogue_versions
WHERE type = ANY(%(types)s::text[])
ORDER BY type, version;

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
-- The operator's status pass: endpoint_health's rows with a `digest`, of
-- the endpoints whose digest differs from the one reflected last, and the
-- known ones gone (NULL id, `known_id`).
-- Parameters: ids and digests (reflected last), age_step (seconds).
-- Index: as endpoint_health (ordering_keys_held per endpoint for its keys
-- held); the primary key for the known ids.
WITH health AS (
    SELECT ep.id, ep.namespace, ep.name, ep.tenant, ep.url, ep.state, ep.paused,
           ep.secret IS NOT NULL AS signed, ep.max_concurrency, ep.consecutive_failures,
           hooklane_concurrency(ep) AS effective_concurrency, ep.adaptive_concurrency,
           ep.rate_per_second, ep.rate_burst, ep.throttled_until,
           ep.paused_until, ep.last_error, ep.last_delivered_at, ep.deactivated_reason, ep.ordering_on_dead,
           count(d.id) FILTER (WHERE d.state = 'pending') AS pending,
           extract(epoch FROM now() - min(d.created_at) FILTER (WHERE d.state = 'pending'))
             AS oldest_pending_age,
           count(d.id) FILTER (WHERE d.state = 'sending') AS in_flight,
           array_agg(DISTINCT d.attempted_by ORDER BY d.attempted_by)
             FILTER (WHERE d.state = 'sending' AND d.attempted_by IS NOT NULL) AS sending_on,
           count(d.id) FILTER (WHERE d.state = 'dead') AS dead,
           (SELECT count(*) FROM ordering_keys k
            WHERE k.endpoint_id = ep.id AND k.held_since IS NOT NULL) AS held_keys,
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
                   h.pending, h.in_flight, h.dead, h.held_keys,
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

-- Tenant portal (hooklane/store/grants.py; migration 0013).

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
       max_age_seconds, request_terms, ordering_on_dead
FROM endpoints
WHERE namespace = %(namespace)s AND name = %(name)s;

-- Operational notifications (hooklane/store/notifications.py; migration 0014).

-- name: note_notices
-- Note in endpoint_notices the circuits opened, deactivations and dead
-- attempts since the last run, up to a cut `settle_seconds` ago, and make
-- each due. One row: the cut, the next `since` and the counts noted.
-- Parameters: tenant (the notifications tenant), since, lookback_seconds,
-- settle_seconds, interval_seconds.
-- Index: endpoints_paused_until, endpoints_deactivated_at,
-- delivery_attempts_dead, each from `since`; primary keys of endpoints and
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
-- Take (lock, clear and return) the notices due, at most `limit`, each
-- with what it tells; skips those another run holds.
-- Parameters: tenant (the notifications tenant), settle_seconds, limit.
-- Index: endpoint_notices_due; primary key of endpoints;
-- delivery_attempts_endpoint_dead from each endpoint's last count.
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
-- EXECUTE on hooklane_try_publish_v1, _v2, _v3 and _v4, in that order
-- (false for a version the schema has not yet: an older one, migrating).
-- The owner, its members and superusers are left out: they publish for
-- every tenant without a scope.
-- Parameters: none. Index: none (a scan of a table of a few rows per role,
-- and of pg_roles).
WITH owner AS (
    SELECT proowner AS oid FROM pg_proc
    WHERE oid = 'hooklane_try_publish_v1(text, text, jsonb, text, text, text)'::regprocedure
),
roles AS (
    SELECT r.rolname AS role,
           array_agg(coalesce(has_function_privilege(r.oid, to_regprocedure(f.signature)::oid, 'EXECUTE'),
                              false)
                     ORDER BY f.version) AS execute
    FROM pg_roles r, owner,
         (VALUES (1, 'hooklane_try_publish_v1(text, text, jsonb, text, text, text)'),
                 (2, 'hooklane_try_publish_v2(text, text, text, text, text, text)'),
                 (3, 'hooklane_try_publish_v3(text, text, jsonb, text, text, text, text)'),
                 (4, 'hooklane_try_publish_v4(text, text, text, text, text, text, text)')) AS f(version, signature)
    WHERE NOT pg_has_role(r.oid, owner.oid, 'MEMBER')
    GROUP BY r.rolname
)
SELECT coalesce(s.role, r.role) AS role,
       coalesce(s.tenants, '{}') AS tenants,
       coalesce(r.execute, '{}') AS execute
FROM (SELECT role, array_agg(tenant ORDER BY tenant NULLS FIRST) AS tenants
      FROM publisher_scopes GROUP BY role) AS s
FULL JOIN (SELECT * FROM roles WHERE true = ANY (execute)) AS r ON r.role = s.role
ORDER BY 1;

-- The event catalogue: applied types (operator, CLI)

-- name: upsert_catalogue_type
-- Create or update one event type of the catalogue, unless the other
-- source wrote it: a type the CLI applied ('local') is not overwritten by
-- the operator ('kubernetes'), nor the other way round. No row comes back
-- then. updated_at moves only when something changed.
-- Parameters: name, description, type_group, deprecated_since, archived,
-- source. Index: catalogue_types primary key (name).
INSERT INTO catalogue_types AS t (name, description, type_group, deprecated_since, archived, source)
VALUES (%(name)s, %(description)s, %(type_group)s, %(deprecated_since)s, %(archived)s, %(source)s)
ON CONFLICT (name) DO UPDATE
SET description = EXCLUDED.description,
    type_group = EXCLUDED.type_group,
    deprecated_since = EXCLUDED.deprecated_since,
    archived = EXCLUDED.archived,
    updated_at = CASE
        WHEN (t.description, t.type_group, t.deprecated_since, t.archived)
             IS DISTINCT FROM (EXCLUDED.description, EXCLUDED.type_group, EXCLUDED.deprecated_since,
                               EXCLUDED.archived)
        THEN now() ELSE t.updated_at END
WHERE t.source = EXCLUDED.source
RETURNING (xmax = 0) AS created;

-- name: upsert_catalogue_versions
-- Write every listed version of a type (its schema, example and the
-- schema's digest, md5 of its jsonb text), in the arrays' order; a version
-- whose schema and example are unchanged is not written again.
-- Parameters: name, versions (integer[]), schemas (text[] of JSON),
-- examples (text[] of JSON). Index: catalogue_versions primary key.
INSERT INTO catalogue_versions AS v (type, version, schema, example, digest)
SELECT %(name)s, l.version, CAST(l.schema AS jsonb), CAST(l.example AS jsonb), md5(CAST(l.schema AS jsonb)::text)
FROM unnest(%(versions)s::integer[], %(schemas)s::text[], %(examples)s::text[]) AS l (version, schema, example)
ON CONFLICT (type, version) DO UPDATE
SET schema = EXCLUDED.schema, example = EXCLUDED.example, digest = EXCLUDED.digest
WHERE (v.schema, v.example) IS DISTINCT FROM (EXCLUDED.schema, EXCLUDED.example)
RETURNING version;

-- name: delete_catalogue_versions_unlisted
-- Remove the versions of a type its spec no longer lists.
-- Parameters: name, versions (integer[]). Index: catalogue_versions
-- primary key (type, version), by its leading column.
DELETE FROM catalogue_versions
WHERE type = %(name)s AND version <> ALL (%(versions)s::integer[])
RETURNING version;

-- name: catalogue_type_source
-- Who wrote a type, if anyone: 'kubernetes' or 'local'.
-- Parameters: name. Index: catalogue_types primary key (name).
SELECT source FROM catalogue_types WHERE name = %(name)s;

-- name: delete_catalogue_type
-- Remove a type and, by the foreign key's cascade, its versions, when this
-- source wrote it; the other source's row of the same name stays.
-- Parameters: name, source. Index: catalogue_types primary key (name);
-- catalogue_versions primary key for the cascade.
DELETE FROM catalogue_types WHERE name = %(name)s AND source = %(source)s
RETURNING name;

-- name: catalogue_types_applied
-- Every type of the catalogue by name, with its latest version and how
-- many versions it has: `hooklane eventtype list`.
-- Parameters: none. Index: catalogue_types primary key, in order;
-- catalogue_versions primary key per type.
SELECT t.name, t.type_group, t.deprecated_since, t.archived, t.source, t.updated_at,
       v.latest, coalesce(v.versions, 0) AS versions
FROM catalogue_types t
LEFT JOIN LATERAL (
    SELECT max(version) AS latest, count(*) AS versions FROM catalogue_versions WHERE type = t.name
) AS v ON true
ORDER BY t.name;

-- Ordered delivery (migration 0026): what people see.

-- name: endpoint_ordering
-- An endpoint's ordering state: its keys with something outstanding, the
-- keys held (their head dead under ordering_on_dead 'hold') and since when
-- the oldest, the deliveries waiting behind their key, and the dead
-- deliveries its keys went on past (skipped, still kept: a resend queues
-- them at their key's tail). No row when there is no such endpoint.
-- Parameters: namespace, name.
-- Index: the unique (namespace, name) constraint;
-- ordering_keys_outstanding_keys and ordering_keys_held per endpoint;
-- deliveries_queue from 'infinity' (what waits behind a key is queued
-- there); deliveries_dead with the primary key of ordering_keys for each
-- dead ordered delivery.
SELECT ep.id AS endpoint_id, ep.ordering_on_dead,
       (SELECT count(*) FROM ordering_keys k
        WHERE k.endpoint_id = ep.id AND k.head_seq IS NOT NULL) AS keys_outstanding,
       h.keys_held, h.oldest_held_since,
       (SELECT count(*) FROM deliveries d
        WHERE d.endpoint_id = ep.id AND d.state = 'pending' AND d.next_attempt_at = 'infinity'
          AND d.ordering_key IS NOT NULL) AS waiting,
       (SELECT count(*) FROM deliveries d
        WHERE d.endpoint_id = ep.id AND d.state = 'dead' AND d.ordering_key IS NOT NULL
          AND NOT EXISTS (SELECT FROM ordering_keys k
                          WHERE k.endpoint_id = d.endpoint_id AND k.key = d.ordering_key
                            AND k.held_since IS NOT NULL AND k.head_seq = d.ordering_seq)) AS skipped,
       now() AS observed_at
FROM endpoints ep
CROSS JOIN LATERAL (
    SELECT count(*) AS keys_held, min(k.held_since) AS oldest_held_since
    FROM ordering_keys k
    WHERE k.endpoint_id = ep.id AND k.held_since IS NOT NULL
) h
WHERE ep.namespace = %(namespace)s AND ep.name = %(name)s;

-- name: held_keys
-- A page of an endpoint's held keys, held longest first, after the cursor
-- (held_since, key): each with its head (the dead delivery that holds it:
-- id, event, attempts and last answer) and how many deliveries wait behind
-- it. A NULL-key row when it has none there, no row when there is no such
-- endpoint.
-- Parameters: namespace, name, after_at, after_key, limit.
-- Index: the unique (namespace, name) constraint; ordering_keys_held from
-- the cursor; deliveries_ordering for each key's head and what waits
-- behind it; primary key of events.
SELECT ep.id AS endpoint_id, p.*
FROM endpoints ep
LEFT JOIN LATERAL (
    SELECT k.key, k.held_since, k.head_seq, hd.id AS delivery_id, hd.event_id, e.type AS event_type,
           hd.attempts, hd.last_status, hd.last_failure, hd.last_error,
           (SELECT count(*) FROM deliveries w
            WHERE w.endpoint_id = k.endpoint_id AND w.ordering_key = k.key
              AND w.ordering_seq > k.head_seq AND w.state = 'pending') AS waiting
    FROM ordering_keys k
    LEFT JOIN deliveries hd
           ON hd.endpoint_id = k.endpoint_id AND hd.ordering_key = k.key AND hd.ordering_seq = k.head_seq
    LEFT JOIN events e ON e.tenant = hd.event_tenant AND e.id = hd.event_id
    WHERE k.endpoint_id = ep.id
      AND k.held_since IS NOT NULL
      AND k.held_since >= coalesce(%(after_at)s::timestamptz, '-infinity')
      AND (k.held_since, k.key) > (coalesce(%(after_at)s::timestamptz, '-infinity'),
                                   coalesce(%(after_key)s::text, ''))
    ORDER BY k.held_since, k.key
    LIMIT %(limit)s
) p ON true
WHERE ep.namespace = %(namespace)s AND ep.name = %(name)s
ORDER BY p.held_since, p.key;

-- name: held_key_counts
-- Of the endpoints `ids`, those with held keys: how many, and since when
-- the oldest (`hooklane status`), most held first.
-- Parameters: ids.
-- Index: ordering_keys_held per endpoint; primary key of endpoints.
SELECT ep.namespace, ep.name, ep.tenant, h.keys_held, h.oldest_held_since
FROM endpoints ep
CROSS JOIN LATERAL (
    SELECT count(*) AS keys_held, min(k.held_since) AS oldest_held_since
    FROM ordering_keys k
    WHERE k.endpoint_id = ep.id AND k.held_since IS NOT NULL
) h
WHERE ep.id = ANY(%(ids)s::bigint[])
  AND h.keys_held > 0
ORDER BY h.keys_held DESC, ep.namespace, ep.name;
