// Publish an order's event in the same transaction as the order itself.
//
//	DATABASE_URL=postgres://app@db/shop go run . 1042 order.created [rollback]
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
)

func main() {
	args := os.Args[1:]
	if len(args) < 2 || len(args) > 3 || (len(args) == 3 && args[2] != "rollback") {
		fmt.Fprintln(os.Stderr, "usage: publish ORDER_ID EVENT_TYPE [rollback]")
		os.Exit(1)
	}
	status, err := run(context.Background(), args[0], args[1], len(args) == 3)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		status = 1
	}
	os.Exit(status)
}

func run(ctx context.Context, orderID, eventType string, rollback bool) (int, error) {
	conn, err := pgx.Connect(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return 1, err
	}
	defer conn.Close(ctx)

	tx, err := conn.Begin(ctx)
	if err != nil {
		return 1, err
	}
	// An early return rolls the order back with its event; after Commit this does nothing.
	defer tx.Rollback(ctx)

	const total = "19.99"
	if _, err := tx.Exec(ctx, "INSERT INTO orders (id, total) VALUES ($1, $2)", orderID, total); err != nil {
		return 1, err
	}
	// Marshalled here and cast in SQL, rather than a map pgx encodes: pgx's
	// exec and simple protocol modes (PgBouncer) cannot encode a map.
	// json.Number writes the total exactly as stored.
	data, err := json.Marshal(map[string]any{"order_id": orderID, "total": json.Number(total)})
	if err != nil {
		return 1, err
	}
	// The id is the order's own, so a retry after a lost COMMIT cannot publish it twice.
	// The ordering key is the order: each endpoint gets its events one at
	// a time, in the order their transactions commit.
	var eventID, code, field, message *string
	err = tx.QueryRow(ctx, `SELECT event_id, error_code, error_field, error_message
		FROM hooklane_try_publish_v3(tenant => 'acme', type => $1, data => $2::jsonb, id => $3,
		                             ordering_key => $4)`,
		eventType, string(data), "order-"+orderID+"-created", "order-"+orderID).Scan(&eventID, &code, &field, &message)
	if err != nil {
		return 1, err
	}
	if code != nil {
		fmt.Fprintf(os.Stderr, "refused %s %s: %s\n", *code, *field, *message)
		// A refusal comes back as a row, not an error: the transaction is
		// still usable, and the order commits without its event.
		return 2, tx.Commit(ctx)
	}
	finish := tx.Commit
	if rollback {
		finish = tx.Rollback
	}
	if err := finish(ctx); err != nil {
		return 1, err
	}
	fmt.Println(*eventID)
	return 0, nil
}
