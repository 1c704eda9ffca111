//! Competing consumers: many sessions claim the same key at the same instant.

mod common;

use std::thread;

use common::{claim, claim_nowait, describe, join, ledger_rows, ok, sqlstate, test_db, Barrier, TestDb};

const SETUP: &str = "CREATE TABLE effects (key text NOT NULL, worker int NOT NULL)";

fn db() -> &'static TestDb {
    test_db("race", SETUP)
}

/// The business side effect a consumer commits only when its claim was new.
fn record_effect(c: &mut postgres::Client, key: &str, worker: usize) {
    ok(c.execute("INSERT INTO effects (key, worker) VALUES ($1, $2)", &[&key, &(worker as i32)]), "business insert");
}

/// The workers whose side effect for `key` was committed.
fn committed_effects(check: &mut postgres::Client, key: &str) -> Vec<i32> {
    check.query("SELECT worker FROM effects WHERE key = $1", &[&key]).unwrap().iter().map(|r| r.get(0)).collect()
}

/// Duplicate source: one message delivered to many competing consumers at once (a broker
/// redelivering to every member of a consumer group, or a retry storm).
///
/// Guarantee: of N transactions that claim the same key concurrently, exactly one gets
/// true and so exactly one business side effect is committed; the ledger holds exactly one
/// row for the key. 16 sessions start their transactions, meet at a barrier and claim
/// together; this is repeated for 20 keys so that real overlap happens many times.
///
/// It fails if the claim is a check-then-insert (two sessions both see "absent" and both
/// get true: more than one `effects` row), if a duplicate raises instead of returning false
/// (a worker panics with the SQLSTATE), or if a loser gets true after the winner committed.
#[test]
fn sixteen_concurrent_claims_of_one_key_have_exactly_one_winner() {
    race_for_one_key("race", 0);
}

/// The same race when every session has just claimed a run of new keys, so that its racing
/// claim skips the pre-check and finds the others only in its speculative insertion, which
/// it then backs out. The guarantee is the same, and the backed-out insertions leave no
/// visible ledger row.
#[test]
fn concurrent_claims_after_a_run_of_new_keys_have_exactly_one_winner() {
    race_for_one_key("race-calm", 16);
}

/// 16 sessions claim each of 20 keys at the same instant, each after claiming `new_first`
/// keys of its own in the same transaction.
fn race_for_one_key(prefix: &str, new_first: usize) {
    const WORKERS: usize = 16;
    const ROUNDS: usize = 20;
    let db = db();
    let keys: Vec<String> = (1..=ROUNDS).map(|r| format!("{prefix}-{r}")).collect();
    let barrier = Barrier::new(WORKERS);

    // answers[worker][round]
    let answers: Vec<Vec<bool>> = thread::scope(|s| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|worker| {
                let (keys, barrier) = (&keys, &barrier);
                s.spawn(move || {
                    let mut c = db.connect(&format!("{prefix}-worker-{worker}"));
                    keys.iter()
                        .map(|key| {
                            ok(c.batch_execute("BEGIN"), "BEGIN");
                            for n in 0..new_first {
                                let own = format!("{key}-own-{worker}-{n}");
                                assert!(ok(claim(&mut c, &own), "a key of its own"), "{own} is new");
                            }
                            barrier.wait();
                            let won = ok(claim(&mut c, key), &format!("worker {worker} claims {key}"));
                            if won {
                                record_effect(&mut c, key, worker);
                            }
                            ok(c.batch_execute("COMMIT"), "COMMIT");
                            won
                        })
                        .collect()
                })
            })
            .collect();
        workers.into_iter().enumerate().map(|(w, h)| join(&format!("{prefix} worker {w}"), h)).collect()
    });

    let mut check = db.connect(&format!("{prefix}-check"));
    for (round, key) in keys.iter().enumerate() {
        let winners: Vec<usize> = (0..WORKERS).filter(|&w| answers[w][round]).collect();
        assert_eq!(
            winners.len(),
            1,
            "{key}: exactly one of {WORKERS} concurrent claims must be true, got winners {winners:?}"
        );
        let effects = committed_effects(&mut check, key);
        assert_eq!(effects, vec![winners[0] as i32], "{key}: exactly the winner's side effect is committed");
        assert_eq!(ledger_rows(&mut check, key), 1, "{key}: one ledger row");
    }
    let total: i64 = check.query_one("SELECT count(*) FROM effects WHERE key = ANY($1)", &[&keys]).unwrap().get(0);
    assert_eq!(total, ROUNDS as i64, "one side effect per key, none for any duplicate");
}

/// Duplicate source: the same message delivered to many competing consumers at once, each
/// of which uses the no-wait claim (and requeues on 55P03 rather than waiting).
///
/// Guarantee: never more than one winner. Every other concurrent call either answers false
/// (the winner had already committed) or raises 55P03 (the key was in flight), never any
/// other error; committed side effects = winners = ledger rows for the key. (Unlike the
/// waiting claim, a no-wait race may end with no winner at all: every caller may find
/// another's claim in flight. The message is then requeued, not lost or duplicated.)
#[test]
fn concurrent_nowait_claims_of_one_key_have_at_most_one_winner() {
    const WORKERS: usize = 16;
    const ROUNDS: usize = 20;
    let db = db();
    let keys: Vec<String> = (1..=ROUNDS).map(|r| format!("race-nowait-{r}")).collect();
    let barrier = Barrier::new(WORKERS);

    // outcomes[worker][round]: Some(answer), or None for 55P03
    let outcomes: Vec<Vec<Option<bool>>> = thread::scope(|s| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|worker| {
                let (keys, barrier) = (&keys, &barrier);
                s.spawn(move || {
                    let mut c = db.connect(&format!("race-nowait-worker-{worker}"));
                    keys.iter()
                        .map(|key| {
                            ok(c.batch_execute("BEGIN"), "BEGIN");
                            barrier.wait();
                            match claim_nowait(&mut c, key) {
                                Ok(won) => {
                                    if won {
                                        record_effect(&mut c, key, worker);
                                    }
                                    ok(c.batch_execute("COMMIT"), "COMMIT");
                                    Some(won)
                                }
                                Err(e) => {
                                    assert_eq!(sqlstate(&e), Some("55P03"), "worker {worker}, {key}: {}", describe(&e));
                                    ok(c.batch_execute("ROLLBACK"), "ROLLBACK");
                                    None
                                }
                            }
                        })
                        .collect()
                })
            })
            .collect();
        workers.into_iter().enumerate().map(|(w, h)| join(&format!("race worker {w}"), h)).collect()
    });

    let mut check = db.connect("race-check");
    for (round, key) in keys.iter().enumerate() {
        let winners: Vec<usize> = (0..WORKERS).filter(|&w| outcomes[w][round] == Some(true)).collect();
        assert!(winners.len() <= 1, "{key}: at most one no-wait claim may be true, got winners {winners:?}");
        let effects = committed_effects(&mut check, key);
        let expected: Vec<i32> = winners.iter().map(|&w| w as i32).collect();
        assert_eq!(effects, expected, "{key}: exactly the winner's side effect is committed");
        assert_eq!(
            ledger_rows(&mut check, key),
            winners.len() as i64,
            "{key}: a ledger row exactly if there was a winner"
        );
        if winners.is_empty() {
            assert!((0..WORKERS).all(|w| outcomes[w][round].is_none()), "{key}: false without any committed winner");
        }
    }
}
