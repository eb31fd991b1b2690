-- Hooklane schema, version 19 (issue 38): a publish sends no NOTIFY, so
-- that publishing transactions no longer commit one at a time.
--
-- PostgreSQL takes one lock for the whole instance from a notifying
-- transaction's pre-commit until its commit is flushed (and, with a
-- synchronous standby, acknowledged), so that notifications queue in
-- commit order. hooklane_try_publish_v1 notified each matched endpoint's
-- owner (hooklane_wake_v2) from inside the application's transaction, so
-- every application transaction that published waited for every other
-- one's commit, whatever it touched. It now writes its rows and nothing
-- else; workers of this version find committed events themselves, in
-- commit order (queries.sql: published_since, on the new index below).
--
-- hooklane_try_publish_v1 is redefined in place, against the rule that a
-- released function never is (CONTRIBUTING.md), as migration 0015 did and
-- for the same reason: the hazard is in every caller of v1. What a caller
-- gets stays the same: the arguments, the result, the refusals, the rows
-- written, its privileges (CREATE OR REPLACE keeps the owner and every
-- grant, so roles granted EXECUTE keep it) and its scope. Only the worker
-- observed the NOTIFY. A v3 would leave every application that calls v1
-- (the Python drivers, the publishing examples, any SQL of its own)
-- serialised until its owners changed their SQL and granted again.
-- hooklane_try_publish_v2 and both hooklane_publish_* call v1 and change
-- with it.
--
-- Rolling upgrade: publishers of every version call v1, so from this
-- migration on none notifies. Workers of this version learn of their
-- events by the probe, whoever published them. Workers of the previous
-- version learn of them only by their sweep (HOOKLANE_SWEEP_SECONDS, 60 s
-- by default) until they are replaced: upgrade the workers promptly after
-- migrating. hooklane_wake_v2 stays: Hooklane's own processes (resends,
-- replays, endpoint changes, retries recorded by another worker) notify
-- with it from their own transactions.

-- published_since: the events committed since a snapshot, in the order of
-- their transactions. events_tenant_xact leads with the tenant, so it
-- cannot find every tenant's newest events at once.
CREATE INDEX events_xact ON events (xact);

-- What was published since a worker's last probe (queries.sql:
-- published_since, which says what it answers). A function, so that its
-- statement is planned once per session (plan_cache_mode): the workers'
-- sessions plan every statement anew (WORKER_SESSION), which took 0.34 ms
-- a probe against 0.06 ms to run it on a quiet database, and a worker
-- probes every 5 ms while events come. The deliveries of each event are read by
-- their event (OFFSET 0 keeps it a nested loop of index probes, whatever
-- the statistics say of the events found), never by a scan of every
-- pending delivery: their state is tested above the OFFSET, out of the
-- probe's reach, as the partial index deliveries_queue (state 'pending')
-- would otherwise serve it too, and a plan made while the tables were
-- empty chose it, scanning every pending delivery once per event found
-- (37 s for a probe finding 16,500 events).
-- Index: events_xact; deliveries_event; primary key of endpoints.
CREATE FUNCTION hooklane_published_since_v1(since text)
RETURNS TABLE (snapshot text, events bigint, endpoint_ids bigint[], partitions integer[],
               dues timestamptz[])
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY
    WITH fresh AS MATERIALIZED (
        SELECT e.tenant, e.id FROM events e
        WHERE e.xact >= pg_snapshot_xmax(since::pg_snapshot)
        UNION ALL
        SELECT e.tenant, e.id FROM events e
        WHERE e.xact = ANY (ARRAY(SELECT pg_snapshot_xip(since::pg_snapshot)))
    ),
    woken AS (
        SELECT d.endpoint_id, ep.partition, min(d.next_attempt_at) AS due
        FROM fresh f
        CROSS JOIN LATERAL (
            SELECT q.endpoint_id, q.next_attempt_at, q.state FROM deliveries q
            WHERE q.event_tenant = f.tenant AND q.event_id = f.id
            OFFSET 0
        ) d
        JOIN endpoints ep ON ep.id = d.endpoint_id
        WHERE d.state = 'pending'
        GROUP BY d.endpoint_id, ep.partition
    )
    SELECT pg_current_snapshot()::text,
           (SELECT count(*) FROM fresh),
           coalesce(array_agg(w.endpoint_id ORDER BY w.endpoint_id), '{}'),
           coalesce(array_agg(w.partition ORDER BY w.endpoint_id), '{}'),
           coalesce(array_agg(w.due ORDER BY w.endpoint_id), '{}')
    FROM woken w;
