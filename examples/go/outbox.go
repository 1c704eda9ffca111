// The same consumer, announcing each new payment downstream through the outbox (README, "Outbox"):
// main runs it instead of pay when ANNOUNCE is set. idempotency-relay publishes the announcements
// after commit.
package main

import (
	"context"
	"encoding/json"
	"log"

	"github.com/jackc/pgx/v4/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
)

func consumeAndAnnounce(ctx context.Context, pool *pgxpool.Pool, deliveries <-chan amqp.Delivery) {
	for d := range deliveries {
		if err := payAndAnnounce(ctx, pool, d); err != nil {
			log.Printf("payment %s rolled back, requeued: %v", d.MessageId, err)
			d.Nack(false, true)
			continue
		}
		d.Ack(false)
	}
}

// README:begin outbox go
func payAndAnnounce(ctx context.Context, pool *pgxpool.Pool, d amqp.Delivery) error {
	var p struct {
		OrderID string      `json:"order_id"`
		Amount  json.Number `json:"amount"`
	}
	if err := json.Unmarshal(d.Body, &p); err != nil {
		return err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) // a no-op once committed: an error leaves no payment and no message
	var isNew bool
	if err := tx.QueryRow(ctx, "SELECT idem_claim($1, 'billing')", d.MessageId).Scan(&isNew); err != nil {
		return err
	}
	if isNew {
		if _, err := tx.Exec(ctx, "INSERT INTO payments (order_id, amount) VALUES ($1, $2)", p.OrderID, p.Amount.String()); err != nil {
			return err
		}
		// Its id is idem_message_id(d.MessageId, 'billing', 1): the same on every run of this
		// handler for this key. Built from the message alone, never from now(), so that a run
		// again sends the same message and not a different one (ID001).
		announcement, err := json.Marshal(map[string]any{"order_id": p.OrderID, "amount": p.Amount})
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SELECT idem_send('payments.paid', $1::jsonb, ordering_key => $2)", string(announcement), p.OrderID); err != nil {
			return err
		}
	}
	return tx.Commit(ctx) // the payment, its claim and its announcement, or none of them
}

// README:end outbox go
