-- Hooklane schema, version 2: reservation visits only the endpoints that may
-- have work, so that its cost follows the endpoints with deliveries to make
-- rather than every endpoint of the platform.

-- Publishers append a wakeup for each endpoint they queue a delivery for.
-- Append-only on purpose: publish runs inside the application's own,
-- possibly long, transaction, and must never lock a row the worker needs.
CREATE TABLE wakeups (
    id          bigserial PRIMARY KEY,
    endpoint_id bigint NOT NULL,
    partition   integer NOT NULL
);

-- absorb_wakeups: the wakeups of the partitions a worker owns
CREATE INDEX wakeups_partition ON wakeups (partition);

-- The endpoints of each partition that may have work, and from when. Kept by
-- the partition's owner: absorbed wakeups and freed slots make an endpoint
-- ready now; after each reservation an endpoint moves to the back of the
-- line, to its next retry time, to the end of its circuit pause, to
-- 'infinity' while all its slots are taken (a result brings it back), or out
-- of the table when it has nothing pending.
CREATE TABLE ready_endpoints (
    endpoint_id bigint PRIMARY KEY,
    partition   integer NOT NULL,
    ready_at    timestamptz NOT NULL
);

-- ready_candidates: the longest-waiting ready endpoints of owned partitions
CREATE INDEX ready_endpoints_ready_at ON ready_endpoints (ready_at, partition);

INSERT INTO ready_endpoints (endpoint_id, partition, ready_at)
SELECT DISTINCT d.endpoint_id, ep.partition, now()
FROM deliveries d
JOIN endpoints ep ON ep.id = d.endpoint_id
WHERE d.state IN ('pending', 'sending');

-- Reservation is one round trip (`SELECT * FROM hooklane_reserve(...)`, the
-- `reserve` query): a busy worker's event loop adds its own latency to every
-- round trip, so four statements from the client cost four times that. The
-- steps stay separate statements inside, each with a fresh snapshot, in the
-- one transaction that holds the candidates' rows locked.

-- Step 1: turn the wakeups of the owned partitions into ready endpoints.
-- Index: wakeups_partition; primary key of ready_endpoints.
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

-- Step 4: when may each candidate have work again: now, at the back of the
-- line, if it still has due deliveries and free slots (round robin between
-- endpoints); at its next retry; at the end of its circuit pause; never
-- ('infinity') while all its slots are taken, until a result frees one; and
-- not at all when it has nothing pending or cannot be delivered to (paused
-- by hand, unsigned, deactivated, deleted), until a wakeup.
-- Index: deliveries_queue for the head, deliveries_in_flight for the count.
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

-- The whole reservation. Runs only under the owned partitions' advisory
-- locks, which is what makes counting in-flight deliveries and reserving one
-- exact step.
CREATE FUNCTION hooklane_reserve(owned integer[], max_rows integer, lease_grace double precision)
RETURNS TABLE (id bigint, attempts integer, created_at timestamptz, endpoint_id bigint,
               namespace text, name text, url text, secret text, timeout_seconds integer,
               event_id text, type text, data text, event_created_at timestamptz)
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
    -- any.
    -- Index: deliveries_in_flight for the count; deliveries_queue for the
    -- first rows of each endpoint's queue.
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
    )
    UPDATE deliveries d
    SET state = 'sending',
        attempts = d.attempts + 1,
        reserved_at = now(),
        lease_expires_at = now() + make_interval(secs => ep.timeout_seconds + lease_grace)
    FROM chosen s, endpoints ep, events e
    WHERE d.id = s.id
      AND d.state = 'pending'
      AND ep.id = d.endpoint_id
      AND e.id = d.event_id
    RETURNING d.id, d.attempts, d.created_at, d.endpoint_id,
              ep.namespace, ep.name, ep.url, ep.secret, ep.timeout_seconds,
              e.id, e.type, e.data::text, e.created_at;

    PERFORM hooklane_rerate(candidates);
END;
$$;
