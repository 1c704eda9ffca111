//! The real relay against the machine's RabbitMQ and NATS JetStream.
//!
//! - `ten_thousand_messages_four_relays_one_killed`: 10,000 messages over 200 ordering keys
//!   (half to a RabbitMQ queue, half to a JetStream stream), four relay processes, one killed
//!   with SIGKILL mid-stream. Consumers on the other side dedup with their own claim; each
//!   message is applied exactly once, and each key's messages arrive in order.
//! - `a_rabbitmq_outage_marks_nothing`, `a_nats_outage_marks_nothing`: the relay reaches the
//!   broker through a loopback TCP proxy that the test cuts: meanwhile nothing is marked sent,
//!   and everything arrives once the proxy is back.
//! - `messages_no_broker_takes_are_set_aside_alone`: messages that the client libraries panicked
//!   on, or that JetStream refuses every time, fail alone and are set aside; every other
//!   message, those behind them on their keys included, is delivered, and the relay runs on.
//!
//! Each test declares a uniquely named queue and stream and deletes them at the end, and runs
//! in a database of its own. PGHOST/PGPORT/PGUSER point at the server; AMQP_URL and NATS_URL
//! at the brokers (default: the machine's).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_lite::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use tokio_postgres::{Client, NoTls};

const LIMIT: Duration = Duration::from_secs(180);

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).ok().filter(|v| !v.is_empty()).unwrap_or_else(|| default.to_string())
}

fn pg_url(dbname: &str) -> String {
    let mut url = format!(
        "host={} port={} user={} dbname={dbname}",
        env_or("PGHOST", "127.0.0.1"),
        env_or("PGPORT", "5432"),
        env_or("PGUSER", "postgres")
    );
    if let Ok(password) = std::env::var("PGPASSWORD") {
        url.push_str(&format!(" password={password}"));
    }
    url
}

async fn pg(dbname: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(&pg_url(dbname), NoTls).await.expect("connect to PostgreSQL");
    tokio::spawn(connection);
    client
}

/// A name no other run uses.
fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{prefix}_{}_{nanos}", std::process::id())
}

/// A database of the test's own with the extension, dropped with it.
struct Database {
    name: String,
}

impl Database {
    async fn create(name: &str) -> Database {
        let admin = pg("postgres").await;
        admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await.unwrap();
        admin.batch_execute(&format!("CREATE DATABASE {name}")).await.unwrap();
        let db = pg(name).await;
        db.batch_execute("CREATE EXTENSION idempotency; CREATE TABLE applied (topic text, ordering_key text, n int, PRIMARY KEY (ordering_key, n))")
            .await
            .unwrap();
        Database { name: name.to_string() }
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let url = pg_url("postgres");
        let name = self.name.clone();
        // A plain thread: Drop may run outside the runtime, after a failed assertion.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                if let Ok((c, conn)) = tokio_postgres::connect(&url, NoTls).await {
                    tokio::spawn(conn);
                    let _ = c.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await;
                }
            });
        })
        .join();
    }
}

struct Relay(Child);

/// Where a relay reaches the brokers: the machine's, or a proxy in front of one.
#[derive(Clone)]
struct Brokers {
    amqp: String,
    nats: String,
}

impl Brokers {
    fn machine() -> Brokers {
        Brokers {
            amqp: env_or("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672"),
            nats: env_or("NATS_URL", "nats://127.0.0.1:4222"),
        }
    }
}

/// The host:port of a broker URL (amqp://user:pass@host:port/vhost, nats://host:port).
fn address(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.rsplit('@').next().unwrap_or(rest);
    rest.split('/').next().unwrap_or(rest).to_string()
}

impl Relay {
    fn start(name: &str, dbname: &str, brokers: &Brokers, routes: &str) -> Relay {
        Relay::start_with(name, dbname, brokers, routes, &[])
    }

    fn start_with(name: &str, dbname: &str, brokers: &Brokers, routes: &str, settings: &[(&str, &str)]) -> Relay {
        let child = Command::new(env!("CARGO_BIN_EXE_idempotency-relay"))
            .env("DATABASE_URL", format!("{} application_name={name}", pg_url(dbname)))
            .env("AMQP_URL", &brokers.amqp)
            .env("NATS_URL", &brokers.nats)
            .env("RELAY_ROUTES", routes)
            .env("RELAY_BATCH_SIZE", "50")
            .env("RELAY_LOG_EVERY_S", "5")
            .env("RELAY_CONFIRM_TIMEOUT_MS", "2000")
            .envs(settings.iter().copied())
            .stdout(Stdio::null())
            .spawn()
            .expect("start the relay");
        Relay(child)
    }

