-- Hooklane schema, version 3: an event is identified by (tenant, id), never
-- by its id alone; deliveries that must not go out any more are discarded
-- with a reason; signing secrets rotate with an overlap and may be stored
-- encrypted.
--
-- Rolling upgrade: workers of version 2 keep working against this schema
-- (they read `hooklane_reserve` by column name and record results as
-- before). Publishers of version 2 do not: their `ON CONFLICT (id)` has no
-- unique index left to match, so their publish fails (and the application's
-- transaction rolls back: nothing is lost silently) until they run version 3
-- code. Upgrade publishing applications together with the migration.

-- Events: the same id from two tenants is two events.
ALTER TABLE deliveries DROP CONSTRAINT deliveries_event_id_fkey;
ALTER TABLE events DROP CONSTRAINT events_pkey;
ALTER TABLE events ADD PRIMARY KEY (tenant, id);

-- A delivery names its event by both parts. The tenant is the event's, not
-- the endpoint's: the two differ once an endpoint moves to another tenant,
-- which is how reservation recognises what it must never send.
ALTER TABLE deliveries ADD COLUMN event_tenant text;
UPDATE deliveries d SET event_tenant = e.tenant FROM events e WHERE e.id = d.event_id;
ALTER TABLE deliveries ALTER COLUMN event_tenant SET NOT NULL;
ALTER TABLE deliveries
    ADD CONSTRAINT deliveries_event_fkey FOREIGN KEY (event_tenant, event_id)
    REFERENCES events (tenant, id) ON DELETE CASCADE;

-- purge_events: the deliveries of one event
DROP INDEX deliveries_event;
CREATE INDEX deliveries_event ON deliveries (event_tenant, event_id);

-- 'discarded': will never be sent, and no resend brings it back (resend_dead
-- takes 'dead' only). last_error says why.
ALTER TABLE deliveries DROP CONSTRAINT deliveries_state_check;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_state_check
    CHECK (state IN ('pending', 'sending', 'delivered', 'dead', 'discarded'));

-- Signing secrets: `secret` (and `previous_secret`) hold either the whsec_
-- text, or `enc:v1:<key id>:<base64>` sealed with HOOKLANE_ENCRYPTION_KEY
-- (hooklane/secrets.py); the database never sees the key. The previous
-- secret is signed with too until `previous_secret_until`, so that a
-- receiver can switch keys without refusing a delivery.
ALTER TABLE endpoints
    ADD COLUMN previous_secret text,
    ADD COLUMN previous_secret_until timestamptz,
    ADD CONSTRAINT endpoints_previous_secret_check
        CHECK ((previous_secret IS NULL) = (previous_secret_until IS NULL));

