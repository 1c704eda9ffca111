//! The hand-written relay `make bench` compares idempotency-relay with (bench/drain.sh): the
//! usual `FOR UPDATE SKIP LOCKED` loop over a plain outbox table, with the same batch size and
//! the same publisher confirms (publish the batch, await every confirmation, then DELETE the
//! rows and COMMIT). It knows nothing of ordering keys, so several of it publish one entity's
//! messages out of order; that is the difference the comparison prices.
//!
//!   hand_relay DATABASE_URL AMQP_URL BATCH_SIZE   (runs until SIGTERM)

use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::ShortString;
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties};
use tokio_postgres::NoTls;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, database_url, amqp_url, batch] = args.as_slice() else {
        panic!("usage: hand_relay DATABASE_URL AMQP_URL BATCH_SIZE");
    };
    let batch: i64 = batch.parse().expect("BATCH_SIZE is a number");
    let (db, connection) = tokio_postgres::connect(database_url, NoTls).await.expect("PostgreSQL");
    tokio::spawn(connection);
    let rabbit = Connection::connect(amqp_url, ConnectionProperties::default()).await.expect("RabbitMQ");
    let channel = rabbit.create_channel().await.expect("channel");
    channel.confirm_select(ConfirmSelectOptions::default()).await.expect("confirm.select");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM");
    loop {
        db.batch_execute("BEGIN").await.unwrap();
        let rows = db
            .query(
                "SELECT id::text, topic, payload::text FROM hand_outbox ORDER BY created_at LIMIT $1 FOR UPDATE SKIP LOCKED",
                &[&batch],
            )
            .await
            .unwrap();
        if rows.is_empty() {
            db.batch_execute("COMMIT").await.unwrap();
            tokio::select! {
                _ = term.recv() => return,
                _ = tokio::time::sleep(Duration::from_millis(50)) => continue,
            }
        }
        let mut confirms = Vec::with_capacity(rows.len());
        let mut ids = Vec::with_capacity(rows.len());
        for row in &rows {
            let (id, topic, payload): (String, String, String) = (row.get(0), row.get(1), row.get(2));
            let properties = BasicProperties::default()
                .with_message_id(ShortString::from(id.as_str()))
                .with_content_type(ShortString::from("application/json"))
                .with_delivery_mode(2);
            let options = BasicPublishOptions { mandatory: true, ..BasicPublishOptions::default() };
            confirms.push(
                channel
                    .basic_publish("".into(), topic.as_str().into(), options, payload.as_bytes(), properties)
                    .await
                    .unwrap(),
            );
            ids.push(id);
        }
        for confirm in confirms {
            assert!(matches!(confirm.await.unwrap(), Confirmation::Ack(None)), "RabbitMQ refused a message");
        }
        db.execute("DELETE FROM hand_outbox WHERE id = ANY ($1::text[]::uuid[])", &[&ids]).await.unwrap();
        db.batch_execute("COMMIT").await.unwrap();
    }
}
