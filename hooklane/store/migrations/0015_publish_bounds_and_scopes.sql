-- Hooklane schema, version 15 (issue 37): the publish functions bounded in
-- their cost by the limits they enforce, and the tenants a role may
-- publish for.
--
-- hooklane_publish_refusal_v1 and hooklane_try_publish_v1 are redefined in
-- place, against the rule that a released function never is
-- (CONTRIBUTING.md), because what they fix is a crash and a leak that
-- every caller of v1 has, not a change of contract: the arguments, the
-- result and every answer to an input they answered before stay the same.
-- What changes: an input that raised an error (a stack overflow for data
-- nested ~11,000 deep, an out-of-memory error for a few kilobytes of
-- numbers such as 1e131071, each printed as 131,072 digits) is now refused
-- in the row, as the contract always said; and a role outside the owner's
-- is refused (WH403) for a tenant its scope does not name. A new v1 would
-- leave the old one callable, and so every role granted it able to crash
-- its own transaction and to read other tenants' ids by oracle.
--
-- hooklane_try_publish_v2 and hooklane_publish_v2 are v1 with the data as
-- JSON text, parsed inside the function: a jsonb argument is parsed by the
-- caller's statement, before any function runs, and PostgreSQL's parser
-- overflows its stack at ~14,000 levels (max_stack_depth 2MB), which would
-- abort the caller's transaction whatever the function did.
--
-- Rolling upgrade: v1's callers go on unchanged; every role that could
-- publish before keeps publishing for every tenant (below).

-- The tenants each database role may publish for, by the name the
-- connection logged in as (session_user). A NULL tenant: every tenant.
-- The owner of the publish functions (Hooklane's role), its members and
-- superusers need none: they can write the tables themselves.
CREATE TABLE publisher_scopes (
    role       text NOT NULL CHECK (length(role) BETWEEN 1 AND 63),
    tenant     text CHECK (length(tenant) BETWEEN 1 AND 253),
    granted_at timestamptz NOT NULL DEFAULT now()
);
-- hooklane_try_publish_v1's scope check (one role's scope for one tenant
-- or for all, '' standing for NULL, which no tenant is), the CLI's grant
-- (ON CONFLICT) and list.
CREATE UNIQUE INDEX publisher_scopes_role_tenant ON publisher_scopes (role, coalesce(tenant, ''));

-- Why a publish is refused, if it is: as in version 12, each rule now
-- bounded in its cost by its limit, whatever the input (see the body).
CREATE OR REPLACE FUNCTION hooklane_publish_refusal_v1(tenant text, type text, data jsonb, id text,
                                                       coalesce_key text, traceparent text,
                                                       OUT field text, OUT message text)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
-- Every publish pays for these, so no pattern has a bounded repetition
-- ({1,255} took 30 us a call, a tenth of the whole publish: lengths are
-- compared instead). Each rule costs no more than its limit allows,
-- whatever the argument: a text's bytes are compared before its
-- characters are counted (octet_length reads a header; length reads the
-- text), no pattern runs on a text longer than its limit, no walk of the
-- data recurses past level 64, and the data is printed whole only once
-- its binary size and its numbers bound the printed size
-- (bench/publish_function.py).
DECLARE
    printed text;
    candidates jsonb;
    numbers_refused boolean;
