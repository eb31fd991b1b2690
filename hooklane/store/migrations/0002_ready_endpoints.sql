-- Hooklane schema, version 2: reservation visits only the endpoints that may
-- have work, so that its cost follows the endpoints with deliveries to make
-- rather than every endpoint of the platform.

-- Publishers append a wakeup for each endpoint they queue a delivery for.
-- Append-only on purpose: publish runs inside the application's own,
-- possibly long, transaction, and must never lock a row the worker needs.
CREATE TABLE wakeups (
    id          bigserial PRIMARY KEY,
    endpoint_id bigint NOT NULL,
    partition   integer NOT NULL
);

-- absorb_wakeups: the wakeups of the partitions a worker owns
CREATE INDEX wakeups_partition ON wakeups (partition);

-- The endpoints of each partition that may have work, and from when. Kept by
-- the partition's owner: absorbed wakeups and freed slots make an endpoint
-- ready now; after each reservation an endpoint moves to the back of the
-- line, to its next retry time, to the end of its circuit pause, to
-- 'infinity' while all its slots are taken (a result brings it back), or out
-- of the table when it has nothing pending.
CREATE TABLE ready_endpoints (
    endpoint_id bigint PRIMARY KEY,
    partition   integer NOT NULL,
    ready_at    timestamptz NOT NULL
);

-- ready_candidates: the longest-waiting ready endpoints of owned partitions
CREATE INDEX ready_endpoints_ready_at ON ready_endpoints (ready_at, partition);

INSERT INTO ready_endpoints (endpoint_id, partition, ready_at)
SELECT DISTINCT d.endpoint_id, ep.partition, now()
FROM deliveries d
JOIN endpoints ep ON ep.id = d.endpoint_id
WHERE d.state IN ('pending', 'sending');
