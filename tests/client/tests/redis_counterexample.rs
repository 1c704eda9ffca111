//! The counter-example (#14): dedup kept in Redis with SETNX beside a business write in
//! PostgreSQL loses a message when the transaction dies after the Redis write, because the
//! redelivery finds the key taken and is skipped. The same consumer with idem_claim in its
//! own transaction applies every message once: the claim dies with the transaction.
//!
//! Every third message's first delivery ends the way a crashed consumer's does: its
//! connection is closed inside the transaction, before COMMIT and before the ack. The broker
//! then redelivers it, and every message is delivered once more as a plain duplicate.
//! Needs the machine's Redis (REDIS_ADDR, default 127.0.0.1:6379); its keys are this run's
//! own and are deleted afterwards.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;

use common::{ok, test_db, TestDb};
use postgres::Client;

const MESSAGES: u32 = 90;

fn db() -> &'static TestDb {
    test_db(
        "redis_counterexample",
        "CREATE TABLE payments (id bigserial PRIMARY KEY, path text NOT NULL, message text NOT NULL)",
    )
}

/// Just enough RESP for SET … NX and DEL.
struct Redis {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Redis {
    fn connect() -> Redis {
        let address = std::env::var("REDIS_ADDR").unwrap_or_else(|_| "127.0.0.1:6379".into());
        let stream = TcpStream::connect(&address).unwrap_or_else(|e| panic!("Redis at {address}: {e}"));
        Redis { reader: BufReader::new(stream.try_clone().unwrap()), stream }
    }

    /// The reply's first line: "+OK", "$-1" (nil), ":1" …
    fn command(&mut self, args: &[&str]) -> String {
        let mut request = format!("*{}\r\n", args.len());
        for arg in args {
            request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        self.stream.write_all(request.as_bytes()).unwrap();
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        assert!(!line.starts_with('-'), "Redis refused {args:?}: {line}");
        line.trim_end().to_string()
    }

    /// SETNX with a TTL, as dedup libraries do: true when this delivery took the key.
    fn claim(&mut self, key: &str) -> bool {
        self.command(&["SET", key, "1", "NX", "EX", "600"]) == "+OK"
    }
}

/// One delivery of `message` through a consumer whose dedup is `claim`; `crash` ends it
/// before COMMIT by closing the connection, as a killed process would. True when acked.
fn deliver(db: &TestDb, message: &str, crash: bool, claim: &mut dyn FnMut(&mut Client) -> bool, path: &str) -> bool {
    let mut client = db.connect(path);
    ok(client.batch_execute("BEGIN"), "BEGIN");
    if !claim(&mut client) {
        ok(client.batch_execute("ROLLBACK"), "ROLLBACK");
        return true; // a duplicate: acked without effect
    }
    ok(client.execute("INSERT INTO payments (path, message) VALUES ($1, $2)", &[&path, &message]), "the effect");
    if crash {
        drop(client); // the server rolls the transaction back; no ack, so the broker redelivers
        return false;
    }
    ok(client.batch_execute("COMMIT"), "COMMIT");
    true
}

/// Runs every message through `claim_for`: a first delivery (crashing for every third), a
/// redelivery of the crashed ones, a duplicate of all. Returns (lost, doubled).
fn run(db: &TestDb, path: &str, claim_for: &mut dyn FnMut(&str) -> Box<dyn FnMut(&mut Client) -> bool>) -> (i64, i64) {
    for n in 1..=MESSAGES {
        let message = format!("payment-{n}");
        let acked = deliver(db, &message, n % 3 == 0, &mut *claim_for(&message), path);
        if !acked {
            assert!(deliver(db, &message, false, &mut *claim_for(&message), path), "the redelivery is acked");
        }
        assert!(deliver(db, &message, false, &mut *claim_for(&message), path), "the duplicate is acked");
    }
    let mut client = db.connect("count");
    let row = ok(
        client.query_one(
            "SELECT count(*) FILTER (WHERE applied = 0), count(*) FILTER (WHERE applied > 1)
             FROM (SELECT 'payment-' || n AS message, (SELECT count(*) FROM payments p WHERE p.path = $1 AND p.message = 'payment-' || n) AS applied
                   FROM generate_series(1, $2::int) AS n) AS m",
            &[&path, &(MESSAGES as i32)],
        ),
        "count the effects",
    );
    (row.get(0), row.get(1))
}

#[test]
fn setnx_beside_the_transaction_loses_what_the_claim_keeps() {
    let db = db();
    let run_id = std::process::id();
    let mut redis = Redis::connect();
    let mut taken = Vec::new();
    let (redis_lost, redis_doubled) = run(db, "redis", &mut |message| {
        let key = format!("idem-test:{run_id}:{message}");
        taken.push(key.clone());
        let took = redis.claim(&key);
        Box::new(move |_| took)
    });
    let mut cleanup = Redis::connect();
    for key in &taken {
        cleanup.command(&["DEL", key]);
    }
    let (claim_lost, claim_doubled) = run(db, "idem_claim", &mut |message| {
        let key = message.to_string();
        Box::new(move |client| ok(client.query_one("SELECT idem_claim($1, 'payments')", &[&key]), "idem_claim").get(0))
    });
    let crashed = i64::from(MESSAGES / 3);
    println!(
        "redis_counterexample: {MESSAGES} messages, {crashed} first deliveries crashed before COMMIT; \
         Redis SETNX: {redis_lost} lost, {redis_doubled} doubled; idem_claim: {claim_lost} lost, {claim_doubled} doubled"
    );
    assert_eq!((redis_lost, redis_doubled), (crashed, 0), "SETNX loses exactly the crashed messages");
    assert_eq!((claim_lost, claim_doubled), (0, 0), "the claim loses and doubles nothing");
}
