//! The brokers a batch goes to, and the order it goes in.
//!
//! A batch lists each ordering key's messages in commit order. They are published in waves:
//! the first pending message of every key, then (once the broker confirmed each of them) the
//! next one of every key whose last message went through, and so on; keyless messages all go in
//! the first wave. Within a wave nothing waits for anything, across waves a key's messages
//! never overtake each other, and a key stops at its first refused message: the later ones
//! stay pending behind it.

use std::collections::HashMap;
use std::str::FromStr;
use std::time::Duration;

use async_nats::jetstream::context::PublishErrorKind;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use lapin::{Confirmation, PublisherConfirm};

/// A message as idem_outbox_take hands it out.
pub struct Message {
    pub id: String,
    pub topic: String,
    pub ordering_key: Option<String>,
    pub payload: String,
    pub headers: Option<serde_json::Value>,
    pub attempts: i32,
}

/// What the broker said of one message.
pub enum Outcome {
    Sent,
    /// Refused (unroutable, nacked, no stream for the subject, too large): worth a retry later.
    Failed(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    RabbitMq,
    Nats,
}

#[derive(Clone, Debug)]
pub struct Route {
    prefix: String,
    kind: Kind,
}

impl FromStr for Route {
    type Err = String;
    fn from_str(text: &str) -> Result<Route, String> {
        let (prefix, broker) = text.rsplit_once('=').ok_or_else(|| format!("route {text:?} is not PREFIX=BROKER"))?;
        let kind = match broker.trim() {
            "rabbitmq" => Kind::RabbitMq,
            "nats" => Kind::Nats,
            other => return Err(format!("route {text:?}: broker {other:?} is neither rabbitmq nor nats")),
        };
        Ok(Route { prefix: prefix.trim().to_string(), kind })
    }
}

enum Pending {
    Rabbit(PublisherConfirm),
    Nats(async_nats::jetstream::context::PublishAckFuture),
}

pub struct Brokers {
    routes: Vec<Route>,
    amqp_url: Option<String>,
    exchange: String,
    nats_url: Option<String>,
    confirm_timeout: Duration,
    rabbit: Option<(Connection, Channel)>,
    nats: Option<async_nats::jetstream::Context>,
}

impl Brokers {
    pub fn new(
        routes: &[Route],
        amqp_url: &Option<String>,
        exchange: &str,
        nats_url: &Option<String>,
        confirm_timeout: Duration,
    ) -> Result<Brokers, String> {
        let mut routes = routes.to_vec();
        // Longest prefix first: the first match is the most specific.
        routes.sort_by_key(|r| std::cmp::Reverse(r.prefix.len()));
        for (kind, url, flag) in [(Kind::RabbitMq, amqp_url, "--amqp-url"), (Kind::Nats, nats_url, "--nats-url")] {
            if routes.iter().any(|r| r.kind == kind) && url.is_none() {
                return Err(format!("a route goes to {kind:?} but {flag} is not set"));
            }
        }
        Ok(Brokers {
            routes,
            amqp_url: amqp_url.clone(),
            exchange: exchange.to_string(),
            nats_url: nats_url.clone(),
            confirm_timeout,
            rabbit: None,
            nats: None,
        })
    }

    /// Drops the connections, to be made again by the next batch.
    pub fn disconnect(&mut self) {
        self.rabbit = None;
        self.nats = None;
    }

    fn route(&self, topic: &str) -> Option<Kind> {
        self.routes.iter().find(|r| topic.starts_with(&r.prefix)).map(|r| r.kind)
    }

    async fn rabbit(&mut self) -> Result<&Channel, String> {
        if self.rabbit.as_ref().is_none_or(|(c, ch)| !c.status().connected() || !ch.status().connected()) {
            let url = self.amqp_url.as_deref().expect("checked in new");
            let connection = Connection::connect(url, ConnectionProperties::default())
                .await
                .map_err(|e| format!("RabbitMQ: cannot connect: {e}"))?;
            let channel = connection.create_channel().await.map_err(|e| format!("RabbitMQ: channel: {e}"))?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(|e| format!("RabbitMQ: confirm.select: {e}"))?;
            self.rabbit = Some((connection, channel));
        }
        Ok(&self.rabbit.as_ref().expect("just connected").1)
    }

    async fn nats(&mut self) -> Result<&async_nats::jetstream::Context, String> {
        if self.nats.is_none() {
            let url = self.nats_url.as_deref().expect("checked in new");
            let client = async_nats::ConnectOptions::new()
                .connection_timeout(self.confirm_timeout)
                .connect(url)
                .await
                .map_err(|e| format!("NATS: cannot connect: {e}"))?;
            let mut context = async_nats::jetstream::new(client);
            context.set_timeout(self.confirm_timeout);
            self.nats = Some(context);
        }
        Ok(self.nats.as_ref().expect("just connected"))
    }

