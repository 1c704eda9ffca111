//! idem_claim_many: concurrent batches that overlap, in different orders.

mod common;

use std::collections::HashMap;
use std::thread;

use common::{claim_many, describe, join, ok, sqlstate, test_db, wait_until_blocked, Barrier, TestDb};

fn db() -> &'static TestDb {
    test_db("batch", "")
}

const WORKERS: usize = 8;
const KEYS: usize = 200;
/// Each batch repeats the first few keys of its own order at its end: those positions are
/// never "first occurrence in the batch" and must always be false.
const REPEATS: usize = 10;
const ROUNDS: usize = 5;

/// Worker `w`'s order of the keys: rotated by w * KEYS / WORKERS and reversed for odd w, so
/// every pair of batches meets the shared keys in a different order (and half of them in
/// opposite orders), then the first REPEATS keys of that order again.
fn batch_for(worker: usize, keys: &[String]) -> Vec<String> {
    let mut order: Vec<String> = keys.to_vec();
    order.rotate_left(worker * KEYS / WORKERS);
    if worker % 2 == 1 {
        order.reverse();
    }
    let repeats: Vec<String> = order[..REPEATS].to_vec();
    order.extend(repeats);
    order
}

/// Duplicate source: a consumer that takes messages in batches, with several consumers
/// receiving overlapping batches (redeliveries mixed with new messages) in different orders.
///
/// Guarantees: (1) no deadlock: 8 transactions, started together at a barrier, each claim
/// the same 200 keys in a different order and none fails (a batch that inserted in its
/// array order would meet a reversed batch half-way and one of them would get 40P01);
/// (2) across all batches every key is claimed (true) exactly once, and the repeated
/// positions inside a batch are always false; (3) the ledger holds exactly 200 rows for the
/// scope; (4) a later batch of the same keys gets only false. Repeated over 5 rounds, each
/// in its own scope.
#[test]
fn overlapping_batches_in_different_orders_claim_each_key_once_without_deadlock() {
    let db = db();
    let keys: Vec<String> = (0..KEYS).map(|i| format!("batch-key-{i:03}")).collect();
    let scopes: Vec<String> = (0..ROUNDS).map(|r| format!("batch-round-{r}")).collect();
    let barrier = Barrier::new(WORKERS);

    // answers[worker][round] = (the batch sent, the answer per position)
    let answers: Vec<Vec<(Vec<String>, Vec<bool>)>> = thread::scope(|s| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|worker| {
                let (keys, scopes, barrier) = (&keys, &scopes, &barrier);
                s.spawn(move || {
                    let mut c = db.connect(&format!("batch-worker-{worker}"));
                    let batch = batch_for(worker, keys);
                    scopes
                        .iter()
                        .map(|scope| {
                            ok(c.batch_execute("BEGIN"), "BEGIN");
                            barrier.wait();
                            let answer = claim_many(&mut c, &batch, scope).unwrap_or_else(|e| {
                                panic!(
                                    "worker {worker}, {scope}: idem_claim_many failed{}: {}",
                                    if sqlstate(&e) == Some("40P01") { " with a DEADLOCK" } else { "" },
                                    describe(&e)
                                )
                            });
                            ok(c.batch_execute("COMMIT"), "COMMIT");
                            (batch.clone(), answer)
                        })
                        .collect()
                })
            })
            .collect();
        workers.into_iter().enumerate().map(|(w, h)| join(&format!("batch worker {w}"), h)).collect()
    });

    let mut check = db.connect("batch-check");
    for (round, scope) in scopes.iter().enumerate() {
        let mut winners: HashMap<&str, Vec<usize>> = HashMap::new();
        for (worker, per_round) in answers.iter().enumerate() {
            let (batch, answer) = &per_round[round];
            assert_eq!(answer.len(), batch.len(), "one answer per array element");
            for (i, key) in batch.iter().enumerate() {
                if i >= KEYS {
                    assert!(!answer[i], "{scope}, worker {worker}: position {} repeats {key} and must be false", i + 1);
                } else if answer[i] {
                    winners.entry(key.as_str()).or_default().push(worker);
                }
            }
        }
        for key in &keys {
            let won_by = winners.get(key.as_str()).cloned().unwrap_or_default();
            assert_eq!(won_by.len(), 1, "{scope}: {key} must be claimed by exactly one batch, claimed by {won_by:?}");
        }
        let rows: i64 = check
            .query_one("SELECT count(*) FROM idempotency.ledger WHERE scope_id = idem_scope_id($1)", &[scope])
            .unwrap()
            .get(0);
        assert_eq!(rows, KEYS as i64, "{scope}: one ledger row per key");

        let again = ok(claim_many(&mut check, &keys, scope), "a later batch of the same keys");
        assert!(again.iter().all(|&a| !a), "{scope}: every key is already claimed, so every answer is false");
    }
}

/// Duplicate source: a batch that contains a message whose single delivery is still being
/// processed by another consumer (claimed with idem_claim, not yet committed).
///
/// Guarantee: the batch waits for that transaction (checked in pg_stat_activity /
/// pg_locks), then answers that element from the holder's fate: false if it committed,
/// true if it rolled back; the other elements are true either way. Fails if the batch
/// answers before the holder ends, or answers true next to a committed claim.
#[test]
fn batch_waits_for_an_uncommitted_claim_and_follows_its_fate() {
    let db = db();
    for commit in [true, false] {
        let scope = if commit { "batch-holder-commits" } else { "batch-holder-rolls-back" };
        let keys: Vec<String> = ["a", "held", "z"].iter().map(|k| k.to_string()).collect();
        let mut t1 = db.session("batch-holder");
        let mut t2 = db.session("batch-t2");
        let mut observer = db.connect("batch-observer");
        ok(t1.client.batch_execute("BEGIN"), "T1 BEGIN");
        let first: bool = ok(t1.client.query_one("SELECT idem_claim('held', $1)", &[&scope]), "T1 claims").get(0);
        assert!(first, "T1 is the first claim of 'held'");

        let answer = thread::scope(|s| {
            let (t2_client, keys) = (&mut t2.client, &keys);
            let waiter = s.spawn(move || {
                ok(t2_client.batch_execute("BEGIN"), "T2 BEGIN");
                let answer = ok(claim_many(t2_client, keys, scope), "T2's batch");
                ok(t2_client.batch_execute("COMMIT"), "T2 COMMIT");
                answer
            });
            wait_until_blocked(&mut observer, t2.pid, t1.pid, || waiter.is_finished());
            ok(t1.client.batch_execute(if commit { "COMMIT" } else { "ROLLBACK" }), "T1 ends");
            join("T2's batch", waiter)
        });
        assert_eq!(answer, vec![true, !commit, true], "{scope}: the held element follows T1's fate");
        let rows: i64 = observer
            .query_one("SELECT count(*) FROM idempotency.ledger WHERE scope_id = idem_scope_id($1)", &[&scope])
            .unwrap()
            .get(0);
        assert_eq!(rows, 3, "{scope}: one ledger row per key");
    }
}
