//! Crashes (#15): a backend killed with SIGKILL between its claim and its COMMIT, and the whole
//! server stopped with `pg_ctl stop -m immediate` in the middle of a storm of consumers. After
//! crash recovery, exactly what committed is there, and redelivering every message processes
//! each exactly once.
//!
//! These tests kill the server they run against, so they are ignored by a plain `cargo test`:
//! tests/crash.sh starts a cluster of its own and runs them there, each in its own process (so
//! each gets a fresh database). Besides the libpq variables it passes CRASH_STOP and
//! CRASH_START, the shell commands that stop the server with `-m immediate` and start it
//! again, and CRASH_KILLED_PID, the file where the SIGKILL test leaves its victim's pid for
//! the script's leak sentinel. The test process must be allowed to SIGKILL the backend
//! (tests/crash.sh runs as root).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::env;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use postgres::Client;

use common::{assert_intact, claim, claim_many, describe, ok, sqlstate, test_db, wait_until, Lcg, TestDb, WAIT_LIMIT};

const SETUP: &str = "
CREATE EXTENSION amcheck;
-- One row per delivery attempt, written first: whether an attempt survived the crash is read
-- here, even for one whose claims all answered false and so left nothing else behind.
CREATE TABLE transactions (tx bigint PRIMARY KEY);
-- No unique constraint: a key's second effect must show up as a second row, not as an error.
CREATE TABLE effects (key text NOT NULL, tx bigint NOT NULL);
CREATE INDEX effects_key ON effects (key);
CREATE INDEX effects_tx ON effects (tx);
CREATE TABLE accounts (id int PRIMARY KEY, version bigint NOT NULL);
INSERT INTO accounts SELECT g, 0 FROM generate_series(0, 7) AS g;
";

/// What amcheck reads after each crash: the extension's tables and the business tables.
const CHECKED: [&str; 5] = ["idempotency.ledger", "idempotency.outbox", "transactions", "effects", "accounts"];

const WORKERS: usize = 8;
/// Keys the workers draw from, so that sessions claim the same keys at once and duplicates
/// arrive both during the storm and on redelivery.
const POOL: u64 = 4000;
const ACCOUNTS: u64 = 8;
const BATCH: usize = 5;
/// How long the storm runs at the least before the server is stopped.
const STORM: Duration = Duration::from_millis(2000);
/// ... and how many transactions it commits by then at the least.
const MIN_COMMITS: usize = 100;
/// Redelivery commits this many messages a transaction.
const REDELIVERY_CHUNK: usize = 25;

fn db() -> &'static TestDb {
    test_db("crash", SETUP)
}

/// A setting tests/crash.sh passes.
fn setting(name: &str) -> String {
    env::var(name).unwrap_or_else(|_| panic!("{name} is not set: these tests run from tests/crash.sh"))
}

