//! A RabbitMQ consumer of payment messages that pays each order once, however often it is delivered.
//!
//! Each message is {"order_id": ..., "amount": ...} with its idempotency key as the AMQP message_id.
//! PostgreSQL from DATABASE_URL (a libpq connection string, "host=... user=... dbname=..."), the
//! broker from AMQP_URL, the queue from QUEUE. tokio-postgres and lapin; the part between the
//! README markers is the Rust snippet of README.md.
use futures_lite::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use rust_decimal::Decimal;
use serde::Deserialize;
use tokio_postgres::{Client, NoTls};

#[derive(Deserialize)]
struct Payment {
    order_id: String,
    amount: Decimal,
}

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let (mut client, connection) = tokio_postgres::connect(&std::env::var("DATABASE_URL")?, NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("PostgreSQL connection ended: {e}");
        }
    });
    let url = std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672".into());
    let broker = Connection::connect(&url, ConnectionProperties::default()).await?;
    let channel = broker.create_channel().await?;
    channel.basic_qos(10, BasicQosOptions::default()).await?;
    let queue = std::env::var("QUEUE").unwrap_or_else(|_| "payments".into());
    channel.queue_declare(queue.as_str().into(), QueueDeclareOptions::durable(), FieldTable::default()).await?;
    let mut consumer = channel
        .basic_consume(queue.as_str().into(), "".into(), BasicConsumeOptions::default(), FieldTable::default())
        .await?;
    // One message at a time, so one connection is enough.
    while let Some(delivery) = consumer.next().await {
        on_message(&mut client, delivery?).await?;
        if client.is_closed() {
            // The server is gone (a restart, a failover): every later message would fail and be
            // requeued at once. Exit; a supervisor starts the consumer again, on a new connection.
            return Err("the database connection is lost".into());
        }
    }
    Ok(())
}

// README:begin rust
async fn on_message(client: &mut Client, delivery: Delivery) -> Result<(), lapin::Error> {
    let key = delivery.properties.message_id().as_ref().map(|id| id.to_string()).unwrap_or_default();
    match pay(client, &key, &delivery.data).await {
        Ok(()) => delivery.ack(BasicAckOptions::default()).await?, // only after COMMIT; a duplicate is acked too
        Err(e) => {
            eprintln!("payment {key} rolled back, requeued: {e}");
            // requeue: the broker delivers it again
            delivery.nack(BasicNackOptions { requeue: true, ..Default::default() }).await?
        }
    };
    Ok(())
}

async fn pay(client: &mut Client, key: &str, body: &[u8]) -> Result<(), Error> {
    let p: Payment = serde_json::from_slice(body)?;
    let tx = client.transaction().await?; // dropped without commit() on an error: ROLLBACK
    let is_new: bool = tx.query_one("SELECT idem_claim($1, 'billing')", &[&key]).await?.get(0);
    if is_new {
        tx.execute("INSERT INTO payments (order_id, amount) VALUES ($1, $2)", &[&p.order_id, &p.amount]).await?;
    }
    tx.commit().await?;
    Ok(())
}
// README:end rust
