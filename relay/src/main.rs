//! idempotency-relay: publishes the messages that `idem_send` wrote to the outbox, after their
//! transactions committed, to RabbitMQ and NATS JetStream.
//!
//! One loop per process, on one PostgreSQL connection: BEGIN, `idem_outbox_take`, publish,
//! mark each message sent (once the broker confirmed it) or failed, COMMIT. The rows it took
//! stay locked until then, so several relays run side by side without sharing anything, and
//! a relay that dies loses nothing: its transaction rolls back and its messages are pending
//! again. A broker outage rolls the batch back too and marks nothing; the relay retries with
//! back-off until the broker is back, and so it does after losing PostgreSQL.

mod broker;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use tokio_postgres::{Client, NoTls, Statement};

use broker::{Brokers, Message, Outcome, Route};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Publishes the idempotency outbox to RabbitMQ and NATS JetStream, in each ordering key's commit order.",
    after_help = "Topic mapping: a message goes to the broker of the longest --route prefix its topic starts with. \
RabbitMQ: published to --amqp-exchange with the topic as routing key, persistent, mandatory, with publisher confirms; \
the default exchange (\"\") delivers to the queue named like the topic. NATS: published with JetStream to the subject \
named like the topic, which a stream must capture. The relay declares nothing: exchanges, queues, bindings and streams \
are the operator's. Each message carries its outbox id as message_id (RabbitMQ) and Nats-Msg-Id (NATS); JetStream \
drops a repeated id only within the stream's duplicate window (2 minutes unless set), so set that window longer than \
the longest outage you want repeats dropped across."
)]
struct Args {
    /// PostgreSQL connection string (URI or key=value), for a role that may use the relay functions.
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// RabbitMQ URI, for topics routed to rabbitmq.
    #[arg(long, env = "AMQP_URL")]
    amqp_url: Option<String>,
    /// The RabbitMQ exchange messages are published to, with the topic as routing key.
    #[arg(long, env = "AMQP_EXCHANGE", default_value = "")]
    amqp_exchange: String,
    /// NATS server URL, for topics routed to nats.
    #[arg(long, env = "NATS_URL")]
    nats_url: Option<String>,
    /// PREFIX=BROKER, BROKER being rabbitmq or nats: topics that start with PREFIX go there; the
    /// longest prefix wins, and an empty prefix matches every topic. Repeat, or separate with commas.
    #[arg(long = "route", env = "RELAY_ROUTES", value_delimiter = ',', required = true)]
    routes: Vec<Route>,
    /// Messages taken per transaction.
    #[arg(long, env = "RELAY_BATCH_SIZE", default_value_t = 100)]
    batch_size: i32,
    /// Failed deliveries after which a message is set aside (idempotency.outbox_set_aside).
    #[arg(long, env = "RELAY_MAX_ATTEMPTS", default_value_t = 10)]
    max_attempts: i32,
    /// Wait before retrying a message the broker refused, in ms; doubled for every further attempt, up to ten minutes.
    #[arg(long, env = "RELAY_RETRY_AFTER_MS", default_value_t = 1000)]
    retry_after_ms: u64,
    /// Pause between two looks at an empty outbox, in ms: how late an idle relay notices a new message.
    #[arg(long, env = "RELAY_POLL_MS", default_value_t = 50)]
    poll_ms: u64,
    /// Longest wait for a broker's confirmation, in ms, after which the batch counts as an outage.
    #[arg(long, env = "RELAY_CONFIRM_TIMEOUT_MS", default_value_t = 10_000)]
    confirm_timeout_ms: u64,
    /// Seconds between two progress lines on stderr.
    #[arg(long, env = "RELAY_LOG_EVERY_S", default_value_t = 10)]
    log_every_s: u64,
}

const TAKE: &str = "SELECT id::text, topic, ordering_key, payload::text, headers::text, attempts \
                    FROM idem_outbox_take($1)";
const SENT: &str = "SELECT idem_outbox_sent($1::text[]::uuid[])";
const FAILED: &str = "SELECT idem_outbox_failed($1::text::uuid, $2, $3::text::interval, $4)";
const LAG: &str = "SELECT coalesce(extract(epoch FROM max(oldest_pending_age)), 0)::float8, \
                   coalesce(sum(pending), 0)::int8 FROM idempotency.outbox_status";

/// Counters for the progress line.
#[derive(Default)]
struct Progress {
    relayed: u64,
    failed: u64,
    set_aside: u64,
    outages: u64,
}

fn log(line: impl AsRef<str>) {
    eprintln!("idempotency-relay[{}]: {}", std::process::id(), line.as_ref());
}

fn retry_after(args: &Args, attempts: i32) -> String {
    let ms = args.retry_after_ms.saturating_mul(1 << attempts.clamp(0, 20)).min(600_000);
    format!("{ms} milliseconds")
}

