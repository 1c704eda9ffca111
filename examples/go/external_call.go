// The external-call sequence from Go (README, "External calls"): charge an API that takes no
// idempotency key, so that a redelivery never charges twice. The same steps as
// examples/python/external_call.py, which tests/external_calls.py runs against a fake API; this
// file is compared with the README and compiled with the consumer (tests/readme_snippets.sh), not run.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v4/pgxpool"
)

// ErrInDoubt: the call was begun and never confirmed, so it may have happened. Park the message.
var ErrInDoubt = errors.New("external call in doubt")

type order struct {
	OrderID int         `json:"order_id"`
	Amount  json.Number `json:"amount"`
}

// README:begin external go
func charge(ctx context.Context, pool *pgxpool.Pool, o order, chargeAPI func(order) (map[string]any, error)) error {
	key := fmt.Sprintf("order-%d:paid", o.OrderID)
	// 1. "begun", committed before the call: pool.QueryRow runs outside any transaction.
	var state string
	var response map[string]any
	if err := pool.QueryRow(ctx, "SELECT state, response FROM idem_call_begin($1, 'billing', 'charge')", key).
		Scan(&state, &response); err != nil {
		return err
	}
	if state == "in_doubt" { // begun before, never confirmed: the charge may have happened
		return ErrInDoubt // park the message; idempotency.unconfirmed_calls lists the call
	}
	if state == "new" {
		var err error
		if response, err = chargeAPI(o); err != nil {
			return err
		}
		// 2. the response, committed: every redelivery reuses it instead of calling again.
		if _, err := pool.Exec(ctx, "SELECT idem_call_confirm($1, 'billing', 'charge', $2)", key, response); err != nil {
			return err
		}
	}
	// 3. the effect, with the claim, in the consumer's own transaction; ack after it commits.
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	var isNew bool
	if err := tx.QueryRow(ctx, "SELECT idem_claim($1, 'billing')", key).Scan(&isNew); err != nil {
		return err
	}
	if isNew {
		if _, err := tx.Exec(ctx, "INSERT INTO charges (order_id, charge_id) VALUES ($1, $2)", o.OrderID, response["charge_id"]); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// README:end external go