END;
$$;

CREATE OR REPLACE FUNCTION hooklane_try_publish_v1(tenant text, type text, data jsonb, id text DEFAULT NULL,
                                        coalesce_key text DEFAULT NULL, traceparent text DEFAULT NULL,
                                        OUT event_id text, OUT stored boolean, OUT fanout integer,
                                        OUT error_code text, OUT error_field text, OUT error_message text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_column
DECLARE
    -- The arguments share their names with columns of events: the
    -- statements below read columns by those names, and these copies.
    p_tenant text := $1;
    p_type text := $2;
    p_data jsonb := $3;
    p_key text := $5;
    p_traceparent text := $6;
    refusal record;
    differs boolean;
BEGIN
    refusal := hooklane_publish_refusal_v1(p_tenant, p_type, p_data, $4, p_key, p_traceparent);
    IF refusal.field IS NOT NULL THEN
        error_code := 'WH422'; error_field := refusal.field; error_message := refusal.message;
        RETURN;
    END IF;
    -- Index: publisher_scopes_role_tenant.
    IF NOT pg_has_role(session_user, current_user, 'MEMBER')
       AND NOT EXISTS (SELECT FROM publisher_scopes s
                       WHERE s.role = session_user AND coalesce(s.tenant, '') IN ('', p_tenant)) THEN
        error_code := 'WH403'; error_field := 'tenant';
        error_message := format('role %s may not publish for tenant %s: its publishing scope does not '
                                'include it (hooklane publisher grant)', session_user, p_tenant);
        RETURN;
    END IF;
    event_id := coalesce($4, 'msg_' || replace(gen_random_uuid()::text, '-', ''));
    WITH matched AS (
        SELECT ep.id, ep.partition
        FROM endpoints ep
        WHERE ep.tenant = p_tenant
          AND ep.state = 'active'
          AND hooklane_type_matches(ep.event_types, p_type)
    ),
    event AS (
        INSERT INTO events (id, tenant, type, data, coalesce_key, fanout, traceparent)
        SELECT hooklane_try_publish_v1.event_id, p_tenant, p_type, p_data, p_key, count(*), p_traceparent
        FROM matched
        ON CONFLICT (tenant, id) DO NOTHING
        RETURNING fanout
    ),
    queued AS (
        INSERT INTO deliveries (endpoint_id, event_tenant, event_id, coalesce_key)
        SELECT m.id, p_tenant, hooklane_try_publish_v1.event_id, p_key FROM matched m
        WHERE EXISTS (SELECT FROM event)
        ON CONFLICT (endpoint_id, coalesce_key)
            WHERE state = 'pending' AND coalesce_key IS NOT NULL
        DO UPDATE SET event_tenant = EXCLUDED.event_tenant, event_id = EXCLUDED.event_id
    )
    SELECT e.fanout INTO fanout FROM event e;
    stored := fanout IS NOT NULL;
    IF stored THEN
        RETURN;
    END IF;
    -- A new statement, so a new snapshot (read committed): it sees the
    -- event another transaction committed while the insert waited on it.
    SELECT NOT (e.type = p_type AND e.data = p_data AND e.coalesce_key IS NOT DISTINCT FROM p_key)
    INTO differs
    FROM events e
    WHERE e.tenant = p_tenant AND e.id = hooklane_try_publish_v1.event_id;
    IF differs THEN
        error_code := 'WH409'; error_field := 'id';
        error_message := format('%s was already published by this tenant with different content '
                                '(type, data or coalesce_key); an id names one event',
                                hooklane_try_publish_v1.event_id);
        event_id := NULL;
        stored := NULL;
    END IF;
END;
$$;

-- CREATE OR REPLACE sets every attribute anew: the search_path pinned by
-- migration 0015 is pinned again.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION hooklane_try_publish_v1(text, text, jsonb, text, text, text) '
                   'SET search_path = %I, pg_temp', current_schema());
END;
$$;
