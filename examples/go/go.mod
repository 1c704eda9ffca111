// For building with modules; `go mod tidy` writes go.sum. tests/readme_snippets.sh builds this
// package in GOPATH mode instead, offline, from Debian's packages of the same major versions.
module example.com/idempotency-example-go

go 1.19

require (
	github.com/jackc/pgx/v4 v4.15.0
	github.com/rabbitmq/amqp091-go v1.5.0
)
