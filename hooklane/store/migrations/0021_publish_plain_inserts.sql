-- Hooklane schema, version 21 (issue 38): a publish without a coalesce
-- key inserts its deliveries plainly, not as ON CONFLICT's speculative
-- insertions.
--
-- hooklane_try_publish_v1 inserted every delivery with ON CONFLICT on
-- deliveries_coalesce, so that a pending delivery of the same coalesce key
-- to the same endpoint is replaced. PostgreSQL makes each row of such an
-- insert a speculative insertion, whatever its values: a probe of the
-- arbiter index, a lock on the row's speculative token taken and released
-- in the shared lock table, the heap insert, and a second WAL record
-- confirming it. A delivery without a key cannot conflict there (the
-- index holds only rows with one), so all of it bought nothing for the
-- publishes that name no key, most of them: at 16 connections an
-- application transaction publishing an event to 4 endpoints ran at
-- 0.88-0.90x one writing the same rows by hand (docs/benchmarks.md,
-- section 15). Without a key the deliveries are now inserted plainly; with
-- one, as before. The event's own insert keeps its ON CONFLICT: an id may
-- be published again, by this transaction or by another at the same time.
--
-- Redefined in place, as migrations 0015 and 0019 did and for their
-- reason: every caller of v1 (the drivers, the examples, an application's
-- own SQL, hooklane_try_publish_v2 and both hooklane_publish_*) gains it
-- without changing a line or a grant. Nothing a caller sees changes: the
-- arguments, the result, the refusals, the rows written (the same rows,
-- the same values) and the locks other transactions may wait on (none
-- but the same event id's, and a coalesced pending delivery's).
--
-- Rolling upgrade: nothing to do; workers of every version read the same
-- rows.

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
    -- Without a key: no row of deliveries_coalesce to conflict with.
    queued AS (
        INSERT INTO deliveries (endpoint_id, event_tenant, event_id, coalesce_key)
        SELECT m.id, p_tenant, hooklane_try_publish_v1.event_id, NULL FROM matched m
        WHERE p_key IS NULL AND EXISTS (SELECT FROM event)
    ),
    coalesced AS (
        INSERT INTO deliveries (endpoint_id, event_tenant, event_id, coalesce_key)
        SELECT m.id, p_tenant, hooklane_try_publish_v1.event_id, p_key FROM matched m
        WHERE p_key IS NOT NULL AND EXISTS (SELECT FROM event)
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
