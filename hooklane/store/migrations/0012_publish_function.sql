-- Hooklane schema, version 12 (issue 24): publishing is a database
-- contract. Every rule of a publish lives in these functions, so that an
-- application in any language publishes inside its own transaction with
-- one call, and hooklane.publish, the CLI and the ingest API are callers
-- of the same functions. docs/publishing.md is the callers' contract:
-- the arguments, the result, and the SQLSTATEs of a refusal (WH422: the
-- input, naming the argument; WH409: an id the tenant already published
-- with other content).
--
-- Rolling upgrade: nothing is replaced. Publishers of earlier versions go
-- on writing with their own statement, which stores what these do.

-- Why a publish is refused, if it is: the first rule the arguments break,
-- as the argument's name and the reason; NULLs when none is. Reads no
-- table. hooklane.publish.check_event holds the same rules, checked before
-- any SQL for messages that quote the value and the path in the data;
-- tests/test_publish_function.py feeds both the same inputs.
CREATE FUNCTION hooklane_publish_refusal_v1(tenant text, type text, data jsonb, id text,
                                            coalesce_key text, traceparent text,
                                            OUT field text, OUT message text)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
-- Every publish pays for these, so no pattern has a bounded repetition
-- ({1,255} took 30 us a call, a tenth of the whole publish: lengths are
-- compared instead), and the data is walked once, for its depth: its
-- printed text, which its size needs anyway, tells whether any number
-- could be out of range (bench/publish_function.py).
DECLARE
    printed text;
