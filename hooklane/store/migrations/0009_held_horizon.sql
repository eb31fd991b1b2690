-- Hooklane schema, version 9 (issue 21): a hot path whose cost does not
-- grow while another session holds the xmin horizon back (a long report, an
-- idle transaction, a pg_dump, a standby's feedback).
--
-- While the horizon is held, no row version that dies after it can be
-- removed, and an index scan walks every dead entry in its range. Up to
-- version 8, each delivery left about six dead versions in small tables that
-- every reservation scanned from their start: the wakeup publish inserted and
-- the reservation deleted, the ready row each round moved and deleted, the
-- queue's and the in-flight index's entries of every earlier delivery of the
-- endpoint, and a version of the endpoint row per batch of results. So from
-- version 9 on:
-- - the ready list lives in the partition owner's memory
--   (hooklane/worker/ready.py): publishes notify the owner of each endpoint
--   that got work (hooklane_wake_v2) and write no row for it;
-- - a reservation scans an endpoint's queue from the floor the worker hands
--   it, the earliest position a pending delivery of it may hold, instead of
--   from the start of every delivery it ever had;
-- - the deliveries in flight are counted by lease (deliveries_leased), so
--   that a count reads the leases of the last call's length, not every
--   delivery sent since the horizon;
-- - a batch of results writes an endpoint row only when its circuit,
--   lifecycle or last error changes, or its last delivery time is older
--   than a step.
--
-- Rolling upgrade: workers of version 8 (hooklane_reserve_v2,
-- hooklane_complete_v2) go on working beside these, on the tables they
-- know; a publish of this release writes no wakeup row, so a partition
-- still owned by an old worker finds it by that worker's sweep (a minute at
-- most). Publishers of version 8 still write wakeups; this release's
-- workers absorb them. The next release drops wakeups, ready_endpoints and
-- the functions of version 8 that use them.

-- The deliveries in flight of an endpoint, by when their lease ends. A
-- lease ends when the worker that reserved the delivery has certainly given
-- up on the call, so only a live lease holds a slot; a count reads only the
-- leases still live. Replaces deliveries_in_flight, whose count read one
-- entry per delivery the endpoint ever sent while the horizon was held.
DROP INDEX deliveries_in_flight;
CREATE INDEX deliveries_leased
    ON deliveries (endpoint_id, lease_expires_at)
    WHERE state = 'sending';

-- Tell the owner of each endpoint that it may have work, from `dues`: the
-- earliest time a delivery it got may be due (the next_attempt_at it was
-- written with), or NULL when no delivery was written (the endpoint
-- changed). One notification per partition and due time, listing up to 300
-- endpoints, so a payload stays under Postgres's 8,000 bytes: "<partition>
-- <due in microseconds since the epoch, or -> <id>,<id>,...". Postgres
-- delivers it at commit, and folds the same payload repeated within a
-- transaction. A notification costs no row: a publish held open in a long
-- application transaction writes nothing here that a worker scans.
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

-- The reservation from version 9 on: `reserve` in queries.sql. The worker
-- names the candidates (endpoints of its partitions whose ready time has
-- come, longest waiting first) and each one's floor: the earliest
-- next_attempt_at a pending delivery of it may have (NULL: unknown, scan
-- from the start). Returns the reserved deliveries (id not NULL) and then
-- one verdict row per candidate (id NULL): whether it is deliverable, its
-- circuit pause, its head (the earliest pending next_attempt_at from its
-- floor on, after this round; NULL: nothing pending), whether its slots
-- are all taken, and when the first live lease ends.
CREATE FUNCTION hooklane_reserve_v3(owned integer[], candidates bigint[], floors timestamptz[],
                                    max_rows integer, lease_grace double precision, worker text)