/// A connection and the relay's statements, prepared on it once: a batch then costs two round
/// trips (BEGIN with the take, the marking with COMMIT) instead of six, which four relays on
/// two cores felt. They are prepared by the first batch, so that an error in preparing them
/// is an error of that batch, as it was of every batch when each statement was prepared anew.
struct Db {
    client: Client,
    prepared: Option<Prepared>,
}

#[derive(Clone)]
struct Prepared {
    take: Statement,
    sent: Statement,
    failed: Statement,
}

impl Db {
    async fn prepared(&mut self) -> Result<Prepared, tokio_postgres::Error> {
        if self.prepared.is_none() {
            let c = &self.client;
            let (take, sent, failed) = tokio::try_join!(c.prepare(TAKE), c.prepare(SENT), c.prepare(FAILED))?;
            self.prepared = Some(Prepared { take, sent, failed });
        }
        Ok(self.prepared.clone().expect("prepared above"))
    }
}

async fn connect(url: &str) -> Result<Db, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            log(format!("PostgreSQL connection ended: {e}"));
        }
    });
    Ok(Db { client, prepared: None })
}

/// What became of one look at the outbox.
enum Batch {
    Empty,
    Relayed,
    /// A broker could not be reached or did not confirm: nothing was marked.
    Outage(String),
}

/// One batch: taken, published, marked, committed.
async fn relay_batch(
    db: &mut Db,
    brokers: &mut Brokers,
    args: &Args,
    progress: &mut Progress,
) -> Result<Batch, tokio_postgres::Error> {
    let statements = db.prepared().await?;
    let db = &db.client;
    // Sent together: the take runs once BEGIN has.
    let size: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&args.batch_size];
    let (_, rows) = tokio::try_join!(db.batch_execute("BEGIN"), db.query(&statements.take, &size))?;
    if rows.is_empty() {
        db.batch_execute("COMMIT").await?;
        return Ok(Batch::Empty);
    }
    let batch: Vec<Message> = rows
        .iter()
        .map(|r| Message {
            id: r.get(0),
            topic: r.get(1),
            ordering_key: r.get(2),
            payload: r.get(3),
            headers: r.get::<_, Option<String>>(4).map(|h| serde_json::from_str(&h).map_err(|e| e.to_string())),
            attempts: r.get(5),
        })
        .collect();
    let outcomes = match brokers.publish(&batch).await {
        Ok(outcomes) => outcomes,
        Err(outage) => {
            // Nothing is marked: every message of the batch is pending again, and what the
            // broker did get is a repeat its consumers recognise by id.
            db.batch_execute("ROLLBACK").await?;
            progress.outages += 1;
            return Ok(Batch::Outage(outage));
        }
    };
    let mut sent = Vec::with_capacity(batch.len());
    for (message, outcome) in batch.iter().zip(outcomes) {
        match outcome {
            Some(Outcome::Sent) => sent.push(message.id.clone()),
            Some(Outcome::Failed(reason)) => {
                let state: String = db
                    .query_one(
                        &statements.failed,
                        &[&message.id, &reason, &retry_after(args, message.attempts), &args.max_attempts],
                    )
                    .await?
                    .get(0);
                progress.failed += 1;
                if state == "set aside" {
                    progress.set_aside += 1;
                    log(format!(
                        "set aside message {} ({}) after {} attempts: {reason}",
                        message.id,
                        message.topic,
                        message.attempts + 1
                    ));
                }
            }
            // Behind a failure of its key: stays pending, untouched.
            None => {}
        }
    }
    // Sent together: COMMIT ends the transaction either way, and a refused marking is the
    // error returned, its batch rolled back.
    let ids: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&sent];
    tokio::try_join!(db.query_one(&statements.sent, &ids), db.batch_execute("COMMIT"))?;
    progress.relayed += sent.len() as u64;
    Ok(Batch::Relayed)
}

/// An error that a new connection, later, may not meet: the connection lost (a restart, a
/// failover, a terminated backend), a server starting or shutting down, a standby not yet
/// promoted, a serialization failure or deadlock, exhausted resources. Anything else (a
/// missing privilege, a setting that idem_outbox_take refuses) would fail every batch again,
/// so the relay stops and says why, as it did before it reconnected at all.
fn transient(e: &tokio_postgres::Error) -> bool {
    let Some(db) = e.as_db_error() else { return true };
    let code = db.code().code();
    ["08", "40", "53", "57P"].iter().any(|class| code.starts_with(class)) || code == "25006"
}

/// What PostgreSQL said, with its SQLSTATE (tokio-postgres's own text is only "db error").
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

