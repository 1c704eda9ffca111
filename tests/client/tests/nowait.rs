//! idem_claim_nowait: refuse at once (55P03) instead of waiting for another transaction's
//! uncommitted claim, and leave the session's own lock settings alone.

mod common;

use std::thread;
use std::time::Duration;

use common::{
    assert_still_blocked, claim, claim_nowait, expect_sqlstate, join, ledger_rows, ok, test_db, wait_until_blocked,
    Session, TestDb,
};
use postgres::Client;

fn db() -> &'static TestDb {
    test_db("nowait", "")
}

/// T1: a session holding an uncommitted claim of every key in `keys`.
fn holder(keys: &[&str]) -> Session {
    let mut t1 = db().session("nowait-holder");
    ok(t1.client.batch_execute("BEGIN"), "T1 BEGIN");
    for key in keys {
        assert!(ok(claim(&mut t1.client, key), "T1 claims"), "T1 is the first claim of {key}");
    }
    t1
}

/// T2: the session making no-wait claims. Its statement_timeout bounds the failure mode
/// "the no-wait claim waited after all": such a call ends in 57014 after 10 s, which fails
/// the 55P03 assertions, instead of hanging. A correct no-wait claim never gets near it.
fn requester() -> Session {
    let mut t2 = db().session("nowait-t2");
    ok(t2.client.batch_execute("SET statement_timeout = '10s'"), "SET statement_timeout");
    t2
}

fn show_lock_timeout(c: &mut Client) -> String {
    ok(c.query_one("SHOW lock_timeout", &[]), "SHOW lock_timeout").get(0)
}

/// Duplicate source: a redelivery arriving while the first delivery is still in flight, at
/// a consumer that prefers to requeue over holding a worker.
///
/// Guarantee: the no-wait claim neither waits nor guesses: it raises 55P03 while another
/// transaction holds an uncommitted claim, both inside an explicit transaction (which the
/// caller then rolls back, after which the session is fully usable) and as a single
/// autocommit statement. The session runs with lock_timeout = 0 (wait forever), so a no-wait
/// claim that waited would run into T2's statement_timeout and fail with 57014 instead of
/// 55P03; one that answered false or true would fail the assertion.
#[test]
fn nowait_raises_55p03_while_another_transaction_holds_the_key() {
    let mut t1 = holder(&["nowait-held"]);
    let mut t2 = requester().client;
    assert_eq!(show_lock_timeout(&mut t2), "0", "precondition: T2 would otherwise wait forever");

    ok(t2.batch_execute("BEGIN"), "T2 BEGIN");
    expect_sqlstate(claim_nowait(&mut t2, "nowait-held"), "55P03", "no-wait claim in a transaction");
    ok(t2.batch_execute("ROLLBACK"), "T2 ROLLBACK after 55P03");
    let one: i32 = ok(t2.query_one("SELECT 1", &[]), "T2 usable after ROLLBACK").get(0);
    assert_eq!(one, 1);
    ok(t2.batch_execute("BEGIN"), "T2 BEGIN again");
    assert!(ok(claim_nowait(&mut t2, "nowait-free"), "no-wait claim of a free key"), "a free key is claimed");
    ok(t2.batch_execute("COMMIT"), "T2 COMMIT");

    expect_sqlstate(claim_nowait(&mut t2, "nowait-held"), "55P03", "no-wait claim as an autocommit statement");
    let one: i32 = ok(t2.query_one("SELECT 1", &[]), "T2 usable after the failed autocommit statement").get(0);
    assert_eq!(one, 1);

    ok(t1.client.batch_execute("ROLLBACK"), "T1 ROLLBACK");
    let mut check = db().connect("nowait-check");
    assert_eq!(
        ledger_rows(&mut check, "nowait-held"),
        0,
        "neither the rolled-back claim nor the refused ones left a row"
    );
    assert_eq!(ledger_rows(&mut check, "nowait-free"), 1);
}

/// Duplicate source: the requeued redelivery, tried again after the first delivery committed.
///
/// Guarantee: once the holder has committed, the no-wait claim answers false (a duplicate),
/// in a transaction and in autocommit. Fails if the refusal outlives the holder (55P03 after
/// the commit) or the committed claim is not seen (true).
#[test]
fn nowait_is_a_duplicate_after_the_holder_commits() {
    let mut t1 = holder(&["nowait-commit"]);
    let mut t2 = requester().client;
    expect_sqlstate(claim_nowait(&mut t2, "nowait-commit"), "55P03", "while T1 is open");
    ok(t1.client.batch_execute("COMMIT"), "T1 COMMIT");

    ok(t2.batch_execute("BEGIN"), "T2 BEGIN");
    assert!(!ok(claim_nowait(&mut t2, "nowait-commit"), "no-wait claim after T1 committed"), "T1 committed: duplicate");
    ok(t2.batch_execute("COMMIT"), "T2 COMMIT");
    assert!(!ok(claim_nowait(&mut t2, "nowait-commit"), "autocommit no-wait claim after T1 committed"));
    assert_eq!(ledger_rows(&mut t2, "nowait-commit"), 1);
}

/// Duplicate source: the requeued redelivery, tried again after the first delivery failed.
///
/// Guarantee: once the holder has rolled back, the no-wait claim succeeds (true), so the
/// message is processed exactly once and not lost. Fails if the rolled-back claim still
/// blocks (55P03) or counts as a duplicate (false).
#[test]
fn nowait_claims_after_the_holder_rolls_back() {
    let mut t1 = holder(&["nowait-rollback"]);
    let mut t2 = requester().client;
    expect_sqlstate(claim_nowait(&mut t2, "nowait-rollback"), "55P03", "while T1 is open");
    ok(t1.client.batch_execute("ROLLBACK"), "T1 ROLLBACK");

    ok(t2.batch_execute("BEGIN"), "T2 BEGIN");
    assert!(ok(claim_nowait(&mut t2, "nowait-rollback"), "no-wait claim after T1 rolled back"), "T1 rolled back: new");
    ok(t2.batch_execute("COMMIT"), "T2 COMMIT");
    assert_eq!(ledger_rows(&mut t2, "nowait-rollback"), 1);
}

