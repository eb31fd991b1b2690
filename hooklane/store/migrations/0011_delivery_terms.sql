-- Hooklane schema, version 11 (issue 23): each receiver on its own terms.
-- An endpoint's spec.delivery (hooklane/delivery.py) gives it a rate limit,
-- adaptive concurrency, extra request headers, TLS trust and a client
-- certificate, and retry limits of its own; every column is NULL or false
-- for an endpoint without them, which behaves as before.
--
-- Rolling upgrade: workers of version 10 (hooklane_reserve_v4,
-- hooklane_complete_v4) are not of any release, so their functions are
-- replaced here rather than kept beside; workers of 0.1.0 and version 8
-- (the _v2 functions) go on working and know none of these terms.

ALTER TABLE endpoints
    -- spec.delivery.rateLimit: starts per second and the bucket's size.
    ADD COLUMN rate_per_second integer CHECK (rate_per_second BETWEEN 1 AND 10000),
    ADD COLUMN rate_burst integer NOT NULL DEFAULT 1 CHECK (rate_burst BETWEEN 1 AND 10000),
    -- spec.delivery.adaptiveConcurrency, and the limit in force (NULL: the
    -- endpoint's max_concurrency), when it was last raised and lowered,
    -- and until when a Retry-After holds the whole endpoint.
    ADD COLUMN adaptive_concurrency boolean NOT NULL DEFAULT false,
    ADD COLUMN effective_concurrency integer CHECK (effective_concurrency >= 1),
    ADD COLUMN concurrency_raised_at timestamptz,
    ADD COLUMN concurrency_lowered_at timestamptz,
    ADD COLUMN throttled_until timestamptz,
    -- spec.delivery.retry (NULL: HOOKLANE_RETRY_MAX_ATTEMPTS and _MAX_AGE).
    ADD COLUMN max_attempts integer CHECK (max_attempts BETWEEN 1 AND 20),
    ADD COLUMN max_age_seconds double precision CHECK (max_age_seconds > 0 AND max_age_seconds <= 259200),
    -- spec.delivery.headers and tls, resolved from their Secrets and sealed
    -- like the signing secret (hooklane/delivery.py: RequestTerms); NULL
    -- without either.
    ADD COLUMN request_terms text;

-- The rate-limit bucket of the delivery's endpoint after this delivery's
-- start (GCRA's theoretical arrival time), written by the reservation that
-- granted it: the endpoint's bucket is its latest delivery's. complete
-- clears it once a later start or the clock has passed it.
ALTER TABLE deliveries ADD COLUMN rate_tat timestamptz;

-- reserve: an endpoint's bucket, its latest granted start. Only the
-- deliveries of rate-limited endpoints have one. Building it reads the
-- table once, while the ALTER TABLE above holds its lock on deliveries
-- (every statement on the table waits, publishes and workers alike): this
-- whole migration took 0.6 s with 3 million deliveries (313 MB, cached)
-- on the benchmarks' machine.
CREATE INDEX deliveries_rate ON deliveries (endpoint_id, rate_tat DESC) WHERE rate_tat IS NOT NULL;

-- The concurrency limit in force: the effective one of an adaptive
-- endpoint, within max_concurrency; the reservation and complete read it.
CREATE FUNCTION hooklane_concurrency(ep endpoints) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT least(coalesce(ep.effective_concurrency, ep.max_concurrency), ep.max_concurrency)
$$;

-- Reserve (version 11): as hooklane_reserve_v4, and each endpoint's rate
-- limit, effective concurrency and Retry-After hold decide its share; each
-- delivery carries its wait (send_in), its endpoint's request terms and
-- retry limits.
DROP FUNCTION hooklane_reserve_v4(integer[], bigint[], timestamptz[], integer, double precision, text);
CREATE FUNCTION hooklane_reserve_v5(owned integer[], candidates bigint[], floors timestamptz[],
                                    max_rows integer, lease_grace double precision, worker text,
                                    lookahead double precision)
RETURNS TABLE (id bigint, attempts integer, created_at timestamptz, endpoint_id bigint,
               namespace text, name text, url text, secret text, timeout_seconds integer,
               event_id text, type text, data text, event_created_at timestamptz,
               previous_secret text, max_concurrency integer,
               deliverable boolean, paused_until timestamptz, head timestamptz,
               at_limit boolean, leases_end timestamptz, tenant text, traceparent text,
               send_in double precision, request_terms text, max_attempts integer,
               max_age_seconds double precision)
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
    -- A rate-limited endpoint is granted no more starts than its bucket
    -- allows within the next `lookahead` seconds (GCRA: `tat` is when the
    -- bucket would be full again, each start moves it on by 1/rate, and
    -- `tolerance` is the burst's worth of starts before it), each with the
    -- seconds its worker waits before the call (`send_in`), so that starts
    -- are spaced as the bucket says whoever sends them. The bucket lives in
    -- the deliveries it granted (`rate_tat`, the bucket after each start),
    -- written by this same update: no row of its own to version.
    -- An adaptive endpoint's limit is its effective concurrency, and a
    -- Retry-After it gave (throttled_until) holds all of it.
    -- Index: deliveries_leased for the count; deliveries_rate for the
    -- bucket; deliveries_queue from each floor; primary key of events.
    RETURN QUERY
    WITH candidate AS (
        SELECT c.endpoint_id, coalesce(c.low, '-infinity') AS low
        FROM unnest(candidates, floors) AS c(endpoint_id, low)
    ),
    -- MATERIALIZED: read once per candidate; inlined into the queue's
    -- LIMIT and the waits, the bucket was read again for each row.
    slots AS MATERIALIZED (
        SELECT ep.id, c.low, ep.rate_per_second::float8 AS rate,
               (ep.rate_burst - 1)::float8 / ep.rate_per_second AS tolerance,
               hooklane_concurrency(ep) - (SELECT count(*) FROM deliveries f
                                           WHERE f.endpoint_id = ep.id AND f.state = 'sending'
                                             AND f.lease_expires_at > now()) AS free,
               CASE WHEN ep.rate_per_second IS NOT NULL
                    THEN greatest(now(), (SELECT t.rate_tat FROM deliveries t
                                          WHERE t.endpoint_id = ep.id AND t.rate_tat IS NOT NULL
                                          ORDER BY t.rate_tat DESC LIMIT 1)) END AS tat
        FROM candidate c
        JOIN endpoints ep ON ep.id = c.endpoint_id
        WHERE ep.partition = ANY(owned)
          AND hooklane_deliverable(ep)
          AND (ep.paused_until IS NULL OR ep.paused_until <= now())
          AND (ep.throttled_until IS NULL OR ep.throttled_until <= now())
    ),
    granted AS (
        SELECT s.id, s.low, s.rate, s.tolerance, s.tat,
               CASE WHEN s.rate IS NULL THEN greatest(s.free, 0)
                    ELSE least(greatest(s.free, 0),
                               greatest(floor((extract(epoch FROM now() - s.tat)::float8 + lookahead
                                               + s.tolerance) * s.rate)::bigint + 1, 0)) END AS allowed
        FROM slots s
    ),
    queued AS (
        SELECT q.id, q.state, s.rate, s.tolerance, s.tat,
               row_number() OVER (PARTITION BY s.id ORDER BY q.next_attempt_at, q.id) AS pos
        FROM granted s
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
            LIMIT s.allowed
            FOR UPDATE SKIP LOCKED
        ) q
    ),
    chosen AS (
        SELECT q.id, q.state,
               CASE WHEN q.rate IS NULL THEN 0
                    ELSE greatest(0, extract(epoch FROM q.tat - now())::float8
                                     + (q.pos - 1) / q.rate - q.tolerance) END AS send_in,
               q.tat + make_interval(secs => q.pos / q.rate) AS rate_tat
        FROM queued q ORDER BY q.pos, q.id LIMIT max_rows
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
                                    THEN now() + make_interval(secs => ep.timeout_seconds + lease_grace
                                                                       + s.send_in)
                               END,
            rate_tat = CASE WHEN hooklane_tenant_discard(d.event_tenant, ep.tenant) IS NULL
                            THEN coalesce(s.rate_tat, d.rate_tat) ELSE d.rate_tat END,
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
                  hooklane_concurrency(ep) AS max_concurrency, d.state, e.tenant, e.traceparent,
                  s.send_in, ep.request_terms, ep.max_attempts, ep.max_age_seconds
    )
    SELECT r.id, r.attempts, r.created_at, r.endpoint_id, r.namespace, r.name, r.url, r.secret,
           r.timeout_seconds, r.event_id, r.type, r.data, r.event_created_at, r.previous_secret,
           r.max_concurrency, NULL::boolean, NULL::timestamptz, NULL::timestamptz, NULL::boolean,
           NULL::timestamptz, r.tenant, r.traceparent, r.send_in, r.request_terms, r.max_attempts,
           r.max_age_seconds
    FROM reserved r
    WHERE r.state = 'sending';

    -- The verdicts, in a statement of their own: its snapshot sees this
    -- round's reservations, so a head is read past what was just reserved,
    -- and only from the floor on. Its paused_until is when the endpoint
    -- is worth a round again: the end of its circuit's pause, of the hold
    -- a Retry-After asked for, or, rate-limited, when half the lookahead's
    -- starts are granted anew (at the lookahead's end each round would
    -- grant a single start: a round per start).
    -- Index: primary key of endpoints; deliveries_queue from each floor;
    -- deliveries_leased for the live leases; deliveries_rate.
    RETURN QUERY
    SELECT NULL::bigint, NULL::integer, NULL::timestamptz, c.endpoint_id,
           NULL::text, NULL::text, NULL::text, NULL::text, NULL::integer,
           NULL::text, NULL::text, NULL::text, NULL::timestamptz, NULL::text,
           hooklane_concurrency(ep), k.ok,
           greatest(ep.paused_until, ep.throttled_until,
                    b.tat - make_interval(secs => lookahead / 2
                                          + (ep.rate_burst - 1)::float8 / ep.rate_per_second)),
           h.head, coalesce(l.n >= hooklane_concurrency(ep), false), l.ends, NULL::text, NULL::text,
           NULL::float8, NULL::text, NULL::integer, NULL::float8
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

-- Record a batch of results (version 11): `complete` in queries.sql. As
-- hooklane_complete_v4, and an adaptive endpoint's limit follows the
-- receiver's overload signals (adapt_step: the seconds between two
-- raises, and the hold of an endpoint overloaded at a limit of 1); returns
-- each endpoint's hold, limit, and whether it was lowered.
DROP FUNCTION hooklane_complete_v4(bigint[], integer[], text[], double precision[], integer[], text[],
                                   text[], timestamptz[], double precision[], double precision[],
                                   text[], text, integer, double precision, double precision,
                                   integer[], double precision);
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
