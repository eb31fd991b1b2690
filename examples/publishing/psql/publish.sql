-- Publish an order's event in the same transaction as the order itself.
--
--   psql "$DATABASE_URL" -X -v order_id=1042 -v type=order.created [-v rollback=1] -f publish.sql
--
-- Prints the event id. A refused event is reported on stderr and psql
-- exits 3: it has no way to choose its exit status, and 3 is its status
-- for a statement that fails under ON_ERROR_STOP.
\set ON_ERROR_STOP on
\set QUIET on
\set total 19.99

BEGIN;
INSERT INTO orders (id, total) VALUES (:'order_id', :total);
-- The id is the order's own, so a retry after a lost COMMIT cannot publish it twice.
-- The ordering key is the order: each endpoint gets its events one at a
-- time, in the order their transactions commit.
-- \gset leaves a NULL column's variable unset, which \if :{?...} tests.
SELECT event_id, error_code, error_field, error_message
FROM hooklane_try_publish_v3(tenant => 'acme', type => :'type',
                             data => jsonb_build_object('order_id', :'order_id', 'total', :total),
                             id => 'order-' || :'order_id' || '-created',
                             ordering_key => 'order-' || :'order_id')
\gset

\if :{?error_code}
    \warn refused :error_code :error_field: :error_message
    -- A refusal comes back as a row, not an error: the transaction is
    -- still usable, and the order commits without its event.
    COMMIT;
    DO $$ BEGIN RAISE EXCEPTION 'the order is committed, its event refused'; END $$;
\elif :{?rollback}
    ROLLBACK;
    \echo :event_id
\else
    COMMIT;
    \echo :event_id
\endif
