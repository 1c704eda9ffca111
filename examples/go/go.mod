// No go.sum yet: the test machines have no Go toolchain, so this example is only text-checked
// (tests/readme_sync.sh). `go mod tidy` writes it.
module example.com/idempotency-example-go

go 1.22

require (
	github.com/jackc/pgx/v5 v5.7.1
	github.com/rabbitmq/amqp091-go v1.10.0
)
