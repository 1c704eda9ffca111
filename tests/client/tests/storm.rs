//! A storm of 32 sessions (#15): overlapping claims under all three isolation levels, batches
//! whose savepoints roll back part of the work, and versioned updates of shared rows, retried
//! the way a consumer retries a redelivered message. Afterwards the business state and the
//! storage must both be exact.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::thread;
use std::time::Duration;

use postgres::Client;

use common::{assert_intact, describe, ok, sqlstate, test_db, Barrier, Lcg, TestDb};

const SETUP: &str = "
CREATE EXTENSION amcheck;
-- No unique constraint: a key's second effect must show up as a second row, not as an error.
CREATE TABLE effects (key text NOT NULL, worker int NOT NULL);
CREATE INDEX effects_key ON effects (key);
CREATE TABLE accounts (id int PRIMARY KEY, status text, version bigint);
INSERT INTO accounts SELECT g, 'opened', 0 FROM generate_series(1, 8) AS g;
";

const WORKERS: usize = 32;
const TRANSACTIONS: usize = 8;
const BATCH: usize = 6;
const KEYS: u64 = 150;
const ACCOUNTS: u64 = 8;
const ISOLATION: [&str; 3] = ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"];

fn db() -> &'static TestDb {
    test_db("storm", SETUP)
}

/// One message of a batch: its key, the account it moves to `version`, and whether the
/// savepoint around its processing is rolled back.
struct Message {
    key: String,
    account: i32,
    version: i64,
    rolled_back: bool,
}

/// What a worker's committed transactions did: the keys they claimed as new and the keys they
/// processed (outside rolled-back savepoints), and the versions they wrote.
#[derive(Default)]
struct Committed {
    won: Vec<String>,
    processed: Vec<String>,
    versions: Vec<(i32, i64)>,
    retries: usize,
}

/// Every third transaction claims its whole batch with idem_claim_many.
fn claims_many(transaction: usize) -> bool {
    transaction % 3 == 2
}

/// The batches of one worker: keys drawn from a pool the 32 workers share, so most keys are
/// claimed by several sessions at once; a quarter of the savepoints roll back (never worker
/// 0's, so the run always commits some work). A batch claimed with idem_claim_many has one
/// savepoint around it all, so its messages share one fate. Versions are unique per message.
fn batches(worker: usize) -> Vec<Vec<Message>> {
    let mut lcg = Lcg::new(0x5707_0000 + worker as u64);
    (0..TRANSACTIONS)
        .map(|t| {
            let batch_rolled_back = worker != 0 && lcg.below(4) == 0;
            (0..BATCH)
                .map(|m| Message {
                    key: format!("storm-{}", lcg.below(KEYS)),
                    account: 1 + lcg.below(ACCOUNTS) as i32,
                    version: ((worker * TRANSACTIONS + t) * BATCH + m + 1) as i64,
                    rolled_back: if claims_many(t) { batch_rolled_back } else { worker != 0 && lcg.below(4) == 0 },
                })
                .collect()
        })
        .collect()
}

/// The business side of one message: its effect when the claim was new, and its version.
fn process(c: &mut Client, worker: usize, m: &Message, new: bool) -> Result<(), postgres::Error> {
    if new {
        c.execute("INSERT INTO effects (key, worker) VALUES ($1, $2)", &[&m.key, &(worker as i32)])?;
    }
    c.execute(
        "SELECT idem_versioned_update('accounts', jsonb_build_object('id', $1::int), \
         jsonb_build_object('status', 'moved', 'version', $2::bigint))",
        &[&m.account, &m.version],
    )?;
    Ok(())
}

fn end_savepoint(c: &mut Client, name: &str, rolled_back: bool) -> Result<(), postgres::Error> {
    c.batch_execute(&format!("{} SAVEPOINT {name}", if rolled_back { "ROLLBACK TO" } else { "RELEASE" }))
}

/// One transaction of a worker: for each message, whether its claim was new. It fails with
/// the SQLSTATE that ends it (a serialization failure or a deadlock, after which the consumer
/// retries the whole batch, as a redelivery would).
fn run_batch(
    c: &mut Client,
    worker: usize,
    isolation: &str,
    batch: &[Message],
    many: bool,
) -> Result<Vec<bool>, postgres::Error> {
    c.batch_execute(&format!("BEGIN ISOLATION LEVEL {isolation}"))?;
    let new = if many {
        c.batch_execute("SAVEPOINT batch")?;
        let keys: Vec<&str> = batch.iter().map(|m| m.key.as_str()).collect();
        let answers: Vec<Option<bool>> = c.query_one("SELECT idem_claim_many($1::text[])", &[&keys])?.get(0);
        let new: Vec<bool> = answers.into_iter().map(|a| a.expect("idem_claim_many answers every key")).collect();
        for (m, &new) in batch.iter().zip(&new) {
            process(c, worker, m, new)?;
        }
        end_savepoint(c, "batch", batch[0].rolled_back)?;
        new
    } else {
        let mut new = Vec::with_capacity(batch.len());
        for m in batch {
            c.batch_execute("SAVEPOINT message")?;
            let claimed: Option<bool> = c.query_one("SELECT idem_claim($1)", &[&m.key])?.get(0);
            let claimed = claimed.expect("idem_claim answers");
            process(c, worker, m, claimed)?;
            end_savepoint(c, "message", m.rolled_back)?;
            new.push(claimed);
        }
        new
    };
    c.batch_execute("COMMIT")?;
    Ok(new)
}

