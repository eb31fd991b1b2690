-- Hooklane schema, version 4: each delivery records the worker that last
-- reserved it; the rules that make an endpoint ready are SQL functions
-- written once, which every statement and the new reservation call; and SQL
-- functions are versioned by name (CONTRIBUTING.md, "Changing SQL
-- functions").
--
-- Rolling upgrade: no function is changed or dropped. Workers of the
-- previous release (0.1.0) keep calling `hooklane_reserve` (which leaves
-- `attempted_by` NULL) and their `complete` statement as it was
-- (tests/release_0_1_0.sql), next to new workers calling
-- `hooklane_reserve_v2`. `hooklane_reserve`, `hooklane_absorb_wakeups` and
-- `hooklane_rerate`, which no code of this release calls, are dropped by a
-- migration of the next release.

-- The worker (HOOKLANE_WORKER_ID, by default <hostname>-<pid>: a pod's name)
-- that reserved the delivery last, kept after the attempt and after a
-- rescue, so that one can tell who held what. NULL: never reserved, or
-- reserved by a worker of a release before this migration.
ALTER TABLE deliveries ADD COLUMN attempted_by text;

-- Whether deliveries may be sent to the endpoint at all: active, not paused
-- by hand, and with a signing secret (nothing is ever sent unsigned). The
-- circuit's pause is not part of it: it ends by itself, at a known time.
-- LANGUAGE sql, one expression, STABLE: the planner inlines it into the
-- calling statement, so that the partial indexes on `state = 'active'` still
-- match.
CREATE FUNCTION hooklane_deliverable(ep endpoints) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT ep.state = 'active' AND NOT ep.paused AND ep.secret IS NOT NULL
$$;

-- Wake endpoints that got work, or may deliver again: a wakeup row each,
-- turned into a ready row by the partition's owner at its next reservation.
-- Append-only: publish calls it inside the application's transaction, which
-- must never hold a lock a worker waits on. The arrays go in pairs.
-- Index: none (wakeups_partition serves the reader).
CREATE FUNCTION hooklane_wake(endpoint_ids bigint[], partitions integer[]) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO wakeups (endpoint_id, partition)
    SELECT w.endpoint_id, w.partition FROM unnest(endpoint_ids, partitions) AS w(endpoint_id, partition);
$$;

-- Make endpoints ready now (or at the times `ready_ats` gives), or keep the
-- earlier time they are ready at already. Called by the reservation and
-- rescue_expired, under the partitions' locks, and by complete. The arrays
-- go together, `ready_ats` may be left out; an endpoint may appear more than
-- once, and its earliest time counts.
-- Index: primary key of ready_endpoints.
CREATE FUNCTION hooklane_make_ready(endpoint_ids bigint[], partitions integer[],
                                    ready_ats timestamptz[] DEFAULT NULL) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO ready_endpoints (endpoint_id, partition, ready_at)
    SELECT DISTINCT ON (r.endpoint_id) r.endpoint_id, r.partition, coalesce(r.ready_at, now())
    FROM unnest(endpoint_ids, partitions, ready_ats) AS r(endpoint_id, partition, ready_at)
    ORDER BY r.endpoint_id, coalesce(r.ready_at, now())
    ON CONFLICT (endpoint_id) DO UPDATE
    SET ready_at = least(ready_endpoints.ready_at, EXCLUDED.ready_at);
$$;

-- The reservation's functions are PL/pgSQL with `plan_cache_mode =
-- force_generic_plan`: each statement in them is planned once per session
-- and its plan kept. The worker's sessions plan every other statement
-- afresh (WORKER_SESSION in hooklane/store/connection.py) because the best
-- plan for `complete` depends on its batch's size; these statements' plans
-- do not (index lookups per candidate, whether there is one or 256: the
-- same plan either way under EXPLAIN), and planning them anew cost Postgres
-- more than running them in a round that finds one delivery.

-- Step 1 of a reservation: turn the wakeups of the owned partitions into
-- ready endpoints.
-- Index: wakeups_partition; primary key of ready_endpoints.
CREATE FUNCTION hooklane_absorb_wakeups_v2(owned integer[]) RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    woken bigint[];
    partitions integer[];
BEGIN
    WITH taken AS (
        DELETE FROM wakeups
        WHERE partition = ANY(owned)
        RETURNING endpoint_id, partition
    )
    SELECT array_agg(endpoint_id), array_agg(partition) INTO woken, partitions FROM taken;
    IF woken IS NOT NULL THEN
        PERFORM hooklane_make_ready(woken, partitions);
    END IF;
END;
$$;

-- Step 4: when may each candidate have work again: now, at the back of the
-- line, if it still has due deliveries and free slots (round robin between
-- endpoints); at its next retry; at the end of its circuit pause; never
-- ('infinity') while all its slots are taken, until a result frees one; and
-- not at all when it has nothing pending or is not deliverable, until a
-- wakeup.
-- Index: deliveries_queue for the head, deliveries_in_flight for the count.
CREATE FUNCTION hooklane_rerate_v2(candidates bigint[]) RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    WITH verdict AS (
        SELECT c.endpoint_id,
               CASE
                   WHEN ep.id IS NULL OR NOT hooklane_deliverable(ep) OR h.head IS NULL THEN NULL
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
END;
$$;

-- The reservation of migration 0003, with two changes: the steps it shares with
-- other statements are the functions above, and each reserved delivery
-- records `worker`, the reserving worker's id, in `attempted_by`. Runs only
-- under the owned partitions' advisory locks, which is what makes counting
-- in-flight deliveries and reserving one exact step.
CREATE FUNCTION hooklane_reserve_v2(owned integer[], max_rows integer, lease_grace double precision,
                                    worker text)
RETURNS TABLE (id bigint, attempts integer, created_at timestamptz, endpoint_id bigint,
               namespace text, name text, url text, secret text, timeout_seconds integer,
               event_id text, type text, data text, event_created_at timestamptz,
               previous_secret text, max_concurrency integer)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    candidates bigint[];
BEGIN
    PERFORM hooklane_absorb_wakeups_v2(owned);

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
    -- any. Those of another tenant's event than the endpoint's are discarded
    -- in the same statement; they took a slot of this round only, and the
    -- endpoint stays ready for the next.
    -- Index: deliveries_in_flight for the count; deliveries_queue for the
    -- first rows of each endpoint's queue; primary key of events.
    RETURN QUERY
    WITH slots AS (
        SELECT ep.id,
               ep.max_concurrency - (SELECT count(*) FROM deliveries f
                                     WHERE f.endpoint_id = ep.id AND f.state = 'sending') AS free
        FROM endpoints ep
        WHERE ep.id = ANY(candidates)
          AND hooklane_deliverable(ep)
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
            attempted_by = CASE WHEN d.event_tenant = ep.tenant THEN worker ELSE d.attempted_by END,
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
                  ep.max_concurrency, d.state
    )
    SELECT r.id, r.attempts, r.created_at, r.endpoint_id, r.namespace, r.name, r.url, r.secret,
           r.timeout_seconds, r.event_id, r.type, r.data, r.event_created_at, r.previous_secret,
           r.max_concurrency
    FROM reserved r
    WHERE r.state = 'sending';

    PERFORM hooklane_rerate_v2(candidates);
END;
$$;
