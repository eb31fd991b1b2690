-- Hooklane schema, version 6 (issue 18): the event-type rule written once,
-- for publish and replay alike; and a `complete` that says which circuits it
-- opened and which endpoints it deactivated.
--
-- Rolling upgrade: nothing is changed or dropped. Workers of the previous
-- release keep calling `hooklane_complete` beside new ones calling
-- `hooklane_complete_v2`; publishers of the previous release keep their
-- own spelling of the event-type rule, which is the same rule.
-- `hooklane_complete`, which no code of this release calls, is dropped by a
-- migration of the next release.
--
-- No index is added. Replay (`replay_since`) walks the endpoint's tenant's
-- events through events_tenant_xact, checking created_at on its included
-- column, page by page; an index on (tenant, created_at) would save that
-- walk the tenant's events from before the replay's start, once per
-- replay, at the cost of one more index entry on every publish, which
-- migration 0005 took away on purpose (events_tenant_created_at).

-- Whether an endpoint with these event-type patterns receives an event of
-- this type: no patterns means every type; '*' matches every type;
-- 'order.*' every type that starts with 'order.'; anything else the type
-- itself. publish (which endpoints get a delivery) and replay_since (which
-- stored events an endpoint is sent again) both call it, so that a replay
-- sends exactly what publish would have.
-- PL/pgSQL: publish calls it on every endpoint of the tenant. A LANGUAGE sql
-- function holding the EXISTS over unnest(patterns) the rule needs is never
-- inlined (a sub-select stops it), and over 10,000 endpoints it cost two to
-- three times what the rule written out in the statement did; this one
-- costs about the same as the written-out rule (30 to 40 ms there, on a
-- shared machine). STRICT: NULL patterns or type match nothing (neither
-- column can hold NULL).
CREATE FUNCTION hooklane_type_matches(patterns text[], type text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    pattern text;
BEGIN
    IF cardinality(patterns) = 0 THEN
        RETURN true;
    END IF;
    FOREACH pattern IN ARRAY patterns LOOP
        IF pattern = '*' OR pattern = type
           OR (right(pattern, 2) = '.*' AND starts_with(type, left(pattern, -1))) THEN
            RETURN true;
        END IF;
    END LOOP;
    RETURN false;
END;
$$;

-- hooklane_complete (migration 0004) with two more columns per touched
-- endpoint: `opened`, whether this call opened its circuit (its
-- consecutive failures were below the threshold before, and are at it or
-- past it now: a batch of several failures may jump past the threshold,
-- which a caller comparing the count with the threshold missed), and
-- `deactivated`, whether this call deactivated it (a 410 of an active
-- endpoint). A failure while the circuit is open already (a probe after
-- the pause) extends the pause but opens nothing. The endpoints touched are
-- locked in id order before they are updated.
CREATE FUNCTION hooklane_complete_v2(ids bigint[], fences integer[], outcomes text[],
                                     retry_ins double precision[], statuses integer[], errors text[],
                                     threshold integer, step_seconds double precision,
                                     cap_seconds double precision)
RETURNS TABLE (id bigint, namespace text, name text, state text, paused_until timestamptz,
               consecutive_failures integer, ready boolean, opened boolean, deactivated boolean)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH fenced AS MATERIALIZED (
        SELECT r.id, r.attempts, r.outcome, r.retry_in, r.status, r.error, d.state
        FROM unnest(ids, fences, outcomes, retry_ins, statuses, errors)
             AS r(id, attempts, outcome, retry_in, status, error)
        CROSS JOIN LATERAL (SELECT d.state, d.attempts FROM deliveries d WHERE d.id = r.id OFFSET 0) d
        WHERE d.state = 'sending' AND d.attempts = r.attempts
    ),
    recorded AS (
        UPDATE deliveries d
        SET state = CASE WHEN r.outcome <> 'delivered' AND d.event_tenant <> ep.tenant THEN 'discarded'
                         WHEN r.outcome = 'retry' THEN 'pending'
                         ELSE r.outcome END,
            next_attempt_at = CASE WHEN r.outcome = 'retry'
                                   THEN now() + make_interval(secs => r.retry_in)
                                   ELSE d.next_attempt_at END,
            delivered_at = CASE WHEN r.outcome = 'delivered' THEN now() END,
            lease_expires_at = NULL,
            last_status = r.status,
            last_error = CASE WHEN r.outcome <> 'delivered' AND d.event_tenant <> ep.tenant
                              THEN format('discarded: the endpoint''s tenant changed from %s to %s (%s)',
                                          d.event_tenant, ep.tenant, r.error)
                              ELSE r.error END
        FROM fenced r, endpoints ep
        WHERE d.id = r.id
          AND d.state = r.state
          AND d.attempts = r.attempts
          AND ep.id = d.endpoint_id
        RETURNING d.id, d.endpoint_id, d.state, d.next_attempt_at, r.outcome, r.status, r.error
    ),
    per_endpoint AS (
        SELECT rec.endpoint_id,
               bool_or(rec.outcome = 'delivered') AS succeeded,
               count(*) FILTER (WHERE rec.outcome <> 'delivered') AS failures,
               bool_or(rec.status = 410) AS gone,
               (array_agg(rec.error ORDER BY rec.id DESC)
                  FILTER (WHERE rec.outcome <> 'delivered'))[1] AS error,
               -- The pending head is read in the statement's snapshot, from
               -- before its own updates: a retry recorded here counts too.
               min(rec.next_attempt_at) FILTER (WHERE rec.state = 'pending') AS retried_head
        FROM recorded rec
        GROUP BY rec.endpoint_id
    ),
    -- Each touched endpoint as it is before this statement changes it, its
    -- row locked (in id order) until the transaction ends: what `opened` and
    -- `deactivated` compare the updated row with. Locked first, so that no
    -- other transaction changes the row between this read and the update;
    -- the update takes the same lock anyway.
    locked AS MATERIALIZED (
        SELECT ep.id, ep.state, ep.consecutive_failures
        FROM per_endpoint pe
        JOIN endpoints ep ON ep.id = pe.endpoint_id
        ORDER BY ep.id
        FOR NO KEY UPDATE OF ep
    ),
    touched AS (
        UPDATE endpoints ep
        SET consecutive_failures = CASE WHEN pe.succeeded THEN 0
                                        ELSE ep.consecutive_failures + pe.failures END,
            failing_since = CASE WHEN pe.succeeded THEN NULL
                                 ELSE coalesce(ep.failing_since, now()) END,
            paused_until = CASE
                WHEN pe.succeeded THEN NULL
                WHEN ep.consecutive_failures + pe.failures >= threshold
                THEN now() + make_interval(secs => least(
                         cap_seconds, step_seconds * (ep.consecutive_failures + pe.failures - threshold + 1)))
                ELSE ep.paused_until END,
            last_error = coalesce(pe.error, ep.last_error),
            last_delivered_at = CASE WHEN pe.succeeded THEN now()
                                     ELSE ep.last_delivered_at END,
            state = CASE WHEN pe.gone THEN 'deactivated' ELSE ep.state END,
            deactivated_at = CASE WHEN pe.gone AND ep.state = 'active' THEN now()
                                  ELSE ep.deactivated_at END,
            deactivated_reason = CASE WHEN pe.gone AND ep.state = 'active'
                                      THEN 'the receiver answered 410 Gone'
                                      ELSE ep.deactivated_reason END
        FROM per_endpoint pe, locked b
        WHERE ep.id = pe.endpoint_id
          AND b.id = pe.endpoint_id
        RETURNING ep.id, ep.partition, ep.namespace, ep.name, ep.state, ep.paused_until,
                  ep.consecutive_failures, hooklane_deliverable(ep) AS deliverable, pe.retried_head,
                  b.consecutive_failures < threshold AND ep.consecutive_failures >= threshold
                    AS opened,
                  b.state = 'active' AND ep.state = 'deactivated' AS deactivated
    ),
    verdict AS (
        SELECT t.id, t.partition, t.namespace, t.name, t.state, t.paused_until, t.consecutive_failures,
               t.opened, t.deactivated,
               CASE WHEN NOT t.deliverable OR h.head IS NULL THEN NULL
                    WHEN t.paused_until > now() THEN greatest(t.paused_until, h.head)
                    ELSE greatest(h.head, now())
               END AS ready_at
        FROM touched t
        CROSS JOIN LATERAL (
            SELECT least((SELECT min(d.next_attempt_at) FROM deliveries d
                          WHERE d.endpoint_id = t.id AND d.state = 'pending'),
                         t.retried_head) AS head
        ) h
    ),
    made_ready AS (
        SELECT hooklane_make_ready(array_agg(v.id), array_agg(v.partition), array_agg(v.ready_at))
        FROM verdict v
        WHERE v.ready_at IS NOT NULL
    )
    SELECT v.id, v.namespace, v.name, v.state, v.paused_until, v.consecutive_failures,
           coalesce(v.ready_at <= now(), false), v.opened, v.deactivated
    FROM verdict v, made_ready;
END;
$$;