    /// SIGTERM, and the exit status once it has finished its batch.
    fn stop(mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill").arg("-TERM").arg(self.0.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "the relay did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What the consumers saw: per ordering key, the order in which messages were first applied.
#[derive(Default)]
struct Seen {
    first_order: HashMap<String, Vec<i32>>,
    deliveries: u64,
    duplicates: u64,
}

/// The consumer's transaction: claim the message id, apply it if new; returns whether new.
async fn apply(db: &Client, id: &str, topic: &str, payload: &[u8], seen: &Mutex<Seen>) -> bool {
    let body: serde_json::Value = serde_json::from_slice(payload).expect("a JSON payload");
    let key = body["key"].as_str().expect("key").to_string();
    let n = body["n"].as_i64().expect("n") as i32;
    db.batch_execute("BEGIN").await.unwrap();
    let new: bool = db.query_one("SELECT idem_claim($1, 'e2e-consumer')", &[&id]).await.unwrap().get(0);
    if new {
        db.execute("INSERT INTO applied VALUES ($1, $2, $3)", &[&topic, &key, &n]).await.unwrap();
    }
    db.batch_execute("COMMIT").await.unwrap();
    let mut seen = seen.lock().unwrap();
    seen.deliveries += 1;
    if new {
        seen.first_order.entry(key).or_default().push(n);
    } else {
        seen.duplicates += 1;
    }
    new
}

async fn consume_rabbit(
    amqp_url: String,
    queue: String,
    dbname: String,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
) {
    let db = pg(&dbname).await;
    let connection = Connection::connect(&amqp_url, ConnectionProperties::default()).await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel.basic_qos(100, BasicQosOptions::default()).await.unwrap();
    let mut consumer = channel
        .basic_consume(queue.as_str().into(), "e2e".into(), BasicConsumeOptions::default(), FieldTable::default())
        .await
        .unwrap();
    while !stop.load(Ordering::SeqCst) {
        let Ok(Some(delivery)) = tokio::time::timeout(Duration::from_millis(200), consumer.next()).await else {
            continue;
        };
        let delivery = delivery.unwrap();
        let id = delivery.properties.message_id().as_ref().expect("message_id").to_string();
        apply(&db, &id, &queue, &delivery.data, &seen).await;
        delivery.ack(BasicAckOptions::default()).await.unwrap();
    }
}

async fn consume_nats(stream: String, subject: String, dbname: String, seen: Arc<Mutex<Seen>>, stop: Arc<AtomicBool>) {
    let db = pg(&dbname).await;
    let client = async_nats::connect(env_or("NATS_URL", "nats://127.0.0.1:4222")).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let stream = js.get_stream(&stream).await.unwrap();
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            durable_name: Some("e2e".into()),
            ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut messages = consumer.messages().await.unwrap();
    while !stop.load(Ordering::SeqCst) {
        let Ok(Some(message)) = tokio::time::timeout(Duration::from_millis(200), messages.next()).await else {
            continue;
        };
        let message = message.unwrap();
        let id = message
            .headers
            .as_ref()
            .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
            .expect("Nats-Msg-Id")
            .to_string();
        apply(&db, &id, &subject, &message.payload, &seen).await;
        message.ack().await.unwrap();
    }
}

/// A durable queue for the test, and the connection and channel that declared it. Broker
/// objects are the operator's: the test declares them, the relay never does.
async fn declare_queue(amqp_url: &str, queue: &str) -> (Connection, lapin::Channel) {
    let rabbit = Connection::connect(amqp_url, ConnectionProperties::default()).await.unwrap();
    let admin = rabbit.create_channel().await.unwrap();
    admin
        .queue_declare(queue.into(), QueueDeclareOptions { durable: true, ..Default::default() }, FieldTable::default())
        .await
        .unwrap();
    (rabbit, admin)
}

/// A JetStream stream for the test, whose duplicate window outlasts the test, so a message the
/// relay publishes again is dropped by id.
async fn create_stream(nats_url: &str, stream: &str, subject: &str) -> async_nats::jetstream::Context {
    let js = async_nats::jetstream::new(async_nats::connect(nats_url).await.unwrap());
    js.create_stream(async_nats::jetstream::stream::Config {
        name: stream.to_string(),
        subjects: vec![subject.to_string()],
        duplicate_window: Duration::from_secs(600),
        ..Default::default()
    })
    .await
    .unwrap();
    js
}

async fn count(db: &Client, sql: &str) -> i64 {
    db.query_one(sql, &[]).await.unwrap().get(0)
}

async fn wait_for(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Each key's messages were first applied in the order they were sent.
fn assert_in_order(seen: &Seen, keys: usize, per_key: usize) {
    assert_eq!(seen.first_order.len(), keys, "every key was seen");
    for (key, order) in &seen.first_order {
        let expected: Vec<i32> = (0..per_key as i32).collect();
        assert_eq!(order, &expected, "key {key}: messages applied out of order");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_messages_four_relays_one_killed() {
    const KEYS: usize = 200;
    const PER_KEY: usize = 50;
    let brokers = Brokers::machine();
    let amqp_url = brokers.amqp.clone();
    let (queue, stream) = (unique("idem_e2e_q"), unique("IDEM_E2E_S"));
    let subject = format!("{}.events", stream.to_lowercase());
    let database = Database::create(&unique("idem_e2e")).await;
    let db = pg(&database.name).await;

    let (_rabbit, admin) = declare_queue(&amqp_url, &queue).await;
    let js = create_stream(&brokers.nats, &stream, &subject).await;

    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let consumers = [
        tokio::spawn(consume_rabbit(
            amqp_url.clone(),
            queue.clone(),
            database.name.clone(),
            seen.clone(),
            stop.clone(),
        )),
        tokio::spawn(consume_nats(stream.clone(), subject.clone(), database.name.clone(), seen.clone(), stop.clone())),
    ];
    let routes = format!("{queue}=rabbitmq,{subject}=nats");
    let mut relays: Vec<Relay> =
        (0..4).map(|i| Relay::start(&format!("e2e-relay-{i}"), &database.name, &brokers, &routes)).collect();

    // Senders commit while the relays run: keys 0..99 go to RabbitMQ, 100..199 to NATS; each
    // transaction sends the next message of 20 keys.
    let sender = {
        let (dbname, queue, subject) = (database.name.clone(), queue.clone(), subject.clone());
        tokio::spawn(async move {
            let db = pg(&dbname).await;
            for n in 0..PER_KEY as i32 {
                for chunk in (0..KEYS as i32).collect::<Vec<_>>().chunks(20) {
                    db.batch_execute("BEGIN").await.unwrap();
                    for &k in chunk {
                        let topic = if k < 100 { &queue } else { &subject };
                        let key = format!("key-{k}");
                        db.execute(
                            "SELECT idem_send($1, jsonb_build_object('key', $2::text, 'n', $3::int), ordering_key => $2, key => $2 || '/' || $3)",
                            &[topic, &key, &n],
                        )
                        .await
                        .unwrap();
                    }
                    db.batch_execute("COMMIT").await.unwrap();
                }
            }
        })
    };

    wait_for("2,000 messages applied", async || count(&db, "SELECT count(*) FROM applied").await >= 2000).await;
    // SIGKILL while relay 0 holds a batch: its transaction open, publishing.
    wait_for("relay 0 holding a batch", async || {
        count(&db, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'e2e-relay-0' AND state = 'idle in transaction'").await > 0
    })
    .await;
    drop(relays.remove(0));
    sender.await.unwrap();
    wait_for("all 10,000 messages applied", async || {
        count(&db, "SELECT count(*) FROM applied").await >= (KEYS * PER_KEY) as i64
    })
    .await;
    wait_for("every message marked sent", async || {
        count(&db, "SELECT count(*) FROM idempotency.outbox WHERE sent_at IS NULL").await == 0
    })
    .await;
    for relay in relays {
        assert!(relay.stop().success(), "a relay exited with an error on SIGTERM");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    for c in consumers {
        c.await.unwrap();
    }

    assert_eq!(
        count(&db, "SELECT count(*) FROM applied").await,
        (KEYS * PER_KEY) as i64,
        "each message applied exactly once"
    );
    {
        let seen = seen.lock().unwrap();
        assert_in_order(&seen, KEYS, PER_KEY);
        eprintln!(
            "e2e: {} messages over {KEYS} keys applied once each, in order; {} deliveries, {} duplicates dropped by the consumer's claim",
            KEYS * PER_KEY,
            seen.deliveries,
            seen.duplicates
        );
    }

    admin.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await.unwrap();
    js.delete_stream(&stream).await.unwrap();
}

/// A loopback TCP proxy to `target` that the test can cut (closing every connection and
/// refusing new ones) and restore.
struct Proxy {
    port: u16,
    open: Arc<AtomicBool>,
    streams: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(target: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = Arc::new(AtomicBool::new(true));
        let streams: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (o, s) = (open.clone(), streams.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if !o.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&target) else { continue };
                s.lock().unwrap().extend([client.try_clone().unwrap(), server.try_clone().unwrap()]);
                for (mut from, mut to) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)]
                {
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16384];
                        while let Ok(n) = from.read(&mut buf) {
                            if n == 0 || to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Proxy { port, open, streams }
    }

    fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        for s in self.streams.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    fn restore(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Broker {
    RabbitMq,
    Nats,
}

/// The relay reaches `broker` through a proxy the test cuts while messages wait: meanwhile
/// nothing is marked sent and no message counts a failure; once the proxy is back every message
/// arrives, repeats (published before the cut, unconfirmed) under the same id.
async fn an_outage_marks_nothing(broker: Broker) {
    const MESSAGES: i64 = 300;
    let machine = Brokers::machine();
    let name = unique("idem_e2e_outage");
    let database = Database::create(&name).await;
    let db = pg(&database.name).await;
    let (stream, subject) = (name.to_uppercase(), format!("{name}.events"));
    let (rabbit, js) = match broker {
        Broker::RabbitMq => (Some(declare_queue(&machine.amqp, &name).await), None),
        Broker::Nats => (None, Some(create_stream(&machine.nats, &stream, &subject).await)),
    };

    let (url, topic, route) = match broker {
        Broker::RabbitMq => (&machine.amqp, &name, "rabbitmq"),
        Broker::Nats => (&machine.nats, &subject, "nats"),
    };
    let target = address(url);
    let proxy = Proxy::start(target.clone());
    let proxied = url.replace(&target, &format!("127.0.0.1:{}", proxy.port));
    let brokers = match broker {
        Broker::RabbitMq => Brokers { amqp: proxied, ..machine.clone() },
        Broker::Nats => Brokers { nats: proxied, ..machine.clone() },
    };
    let relay = Relay::start("e2e-outage-relay", &database.name, &brokers, &format!("{topic}={route}"));

    let send = async |from: i64, to: i64| {
        db.execute(
            "SELECT count(idem_send($1, jsonb_build_object('key', 'k' || (n % 10), 'n', n / 10), ordering_key => 'k' || (n % 10), key => 'm' || n)) FROM generate_series($2::int8, $3::int8) AS n",
            &[topic, &from, &(to - 1)],
        )
        .await
        .unwrap();
    };
    send(0, MESSAGES / 2).await;
    wait_for("the first half sent", async || {
        count(&db, "SELECT count(*) FROM idempotency.outbox WHERE sent_at IS NULL").await == 0
    })
    .await;

    proxy.cut();
    send(MESSAGES / 2, MESSAGES).await;
    // Through the outage (several of the relay's retries), nothing more is marked sent.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let marked = count(&db, "SELECT count(*) FROM idempotency.outbox WHERE sent_at IS NOT NULL").await;
    assert_eq!(marked, MESSAGES / 2, "{broker:?}: messages were marked sent while the broker was unreachable");
    let failed = count(&db, "SELECT count(*) FROM idempotency.outbox WHERE attempts > 0").await;
    assert_eq!(failed, 0, "{broker:?}: an outage is not a message's failure");

    proxy.restore();
    wait_for("everything sent after the outage", async || {
        count(&db, "SELECT count(*) FROM idempotency.outbox WHERE sent_at IS NULL").await == 0
    })
    .await;
    assert!(relay.stop().success());

    // Every message is there, once per id: RabbitMQ keeps repeats (the queue is read by id),
    // JetStream drops them within its duplicate window.
    let arrived = match (rabbit, js) {
        (Some((rabbit, admin)), _) => {
            let channel = rabbit.create_channel().await.unwrap();
            let mut ids = std::collections::HashSet::new();
            while let Some(message) =
                channel.basic_get(name.as_str().into(), lapin::options::BasicGetOptions { no_ack: true }).await.unwrap()
            {
                ids.insert(message.delivery.properties.message_id().as_ref().unwrap().to_string());
            }
            admin.queue_delete(name.as_str().into(), QueueDeleteOptions::default()).await.unwrap();
            ids.len() as i64
        }
        (None, Some(js)) => {
            let messages = js.get_stream(&stream).await.unwrap().info().await.unwrap().state.messages;
            js.delete_stream(&stream).await.unwrap();
            messages as i64
        }
        (None, None) => unreachable!("one broker"),
    };
    assert_eq!(arrived, MESSAGES, "{broker:?}: every message arrived, once per id");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rabbitmq_outage_marks_nothing() {
    an_outage_marks_nothing(Broker::RabbitMq).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_outage_marks_nothing() {
    an_outage_marks_nothing(Broker::Nats).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_no_broker_takes_are_set_aside_alone() {
    let machine = Brokers::machine();
    let name = unique("idem_e2e_poison");
    let database = Database::create(&name).await;
    let db = pg(&database.name).await;
    let (_rabbit, admin) = declare_queue(&machine.amqp, &name).await;
    let stream = name.to_uppercase();
    let js = async_nats::jetstream::new(async_nats::connect(machine.nats.as_str()).await.unwrap());
    js.create_stream(async_nats::jetstream::stream::Config {
        name: stream.clone(),
        subjects: vec![format!("{name}.>")],
        max_message_size: 2000,
        ..Default::default()
    })
    .await
    .unwrap();

    // Topics "<name>.…" go to NATS, "<name>…" otherwise to RabbitMQ's queue <name>. Each poison
    // message heads an ordering key of its own, with a good message behind it.
    let ok = format!("{name}.ok");
    let poison: [(String, &str, &str); 6] = [
        (ok.clone(), "{}", r#"{"note": "a\nb"}"#),
        (ok.clone(), "{}", r#"{"Nats-Msg-Id": "copied"}"#),
        (format!("{name}.a b"), "{}", "{}"),
        (ok.clone(), "{\"pad\": \"PAD\"}", "{}"),
        (format!("{name}x{}", "x".repeat(300)), "{}", "{}"),
        (ok.clone(), "{}", r#"{"trace id": "x"}"#),
    ];
    for (i, (topic, payload, headers)) in poison.iter().enumerate() {
        db.execute(
            "SELECT idem_send($1, replace($2, 'PAD', repeat('p', 3000))::jsonb, $3::text::jsonb, ordering_key => 'p' || $4::text, key => 'poison-' || $4::text)",
            &[topic, payload, headers, &(i as i64).to_string()],
        )
        .await
        .unwrap();
        db.execute(
            "SELECT idem_send($1, '{}', ordering_key => 'p' || $2::text, key => 'behind-' || $2::text)",
            &[&ok, &(i as i64).to_string()],
        )
        .await
        .unwrap();
    }
    // Headers that are not an object, as a release before 0.5.0 stored them.
    db.execute("SELECT idem_send($1, '{}', ordering_key => 'p6', key => 'poison-6')", &[&ok]).await.unwrap();
    db.execute("SELECT idem_send($1, '{}', ordering_key => 'p6', key => 'behind-6')", &[&ok]).await.unwrap();
    db.execute(
        "UPDATE idempotency.outbox SET headers = '[1, 2]' WHERE id = idem_message_id('poison-6', 'default', 0)",
        &[],
    )
    .await
    .unwrap();
    db.execute(
        "SELECT count(idem_send(CASE WHEN n % 2 = 0 THEN $1 ELSE $2 END, '{}', key => 'good-' || n)) FROM generate_series(1, 40) AS n",
        &[&ok, &name],
    )
    .await
    .unwrap();

    let routes = format!("{name}.=nats,{name}=rabbitmq");
    let mut relay = Relay::start_with(
        "e2e-poison-relay",
        &database.name,
        &machine,
        &routes,
        &[("RELAY_MAX_ATTEMPTS", "2"), ("RELAY_RETRY_AFTER_MS", "10")],
    );
    wait_for("every message sent or set aside", async || {
        count(&db, "SELECT count(*) FROM idempotency.outbox WHERE sent_at IS NULL AND set_aside_at IS NULL").await == 0
    })
    .await;
    assert!(relay.0.try_wait().unwrap().is_none(), "the relay exited on a message");

    let set_aside: Vec<(String, i32, String)> = db
        .query(
            "SELECT idem_message_id('poison-' || n, 'default', 0)::text, attempts, coalesce(last_error, '') \
             FROM generate_series(0, 6) AS n JOIN idempotency.outbox ON id = idem_message_id('poison-' || n, 'default', 0) \
             WHERE set_aside_at IS NOT NULL ORDER BY n",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(set_aside.len(), 7, "every poison message is set aside: {set_aside:?}");
    for (id, attempts, error) in &set_aside {
        assert_eq!(*attempts, 2, "{id}: set aside after its attempts ({error})");
        assert!(!error.is_empty(), "{id}: its reason is kept");
    }
    let sent = count(&db, "SELECT count(*) FROM idempotency.outbox WHERE sent_at IS NOT NULL").await;
    assert_eq!(sent, 7 + 40, "the messages behind the poison ones, and every other one, were sent");
    assert!(relay.stop().success());

    let in_stream = js.get_stream(&stream).await.unwrap().info().await.unwrap().state.messages;
    assert_eq!(in_stream, 7 + 20, "JetStream holds the good messages, none dropped as a repeat of a copied id");
    js.delete_stream(&stream).await.unwrap();
    admin.queue_delete(name.as_str().into(), QueueDeleteOptions::default()).await.unwrap();
}