    /// Starts publishing one message; Err is an outage.
    async fn start(&mut self, message: &Message) -> Result<Result<Pending, Outcome>, String> {
        let Some(kind) = self.route(&message.topic) else {
            return Ok(Err(Outcome::Failed(format!("no --route for topic {:?}", message.topic))));
        };
        let headers = header_pairs(message);
        match kind {
            Kind::RabbitMq => {
                let exchange = ShortString::from(self.exchange.as_str());
                let mut table = FieldTable::default();
                for (name, value) in headers {
                    table.insert(ShortString::from(name), AMQPValue::LongString(LongString::from(value)));
                }
                let properties = BasicProperties::default()
                    .with_message_id(ShortString::from(message.id.as_str()))
                    .with_content_type(ShortString::from("application/json"))
                    .with_delivery_mode(2)
                    .with_headers(table);
                let channel = self.rabbit().await?;
                let options = BasicPublishOptions { mandatory: true, ..BasicPublishOptions::default() };
                let confirm = channel
                    .basic_publish(
                        exchange,
                        ShortString::from(message.topic.as_str()),
                        options,
                        message.payload.as_bytes(),
                        properties,
                    )
                    .await
                    .map_err(|e| format!("RabbitMQ: publish: {e}"))?;
                Ok(Ok(Pending::Rabbit(confirm)))
            }
            Kind::Nats => {
                let mut map = async_nats::HeaderMap::new();
                map.insert(async_nats::header::NATS_MESSAGE_ID, message.id.as_str());
                for (name, value) in headers {
                    map.insert(name.as_str(), value.as_str());
                }
                let js = self.nats().await?;
                match js.publish_with_headers(message.topic.clone(), map, message.payload.clone().into()).await {
                    Ok(ack) => Ok(Ok(Pending::Nats(ack))),
                    Err(e) => nats_refusal(e.kind(), &e).map(Err),
                }
            }
        }
    }

    async fn finish(pending: Pending) -> Result<Outcome, String> {
        match pending {
            Pending::Rabbit(confirm) => match confirm.await.map_err(|e| format!("RabbitMQ: confirm: {e}"))? {
                Confirmation::Ack(None) => Ok(Outcome::Sent),
                Confirmation::Ack(Some(returned)) => Ok(Outcome::Failed(format!(
                    "RabbitMQ returned it as unroutable: {} {}",
                    returned.reply_code, returned.reply_text
                ))),
                Confirmation::Nack(_) => Ok(Outcome::Failed("RabbitMQ refused it (basic.nack)".into())),
                Confirmation::NotRequested => Err("RabbitMQ: the channel is not in confirm mode".into()),
            },
            Pending::Nats(ack) => match ack.await {
                Ok(_) => Ok(Outcome::Sent),
                Err(e) => nats_refusal(e.kind(), &e),
            },
        }
    }

    /// Publishes a batch in waves (see the module's comment). One outcome per message, None
    /// for a message left behind a refused one of its key; Err is an outage.
    pub async fn publish(&mut self, batch: &[Message]) -> Result<Vec<Option<Outcome>>, String> {
        let mut outcomes: Vec<Option<Outcome>> = batch.iter().map(|_| None).collect();
        // Per key, its messages' positions in the batch, in order.
        let mut queues: HashMap<Option<&str>, Vec<usize>> = HashMap::new();
        let mut keyless = Vec::new();
        for (i, m) in batch.iter().enumerate() {
            match m.ordering_key.as_deref() {
                Some(key) => queues.entry(Some(key)).or_default().push(i),
                None => keyless.push(i),
            }
        }
        let mut wave: Vec<usize> = keyless;
        let mut depth = 0;
        loop {
            wave.extend(queues.values().filter_map(|q| q.get(depth).copied()));
            if wave.is_empty() {
                return Ok(outcomes);
            }
            let mut pending = Vec::with_capacity(wave.len());
            for &i in &wave {
                match self.start(&batch[i]).await? {
                    Ok(p) => pending.push((i, p)),
                    Err(outcome) => outcomes[i] = Some(outcome),
                }
            }
            let confirmed = tokio::time::timeout(self.confirm_timeout, async {
                let mut done = Vec::with_capacity(pending.len());
                for (i, p) in pending {
                    done.push((i, Self::finish(p).await?));
                }
                Ok::<_, String>(done)
            })
            .await
            .map_err(|_| format!("no confirmation within {:?}", self.confirm_timeout))??;
            for (i, outcome) in confirmed {
                outcomes[i] = Some(outcome);
            }
            // A key whose message of this wave was refused stops here.
            queues.retain(|_, q| q.get(depth).is_some_and(|&i| matches!(outcomes[i], Some(Outcome::Sent))));
            depth += 1;
            wave = Vec::new();
        }
    }
}

/// The message's own headers (string values as they are, others as JSON), and its ordering key.
fn header_pairs(message: &Message) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    if let Some(serde_json::Value::Object(map)) = &message.headers {
        for (name, value) in map {
            let text = match value {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            pairs.push((name.clone(), text));
        }
    }
    if let Some(key) = &message.ordering_key {
        pairs.push(("Ordering-Key".to_string(), key.clone()));
    }
    pairs
}

/// A JetStream error that concerns the message (retry it later) or the connection (an outage).
fn nats_refusal(kind: PublishErrorKind, error: &dyn std::fmt::Display) -> Result<Outcome, String> {
    match kind {
        PublishErrorKind::StreamNotFound
        | PublishErrorKind::MaxPayloadExceeded
        | PublishErrorKind::WrongLastMessageId
        | PublishErrorKind::WrongLastSequence => Ok(Outcome::Failed(format!("NATS JetStream refused it: {error}"))),
        _ => Err(format!("NATS: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_prefix_wins() {
        let routes: Vec<Route> =
            ["=nats", "orders.=rabbitmq", "orders.eu.=nats"].iter().map(|r| r.parse().unwrap()).collect();
        let url = Some("x".to_string());
        let brokers = Brokers::new(&routes, &url, "", &url, Duration::from_secs(1)).unwrap();
        assert_eq!(brokers.route("orders.paid"), Some(Kind::RabbitMq));
        assert_eq!(brokers.route("orders.eu.paid"), Some(Kind::Nats));
        assert_eq!(brokers.route("audit"), Some(Kind::Nats));
        let only_orders = Brokers::new(&routes[1..2], &url, "", &None, Duration::from_secs(1)).unwrap();
        assert_eq!(only_orders.route("audit"), None);
        assert!(
            Brokers::new(&routes, &None, "", &url, Duration::from_secs(1)).is_err(),
            "rabbitmq routed without --amqp-url"
        );
    }
}
