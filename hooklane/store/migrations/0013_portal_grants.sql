-- Tenant portal (docs/portal.md): the signed links the admin API hands out
-- and the sessions (or tenant tokens) they open. Only the SHA-256 of a
-- token is kept, so that a read of this table (a backup, a replica, a
-- support query) gives no one a way in.
CREATE TABLE portal_grants (
    digest     bytea PRIMARY KEY CHECK (octet_length(digest) = 32),
    -- a link is good for one redemption; a session for requests until it expires
    kind       text NOT NULL CHECK (kind IN ('link', 'session')),
    tenant     text NOT NULL,
    access     text NOT NULL CHECK (access IN ('read', 'resend', 'manage')),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
-- create_portal_grant: the expired grants it purges, oldest first.
CREATE INDEX portal_grants_expiry ON portal_grants (expires_at);