fn work(db: &TestDb, worker: usize, start: &Barrier) -> Committed {
    let isolation = ISOLATION[worker % ISOLATION.len()];
    let mut c = db.connect(&format!("storm-{worker}"));
    // Claims in batch order and updates of shared rows deadlock by design here; the default
    // second before the detector runs would make the storm a queue.
    ok(c.batch_execute("SET deadlock_timeout = '20ms'"), "SET deadlock_timeout");
    let mut committed = Committed::default();
    let mut backoff = Lcg::new(0xBAC0_0000 + worker as u64);
    start.wait();
    for (t, batch) in batches(worker).into_iter().enumerate() {
        loop {
            match run_batch(&mut c, worker, isolation, &batch, claims_many(t)) {
                Ok(new) => {
                    for (m, new) in batch.iter().zip(new).filter(|(m, _)| !m.rolled_back) {
                        if new {
                            committed.won.push(m.key.clone());
                        }
                        committed.processed.push(m.key.clone());
                        committed.versions.push((m.account, m.version));
                    }
                    break;
                }
                Err(e) if matches!(sqlstate(&e), Some("40001" | "40P01")) => {
                    ok(c.batch_execute("ROLLBACK"), "ROLLBACK after a serialization failure");
                    committed.retries += 1;
                    assert!(committed.retries < 500, "worker {worker} ({isolation}) keeps failing: {}", describe(&e));
                    // A few milliseconds apart, as a broker's redelivery would be: retrying at
                    // once only meets the same writers again, longer on a slower build.
                    thread::sleep(Duration::from_millis(1 + backoff.below(8)));
                }
                Err(e) => panic!("worker {worker} ({isolation}), transaction {t}: {}", describe(&e)),
            }
        }
    }
    committed
}

/// Guarantee: with 32 sessions claiming overlapping keys under READ COMMITTED, REPEATABLE
/// READ and SERIALIZABLE, with savepoints rolled back inside batch transactions and versioned
/// updates of 8 shared rows, retried on 40001 and 40P01:
/// - every key a committed transaction processed has exactly one effect and one ledger row,
///   and exactly one committed claim answered "new" for it;
/// - a key no committed transaction processed has neither;
/// - each account ends at the highest version a committed, kept savepoint wrote;
/// - amcheck finds the ledger, the effects and the accounts intact, heaps and every index.
#[test]
fn thirty_two_sessions_at_every_isolation_level_leave_exact_state() {
    let db = db();
    let start = &Barrier::new(WORKERS);
    let started = std::time::Instant::now();
    let results: Vec<Committed> = thread::scope(|s| {
        let handles: Vec<_> = (0..WORKERS).map(|w| s.spawn(move || work(db, w, start))).collect();
        // Not common::join's 30 s: on an assert-enabled build the storm takes longer. Every
        // statement is bounded by the connections' statement_timeout and the retries by 500.
        handles.into_iter().map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    });

    let processed: BTreeSet<&String> = results.iter().flat_map(|r| &r.processed).collect();
    let mut winners: BTreeMap<&String, usize> = BTreeMap::new();
    for key in results.iter().flat_map(|r| &r.won) {
        *winners.entry(key).or_default() += 1;
    }
    let mut check = db.connect("storm-check");
    let effects: BTreeMap<String, i64> = check
        .query("SELECT key, count(*) FROM effects GROUP BY key", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let pool: Vec<String> = (0..KEYS).map(|k| format!("storm-{k}")).collect();
    let ledger: BTreeMap<String, i64> = check
        .query(
            "SELECT k, (SELECT count(*) FROM idempotency.ledger WHERE key_digest = idem_digest(k)) \
             FROM unnest($1::text[]) AS k",
            &[&pool],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    for key in &pool {
        let done = processed.contains(key);
        let expected = i64::from(done);
        assert_eq!(effects.get(key).copied().unwrap_or(0), expected, "{key}: effects (processed: {done})");
        assert_eq!(ledger[key], expected, "{key}: ledger rows (processed: {done})");
        assert_eq!(winners.get(key).copied().unwrap_or(0), expected as usize, "{key}: claims that answered new");
    }
    assert!(processed.len() > KEYS as usize / 2, "the storm processed {} keys of {KEYS}", processed.len());

    let mut highest: BTreeMap<i32, i64> = (1..=ACCOUNTS as i32).map(|a| (a, 0)).collect();
    for &(account, version) in results.iter().flat_map(|r| &r.versions) {
        let top = highest.get_mut(&account).expect("a known account");
        *top = (*top).max(version);
    }
    let versions: BTreeMap<i32, i64> =
        check.query("SELECT id, version FROM accounts", &[]).unwrap().iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(versions, highest, "each account holds the highest committed version");

    assert_intact(&mut check, &["idempotency.ledger", "effects", "accounts"]);
    let retries: usize = results.iter().map(|r| r.retries).sum();
    println!(
        "storm: {} keys processed in {:.1} s, {retries} retries after 40001 or 40P01",
        processed.len(),
        started.elapsed().as_secs_f64()
    );
}
