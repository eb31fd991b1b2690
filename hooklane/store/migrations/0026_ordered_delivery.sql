-- Hooklane schema, version 26 (issue 42): ordered delivery per key.
--
-- A publish may name an ordering key (hooklane_try_publish_v3 and _v4, and
-- hooklane_publish_v3 and _v4 raising their refusals). For each endpoint
-- and key, at most one delivery is outstanding (due, in flight, or dead
-- and held), and they go in the order their publishing transactions
-- committed (docs/concepts.md, "Ordered delivery per key").
--
-- How, in rows:
--
-- - ordering_positions holds one row per tenant and key, which a publish
--   with the key upserts first: a second transaction publishing the same
--   key waits there until the first commits, and so comes after it. The
--   event keeps its place (events.ordering_position), by which a replay
--   queues a key's events again. That wait is the price of the order, and
--   only publishers of the same key pay it: no other publish touches the
--   row (issue 38).
-- - ordering_keys holds one row per endpoint and key: the last sequence
--   number given (last_seq) and the one at the head (head_seq: the only
--   delivery of the key that may be due; NULL when nothing of the key is
--   outstanding). A publish upserts the rows of its endpoints, in endpoint
--   order, after the key's position: the numbers follow commit order too,
--   and the worker locks these rows, never the position, to move a key
--   on.
-- - Every delivery of a key but its head is queued with next_attempt_at
--   'infinity': the reservation, which reads each endpoint's queue up to
--   now(), never sees it, so it needs no change to keep one delivery of a
--   key in flight, and the other keys of the endpoint use its remaining
--   concurrency. A retried head keeps its backoff; nothing behind it moves.
-- - When a head settles (delivered, discarded, or dead under the
--   endpoint's ordering_on_dead 'skip'), the transaction recording it
--   (hooklane_complete_v6, the resend and discard statements) locks the
--   key's row and makes the next pending delivery of the key due
--   (hooklane_ordering_advance_v1). A head that died under 'hold' holds the
--   key (held_since) until it is resent or discarded.
--
-- With a coalesce key too, an event replaces the pending delivery of the
-- same coalesce key only when that delivery is the last of its ordering
-- key (nothing queued behind it), which then takes the new sequence
-- number; otherwise the event is queued behind. So a later state never
-- jumps ahead of the key's other events, and a receiver sees a gap in the
-- sequence where a state was replaced. An ordered delivery keeps no
-- coalesce key of its own (its event has it), so deliveries_coalesce, one
-- pending delivery per coalesce key, holds unordered ones only, as it
-- always did: the ordered ones are kept apart by the key's lock.
--
-- Rolling upgrade: ordered deliveries need workers of this version
-- (hooklane_complete_v6 advances the keys). Publishers of an earlier
-- version call hooklane_try_publish_v1, redefined here to call v3 without
-- an ordering key: the rows they write are as before.

ALTER TABLE events ADD COLUMN ordering_key text, ADD COLUMN ordering_position bigint;
ALTER TABLE deliveries ADD COLUMN ordering_key text, ADD COLUMN ordering_seq bigint;
ALTER TABLE endpoints ADD COLUMN ordering_on_dead text NOT NULL DEFAULT 'hold'
    CONSTRAINT endpoints_ordering_on_dead_check CHECK (ordering_on_dead IN ('hold', 'skip'));

-- One row per tenant and key: the key's events numbered across every
-- endpoint (events.ordering_position), in the order their transactions
-- committed, taken under this row's lock. A replay queues a key's events
-- again in this order, whatever endpoints they went to.
CREATE TABLE ordering_positions (
    tenant        text NOT NULL,
    key           text NOT NULL,
    last_position bigint NOT NULL,
    -- The key's last publish: forgotten with ordering_keys' rows
    -- (purge_ordering_keys), once its events are past retention.
    touched_at    timestamptz NOT NULL DEFAULT now(),
    -- publish (the upsert)
    PRIMARY KEY (tenant, key)
);

-- purge_ordering_keys: the keys by their last publish
CREATE INDEX ordering_positions_touched_at ON ordering_positions (touched_at);

CREATE TABLE ordering_keys (
    endpoint_id bigint NOT NULL REFERENCES endpoints (id) ON DELETE CASCADE,
    key         text NOT NULL,
    last_seq    bigint NOT NULL,
    head_seq    bigint,
    -- When the head died and the endpoint holds (ordering_on_dead 'hold'):
    -- the key waits until the head is resent or discarded.
    held_since  timestamptz,
    -- Heads that died and were skipped (ordering_on_dead 'skip').
    skipped     bigint NOT NULL DEFAULT 0,
    -- The key's last publish: a key idle past the events' retention, with
    -- nothing outstanding, is forgotten (purge_ordering_keys) and numbered
    -- from 1 again if it comes back.
    touched_at  timestamptz NOT NULL DEFAULT now(),
    -- publish (the upsert), hooklane_ordering_advance_v1 (the lock)
    PRIMARY KEY (endpoint_id, key)
);

-- ordering_keys_held, endpoint_health: an endpoint's keys held back
CREATE INDEX ordering_keys_held ON ordering_keys (endpoint_id, held_since) WHERE held_since IS NOT NULL;

-- purge_ordering_keys: the keys with nothing outstanding, by their last
-- publish
CREATE INDEX ordering_keys_idle ON ordering_keys (touched_at) WHERE head_seq IS NULL;

-- publish (the tail a coalesce key replaces), hooklane_ordering_advance_v1
-- (the head and the next pending of a key): the ordered deliveries only
CREATE UNIQUE INDEX deliveries_ordering ON deliveries (endpoint_id, ordering_key, ordering_seq)
    WHERE ordering_key IS NOT NULL;

-- hooklane_ordering_sweep_v1: the keys with something outstanding
CREATE INDEX ordering_keys_outstanding ON ordering_keys (endpoint_id) WHERE head_seq IS NOT NULL;

-- hooklane_publish_refusal_v1's rules, with the ordering key's.
CREATE FUNCTION hooklane_publish_refusal_v2(tenant text, type text, data jsonb, id text,
                                            coalesce_key text, traceparent text, ordering_key text,
                                            OUT field text, OUT message text)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    SELECT r.field, r.message INTO field, message
    FROM hooklane_publish_refusal_v1(tenant, type, data, id, coalesce_key, traceparent) r;
    IF field IS NOT NULL OR ordering_key IS NULL THEN
        RETURN;
    -- It travels as a header (hooklane-ordering-key), which HTTP keeps to
    -- visible ASCII and spaces: nothing a receiver's framework could read
    -- otherwise than it was written.
    ELSIF octet_length(ordering_key) NOT BETWEEN 1 AND 255 OR ordering_key !~ '^[\x20-\x7e]+$' THEN
        field := 'ordering_key'; message := 'must be 1 to 255 printable ASCII characters (letters, digits, punctuation, spaces)';
    END IF;
END;
$$;

-- The outbox write, as hooklane_try_publish_v1 (migration 0024), with an
-- optional ordering key. Index: endpoints_tenant; primary key of events;
-- deliveries_coalesce for the ON CONFLICT of a keyed unordered publish;
-- publisher_scopes_role_tenant; the primary keys of catalogue_modes,
-- catalogue_types and ordering_keys; deliveries_ordering for the tail a
-- coalesce key replaces.
CREATE FUNCTION hooklane_try_publish_v3(tenant text, type text, data jsonb, id text DEFAULT NULL,
                                        coalesce_key text DEFAULT NULL, traceparent text DEFAULT NULL,
                                        ordering_key text DEFAULT NULL,
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
    p_order text := $7;
    refusal record;
    differs boolean;
    check_mode text;
    type_archived boolean;
    type_deprecated boolean;
    checked record;
    p_version integer;
    p_problem text;
    refused_reason text;
    key_endpoints bigint[];
    key_seqs bigint[];
    key_heads bigint[];
    moved bigint[];
BEGIN
    refusal := hooklane_publish_refusal_v2(p_tenant, p_type, p_data, $4, p_key, p_traceparent, p_order);
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
    IF p_order IS NULL THEN
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
            SELECT hooklane_try_publish_v3.event_id, p_tenant, p_type, p_data, p_key, count(*), p_traceparent,
                   p_version, p_problem, nullif(type_deprecated, false)
            FROM matched
            ON CONFLICT (tenant, id) DO NOTHING
            RETURNING fanout
        ),
        -- Without a key: no row of deliveries_coalesce to conflict with.
        queued AS (
            INSERT INTO deliveries (endpoint_id, event_tenant, event_id, coalesce_key)
            SELECT m.id, p_tenant, hooklane_try_publish_v3.event_id, NULL FROM matched m
            WHERE p_key IS NULL AND EXISTS (SELECT FROM event)
        ),
        coalesced AS (
            INSERT INTO deliveries (endpoint_id, event_tenant, event_id, coalesce_key)
            SELECT m.id, p_tenant, hooklane_try_publish_v3.event_id, p_key FROM matched m
            WHERE p_key IS NOT NULL AND EXISTS (SELECT FROM event)
            ON CONFLICT (endpoint_id, coalesce_key)
                WHERE state = 'pending' AND coalesce_key IS NOT NULL
            DO UPDATE SET event_tenant = EXCLUDED.event_tenant, event_id = EXCLUDED.event_id
        )
        SELECT e.fanout INTO fanout FROM event e;
    ELSE
        -- The event, and the key's row of each endpoint it goes to, locked
        -- in endpoint order (as every publisher and worker takes them, so
        -- that none waits on another in a cycle) and numbered. A row
        -- another transaction holds is waited for until it commits: its
        -- deliveries then come first.
        WITH matched AS (
            SELECT ep.id
            FROM endpoints ep
            WHERE ep.tenant = p_tenant
              AND ep.state = 'active'
              AND hooklane_type_matches(ep.event_types, p_type)
        ),
        -- The key's place in the tenant's commit order, first of the
        -- key's rows (every publisher of the key takes it first).
        placed AS (
            INSERT INTO ordering_positions AS o (tenant, key, last_position)
            VALUES (p_tenant, p_order, 1)
            ON CONFLICT (tenant, key) DO UPDATE
            SET last_position = o.last_position + 1, touched_at = now()
            RETURNING o.last_position
        ),
        event AS (
            INSERT INTO events (id, tenant, type, data, coalesce_key, fanout, traceparent,
                                schema_version, schema_problem, schema_deprecated, ordering_key,
                                ordering_position)
            SELECT hooklane_try_publish_v3.event_id, p_tenant, p_type, p_data, p_key, count(*), p_traceparent,
                   p_version, p_problem, nullif(type_deprecated, false), p_order,
                   (SELECT p.last_position FROM placed p)
            FROM matched
            ON CONFLICT (tenant, id) DO NOTHING
            RETURNING fanout
        ),
        numbered AS (
            INSERT INTO ordering_keys AS k (endpoint_id, key, last_seq, head_seq)
            SELECT m.id, p_order, 1, 1 FROM matched m
            WHERE EXISTS (SELECT FROM event)
            ORDER BY m.id
            ON CONFLICT (endpoint_id, key) DO UPDATE
            SET last_seq = k.last_seq + 1, head_seq = coalesce(k.head_seq, k.last_seq + 1),
                touched_at = now()
            RETURNING k.endpoint_id, k.last_seq, k.head_seq
        )
        SELECT e.fanout,
               (SELECT array_agg(n.endpoint_id ORDER BY n.endpoint_id) FROM numbered n),
               (SELECT array_agg(n.last_seq ORDER BY n.endpoint_id) FROM numbered n),
               (SELECT array_agg(n.head_seq ORDER BY n.endpoint_id) FROM numbered n)
        INTO fanout, key_endpoints, key_seqs, key_heads
        FROM event e;
        IF key_endpoints IS NOT NULL THEN
            -- A new statement, so a new snapshot (read committed): it sees
            -- the deliveries of the transactions the rows were waited on.
            -- A pending delivery of the coalesce key that is the key's
            -- last takes the event and the new number; every other
            -- endpoint gets a delivery, due only if it is the key's head.
            WITH k AS MATERIALIZED (
                SELECT * FROM unnest(key_endpoints, key_seqs, key_heads) AS k(endpoint_id, seq, head)
            ),
            tail AS (
                UPDATE deliveries d
                SET event_tenant = p_tenant, event_id = hooklane_try_publish_v3.event_id,
                    ordering_seq = k.seq
                FROM k
                WHERE p_key IS NOT NULL
                  AND d.endpoint_id = k.endpoint_id
                  AND d.ordering_key = p_order
                  AND d.ordering_seq = k.seq - 1
                  AND d.state = 'pending'
                  AND EXISTS (SELECT FROM events e
                              WHERE e.tenant = d.event_tenant AND e.id = d.event_id
                                AND e.coalesce_key = p_key)
                RETURNING d.endpoint_id, k.head = k.seq - 1 AS was_head
            ),
            queued AS (
                INSERT INTO deliveries (endpoint_id, event_tenant, event_id, coalesce_key, ordering_key,
                                        ordering_seq, next_attempt_at)
                SELECT k.endpoint_id, p_tenant, hooklane_try_publish_v3.event_id, NULL, p_order, k.seq,
                       CASE WHEN k.head = k.seq THEN now() ELSE 'infinity' END
                FROM k
                WHERE NOT EXISTS (SELECT FROM tail t WHERE t.endpoint_id = k.endpoint_id)
            )
            SELECT array_agg(t.endpoint_id) FILTER (WHERE t.was_head) INTO moved FROM tail t;
            IF moved IS NOT NULL THEN
                UPDATE ordering_keys k SET head_seq = k.last_seq
                WHERE k.endpoint_id = ANY(moved) AND k.key = p_order;
            END IF;
        END IF;
    END IF;
    stored := fanout IS NOT NULL;
    IF stored THEN
        RETURN;
    END IF;
    -- A new statement, so a new snapshot (read committed): it sees the
    -- event another transaction committed while the insert waited on it.
    SELECT NOT (e.type = p_type AND e.data = p_data AND e.coalesce_key IS NOT DISTINCT FROM p_key
                AND e.ordering_key IS NOT DISTINCT FROM p_order)
    INTO differs
    FROM events e
    WHERE e.tenant = p_tenant AND e.id = hooklane_try_publish_v3.event_id;
    IF differs THEN
        error_code := 'WH409'; error_field := 'id';
        error_message := format('%s was already published by this tenant with different content '
                                '(type, data, coalesce_key or ordering_key); an id names one event',
                                hooklane_try_publish_v3.event_id);
        event_id := NULL;
        stored := NULL;
    END IF;
END;
$$;

-- hooklane_try_publish_v3 with the data as JSON text, as
-- hooklane_try_publish_v2 is v1's.
CREATE FUNCTION hooklane_try_publish_v4(tenant text, type text, data text, id text DEFAULT NULL,
                                        coalesce_key text DEFAULT NULL, traceparent text DEFAULT NULL,
                                        ordering_key text DEFAULT NULL,
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
    FROM hooklane_try_publish_v3($1, $2, parsed, $4, $5, $6, $7);
END;
$$;

-- Redefined in place, as migrations 0021 and 0024 did and for their
-- reason: every caller of v1 (and of v2, and both hooklane_publish_*,
-- which call it) writes through the one implementation, v3's, without an
-- ordering key: the same rows and refusals as before.
CREATE OR REPLACE FUNCTION hooklane_try_publish_v1(tenant text, type text, data jsonb, id text DEFAULT NULL,
                                        coalesce_key text DEFAULT NULL, traceparent text DEFAULT NULL,
                                        OUT event_id text, OUT stored boolean, OUT fanout integer,
                                        OUT error_code text, OUT error_field text, OUT error_message text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
BEGIN
    SELECT * INTO event_id, stored, fanout, error_code, error_field, error_message
    FROM hooklane_try_publish_v3($1, $2, $3, $4, $5, $6, NULL);
END;
$$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION hooklane_try_publish_v1(text, text, jsonb, text, text, text) '
                   'SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION hooklane_try_publish_v3(text, text, jsonb, text, text, text, text) '
                   'SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION hooklane_try_publish_v4(text, text, text, text, text, text, text) '
                   'SET search_path = %I, pg_temp', current_schema());
END;
$$;

-- hooklane_try_publish_v3 and _v4, raising their refusals as
-- hooklane_publish_v1 raises v1's.
CREATE FUNCTION hooklane_publish_v3(tenant text, type text, data jsonb, id text DEFAULT NULL,
                                    coalesce_key text DEFAULT NULL, traceparent text DEFAULT NULL,
                                    ordering_key text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    r record;
BEGIN
    r := hooklane_try_publish_v3($1, $2, $3, $4, $5, $6, $7);
    IF r.error_code IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = r.error_code, COLUMN = r.error_field,
            MESSAGE = format('%s: %s', r.error_field, r.error_message);
    END IF;
    RETURN r.event_id;
END;
$$;

CREATE FUNCTION hooklane_publish_v4(tenant text, type text, data text, id text DEFAULT NULL,
                                    coalesce_key text DEFAULT NULL, traceparent text DEFAULT NULL,
                                    ordering_key text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    r record;
BEGIN
    r := hooklane_try_publish_v4($1, $2, $3, $4, $5, $6, $7);
    IF r.error_code IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = r.error_code, COLUMN = r.error_field,
            MESSAGE = format('%s: %s', r.error_field, r.error_message);
    END IF;
    RETURN r.event_id;
END;
$$;

REVOKE EXECUTE ON FUNCTION hooklane_try_publish_v3(text, text, jsonb, text, text, text, text),
                           hooklane_publish_v3(text, text, jsonb, text, text, text, text),
                           hooklane_try_publish_v4(text, text, text, text, text, text, text),
                           hooklane_publish_v4(text, text, text, text, text, text, text) FROM PUBLIC;

-- Roles granted hooklane_try_publish_v1 (hooklane publisher grant) may
-- name an ordering key too: the new versions are granted to them.
DO $$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee::regrole::text
        FROM pg_proc p, aclexplode(p.proacl) a
        WHERE p.oid = 'hooklane_try_publish_v1(text, text, jsonb, text, text, text)'::regprocedure
          AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION hooklane_try_publish_v3(text, text, jsonb, text, text, text, text), '
                       'hooklane_publish_v3(text, text, jsonb, text, text, text, text), '
                       'hooklane_try_publish_v4(text, text, text, text, text, text, text), '
                       'hooklane_publish_v4(text, text, text, text, text, text, text) TO %s', grantee);
    END LOOP;
END;
$$;

-- hooklane_reserve_v7 (migration 0020), each delivery with its ordering
-- key and number (NULL for an unordered one and for the verdicts), which
-- the receiver gets as headers, read from the row the reservation updates:
-- a join after it, in a statement of its own snapshot, missed a delivery
-- committed after that snapshot was taken and locked by the reservation
-- (FOR UPDATE reads the newest version), which then went out without its
-- headers. A verdict's head is NULL when all that is pending from the
-- floor waits behind its keys ('infinity'), as when nothing is: a key
-- moving on wakes the endpoint.
-- Index: as hooklane_reserve_v7's.
CREATE FUNCTION hooklane_reserve_v8(owned integer[], candidates bigint[], floors timestamptz[],
                                    caps integer[], apart boolean[], max_rows integer,
                                    lease_grace double precision, worker text,
                                    lookahead double precision, tenant_ceiling integer)
RETURNS TABLE (id bigint, attempts integer, created_at timestamptz, endpoint_id bigint,
               namespace text, name text, url text, secret text, timeout_seconds integer,
               event_id text, type text, data text, event_created_at timestamptz,
               previous_secret text, max_concurrency integer,
               deliverable boolean, paused_until timestamptz, head timestamptz,
               at_limit boolean, leases_end timestamptz, tenant text, traceparent text,
               start_at timestamptz, request_terms text, max_attempts integer,
               max_age_seconds double precision, answered_at timestamptz, rate_per_second integer,
               ordering_key text, ordering_seq bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    lock_key integer;
    locked integer[] := '{}';
BEGIN
    -- The tenants' locks, before anything is counted: a statement after
    -- them sees every round that held one before. Class 0x686C74 ("hlt"),
    -- beside the partitions' "hlp", the workers' "hlm" and the tenant
    -- creates' "hle"; two tenants of one hash share a lock, and only wait
    -- on each other. Released as the round's transaction ends.
    -- Index: primary key of endpoints.
    IF tenant_ceiling IS NOT NULL THEN
        FOR lock_key IN
            SELECT DISTINCT hashtext(ep.tenant)
            FROM endpoints ep
            WHERE ep.id = ANY(candidates) AND ep.partition = ANY(owned)
            ORDER BY 1
        LOOP
            PERFORM pg_advisory_xact_lock(x'686C74'::integer, lock_key);
            locked := locked || lock_key;
        END LOOP;
    END IF;

    -- As hooklane_reserve_v6's (migration 0016), with the caps, the tenants' ceiling and
    -- order. An endpoint whose tenant was not locked (it moved to another
    -- tenant since) waits for the next round.
    -- Index: deliveries_leased for the count; deliveries_tenant_leased for
    -- the tenant's; deliveries_rate for the bucket; deliveries_queue from
    -- each floor; primary key of events.
    RETURN QUERY
    WITH candidate AS (
        SELECT c.endpoint_id, coalesce(c.low, '-infinity') AS low, c.cap,
               coalesce(c.apart, false) AS apart
        FROM unnest(candidates, floors, caps, apart) AS c(endpoint_id, low, cap, apart)
    ),
    slots AS MATERIALIZED (
        SELECT ep.id, ep.tenant, c.low, c.cap, c.apart, ep.rate_per_second::float8 AS rate,
               (ep.rate_burst - 1)::float8 / ep.rate_per_second AS tolerance,
               hooklane_concurrency(ep) - (SELECT count(*)
                                           FROM (SELECT f.lease_expires_at FROM deliveries f
                                                 WHERE f.endpoint_id = ep.id AND f.state = 'sending'
                                                   AND f.lease_expires_at > now()
                                                 ORDER BY f.lease_expires_at OFFSET 0) f) AS free,
               CASE WHEN ep.rate_per_second IS NOT NULL
                    THEN greatest(now(), (SELECT t.rate_tat FROM deliveries t
                                          WHERE t.endpoint_id = ep.id AND t.rate_tat IS NOT NULL
                                          ORDER BY t.rate_tat DESC LIMIT 1)) END AS tat
        FROM candidate c
        -- Each candidate's row by its key, as the verdicts read it: the
        -- conditions are kept out of the scan's reach (an outer join,
        -- filtered above it through coalesce). Given to the scan, they
        -- let a plan made on a new install's statistics read every active
        -- endpoint (endpoints_tenant: the state is one of them) into a
        -- hash to meet a hundred candidates, as hooklane_reserve_v6's (migration 0016) does.
        LEFT JOIN endpoints ep ON ep.id = c.endpoint_id
        WHERE coalesce(ep.partition = ANY(owned)
                       AND hooklane_deliverable(ep)
                       AND (ep.paused_until IS NULL OR ep.paused_until <= now())
                       AND (ep.throttled_until IS NULL OR ep.throttled_until <= now())
                       AND (tenant_ceiling IS NULL OR hashtext(ep.tenant) = ANY(locked)), false)
    ),
    -- What each tenant may still start: its ceiling less its live leases,
    -- counted in their index's order up to the ceiling, no further.
    room AS MATERIALIZED (
        SELECT t.tenant,
               tenant_ceiling - (SELECT count(*)
                                 FROM (SELECT f.lease_expires_at FROM deliveries f
                                       WHERE f.event_tenant = t.tenant AND f.state = 'sending'
                                         AND f.attempts > 0 AND f.lease_expires_at > now()
                                       ORDER BY f.lease_expires_at LIMIT tenant_ceiling) f) AS left_
        FROM (SELECT DISTINCT s.tenant FROM slots s) t
        WHERE tenant_ceiling IS NOT NULL
    ),
    granted AS (
        SELECT s.id, s.tenant, s.low, s.cap, s.apart, s.rate, s.tolerance, s.tat,
               least(CASE WHEN s.rate IS NULL THEN greatest(s.free, 0)
                          ELSE least(greatest(s.free, 0),
                                     greatest(floor((extract(epoch FROM now() - s.tat)::float8 + lookahead
                                                     + s.tolerance) * s.rate)::bigint + 1, 0)) END,
                     CASE WHEN s.cap IS NOT NULL THEN greatest(s.cap, 0) END) AS allowed
        FROM slots s
    ),
    queued AS (
        SELECT q.id, q.state, s.tenant, s.apart, s.rate, s.tolerance, s.tat,
               row_number() OVER (PARTITION BY s.id ORDER BY q.next_attempt_at, q.id) AS pos
        FROM granted s
        CROSS JOIN LATERAL (
            -- SKIP LOCKED: as hooklane_reserve_v6's (migration 0016).
            SELECT d.id, d.state, d.next_attempt_at
            FROM deliveries d
            WHERE d.endpoint_id = s.id
              AND d.state = 'pending'
              AND d.next_attempt_at >= s.low
              AND d.next_attempt_at <= now()
            ORDER BY d.next_attempt_at, d.id
            LIMIT s.allowed
            FOR UPDATE SKIP LOCKED
        ) q
    ),
    -- Each row's place within its tenant (its endpoint's first rows before
    -- their seconds, as endpoints interleave), among all of the tenant's
    -- rows and among those counted in max_rows, in one pass. The ceiling keeps a
    -- tenant's first rows, apart or not; it cuts a tenant's last ones, so
    -- the places of those it keeps stand.
    kept AS (
        SELECT q.*
        FROM (SELECT q.*,
                     count(*) OVER w AS place,
                     count(*) FILTER (WHERE NOT q.apart) OVER w AS counted_place
              FROM queued q
              WINDOW w AS (PARTITION BY q.tenant ORDER BY q.pos, q.id ROWS UNBOUNDED PRECEDING)) q
        LEFT JOIN room r ON r.tenant = q.tenant
        WHERE tenant_ceiling IS NULL OR q.place <= r.left_
    ),
    -- The rows counted in max_rows by their place among their tenant's
    -- (every tenant's first before any tenant's second), up to max_rows;
    -- every row apart, which its cap bounds.
    taken AS (
        (SELECT k.id, k.state, k.rate, k.tolerance, k.tat, k.pos
         FROM kept k WHERE NOT k.apart
         ORDER BY k.counted_place, k.id LIMIT max_rows)
        UNION ALL
        SELECT k.id, k.state, k.rate, k.tolerance, k.tat, k.pos FROM kept k WHERE k.apart
    ),
    chosen AS (
        SELECT q.id, q.state,
               CASE WHEN q.rate IS NULL THEN now()
                    ELSE greatest(now(), q.tat + make_interval(secs => (q.pos - 1) / q.rate
                                                                       - q.tolerance)) END AS start_at,
               q.tat + make_interval(secs => q.pos / q.rate) AS rate_tat
        FROM taken q
    ),
    -- The rows to update, found by primary key from the array: joined to
    -- `chosen` alone, a plan made on a nearly empty table's statistics
    -- read the whole key to meet the rows of both branches of `taken`.
    ids AS (
        SELECT array_agg(s.id) AS ids FROM chosen s
    ),
    reserved AS (
        UPDATE deliveries d
        SET state = CASE WHEN hooklane_tenant_discard(d.event_tenant, ep.tenant) IS NULL
                         THEN 'sending' ELSE 'discarded' END,
            attempts = CASE WHEN hooklane_tenant_discard(d.event_tenant, ep.tenant) IS NULL
                            THEN d.attempts + 1 ELSE d.attempts END,
            reserved_at = now(),
            attempted_by = CASE WHEN hooklane_tenant_discard(d.event_tenant, ep.tenant) IS NULL
                                THEN worker ELSE d.attempted_by END,
            lease_expires_at = CASE WHEN hooklane_tenant_discard(d.event_tenant, ep.tenant) IS NULL
                                    THEN s.start_at + make_interval(secs => ep.timeout_seconds
                                                                            + lease_grace)
                               END,
            rate_tat = CASE WHEN hooklane_tenant_discard(d.event_tenant, ep.tenant) IS NULL
                            THEN coalesce(s.rate_tat, d.rate_tat) ELSE d.rate_tat END,
            last_error = coalesce(hooklane_tenant_discard(d.event_tenant, ep.tenant), d.last_error)
        FROM chosen s, endpoints ep, events e
        WHERE d.id = ANY((SELECT i.ids FROM ids i)::bigint[])
          AND d.id = s.id
          AND d.state = s.state
          AND ep.id = d.endpoint_id
          AND e.tenant = d.event_tenant
          AND e.id = d.event_id
        RETURNING d.id, d.attempts, d.created_at, d.endpoint_id,
                  ep.namespace, ep.name, ep.url, ep.secret, ep.timeout_seconds,
                  e.id AS event_id, e.type, e.data::text AS data, e.created_at AS event_created_at,
                  CASE WHEN ep.previous_secret_until > now() THEN ep.previous_secret END
                    AS previous_secret,
                  hooklane_concurrency(ep) AS max_concurrency, d.state, e.tenant, e.traceparent,
                  s.start_at, ep.request_terms, ep.max_attempts, ep.max_age_seconds,
                  ep.rate_per_second, d.ordering_key, d.ordering_seq
    )
    SELECT r.id, r.attempts, r.created_at, r.endpoint_id, r.namespace, r.name, r.url, r.secret,
           r.timeout_seconds, r.event_id, r.type, r.data, r.event_created_at, r.previous_secret,
           r.max_concurrency, NULL::boolean, NULL::timestamptz, NULL::timestamptz, NULL::boolean,
           NULL::timestamptz, r.tenant, r.traceparent, r.start_at, r.request_terms, r.max_attempts,
           r.max_age_seconds, NULL::timestamptz, r.rate_per_second, r.ordering_key, r.ordering_seq
    FROM reserved r
    WHERE r.state = 'sending';

    -- The verdicts, as hooklane_reserve_v6's (migration 0016); an endpoint is also at its
    -- limit while its tenant's live leases are at the ceiling, until the
    -- first of them ends (`leases_end`, unless its own slots are all held:
    -- then the first of its own), and its verdict then names its tenant,
    -- so that a worker may look again when a call of that tenant's ends.
    -- Each tenant's leases are counted once.
    -- Index: primary key of endpoints; deliveries_queue from each floor;
    -- deliveries_leased for the live leases; deliveries_tenant_leased for
    -- the tenant's; deliveries_rate.
    RETURN QUERY
    WITH tenant_leases AS MATERIALIZED (
        SELECT t.tenant, l.n >= tenant_ceiling AS full_, l.ends
        FROM (SELECT DISTINCT ep.tenant FROM endpoints ep
              WHERE ep.id = ANY(candidates) AND ep.partition = ANY(owned)
                AND tenant_ceiling IS NOT NULL) t
        CROSS JOIN LATERAL (
            SELECT count(*) AS n, min(f.lease_expires_at) AS ends
            FROM (SELECT f.lease_expires_at
                  FROM deliveries f
                  WHERE f.event_tenant = t.tenant
                    AND f.state = 'sending'
                    AND f.attempts > 0
                    AND f.lease_expires_at > now()
                  ORDER BY f.lease_expires_at LIMIT tenant_ceiling) f
        ) l
    )
    SELECT NULL::bigint, NULL::integer, NULL::timestamptz, c.endpoint_id,
           NULL::text, NULL::text, NULL::text, NULL::text, NULL::integer,
           NULL::text, NULL::text, NULL::text, NULL::timestamptz, NULL::text,
           hooklane_concurrency(ep), k.ok,
           greatest(ep.paused_until, ep.throttled_until,
                    b.tat - make_interval(secs => lookahead / 2
                                          + (ep.rate_burst - 1)::float8 / ep.rate_per_second)),
           nullif(h.head, 'infinity'), coalesce(l.n >= hooklane_concurrency(ep), false) OR coalesce(k.ok AND tl.full_, false),
           CASE WHEN coalesce(l.n >= hooklane_concurrency(ep), false) OR NOT coalesce(k.ok AND tl.full_, false)
                THEN l.ends ELSE tl.ends END,
           CASE WHEN k.ok AND tl.full_ THEN ep.tenant END, NULL::text,
           NULL::timestamptz, NULL::text, NULL::integer, NULL::float8, clock_timestamp(), NULL::integer,
           NULL::text, NULL::bigint
    FROM unnest(candidates, floors) AS c(endpoint_id, low)
    LEFT JOIN endpoints ep ON ep.id = c.endpoint_id
    CROSS JOIN LATERAL (
        SELECT coalesce(ep.partition = ANY(owned) AND hooklane_deliverable(ep), false) AS ok
    ) k
    LEFT JOIN tenant_leases tl ON tl.tenant = ep.tenant
    LEFT JOIN LATERAL (
        SELECT min(d.next_attempt_at) AS head
        FROM deliveries d
        WHERE k.ok
          AND d.endpoint_id = c.endpoint_id
          AND d.state = 'pending'
          AND d.next_attempt_at >= coalesce(c.low, '-infinity')
    ) h ON true
    LEFT JOIN LATERAL (
        SELECT count(*) AS n, min(f.lease_expires_at) AS ends
        FROM (SELECT f.lease_expires_at
              FROM deliveries f
              WHERE k.ok
                AND f.endpoint_id = c.endpoint_id
                AND f.state = 'sending'
                AND f.lease_expires_at > now()
              ORDER BY f.lease_expires_at OFFSET 0) f
    ) l ON true
    LEFT JOIN LATERAL (
        SELECT t.rate_tat AS tat
        FROM deliveries t
        WHERE k.ok
          AND ep.rate_per_second IS NOT NULL
          AND t.endpoint_id = c.endpoint_id
          AND t.rate_tat IS NOT NULL
        ORDER BY t.rate_tat DESC
        LIMIT 1
    ) b ON true;
END;
$$;

-- Move keys on: for each (endpoint, key) given whose head has settled
-- (delivered, discarded, gone, or dead under the endpoint's
-- ordering_on_dead 'skip'), the next pending delivery of the key becomes
-- due and the head; a head dead under 'hold' holds the key (held_since)
-- until it is resent or discarded. A key whose row a publishing
-- transaction holds is not waited for: it is returned as busy (due NULL),
-- to be moved on once that transaction ends (the worker tries again; its
-- sweep catches what a crash left). Returns the promoted deliveries'
-- endpoints with their due time, and the busy keys. Promoted endpoints
-- outside `owned` (NULL: all) are notified to their owner.
-- Index: primary keys of ordering_keys and endpoints; deliveries_ordering
-- for the head and the next pending of each key.
CREATE FUNCTION hooklane_ordering_advance_v1(endpoint_ids bigint[], keys text[], owned integer[])
RETURNS TABLE (endpoint_id bigint, partition integer, key text, due timestamptz)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    got_endpoints bigint[];
    got_keys text[];
BEGIN
    -- In the publishers' order: endpoint, then key.
    SELECT array_agg(k.endpoint_id ORDER BY k.endpoint_id, k.key), array_agg(k.key ORDER BY k.endpoint_id, k.key)
    INTO got_endpoints, got_keys
    FROM (SELECT k.endpoint_id, k.key
          FROM ordering_keys k
          WHERE (k.endpoint_id, k.key) IN (SELECT DISTINCT u.e, u.k FROM unnest(endpoint_ids, keys) AS u(e, k))
          ORDER BY k.endpoint_id, k.key
          FOR UPDATE OF k SKIP LOCKED) k;
    -- A new statement, so a new snapshot (read committed): it sees what the
    -- transactions that held the rows before committed.
    RETURN QUERY
    WITH keyed AS MATERIALIZED (
        SELECT k.endpoint_id, k.key, k.head_seq, k.held_since, h.state AS head_state,
               ep.ordering_on_dead, ep.partition
        FROM unnest(got_endpoints, got_keys) AS g(endpoint_id, key)
        JOIN ordering_keys k ON k.endpoint_id = g.endpoint_id AND k.key = g.key
        JOIN endpoints ep ON ep.id = k.endpoint_id
        LEFT JOIN deliveries h ON h.endpoint_id = k.endpoint_id AND h.ordering_key = k.key
                              AND h.ordering_seq = k.head_seq
        WHERE k.head_seq IS NOT NULL
    ),
    moving AS (
        SELECT kk.endpoint_id, kk.key, kk.partition, kk.head_state, n.id AS next_id, n.ordering_seq AS next_seq
        FROM keyed kk
        LEFT JOIN LATERAL (
            SELECT n.id, n.ordering_seq
            FROM deliveries n
            WHERE n.endpoint_id = kk.endpoint_id
              AND n.ordering_key = kk.key
              AND n.ordering_seq > kk.head_seq
              AND n.state = 'pending'
            ORDER BY n.ordering_seq
            LIMIT 1
        ) n ON true
        WHERE kk.head_state IS NULL
           OR kk.head_state IN ('delivered', 'discarded')
           OR (kk.head_state = 'dead' AND kk.ordering_on_dead = 'skip')
    ),
    promoted AS (
        UPDATE deliveries d
        SET next_attempt_at = now()
        FROM moving m
        WHERE d.id = m.next_id
          AND d.state = 'pending'
        RETURNING d.endpoint_id, m.partition, m.key, d.next_attempt_at
    ),
    -- Runs whether or not it is read, as every data-modifying WITH does.
    advanced AS (
        UPDATE ordering_keys k
        SET head_seq = m.next_seq, held_since = NULL,
            skipped = k.skipped + CASE WHEN m.head_state = 'dead' THEN 1 ELSE 0 END
        FROM moving m
        WHERE k.endpoint_id = m.endpoint_id AND k.key = m.key
    ),
    -- A dead head under 'hold' holds its key; a head pending or in flight
    -- (resent) does not. Disjoint from `moving`.
    held AS (
        UPDATE ordering_keys k
        SET held_since = CASE WHEN kk.head_state = 'dead' THEN now() END
        FROM keyed kk
        WHERE k.endpoint_id = kk.endpoint_id AND k.key = kk.key
          AND (kk.head_state IN ('pending', 'sending')
               OR (kk.head_state = 'dead' AND kk.ordering_on_dead = 'hold'))
          AND (k.held_since IS NULL) = (kk.head_state = 'dead')
    ),
    woken AS (
        SELECT hooklane_wake_v2(array_agg(p.endpoint_id), array_agg(p.partition), array_agg(p.next_attempt_at))
        FROM promoted p
        WHERE owned IS NULL OR NOT p.partition = ANY(owned)
    )
    SELECT p.endpoint_id, p.partition, p.key, p.next_attempt_at FROM promoted p, woken
    UNION ALL
    SELECT u.e, NULL::integer, u.k, NULL::timestamptz
    FROM (SELECT DISTINCT u.e, u.k FROM unnest(endpoint_ids, keys) AS u(e, k)) u
    WHERE EXISTS (SELECT FROM ordering_keys k WHERE k.endpoint_id = u.e AND k.key = u.k)
      AND NOT EXISTS (SELECT FROM unnest(got_endpoints, got_keys) AS g(e, k) WHERE g.e = u.e AND g.k = u.k);
END;
$$;

-- Record a batch of results: hooklane_complete_v5, then the keys of the
-- batch's ordered deliveries (ordered_endpoints and ordered_keys, one pair
-- per delivery, as the reservation gave them) moved on in the same
-- transaction (hooklane_ordering_advance_v1). Each endpoint's row as v5's,
-- its retried_head the earlier of its retry and a delivery promoted, and
-- `ordering_busy` the keys a publishing transaction held (NULL: none). A
-- promoted endpoint that v5 returned no row for (its result was fenced
-- off) is notified to its owner.
CREATE FUNCTION hooklane_complete_v6(ids bigint[], fences integer[], outcomes text[],
                                     retry_ins double precision[], statuses integer[], errors text[],
                                     failures text[], started_ats timestamptz[],
                                     durations double precision[], retry_afters double precision[],
                                     trace_ids text[], worker text,
                                     threshold integer, step_seconds double precision,
                                     cap_seconds double precision, owned integer[],
                                     delivered_step double precision, adapt_step double precision,
                                     ordered_endpoints bigint[], ordered_keys text[])
RETURNS TABLE (id bigint, partition integer, namespace text, name text, state text,
               paused_until timestamptz, consecutive_failures integer, deliverable boolean,
               retried_head timestamptz, opened boolean, deactivated boolean,
               throttled_until timestamptz, effective_concurrency integer, lowered boolean,
               ordering_busy text[])
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    c_id bigint[]; c_partition integer[]; c_namespace text[]; c_name text[]; c_state text[];
    c_paused_until timestamptz[]; c_failures integer[]; c_deliverable boolean[];
    c_retried_head timestamptz[]; c_opened boolean[]; c_deactivated boolean[];
    c_throttled_until timestamptz[]; c_effective integer[]; c_lowered boolean[];
    a_endpoints bigint[]; a_partitions integer[]; a_keys text[]; a_dues timestamptz[];
BEGIN
    IF coalesce(cardinality(ordered_endpoints), 0) = 0 THEN
        RETURN QUERY
        SELECT c.*, NULL::text[]
        FROM hooklane_complete_v5(ids, fences, outcomes, retry_ins, statuses, errors, failures, started_ats,
                                  durations, retry_afters, trace_ids, worker, threshold, step_seconds,
                                  cap_seconds, owned, delivered_step, adapt_step) c;
        RETURN;
    END IF;
    SELECT array_agg(c.id), array_agg(c.partition), array_agg(c.namespace), array_agg(c.name),
           array_agg(c.state), array_agg(c.paused_until), array_agg(c.consecutive_failures),
           array_agg(c.deliverable), array_agg(c.retried_head), array_agg(c.opened),
           array_agg(c.deactivated), array_agg(c.throttled_until), array_agg(c.effective_concurrency),
           array_agg(c.lowered)
    INTO c_id, c_partition, c_namespace, c_name, c_state, c_paused_until, c_failures, c_deliverable,
         c_retried_head, c_opened, c_deactivated, c_throttled_until, c_effective, c_lowered
    FROM hooklane_complete_v5(ids, fences, outcomes, retry_ins, statuses, errors, failures, started_ats,
                              durations, retry_afters, trace_ids, worker, threshold, step_seconds,
                              cap_seconds, owned, delivered_step, adapt_step) c;
    SELECT array_agg(a.endpoint_id), array_agg(a.partition), array_agg(a.key), array_agg(a.due)
    INTO a_endpoints, a_partitions, a_keys, a_dues
    FROM hooklane_ordering_advance_v1(ordered_endpoints, ordered_keys, owned) a;
    PERFORM hooklane_wake_v2(array_agg(a.e), array_agg(a.p), array_agg(a.due))
    FROM unnest(a_endpoints, a_partitions, a_dues) AS a(e, p, due)
    WHERE a.due IS NOT NULL AND a.p = ANY(owned) AND NOT a.e = ANY(coalesce(c_id, '{}'))
    HAVING count(*) > 0;
    RETURN QUERY
    SELECT r.id, r.partition, r.namespace, r.name, r.state, r.paused_until, r.consecutive_failures,
           r.deliverable, least(r.retried_head, p.due), r.opened, r.deactivated, r.throttled_until,
           r.effective_concurrency, r.lowered, b.keys
    FROM unnest(c_id, c_partition, c_namespace, c_name, c_state, c_paused_until, c_failures, c_deliverable,
                c_retried_head, c_opened, c_deactivated, c_throttled_until, c_effective, c_lowered)
         AS r(id, partition, namespace, name, state, paused_until, consecutive_failures, deliverable,
              retried_head, opened, deactivated, throttled_until, effective_concurrency, lowered)
    LEFT JOIN (SELECT a.e, min(a.due) AS due FROM unnest(a_endpoints, a_dues) AS a(e, due)
               WHERE a.due IS NOT NULL GROUP BY a.e) p ON p.e = r.id
    LEFT JOIN (SELECT a.e, array_agg(a.k ORDER BY a.k) AS keys FROM unnest(a_endpoints, a_keys, a_dues) AS a(e, k, due)
               WHERE a.due IS NULL GROUP BY a.e) b ON b.e = r.id;
END;
$$;

-- The keys of the owned partitions whose head settled without its key
-- moving on (a worker that died between the two, a key a publisher held
-- when its head was recorded, a head discarded by an endpoint's change),
-- up to `max_keys` of them, moved on as hooklane_ordering_advance_v1 does.
-- Index: endpoints_partition; ordering_keys_outstanding per endpoint;
-- deliveries_ordering for each head.
CREATE FUNCTION hooklane_ordering_sweep_v1(owned integer[], max_keys integer)
RETURNS TABLE (endpoint_id bigint, partition integer, key text, due timestamptz)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    s_endpoints bigint[];
    s_keys text[];
BEGIN
    SELECT array_agg(s.endpoint_id), array_agg(s.key) INTO s_endpoints, s_keys
    FROM (
        SELECT k.endpoint_id, k.key
        FROM endpoints ep
        JOIN ordering_keys k ON k.endpoint_id = ep.id AND k.head_seq IS NOT NULL
        LEFT JOIN deliveries h ON h.endpoint_id = k.endpoint_id AND h.ordering_key = k.key
                              AND h.ordering_seq = k.head_seq
        WHERE ep.partition = ANY(owned)
          AND (h.state IS NULL OR h.state IN ('delivered', 'discarded')
               OR (h.state = 'dead' AND (ep.ordering_on_dead = 'skip' OR k.held_since IS NULL))
               OR (h.state IN ('pending', 'sending') AND k.held_since IS NOT NULL))
        LIMIT max_keys
    ) s;
    IF s_endpoints IS NOT NULL THEN
        RETURN QUERY SELECT * FROM hooklane_ordering_advance_v1(s_endpoints, s_keys, owned);
    END IF;
END;
$$;

-- Queue again, behind their keys, the given pending deliveries of
-- ordered events (resent, or queued again by a replay): the head of its
-- key, resent, is due at once and its key no longer held; any other gets
-- the key's next number, in id order, and waits behind the key's
-- outstanding deliveries, or is due at once, as the key's head, if none
-- is. So a delivery skipped or replayed reaches the receiver with a number
-- above every one it already got. Waits for the keys' rows (an admin
-- action, not the worker's loop). Returns the deliveries made due, with
-- their endpoints and partitions, to be woken.
-- Index: primary keys of deliveries and ordering_keys; deliveries_ordering
-- (the unique numbers).
CREATE FUNCTION hooklane_ordering_requeue_v1(ids bigint[])
RETURNS TABLE (endpoint_id bigint, partition integer, due timestamptz)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
BEGIN
    INSERT INTO ordering_keys AS k (endpoint_id, key, last_seq)
    SELECT DISTINCT d.endpoint_id, d.ordering_key, 0
    FROM deliveries d
    WHERE d.id = ANY(ids) AND d.ordering_key IS NOT NULL
    ORDER BY 1, 2
    ON CONFLICT (endpoint_id, key) DO NOTHING;
    PERFORM
    FROM ordering_keys k
    WHERE (k.endpoint_id, k.key) IN (SELECT d.endpoint_id, d.ordering_key FROM deliveries d
                                     WHERE d.id = ANY(ids) AND d.ordering_key IS NOT NULL)
    ORDER BY k.endpoint_id, k.key
    FOR UPDATE OF k;
    RETURN QUERY
    WITH given AS MATERIALIZED (
        SELECT d.id, d.endpoint_id, d.ordering_key AS key, k.head_seq, k.last_seq,
               coalesce(d.ordering_seq = k.head_seq, false) AS is_head
        FROM deliveries d
        JOIN ordering_keys k ON k.endpoint_id = d.endpoint_id AND k.key = d.ordering_key
        WHERE d.id = ANY(ids) AND d.state = 'pending'
    ),
    numbered AS (
        SELECT g.id, g.endpoint_id, g.key,
               g.last_seq + row_number() OVER (PARTITION BY g.endpoint_id, g.key ORDER BY g.id) AS seq
        FROM given g
        WHERE NOT g.is_head
    ),
    placed AS (
        UPDATE deliveries d
        SET ordering_seq = coalesce(n.seq, d.ordering_seq),
            next_attempt_at = CASE WHEN g.is_head OR (g.head_seq IS NULL AND n.seq = g.last_seq + 1)
                                   THEN now() ELSE 'infinity' END
        FROM given g
        LEFT JOIN numbered n ON n.id = g.id
        WHERE d.id = g.id
        RETURNING d.endpoint_id, d.next_attempt_at
    ),
    -- Runs whether or not it is read, as every data-modifying WITH does.
    keyed AS (
        UPDATE ordering_keys k
        SET last_seq = k.last_seq + c.added,
            head_seq = CASE WHEN c.added > 0 THEN coalesce(k.head_seq, k.last_seq + 1) ELSE k.head_seq END,
            held_since = CASE WHEN c.head_resent THEN NULL ELSE k.held_since END
        FROM (SELECT g.endpoint_id, g.key, count(*) FILTER (WHERE NOT g.is_head) AS added,
                     bool_or(g.is_head) AS head_resent
              FROM given g GROUP BY g.endpoint_id, g.key) c
        WHERE k.endpoint_id = c.endpoint_id AND k.key = c.key
    )
    SELECT p.endpoint_id, ep.partition, p.next_attempt_at
    FROM placed p
    JOIN endpoints ep ON ep.id = p.endpoint_id
    WHERE p.next_attempt_at < 'infinity';
END;
$$;
