//! Retention through real connections: the batched purge (`CALL idem_purge`) beside another
//! purge and beside live claims, a claim that meets a purge's uncommitted delete, its
//! progress in idempotency.purge_runs, and the late-replay guard as a client sees it.
//!
//! The purge works on the whole ledger, so the tests of this file take turns (a file-wide
//! lock) and each purge test starts from an empty ledger. "Expired" claims are made by
//! writing claimed_at in the past, which stands in for time passing; "fresh" claims are a
//! day old, well inside the default retention of undeclared scopes (7 days).

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;

use common::{
    bucket_ending_now, claim, config, connect_admin, count, describe, expect_sqlstate, join, ledger_rows, ok,
    sealed_after_bucket_pass, test_db, wait_until, wait_until_blocked, Barrier, TestDb,
};
use postgres::error::DbError;
use postgres::{Client, NoTls};

fn db() -> &'static TestDb {
    test_db("retention", "")
}

/// The purge deletes from the whole ledger, so no two tests of this file may overlap.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `CALL idem_purge(batch_blocks => n)` in autocommit; its INOUT `deleted`.
fn purge(c: &mut Client, batch_blocks: i32) -> Result<i64, postgres::Error> {
    let row = c.query_one("CALL idem_purge(batch_blocks => $1)", &[&batch_blocks])?;
    Ok(row.get::<_, Option<i64>>("deleted").expect("idem_purge's INOUT deleted is never NULL"))
}

/// An empty ledger and purge history, with the retention the fixtures assume.
fn empty_ledger(c: &mut Client) {
    ok(c.batch_execute("TRUNCATE idempotency.ledger, idempotency.purge_runs"), "TRUNCATE the ledger");
    let retention: String = ok(c.query_one("SELECT idem_default_retention()::text", &[]), "default retention").get(0);
    assert_eq!(retention, "7 days", "the fixtures assume idempotency.default_retention = 7 days");
}

/// An emptied ledger refilled with `rows` claims keyed `prefix || i`: every `fresh_every`-th
/// one a day old (inside the 7-day default retention), the others 30 days old (expired),
/// interleaved in the heap.
fn fill_interleaved(c: &mut postgres::Client, prefix: &str, rows: i64, fresh_every: i64) {
    empty_ledger(c);
    ok(
        c.execute(
            "INSERT INTO idempotency.ledger (key_digest, scope_id, claimed_at) \
             SELECT idem_digest($1 || i), idem_scope_id('default'), \
                    CASE WHEN i % $3 = 0 THEN now() - interval '1 day' ELSE now() - interval '30 days' END \
             FROM generate_series(1, $2::int8) AS i",
            &[&prefix, &rows, &fresh_every],
        ),
        "insert interleaved expired and fresh claims",
    );
}

/// Number of heap blocks of the ledger right now (what idem_purge will walk).
fn ledger_blocks(c: &mut Client) -> i64 {
    count(c, "SELECT pg_relation_size('idempotency.ledger') / current_setting('block_size')::int8")
}

/// One row of idempotency.purge_runs.
#[derive(Debug, PartialEq, Eq)]
struct Run {
    finished: bool,
    blocks: i64,
    blocks_done: i64,
    batches: i64,
    deleted: i64,
}

/// The purge runs of backend `pid`.
fn runs_of(c: &mut Client, pid: i32) -> Vec<Run> {
    ok(
        c.query(
            "SELECT finished_at IS NOT NULL, blocks, blocks_done, batches, deleted \
             FROM idempotency.purge_runs WHERE pid = $1 ORDER BY run_id",
            &[&pid],
        ),
        "read purge_runs",
    )
    .iter()
    .map(|r| Run { finished: r.get(0), blocks: r.get(1), blocks_done: r.get(2), batches: r.get(3), deleted: r.get(4) })
    .collect()
}