BEGIN
    -- The C0 and C1 controls of hooklane/checks.py (Postgres text holds
    -- no NUL, nor a lone surrogate).
    IF tenant IS NULL THEN
        field := 'tenant'; message := 'is required';
    ELSIF length(tenant) NOT BETWEEN 1 AND 253 THEN
        field := 'tenant'; message := 'must be a string of 1 to 253 characters';
    ELSIF tenant ~ '[\x01-\x1f\x7f-\x9f]' THEN
        field := 'tenant'; message := 'must not contain control characters';
    ELSIF type IS NULL OR length(type) > 255
          OR type !~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$' THEN
        field := 'type'; message := 'must be a dotted event type like ''order.updated''';
    ELSIF data IS NULL OR jsonb_typeof(data) <> 'object' THEN
        field := 'data'; message := 'must be a JSON object';
    ELSIF id IS NOT NULL AND (length(id) > 255 OR id !~ '^[A-Za-z0-9_.:-]+$') THEN
        field := 'id'; message := 'must be 1 to 255 characters of letters, digits and _.:-';
    ELSIF coalesce_key IS NOT NULL AND length(coalesce_key) NOT BETWEEN 1 AND 255 THEN
        field := 'coalesce_key'; message := 'is required: a string of 1 to 255 characters';
    ELSIF coalesce_key ~ '[\x01-\x1f\x7f-\x9f]' THEN
        field := 'coalesce_key'; message := 'must not contain control characters';
    -- Receivers' parsers recurse: an array or object 64 levels down (the
    -- data itself is level 0) is refused, as hooklane.checks.MAX_DEPTH.
    ELSIF jsonb_path_exists(data, 'strict $.**{64 to last} ? (@.type() == "object" || @.type() == "array")') THEN
        field := 'data'; message := 'nests deeper than 64 levels';
    END IF;
    IF field IS NOT NULL THEN
        RETURN;
    END IF;
    -- What is sent: a receiver gets data::text as the body's "data".
    printed := data::text;
    -- Integers every receiver reads back exactly: 64 bits, signed or
    -- unsigned. A number jsonb prints without a fraction is one, however
    -- the producer wrote it (1e20 is printed as 21 digits); one out of
    -- range has 19 digits in a row at least, which the text shows without
    -- a walk.
    IF printed ~ '[0-9]{19}' AND EXISTS (
        SELECT FROM jsonb_path_query(
            data, 'strict $.** ? (@ < -9223372036854775808 || @ > 18446744073709551615)'
        ) AS n
        WHERE strpos(n::text, '.') = 0
    ) THEN
        field := 'data'; message := 'has an integer outside the 64-bit range';
    ELSIF octet_length(printed) > 262144 THEN
        field := 'data'; message := 'is larger than 262144 bytes';
    ELSIF traceparent IS NOT NULL
          AND (length(traceparent) <> 55 OR traceparent !~ '^00-[0-9a-f]+-[0-9a-f]+-[0-9a-f]+$'
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

-- The outbox write, refusals reported in the result rather than raised, so
-- that a refused publish leaves the caller's transaction as it was: no
-- savepoint, no subtransaction. One row: `event_id` and `stored` (true:
-- stored now with `fanout` deliveries, 0 when no endpoint matched, an
-- unrouted event kept and counted; false: the tenant had already stored
-- this very event under this id, and nothing more is stored), or
-- `error_code` ('WH422', 'WH409'), `error_field` and `error_message`
-- with everything else NULL.
-- An id left NULL is made here, as 'msg_' and 32 hex digits. The storing
-- statement is what queries.sql's `publish` was before: the event, one
-- delivery per active endpoint of the tenant whose event types match
-- (hooklane_type_matches), a coalesce key replacing the pending delivery
-- of the same key to the same endpoint, and the wakeup of each endpoint's
-- owner with the time its delivery is due from, this transaction's now()
-- (hooklane_wake_v2; NOTIFY is delivered at commit, duplicates folded; no
-- row is written for it). Nothing here updates a row that exists already
-- but a coalesced pending delivery, which reservation skips while it is
-- locked: a long application transaction never holds a lock a worker
-- waits on.
-- The endpoints that got work are `matched` itself whenever `event` stored
-- the event: `queued` turns every matched endpoint into one delivery row,
-- inserted or (a pending one of the same key) updated, as ON CONFLICT DO
-- UPDATE without a WHERE never skips a row. So nothing joins `matched` to
-- another CTE: a CTE's row estimate comes from the statistics of
-- `endpoints`, which may say 1 row for a tenant of 10,000 until the table
-- is analysed, and a nested loop over two CTE scans of 10,000 rows each
-- took 28 s (issue 18). `EXISTS (SELECT FROM event)` is evaluated once.
-- An id the tenant stored already is not stored again; the stored event is
-- compared (type, data as jsonb, coalesce key) so that a different event
-- under a reused id is refused rather than dropped. The trace context is
-- the event's own, stored and not compared: the same event published
-- again from another trace is the same event.
-- Index: endpoints_tenant; primary key of events; deliveries_coalesce for
-- the ON CONFLICT.
-- SECURITY DEFINER: it runs with its owner's (Hooklane's) privileges, so
-- that an application's role needs EXECUTE on it and nothing on the
-- tables; EXECUTE is revoked from PUBLIC below, so that only the roles
-- granted it publish. Its search_path is pinned to its own schema (below)
-- and pg_temp last, so that no caller's object is found in place of
-- Hooklane's.
CREATE FUNCTION hooklane_try_publish_v1(tenant text, type text, data jsonb, id text DEFAULT NULL,
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

-- The schema the function and the tables were created in: the first of the
-- migration's search_path.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION hooklane_try_publish_v1(text, text, jsonb, text, text, text) '
                   'SET search_path = %I, pg_temp', current_schema());
END;
$$;

-- hooklane_try_publish_v1, raising its refusal: SQLSTATE WH422 or WH409,
-- the message "<argument>: <reason>", and the argument's name in the
-- error's column field. Returns the event id. A refusal raised inside a
-- transaction aborts it, as any error does: a caller that wants to go on
-- calls it inside a savepoint, or calls hooklane_try_publish_v1.
CREATE FUNCTION hooklane_publish_v1(tenant text, type text, data jsonb, id text DEFAULT NULL,
                                    coalesce_key text DEFAULT NULL, traceparent text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    r record;
BEGIN
    r := hooklane_try_publish_v1($1, $2, $3, $4, $5, $6);
    IF r.error_code IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = r.error_code, COLUMN = r.error_field,
            MESSAGE = format('%s: %s', r.error_field, r.error_message);
    END IF;
    RETURN r.event_id;
END;
$$;

-- Publishing is granted, not given: GRANT EXECUTE ON FUNCTION
-- hooklane_try_publish_v1, hooklane_publish_v1 TO the application's role
-- (docs/publishing.md). The owner keeps it.
REVOKE EXECUTE ON FUNCTION hooklane_try_publish_v1(text, text, jsonb, text, text, text),
                           hooklane_publish_v1(text, text, jsonb, text, text, text) FROM PUBLIC;
