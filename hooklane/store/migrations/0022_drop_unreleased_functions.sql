-- Hooklane schema, version 22 (issue 40): the functions no release calls
-- are dropped.
--
-- 0.1.0 (migrations 0001 and 0002) is the only release made. Every
-- version since was written for a release after it, and none was made:
-- no worker, publisher or operator that calls these ever ran outside this
-- tree, and no code of this release calls them. So no rolling upgrade
-- needs them:
-- - version 4's and 8's ready table: hooklane_wake, hooklane_make_ready
--   and the reservation's steps hooklane_absorb_wakeups_v2,
--   hooklane_rerate_v2 and hooklane_reserve_v2 (migration 0004);
-- - the results of versions 4 and 6, hooklane_complete (0004) and
--   hooklane_complete_v2 (0006);
-- - the reservations of versions 11 and 16, hooklane_reserve_v5 (0011)
--   and hooklane_reserve_v6 (0016), copies of hooklane_reserve_v7;
-- - hooklane_ready_at (0008), written for the next versions of the
--   functions above, which keep the ready list in the worker instead
--   (hooklane/worker/ready.py).
--
-- Rolling upgrade: 0.1.0's workers keep theirs, hooklane_reserve (which
-- calls hooklane_absorb_wakeups and hooklane_rerate) and the tables
-- wakeups and ready_endpoints that these and their complete and sweep
-- statements write (tests/db/release_0_1_0.sql). Their drop is written
-- already, in hooklane/store/after_next_release/: the first migration
-- after the next release (CONTRIBUTING.md, "Releasing").

DROP FUNCTION hooklane_wake(bigint[], integer[]);
DROP FUNCTION hooklane_make_ready(bigint[], integer[], timestamptz[]);
DROP FUNCTION hooklane_absorb_wakeups_v2(integer[]);
DROP FUNCTION hooklane_rerate_v2(bigint[]);
DROP FUNCTION hooklane_reserve_v2(integer[], integer, double precision, text);
DROP FUNCTION hooklane_complete(bigint[], integer[], text[], double precision[], integer[], text[],
                                integer, double precision, double precision);
DROP FUNCTION hooklane_complete_v2(bigint[], integer[], text[], double precision[], integer[], text[],
                                   integer, double precision, double precision);
DROP FUNCTION hooklane_reserve_v5(integer[], bigint[], timestamptz[], integer, double precision, text,
                                  double precision);
DROP FUNCTION hooklane_reserve_v6(integer[], bigint[], timestamptz[], integer, double precision, text,
                                  double precision);
DROP FUNCTION hooklane_ready_at(boolean, timestamptz, timestamptz, boolean);
