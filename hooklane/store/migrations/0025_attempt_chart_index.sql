-- Hooklane schema, version 25 (issue 41): the endpoint charts read an
-- endpoint's attempts from an index alone.
--
-- Each endpoint page charts its attempts by outcome and their latency over
-- the last 24 hours or 7 days (endpoint_chart in queries.sql). Through
-- delivery_attempts_endpoint (endpoint_id, recorded_at) every attempt of
-- the range was read from the table for its outcome and duration: one
-- page of the heap per row, as an endpoint's rows lie scattered among
-- every other's. A busy endpoint's week (93,000 attempts among 4 million)
-- took 550 ms and 58,000 buffers; with its outcome and duration in the
-- index, about 700 buffers (docs/benchmarks.md, section 19). The new index
-- replaces the old one, which it serves as well (endpoint_attempts walks
-- the same keys): the history's writes keep one index per endpoint.
--
-- Locking: CREATE INDEX on the partitioned table builds the index on each
-- partition in this migration's transaction, holding a SHARE lock on
-- each, which blocks the inserts into delivery_attempts, so every result a
-- worker records (hooklane_complete, hooklane_rescue) waits until the
-- build commits. It took 5 s for 4 million attempts (760 MB) on the
-- benchmarks' machine: about a minute and a half per 100 million. A larger
-- history builds each partition's index first, CONCURRENTLY, outside any
-- transaction, which this statement then finds and attaches instead of
-- building (CHANGELOG.md, Upgrading, shows the statements). The DROP
-- takes an ACCESS EXCLUSIVE lock on the table for as long as it takes to
-- drop the partitions' indexes: a moment.
CREATE INDEX delivery_attempts_endpoint_chart ON delivery_attempts (endpoint_id, recorded_at)
    INCLUDE (outcome, duration_seconds);
DROP INDEX delivery_attempts_endpoint;

-- The existing partitions' copies of delivery_attempts_endpoint_dead were
-- named with a 1 because the old index had the name first: they take the
-- name a partition attached from now on gives them (and schema.sql's).
DO $$
DECLARE
    found text;
BEGIN
    FOR found IN
        SELECT c.relname
        FROM pg_inherits h
        JOIN pg_index i ON i.indrelid = h.inhrelid
        JOIN pg_class c ON c.oid = i.indexrelid
        WHERE h.inhparent = 'delivery_attempts'::regclass
          AND c.relname LIKE '%\_endpoint\_id\_recorded\_at\_idx1'
    LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', found, left(found, -1));
    END LOOP;
END $$;
