-- 0.1.0's reservation, dropped once no 0.1.0 worker may run: by the
-- first migration after the next release, which its workers' rolling
-- upgrade from 0.1.0 still needs them for (CONTRIBUTING.md, "Releasing").
-- Nothing of a later version reads or writes these: its workers keep the
-- ready list in memory (migration 0009) and its publishes write no wakeup
-- (migration 0009).

DROP FUNCTION hooklane_reserve(integer[], integer, double precision);
DROP FUNCTION hooklane_absorb_wakeups(integer[]);
DROP FUNCTION hooklane_rerate(bigint[]);
DROP TABLE wakeups;
DROP TABLE ready_endpoints;