/// Duplicate source: none directly; this guards the ledger itself. Two purges overlap when
/// a pg_cron schedule fires while a manual purge (or a slow previous run) is still going.
///
/// Guarantee: two purges running at once over the same heap both finish without an error
/// (in particular no deadlock: they lock rows in the same heap order), every expired claim
/// is deleted exactly once (the two INOUT `deleted` add up to exactly the number of expired
/// claims), and no claim inside its retention is deleted. 200,000 expired and 50,000 fresh
/// claims are interleaved in the heap (every fifth row is fresh), and the purges use
/// 16-block batches so that they walk the heap side by side for many batches.
#[test]
fn two_purges_at_once_delete_every_expired_claim_exactly_once() {
    const EXPIRED: i64 = 200_000;
    const FRESH: i64 = 50_000;
    let _turn = one_at_a_time();
    let db = db();
    let mut setup = db.connect("retention-2purges-setup");
    fill_interleaved(&mut setup, "p1-", EXPIRED + FRESH, 5);
    let blocks = ledger_blocks(&mut setup);

    let mut purgers = [db.session("retention-purge-1"), db.session("retention-purge-2")];
    let barrier = Barrier::new(purgers.len());
    let deleted: Vec<i64> = thread::scope(|s| {
        let handles: Vec<_> = purgers
            .iter_mut()
            .enumerate()
            .map(|(n, p)| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    ok(purge(&mut p.client, 16), &format!("purge {} (16-block batches)", n + 1))
                })
            })
            .collect();
        handles.into_iter().enumerate().map(|(n, h)| join(&format!("purge {}", n + 1), h)).collect()
    });

    eprintln!("two purges at once: they deleted {deleted:?}");
    assert_eq!(
        deleted.iter().sum::<i64>(),
        EXPIRED,
        "the two purges together delete each of the {EXPIRED} expired claims exactly once; they reported {deleted:?}"
    );
    assert_eq!(count(&mut setup, "SELECT count(*) FROM idempotency.ledger"), FRESH, "exactly the fresh claims remain");
    assert_eq!(
        count(
            &mut setup,
            "SELECT count(*) FROM idempotency.ledger \
             WHERE claimed_at < now() - interval '7 days'"
        ),
        0,
        "no remaining claim is outside its retention"
    );
    assert_eq!(
        count(
            &mut setup,
            "SELECT count(*) FROM idempotency.ledger \
             WHERE key_digest IN (SELECT idem_digest('p1-' || i) FROM generate_series(5, 250000, 5) AS i)"
        ),
        FRESH,
        "each fresh claim is still there"
    );
    for (n, p) in purgers.iter().enumerate() {
        let runs = runs_of(&mut setup, p.pid);
        assert_eq!(
            runs,
            vec![Run { finished: true, blocks, blocks_done: blocks, batches: (blocks + 15) / 16, deleted: deleted[n] }],
            "purge {}'s run in idempotency.purge_runs: finished, every block walked, its own count",
            n + 1
        );
    }
}

/// What one claimer transaction answered for its expired key: (i of key 'p2-<i>', answer).
type ExpiredAnswer = (i64, bool);

