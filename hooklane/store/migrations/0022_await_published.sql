-- Hooklane schema, version 22 (issue 38): a worker waits for what is
-- published inside PostgreSQL, instead of asking again and again.
--
-- Since migration 0019 a worker finds what was published by probing
-- (published_since). Each probe was a statement sent from the worker: the
-- worker woke, the backend woke, each about 0.3 ms of CPU on the machine
-- measured (docs/benchmarks.md, section 15), most of it the waking, not the
-- statement. At 10 events/s the ~45 probes a second cost more cores than
-- version 16's notifications did. hooklane_await_published_v1 runs the
-- probe's loop where the data is: one CALL sleeps the given pauses in turn
-- and, after each, compares the database's snapshot with the last one it
-- probed from. Only when a transaction began or ended since does it run
-- the probe's query, and it returns as soon as that finds an event, or
-- once the pauses are spent. The worker wakes only then; an empty turn
-- costs the backend's wake alone.
--
-- A procedure, so that it commits before each pause: a statement running
-- for seconds would hold its snapshot, and with it every table's horizon,
-- for that long while the worker updates deliveries by the thousand. Its
-- transaction holds no lock and writes nothing; a pause holds a snapshot
-- for its own length only (pg_sleep is evaluated under one). Called
-- outside a transaction block (procedures that commit must be).
--
-- Rolling upgrade: workers of the previous version keep calling
-- hooklane_published_since_v1, which this calls and leaves as it is.
--
-- Index: hooklane_published_since_v1's (events_xact; deliveries_event;
-- primary key of endpoints).
CREATE PROCEDURE hooklane_await_published_v1(
    INOUT since text,
    pauses double precision[],
    INOUT events bigint DEFAULT NULL,
    INOUT endpoint_ids bigint[] DEFAULT NULL,
    INOUT partitions integer[] DEFAULT NULL,
    INOUT dues timestamptz[] DEFAULT NULL,
    INOUT probes integer DEFAULT NULL
)
LANGUAGE plpgsql
AS $$
DECLARE
    pause double precision;
BEGIN
    probes := 0;
    FOREACH pause IN ARRAY pauses LOOP
        COMMIT;
        PERFORM pg_sleep(pause);
        -- The same text when no transaction began or ended: nothing can
        -- have committed (pg_current_snapshot lists its running
        -- transactions in order).
        CONTINUE WHEN pg_current_snapshot()::text = since;
        probes := probes + 1;
        SELECT p.snapshot, p.events, p.endpoint_ids, p.partitions, p.dues
        INTO since, events, endpoint_ids, partitions, dues
        FROM hooklane_published_since_v1(since) p;
        IF events > 0 THEN
            RETURN;
        END IF;
    END LOOP;
    events := 0;
    endpoint_ids := '{}';
    partitions := '{}';
    dues := '{}';
END;
$$;
