-- Hooklane schema, version 5: what the admin API and receivers'
-- reconciliation read (issue 11).
--
-- Rolling upgrade: nothing running code relies on changes. Workers and
-- publishers of the previous release insert events without naming `xact`,
-- so the default fills it for them too; no function is changed or dropped.

-- The transaction that inserted the event (its id, which never wraps), so
-- that receivers page through a tenant's events in an order nothing can
-- later appear behind: list_events returns only events of transactions
-- below the oldest one still running, ordered by (xact, id). Events stored
-- before this migration share the placeholder 1, below every real id, and
-- keep their order by id among themselves. Added with a constant default
-- and then given the real one, so that the table is not rewritten; the
-- index builds below do read it whole, holding publishes up meanwhile.
ALTER TABLE events ADD COLUMN xact xid8 NOT NULL DEFAULT '1';
ALTER TABLE events ALTER COLUMN xact SET DEFAULT pg_current_xact_id();

-- list_events: one tenant's events in the order of the transactions that
-- stored them, the time range checked on the index entries themselves (an
-- index-only scan finds a page, then the rows are read by primary key). It
-- replaces events_tenant_created_at, which served the time-ordered listing
-- only, so that a publish writes as many index entries as before.
CREATE INDEX events_tenant_xact ON events (tenant, xact, id) INCLUDE (created_at);
DROP INDEX events_tenant_created_at;

-- endpoint_deliveries, replay_since: an endpoint's deliveries of every
-- state, newest first. The partial indexes by state serve the worker; without this one,
-- listing a quiet endpoint's delivered rows would read the whole table. Its
-- cost: one more entry per delivery written or changed (a change of state
-- is never a HOT update, as the partial indexes' predicates read `state`).
CREATE INDEX deliveries_endpoint ON deliveries (endpoint_id, id);
