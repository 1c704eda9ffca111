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

/// Where a consumer keeps what it has processed.
enum Dedup {
    /// SET … NX before the transaction, as Redis dedup libraries do; the keys it took.
    Redis { redis: Redis, prefix: String, taken: Vec<String> },
    /// idem_claim inside the transaction.
    Claim,
}

impl Dedup {
    fn name(&self) -> &'static str {
        match self {
            Dedup::Redis { .. } => "redis",
            Dedup::Claim => "idem_claim",
        }
    }

    /// One delivery of `message`; `crash` ends it before COMMIT by closing the connection,
    /// as a killed process would. True when acked.
    fn deliver(&mut self, db: &TestDb, message: &str, crash: bool) -> bool {
        let path = self.name();
        let first = match self {
            Dedup::Redis { redis, prefix, taken } => {
                let key = format!("{prefix}{message}");
                taken.push(key.clone());
                Some(redis.claim(&key))
            }
            Dedup::Claim => None,
        };
        let mut client = db.connect(path);
        ok(client.batch_execute("BEGIN"), "BEGIN");
        let first = first.unwrap_or_else(|| {
            ok(client.query_one("SELECT idem_claim($1, 'payments')", &[&message]), "idem_claim").get(0)
        });
        if !first {
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

    /// Every message: a first delivery (every third crashing), a redelivery of the crashed
    /// ones, a duplicate of all. Returns (lost, doubled).
    fn run(&mut self, db: &TestDb) -> (i64, i64) {
        for n in 1..=MESSAGES {
            let message = format!("payment-{n}");
            if !self.deliver(db, &message, n % 3 == 0) {
                assert!(self.deliver(db, &message, false), "the redelivery is acked");
            }
            assert!(self.deliver(db, &message, false), "the duplicate is acked");
        }
        let mut client = db.connect("count");
        let row = ok(
            client.query_one(
                "SELECT count(*) FILTER (WHERE applied = 0), count(*) FILTER (WHERE applied > 1)
                 FROM (SELECT (SELECT count(*) FROM payments p WHERE p.path = $1 AND p.message = 'payment-' || n) AS applied
                       FROM generate_series(1, $2::int) AS n) AS m",
                &[&self.name(), &(MESSAGES as i32)],
            ),
            "count the effects",
        );
        (row.get(0), row.get(1))
    }
}

#[test]
fn setnx_beside_the_transaction_loses_what_the_claim_keeps() {
    let db = db();
    let prefix = format!("idem-test:{}:", std::process::id());
    let mut redis = Dedup::Redis { redis: Redis::connect(), prefix, taken: Vec::new() };
    let (redis_lost, redis_doubled) = redis.run(db);
    if let Dedup::Redis { redis, taken, .. } = &mut redis {
        for key in taken.iter() {
            redis.command(&["DEL", key]);
        }
    }
    let (claim_lost, claim_doubled) = Dedup::Claim.run(db);
    let crashed = i64::from(MESSAGES / 3);
    println!(
        "redis_counterexample: {MESSAGES} messages, {crashed} first deliveries crashed before COMMIT; \
         Redis SETNX: {redis_lost} lost, {redis_doubled} doubled; idem_claim: {claim_lost} lost, {claim_doubled} doubled"
    );
    assert_eq!((redis_lost, redis_doubled), (crashed, 0), "SETNX loses exactly the crashed messages");
    assert_eq!((claim_lost, claim_doubled), (0, 0), "the claim loses and doubles nothing");
}
