//! Claims whose transaction never commits (rolled back, rolled back to a savepoint, or lost
//! with a crashed consumer's connection) leave no trace: the message is processed again,
//! exactly once.

mod common;

use std::thread;

use common::{claim, join, ledger_rows, ok, test_db, wait_until_blocked, wait_until_gone, Session, TestDb};
use postgres::Client;

const SETUP: &str = "CREATE TABLE effects (key text NOT NULL, worker text NOT NULL)";

fn db() -> &'static TestDb {
    test_db("abandoned", SETUP)
}

/// One delivery as a consumer processes it: claim, and the business write only if new.
fn process(c: &mut Client, key: &str, worker: &str) -> bool {
    let new = ok(claim(c, key), &format!("{worker} claims {key}"));
    if new {
        ok(c.execute("INSERT INTO effects (key, worker) VALUES ($1, $2)", &[&key, &worker]), "business insert");
    }
    new
}

fn effects(c: &mut Client, key: &str) -> Vec<String> {
    ok(c.query("SELECT worker FROM effects WHERE key = $1 ORDER BY worker", &[&key]), "read effects")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Duplicate source: a delivery whose processing fails and rolls back, followed by the
/// broker's redelivery to another consumer.
///
/// Guarantee: the rolled-back claim leaves no ledger row, so the redelivery (on another
/// connection) gets true and its side effect is the only one. Fails if a rolled-back claim
/// survives (the redelivery would get false and the message would be lost).
#[test]
fn rolled_back_claim_leaves_no_trace() {
    let key = "abandoned-rollback";
    let mut a = db().connect("abandoned-a");
    let mut b = db().connect("abandoned-b");

    ok(a.batch_execute("BEGIN"), "A BEGIN");
    assert!(process(&mut a, key, "A"), "A's claim is the first");
    ok(a.batch_execute("ROLLBACK"), "A ROLLBACK");
    assert_eq!(ledger_rows(&mut b, key), 0, "the rolled-back claim left no ledger row");

    ok(b.batch_execute("BEGIN"), "B BEGIN");
    assert!(process(&mut b, key, "B"), "after A's rollback, B's claim is the first");
    ok(b.batch_execute("COMMIT"), "B COMMIT");
    assert_eq!(effects(&mut a, key), ["B"], "exactly one side effect, B's");
    assert_eq!(ledger_rows(&mut a, key), 1);
}

/// Duplicate source: a batch consumer that processes each message under a SAVEPOINT and
/// rolls back to it when one message fails, while the message is redelivered to another
/// consumer that is already waiting on it.
///
/// Guarantee: ROLLBACK TO SAVEPOINT releases the claim at once: the waiting consumer B gets
/// true (without waiting for A's whole transaction), and A's own later claim of the same key
/// in the same transaction is then a duplicate (false). One side effect, one ledger row.
#[test]
fn claim_rolled_back_to_a_savepoint_is_released_to_a_waiter() {
    let key = "abandoned-savepoint";
    let mut a = db().session("abandoned-a");
    let mut b = db().session("abandoned-b");
    let mut observer = db().connect("abandoned-observer");

    ok(a.client.batch_execute("BEGIN; SAVEPOINT message"), "A BEGIN, SAVEPOINT");
    assert!(process(&mut a.client, key, "A"), "A's claim is the first");

    thread::scope(|s| {
        let b_client = &mut b.client;
        let waiter = s.spawn(move || {
            ok(b_client.batch_execute("BEGIN"), "B BEGIN");
            let new = process(b_client, key, "B");
            ok(b_client.batch_execute("COMMIT"), "B COMMIT");
            new
        });
        wait_until_blocked(&mut observer, b.pid, a.pid, || waiter.is_finished());
        ok(a.client.batch_execute("ROLLBACK TO SAVEPOINT message"), "A ROLLBACK TO SAVEPOINT");
        assert!(join("B's claim", waiter), "A's claim was rolled back to its savepoint, so B's claim is the first");
    });

    assert!(!process(&mut a.client, key, "A"), "B committed the key, so A's second attempt is a duplicate");
    ok(a.client.batch_execute("COMMIT"), "A COMMIT");
    assert_eq!(effects(&mut observer, key), ["B"], "exactly one side effect, B's");
    assert_eq!(ledger_rows(&mut observer, key), 1);
}

/// How consumer A's connection is lost.
#[derive(Clone, Copy, Debug)]
enum Crash {
    /// The client goes away without COMMIT (process killed, socket closed).
    DropConnection,
    /// The backend is killed from outside (pg_terminate_backend, OOM-killer, failover).
    TerminateBackend,
}

/// Consumer A claims `key`, does its business write and crashes before COMMIT, while
/// consumer B, processing the redelivery, is already blocked on A's claim.
fn consumer_crashes_before_commit(key: &str, crash: Crash) {
    let a: Session = db().session("abandoned-a-crashes");
    let mut b = db().session("abandoned-b");
    let mut observer = db().connect("abandoned-observer");
    let (mut a_client, a_pid) = (a.client, a.pid);

    ok(a_client.batch_execute("BEGIN"), "A BEGIN");
    assert!(process(&mut a_client, key, "A"), "A's claim is the first");

    thread::scope(|s| {
        let b_client = &mut b.client;
        let waiter = s.spawn(move || {
            ok(b_client.batch_execute("BEGIN"), "B BEGIN");
            let new = process(b_client, key, "B");
            ok(b_client.batch_execute("COMMIT"), "B COMMIT");
            new
        });
        wait_until_blocked(&mut observer, b.pid, a_pid, || waiter.is_finished());
        match crash {
            Crash::DropConnection => drop(a_client),
            Crash::TerminateBackend => {
                let killed: bool =
                    ok(observer.query_one("SELECT pg_terminate_backend($1)", &[&a_pid]), "pg_terminate_backend").get(0);
                assert!(killed, "A's backend was signalled");
            }
        }
        wait_until_gone(&mut observer, a_pid);
        assert!(join("B's claim", waiter), "{crash:?}: A never committed, so B's claim is the first");
    });

    assert_eq!(effects(&mut observer, key), ["B"], "{crash:?}: exactly one side effect, B's");
    assert_eq!(ledger_rows(&mut observer, key), 1, "{crash:?}: one ledger row");
}

/// Duplicate source: the same message processed twice because the first consumer crashed
/// after its claim and business write but before COMMIT, and the broker redelivered.
///
/// Guarantee: the claim dies with the connection: the redelivery, already waiting on it,
/// gets true, and only its side effect exists. Fails if B is answered false while A's
/// transaction is in doubt (the message would be lost), or if A's write survived.
#[test]
fn claim_of_a_consumer_whose_connection_drops_is_released() {
    consumer_crashes_before_commit("abandoned-dropped", Crash::DropConnection);
}

/// As above, with A's backend terminated from another session.
#[test]
fn claim_of_a_consumer_whose_backend_is_terminated_is_released() {
    consumer_crashes_before_commit("abandoned-terminated", Crash::TerminateBackend);
}