/// Runs one of the server commands tests/crash.sh passes (CRASH_STOP, CRASH_START), which
/// know how to reach the cluster as its owner.
fn server(command: &str) {
    let script = setting(command);
    let out = Command::new("sh").args(["-c", &script]).output().unwrap_or_else(|e| panic!("{command}: {e}"));
    assert!(
        out.status.success(),
        "{command} ({script}) failed: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

// --- a message and its processing ---------------------------------------------------------

/// Message `k` always carries the same content, as a redelivered message does: its key, the
/// account it moves and the version it moves it to (unique, so a version names its message).
fn key(k: u64) -> String {
    format!("crash-{k}")
}

fn account(k: u64) -> i32 {
    (k % ACCOUNTS) as i32
}

fn version(k: u64) -> i64 {
    k as i64 + 1
}

/// One delivery attempt: a transaction that processes `keys`, the claims among them that
/// answered true before it ended, and how it ended as its client saw it.
struct Attempt {
    tx: i64,
    keys: Vec<u64>,
    won: Vec<u64>,
    outcome: Outcome,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Outcome {
    /// COMMIT returned.
    Committed,
    /// A deadlock (40P01) ended it before COMMIT; the worker rolled back and tried again.
    RolledBack,
    /// The server went away before COMMIT was sent.
    Lost,
    /// The server went away while COMMIT was on its way: committed or not, the client cannot know.
    InDoubt,
}

static NEXT_TX: AtomicI64 = AtomicI64::new(1);

impl Attempt {
    fn new(keys: Vec<u64>) -> Self {
        Attempt { tx: NEXT_TX.fetch_add(1, Ordering::SeqCst), keys, won: Vec::new(), outcome: Outcome::Lost }
    }

    /// Everything up to COMMIT: claims (one `idem_claim` per key, or one `idem_claim_many`);
    /// for a new claim its effect and an outbox message; for every message the versioned
    /// update of its shared account row. A single claim's message takes an ordering key, so
    /// that senders of an account also serialize on its lock; a batch's is sent with `key =>`,
    /// since a batch claim numbers no message.
    fn process(&mut self, c: &mut Client, many: bool) -> Result<(), postgres::Error> {
        c.batch_execute("BEGIN")?;
        c.execute("INSERT INTO transactions (tx) VALUES ($1)", &[&self.tx])?;
        let names: Vec<String> = self.keys.iter().map(|&k| key(k)).collect();
        let batch_answers = if many { Some(claim_many(c, &names, "default")?) } else { None };
        for (i, (&k, name)) in self.keys.iter().zip(&names).enumerate() {
            let new = match &batch_answers {
                Some(answers) => answers[i],
                None => claim(c, name)?,
            };
            if new {
                self.won.push(k);
                c.execute("INSERT INTO effects (key, tx) VALUES ($1, $2)", &[name, &self.tx])?;
                if many {
                    c.execute(
                        "SELECT idem_send('crash.effect', jsonb_build_object('key', $1::text, 'tx', $2::bigint), \
                         key => $1)",
                        &[name, &self.tx],
                    )?;
                } else {
                    c.execute(
                        "SELECT idem_send('crash.effect', jsonb_build_object('key', $1::text, 'tx', $2::bigint), \
                         ordering_key => $3)",
                        &[name, &self.tx, &format!("account-{}", account(k))],
                    )?;
                }
            }
            c.execute(
                "SELECT idem_versioned_update('accounts', jsonb_build_object('id', $1::int), \
                 jsonb_build_object('version', $2::bigint))",
                &[&account(k), &version(k)],
            )?;
        }
        Ok(())
    }

    /// Processes and commits, for a redelivery after the crash, where nothing may fail.
    fn commit(&mut self, c: &mut Client, many: bool) {
        ok(self.process(c, many), &format!("transaction {}", self.tx));
        ok(c.batch_execute("COMMIT"), &format!("COMMIT of transaction {}", self.tx));
        self.outcome = Outcome::Committed;
    }

    /// Its claims that answered false: duplicates it suppressed.
    fn duplicates(&self) -> usize {
        self.keys.len() - self.won.len()
    }
}

// --- what the database holds ----------------------------------------------------------------

/// The state checked after a crash, read through one connection.
struct Stored {
    transactions: BTreeSet<i64>,
    effects_by_tx: BTreeMap<i64, i64>,
    /// By message: the `k` of `key(k)`.
    effects_by_key: BTreeMap<u64, i64>,
    outbox_by_tx: BTreeMap<i64, i64>,
    outbox_by_key: BTreeMap<u64, i64>,
    /// The messages (of the first `pool`) whose key has a ledger row.
    claimed: BTreeSet<u64>,
    /// Every ledger row, of any key.
    ledger_rows: i64,
    versions: BTreeMap<i32, i64>,
}

fn counts<K: Ord + postgres::types::FromSqlOwned>(c: &mut Client, sql: &str) -> BTreeMap<K, i64> {
    ok(c.query(sql, &[]), sql).iter().map(|r| (r.get(0), r.get(1))).collect()
}

/// Counts by key text, by message number.
fn by_message(counts: BTreeMap<String, i64>) -> BTreeMap<u64, i64> {
    counts
        .into_iter()
        .map(|(name, n)| {
            let k = name.strip_prefix("crash-").and_then(|k| k.parse().ok());
            (k.unwrap_or_else(|| panic!("{name:?} is no message of this test")), n)
        })
        .collect()
}

/// Asserts that `actual` holds exactly the messages `expected`, naming the first that differ
/// either way rather than printing thousands.
#[track_caller]
fn assert_same(what: &str, actual: &BTreeSet<u64>, expected: &BTreeSet<u64>) {
    let missing: Vec<u64> = expected.difference(actual).copied().collect();
    let extra: Vec<u64> = actual.difference(expected).copied().collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{what}: {} missing (first: {:?}), {} not expected (first: {:?})",
        missing.len(),
        &missing[..missing.len().min(10)],
        extra.len(),
        &extra[..extra.len().min(10)]
    );
}

/// Asserts that each message in `expected`, and no other, counts exactly once.
#[track_caller]
fn assert_once_each(what: &str, counts: &BTreeMap<u64, i64>, expected: &BTreeSet<u64>) {
    let wrong: Vec<(u64, i64)> = counts.iter().filter(|(_, &n)| n != 1).map(|(&k, &n)| (k, n)).collect();
    assert!(
        wrong.is_empty(),
        "{what}: {} messages counted more than once (first: {:?})",
        wrong.len(),
        &wrong[..wrong.len().min(10)]
    );
    assert_same(what, &counts.keys().copied().collect(), expected);
}

impl Stored {
    fn read(c: &mut Client, pool: u64) -> Self {
        let claimed: Vec<i64> = ok(
            c.query(
                "SELECT k FROM generate_series(0, $1::bigint - 1) AS k \
                 WHERE EXISTS (SELECT FROM idempotency.ledger WHERE key_digest = idem_digest('crash-' || k))",
                &[&(pool as i64)],
            ),
            "the claimed keys",
        )
        .iter()
        .map(|r| r.get(0))
        .collect();
        Stored {
            transactions: ok(c.query("SELECT tx FROM transactions", &[]), "transactions")
                .iter()
                .map(|r| r.get(0))
                .collect(),
            effects_by_tx: counts(c, "SELECT tx, count(*) FROM effects GROUP BY tx"),
            effects_by_key: by_message(counts(c, "SELECT key, count(*) FROM effects GROUP BY key")),
            outbox_by_tx: counts(c, "SELECT (payload->>'tx')::bigint, count(*) FROM idempotency.outbox GROUP BY 1"),
            outbox_by_key: by_message(counts(c, "SELECT payload->>'key', count(*) FROM idempotency.outbox GROUP BY 1")),
            claimed: claimed.into_iter().map(|k| k as u64).collect(),
            ledger_rows: ok(c.query_one("SELECT count(*) FROM idempotency.ledger", &[]), "ledger rows").get(0),
            versions: counts(c, "SELECT id, version FROM accounts"),
        }
    }

    /// Whether attempt `a` is in the database, wholly or not at all: its transactions row, one
    /// effect and one outbox message per claim it won, and the ledger rows of those claims. A
    /// deadlock's rolled-back claims may have been won again by a later attempt, so their
    /// ledger rows say nothing about it.
    #[track_caller]
    fn present(&self, a: &Attempt) -> bool {
        let there = self.transactions.contains(&a.tx);
        let expected = if there { a.won.len() as i64 } else { 0 };
        let what = format!(
            "transaction {} ({:?}, {}; won {:?})",
            a.tx,
            a.outcome,
            if there { "present" } else { "absent" },
            a.won
        );
        assert_eq!(self.effects_by_tx.get(&a.tx).copied().unwrap_or(0), expected, "{what}: effects");
        assert_eq!(self.outbox_by_tx.get(&a.tx).copied().unwrap_or(0), expected, "{what}: outbox messages");
        if a.outcome != Outcome::RolledBack {
            for k in &a.won {
                assert_eq!(self.claimed.contains(k), there, "{what}: ledger row of {}", key(*k));
            }
        }
        there
    }

    /// The accounts as the present attempts leave them: each at the highest version any of
    /// them wrote, whatever their claims answered (a versioned update is idempotent itself).
    #[track_caller]
    fn assert_versions<'a>(&self, present: impl Iterator<Item = &'a Attempt>) {
        let mut highest: BTreeMap<i32, i64> = (0..ACCOUNTS as i32).map(|a| (a, 0)).collect();
        for &k in present.flat_map(|a| &a.keys) {
            let top = highest.get_mut(&account(k)).expect("a known account");
            *top = (*top).max(version(k));
        }
        assert_eq!(self.versions, highest, "each account holds the highest version a present transaction wrote");
    }
}

// --- SIGKILL between claim and COMMIT -----------------------------------------------------------

/// Guarantee: a backend killed with SIGKILL after its claim, effect, outbox message and
/// versioned update but before COMMIT leaves none of them once the postmaster has restarted
/// every backend (crash recovery); redelivering the message then processes it once: the claim
/// answers true, and false on the next redelivery.
#[test]
#[ignore = "kills a backend: run by tests/crash.sh, on a cluster of its own"]
fn sigkill_between_claim_and_commit_leaves_nothing() {
    let db = db();
    let k = 0;
    let mut observer = db.session("crash-observer");
    let mut victim = db.session("crash-victim");
    let mut killed = Attempt::new(vec![k]);
    ok(killed.process(&mut victim.client, false), "the victim's claim and effect");
    assert_eq!(killed.won, [k], "the victim's claim is new");

    // tests/crash.sh lets exactly the log lines of this backend's death through its sentinel.
    std::fs::write(setting("CRASH_KILLED_PID"), victim.pid.to_string()).expect("CRASH_KILLED_PID is writable");
    let kill = Command::new("kill").args(["-9", &victim.pid.to_string()]).status().expect("kill runs");
    assert!(kill.success(), "kill -9 {} failed: {kill}", victim.pid);
    assert!(victim.client.batch_execute("COMMIT").is_err(), "COMMIT on a killed backend cannot succeed");
    // The postmaster ends every other backend too, which is how a crash restart shows itself.
    wait_until("the postmaster to end the other backends", || observer.client.simple_query("SELECT 1").is_err());
    let deadline = Instant::now() + WAIT_LIMIT;
    let mut c = loop {
        match db.try_connect("crash-after-sigkill") {
            Ok(c) => break c,
            Err(e) => assert!(Instant::now() < deadline, "the server did not recover: {}", describe(&e)),
        }
        thread::sleep(Duration::from_millis(20));
    };

    let stored = Stored::read(&mut c, 1);
    assert!(!stored.present(&killed), "the killed transaction left nothing");
    assert_eq!(stored.ledger_rows, 0, "no ledger row");
    stored.assert_versions(std::iter::empty());
    assert_intact(&mut c, &CHECKED);

    let mut first = Attempt::new(vec![k]);
    first.commit(&mut c, false);
    let mut second = Attempt::new(vec![k]);
    second.commit(&mut c, false);
    assert_eq!((first.won.as_slice(), second.won.as_slice()), (&[k][..], &[][..]), "redelivery: true, then false");
    let stored = Stored::read(&mut c, 1);
    assert!(stored.present(&first) && stored.present(&second), "both redeliveries committed");
    assert_eq!(stored.effects_by_key.get(&k), Some(&1), "one effect");
    assert_eq!(stored.ledger_rows, 1, "one ledger row");
    stored.assert_versions([&first, &second].into_iter());
    println!(
        "crash: SIGKILL of backend {} before COMMIT: nothing of it after recovery; redelivered twice, processed once",
        victim.pid
    );
}

// --- pg_ctl stop -m immediate during a storm ---------------------------------------------------

/// One storm worker: delivers a single message or a batch, chosen at random, until the
/// server goes away; retries a transaction that a deadlock ended, as a consumer whose
/// message is redelivered would. Any error before the server is stopped fails the test.
fn storm_worker(db: &TestDb, worker: usize, stopping: &AtomicBool, commits: &AtomicUsize) -> Vec<Attempt> {
    let mut c = db.connect(&format!("crash-storm-{worker}"));
    // Claims, account rows and ordering keys locked in message order deadlock by design here;
    // the default second before the detector runs would make the storm a queue.
    ok(c.batch_execute("SET deadlock_timeout = '20ms'"), "SET deadlock_timeout");
    let mut lcg = Lcg::new(0xc4a5_0000 + worker as u64);
    let mut attempts = Vec::new();
    let crashed = |e: &postgres::Error, what: &str| {
        assert!(stopping.load(Ordering::SeqCst), "worker {worker}: {what} failed before the crash: {}", describe(e));
    };
    loop {
        let many = lcg.below(3) == 0;
        let keys: Vec<u64> = (0..if many { BATCH } else { 1 }).map(|_| lcg.below(POOL)).collect();
        loop {
            let mut a = Attempt::new(keys.clone());
            match a.process(&mut c, many) {
                Ok(()) => match c.batch_execute("COMMIT") {
                    Ok(()) => {
                        a.outcome = Outcome::Committed;
                        commits.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(e) => {
                        crashed(&e, "COMMIT");
                        a.outcome = Outcome::InDoubt;
                        attempts.push(a);
                        return attempts;
                    }
                },
                Err(e) if sqlstate(&e) == Some("40P01") => {
                    a.outcome = Outcome::RolledBack;
                    attempts.push(a);
                    if let Err(e) = c.batch_execute("ROLLBACK") {
                        crashed(&e, "ROLLBACK");
                        return attempts;
                    }
                    continue;
                }
                Err(e) => {
                    crashed(&e, "a statement");
                    attempts.push(a);
                    return attempts;
                }
            }
            attempts.push(a);
            break;
        }
    }
}

/// Guarantee: with 8 sessions committing single claims, `idem_claim_many` batches, their
/// effects, outbox messages and versioned updates of 8 shared rows (synchronous_commit = on),
/// `pg_ctl stop -m immediate` and crash recovery keep exactly what committed:
/// - every transaction whose COMMIT returned is there: its claims, effects, outbox messages,
///   and the versions it wrote (or higher ones);
/// - no transaction whose COMMIT was never sent is there, nor one a deadlock rolled back;
/// - a transaction whose COMMIT was in flight is there wholly or not at all;
/// - the ledger holds exactly the claims the present transactions won, and each account the
///   highest version they wrote;
/// - amcheck finds the ledger, the outbox and the business tables intact;
/// - redelivering every message once more processes each exactly once overall: the claims that
///   answer true are exactly those of messages no present transaction won.
#[test]
#[ignore = "stops the server: run by tests/crash.sh, on a cluster of its own"]
fn immediate_stop_during_a_storm_keeps_exactly_what_committed() {
    let db = db();
    let stopping = AtomicBool::new(false);
    let commits = AtomicUsize::new(0);
    let started = Instant::now();
    let attempts: Vec<Attempt> = thread::scope(|s| {
        let (stopping, commits) = (&stopping, &commits);
        let handles: Vec<_> = (0..WORKERS).map(|w| s.spawn(move || storm_worker(db, w, stopping, commits))).collect();
        // Not common::wait_until: its panic would leave the scope joining workers that never end.
        let deadline = started + WAIT_LIMIT;
        while (started.elapsed() < STORM || commits.load(Ordering::SeqCst) < MIN_COMMITS) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        stopping.store(true, Ordering::SeqCst);
        server("CRASH_STOP");
        handles.into_iter().flat_map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    });
    let storm = started.elapsed();
    server("CRASH_START");
    let committed = commits.load(Ordering::SeqCst);
    assert!(committed >= MIN_COMMITS, "the storm committed only {committed} transactions in {storm:?}");

    let mut c = db.connect("crash-check");
    let stored = Stored::read(&mut c, POOL);
    let mut in_doubt = (0, 0);
    let mut present = Vec::new();
    for a in &attempts {
        let there = stored.present(a);
        match a.outcome {
            Outcome::Committed => assert!(there, "transaction {} committed but is gone", a.tx),
            Outcome::Lost | Outcome::RolledBack => {
                assert!(!there, "transaction {} never committed ({:?}) but is there", a.tx, a.outcome)
            }
            Outcome::InDoubt if there => in_doubt.0 += 1,
            Outcome::InDoubt => in_doubt.1 += 1,
        }
        if there {
            present.push(a);
        }
    }
    let won: BTreeSet<u64> = present.iter().flat_map(|a| a.won.iter().copied()).collect();
    assert_eq!(won.len(), present.iter().map(|a| a.won.len()).sum::<usize>(), "no key won twice");
    assert_same("the ledger against the claims the present transactions won", &stored.claimed, &won);
    assert_eq!(stored.ledger_rows, won.len() as i64, "no other ledger row");
    for a in attempts.iter().filter(|a| a.outcome == Outcome::Committed) {
        for k in &a.keys {
            assert!(stored.claimed.contains(k), "{} of committed transaction {} has no ledger row", key(*k), a.tx);
        }
    }
    stored.assert_versions(present.iter().copied());
    assert_intact(&mut c, &CHECKED);

    // Redelivery: every message of the storm once more, the committed ones too, in chunks that
    // alternate between single claims and a batch claim.
    let messages: BTreeSet<u64> = attempts.iter().flat_map(|a| a.keys.iter().copied()).collect();
    let in_order: Vec<u64> = messages.iter().copied().collect();
    let mut redelivered = Vec::new();
    for (i, chunk) in in_order.chunks(REDELIVERY_CHUNK).enumerate() {
        let mut a = Attempt::new(chunk.to_vec());
        a.commit(&mut c, i % 2 == 1);
        let expected: Vec<u64> = chunk.iter().copied().filter(|k| !won.contains(k)).collect();
        assert_eq!(a.won, expected, "redelivered transaction {}: new claims only for messages not processed", a.tx);
        redelivered.push(a);
    }
    let after = Stored::read(&mut c, POOL);
    assert_once_each("effects", &after.effects_by_key, &messages);
    assert_once_each("outbox messages", &after.outbox_by_key, &messages);
    assert_same("the ledger against the messages", &after.claimed, &messages);
    assert_eq!(after.ledger_rows, messages.len() as i64, "no other ledger row");
    after.assert_versions(present.into_iter().chain(&redelivered));
    assert_intact(&mut c, &CHECKED);

    let count = |outcome| attempts.iter().filter(|a| a.outcome == outcome).count();
    let new_on_redelivery: usize = redelivered.iter().map(|a| a.won.len()).sum();
    println!(
        "crash: {WORKERS} sessions for {:.1} s, then pg_ctl stop -m immediate and crash recovery:\n\
         crash:   transactions: {} committed, {} lost (COMMIT never sent), {} in doubt ({} present, {} absent), \
         {} rolled back by a deadlock and retried\n\
         crash:   messages: {} delivered in the storm, {} processed before the stop; {} redelivered, {} of them \
         processed then\n\
         crash:   effects: {} rows, one per message; duplicates suppressed: {} in committed storm transactions, \
         {} on redelivery",
        storm.as_secs_f64(),
        count(Outcome::Committed),
        count(Outcome::Lost),
        in_doubt.0 + in_doubt.1,
        in_doubt.0,
        in_doubt.1,
        count(Outcome::RolledBack),
        messages.len(),
        won.len(),
        redelivered.iter().map(|a| a.keys.len()).sum::<usize>(),
        new_on_redelivery,
        after.effects_by_key.values().sum::<i64>(),
        attempts.iter().filter(|a| a.outcome == Outcome::Committed).map(Attempt::duplicates).sum::<usize>(),
        redelivered.iter().map(Attempt::duplicates).sum::<usize>(),
    );
}