-- The reservation of version 2, with two changes: a chosen delivery whose
-- event belongs to another tenant than its endpoint now does (the endpoint
-- changed tenant after it was queued, in a publish that was still open, or
-- while it was in flight) is discarded instead of sent; and the previous
-- secret, while valid, is returned too. `previous_secret` is appended as the
-- last column on purpose: workers of version 2 read the rows by name
-- (`SELECT *`), so they keep working while the new ones roll out. A new
-- column changes the function's type, hence DROP and CREATE rather than
-- CREATE OR REPLACE.
DROP FUNCTION hooklane_reserve(integer[], integer, double precision);
CREATE FUNCTION hooklane_reserve(owned integer[], max_rows integer, lease_grace double precision)
RETURNS TABLE (id bigint, attempts integer, created_at timestamptz, endpoint_id bigint,
               namespace text, name text, url text, secret text, timeout_seconds integer,
               event_id text, type text, data text, event_created_at timestamptz,
               previous_secret text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    candidates bigint[];
BEGIN
    PERFORM hooklane_absorb_wakeups(owned);

    -- Step 2: the endpoints that have waited longest, locked until the
    -- reservation commits so that a result recorded meanwhile (which makes
    -- its endpoint ready again) waits for step 4's verdict instead of being
    -- overwritten by it. Rows a result is updating right now are skipped:
    -- they will be ready on the next round.
    -- Index: ready_endpoints_ready_at.
    SELECT array_agg(r.endpoint_id) INTO candidates
    FROM (SELECT endpoint_id
          FROM ready_endpoints
          WHERE ready_at <= now()
            AND partition = ANY(owned)
          ORDER BY ready_at
          LIMIT max_rows
          FOR UPDATE SKIP LOCKED) r;
    IF candidates IS NULL THEN
        RETURN;
    END IF;

    -- Step 3: due deliveries of the candidates, never more per endpoint than
    -- its free concurrency, ordered by position within each endpoint's queue
    -- so that endpoints interleave: the first of each before the second of
    -- any. Those of another tenant's event are discarded in the same
    -- statement; they took a slot of this round only, and the endpoint stays
    -- ready for the next.
    -- Index: deliveries_in_flight for the count; deliveries_queue for the
    -- first rows of each endpoint's queue; primary key of events.
    RETURN QUERY
    WITH slots AS (
        SELECT ep.id,
               ep.max_concurrency - (SELECT count(*) FROM deliveries f
                                     WHERE f.endpoint_id = ep.id AND f.state = 'sending') AS free
        FROM endpoints ep
        WHERE ep.id = ANY(candidates)
          AND ep.state = 'active'
          AND NOT ep.paused
          AND ep.secret IS NOT NULL
          AND (ep.paused_until IS NULL OR ep.paused_until <= now())
    ),
    queued AS (
        SELECT c.id, row_number() OVER (PARTITION BY s.id ORDER BY c.next_attempt_at, c.id) AS pos
        FROM slots s
        CROSS JOIN LATERAL (
            -- SKIP LOCKED: a pending row is locked by a publish coalescing
            -- into it, in an application transaction that may stay open
            -- for long; the reservation takes the next one rather than
            -- wait (and hold up the worker) until it commits.
            SELECT d.id, d.next_attempt_at
            FROM deliveries d
            WHERE d.endpoint_id = s.id
              AND d.state = 'pending'
              AND d.next_attempt_at <= now()
            ORDER BY d.next_attempt_at, d.id
            LIMIT greatest(s.free, 0)
            FOR UPDATE SKIP LOCKED
        ) c
    ),
    chosen AS (
        SELECT q.id FROM queued q ORDER BY q.pos, q.id LIMIT max_rows
    ),
    reserved AS (
        UPDATE deliveries d
        SET state = CASE WHEN d.event_tenant = ep.tenant THEN 'sending' ELSE 'discarded' END,
            attempts = CASE WHEN d.event_tenant = ep.tenant THEN d.attempts + 1 ELSE d.attempts END,
            reserved_at = now(),
            lease_expires_at = CASE WHEN d.event_tenant = ep.tenant
                                    THEN now() + make_interval(secs => ep.timeout_seconds + lease_grace)
                               END,
            last_error = CASE WHEN d.event_tenant = ep.tenant THEN d.last_error
                              ELSE format('discarded: the endpoint''s tenant changed from %s to %s',
                                          d.event_tenant, ep.tenant)
                         END
        FROM chosen s, endpoints ep, events e
        WHERE d.id = s.id
          AND d.state = 'pending'
          AND ep.id = d.endpoint_id
          AND e.tenant = d.event_tenant
          AND e.id = d.event_id
        RETURNING d.id, d.attempts, d.created_at, d.endpoint_id,
                  ep.namespace, ep.name, ep.url, ep.secret, ep.timeout_seconds,
                  e.id AS event_id, e.type, e.data::text AS data, e.created_at AS event_created_at,
                  CASE WHEN ep.previous_secret_until > now() THEN ep.previous_secret END
                    AS previous_secret,
                  d.state
    )
    SELECT r.id, r.attempts, r.created_at, r.endpoint_id, r.namespace, r.name, r.url, r.secret,
           r.timeout_seconds, r.event_id, r.type, r.data, r.event_created_at, r.previous_secret
    FROM reserved r
    WHERE r.state = 'sending';

    PERFORM hooklane_rerate(candidates);
END;
$$;
