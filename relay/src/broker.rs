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
    /// Err holds why the stored headers could not be read: the message then fails, rather
    /// than go out without them.
    pub headers: Option<Result<serde_json::Value, String>>,
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
        if ShortString::try_new(exchange).is_err() {
            return Err(format!("--amqp-exchange is {} bytes; RabbitMQ takes at most 255", exchange.len()));
        }
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
        let headers = match header_pairs(message) {
            Ok(headers) => headers,
            Err(why) => return Ok(Err(Outcome::Failed(why))),
        };
        match kind {
            Kind::RabbitMq => {
                // A routing key and a header name are AMQP short strings: lapin panics on one
                // over 255 bytes, where the message alone is at fault.
                let short = |what: &str, text: &str| {
                    ShortString::try_new(text).map_err(|_| {
                        Outcome::Failed(format!("{what} is {} bytes; RabbitMQ takes at most 255", text.len()))
                    })
                };
                let routing_key = match short("the topic (the routing key)", &message.topic) {
                    Ok(key) => key,
                    Err(refused) => return Ok(Err(refused)),
                };
                let exchange = ShortString::from(self.exchange.as_str());
                let mut table = FieldTable::default();
                for (name, value) in headers {
                    match short(&format!("header name {:?}", abbreviate(&name)), &name) {
                        Ok(name) => {
                            table.insert(name, AMQPValue::LongString(LongString::from(value)));
                        }
                        Err(refused) => return Ok(Err(refused)),
                    }
                }
                let properties = BasicProperties::default()
                    .with_message_id(ShortString::from(message.id.as_str()))
                    .with_content_type(ShortString::from("application/json"))
                    .with_delivery_mode(2)
                    .with_headers(table);
                let channel = self.rabbit().await?;
                let options = BasicPublishOptions { mandatory: true, ..BasicPublishOptions::default() };
                let confirm = channel
                    .basic_publish(exchange, routing_key, options, message.payload.as_bytes(), properties)
                    .await
                    .map_err(|e| format!("RabbitMQ: publish: {e}"))?;
                Ok(Ok(Pending::Rabbit(confirm)))
            }
            Kind::Nats => {
                let map = match nats_headers(message, headers) {
                    Ok(map) => map,
                    Err(why) => return Ok(Err(Outcome::Failed(why))),
                };
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

/// The message's own headers (string values as they are, others as JSON), then its ordering
/// key; Err when its headers are not a JSON object (idem_send refuses those since 0.5.0, but
/// an older release stored them), which would otherwise go out without a word.
fn header_pairs(message: &Message) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    match &message.headers {
        None => {}
        Some(Err(why)) => return Err(format!("its headers cannot be read: {why}")),
        Some(Ok(serde_json::Value::Object(map))) => {
            for (name, value) in map {
                let text = match value {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                pairs.push((name.clone(), text));
            }
        }
        Some(Ok(other)) => {
            return Err(format!("its headers are not a JSON object: {}", abbreviate(&other.to_string())))
        }
    }
    if let Some(key) = &message.ordering_key {
        pairs.push(("Ordering-Key".to_string(), key.clone()));
    }
    Ok(pairs)
}

/// The NATS headers of a message: its id as Nats-Msg-Id, then its own, each checked as
/// async-nats would check it with a panic. A header of its own named Nats-… is refused, since
/// JetStream acts on them: a copied Nats-Msg-Id would make JetStream drop other messages as
/// repeats of this one, and Nats-Expected-… or Nats-Rollup would refuse or purge messages.
fn nats_headers(message: &Message, headers: Vec<(String, String)>) -> Result<async_nats::HeaderMap, String> {
    let topic = &message.topic;
    if topic.is_empty() || topic.contains([' ', '\t', '\r', '\n']) {
        return Err(format!("the topic {:?} is no NATS subject: it is empty or holds white space", abbreviate(topic)));
    }
    let mut map = async_nats::HeaderMap::new();
    map.insert(async_nats::header::NATS_MESSAGE_ID, message.id.as_str());
    for (name, value) in headers {
        let shown = abbreviate(&name);
        if name.is_empty() || name.get(..5).is_some_and(|prefix| prefix.eq_ignore_ascii_case("nats-")) {
            return Err(format!("header {shown:?}: an empty name, or one of JetStream's own Nats- headers"));
        }
        let name = async_nats::HeaderName::from_str(&name)
            .map_err(|_| format!("header {shown:?}: a NATS header name is printable ASCII without ':'"))?;
        let value = async_nats::HeaderValue::from_str(&value).map_err(|_| {
            format!("the value of header {shown:?} holds a line break, which NATS headers cannot carry")
        })?;
        map.insert(name, value);
    }
    Ok(map)
}

/// At most 64 characters of a text a message quotes.
fn abbreviate(text: &str) -> String {
    match text.char_indices().nth(64) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_string(),
    }
}

/// A JetStream error that concerns the message (retry it later) or the connection (an outage).
/// async-nats files every error the server answers with under Other: of those, only the ones
/// about this message's own size concern it. The rest (no cluster leader during an election,
/// storage exhausted or failing, JetStream off) would set aside every message while they
/// last, and a key whose message is set aside goes on without it: they are outages.
fn nats_refusal(kind: PublishErrorKind, error: &(dyn std::error::Error + 'static)) -> Result<Outcome, String> {
    use async_nats::jetstream::ErrorCode;
    let answered = error.source().and_then(|source| source.downcast_ref::<async_nats::jetstream::Error>()).is_some_and(
        |refusal| {
            [ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM, ErrorCode::STREAM_HEADER_EXCEEDS_MAXIMUM]
                .contains(&refusal.error_code())
        },
    );
    let refused = answered
        || matches!(
            kind,
            PublishErrorKind::StreamNotFound
                | PublishErrorKind::MaxPayloadExceeded
                | PublishErrorKind::WrongLastMessageId
                | PublishErrorKind::WrongLastSequence
        );
    if refused {
        Ok(Outcome::Failed(format!("NATS JetStream refused it: {error}")))
    } else {
        Err(format!("NATS: {error}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(topic: &str, ordering_key: Option<&str>, headers: Option<serde_json::Value>) -> Message {
        let headers = headers.map(Ok);
        Message {
            id: "00000000-0000-0000-0000-000000000001".into(),
            topic: topic.into(),
            ordering_key: ordering_key.map(String::from),
            payload: "{}".into(),
            headers,
            attempts: 0,
        }
    }

    fn nats(m: &Message) -> Result<async_nats::HeaderMap, String> {
        nats_headers(m, header_pairs(m)?)
    }

    // Each of these made async-nats or lapin panic, which took the relay down mid-batch and
    // then every relay that took the message again: they are the message's failures now.
    #[test]
    fn messages_no_broker_takes_fail_alone() {
        use serde_json::json;
        let refused = |m: Message| nats(&m).expect_err("refused");
        assert!(refused(message("orders", None, Some(json!({"note": "a\nb"})))).contains("line break"));
        assert!(refused(message("orders", Some("key\r1"), None)).contains("line break"));
        assert!(refused(message("orders", None, Some(json!({"trace id": "x"})))).contains("printable ASCII"));
        assert!(refused(message("orders", None, Some(json!({"café": "x"})))).contains("printable ASCII"));
        assert!(refused(message("orders", None, Some(json!({"a:b": "x"})))).contains("printable ASCII"));
        assert!(refused(message("orders paid", None, None)).contains("no NATS subject"));
        assert!(refused(message("", None, None)).contains("no NATS subject"));
        for reserved in ["Nats-Msg-Id", "nats-msg-id", "Nats-Expected-Last-Sequence", "Nats-Rollup"] {
            assert!(refused(message("orders", None, Some(json!({reserved: "x"})))).contains("Nats-"), "{reserved}");
        }
        assert!(header_pairs(&message("orders", None, Some(json!([1, 2])))).is_err(), "headers as an array");
        assert!(header_pairs(&message("orders", None, Some(json!(null)))).is_err(), "headers as JSON null");

        let mut unreadable = message("orders", None, None);
        unreadable.headers = Some(Err("a number out of range".into()));
        assert!(header_pairs(&unreadable).is_err(), "headers that cannot be read");
        // jsonb prints 1e400 as its 401 digits, past any f64.
        let digits = format!("1{}", "0".repeat(400));
        let big: serde_json::Value =
            serde_json::from_str(&format!(r#"{{"n": {digits}, "d": 0.1000000000000000001}}"#)).unwrap();
        let pairs = header_pairs(&message("orders", None, Some(big))).unwrap();
        assert_eq!(pairs, vec![("d".to_string(), "0.1000000000000000001".to_string()), ("n".into(), digits)]);

        let map =
            nats(&message("orders.paid", Some("k1"), Some(json!({"n": 1, "s": "x", "Ordering-Key": "mine"})))).unwrap();
        assert_eq!(map.get("Nats-Msg-Id").map(|v| v.as_str()), Some("00000000-0000-0000-0000-000000000001"));
        assert_eq!(map.get("n").map(|v| v.as_str()), Some("1"));
        assert_eq!(map.get("s").map(|v| v.as_str()), Some("x"));
        assert_eq!(map.get("Ordering-Key").map(|v| v.as_str()), Some("k1"), "the ordering key is the relay's");
    }

    #[test]
    fn an_exchange_name_over_255_bytes_is_refused_at_start() {
        let routes: Vec<Route> = vec!["=rabbitmq".parse().unwrap()];
        let url = Some("x".to_string());
        assert!(Brokers::new(&routes, &url, &"e".repeat(256), &None, Duration::from_secs(1)).is_err());
        assert!(Brokers::new(&routes, &url, &"e".repeat(255), &None, Duration::from_secs(1)).is_ok());
    }

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
