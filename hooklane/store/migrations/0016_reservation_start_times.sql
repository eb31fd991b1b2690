-- Hooklane schema, version 16 (issue 37): the reservation's starts on the
-- server's clock.
--
-- hooklane_reserve_v6 is hooklane_reserve_v5 with each delivery's start
-- as a time (`start_at`, on this server's clock) rather than a wait from
-- the statement's start (`send_in`), and each verdict with the server's
-- clock as it answers (`answered_at`): a worker waits from the answer for
-- `start_at - answered_at`, so that a round that took long to run does not
-- push its starts onto the next round's (issue 37, item 6); each delivery
-- carries its endpoint's rate limit, by which a worker spaces the starts a
-- stall of its own made late. Its lookups
-- are planned as the worker's sessions plan every statement, without
-- sequential or bitmap scans (store/connection.py: WORKER_SESSION), which
-- on a fresh or fast-growing `deliveries` the planner chose from
-- statistics of a nearly empty table, and kept for the session (item 4);
-- it counts live leases in their index's order, which on such statistics
-- cost the same as reading the endpoint's every delivery.
--
-- Rolling upgrade: workers of the previous version go on calling
-- hooklane_reserve_v5, which is kept through this release (no release
-- called it) and dropped by the next.

-- Reserve (version 16): as hooklane_reserve_v5, each delivery with its
-- start's time, each verdict with the server's clock at the answer.
CREATE FUNCTION hooklane_reserve_v6(owned integer[], candidates bigint[], floors timestamptz[],
                                    max_rows integer, lease_grace double precision, worker text,
                                    lookahead double precision)
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
    -- `tolerance` is the burst's worth of starts before it), each with its
    -- time on this server's clock (`start_at`; now() without a limit), so
    -- that starts are spaced as the bucket says whoever sends them. The
    -- bucket lives in the deliveries it granted (`rate_tat`, the bucket
    -- after each start), written by this same update: no row of its own to
    -- version.
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
               -- In the index's order: on a fresh table's statistics the
               -- planner costs deliveries_endpoint the same, and reads the
               -- endpoint's every delivery by it.
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
               CASE WHEN q.rate IS NULL THEN now()
                    ELSE greatest(now(), q.tat + make_interval(secs => (q.pos - 1) / q.rate
                                                                       - q.tolerance)) END AS start_at,
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
                                    THEN s.start_at + make_interval(secs => ep.timeout_seconds
                                                                            + lease_grace)
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
           NULL::timestamptz, NULL::text, NULL::integer, NULL::float8, clock_timestamp(), NULL::integer
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
    -- In the index's order, as the reservation's count.
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

