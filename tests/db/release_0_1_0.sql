-- The `reserve`, `complete` and `sweep_ready` statements of the 0.1.0
-- release, frozen as that release's workers run them, for tests/db/test_migrations.py to check
-- that such a worker keeps working while a rolling upgrade replaces it.
-- Not a second source of Hooklane's SQL: the statements in use are in
-- hooklane/store/queries.sql. Never edit this file to follow a change there;
-- it goes when 0.1.0 workers need no longer be supported (with
-- hooklane_reserve, 3 arguments, in the release after 0.2.0).

-- name: reserve
-- Reserve up to $2 due deliveries of the owned partitions, visiting only the
-- endpoints that may have work: the steps are in hooklane_reserve (migration
-- 0002), one round trip. Runs only under the partitions' advisory locks.
-- Parameters: $1 owned partitions, $2 how many at most, $3 lease grace
-- seconds beyond the endpoint's timeout.
-- Index: wakeups_partition, ready_endpoints_ready_at, deliveries_in_flight,
-- deliveries_queue (see the function).
SELECT * FROM hooklane_reserve($1::int[], $2, $3);

-- name: complete
-- Record a batch of results in one statement, and fold them into each
-- endpoint's circuit. Each row is fenced by (state, attempts): a late result
-- from a worker whose delivery was rescued and reserved again changes
-- nothing. A success closes the circuit; failures add up, and from the
-- threshold on every failure (re)opens it for step x (failures past the
-- threshold + 1), capped. A 410 deactivates the endpoint. Every endpoint
-- touched is ready again: a slot is free, or a retry is queued.
-- Parameters: $1 ids, $2 attempts (the fence), $3 outcomes ('delivered',
-- 'retry', 'dead'), $4 retry delays in seconds, $5 HTTP statuses (NULL when
-- no response), $6 errors, $7 failures that open the circuit, $8 pause step
-- seconds, $9 pause cap seconds.
-- Index: primary keys of deliveries, endpoints and ready_endpoints.
WITH result AS (
    SELECT *
    FROM unnest($1::bigint[], $2::int[], $3::text[], $4::float8[], $5::int[], $6::text[])
         AS r(id, attempts, outcome, retry_in, status, error)
),
recorded AS (
    UPDATE deliveries d
    SET state = CASE r.outcome WHEN 'retry' THEN 'pending' ELSE r.outcome END,
        next_attempt_at = CASE WHEN r.outcome = 'retry'
                               THEN now() + make_interval(secs => r.retry_in)
                               ELSE d.next_attempt_at END,
        delivered_at = CASE WHEN r.outcome = 'delivered' THEN now() END,
        lease_expires_at = NULL,
        last_status = r.status,
        last_error = r.error
    FROM result r
    WHERE d.id = r.id
      AND d.state = 'sending'
      AND d.attempts = r.attempts
    RETURNING d.id, d.endpoint_id, r.outcome, r.status, r.error
),
per_endpoint AS (
    SELECT endpoint_id,
           bool_or(outcome = 'delivered') AS succeeded,
           count(*) FILTER (WHERE outcome <> 'delivered') AS failures,
           bool_or(status = 410) AS gone,
           (array_agg(error ORDER BY id DESC)
              FILTER (WHERE outcome <> 'delivered'))[1] AS error
    FROM recorded
    GROUP BY endpoint_id
),
touched AS (
UPDATE endpoints ep
SET consecutive_failures = CASE WHEN pe.succeeded THEN 0
                                ELSE ep.consecutive_failures + pe.failures END,
    failing_since = CASE WHEN pe.succeeded THEN NULL
                         ELSE coalesce(ep.failing_since, now()) END,
    paused_until = CASE
        WHEN pe.succeeded THEN NULL
        WHEN ep.consecutive_failures + pe.failures >= $7
        THEN now() + make_interval(secs => least(
                 $9, $8 * (ep.consecutive_failures + pe.failures - $7 + 1)))
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
FROM per_endpoint pe
WHERE ep.id = pe.endpoint_id
RETURNING ep.id, ep.partition, ep.namespace, ep.name, ep.state, ep.paused_until,
          ep.consecutive_failures
),
ready AS (
    INSERT INTO ready_endpoints (endpoint_id, partition, ready_at)
    SELECT id, partition, now() FROM touched
    ON CONFLICT (endpoint_id) DO UPDATE
    SET ready_at = least(ready_endpoints.ready_at, EXCLUDED.ready_at)
)
SELECT id, namespace, name, state, paused_until, consecutive_failures FROM touched;

-- name: sweep_ready
-- Safety net, run now and then: make ready every deliverable endpoint of the
-- owned partitions that has pending deliveries but neither a ready row nor
-- a wakeup, whatever left it so (deliveries written by an older publish, or
-- by hand). An endpoint with a wakeup not yet absorbed is not missing: the
-- next reservation makes it ready. Parameters: $1 owned partitions.
-- Index: endpoints_partition; primary key of ready_endpoints;
-- deliveries_queue for the pending check; wakeups is read whole (an
-- anti-join), as it only holds what publishes added since the last round.
INSERT INTO ready_endpoints (endpoint_id, partition, ready_at)
SELECT ep.id, ep.partition, now()
FROM endpoints ep
WHERE ep.partition = ANY($1::int[])
  AND ep.state = 'active'
  AND NOT ep.paused
  AND ep.secret IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM ready_endpoints r WHERE r.endpoint_id = ep.id)
  AND NOT EXISTS (SELECT 1 FROM wakeups w WHERE w.endpoint_id = ep.id)
  AND EXISTS (SELECT 1 FROM deliveries d WHERE d.endpoint_id = ep.id AND d.state = 'pending')
ON CONFLICT (endpoint_id) DO NOTHING
RETURNING endpoint_id;
