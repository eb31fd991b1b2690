-- Operational notifications (issue 25; docs/operations.md, "Operational
-- notifications"): an endpoint's circuit opening, its deactivation and its
-- dead deliveries are published as events to the notifications tenant
-- (HOOKLANE_NOTIFICATIONS_TENANT) by the worker holding partition 0.

-- What that worker noticed of each endpoint, per kind of notice, and when
-- it last told: so that each transition is told once, each kind at most
-- once per HOOKLANE_NOTIFICATION_INTERVAL_SECONDS per endpoint, and the
-- dead deliveries in between are counted into the next notice. Written
-- only when something is noticed or told, never per delivery.
CREATE TABLE endpoint_notices (
    endpoint_id   bigint NOT NULL REFERENCES endpoints (id) ON DELETE CASCADE,
    kind          text NOT NULL CHECK (kind IN ('paused', 'deactivated', 'deliveries_dead')),
    -- The last transition noticed, which a notice names: the failing
    -- episode whose circuit opened (the endpoint's failing_since), or the
    -- deactivation (its deactivated_at). NULL for dead deliveries.
    seen          timestamptz,
    -- Openings or deactivations noticed since the last notice.
    transitions   integer NOT NULL DEFAULT 0,
    -- Dead deliveries: counted up to here; the next notice counts the
    -- dead attempts recorded after it.
    counted_until timestamptz,
    notified_at   timestamptz,
    -- When the next notice goes (the last one's time plus the interval at
    -- the soonest); NULL: nothing to tell.
    due_at        timestamptz,
    PRIMARY KEY (endpoint_id, kind)
);

-- take_notices: the notices due, soonest first.
CREATE INDEX endpoint_notices_due ON endpoint_notices (due_at) WHERE due_at IS NOT NULL;

-- note_notices: circuits that opened or paused again since the last pass
-- (every opening sets paused_until ahead of its own time). A change of
-- paused_until is no longer a HOT update: once per opening or failed probe.
CREATE INDEX endpoints_paused_until ON endpoints (paused_until) WHERE paused_until IS NOT NULL;
-- note_notices: endpoints deactivated since the last pass.
CREATE INDEX endpoints_deactivated_at ON endpoints (deactivated_at) WHERE state = 'deactivated';

-- note_notices: the dead attempts recorded since the last pass, and whose.
-- Built on each existing partition, and by the attach on each new one.
CREATE INDEX delivery_attempts_dead ON delivery_attempts (recorded_at) INCLUDE (endpoint_id)
    WHERE outcome = 'dead';
-- take_notices: one endpoint's dead attempts since its last notice.
CREATE INDEX delivery_attempts_endpoint_dead ON delivery_attempts (endpoint_id, recorded_at)
    WHERE outcome = 'dead';
