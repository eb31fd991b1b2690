-- Hooklane schema, version 27: the ordering sweep walks the keys a page at
-- a time.
--
-- Each worker's maintenance pass (every 5 s) repairs the keys of its
-- partitions whose head settled without the key moving on
-- (hooklane_ordering_sweep_v1, migration 0026). It runs on the connection
-- that holds the partitions' advisory locks, so the worker's reservations
-- wait behind it, and v1 read every outstanding key of the partitions in
-- one statement to find the few that need it: at 100,000 keys with
-- something outstanding, 100,000 keys and their heads every pass, most of
-- them healthy. And once `max_keys` keys needed repair but could not have
-- it (a publisher holding them), each pass found the same ones first and
-- never reached the rest.
--
-- v2 walks the outstanding keys in (endpoint, key) order from a cursor
-- the worker keeps, a page a statement: each statement's cost is bounded
-- by the page, the worker takes the lock connection back between pages,
-- and every key is reached in turn (docs/benchmarks.md, section 21).
--
-- Rolling upgrade: v1 stays for workers of the release before, and reads
-- the new index as it read the old one (its first column).
--
-- Locking: CREATE INDEX holds a SHARE lock on ordering_keys while it
-- builds, which makes publishes with an ordering key and the workers'
-- results of ordered deliveries wait; one row per endpoint and key with
-- something outstanding or published within the events' retention, it
-- builds in well under a second at 100,000 keys.

-- hooklane_ordering_sweep_v2: the keys with something outstanding, walked
-- from a cursor; hooklane_ordering_sweep_v1 and endpoint_ordering, an
-- endpoint's (its first column)
CREATE INDEX ordering_keys_outstanding_keys ON ordering_keys (endpoint_id, key) WHERE head_seq IS NOT NULL;
DROP INDEX ordering_keys_outstanding;

-- The outstanding keys of the owned partitions after (after_endpoint,
-- after_key) in (endpoint, key) order, `page` of them at most (NULLs:
-- from the first), those among them whose head settled without the key
-- moving on moved on as hooklane_ordering_advance_v1 does: the same keys
-- as hooklane_ordering_sweep_v1 finds. next_endpoint and next_key: the
-- page's last key, where the next call goes on from; NULL once the walk
-- reached the end, so the next call starts over. Returns the deliveries
-- made due (woken_*: each one's endpoint, partition, key and due time);
-- a key a publisher holds stays as it is until the walk comes back to it.
-- Index: ordering_keys_outstanding_keys from the cursor on; primary key
-- of endpoints (the partition) and deliveries_ordering (the head), per key.
CREATE FUNCTION hooklane_ordering_sweep_v2(owned integer[], after_endpoint bigint, after_key text, page integer,
                                           OUT next_endpoint bigint, OUT next_key text,
                                           OUT woken_endpoints bigint[], OUT woken_partitions integer[],
                                           OUT woken_keys text[], OUT woken_dues timestamptz[])
LANGUAGE plpgsql
AS $$
DECLARE
    walked integer;
    s_endpoints bigint[];
    s_keys text[];
BEGIN
    -- Keys are 1 to 255 printable characters, so every key sorts after ''
    -- and every endpoint id (a bigserial) after -1.
    WITH page_keys AS MATERIALIZED (
        SELECT k.endpoint_id, k.key, k.head_seq, k.held_since, ep.ordering_on_dead
        FROM ordering_keys k
        JOIN endpoints ep ON ep.id = k.endpoint_id
        WHERE k.head_seq IS NOT NULL AND ep.partition = ANY(owned)
          AND (k.endpoint_id, k.key) > (coalesce(after_endpoint, -1), coalesce(after_key, ''))
        ORDER BY k.endpoint_id, k.key
        LIMIT page
    )
    SELECT count(*),
           (array_agg(w.endpoint_id ORDER BY w.endpoint_id DESC, w.key DESC))[1],
           (array_agg(w.key ORDER BY w.endpoint_id DESC, w.key DESC))[1],
           array_agg(w.endpoint_id) FILTER (WHERE s.stale),
           array_agg(w.key) FILTER (WHERE s.stale)
    INTO walked, next_endpoint, next_key, s_endpoints, s_keys
    FROM page_keys w
    LEFT JOIN deliveries h ON h.endpoint_id = w.endpoint_id AND h.ordering_key = w.key
                          AND h.ordering_seq = w.head_seq
    CROSS JOIN LATERAL (
        SELECT h.state IS NULL OR h.state IN ('delivered', 'discarded')
               OR (h.state = 'dead' AND (w.ordering_on_dead = 'skip' OR w.held_since IS NULL))
               OR (h.state IN ('pending', 'sending') AND w.held_since IS NOT NULL) AS stale
    ) s;
    IF walked < page THEN
        next_endpoint := NULL;
        next_key := NULL;
    END IF;
    IF s_endpoints IS NOT NULL THEN
        SELECT array_agg(a.endpoint_id), array_agg(a.partition), array_agg(a.key), array_agg(a.due)
        INTO woken_endpoints, woken_partitions, woken_keys, woken_dues
        FROM hooklane_ordering_advance_v1(s_endpoints, s_keys, owned) a
        WHERE a.due IS NOT NULL;
    END IF;
END;
$$;