/// Guarantee: a no-wait claim shortens the lock wait of its own INSERT only. The session's
/// lock_timeout reads the same afterwards, whether the claim succeeded, found a duplicate,
/// or failed with 55P03 (in a transaction or in autocommit), for a session that set it
/// ('5s') and for one that left the default ('0'). Fails if the 1 ms used inside the call
/// leaks into the session setting.
#[test]
fn nowait_leaves_the_sessions_lock_timeout_as_it_was() {
    let mut t1 = holder(&["nowait-lt-held"]);
    for setting in ["5s", "0"] {
        let mut t2 = requester().client;
        ok(t2.batch_execute(&format!("SET lock_timeout = '{setting}'")), "SET lock_timeout");
        assert_eq!(show_lock_timeout(&mut t2), setting);

        // Success, then a duplicate, inside one transaction.
        let fresh = format!("nowait-lt-fresh-{setting}");
        ok(t2.batch_execute("BEGIN"), "T2 BEGIN");
        assert!(ok(claim_nowait(&mut t2, &fresh), "no-wait claim of a free key"));
        assert_eq!(show_lock_timeout(&mut t2), setting, "after a successful no-wait claim");
        assert!(!ok(claim_nowait(&mut t2, &fresh), "no-wait claim of a key this transaction holds"));
        assert_eq!(show_lock_timeout(&mut t2), setting, "after a no-wait duplicate");
        ok(t2.batch_execute("COMMIT"), "T2 COMMIT");
        assert_eq!(show_lock_timeout(&mut t2), setting, "after COMMIT");

        // Failure inside a transaction.
        ok(t2.batch_execute("BEGIN"), "T2 BEGIN");
        expect_sqlstate(claim_nowait(&mut t2, "nowait-lt-held"), "55P03", "no-wait claim of a held key");
        ok(t2.batch_execute("ROLLBACK"), "T2 ROLLBACK");
        assert_eq!(show_lock_timeout(&mut t2), setting, "after a failed no-wait claim and ROLLBACK");

        // Failure as an autocommit statement.
        expect_sqlstate(claim_nowait(&mut t2, "nowait-lt-held"), "55P03", "autocommit no-wait claim of a held key");
        assert_eq!(show_lock_timeout(&mut t2), setting, "after a failed autocommit no-wait claim");
    }
    ok(t1.client.batch_execute("ROLLBACK"), "T1 ROLLBACK");
}

/// After a no-wait claim (`failed`: one that raised 55P03 and was rolled back; otherwise one
/// that succeeded), the same session makes an ordinary claim of a key T1 holds. It must
/// block, still be blocked well past 1 ms, and return false when T1 commits.
fn ordinary_wait_after_nowait(failed: bool) {
    let suffix = if failed { "after-failure" } else { "after-success" };
    let held = format!("nowait-wait-held-{suffix}");
    let waited = format!("nowait-wait-waited-{suffix}");
    let mut t1 = holder(&[held.as_str(), waited.as_str()]);
    let mut t2 = requester();
    let mut observer = db().connect("nowait-observer");
    ok(t2.client.batch_execute("SET lock_timeout = '5s'"), "SET lock_timeout");

    ok(t2.client.batch_execute("BEGIN"), "T2 BEGIN");
    if failed {
        expect_sqlstate(claim_nowait(&mut t2.client, &held), "55P03", "no-wait claim of a held key");
        ok(t2.client.batch_execute("ROLLBACK"), "T2 ROLLBACK");
    } else {
        assert!(ok(claim_nowait(&mut t2.client, &format!("nowait-wait-free-{suffix}")), "no-wait claim of a free key"));
        ok(t2.client.batch_execute("COMMIT"), "T2 COMMIT");
    }

    let answer = thread::scope(|s| {
        let (t2_client, waited) = (&mut t2.client, &waited);
        let waiter = s.spawn(move || {
            ok(t2_client.batch_execute("BEGIN"), "T2 BEGIN");
            let answer = ok(claim(t2_client, waited), "ordinary claim after a no-wait claim");
            ok(t2_client.batch_execute("COMMIT"), "T2 COMMIT");
            answer
        });
        wait_until_blocked(&mut observer, t2.pid, t1.pid, || waiter.is_finished());
        // Deliberately hold T1 for far longer than the 1 ms the no-wait claim uses, then
        // confirm the ordinary claim is still waiting (the barrier above is the real sync).
        thread::sleep(Duration::from_millis(200));
        assert_still_blocked(&mut observer, t2.pid, t1.pid, || waiter.is_finished());
        ok(t1.client.batch_execute("COMMIT"), "T1 COMMIT");
        join("T2's ordinary claim", waiter)
    });
    assert!(!answer, "T1 committed {waited}, so T2's ordinary claim is a duplicate");
}

/// Guarantee: the 1 ms lock timeout of a failed no-wait claim does not outlive the call: a
/// later ordinary claim in the same session still waits for the holder (lock_timeout 5s)
/// and gets the right answer. Fails if that later wait is cut short with 55P03.
#[test]
fn ordinary_claim_after_a_failed_nowait_still_waits() {
    ordinary_wait_after_nowait(true);
}

/// As above, after a no-wait claim that succeeded.
#[test]
fn ordinary_claim_after_a_successful_nowait_still_waits() {
    ordinary_wait_after_nowait(false);
}