RETURNS TABLE (id bigint, attempts integer, created_at timestamptz, endpoint_id bigint,
               namespace text, name text, url text, secret text, timeout_seconds integer,
               event_id text, type text, data text, event_created_at timestamptz,
               previous_secret text, max_concurrency integer,
               deliverable boolean, paused_until timestamptz, head timestamptz,
               at_limit boolean, leases_end timestamptz)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    -- Due deliveries of the candidates, never more per endpoint than its
    -- free slots, ordered by position within each endpoint's queue so that
    -- endpoints interleave: the first of each before the second of any.
    -- Those of another tenant's event than the endpoint's are discarded in
    -- the same statement. Each queue is read from its floor, so that the
    -- entries of deliveries sent before (dead versions while the horizon is
    -- held) are not walked again.
    -- Index: deliveries_leased for the count; deliveries_queue from each
    -- floor; primary key of events.
    RETURN QUERY
    WITH candidate AS (
        SELECT c.endpoint_id, coalesce(c.low, '-infinity') AS low
        FROM unnest(candidates, floors) AS c(endpoint_id, low)
    ),
    slots AS (
        SELECT ep.id, c.low,
               ep.max_concurrency - (SELECT count(*) FROM deliveries f
                                     WHERE f.endpoint_id = ep.id AND f.state = 'sending'
                                       AND f.lease_expires_at > now()) AS free
        FROM candidate c
        JOIN endpoints ep ON ep.id = c.endpoint_id
        WHERE ep.partition = ANY(owned)
          AND hooklane_deliverable(ep)
          AND (ep.paused_until IS NULL OR ep.paused_until <= now())
    ),
    queued AS (
        SELECT q.id, q.state, row_number() OVER (PARTITION BY s.id ORDER BY q.next_attempt_at, q.id) AS pos
        FROM slots s
        CROSS JOIN LATERAL (
            -- SKIP LOCKED: a pending row is locked by a publish coalescing
            -- into it, in an application transaction that may stay open
            -- for long; the reservation takes the next one rather than
            -- wait until it commits. The verdict's head still sees it.
            SELECT d.id, d.state, d.next_attempt_at
            FROM deliveries d
            WHERE d.endpoint_id = s.id
              AND d.state = 'pending'
              AND d.next_attempt_at >= s.low
              AND d.next_attempt_at <= now()
            ORDER BY d.next_attempt_at, d.id
            LIMIT greatest(s.free, 0)
            FOR UPDATE SKIP LOCKED
        ) q
    ),
    chosen AS (
        SELECT q.id, q.state FROM queued q ORDER BY q.pos, q.id LIMIT max_rows
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
                                    THEN now() + make_interval(secs => ep.timeout_seconds + lease_grace)
                               END,
            last_error = coalesce(hooklane_tenant_discard(d.event_tenant, ep.tenant), d.last_error)
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
           r.max_concurrency, NULL::boolean, NULL::timestamptz, NULL::timestamptz, NULL::boolean,
           NULL::timestamptz
    FROM reserved r
    WHERE r.state = 'sending';

    -- The verdicts, in a statement of their own: its snapshot sees this
    -- round's reservations, so a head is read past what was just reserved,
    -- and only from the floor on.
    -- Index: primary key of endpoints; deliveries_queue from each floor;
    -- deliveries_leased for the live leases.
    RETURN QUERY
    SELECT NULL::bigint, NULL::integer, NULL::timestamptz, c.endpoint_id,
           NULL::text, NULL::text, NULL::text, NULL::text, NULL::integer,
           NULL::text, NULL::text, NULL::text, NULL::timestamptz, NULL::text,
           ep.max_concurrency, k.ok, ep.paused_until, h.head,
           coalesce(l.n >= ep.max_concurrency, false), l.ends
    FROM unnest(candidates, floors) AS c(endpoint_id, low)
    LEFT JOIN endpoints ep ON ep.id = c.endpoint_id
    CROSS JOIN LATERAL (
        SELECT coalesce(ep.partition = ANY(owned) AND hooklane_deliverable(ep), false) AS ok
    ) k
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
        FROM deliveries f
        WHERE k.ok
          AND f.endpoint_id = c.endpoint_id
          AND f.state = 'sending'
          AND f.lease_expires_at > now()
    ) l ON true;
END;
$$;

-- Record a batch of results (version 9): `complete` in queries.sql. As
-- hooklane_complete_v2, less the ready list: the worker owning each
-- endpoint decides when it is ready from what this returns. An endpoint's
-- row is written only when something of it changes (its failures, circuit,
-- lifecycle, last error), or when its last delivery time is at least
-- `delivered_step` seconds old: a healthy endpoint's row gets one version
-- per step rather than one per batch. A retry of an endpoint of a partition
-- the recording worker does not own (`owned`: it lost it while the call was
-- out) is notified to its owner.
CREATE FUNCTION hooklane_complete_v3(ids bigint[], fences integer[], outcomes text[],
                                     retry_ins double precision[], statuses integer[], errors text[],
                                     threshold integer, step_seconds double precision,
                                     cap_seconds double precision, owned integer[],
                                     delivered_step double precision)
RETURNS TABLE (id bigint, partition integer, namespace text, name text, state text,
               paused_until timestamptz, consecutive_failures integer, deliverable boolean,
               retried_head timestamptz, opened boolean, deactivated boolean)
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
            last_status = r.status,
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
        RETURNING d.id, d.endpoint_id, d.state, d.next_attempt_at, r.outcome, r.status, r.error
    ),
    per_endpoint AS (
        SELECT rec.endpoint_id,
               bool_or(rec.outcome = 'delivered') AS succeeded,
               count(*) FILTER (WHERE rec.outcome <> 'delivered') AS failures,
               bool_or(rec.status = 410) AS gone,
               (array_agg(rec.error ORDER BY rec.id DESC)
                  FILTER (WHERE rec.outcome <> 'delivered'))[1] AS error,
               min(rec.next_attempt_at) FILTER (WHERE rec.state = 'pending') AS retried_head
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
               ep.deactivated_reason
        FROM per_endpoint pe
        JOIN endpoints ep ON ep.id = pe.endpoint_id
        ORDER BY ep.id
        FOR NO KEY UPDATE OF ep
    ),
    judged AS (
        SELECT b.*, pe.retried_head,
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
            deactivated_reason = j.new_deactivated_reason
        FROM judged j
        WHERE ep.id = j.id
          AND (j.new_failures, j.new_failing_since, j.new_paused_until, j.new_last_error,
               j.new_last_delivered_at, j.new_state, j.new_deactivated_at, j.new_deactivated_reason)
              IS DISTINCT FROM
              (j.consecutive_failures, j.failing_since, j.paused_until, j.last_error,
               j.last_delivered_at, j.state, j.deactivated_at, j.deactivated_reason)
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
           j.state = 'active' AND j.new_state = 'deactivated'
    FROM judged j, woken;
END;
$$;
