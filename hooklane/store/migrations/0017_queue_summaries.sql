-- Hooklane schema, version 17 (issue 37, item 8): the endpoint listings'
-- queue counts from the workers' gauge passes.
--
-- Counting an endpoint's pending deliveries from the start of its queue
-- walks the dead index entry of every delivery it sent while a snapshot
-- is held somewhere (a report, a pg_dump): the admin listing, the
-- dashboard's and the portal's grew with the time held (434,064 buffers,
-- 0.46 s after 400,000 deliveries, against 20,846 and 23 ms before). The
-- worker owning a partition counts each of its endpoints' queue from the
-- floor its ready list holds, every HOOKLANE_GAUGES_SECONDS (its gauges);
-- it now also writes what it counted here, one row per partition, and the
-- listings read that while it is fresh, and the queues themselves only of
-- the endpoints no fresh row holds.

-- One row per partition, written by the worker owning it at each gauge
-- pass (a few rows a second for the whole install, never per delivery):
-- each endpoint of the partition with its pending deliveries and the
-- creation of the oldest, as the pass counted them.
CREATE TABLE queue_summaries (
    partition         integer PRIMARY KEY,
    -- The database's clock when the pass counted.
    counted_at        timestamptz NOT NULL,
    -- Until when a listing may show these counts: a few gauge periods of
    -- the worker that wrote them, after which (its worker gone) the
    -- listings count the queues themselves again.
    fresh_until       timestamptz NOT NULL,
    endpoint_ids      bigint[] NOT NULL,
    pending           bigint[] NOT NULL,
    oldest_pending_at timestamptz[] NOT NULL,
    CHECK (cardinality(endpoint_ids) = cardinality(pending)
           AND cardinality(endpoint_ids) = cardinality(oldest_pending_at))
);

-- The counts of the fresh summaries, a row per endpoint they hold.
CREATE FUNCTION hooklane_queue_counts()
RETURNS TABLE (endpoint_id bigint, pending bigint, oldest_pending_at timestamptz,
               counted_at timestamptz)
LANGUAGE sql
STABLE
AS $$
    SELECT u.endpoint_id, u.pending, u.oldest_pending_at, s.counted_at
    FROM queue_summaries s
    CROSS JOIN LATERAL unnest(s.endpoint_ids, s.pending, s.oldest_pending_at)
                       AS u(endpoint_id, pending, oldest_pending_at)
    WHERE s.fresh_until > now()
$$;