BEGIN
    -- The C0 and C1 controls of hooklane/checks.py (Postgres text holds
    -- no NUL, nor a lone surrogate).
    IF tenant IS NULL THEN
        field := 'tenant'; message := 'is required';
    ELSIF octet_length(tenant) > 4 * 253 OR length(tenant) NOT BETWEEN 1 AND 253 THEN
        field := 'tenant'; message := 'must be a string of 1 to 253 characters';
    ELSIF tenant ~ '[\x01-\x1f\x7f-\x9f]' THEN
        field := 'tenant'; message := 'must not contain control characters';
    ELSIF type IS NULL OR octet_length(type) > 4 * 255 OR length(type) > 255
          OR type !~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$' THEN
        field := 'type'; message := 'must be a dotted event type like ''order.updated''';
    ELSIF data IS NULL OR jsonb_typeof(data) <> 'object' THEN
        field := 'data'; message := 'must be a JSON object';
    ELSIF id IS NOT NULL AND (octet_length(id) > 255 OR id !~ '^[A-Za-z0-9_.:-]+$') THEN
        field := 'id'; message := 'must be 1 to 255 characters of letters, digits and _.:-';
    ELSIF coalesce_key IS NOT NULL
          AND (octet_length(coalesce_key) > 4 * 255 OR length(coalesce_key) NOT BETWEEN 1 AND 255) THEN
        field := 'coalesce_key'; message := 'is required: a string of 1 to 255 characters';
    ELSIF coalesce_key ~ '[\x01-\x1f\x7f-\x9f]' THEN
        field := 'coalesce_key'; message := 'must not contain control characters';
    -- jsonb's binary form is at most 4 times its printed text (an array
    -- of 1s: a 4-byte entry and an aligned 8-byte numeric per ", 1"), so
    -- a binary over 8 times the limit prints over the limit: refused
    -- unprinted and unwalked. `#> '{}'` is the data decompressed, as a
    -- value read from a table may come compressed.
    ELSIF pg_column_size(data #> '{}') > 8 * 262144 THEN
        field := 'data'; message := 'is larger than 262144 bytes';
    -- Receivers' parsers recurse: an array or object 64 levels down (the
    -- data itself is level 0) is refused, as hooklane.checks.MAX_DEPTH.
    -- Level 64 exactly: any deeper one has an ancestor there, and the walk
    -- goes no further down ({64 to last} recursed to the bottom, and
    -- overflowed the stack at ~11,000 levels).
    ELSIF jsonb_path_exists(data, 'strict $.**{64} ? (@.type() == "object" || @.type() == "array")') THEN
        field := 'data'; message := 'nests deeper than 64 levels';
    END IF;
    IF field IS NOT NULL THEN
        RETURN;
    END IF;
    -- Integers every receiver reads back exactly: 64 bits, signed or
    -- unsigned. A number jsonb prints without a fraction is one, however
    -- the producer wrote it (1e20 is printed as 21 digits). The numbers
    -- whose text may be many times their binary are among those beyond
    -- 2^63 (1e131071: 131,072 digits) and those within 1e-19 of zero
    -- (0e-16383, 1e-16383: 16,385 characters); any other prints in at
    -- most its own stored digits and 21 more. Those are collected in one
    -- walk (.abs() of a non-number is no match), then printed one by one
    -- until one is an integer out of range or together they pass the
    -- size limit.
    candidates := jsonb_path_query_array(data, 'strict $.** ? (@.abs() > 9223372036854775807 '
                                                 '|| @.abs() < 1e-19)');
    IF candidates <> '[]' THEN
        SELECT n.out_of_range INTO numbers_refused
        FROM (
            SELECT strpos(p.text, '.') = 0
                   AND (c.number::numeric < -9223372036854775808
                        OR c.number::numeric > 18446744073709551615) AS out_of_range,
                   sum(octet_length(p.text)) OVER (ROWS UNBOUNDED PRECEDING) AS bytes
            FROM jsonb_array_elements(candidates) AS c(number),
                 LATERAL (SELECT c.number::text) AS p(text)
        ) AS n
        WHERE n.out_of_range OR n.bytes > 262144
        LIMIT 1;
        IF numbers_refused THEN
            field := 'data'; message := 'has an integer outside the 64-bit range';
        ELSIF NOT numbers_refused THEN
            field := 'data'; message := 'is larger than 262144 bytes';
        END IF;
    END IF;
    IF field IS NOT NULL THEN
        RETURN;
    END IF;
    -- What is sent: a receiver gets data::text as the body's "data". At
    -- most a few times the binary now, 2 MiB at most.
    printed := data::text;
    IF octet_length(printed) > 262144 THEN
        field := 'data'; message := 'is larger than 262144 bytes';
    ELSIF traceparent IS NOT NULL
          AND (octet_length(traceparent) <> 55 OR traceparent !~ '^00-[0-9a-f]+-[0-9a-f]+-[0-9a-f]+$'
               OR substr(traceparent, 36, 1) <> '-' OR substr(traceparent, 53, 1) <> '-') THEN
        field := 'traceparent';
        message := 'must be a W3C traceparent: 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>, lowercase';
    ELSIF substr(traceparent, 4, 32) = repeat('0', 32) THEN
        field := 'traceparent'; message := 'has an all-zero trace id, which W3C Trace Context forbids';
    ELSIF substr(traceparent, 37, 16) = repeat('0', 16) THEN
        field := 'traceparent'; message := 'has an all-zero parent span id, which W3C Trace Context forbids';
    END IF;
END;
$$;

-- The outbox write, as in version 12 (its comment in schema.sql), with the
-- caller's scope checked once the arguments pass and before anything is
-- read: a role refused for a tenant learns nothing of it (not whether an
-- id exists, nor its content, nor how many endpoints take a type) and
-- writes nothing. session_user, the role the connection logged in as:
-- inside this function current_user is the owner's.
CREATE OR REPLACE FUNCTION hooklane_try_publish_v1(tenant text, type text, data jsonb, id text DEFAULT NULL,
                                                   coalesce_key text DEFAULT NULL,
                                                   traceparent text DEFAULT NULL,
                                                   OUT event_id text, OUT stored boolean, OUT fanout integer,
                                                   OUT error_code text, OUT error_field text,
                                                   OUT error_message text)
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
    ),
    woken AS (
        SELECT hooklane_wake_v2(array_agg(m.id), array_agg(m.partition), array_agg(now()))
        FROM matched m
        WHERE EXISTS (SELECT FROM event)
    )
    SELECT (SELECT e.fanout FROM event e) INTO fanout FROM woken;
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

