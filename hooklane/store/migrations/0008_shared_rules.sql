-- Hooklane schema, version 8 (issue 20): two rules that were written out
-- more than once, each written once as a function: which deliveries a
-- tenant change discards, and when an endpoint is ready again. Statements
-- call them from this release on; the released functions that spell them
-- out (CONTRIBUTING.md, "Changing SQL functions") call them from their
-- next version on, and are not redefined for it.
--
-- Rolling upgrade: only adds functions.

-- Why a delivery is discarded rather than sent, retried or kept dead: its
-- event is of another tenant than its endpoint's, which moved to another
-- tenant after the delivery was queued, and must never send or resend the
-- old tenant's events to whoever owns the receiver now. NULL while the
-- event is of the endpoint's own tenant. upsert_endpoint discards by it;
-- hooklane_reserve_v2 and hooklane_complete_v2 write the same rule out.
-- LANGUAGE sql with a single expression, so that it is inlined into the
-- statements that call it; STABLE, as format() is.
CREATE FUNCTION hooklane_tenant_discard(event_tenant text, endpoint_tenant text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN event_tenant <> endpoint_tenant
                THEN format('discarded: the endpoint''s tenant changed from %s to %s',
                            event_tenant, endpoint_tenant) END
$$;

-- When an endpoint may have work again, the time its ready row holds:
-- never (NULL: it leaves the ready list until a wakeup) when it is not
-- deliverable or has nothing pending (`head`, the earliest next_attempt_at
-- of its pending deliveries, is NULL); while its circuit pauses, at the end
-- of the pause or at its head if that is later; 'infinity' while all its
-- slots are taken, until a result frees one; else at its head, or now if
-- that is past (at the back of the line). hooklane_rerate_v2 and
-- hooklane_complete_v2 (which passes no slot taken: a result just freed
-- one) write the same rule out.
CREATE FUNCTION hooklane_ready_at(deliverable boolean, paused_until timestamptz, head timestamptz,
                                  slots_taken boolean) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN NOT deliverable OR head IS NULL THEN NULL
                WHEN paused_until > now() THEN greatest(paused_until, head)
                WHEN slots_taken THEN 'infinity'::timestamptz
                ELSE greatest(head, now()) END
$$;
