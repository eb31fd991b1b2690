-- Hooklane schema, version 24 (issue 41): published events are checked
-- against the event catalogue, in hooklane_try_publish_v1.
--
-- Every publish path ends in hooklane_try_publish_v1: hooklane.publish and
-- its psycopg and SQLAlchemy callers, the API's group commit, the CLI,
-- hooklane_publish_v1/v2 and hooklane_try_publish_v2. The check is written
-- there once, after the arguments' and the scope's rules and before the
-- insert (docs/catalogue.md, "Checking events at publish"):
--
-- - the mode is the tenant's row of catalogue_modes, else the row of
--   tenant '', else 'off';
-- - an archived type is refused (WH422, field type), whatever the mode;
-- - under 'off' nothing else happens: two primary-key lookups of tables of
--   a few rows (bench/catalogue_publish.py measures what they cost);
-- - an unknown type is refused under 'enforce', stored with
--   schema_problem set under 'warn';
-- - a known type's data is validated against its versions, newest first:
--   the first that validates is stored as schema_version; none refuses it
--   under 'enforce' (WH422, field data, naming the path inside data and
--   the schema's rule) and marks it under 'warn';
-- - a deprecated type (deprecated_since today or before) is accepted and
--   marked schema_deprecated, which events_schema_deprecated counts.
--
-- Each refusal of the check inserts a row of catalogue_refusals in the
-- publisher's transaction. Nothing is counted in a row that every publish
-- updates: such a row would serialise the commits of every publisher
-- (issue 38). A refusal is a row of its own; the events a warning marked
-- and those of deprecated types are counted from events, by the partial
-- indexes events_schema_problem and events_schema_deprecated.
--
-- The validation itself is the jsonschema library's (draft 2020-12),
-- running in PostgreSQL: hooklane_catalogue_problem_v1, a PL/Python
-- function. PL/Python is an untrusted language, which only a superuser
-- may create and which a managed service may not offer: this migration
-- does not need it. `hooklane catalogue mode warn|enforce` creates it
-- (hooklane/store/catalogue_check.sql) when a mode first asks for it, and
-- refuses with what to install where it cannot. PL/pgSQL resolves the
-- call only when the branch runs, so under 'off' a database without
-- PL/Python publishes as before.
--
-- Redefined in place, as migrations 0015, 0019 and 0021 did and for their
-- reason: every caller of v1 (the drivers, the examples, an application's
-- own SQL, hooklane_try_publish_v2 and both hooklane_publish_*) gains the
-- check without changing a line or a grant. With no mode set and no type
-- archived, nothing a caller sees changes.
--
-- Rolling upgrade: nothing to do. Workers of every version read the same
-- rows; publishers of version 23 call the same function.

-- Whether the event's type was deprecated when it was published (NULL:
-- it was not, or the type is not in the catalogue).
ALTER TABLE events ADD COLUMN schema_deprecated boolean;
-- event_type_counts: the events of deprecated types, by type and time;
-- only those are in it.
CREATE INDEX events_schema_deprecated ON events (type, created_at) WHERE schema_deprecated;

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
    check_mode text;
    type_archived boolean;
    type_deprecated boolean;
    checked record;
    p_version integer;
    p_problem text;
    refused_reason text;
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
    -- The event catalogue's check (migration 0024). Index: the primary
    -- keys of catalogue_modes and catalogue_types.
    SELECT m.mode INTO check_mode
    FROM catalogue_modes m
    WHERE m.tenant IN (p_tenant, '')
    ORDER BY m.tenant DESC
    LIMIT 1;
    SELECT t.archived, t.deprecated_since <= current_date INTO type_archived, type_deprecated
    FROM catalogue_types t
    WHERE t.name = p_type;
    IF type_archived THEN
        error_field := 'type'; refused_reason := 'archived';
        error_message := format('%s is archived in the event catalogue: it is no longer published', p_type);
    ELSIF coalesce(check_mode, 'off') = 'off' THEN
        NULL;
    ELSIF type_archived IS NULL THEN
        -- Not in the catalogue (archived is NOT NULL in every row).
        error_field := 'type'; refused_reason := 'unknown';
        error_message := format('%s is not in the event catalogue (hooklane eventtype apply, or a '
                                'WebhookEventType resource, adds it)', p_type);
    ELSE
        -- hooklane_catalogue_problem_v1 exists once a mode other than
        -- 'off' was set (hooklane/store/catalogue_check.sql). The data goes
        -- as text: the jsonb transform would make every number a Decimal,
        -- which JSON Schema's "integer" refuses.
        checked := hooklane_catalogue_problem_v1(p_type, p_data::text);
        p_version := checked.version;
        IF checked.problem IS NOT NULL THEN
            error_field := 'data'; refused_reason := 'schema'; error_message := checked.problem;
        END IF;
    END IF;
    IF refused_reason IS NOT NULL THEN
        IF refused_reason = 'archived' OR check_mode = 'enforce' THEN
            INSERT INTO catalogue_refusals (tenant, type, reason, message)
            VALUES (p_tenant, p_type, refused_reason, error_message);
            error_code := 'WH422';
            RETURN;
        END IF;
        -- 'warn': stored, and marked.
        p_problem := format('%s: %s', error_field, error_message);
        error_field := NULL; error_message := NULL;
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
        INSERT INTO events (id, tenant, type, data, coalesce_key, fanout, traceparent,
                            schema_version, schema_problem, schema_deprecated)
        SELECT hooklane_try_publish_v1.event_id, p_tenant, p_type, p_data, p_key, count(*), p_traceparent,
               p_version, p_problem, nullif(type_deprecated, false)
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