/// Duplicate source: redeliveries and new messages arriving while the purge runs (it runs
/// every ten minutes under pg_cron, so claims are always going on beside it).
///
/// Guarantee: the purge and live claims do not get in each other's way. One session purges
/// 200,000 expired claims in 8-block batches while 4 sessions each run 2,000 transactions
/// that claim (a) a brand-new key: always true; (b) the key of a fresh claim (inside its
/// retention): always false, since the purge never deletes a claim inside its retention;
/// (c) the key of an expired claim: true or false depending on whether the purge had
/// deleted it, but never true twice, and afterwards the ledger holds a (fresh) row for the
/// key exactly when a claimer got true. No claimer sees any error (no deadlock, no
/// serialization failure at READ COMMITTED), the purge deletes exactly the 200,000
/// expired claims, and no expired claim is left.
///
/// Progress is checked deterministically: before the claimers start, a sixth session holds
/// a row lock on an expired claim in the purge's second batch (blocks 8..15), so the purge
/// is seen blocked there with its first batch committed: purge_runs shows the run
/// unfinished with blocks_done = 8 of `blocks`, 1 batch and exactly the expired claims of
/// blocks 0..7 deleted. The lock is released once every claimer has done 100 transactions.
#[test]
fn purge_beside_live_claims_and_its_progress() {
    const ROWS: i64 = 220_000; // every 11th fresh: 20,000 fresh, 200,000 expired
    const FRESH: i64 = 20_000;
    const EXPIRED: i64 = ROWS - FRESH;
    const BATCH: i32 = 8;
    const CLAIMERS: usize = 4;
    const TRANSACTIONS: usize = 2_000;
    const RELEASE_AFTER: usize = 100;
    let _turn = one_at_a_time();
    let db = db();
    let mut observer = db.connect("retention-live-observer");
    fill_interleaved(&mut observer, "p2-", ROWS, 11);
    let blocks = ledger_blocks(&mut observer);
    assert!(blocks > 2 * i64::from(BATCH), "the ledger spans more than two batches ({blocks} blocks)");
    let first_batch_expired = count(
        &mut observer,
        "SELECT count(*) FROM idempotency.ledger WHERE ctid < '(8,0)' AND claimed_at < now() - interval '7 days'",
    );

    // The sixth session: a row lock on an expired claim of the second batch.
    let mut locker = db.session("retention-live-locker");
    ok(locker.client.batch_execute("BEGIN"), "locker BEGIN");
    let locked: String = ok(
        locker.client.query_one(
            "SELECT l.ctid::text AS locked FROM idempotency.ledger AS l \
             WHERE l.ctid >= '(8,0)' AND l.ctid < '(16,0)' AND l.claimed_at < now() - interval '7 days' \
             ORDER BY l.ctid LIMIT 1 FOR UPDATE",
            &[],
        ),
        "lock an expired claim in blocks 8..15",
    )
    .get(0);
    assert!(locked.starts_with("(8,"), "the first expired claim of the second batch is in block 8, not {locked}");

    let mut purger = db.session("retention-live-purge");
    let purge_done = AtomicBool::new(false);
    let progressed = AtomicUsize::new(0); // claimers that did RELEASE_AFTER transactions
    let during_purge = AtomicUsize::new(0); // claimer transactions that ended while the purge ran
    let barrier = Barrier::new(CLAIMERS + 1);

    let (deleted, answers) = thread::scope(|s| {
        let purge_pid = purger.pid;
        let (purge_done, progressed, during_purge, barrier) = (&purge_done, &progressed, &during_purge, &barrier);
        let purge_client = &mut purger.client;
        let purge_thread = s.spawn(move || {
            let deleted = ok(purge(purge_client, BATCH), "the purge beside live claims");
            purge_done.store(true, Ordering::SeqCst);
            deleted
        });

        wait_until_blocked(&mut observer, purge_pid, locker.pid, || purge_thread.is_finished());
        let mut seen = None;
        wait_until("purge_runs to show the running purge part-way", || {
            let runs = runs_of(&mut observer, purge_pid);
            let part_way = runs.iter().any(|r| !r.finished && 0 < r.blocks_done && r.blocks_done < r.blocks);
            seen = Some(runs);
            part_way
        });
        assert_eq!(
            seen.unwrap(),
            vec![Run {
                finished: false,
                blocks,
                blocks_done: i64::from(BATCH),
                batches: 1,
                deleted: first_batch_expired
            }],
            "while blocked in its second batch (on the lock of {locked}), the purge's first batch is committed and visible"
        );

        let claimers: Vec<_> = (0..CLAIMERS)
            .map(|w| {
                s.spawn(move || {
                    let mut c = db.connect(&format!("retention-live-claimer-{w}"));
                    // Only so that 8,000 commits do not wait for 8,000 WAL flushes: durability
                    // is not under test, and locking and visibility are the same either way.
                    ok(c.batch_execute("SET synchronous_commit = off"), "claimer SET synchronous_commit");
                    barrier.wait();
                    let mut expired_answers: Vec<ExpiredAnswer> = Vec::with_capacity(TRANSACTIONS);
                    for j in 0..TRANSACTIONS {
                        let new_key = format!("p2-new-{w}-{j}");
                        let fresh_i = 11 * (1 + ((j * 7 + w * 13) as i64 % FRESH));
                        let fresh_key = format!("p2-{fresh_i}");
                        // The m-th expired claim (i not a multiple of 11); workers 0 and 2 (and 1
                        // and 3) claim the same expired keys, spread over the whole heap. They go
                        // from the end of the heap towards its start, against the purge: the first
                        // transactions (before the locker lets the purge go on) stay far from the
                        // second batch, whose claims the blocked purge holds deleted, and later the
                        // claimers meet the purge where it is deleting.
                        let m = EXPIRED - 1 - ((j as i64) * 100 + (w as i64 % 2) * 50) % EXPIRED;
                        let expired_i = 11 * (m / 10) + 1 + m % 10;
                        let expired_key = format!("p2-{expired_i}");
                        let what =
                            |kind: &str, key: &str| format!("claimer {w}, transaction {j}: claim of {kind} key {key}");

                        ok(c.batch_execute("BEGIN"), "claimer BEGIN");
                        assert!(
                            ok(claim(&mut c, &new_key), &what("new", &new_key)),
                            "{}: must be true",
                            what("new", &new_key)
                        );
                        assert!(
                            !ok(claim(&mut c, &fresh_key), &what("fresh", &fresh_key)),
                            "{}: must be false, the claim is inside its retention and must not have been purged",
                            what("fresh", &fresh_key)
                        );
                        let answer = ok(claim(&mut c, &expired_key), &what("expired", &expired_key));
                        ok(c.batch_execute("COMMIT"), "claimer COMMIT");
                        expired_answers.push((expired_i, answer));
                        if !purge_done.load(Ordering::SeqCst) {
                            during_purge.fetch_add(1, Ordering::SeqCst);
                        }
                        if j + 1 == RELEASE_AFTER {
                            progressed.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    expired_answers
                })
            })
            .collect();

        barrier.wait();
        wait_until("every claimer to have done its first transactions", || {
            progressed.load(Ordering::SeqCst) == CLAIMERS || claimers.iter().any(|h| h.is_finished())
        });
        assert!(
            !purge_thread.is_finished(),
            "the purge returned while the locker still held a row of its second batch"
        );
        ok(locker.client.batch_execute("COMMIT"), "locker COMMIT (releases the purge)");

        let answers: Vec<Vec<ExpiredAnswer>> =
            claimers.into_iter().enumerate().map(|(w, h)| join(&format!("claimer {w}"), h)).collect();
        (join("the purge", purge_thread), answers)
    });
    eprintln!(
        "purge beside live claims: {} of {} claimer transactions ended while the purge was running",
        during_purge.load(Ordering::SeqCst),
        CLAIMERS * TRANSACTIONS
    );

    assert_eq!(deleted, EXPIRED, "the purge deletes exactly the {EXPIRED} expired claims, once each");
    let mut trues_per_key = std::collections::BTreeMap::<i64, i64>::new();
    for (i, answer) in answers.iter().flatten() {
        *trues_per_key.entry(*i).or_default() += i64::from(*answer);
    }
    let twice: Vec<_> = trues_per_key.iter().filter(|(_, trues)| **trues > 1).collect();
    assert!(twice.is_empty(), "expired keys p2-<i> claimed anew (true) more than once, as (i, trues): {twice:?}");
    let (claimed_is, trues): (Vec<i64>, Vec<i64>) = trues_per_key.iter().map(|(i, t)| (*i, *t)).unzip();
    // Per expired key: the claims that got true, the ledger rows, and the fresh ones.
    let mismatched: Vec<(i64, i64, i64, i64)> = ok(
        observer.query(
            "SELECT k.i, k.trues, count(l.key_digest), count(l.key_digest) FILTER (WHERE l.claimed_at > now() - interval '1 hour') \
             FROM unnest($1::int8[], $2::int8[]) AS k(i, trues) \
             LEFT JOIN idempotency.ledger AS l ON l.key_digest = idem_digest('p2-' || k.i) \
             GROUP BY k.i, k.trues \
             HAVING count(l.key_digest) <> k.trues \
                 OR count(l.key_digest) FILTER (WHERE l.claimed_at > now() - interval '1 hour') <> k.trues \
             ORDER BY k.i",
            &[&claimed_is, &trues],
        ),
        "ledger rows of the expired keys claimed",
    )
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
    .collect();
    assert!(
        mismatched.is_empty(),
        "each expired key claimed must have a ledger row exactly when a claimer got true, and that row must be the new \
         claim (the old one is purged either way); mismatches as (i of p2-<i>, trues, rows, fresh rows): {mismatched:?}"
    );
    let claimed_anew: i64 = trues.iter().sum();
    assert_eq!(
        count(&mut observer, "SELECT count(*) FROM idempotency.ledger WHERE claimed_at < now() - interval '7 days'"),
        0,
        "no expired claim is left"
    );
    assert_eq!(
        count(&mut observer, "SELECT count(*) FROM idempotency.ledger"),
        FRESH + (CLAIMERS * TRANSACTIONS) as i64 + claimed_anew,
        "the ledger holds the fresh claims, the new keys and the expired keys claimed anew"
    );
    let runs = runs_of(&mut observer, purger.pid);
    assert_eq!(
        runs,
        vec![Run {
            finished: true,
            blocks,
            blocks_done: blocks,
            batches: (blocks + i64::from(BATCH) - 1) / i64::from(BATCH),
            deleted: EXPIRED
        }],
        "the finished run in purge_runs"
    );
}

/// How the transaction that deletes the expired claim ends.
#[derive(Clone, Copy, Debug)]
enum Fate {
    Commit,
    Rollback,
}

/// P deletes the expired claim of `key` the way a purge batch does and keeps its
/// transaction open; C claims `key` and must block on P until P ends with `fate`. Returns
/// C's answer and the age of the claim left for the key (whole days).
fn claim_beside_an_uncommitted_purge_delete(key: &str, fate: Fate) -> (bool, i64) {
    let db = db();
    let mut p = db.session("retention-wait-purge");
    let mut c = db.session("retention-wait-claim");
    let mut observer = db.connect("retention-wait-observer");
    ok(
        observer.execute(
            "INSERT INTO idempotency.ledger (key_digest, scope_id, claimed_at) \
             VALUES (idem_digest($1), idem_scope_id('default'), now() - interval '30 days')",
            &[&key],
        ),
        "an expired claim",
    );

    ok(p.client.batch_execute("BEGIN"), "P BEGIN");
    let gone = ok(
        p.client.execute(
            "DELETE FROM idempotency.ledger WHERE key_digest = idem_digest($1) AND claimed_at < now() - interval '7 days'",
            &[&key],
        ),
        "P deletes the expired claim",
    );
    assert_eq!(gone, 1, "P deletes the one expired claim of {key}");

    let answer = thread::scope(|s| {
        let c_client = &mut c.client;
        let claimer = s.spawn(move || ok(claim(c_client, key), "C claims the key"));
        wait_until_blocked(&mut observer, c.pid, p.pid, || claimer.is_finished());
        match fate {
            Fate::Commit => ok(p.client.batch_execute("COMMIT"), "P COMMIT"),
            Fate::Rollback => ok(p.client.batch_execute("ROLLBACK"), "P ROLLBACK"),
        }
        join("C's claim after P ended", claimer)
    });
    assert_eq!(ledger_rows(&mut observer, key), 1, "{key}: exactly one ledger row after P {fate:?}");
    let age: i64 = ok(
        observer.query_one(
            "SELECT extract(day FROM now() - claimed_at)::int8 FROM idempotency.ledger WHERE key_digest = idem_digest($1)",
            &[&key],
        ),
        "age of the claim",
    )
    .get(0);
    (answer, age)
}

/// Duplicate source: a message replayed (from a DLQ, by hand) long after its first
/// delivery, arriving exactly while the purge deletes the old claim of its key.
///
/// Guarantee: the claim waits for the purge's batch instead of answering on the strength
/// of a row that is being deleted; once the delete commits, the old claim is gone and the
/// message is claimed anew (true, with a fresh claim in the ledger). Fails if the claim
/// does not block, answers false next to a committed delete, or errors.
#[test]
fn claim_waiting_on_a_purge_delete_claims_anew_when_it_commits() {
    let _turn = one_at_a_time();
    let (answer, age) = claim_beside_an_uncommitted_purge_delete("p3-exp-commit", Fate::Commit);
    assert!(answer, "the delete committed, so the old claim is gone and the claim is new");
    assert_eq!(age, 0, "the row left is the new claim");
}

/// Duplicate source: the same replay racing the purge, when the purge's batch fails and
/// rolls back (cancelled, or the server restarted).
///
/// Guarantee: the claim waits, and since the old claim survives it is a duplicate (false),
/// and the old claim stays as it was. Fails if the claim does not block or answers true
/// (processing the message a second time) while the old claim still exists.
#[test]
fn claim_waiting_on_a_purge_delete_is_a_duplicate_when_it_rolls_back() {
    let _turn = one_at_a_time();
    let (answer, age) = claim_beside_an_uncommitted_purge_delete("p3-exp-rollback", Fate::Rollback);
    assert!(!answer, "the delete rolled back, so the old claim stands and this is a duplicate");
    assert_eq!(age, 30, "the row left is the old claim, untouched");
}

/// Duplicate source: as above, with the real purge: `CALL idem_purge(batch_blocks => 1)`
/// deletes the expired claim of 'p3-target' at (0,1), then waits in the same batch for a
/// row lock another session holds on the expired claim at (0,2).
///
/// Guarantee: a claim of 'p3-target' then waits for the purge's batch (it is blocked by
/// the purge's backend); when the batch commits the claim is new (true); the purge deletes
/// both expired claims and the ledger keeps only the new claim. Fails if the claim answers
/// before the batch ends, answers false, or either side errors or deadlocks.
#[test]
fn claim_waits_for_the_purge_batch_that_deletes_its_old_claim() {
    let _turn = one_at_a_time();
    let db = db();
    let mut observer = db.connect("retention-batch-observer");
    empty_ledger(&mut observer);
    ok(
        observer.batch_execute(
            "INSERT INTO idempotency.ledger (key_digest, scope_id, claimed_at) \
             SELECT idem_digest(k), idem_scope_id('default'), now() - interval '30 days' \
             FROM unnest(ARRAY['p3-target', 'p3-blocker']) WITH ORDINALITY AS u(k, n) ORDER BY n",
        ),
        "two expired claims",
    );
    let layout: Vec<String> = ok(
        observer.query(
            "SELECT ctid::text FROM idempotency.ledger WHERE key_digest IN (idem_digest('p3-target'), idem_digest('p3-blocker')) \
             ORDER BY key_digest = idem_digest('p3-blocker')",
            &[],
        ),
        "heap layout",
    )
    .iter()
    .map(|r| r.get(0))
    .collect();
    assert_eq!(layout, ["(0,1)", "(0,2)"], "p3-target is scanned before p3-blocker, both in block 0");

    let mut locker = db.session("retention-batch-locker");
    let mut purger = db.session("retention-batch-purge");
    let mut claimer = db.session("retention-batch-claim");
    ok(locker.client.batch_execute("BEGIN"), "locker BEGIN");
    ok(
        locker
            .client
            .execute("SELECT FROM idempotency.ledger WHERE key_digest = idem_digest('p3-blocker') FOR UPDATE", &[]),
        "lock p3-blocker",
    );

    let (deleted, answer) = thread::scope(|s| {
        let purge_client = &mut purger.client;
        let purge_thread = s.spawn(move || ok(purge(purge_client, 1), "the purge"));
        wait_until_blocked(&mut observer, purger.pid, locker.pid, || purge_thread.is_finished());

        let claim_client = &mut claimer.client;
        let claim_thread = s.spawn(move || ok(claim(claim_client, "p3-target"), "claim of p3-target"));
        wait_until_blocked(&mut observer, claimer.pid, purger.pid, || claim_thread.is_finished());

        ok(locker.client.batch_execute("COMMIT"), "locker COMMIT");
        (join("the purge", purge_thread), join("the claim", claim_thread))
    });
    assert!(answer, "the purge's batch deleted the old claim, so the waiting claim is new");
    assert_eq!(deleted, 2, "the purge deletes both expired claims");
    assert_eq!(count(&mut observer, "SELECT count(*) FROM idempotency.ledger"), 1, "only the new claim is left");
    assert_eq!(
        count(
            &mut observer,
            "SELECT count(*) FROM idempotency.ledger WHERE key_digest = idem_digest('p3-target') \
             AND claimed_at > now() - interval '1 hour'"
        ),
        1,
        "the row left is the new claim of p3-target"
    );
}

/// A connection to the test database whose notices (and warnings) are collected.
fn connect_collecting_notices(dbname: &str) -> (Client, Arc<Mutex<Vec<DbError>>>) {
    let notices = Arc::new(Mutex::new(Vec::new()));
    let mut config = config(dbname, "retention-late-client");
    let sink = Arc::clone(&notices);
    config.notice_callback(move |notice| sink.lock().unwrap_or_else(|p| p.into_inner()).push(notice));
    let client = config.connect(NoTls).unwrap_or_else(|e| panic!("connect to {dbname}: {}", describe(&e)));
    (client, notices)
}

fn claim_sent_at(c: &mut Client, key: &str, scope: &str, age: &str) -> Result<bool, postgres::Error> {
    let row = c.query_one("SELECT idem_claim($1, $2, NULL, now() - $3::text::interval)", &[&key, &scope, &age])?;
    Ok(row.get::<_, Option<bool>>(0).expect("idem_claim never returns NULL"))
}

fn rows_in_scope(c: &mut Client, key: &str, scope: &str) -> i64 {
    ok(
        c.query_one("SELECT count(*) FROM idempotency.ledger WHERE key_digest = idem_digest($1, $2)", &[&key, &scope]),
        "ledger rows",
    )
    .get(0)
}

/// Duplicate source: a message replayed after its scope's retention (a DLQ drained weeks
/// later): the claim of its first delivery may already have been purged, so a "new" claim
/// cannot be trusted.
///
/// Guarantee, as a client sees it: in a scope declared with a 1-day broker retention (2
/// days of retention with the default 1-day buffer), a new claim of a message sent 3 days
/// ago fails with SQLSTATE ID004 and leaves no claim behind; once
/// the scope is redeclared with late_replay => 'warn', the same claim succeeds (true) and
/// the client receives exactly one WARNING with SQLSTATE ID004, and the claim is stored.
/// A message sent inside the retention is claimed without any notice.
#[test]
fn late_replay_is_an_error_or_a_warning_with_id004() {
    let _turn = one_at_a_time();
    let db = db();
    let (mut c, notices) = connect_collecting_notices(&db.name);
    ok(c.query_one("SELECT idem_declare_scope('late', '1 day')", &[]), "declare scope late (error)");

    let e = expect_sqlstate(claim_sent_at(&mut c, "late-k", "late", "3 days"), "ID004", "late replay in scope late");
    let db_error = e.as_db_error().expect("a server error");
    assert_eq!(db_error.severity(), "ERROR", "{}", describe(&e));
    assert_eq!(rows_in_scope(&mut c, "late-k", "late"), 0, "the refused claim leaves no row");

    assert_eq!(
        ok(
            c.query_one("SELECT retention::text FROM idempotency.scopes WHERE scope = 'late'", &[]),
            "retention of late"
        )
        .get::<_, String>(0),
        "2 days",
        "1 day of broker retention plus the default buffer of 1 day"
    );
    assert!(
        ok(claim_sent_at(&mut c, "late-ok", "late", "36 hours"), "in-retention claim"),
        "a message inside retention is new"
    );
    assert!(notices.lock().unwrap().is_empty(), "no notice so far: {:?}", notices.lock().unwrap());

    ok(
        c.query_one("SELECT idem_declare_scope('late', '1 day', late_replay => 'warn')", &[]),
        "redeclare scope late (warn)",
    );
    let answer = ok(claim_sent_at(&mut c, "late-k", "late", "3 days"), "late replay in scope late (warn)");
    assert!(answer, "with late_replay => 'warn' the late message is claimed");
    let seen: Vec<(String, String, String)> = notices
        .lock()
        .unwrap()
        .iter()
        .map(|n| (n.severity().to_string(), n.code().code().to_string(), n.message().to_string()))
        .collect();
    assert_eq!(seen.len(), 1, "exactly one notice for the late claim: {seen:?}");
    assert_eq!((seen[0].0.as_str(), seen[0].1.as_str()), ("WARNING", "ID004"), "the notice: {seen:?}");
    assert!(seen[0].2.contains("\"late\""), "the warning names the scope: {seen:?}");
    assert_eq!(rows_in_scope(&mut c, "late-k", "late"), 1, "the warned claim is stored");
}

/// A bucket is sealed once no transaction that could still claim into it is running: one of
/// the ledger's own database that began before the bucket ended holds the seal back; one of
/// another database (a long report, a VACUUM elsewhere) never claims here and does not.
#[test]
fn only_this_databases_older_transactions_hold_back_a_seal() {
    let _turn = one_at_a_time();
    let mut c = db().connect("retention-sealer");
    empty_ledger(&mut c);
    let mut here = db().connect("retention-older-here");
    let mut elsewhere = connect_admin("retention-older-elsewhere");
    ok(here.batch_execute("BEGIN; SELECT 1"), "a transaction here, begun before the bucket ends");
    ok(elsewhere.batch_execute("BEGIN; SELECT 1"), "a transaction in another database, begun before it ends");
    bucket_ending_now(&mut c, "ledger_seal_test", None);
    let sealed = |c: &mut Client| sealed_after_bucket_pass(c, "ledger_seal_test");
    assert_eq!(sealed(&mut c), 0, "this database's older transaction may still claim into the bucket");
    ok(here.batch_execute("COMMIT"), "the transaction here ends");
    assert_eq!(sealed(&mut c), 1, "only another database's older transaction is left, which cannot claim here");
    ok(elsewhere.batch_execute("COMMIT"), "the transaction elsewhere ends");
    // The purge made the lanes' buckets too, beside the test's.
    drop_buckets(&mut c);
}

/// Leaves the ledger without buckets for the tests after this one: the purge makes them for
/// every lane once it has made any.
fn drop_buckets(c: &mut Client) {
    ok(
        c.batch_execute(
            "DO $$ DECLARE b record; BEGIN \
               FOR b IN SELECT x.bucket FROM idempotency.ledger_buckets AS x LOOP \
                 EXECUTE format('DROP TABLE idempotency.%I', b.bucket); \
               END LOOP; END $$; \
             DELETE FROM idempotency.ledger_buckets; SELECT idempotency.ledger_layout_changed()",
        ),
        "drop the buckets",
    );
    assert_eq!(
        count(c, "SELECT count(*) FROM pg_inherits WHERE inhparent = 'idempotency.ledger'::regclass"),
        0,
        "the ledger has no children left for the tests after this one"
    );
}

/// Once the purge has moved every claim of the ledger itself into buckets, it gives the
/// ledger's key index back its space (a btree keeps every page it ever had) by truncating the
/// ledger. TRUNCATE is not MVCC-safe: a repeatable-read transaction whose snapshot predates
/// the move would then see the moved claims neither in the ledger (emptied by the truncation)
/// nor in their buckets (filled after its snapshot). So the ledger is truncated only once it
/// holds no row version at all, dead ones included (VACUUM removed them, which it does only
/// when no snapshot can see them any more), and then the reader sees every claim throughout.
#[test]
fn a_snapshot_older_than_the_move_still_sees_every_claim() {
    moved_claims_stay_visible(true);
}

/// The same where VACUUM leaves the emptied blocks in place (`vacuum_truncate = off`, or claims
/// that never let it lock the ledger for a moment): the ledger is truncated all the same once
/// no row version is left in it, and not before.
#[test]
fn the_ledger_is_given_back_where_vacuum_keeps_its_blocks() {
    moved_claims_stay_visible(false);
}

/// `claims` fresh claims keyed `prefix || i` in the ledger itself: at 400,000 its key index is
/// over the 8 MB from which the purge gives it back.
fn fill_fresh(c: &mut Client, prefix: &str, claims: i64) {
    ok(
        c.execute(
            "INSERT INTO idempotency.ledger (key_digest, scope_id, claimed_at) \
             SELECT idem_digest($1 || i), idem_scope_id('default'), now() - interval '1 day' \
             FROM generate_series(1, $2::int8) AS i",
            &[&prefix, &claims],
        ),
        "fresh claims in the ledger itself",
    );
}

/// VACUUM of the ledger until it leaves no row version there; another snapshot (an
/// autoanalyze's, say) may still hold it back for a moment.
fn vacuum_until_no_row_version(c: &mut Client) {
    wait_until("VACUUM removes every version of the moved claims", || {
        ok(c.batch_execute("VACUUM idempotency.ledger"), "VACUUM removes the moved claims' dead versions");
        ok(c.query_one("SELECT idempotency.ledger_holds_no_row_version()", &[]), "ask the ledger").get(0)
    });
}

/// A scan marks the index entries of rows that are dead by this server's horizon, without
/// VACUUM and without a word to a standby, whose snapshot this server may not know of and may
/// still see those rows: only VACUUM's records cancel its queries. So entries marked dead are
/// still entries, and the ledger is truncated only once VACUUM went over it.
#[test]
fn entries_a_scan_marked_dead_do_not_truncate_the_ledger() {
    const CLAIMS: i64 = 400_000;
    let _turn = one_at_a_time();
    let mut c = db().connect("retention-truncate-marked");
    empty_ledger(&mut c);
    ok(c.batch_execute("ALTER TABLE idempotency.ledger SET (autovacuum_enabled = off)"), "only the test's VACUUM runs");
    fill_fresh(&mut c, "m-", CLAIMS);
    ok(c.batch_execute("SET idempotency.ledger_buckets_from = 0"), "buckets from the next purge on");
    ok(purge(&mut c, 1024), "the purge that moves the claims into buckets");
    ok(
        c.batch_execute(
            "SET enable_seqscan = off; SET enable_bitmapscan = off; SET enable_indexonlyscan = off; \
             SELECT count(*) FROM ONLY idempotency.ledger WHERE key_digest IS NOT NULL; \
             RESET enable_seqscan; RESET enable_bitmapscan; RESET enable_indexonlyscan",
        ),
        "an index scan that marks the moved claims' entries dead",
    );
    let index_size = "SELECT pg_relation_size('idempotency.ledger_pkey')";
    ok(purge(&mut c, 1024), "a purge before VACUUM");
    assert!(count(&mut c, index_size) > 8 << 20, "the ledger is not truncated before VACUUM went over it");
    vacuum_until_no_row_version(&mut c);
    ok(purge(&mut c, 1024), "a purge after VACUUM");
    assert!(count(&mut c, index_size) <= 16 << 10, "the ledger's key index gave its pages back");
    assert_eq!(count(&mut c, "SELECT count(*) FROM idempotency.ledger"), CLAIMS, "every claim is still there");
    ok(c.batch_execute("ALTER TABLE idempotency.ledger RESET (autovacuum_enabled)"), "autovacuum again");
    drop_buckets(&mut c);
}

fn moved_claims_stay_visible(vacuum_truncate: bool) {
    const CLAIMS: i64 = 400_000;
    let _turn = one_at_a_time();
    let mut c = db().connect("retention-truncate-purger");
    empty_ledger(&mut c);
    ok(
        c.batch_execute(&format!(
            "ALTER TABLE idempotency.ledger SET (vacuum_truncate = {vacuum_truncate}, autovacuum_enabled = off)"
        )),
        "whether VACUUM cuts the ledger's empty blocks off; only the test's own VACUUM runs",
    );
    fill_fresh(&mut c, "t-", CLAIMS);
    let index_size = "SELECT pg_relation_size('idempotency.ledger_pkey')";
    assert!(count(&mut c, index_size) > 8 << 20, "the ledger's key index is big enough to be given back");
    let mut reader = db().connect("retention-truncate-reader");
    ok(
        reader.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1"),
        "a snapshot taken before the move, which has not touched the ledger yet",
    );
    ok(c.batch_execute("SET idempotency.ledger_buckets_from = 0"), "buckets from the next purge on");
    ok(purge(&mut c, 1024), "the purge that makes buckets and moves the claims into them");
    assert_eq!(count(&mut c, "SELECT count(*) FROM ONLY idempotency.ledger"), 0, "every claim moved");
    let heap_size = "SELECT pg_relation_size('idempotency.ledger')";
    ok(c.batch_execute("VACUUM idempotency.ledger"), "VACUUM while the older snapshot may still see the moved claims");
    assert!(count(&mut c, heap_size) > 0, "VACUUM kept the versions the older snapshot sees");
    ok(purge(&mut c, 1024), "a purge that finds the ledger itself empty");
    assert!(count(&mut c, index_size) > 8 << 20, "the ledger is not truncated while the older snapshot is open");
    let everything = "SELECT count(*) FROM idempotency.ledger";
    assert_eq!(count(&mut reader, everything), CLAIMS, "the older snapshot still sees every claim");
    assert_eq!(
        count(&mut reader, "SELECT count(*) FROM idempotency.ledger WHERE key_digest = idem_digest('t-7')"),
        1,
        "the older snapshot finds a moved key by its digest"
    );
    ok(reader.batch_execute("COMMIT"), "the older snapshot ends");
    vacuum_until_no_row_version(&mut c);
    assert_eq!(count(&mut c, heap_size) == 0, vacuum_truncate, "VACUUM cut the emptied blocks off as told");
    ok(
        c.batch_execute(
            "BEGIN; DECLARE open_ledger CURSOR FOR SELECT * FROM idempotency.ledger; FETCH open_ledger; \
             SELECT idempotency.maintain_ledger_buckets(); COMMIT",
        ),
        "the bucket pass beside this session's own cursor on the ledger, which TRUNCATE refuses (55006)",
    );
    assert!(count(&mut c, index_size) > 8 << 20, "the ledger stays as it is while a cursor of the session reads it");
    ok(purge(&mut c, 1024), "a purge that finds the ledger without any row version");
    assert!(count(&mut c, index_size) <= 16 << 10, "the ledger's key index gave its pages back");
    assert_eq!(count(&mut c, heap_size), 0, "and so did the ledger");
    assert_eq!(count(&mut c, everything), CLAIMS, "every claim is still there");
    assert!(!ok(claim(&mut c, "t-7"), "claim a moved key again"), "a moved key is still a duplicate");
    ok(
        c.batch_execute("ALTER TABLE idempotency.ledger RESET (vacuum_truncate, autovacuum_enabled)"),
        "VACUUM's own defaults again",
    );
    drop_buckets(&mut c);
}
