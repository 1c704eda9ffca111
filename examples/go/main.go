// A RabbitMQ consumer of payment messages that pays each order once, however often it is delivered.
//
// Each message is {"order_id": ..., "amount": ...} with its idempotency key as the AMQP MessageId.
// PostgreSQL from the libpq variables (pgxpool reads PGHOST, PGPORT, ...), the broker from
// AMQP_URL, the queue from QUEUE. The part between the README markers is the Go snippet of
// README.md; tests/readme_sync.sh checks that text, and tests/readme_snippets.sh builds this package
// with Debian's Go packages (GO111MODULE=off) and runs it against RabbitMQ.
package main

import (
	"context"
	"encoding/json"
	"log"
	"os"
	"strconv"
	"syscall"

	"github.com/jackc/pgx/v4/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
)

func main() {
	ctx := context.Background()
	pool, err := pgxpool.Connect(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672"
	}
	queue := os.Getenv("QUEUE")
	if queue == "" {
		queue = "payments"
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		log.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		log.Fatal(err)
	}
	if err := ch.Qos(10, 0, false); err != nil {
		log.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	deliveries = killBeforeAck(deliveries, os.Getenv("E2E_KILL_AT_ACK"))
	if os.Getenv("ANNOUNCE") != "" {
		consumeAndAnnounce(ctx, pool, deliveries)
		return
	}
	// README:begin go
	for d := range deliveries {
		if err := pay(ctx, pool, d); err != nil {
			log.Printf("payment %s rolled back, requeued: %v", d.MessageId, err)
			d.Nack(false, true) // requeue: the broker delivers it again
			continue
		}
		d.Ack(false) // only after COMMIT; a duplicate is acked too
	}
	// README:end go
}

// README:begin go
func pay(ctx context.Context, pool *pgxpool.Pool, d amqp.Delivery) error {
	var p struct {
		OrderID string      `json:"order_id"`
		Amount  json.Number `json:"amount"`
	}
	if err := json.Unmarshal(d.Body, &p); err != nil {
		return err
	}
	tx, err := pool.Begin(ctx) // one pooled connection for this message's transaction
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) // a no-op once committed
	var isNew bool
	if err := tx.QueryRow(ctx, "SELECT idem_claim($1, 'billing')", d.MessageId).Scan(&isNew); err != nil {
		return err
	}
	if isNew {
		if _, err := tx.Exec(ctx, "INSERT INTO payments (order_id, amount) VALUES ($1, $2)", p.OrderID, p.Amount.String()); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// README:end go

// killBeforeAck is make e2e's crash between COMMIT and ack: with E2E_KILL_AT_ACK=N the process
// SIGKILLs itself in place of its N-th ack, after that message's transaction committed. Unset, the
// deliveries pass through untouched.
func killBeforeAck(in <-chan amqp.Delivery, at string) <-chan amqp.Delivery {
	n, err := strconv.Atoi(at)
	if err != nil || n <= 0 {
		return in
	}
	out := make(chan amqp.Delivery)
	acks := 0
	go func() {
		defer close(out)
		for d := range in {
			d.Acknowledger = killingAcker{d.Acknowledger, &acks, n}
			out <- d
		}
	}()
	return out
}

type killingAcker struct {
	amqp.Acknowledger
	acks *int
	at   int
}

func (k killingAcker) Ack(tag uint64, multiple bool) error {
	if *k.acks++; *k.acks == k.at {
		log.Printf("e2e: SIGKILL in place of ack %d, after its COMMIT", k.at)
		syscall.Kill(syscall.Getpid(), syscall.SIGKILL)
	}
	return k.Acknowledger.Ack(tag, multiple)
}
