//! A RabbitMQ consumer of payment messages that pays each order once, however often it is delivered.
//!
//! Each message is {"order_id": ..., "amount": ...} with its idempotency key as the AMQP message_id.
//! PostgreSQL from DATABASE_URL (a libpq connection string, "host=... user=... dbname=..."), the
//! broker from AMQP_URL, the queue from QUEUE. The part between the README markers is the Rust
//! snippet of README.md.
use amiquip::{Connection, Consumer, ConsumerMessage, ConsumerOptions, Delivery, QueueDeclareOptions};
use postgres::{Client, NoTls};
use rust_decimal::Decimal;
use serde::Deserialize;

#[derive(Deserialize)]
struct Payment {
    order_id: String,
    amount: Decimal,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut client = Client::connect(&std::env::var("DATABASE_URL")?, NoTls)?;
    let url = std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672".into());
    let mut broker = Connection::insecure_open(&url)?;
    let channel = broker.open_channel(None)?;
    channel.qos(0, 10, false)?;
    let queue_name = std::env::var("QUEUE").unwrap_or_else(|_| "payments".into());
    let queue = channel.queue_declare(queue_name, QueueDeclareOptions { durable: true, ..Default::default() })?;
    let consumer = queue.consume(ConsumerOptions::default())?;
    for message in consumer.receiver().iter() {
        let ConsumerMessage::Delivery(delivery) = message else { break };
        on_message(&mut client, &consumer, delivery)?;
        if client.is_closed() {
            // The server is gone (a restart, a failover): every later message would fail and be
            // requeued at once. Exit; a supervisor starts the consumer again, on a new connection.
            return Err("the database connection is lost".into());
        }
    }
    Ok(())
}

// README:begin rust
fn on_message(client: &mut Client, consumer: &Consumer, delivery: Delivery) -> amiquip::Result<()> {
    let key = delivery.properties.message_id().clone().unwrap_or_default();
    match pay(client, &key, &delivery.body) {
        Ok(()) => consumer.ack(delivery), // only after COMMIT; a duplicate is acked too
        Err(e) => {
            eprintln!("payment {key} rolled back, requeued: {e}");
            consumer.nack(delivery, true) // requeue: the broker delivers it again
        }
    }
}

fn pay(client: &mut Client, key: &str, body: &[u8]) -> Result<(), Box<dyn std::error::Error>> {
    let p: Payment = serde_json::from_slice(body)?;
    let mut tx = client.transaction()?; // dropped without commit() on an error: ROLLBACK
    let is_new: bool = tx.query_one("SELECT idem_claim($1, 'billing')", &[&key])?.get(0);
    if is_new {
        tx.execute("INSERT INTO payments (order_id, amount) VALUES ($1, $2)", &[&p.order_id, &p.amount])?;
    }
    tx.commit()?;
    Ok(())
}
// README:end rust
