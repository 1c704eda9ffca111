//! A claim that meets another transaction's uncommitted claim of the same key waits, and
//! the holder's fate decides the answer.

mod common;

use std::thread;

use common::{claim, join, ledger_rows, ok, test_db, wait_until_blocked, TestDb};

fn db() -> &'static TestDb {
    test_db("blocking", "")
}

/// How the first transaction ends.
#[derive(Clone, Copy, Debug)]
enum Fate {
    Commit,
    Rollback,
}

/// T1 claims `key` and keeps its transaction open; T2 claims the same key in its own
/// transaction and must block on T1 (checked in pg_stat_activity / pg_locks) until T1
/// ends with `fate`. Returns T2's answer after T2 committed.
fn second_claim_while_first_is_open(key: &str, fate: Fate) -> bool {
    let db = db();
    let mut t1 = db.session("blocking-t1");
    let mut t2 = db.session("blocking-t2");
    let mut observer = db.connect("blocking-observer");

    ok(t1.client.batch_execute("BEGIN"), "T1 BEGIN");
    assert!(ok(claim(&mut t1.client, key), "T1 claims"), "T1 is the first claim of {key}");

    let answer = thread::scope(|s| {
        let t2_client = &mut t2.client;
        let waiter = s.spawn(move || {
            ok(t2_client.batch_execute("BEGIN"), "T2 BEGIN");
            let answer = ok(claim(t2_client, key), "T2 claims");
            ok(t2_client.batch_execute("COMMIT"), "T2 COMMIT");
            answer
        });
        wait_until_blocked(&mut observer, t2.pid, t1.pid, || waiter.is_finished());
        match fate {
            Fate::Commit => ok(t1.client.batch_execute("COMMIT"), "T1 COMMIT"),
            Fate::Rollback => ok(t1.client.batch_execute("ROLLBACK"), "T1 ROLLBACK"),
        }
        join("T2's claim after T1 ended", waiter)
    });
    assert_eq!(ledger_rows(&mut observer, key), 1, "{key}: exactly one ledger row after T1 {fate:?} and T2 commit");
    answer
}

/// Duplicate source: a redelivery that arrives while the first delivery is still being
/// processed (its transaction is open), e.g. after a visibility timeout or a consumer
/// rebalance.
///
/// Guarantee: the redelivery neither processes the message too (true) nor is told it is a
/// duplicate before the first delivery is durable; it waits, and once the first delivery
/// commits it gets false. Fails if the claim does not wait (T2 returns before T1 ends) or
/// answers true next to a committed claim.
#[test]
fn blocked_claim_is_a_duplicate_when_the_holder_commits() {
    assert!(!second_claim_while_first_is_open("blocked-commit", Fate::Commit), "T1 committed, so T2 must get false");
}

/// Duplicate source: the same redelivery race, but the first delivery fails and rolls back.
///
/// Guarantee: a claim whose transaction rolled back does not count; the waiting delivery
/// becomes the one that processes the message (true), so the message is not lost. Fails if
/// the waiter is told "duplicate" on the strength of an uncommitted claim that never
/// became durable.
#[test]
fn blocked_claim_takes_over_when_the_holder_rolls_back() {
    assert!(
        second_claim_while_first_is_open("blocked-rollback", Fate::Rollback),
        "T1 rolled back, so T2 must get true"
    );
}
