-- Hooklane schema, version 20 (issue 39): the reservation shares a
-- worker's capacity tenant first, then endpoint, takes caps for the
-- worker's slow calls, and keeps an optional ceiling on each tenant's
-- calls in flight.
--
-- hooklane_reserve_v7 is hooklane_reserve_v6 with:
-- - a cap of rows per candidate (`caps`, NULL: its free slots alone): the
--   worker's share of its quick slots that one endpoint may hold, or one
--   call for a slow endpoint;
-- - candidates *apart* (`apart`), served from the worker's budget of long
--   calls: the round's `max_rows` limits the others only, as those are
--   counted against that other budget by their caps;
-- - the rows counted in `max_rows` taken by their position within their
--   endpoint's tenant (every tenant's first before any tenant's second;
--   within a tenant, the first of each endpoint before the second of
--   any), so that when `max_rows` binds a tenant with 200 endpoints due
--   gets a tenant's share, not 200 endpoints' worth;
-- - a ceiling on each tenant's calls in flight (`tenant_ceiling`, NULL:
--   none): its live leases, whichever worker holds them, and what the
--   round grants never exceed it. Workers reserve different partitions at
--   once, so the round first takes a transaction's advisory lock per
--   tenant of its candidates, in the order of their keys (no two rounds
--   wait on each other in a cycle), and only then counts; without a
--   ceiling it takes none. An endpoint its tenant's ceiling holds back is
--   `at_limit` in its verdict, with `leases_end` the end of its tenant's
--   first live lease (or its own, when its own slots are all held), and
--   `tenant` (NULL in other verdicts) its tenant.
--
-- The tenant's leases are counted by their event's tenant, on the new
-- index below: the reservation only ever grants a delivery of its
-- endpoint's tenant (another tenant's is discarded), so the two differ
-- only for a call that was in flight when its endpoint moved to another
-- tenant, which counts for the tenant it was reserved for until its lease
-- ends. The count stops at the ceiling: a round reads at most that many
-- entries per tenant, whatever the tenant's number of endpoints.
--
-- Rolling upgrade: workers of the previous version go on calling
-- hooklane_reserve_v6, which is kept through this release (no release
-- called it) and dropped by the next. They take no tenant lock and grant
-- by endpoint alone: a ceiling holds exactly once every worker runs this
-- version. The index is built under the lock CREATE INDEX takes, reading
-- the whole `deliveries` table once (CHANGELOG.md).

-- reserve (hooklane_reserve_v7): a tenant's calls in flight, by when
-- their leases end, for the tenant ceiling. `attempts > 0` holds of every
-- delivery in flight (each reservation counts its attempt) and is stated
-- by the tenant counts alone: on `state = 'sending'` alone, every other
-- statement on the leases could scan this index whole, and the planner
-- chose to for rescue_expired (schema.sql: deliveries_leased).
CREATE INDEX deliveries_tenant_leased
    ON deliveries (event_tenant, lease_expires_at)
    WHERE state = 'sending' AND attempts > 0;

-- Reserve (version 20): as hooklane_reserve_v6, with caps per candidate,
-- tenant then endpoint, and a ceiling per tenant.
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

    -- As hooklane_reserve_v6's, with the caps, the tenants' ceiling and
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
        -- hash to meet a hundred candidates, as hooklane_reserve_v6's does.
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
            -- SKIP LOCKED: as hooklane_reserve_v6's.
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

    -- The verdicts, as hooklane_reserve_v6's; an endpoint is also at its
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
