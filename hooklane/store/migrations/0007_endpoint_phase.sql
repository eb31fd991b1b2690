-- Hooklane schema, version 7 (issue 19): an endpoint's phase, and whether
-- it is delivering, written once in SQL, for the listings that filter on it (endpoint_page and
-- endpoint_totals), as hooklane/endpoint_state.py decides it in Python
-- (tests/test_api_admin.py checks that they agree).
--
-- Rolling upgrade: only adds a function.

-- The phase of an endpoint at the transaction's time: Deactivated; Paused
-- (by hand, or its circuit open until paused_until); Probing (the pause is
-- over, probes go out); else Active. LANGUAGE sql with a single expression,
-- so that it is inlined into the statements that filter on it.
CREATE FUNCTION hooklane_phase(ep endpoints) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN ep.state = 'deactivated' THEN 'Deactivated'
                WHEN ep.paused THEN 'Paused'
                WHEN ep.paused_until IS NULL THEN 'Active'
                WHEN ep.paused_until > now() THEN 'Paused'
                ELSE 'Probing' END
$$;

-- Whether nothing but a probe goes to the endpoint now: not deliverable
-- (deactivated, paused by hand, unsigned) or its circuit open. The
-- listings' "not delivering" filter.
CREATE FUNCTION hooklane_not_delivering(ep endpoints) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT NOT hooklane_deliverable(ep) OR ep.paused_until IS NOT NULL
$$;
