//! A RabbitMQ queue for the benchmarks (bench/drain.sh): the relays declare nothing, so the
//! bench does, as an operator would.
//!
//!   queue AMQP_URL declare|purge|delete NAME

use lapin::options::{QueueDeclareOptions, QueueDeleteOptions, QueuePurgeOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, amqp_url, command, name] = args.as_slice() else {
        panic!("usage: queue AMQP_URL declare|purge|delete NAME");
    };
    let connection = Connection::connect(amqp_url, ConnectionProperties::default()).await.expect("RabbitMQ");
    let channel = connection.create_channel().await.expect("channel");
    let name = name.as_str();
    match command.as_str() {
        "declare" => {
            let options = QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() };
            channel.queue_declare(name.into(), options, FieldTable::default()).await.expect("queue.declare");
        }
        "purge" => {
            channel.queue_purge(name.into(), QueuePurgeOptions::default()).await.expect("queue.purge");
        }
        "delete" => {
            channel.queue_delete(name.into(), QueueDeleteOptions::default()).await.expect("queue.delete");
        }
        other => panic!("unknown command {other:?}"),
    }
}
