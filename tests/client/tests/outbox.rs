//! The outbox under load from real connections: senders commit keyed messages while relays
//! drain them, fail some deliveries, and die in the middle of batches.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{ok, test_db, TestDb, WAIT_LIMIT};
use postgres::Client;

fn db() -> &'static TestDb {
    test_db("outbox", "CREATE SEQUENCE commit_rank; CREATE TABLE commits (m text PRIMARY KEY, rank bigint NOT NULL)")
}

const SENDERS: usize = 4;
const MESSAGES_PER_SENDER: usize = 150;
const KEYS: usize = 12;
const RELAYS: usize = 4;

/// A tiny deterministic generator, so that a failing run can be replayed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// What the relays published, in publication order, with the relay that did it.
type Published = Arc<Mutex<Vec<(String, String, usize)>>>;

/// One relay: take a batch, "publish" each key's messages in order (a random one fails and
/// stops its key), mark them, commit; now and then it dies mid-batch instead, its connection
/// dropped with the transaction open.
fn relay(id: usize, published: Published, done: Arc<AtomicBool>) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (id as u64 + 1));
    let mut c = db().connect(&format!("relay-{id}"));
    let deadline = Instant::now() + WAIT_LIMIT * 3;
    loop {
        assert!(Instant::now() < deadline, "relay {id}: the outbox did not drain in time");
        ok(c.batch_execute("BEGIN"), "relay BEGIN");
        let batch = ok(c.query("SELECT id::text, ordering_key, payload->>'m' FROM idem_outbox_take(20)", &[]), "take");
        if batch.is_empty() {
            ok(c.batch_execute("COMMIT"), "relay COMMIT");
            if done.load(Ordering::SeqCst) {
                let left: i64 =
                    ok(c.query_one("SELECT count(*) FROM idempotency.outbox WHERE sent_at IS NULL", &[]), "pending")
                        .get(0);
                if left == 0 {
                    return;
                }
            }
            thread::sleep(Duration::from_millis(5));
            continue;
        }
        if rng.chance(10) {
            // Dies: the connection goes away with the transaction open; nothing is marked.
            drop(c);
            c = db().connect(&format!("relay-{id}"));
            continue;
        }
        let mut stopped: Vec<String> = Vec::new();
        let mut sent: Vec<String> = Vec::new();
        for row in &batch {
            let (msg_id, key, m): (String, Option<String>, String) = (row.get(0), row.get(1), row.get(2));
            let key = key.expect("every message here has an ordering key");
            if stopped.contains(&key) {
                continue;
            }
            if rng.chance(5) {
                ok(c.execute("SELECT idem_outbox_failed($1::text::uuid, 'simulated NACK', '0')", &[&msg_id]), "failed");
                stopped.push(key);
                continue;
            }
            published.lock().unwrap().push((key, m, id));
            sent.push(msg_id);
        }
        ok(c.execute("SELECT idem_outbox_sent($1::text[]::uuid[])", &[&sent]), "sent");
        ok(c.batch_execute("COMMIT"), "relay COMMIT");
    }
}

/// Guarantees: every message is marked sent, and each key's messages are published in the
/// order their senders committed, although four relays drain them at once, some deliveries
/// fail, and relays die holding batches. A message a dead relay held is published again (as
/// a broker would see a redelivery), but never ahead of an earlier message of its key.
#[test]
fn four_relays_keep_each_keys_commit_order() {
    let published: Published = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicBool::new(false));
    let relays: Vec<_> = (0..RELAYS)
        .map(|id| {
            let (published, done) = (published.clone(), done.clone());
            thread::spawn(move || relay(id, published, done))
        })
        .collect();

    let senders: Vec<_> = (0..SENDERS)
        .map(|s| {
            thread::spawn(move || {
                let mut c: Client = db().connect(&format!("sender-{s}"));
                for n in 0..MESSAGES_PER_SENDER {
                    let key = format!("key-{}", (s * 7 + n) % KEYS);
                    let m = format!("{s}-{n}");
                    ok(c.batch_execute("BEGIN"), "sender BEGIN");
                    ok(
                        c.execute(
                            "SELECT idem_send('t', jsonb_build_object('m', $1::text), ordering_key => $2, key => $1)",
                            &[&m, &key],
                        ),
                        "send",
                    );
                    // The commit order, independent of the outbox's seq: a rank drawn as the
                    // transaction's last statement, under the key's lock, which it holds until
                    // COMMIT, so a key's ranks follow its commits.
                    ok(c.execute("INSERT INTO commits VALUES ($1, nextval('commit_rank'))", &[&m]), "rank");
                    ok(c.batch_execute("COMMIT"), "sender COMMIT");
                }
            })
        })
        .collect();
    for s in senders {
        s.join().expect("a sender panicked");
    }
    done.store(true, Ordering::SeqCst);
    for r in relays {
        r.join().expect("a relay panicked");
    }

    let mut c = db().connect("outbox-check");
    let unsent: i64 =
        ok(c.query_one("SELECT count(*) FROM idempotency.outbox WHERE sent_at IS NULL", &[]), "unsent").get(0);
    assert_eq!(unsent, 0, "every message was marked sent");
    let total: i64 = ok(c.query_one("SELECT count(*) FROM idempotency.outbox", &[]), "total").get(0);
    assert_eq!(total as usize, SENDERS * MESSAGES_PER_SENDER);

    // Each key's commit order, by the senders' ranks; the outbox's seq must agree with it.
    let mut order: HashMap<String, Vec<String>> = HashMap::new();
    for row in ok(
        c.query(
            "SELECT o.ordering_key, c.m FROM commits AS c JOIN idempotency.outbox AS o \
             ON o.id = idem_message_id(c.m, 'default', 0) ORDER BY c.rank",
            &[],
        ),
        "commit order",
    ) {
        order.entry(row.get(0)).or_default().push(row.get(1));
    }
    let mut by_seq: HashMap<String, Vec<String>> = HashMap::new();
    for row in ok(c.query("SELECT ordering_key, payload->>'m' FROM idempotency.outbox ORDER BY seq", &[]), "seq order")
    {
        by_seq.entry(row.get(0)).or_default().push(row.get(1));
    }
    assert_eq!(by_seq, order, "the outbox's seq orders each key's messages as their transactions committed");
    // A key's publications, first publication of each message only, must follow that order,
    // and a message may be published again only by a relay after one that died holding it.
    let published = published.lock().unwrap();
    let mut seen: HashMap<String, Vec<String>> = HashMap::new();
    for (key, m, _) in published.iter() {
        let first = seen.entry(key.clone()).or_default();
        if !first.contains(m) {
            first.push(m.clone());
        }
    }
    for (key, expected) in &order {
        assert_eq!(seen.get(key), Some(expected), "key {key}: published out of commit order");
    }
}
