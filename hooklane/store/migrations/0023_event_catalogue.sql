-- Hooklane schema, version 23 (issue 41): the event catalogue.
--
-- The platform's event types (WebhookEventType resources, or
-- `hooklane eventtype apply` in local mode), each with one JSON Schema per
-- version, and the check of every published event against them
-- (docs/catalogue.md). New tables and two new nullable columns of events:
-- no row is rewritten, and publishers and workers of version 22 go on as
-- before (they neither read nor write any of it).

-- One row per event type of the catalogue, by its name (the pattern of
-- an event's type). Cluster-wide, as the resource is: a type means the same
-- thing for every tenant.
CREATE TABLE catalogue_types (
    name             text PRIMARY KEY
                     CHECK (length(name) BETWEEN 1 AND 255
                            AND name ~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$'),
    description      text NOT NULL DEFAULT '' CHECK (length(description) <= 4096),
    type_group       text CHECK (length(type_group) BETWEEN 1 AND 255),
    -- Deprecated from that day on: still accepted, and counted.
    deprecated_since date,
    -- Archived: refused at publish whatever the mode, kept to be shown.
    archived         boolean NOT NULL DEFAULT false,
    -- Who wrote it: 'kubernetes' (the operator, from a WebhookEventType)
    -- or 'local' (the CLI); neither overwrites or deletes the other's.
    source           text NOT NULL CHECK (source IN ('kubernetes', 'local')),
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- One JSON Schema (draft 2020-12) per version of a type, numbered from 1;
-- the highest is the latest. The schema is stored bundled: every $ref it
-- had outside itself was resolved when it was applied, so that a publish
-- never fetches anything. The example validates against it (checked at
-- apply).
CREATE TABLE catalogue_versions (
    type     text NOT NULL REFERENCES catalogue_types (name) ON DELETE CASCADE,
    version  integer NOT NULL CHECK (version BETWEEN 1 AND 1000),
    schema   jsonb NOT NULL CHECK (jsonb_typeof(schema) IN ('object', 'boolean')),
    example  jsonb NOT NULL CHECK (jsonb_typeof(example) = 'object'),
    -- md5 of the schema's text: the publish check's cache key for the
    -- compiled validator, so that an applied change is never missed.
    digest   text NOT NULL,
    PRIMARY KEY (type, version)
);

-- How published events are checked against the catalogue, per tenant;
-- the row of tenant '' (which no tenant is: a tenant has 1 to 253
-- characters) holds the mode of every tenant without a row of its own.
-- No row at all: 'off'.
CREATE TABLE catalogue_modes (
    tenant text PRIMARY KEY CHECK (length(tenant) <= 253),
    mode   text NOT NULL CHECK (mode IN ('off', 'warn', 'enforce'))
);

-- The publishes the check refused, one row each, written in the
-- publisher's transaction (so a refusal its transaction rolled back leaves
-- none, as nothing else of it does) and purged with the events.
CREATE TABLE catalogue_refusals (
    refused_at timestamptz NOT NULL DEFAULT now(),
    tenant     text NOT NULL,
    type       text NOT NULL,
    -- 'unknown', 'archived' or 'schema'
    reason     text NOT NULL CHECK (reason IN ('unknown', 'archived', 'schema')),
    message    text NOT NULL
);
-- purge_catalogue_refusals: past retention, oldest first; event_type_counts:
-- the last day's
CREATE INDEX catalogue_refusals_refused_at ON catalogue_refusals (refused_at);

-- What the check found of a stored event: the version it validated
-- against (NULL: not checked, the mode was off or it is older than this
-- migration) and, under 'warn', why it validated against none (NULL: it
-- did, or it was not checked).
ALTER TABLE events ADD COLUMN schema_version integer;
ALTER TABLE events ADD COLUMN schema_problem text;
-- event_type_counts: the events a warning marked, by time
CREATE INDEX events_schema_problem ON events (created_at) WHERE schema_problem IS NOT NULL;
