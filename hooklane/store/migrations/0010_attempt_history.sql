-- Hooklane schema, version 10 (issue 22): every attempt recorded, the trace
-- context an event was published in, and retention of the attempt history
-- by dropping a day's partition rather than deleting its rows.
--
-- Up to version 9 a delivery kept only its last status and error: after a
-- retry succeeded, the failures before it were gone. From here on each
-- attempt that ends (a result the worker records, or a lease that ran out)
-- leaves a row in delivery_attempts, written by the statement that records
-- the result, for the deliveries that statement actually changed.
--
-- Rolling upgrade: workers of version 9 (hooklane_reserve_v3,
-- hooklane_complete_v3) are not of any release, so their functions are
-- replaced here rather than kept beside; workers of 0.1.0 and version 8
-- (the _v2 functions) go on working and record no attempts. Publishers of
-- any earlier version store no trace context (the column is NULL).

-- The W3C traceparent the event was published under (NULL: none), so that
-- each attempt's span joins the publisher's trace and the receiver gets it.
-- Checked by the publisher (hooklane/traceparent.py) for its message, and
-- here, the same rule, for whatever else writes events: what is stored is
-- sent to receivers as a header. NOT VALID: the column is new, NULL in
-- every row there is, so there is nothing to check, and checking would
-- scan the whole table under this statement's exclusive lock (0.3 s per
-- 2 million rows on the benchmarks' machine, publishes waiting).
ALTER TABLE events
    ADD COLUMN traceparent text,
    ADD CONSTRAINT events_traceparent_format
        CHECK (traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
               AND substr(traceparent, 4, 32) <> repeat('0', 32)
               AND substr(traceparent, 37, 16) <> repeat('0', 16)) NOT VALID;

-- The failure class of the delivery's last attempt when it got no HTTP
-- answer (timeout, connection_failed, ...; hooklane/results.py), NULL when
-- it got one or has not failed: what "failed with a timeout" filters on.
ALTER TABLE deliveries ADD COLUMN last_failure text;

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
-- endpoint_attempts: an endpoint's attempts over a time range, newest first
CREATE INDEX delivery_attempts_endpoint ON delivery_attempts (endpoint_id, recorded_at);

-- The daily partitions of delivery_attempts, one step per call, so that
-- each exclusive lock a step takes is held by a transaction of its own
-- (the caller's statement) and no longer than that step: create the first
-- missing partition of today and the `ahead` days after it, or else drop
-- the first partition whose whole day ended more than `keep_seconds` ago,
-- or else delete the rows of the default partition past `keep_seconds`
-- (there are none unless maintenance stopped for days). The caller calls
-- again until no row comes back. A day whose rows already went to the
-- default partition gets no partition: they stay where they are until
-- retention deletes them. A partition is created standalone and attached,
-- which takes a SHARE UPDATE EXCLUSIVE lock on delivery_attempts (results
-- go on being recorded) and an ACCESS EXCLUSIVE one on the default
-- partition; a drop takes ACCESS EXCLUSIVE locks on delivery_attempts and
-- the default partition. Each is waited for at most `lock_timeout` (the
-- setting below): results queued behind a waiting step wait too, hence
-- the short wait. A step whose lock was not had in time (a pg_dump, a long
-- read of the history) is 'busy': the partition is named in `skip` by the
-- next call of the same pass, and taken up by the next pass.
-- `keep_seconds` may be 'infinity' (drop nothing). Returns what the step
-- did, one row: 'created', 'dropped' or 'busy' and the partition's name;
-- 'purged', the default partition and the rows it deleted. No row: there
-- was nothing to do.
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

-- Today's partition and the next three days': a step each.
SELECT hooklane_attempt_partitions(3, 'infinity', '{}') FROM generate_series(0, 3);

-- Reserve (version 10): as hooklane_reserve_v3, and each delivery also
-- carries its event's tenant and trace context, for the attempt's span and
-- the receiver's traceparent header.
DROP FUNCTION hooklane_reserve_v3(integer[], bigint[], timestamptz[], integer, double precision, text);
CREATE FUNCTION hooklane_reserve_v4(owned integer[], candidates bigint[], floors timestamptz[],
                                    max_rows integer, lease_grace double precision, worker text)
RETURNS TABLE (id bigint, attempts integer, created_at timestamptz, endpoint_id bigint,
               namespace text, name text, url text, secret text, timeout_seconds integer,
               event_id text, type text, data text, event_created_at timestamptz,
               previous_secret text, max_concurrency integer,
               deliverable boolean, paused_until timestamptz, head timestamptz,
               at_limit boolean, leases_end timestamptz, tenant text, traceparent text)
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
                  ep.max_concurrency, d.state, e.tenant, e.traceparent
    )
    SELECT r.id, r.attempts, r.created_at, r.endpoint_id, r.namespace, r.name, r.url, r.secret,
           r.timeout_seconds, r.event_id, r.type, r.data, r.event_created_at, r.previous_secret,
           r.max_concurrency, NULL::boolean, NULL::timestamptz, NULL::timestamptz, NULL::boolean,
           NULL::timestamptz, r.tenant, r.traceparent
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
           coalesce(l.n >= ep.max_concurrency, false), l.ends, NULL::text, NULL::text
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

-- Record a batch of results (version 10): `complete` in queries.sql. As
-- hooklane_complete_v3, and each result that changed its delivery (passed
-- the fence) leaves its attempt in delivery_attempts, in the same
-- statement: a late result of a worker that lost the delivery changes
-- nothing and leaves no attempt. The new arrays, of the same length as
-- `ids`: when each call started, how long it took, its failure class (NULL
-- with an HTTP answer), the Retry-After it honoured and its trace id;
-- `worker`, the recording worker's id.
DROP FUNCTION hooklane_complete_v3(bigint[], integer[], text[], double precision[], integer[], text[],
                                   integer, double precision, double precision, integer[],
                                   double precision);
CREATE FUNCTION hooklane_complete_v4(ids bigint[], fences integer[], outcomes text[],
                                     retry_ins double precision[], statuses integer[], errors text[],
                                     failures text[], started_ats timestamptz[],
                                     durations double precision[], retry_afters double precision[],
                                     trace_ids text[], worker text,
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
                  r.retry_after, r.trace_id
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