-- hooklane_try_publish_v1 with the data as JSON text, which it parses
-- itself: every input, whatever its text, is answered in the row. The
-- parse runs in a subtransaction (the EXCEPTION block), the only way
-- PostgreSQL 15 has to try a conversion; it writes nothing, so it is given
-- no transaction id of its own and costs none of what subtransactions cost
-- under load (pg_subtrans lookups, the 64-per-backend cache). A text over
-- 16 times the limit is refused before it is parsed: room for any
-- indentation and \u escapes of data that prints within it.
CREATE FUNCTION hooklane_try_publish_v2(tenant text, type text, data text, id text DEFAULT NULL,
                                        coalesce_key text DEFAULT NULL, traceparent text DEFAULT NULL,
                                        OUT event_id text, OUT stored boolean, OUT fanout integer,
                                        OUT error_code text, OUT error_field text, OUT error_message text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    parsed jsonb;
    problem text;
    detail text;
    refusal record;
BEGIN
    IF octet_length(data) > 16 * 262144 THEN
        problem := 'is more than 4194304 bytes of JSON text';
    ELSE
        BEGIN
            parsed := data::jsonb;
        EXCEPTION
            WHEN statement_too_complex THEN
                problem := 'nests deeper than 64 levels';
            WHEN data_exception OR program_limit_exceeded THEN
                GET STACKED DIAGNOSTICS problem = MESSAGE_TEXT, detail = PG_EXCEPTION_DETAIL;
                problem := 'is not JSON that PostgreSQL can store: '
                           || problem || coalesce(' (' || nullif(detail, '') || ')', '');
        END;
    END IF;
    IF problem IS NOT NULL THEN
        -- The rules of the arguments checked before the data's still come
        -- first.
        refusal := hooklane_publish_refusal_v1($1, $2, '{}', NULL, NULL, NULL);
        error_code := 'WH422';
        error_field := coalesce(refusal.field, 'data');
        error_message := coalesce(refusal.message, problem);
        RETURN;
    END IF;
    SELECT * INTO event_id, stored, fanout, error_code, error_field, error_message
    FROM hooklane_try_publish_v1($1, $2, parsed, $4, $5, $6);
END;
$$;

-- The schema the functions and the tables were created in: the first of
-- the migration's search_path. (CREATE OR REPLACE reset v1's.)
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION hooklane_try_publish_v1(text, text, jsonb, text, text, text) '
                   'SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION hooklane_try_publish_v2(text, text, text, text, text, text) '
                   'SET search_path = %I, pg_temp', current_schema());
END;
$$;

-- hooklane_try_publish_v2, raising its refusal, as hooklane_publish_v1
-- raises v1's.
CREATE FUNCTION hooklane_publish_v2(tenant text, type text, data text, id text DEFAULT NULL,
                                    coalesce_key text DEFAULT NULL, traceparent text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    r record;
BEGIN
    r := hooklane_try_publish_v2($1, $2, $3, $4, $5, $6);
    IF r.error_code IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = r.error_code, COLUMN = r.error_field,
            MESSAGE = format('%s: %s', r.error_field, r.error_message);
    END IF;
    RETURN r.event_id;
END;
$$;

REVOKE EXECUTE ON FUNCTION hooklane_try_publish_v2(text, text, text, text, text, text),
                           hooklane_publish_v2(text, text, text, text, text, text) FROM PUBLIC;

-- What every role that could publish before may do now: publish for every
-- tenant, through v1 as before and through v2 too. Refusing them would stop
-- every producer the moment this migration ran, before the platform could
-- say which tenants each may publish for; narrowing a role's scope is the
-- platform's own step (`hooklane publisher`, docs/publishing.md).
DO $$
DECLARE
    owner oid := (SELECT proowner FROM pg_proc
                  WHERE oid = 'hooklane_try_publish_v1(text, text, jsonb, text, text, text)'::regprocedure);
    r record;
BEGIN
    FOR r IN
        SELECT rolname FROM pg_roles
        WHERE (has_function_privilege(oid, 'hooklane_try_publish_v1(text, text, jsonb, text, text, text)',
                                      'EXECUTE')
               OR has_function_privilege(oid, 'hooklane_publish_v1(text, text, jsonb, text, text, text)',
                                         'EXECUTE'))
          AND NOT pg_has_role(oid, owner, 'MEMBER')
    LOOP
        INSERT INTO publisher_scopes (role, tenant) VALUES (r.rolname, NULL);
        EXECUTE format('GRANT EXECUTE ON FUNCTION hooklane_try_publish_v2(text, text, text, text, text, text), '
                       'hooklane_publish_v2(text, text, text, text, text, text) TO %I', r.rolname);
    END LOOP;
END;
$$;
