//! idem_claim_replay / idem_set_result across connections, and the payload fingerprint
//! check when the duplicate had to wait for the first claim.

mod common;

use std::thread;

use common::{claim_with_payload, expect_sqlstate, join, ok, test_db, wait_until_blocked, TestDb};
use postgres::Client;

fn db() -> &'static TestDb {
    test_db("replay", "")
}

/// What idem_claim_replay answered: (claimed, first_claimed_at in µs since the epoch,
/// result as jsonb text).
type Replay = (bool, Option<i64>, Option<String>);

fn replay(c: &mut Client, key: &str) -> Result<Replay, postgres::Error> {
    let row = c.query_one(
        "SELECT claimed, (extract(epoch FROM first_claimed_at) * 1000000)::int8, result::text \
         FROM idem_claim_replay($1)",
        &[&key],
    )?;
    Ok((row.get::<_, Option<bool>>(0).expect("claimed is never NULL"), row.get(1), row.get(2)))
}

/// T1's transaction start (now()) in µs since the epoch.
fn now_micros(c: &mut Client) -> i64 {
    ok(c.query_one("SELECT (extract(epoch FROM now()) * 1000000)::int8", &[]), "now()").get(0)
}

/// T1: claims `key` with idem_claim_replay, stores {"n":1} as its result and returns its
/// transaction start, transaction still open.
fn first_delivery(t1: &mut Client, key: &str) -> i64 {
    ok(t1.batch_execute("BEGIN"), "T1 BEGIN");
    let started = now_micros(t1);
    let first = ok(replay(t1, key), "T1's replay claim");
    assert_eq!(
        first,
        (true, Some(started), None),
        "the first claim: claimed, at T1's transaction start, no result yet"
    );
    ok(t1.execute("SELECT idem_set_result($1, '{\"n\":1}')", &[&key]), "T1 stores its result");
    started
}

/// Duplicate source: a client retrying a request (e.g. an HTTP POST with an idempotency key)
/// after the first attempt committed, on another connection.
///
/// Guarantee: the retry is told it is a duplicate and gets back what the first attempt
/// stored: claimed = false, the stored result {"n":1}, and first_claimed_at equal to the
/// start of the first attempt's transaction (its now()).
#[test]
fn duplicate_gets_the_committed_result_and_first_claim_time() {
    let key = "replay-after-commit";
    let mut t1 = db().connect("replay-t1");
    let mut t2 = db().connect("replay-t2");
    let started = first_delivery(&mut t1, key);
    ok(t1.batch_execute("COMMIT"), "T1 COMMIT");

    ok(t2.batch_execute("BEGIN"), "T2 BEGIN");
    let again = ok(replay(&mut t2, key), "T2's replay claim");
    ok(t2.batch_execute("COMMIT"), "T2 COMMIT");
    assert_eq!(again, (false, Some(started), Some(r#"{"n": 1}"#.to_string())));
}

/// Duplicate source: the retry arrives while the first attempt is still open; it waits.
///
/// Guarantee: when the first attempt commits, the waiting retry gets claimed = false and the
/// result the first attempt stored in the same transaction (not NULL because it read the
/// ledger too early), with the first attempt's claim time. If the first attempt rolls back
/// instead, the retry is the first claim: claimed = true, its own transaction start, no result.
#[test]
fn waiting_duplicate_gets_the_result_committed_by_the_holder() {
    for commit in [true, false] {
        let key = if commit { "replay-waiting-commit" } else { "replay-waiting-rollback" };
        let mut t1 = db().session("replay-t1");
        let mut t2 = db().session("replay-t2");
        let mut observer = db().connect("replay-observer");
        let t1_started = first_delivery(&mut t1.client, key);

        let (t2_started, answer) = thread::scope(|s| {
            let t2_client = &mut t2.client;
            let waiter = s.spawn(move || {
                ok(t2_client.batch_execute("BEGIN"), "T2 BEGIN");
                let started = now_micros(t2_client);
                let answer = ok(replay(t2_client, key), "T2's replay claim");
                ok(t2_client.batch_execute("COMMIT"), "T2 COMMIT");
                (started, answer)
            });
            wait_until_blocked(&mut observer, t2.pid, t1.pid, || waiter.is_finished());
            ok(t1.client.batch_execute(if commit { "COMMIT" } else { "ROLLBACK" }), "T1 ends");
            join("T2's replay claim", waiter)
        });
        if commit {
            assert_eq!(answer, (false, Some(t1_started), Some(r#"{"n": 1}"#.to_string())), "T1 committed");
        } else {
            assert_eq!(answer, (true, Some(t2_started), None), "T1 rolled back");
        }
    }
}

/// Duplicate source: a producer bug that reuses a key for a different message, racing with
/// the message that first used the key.
///
/// Guarantee: a claim with a payload that waited for the first (uncommitted) claim is
/// checked against the first claim's payload once that commits: a different payload raises
/// ID001, and the same payload written differently (key order, whitespace, 1.0 vs 1) is a
/// plain duplicate (false). Fails if the waiter skips the check (false for a different
/// payload would silently drop a distinct message).
#[test]
fn waiting_claim_with_a_different_payload_is_id001() {
    for (same, payload) in [(false, r#"{"amount": 2}"#), (true, r#"{ "currency": "EUR", "amount": 1.0 }"#)] {
        let key = if same { "replay-payload-same" } else { "replay-payload-different" };
        let mut t1 = db().session("replay-t1");
        let mut t2 = db().session("replay-t2");
        let mut observer = db().connect("replay-observer");
        ok(t1.client.batch_execute("BEGIN"), "T1 BEGIN");
        assert!(ok(claim_with_payload(&mut t1.client, key, r#"{"amount":1,"currency":"EUR"}"#), "T1 claims"));

        let answer = thread::scope(|s| {
            let t2_client = &mut t2.client;
            let waiter = s.spawn(move || claim_with_payload(t2_client, key, payload));
            wait_until_blocked(&mut observer, t2.pid, t1.pid, || waiter.is_finished());
            ok(t1.client.batch_execute("COMMIT"), "T1 COMMIT");
            join("T2's claim", waiter)
        });
        if same {
            assert!(!ok(answer, "T2 claims with the same payload"), "same payload: a duplicate");
        } else {
            expect_sqlstate(answer, "ID001", "T2 claims with a different payload");
        }
    }
}