/// A new connection after one failed, waiting `backoff` first; None when asked to stop.
async fn reconnect(url: &str, stop: &AtomicBool, backoff: &mut Duration) -> Option<Db> {
    while !stop.load(Ordering::SeqCst) {
        tokio::time::sleep(*backoff).await;
        *backoff = (*backoff * 2).clamp(Duration::from_millis(100), Duration::from_secs(10));
        match connect(url).await {
            Ok(client) => return Some(client),
            Err(e) => log(format!("cannot reconnect to PostgreSQL; retrying in {backoff:?}: {}", describe(&e))),
        }
    }
    None
}

async fn run(args: Args, stop: Arc<AtomicBool>) -> Result<(), String> {
    let mut db = connect(&args.database_url).await.map_err(|e| format!("cannot connect to PostgreSQL: {e}"))?;
    let mut brokers = Brokers::new(
        &args.routes,
        &args.amqp_url,
        &args.amqp_exchange,
        &args.nats_url,
        Duration::from_millis(args.confirm_timeout_ms),
    )?;
    let mut progress = Progress::default();
    let (mut last_log, mut last_relayed) = (Instant::now(), 0u64);
    let mut backoff = Duration::ZERO;
    // Grows across failures in a row, so that one that keeps coming back is not retried
    // ten times a second; a batch that goes through starts it over.
    let mut db_backoff = Duration::from_millis(100);
    log(format!("started: batches of {}, routes {:?}", args.batch_size, args.routes));
    while !stop.load(Ordering::SeqCst) {
        let batch = match relay_batch(&mut db, &mut brokers, &args, &mut progress).await {
            Ok(batch) => batch,
            // A restart, a failover, a terminated backend, a deadlock: the server rolled the
            // batch back, so its messages are pending again. A new connection starts afresh
            // (an error inside the transaction would leave this one unusable until ROLLBACK).
            Err(e) if !transient(&e) => return Err(format!("PostgreSQL: {}", describe(&e))),
            Err(e) => {
                log(format!("PostgreSQL: {}; the batch is rolled back, reconnecting in {db_backoff:?}", describe(&e)));
                match reconnect(&args.database_url, &stop, &mut db_backoff).await {
                    Some(client) => db = client,
                    None => break,
                }
                continue;
            }
        };
        if !matches!(batch, Batch::Outage(_)) {
            db_backoff = Duration::from_millis(100);
        }
        match batch {
            Batch::Relayed => backoff = Duration::ZERO,
            Batch::Empty => tokio::time::sleep(Duration::from_millis(args.poll_ms)).await,
            Batch::Outage(why) => {
                backoff = (backoff * 2).clamp(Duration::from_millis(100), Duration::from_secs(10));
                log(format!("broker outage, nothing marked; retrying in {backoff:?}: {why}"));
                brokers.disconnect();
                tokio::time::sleep(backoff).await;
            }
        }
        if last_log.elapsed() >= Duration::from_secs(args.log_every_s) {
            let (lag, pending): (f64, i64) = match db.client.query_one(LAG, &[]).await {
                Ok(row) => (row.get(0), row.get(1)),
                Err(_) => (f64::NAN, -1),
            };
            let rate = (progress.relayed - last_relayed) as f64 / last_log.elapsed().as_secs_f64();
            log(format!(
                "relayed {} ({rate:.0}/s), failed {}, set aside {}, outages {}; pending {pending}, oldest {lag:.1}s",
                progress.relayed, progress.failed, progress.set_aside, progress.outages
            ));
            (last_log, last_relayed) = (Instant::now(), progress.relayed);
        }
    }
    log(format!("stopped: relayed {}, failed {}, set aside {}", progress.relayed, progress.failed, progress.set_aside));
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            log("stopping after the current batch");
            stop.store(true, Ordering::SeqCst);
        });
    }
    match run(args, stop).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log(e);
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn flags_are_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn routes_parse_and_refuse_unknown_brokers() {
        let args = Args::try_parse_from([
            "relay",
            "--database-url",
            "x",
            "--amqp-url",
            "a",
            "--route",
            "orders.=rabbitmq,=nats",
        ])
        .expect("two routes");
        assert_eq!(args.routes.len(), 2);
        assert!(Args::try_parse_from(["relay", "--database-url", "x", "--route", "orders.=kafka"]).is_err());
        assert!(Args::try_parse_from(["relay", "--database-url", "x", "--route", "no-broker"]).is_err());
    }

    #[test]
    fn retries_back_off_to_ten_minutes() {
        let args = Args::try_parse_from(["relay", "--database-url", "x", "--route", "=nats"]).unwrap();
        assert_eq!(retry_after(&args, 0), "1000 milliseconds");
        assert_eq!(retry_after(&args, 3), "8000 milliseconds");
        assert_eq!(retry_after(&args, 30), "600000 milliseconds");
    }
}
