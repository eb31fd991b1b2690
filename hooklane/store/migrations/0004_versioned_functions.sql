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

-- hooklane_wake and hooklane_make_ready are PL/pgSQL with a kept plan (see
-- the reservation's functions below): called in a statement's SELECT list, a
-- LANGUAGE sql function that writes is not inlined, and its body was planned
-- again on every call, inside every publish and every complete. Their plans
-- do not depend on the length of the arrays (one insert per element).

-- Wake endpoints that got work, or may deliver again: a wakeup row each,
-- turned into a ready row by the partition's owner at its next reservation.
-- Append-only: publish calls it inside the application's transaction, which
-- must never hold a lock a worker waits on. The arrays go in pairs.
-- Index: none (wakeups_partition serves the reader).
CREATE FUNCTION hooklane_wake(endpoint_ids bigint[], partitions integer[]) RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    IF endpoint_ids IS NOT NULL THEN
        INSERT INTO wakeups (endpoint_id, partition)
        SELECT w.endpoint_id, w.partition FROM unnest(endpoint_ids, partitions) AS w(endpoint_id, partition);
    END IF;
END;
$$;

-- Make endpoints ready now (or at the times `ready_ats` gives), or keep the
-- earlier time they are ready at already. Called by the reservation and
-- rescue_expired, under the partitions' locks, and by complete. The arrays
-- go together, `ready_ats` may be left out; an endpoint may appear more than
-- once, and its earliest time counts.
-- Index: primary key of ready_endpoints.
CREATE FUNCTION hooklane_make_ready(endpoint_ids bigint[], partitions integer[],
                                    ready_ats timestamptz[] DEFAULT NULL) RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    IF endpoint_ids IS NOT NULL THEN
        INSERT INTO ready_endpoints AS re (endpoint_id, partition, ready_at)
        SELECT DISTINCT ON (r.endpoint_id) r.endpoint_id, r.partition, coalesce(r.ready_at, now())
        FROM unnest(endpoint_ids, partitions, ready_ats) AS r(endpoint_id, partition, ready_at)
        ORDER BY r.endpoint_id, coalesce(r.ready_at, now())
        ON CONFLICT (endpoint_id) DO UPDATE
        SET ready_at = least(re.ready_at, EXCLUDED.ready_at);
    END IF;
END;
$$;

-- The reservation's functions are PL/pgSQL with `plan_cache_mode =
-- force_generic_plan`: each statement in them is planned once per session
-- and its plan kept, as are hooklane_complete's below. The worker's
-- sessions plan every other statement afresh (WORKER_SESSION in
-- hooklane/store/connection.py) because a generic plan of a statement given
-- arrays of ids may guess wrong for the batch it gets; these statements'
-- plans do not depend on it (index lookups per candidate or per result,
-- whether there is one or 256: the same plan either way under EXPLAIN), and
-- planning them anew cost Postgres more than running them in a round that
-- finds one delivery. A kept plan is made on the statistics of its first
-- call and lasts until the tables are analysed again, so no condition that
-- finds the rows to change is a constant a partial index could match
-- (`state = 'pending'`): such a plan, made while a queue was short, would
-- read the whole queue on every call once it grew.

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
        SELECT c.id, c.state, row_number() OVER (PARTITION BY s.id ORDER BY c.next_attempt_at, c.id) AS pos
        FROM slots s
        CROSS JOIN LATERAL (
            -- SKIP LOCKED: a pending row is locked by a publish coalescing
            -- into it, in an application transaction that may stay open
            -- for long; the reservation takes the next one rather than
            -- wait (and hold up the worker) until it commits.
            SELECT d.id, d.state, d.next_attempt_at
            FROM deliveries d
            WHERE d.endpoint_id = s.id
              AND d.state = 'pending'
              AND d.next_attempt_at <= now()
            ORDER BY d.next_attempt_at, d.id
            LIMIT greatest(s.free, 0)
            FOR UPDATE SKIP LOCKED
        ) c
    ),
    -- The update finds each chosen row by primary key, fenced by the state
    -- it was locked in rather than by `'pending'`: that constant let the
    -- kept plan read every pending row through deliveries_queue and
    -- join them to the few chosen, a cost that grew with any backlog.
    chosen AS (
        SELECT q.id, q.state FROM queued q ORDER BY q.pos, q.id LIMIT max_rows
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
          AND d.state = s.state
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

-- Record a batch of results: the steps of `complete` (queries.sql, whose
-- comment says what they do), with a kept plan like the reservation's.
-- Planned afresh on every call, `complete` cost Postgres more to plan than
-- to run (about 1.7 ms of planning against 0.6 ms of execution per call at
-- a steady 100 deliveries/s). A kept plan must be right whatever the batch
-- and however many rows are in flight, so no condition on a scan of
-- deliveries says `state = 'sending'`: the one plan that once made
-- recording results slow (docs/benchmarks.md, "What changed in the core")
-- read every in-flight row through deliveries_in_flight and joined the
-- batch against them, and without that condition the index cannot be used.
-- Instead each result's row is looked up by primary key (`OFFSET 0` keeps
-- the lookup apart, so that the fence above it never reaches the scan), and
-- the update finds it again by primary key, fenced by the state and attempt
-- it read (`fenced` is MATERIALIZED, so that its `'sending'` never reaches
-- the update's scan either). An update that finds the row changed since it
-- was read checks the fence again on the new row, as a plain update does.
-- Index: primary keys of deliveries, endpoints and ready_endpoints;
-- deliveries_queue for each touched endpoint's pending head.
CREATE FUNCTION hooklane_complete(ids bigint[], fences integer[], outcomes text[],
                                  retry_ins double precision[], statuses integer[], errors text[],
                                  threshold integer, step_seconds double precision,
                                  cap_seconds double precision)
RETURNS TABLE (id bigint, namespace text, name text, state text, paused_until timestamptz,
               consecutive_failures integer, ready boolean)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH fenced AS MATERIALIZED (
        SELECT r.id, r.attempts, r.outcome, r.retry_in, r.status, r.error, d.state
        FROM unnest(ids, fences, outcomes, retry_ins, statuses, errors)
             AS r(id, attempts, outcome, retry_in, status, error)
        CROSS JOIN LATERAL (SELECT d.state, d.attempts FROM deliveries d WHERE d.id = r.id OFFSET 0) d
        WHERE d.state = 'sending' AND d.attempts = r.attempts
    ),
    recorded AS (
        UPDATE deliveries d
        SET state = CASE WHEN r.outcome <> 'delivered' AND d.event_tenant <> ep.tenant THEN 'discarded'
                         WHEN r.outcome = 'retry' THEN 'pending'
                         ELSE r.outcome END,
            next_attempt_at = CASE WHEN r.outcome = 'retry'
                                   THEN now() + make_interval(secs => r.retry_in)
                                   ELSE d.next_attempt_at END,
            delivered_at = CASE WHEN r.outcome = 'delivered' THEN now() END,
            lease_expires_at = NULL,
            last_status = r.status,
            last_error = CASE WHEN r.outcome <> 'delivered' AND d.event_tenant <> ep.tenant
                              THEN format('discarded: the endpoint''s tenant changed from %s to %s (%s)',
                                          d.event_tenant, ep.tenant, r.error)
                              ELSE r.error END
        FROM fenced r, endpoints ep
        WHERE d.id = r.id
          AND d.state = r.state
          AND d.attempts = r.attempts
          AND ep.id = d.endpoint_id
        RETURNING d.id, d.endpoint_id, d.state, d.next_attempt_at, r.outcome, r.status, r.error
    ),
    per_endpoint AS (
        SELECT rec.endpoint_id,
               bool_or(rec.outcome = 'delivered') AS succeeded,
               count(*) FILTER (WHERE rec.outcome <> 'delivered') AS failures,
               bool_or(rec.status = 410) AS gone,
               (array_agg(rec.error ORDER BY rec.id DESC)
                  FILTER (WHERE rec.outcome <> 'delivered'))[1] AS error,
               -- The pending head is read in the statement's snapshot, from
               -- before its own updates: a retry recorded here counts too.
               min(rec.next_attempt_at) FILTER (WHERE rec.state = 'pending') AS retried_head
        FROM recorded rec
        GROUP BY rec.endpoint_id
    ),
    touched AS (
        UPDATE endpoints ep
        SET consecutive_failures = CASE WHEN pe.succeeded THEN 0
                                        ELSE ep.consecutive_failures + pe.failures END,
            failing_since = CASE WHEN pe.succeeded THEN NULL
                                 ELSE coalesce(ep.failing_since, now()) END,
            paused_until = CASE
                WHEN pe.succeeded THEN NULL
                WHEN ep.consecutive_failures + pe.failures >= threshold
                THEN now() + make_interval(secs => least(
                         cap_seconds, step_seconds * (ep.consecutive_failures + pe.failures - threshold + 1)))
                ELSE ep.paused_until END,
            last_error = coalesce(pe.error, ep.last_error),
            last_delivered_at = CASE WHEN pe.succeeded THEN now()
                                     ELSE ep.last_delivered_at END,
            state = CASE WHEN pe.gone THEN 'deactivated' ELSE ep.state END,
            deactivated_at = CASE WHEN pe.gone AND ep.state = 'active' THEN now()
                                  ELSE ep.deactivated_at END,
            deactivated_reason = CASE WHEN pe.gone AND ep.state = 'active'
                                      THEN 'the receiver answered 410 Gone'
                                      ELSE ep.deactivated_reason END
        FROM per_endpoint pe
        WHERE ep.id = pe.endpoint_id
        RETURNING ep.id, ep.partition, ep.namespace, ep.name, ep.state, ep.paused_until,
                  ep.consecutive_failures, hooklane_deliverable(ep) AS deliverable, pe.retried_head
    ),
    verdict AS (
        SELECT t.id, t.partition, t.namespace, t.name, t.state, t.paused_until, t.consecutive_failures,
               CASE WHEN NOT t.deliverable OR h.head IS NULL THEN NULL
                    WHEN t.paused_until > now() THEN greatest(t.paused_until, h.head)
                    ELSE greatest(h.head, now())
               END AS ready_at
        FROM touched t
        CROSS JOIN LATERAL (
            SELECT least((SELECT min(d.next_attempt_at) FROM deliveries d
                          WHERE d.endpoint_id = t.id AND d.state = 'pending'),
                         t.retried_head) AS head
        ) h
    ),
    made_ready AS (
        SELECT hooklane_make_ready(array_agg(v.id), array_agg(v.partition), array_agg(v.ready_at))
        FROM verdict v
        WHERE v.ready_at IS NOT NULL
    )
    SELECT v.id, v.namespace, v.name, v.state, v.paused_until, v.consecutive_failures,
           coalesce(v.ready_at <= now(), false)
    FROM verdict v, made_ready;
END;
$$;
