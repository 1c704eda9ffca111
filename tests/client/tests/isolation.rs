//! Claims under REPEATABLE READ and SERIALIZABLE: a claim committed after the claimer took
//! its snapshot is a serialization failure (40001), never a silent true or false, and the
//! retry in a new transaction sees the duplicate.

mod common;

use std::thread;

use common::{
    claim, claim_nowait, expect_sqlstate, join, ledger_rows, ok, test_db, wait_until_blocked, Session, TestDb,
};

fn db() -> &'static TestDb {
    test_db("isolation", "")
}

#[derive(Clone, Copy, Debug)]
enum Level {
    RepeatableRead,
    Serializable,
}

impl Level {
    fn begin(self) -> &'static str {
        match self {
            Level::RepeatableRead => "BEGIN ISOLATION LEVEL REPEATABLE READ",
            Level::Serializable => "BEGIN ISOLATION LEVEL SERIALIZABLE",
        }
    }
    fn tag(self) -> &'static str {
        match self {
            Level::RepeatableRead => "rr",
            Level::Serializable => "ser",
        }
    }
}

/// Starts T2's transaction at `level` and takes its snapshot.
fn begin_with_snapshot(t2: &mut Session, level: Level) {
    ok(t2.client.batch_execute(level.begin()), "T2 BEGIN");
    ok(t2.client.query_one("SELECT 1", &[]), "T2 takes its snapshot");
}

/// The retry a consumer makes after 40001: a new transaction at the same level, whose
/// snapshot includes T1's commit, sees the duplicate.
fn retry_is_duplicate(t2: &mut Session, level: Level, key: &str) {
    ok(t2.client.batch_execute("ROLLBACK"), "T2 ROLLBACK after 40001");
    begin_with_snapshot(t2, level);
    assert!(!ok(claim(&mut t2.client, key), "T2's retry"), "{level:?}: the retry of {key} must be a duplicate");
    ok(t2.client.batch_execute("COMMIT"), "T2 COMMIT");
    assert_eq!(ledger_rows(&mut t2.client, key), 1);
}

/// T2 takes its snapshot, then T1 claims `key` and commits, then T2 claims it (with
/// idem_claim, or idem_claim_nowait if `nowait`).
fn claim_committed_after_snapshot(level: Level, nowait: bool) {
    let key = format!("iso-after-snapshot-{}-{}", level.tag(), if nowait { "nowait" } else { "wait" });
    let mut t1 = db().session("iso-t1");
    let mut t2 = db().session("iso-t2");
    begin_with_snapshot(&mut t2, level);

    ok(t1.client.batch_execute("BEGIN"), "T1 BEGIN");
    assert!(ok(claim(&mut t1.client, &key), "T1 claims"));
    ok(t1.client.batch_execute("COMMIT"), "T1 COMMIT");

    let answer = if nowait { claim_nowait(&mut t2.client, &key) } else { claim(&mut t2.client, &key) };
    expect_sqlstate(answer, "40001", &format!("{level:?}: T2 claims {key}, committed after its snapshot"));
    retry_is_duplicate(&mut t2, level, &key);
}

/// T1 claims `key` and keeps its transaction open; T2 (snapshot taken) claims it and must
/// block on T1; then T1 commits or rolls back. Returns T2's result, T2 still in its
/// transaction.
fn claim_blocked_on_open_claim(level: Level, key: &str, commit: bool) -> (Session, Result<bool, postgres::Error>) {
    let mut t1 = db().session("iso-t1");
    let mut t2 = db().session("iso-t2");
    let mut observer = db().connect("iso-observer");
    begin_with_snapshot(&mut t2, level);
    ok(t1.client.batch_execute("BEGIN"), "T1 BEGIN");
    assert!(ok(claim(&mut t1.client, key), "T1 claims"));

    let answer = thread::scope(|s| {
        let t2_client = &mut t2.client;
        let waiter = s.spawn(move || claim(t2_client, key));
        wait_until_blocked(&mut observer, t2.pid, t1.pid, || waiter.is_finished());
        ok(t1.client.batch_execute(if commit { "COMMIT" } else { "ROLLBACK" }), "T1 ends");
        join("T2's blocked claim", waiter)
    });
    (t2, answer)
}

fn blocked_claim_then_holder_commits(level: Level) {
    let key = format!("iso-blocked-commit-{}", level.tag());
    let (mut t2, answer) = claim_blocked_on_open_claim(level, &key, true);
    expect_sqlstate(answer, "40001", &format!("{level:?}: T2 was blocked on T1, T1 committed"));
    retry_is_duplicate(&mut t2, level, &key);
}

fn blocked_claim_then_holder_rolls_back(level: Level) {
    let key = format!("iso-blocked-rollback-{}", level.tag());
    let (mut t2, answer) = claim_blocked_on_open_claim(level, &key, false);
    let answer = ok(answer, &format!("{level:?}: T2 was blocked on T1, T1 rolled back"));
    assert!(answer, "{level:?}: T1 rolled back, so T2's claim of {key} is the first");
    ok(t2.client.batch_execute("COMMIT"), "T2 COMMIT");
    assert_eq!(ledger_rows(&mut t2.client, &key), 1);
}

/// Duplicate source: a redelivery processed in a REPEATABLE READ transaction whose snapshot
/// predates the first delivery's commit.
///
/// Guarantee: the claim raises 40001 instead of answering from a stale snapshot (true would
/// process the message twice; false would let the transaction act on data that does not
/// show the first delivery's effects). The retry in a new transaction returns false.
#[test]
fn repeatable_read_claim_committed_after_snapshot_is_40001() {
    claim_committed_after_snapshot(Level::RepeatableRead, false);
}

/// As above, under SERIALIZABLE.
#[test]
fn serializable_claim_committed_after_snapshot_is_40001() {
    claim_committed_after_snapshot(Level::Serializable, false);
}

/// As above, with idem_claim_nowait: the committed-after-snapshot conflict is 40001, not
/// 55P03 (nothing is being waited for) and not an answer.
#[test]
fn repeatable_read_nowait_claim_committed_after_snapshot_is_40001() {
    claim_committed_after_snapshot(Level::RepeatableRead, true);
}

/// As above, with idem_claim_nowait under SERIALIZABLE.
#[test]
fn serializable_nowait_claim_committed_after_snapshot_is_40001() {
    claim_committed_after_snapshot(Level::Serializable, true);
}

/// Duplicate source: a redelivery in a REPEATABLE READ transaction that reaches the claim
/// while the first delivery is still open, which then commits.
///
/// Guarantee: the waiting claim ends in 40001 (its snapshot cannot see the winner), and the
/// retry returns false. Fails if it returns true (double processing) or false from a
/// snapshot that does not contain the first delivery.
#[test]
fn repeatable_read_blocked_claim_is_40001_when_holder_commits() {
    blocked_claim_then_holder_commits(Level::RepeatableRead);
}

/// As above, under SERIALIZABLE.
#[test]
fn serializable_blocked_claim_is_40001_when_holder_commits() {
    blocked_claim_then_holder_commits(Level::Serializable);
}

/// Duplicate source: as above, but the first delivery rolls back.
///
/// Guarantee: the waiting REPEATABLE READ claim becomes the first claim (true) with no
/// serialization failure, so the message is processed once and without a needless retry.
#[test]
fn repeatable_read_blocked_claim_is_true_when_holder_rolls_back() {
    blocked_claim_then_holder_rolls_back(Level::RepeatableRead);
}

/// As above, under SERIALIZABLE.
#[test]
fn serializable_blocked_claim_is_true_when_holder_rolls_back() {
    blocked_claim_then_holder_rolls_back(Level::Serializable);
}
