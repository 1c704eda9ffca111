//! Versioned writes (idem_versioned_update, idem_versioned_upsert, idem_version_guard)
//! driven by several real sessions at once: concurrent writers with shuffled versions must
//! converge on the highest version, whatever order their statements commit in.

mod common;

use std::collections::BTreeMap;
use std::thread;

use postgres::Client;

use common::{describe, expect_sqlstate, join, ok, shuffled, test_db, Barrier, TestDb};

const SETUP: &str = "
CREATE TABLE read_model (id int PRIMARY KEY, status text, version bigint);
INSERT INTO read_model VALUES (1, 'v0', 0);

CREATE TABLE upsert_model (id int PRIMARY KEY, status text, version bigint);

CREATE TABLE guarded (id int PRIMARY KEY, status text, version bigint);
INSERT INTO guarded VALUES (1, 'v0', 0);

CREATE TABLE ooo_update (id int PRIMARY KEY, status text, version bigint);
INSERT INTO ooo_update VALUES (1, 'v0', 0);
CREATE TABLE ooo_upsert (id int PRIMARY KEY, status text, version bigint);

CREATE TABLE priv_model (id int PRIMARY KEY, status text, version bigint);
INSERT INTO priv_model VALUES (1, 'v0', 0);
";

/// One thread's write: the row id, the version sent, and whether it wrote (or its error).
type Call = (i32, i64, Result<bool, String>);

fn db() -> &'static TestDb {
    test_db("versioned", SETUP)
}

const WRITERS: usize = 8;

// --- helpers local to this file -------------------------------------------------------------

/// Deals `items` round-robin to `WRITERS` threads: thread t gets items t, t+8, t+16, ...
fn deal<T: Clone>(items: &[T]) -> Vec<Vec<T>> {
    (0..WRITERS).map(|t| items.iter().skip(t).step_by(WRITERS).cloned().collect()).collect()
}

/// The row (id, status, version) of `table`, or None.
fn row(client: &mut Client, table: &str, id: i32) -> Option<(i32, Option<String>, Option<i64>)> {
    client
        .query_opt(&format!("SELECT id, status, version FROM {table} WHERE id = $1"), &[&id])
        .unwrap_or_else(|e| panic!("read {table} id {id}: {}", describe(&e)))
        .map(|r| (r.get(0), r.get(1), r.get(2)))
}

fn bool_of(
    client: &mut Client,
    sql: &str,
    params: &[&(dyn postgres::types::ToSql + Sync)],
) -> Result<bool, postgres::Error> {
    let r = client.query_one(sql, params)?;
    Ok(r.get::<_, Option<bool>>(0).unwrap_or_else(|| panic!("{sql} returned NULL")))
}

/// `idem_versioned_update(table, {"id": id}, {"status": "v<version>", "version": version})`.
fn versioned_update(client: &mut Client, table: &str, id: i32, version: i64) -> Result<bool, postgres::Error> {
    bool_of(
        client,
        "SELECT idem_versioned_update($1::text::regclass, jsonb_build_object('id', $2::int), \
                jsonb_build_object('status', 'v' || $3::bigint, 'version', $3::bigint))",
        &[&table, &id, &version],
    )
}

/// `idem_versioned_upsert(table, {"id": id, "status": "v<version>", "version": version})`.
fn versioned_upsert(client: &mut Client, table: &str, id: i32, version: i64) -> Result<bool, postgres::Error> {
    bool_of(
        client,
        "SELECT idem_versioned_upsert($1::text::regclass, \
                jsonb_build_object('id', $2::int, 'status', 'v' || $3::bigint, 'version', $3::bigint))",
        &[&table, &id, &version],
    )
}

/// Asserts that, on one thread, every write that returned true carried a version greater
/// than every version that had returned true before it on that thread (per id). `calls` is
/// the thread's (id, version, returned true) in the order it made them.
#[track_caller]
fn assert_monotone_per_thread(what: &str, thread: usize, calls: &[(i32, i64, bool)]) {
    let mut highest: BTreeMap<i32, i64> = BTreeMap::new();
    for &(id, version, written) in calls {
        if !written {
            continue;
        }
        if let Some(&before) = highest.get(&id) {
            assert!(
                version > before,
                "{what}: thread {thread} got true for id {id} version {version} after it had already \
                 got true for version {before}: an older version overwrote a newer one"
            );
        }
        highest.insert(id, version);
    }
}

/// Runs `steps[t]` on thread t, each thread with its own connection, in lockstep: all
/// threads meet at a barrier before every step, so each step is a real race between 8
/// sessions, and again after it. Between two steps a checker session verifies, on `table`,
/// that every id sent so far holds exactly (id, 'v<max>', max) for the highest version sent
/// for it in all finished steps: a write that was lost, or an older version that overwrote
/// a newer one, is caught at the step where it happened, not only at the end. `call` makes
/// one autocommit write and says whether it wrote. Returns, per thread, the (id, version,
/// wrote) of each call in order, after checking what each step's answers must have been:
/// a version not above the stored one at the start of the step is never written, and the
/// highest version of the step for an id is written whenever it is newer than the stored one.
fn race(
    label: &str,
    table: &str,
    steps: &[Vec<(i32, i64)>],
    call: impl Fn(&mut Client, i32, i64) -> Result<bool, postgres::Error> + Sync,
) -> Vec<Vec<(i32, i64, bool)>> {
    let db = db();
    assert_eq!(steps.len(), WRITERS);
    let len = steps[0].len();
    assert!(steps.iter().all(|s| s.len() == len), "lockstep needs the same number of steps per thread");
    let barrier = Barrier::new(WRITERS + 1);
    let call = &call;
    let calls: Vec<Vec<(i32, i64, bool)>> = thread::scope(|s| {
        let handles: Vec<_> = steps
            .iter()
            .enumerate()
            .map(|(t, mine)| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut c = db.connect(&format!("{label}-{t}"));
                    // An error is kept, not raised at once, so the peers are not left
                    // waiting at the barrier; it fails the test after the race.
                    mine.iter()
                        .map(|&(id, version)| {
                            barrier.wait();
                            let wrote = call(&mut c, id, version).map_err(|e| {
                                format!("{label} thread {t}: id {id} version {version}: {}", describe(&e))
                            });
                            barrier.wait();
                            (id, version, wrote)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let barrier = &barrier;
        let checker = s.spawn(move || {
            let mut c = db.connect(&format!("{label}-checker"));
            let mut highest: BTreeMap<i32, i64> = BTreeMap::new();
            let mut first_wrong: Option<String> = None; // reported after the race, see above
            for step in 0..len {
                barrier.wait(); // the writers start the step
                barrier.wait(); // every writer's call of the step has returned
                for mine in steps {
                    let (id, version) = mine[step];
                    let h = highest.entry(id).or_insert(version);
                    *h = (*h).max(version);
                }
                for (&id, &max) in &highest {
                    let found = row(&mut c, table, id);
                    if first_wrong.is_none() && found != Some((id, Some(format!("v{max}")), Some(max))) {
                        first_wrong = Some(format!(
                            "{label}: after step {step}, id {id} must hold the highest version sent so far \
                             (id {id}, 'v{max}', {max}), found {found:?}"
                        ));
                    }
                }
            }
            first_wrong
        });
        let calls: Vec<Vec<Call>> =
            handles.into_iter().enumerate().map(|(t, h)| join(&format!("{label} thread {t}"), h)).collect();
        let errors: Vec<&String> = calls.iter().flatten().filter_map(|c| c.2.as_ref().err()).collect();
        assert!(errors.is_empty(), "{label}: {} of the concurrent writes failed, e.g. {}", errors.len(), errors[0]);
        if let Some(wrong) = join(&format!("{label} checker"), checker) {
            panic!("{wrong}");
        }
        calls
            .into_iter()
            .map(|mine| mine.into_iter().map(|(id, version, wrote)| (id, version, wrote.unwrap())).collect())
            .collect()
    });

    let mut stored: BTreeMap<i32, i64> = BTreeMap::new(); // at the start of the step
    for step in 0..len {
        let this: Vec<(usize, (i32, i64, bool))> = calls.iter().enumerate().map(|(t, mine)| (t, mine[step])).collect();
        for &(t, (id, version, wrote)) in &this {
            if let Some(&before) = stored.get(&id) {
                assert!(
                    !(wrote && version <= before),
                    "{label}: step {step}, thread {t}: version {version} of id {id} returned true although {before} was \
                     already stored when the step began"
                );
            }
        }
        for &(t, (id, version, wrote)) in &this {
            let step_max = this.iter().filter(|c| c.1 .0 == id).map(|c| c.1 .1).max().unwrap();
            if version == step_max && stored.get(&id).is_none_or(|&before| version > before) {
                assert!(
                    wrote,
                    "{label}: step {step}, thread {t}: version {version} of id {id} is the newest of its step and newer \
                     than the stored {:?}, yet it returned false",
                    stored.get(&id)
                );
            }
        }
        for &(_, (id, version, _)) in &this {
            let h = stored.entry(id).or_insert(version);
            *h = (*h).max(version);
        }
    }
    calls
}

// --- tests ----------------------------------------------------------------------------------

/// Eight writers send versions 1..=200 of one row in a shuffled order, one autocommit
/// idem_versioned_update each, all eight at once at every step.
///
/// Guarantees: after every step the row holds exactly the highest version sent so far (an
/// older version that commits last never overwrites a newer one), so it ends at exactly
/// (1, 'v200', 200); a version not newer than the stored one returns false, the newest of a
/// step returns true when it is newer than the stored one, so the write carrying 200 returns
/// true; at least one write returns true; and on each thread a write that returned true
/// carried a version greater than every version that had returned true before it there.
#[test]
fn eight_concurrent_versioned_updates_converge_on_the_highest_version() {
    let versions: Vec<(i32, i64)> =
        shuffled((1..=200).collect::<Vec<i64>>(), 0x5EED_0001).into_iter().map(|v| (1, v)).collect();
    let steps = deal(&versions);
    let calls = race("vupdate", "read_model", &steps, |c, id, v| versioned_update(c, "read_model", id, v));

    let trues: usize = calls.iter().flatten().filter(|c| c.2).count();
    assert!(trues >= 1, "at least one of the 200 versioned updates must write");
    for (t, mine) in calls.iter().enumerate() {
        assert_monotone_per_thread("idem_versioned_update", t, mine);
    }
    let top = calls.iter().flatten().find(|c| c.1 == 200).expect("version 200 was sent");
    assert!(top.2, "the write of version 200 must return true: no stored version can be newer");

    let mut check = db().connect("vupdate-check");
    assert_eq!(row(&mut check, "read_model", 1), Some((1, Some("v200".into()), Some(200))));
    let n: i64 = check.query_one("SELECT count(*) FROM read_model", &[]).unwrap().get(0);
    assert_eq!(n, 1, "an update never inserts");
}

/// Eight writers upsert ids 1..=10 of an initially empty table, 40 versions per id. First
/// all eight race to insert each id at the same instant (one step per id), then the other
/// 320 (id, version) pairs follow in a shuffled order, all eight at once at every step.
///
/// Guarantees: no call fails (a concurrent first insert must not surface 23505
/// unique_violation); after every step each id sent so far holds exactly its highest
/// version sent so far, so each id ends at exactly (id, 'v40', 40); in each insert race the
/// highest of the eight versions returns true; the write of version 40 of each id returns
/// true; a version not newer than the stored one returns false; writes that returned true
/// are monotone per thread and id.
#[test]
fn eight_concurrent_versioned_upserts_insert_once_and_converge_on_the_highest_version() {
    const IDS: i32 = 10;
    const VERSIONS: i64 = 40;
    let mut steps: Vec<Vec<(i32, i64)>> = vec![Vec::new(); WRITERS];
    let mut rest = Vec::new();
    for id in 1..=IDS {
        let order = shuffled((1..=VERSIONS).collect::<Vec<i64>>(), 0x5EED_0100 + id as u64);
        for (t, &v) in order[..WRITERS].iter().enumerate() {
            steps[t].push((id, v)); // step id-1: all eight threads race on this id's insert
        }
        rest.extend(order[WRITERS..].iter().map(|&v| (id, v)));
    }
    for (t, more) in deal(&shuffled(rest, 0x5EED_0002)).into_iter().enumerate() {
        steps[t].extend(more);
    }
    let calls = race("vupsert", "upsert_model", &steps, |c, id, v| versioned_upsert(c, "upsert_model", id, v));

    for (t, mine) in calls.iter().enumerate() {
        assert_monotone_per_thread("idem_versioned_upsert", t, mine);
    }
    for id in 1..=IDS {
        let step = (id - 1) as usize;
        let racers: Vec<(i64, bool)> = calls.iter().map(|mine| (mine[step].1, mine[step].2)).collect();
        assert!(racers.iter().any(|r| r.1), "id {id}: one of the 8 racing first upserts must write: {racers:?}");
        let best = racers.iter().max_by_key(|r| r.0).unwrap();
        assert!(best.1, "id {id}: the highest version of the insert race must be written: {racers:?}");
        let top = calls.iter().flatten().find(|c| c.0 == id && c.1 == VERSIONS).unwrap();
        assert!(top.2, "id {id}: the write of version {VERSIONS} must return true");
    }

    let mut check = db().connect("vupsert-check");
    for id in 1..=IDS {
        assert_eq!(
            row(&mut check, "upsert_model", id),
            Some((id, Some(format!("v{VERSIONS}")), Some(VERSIONS))),
            "id {id}"
        );
    }
    let n: i64 = check.query_one("SELECT count(*) FROM upsert_model", &[]).unwrap().get(0);
    assert_eq!(n, IDS as i64, "one row per id");
}

/// With idem_version_guard installed, eight sessions run plain
/// `UPDATE guarded SET status = $1, version = $2 WHERE id = 1` with versions 1..=200 in a
/// shuffled order, all eight at once at every step.
///
/// Guarantees: after every step the row holds exactly the highest version sent so far, so it
/// ends at exactly (1, 'v200', 200); an UPDATE the guard skips reports 0 rows, one it lets
/// through 1 row; an UPDATE to a version not newer than the stored one reports 0 rows; the
/// UPDATE of version 200 reports 1 row; reported writes are monotone per thread; afterwards an UPDATE that leaves the version as it is
/// (or lowers it) is skipped too, and idempotency.version_guards lists the table.
#[test]
fn guarded_plain_updates_from_eight_sessions_converge_on_the_highest_version() {
    let db = db();
    let mut admin = db.connect("guard-admin");
    ok(admin.batch_execute("SELECT idem_version_guard('guarded')"), "idem_version_guard('guarded')");

    let versions: Vec<(i32, i64)> =
        shuffled((1..=200).collect::<Vec<i64>>(), 0x5EED_0003).into_iter().map(|v| (1, v)).collect();
    let calls = race("guard", "guarded", &deal(&versions), |c, id, v| {
        let n =
            c.execute("UPDATE guarded SET status = $1, version = $2 WHERE id = $3", &[&format!("v{v}"), &v, &id])?;
        assert!(n <= 1, "an UPDATE by primary key reports at most one row, got {n}");
        Ok(n == 1)
    });

    assert!(calls.iter().flatten().any(|c| c.2), "at least one guarded UPDATE must write");
    for (t, mine) in calls.iter().enumerate() {
        assert_monotone_per_thread("guarded UPDATE", t, mine);
    }
    let top = calls.iter().flatten().find(|c| c.1 == 200).unwrap();
    assert!(top.2, "the UPDATE to version 200 must not be skipped");
    assert_eq!(row(&mut admin, "guarded", 1), Some((1, Some("v200".into()), Some(200))));

    // Same version, or no version change at all: skipped; a lower version: skipped.
    let same = ok(admin.execute("UPDATE guarded SET status = 'same version' WHERE id = 1", &[]), "same-version UPDATE");
    let lower =
        ok(admin.execute("UPDATE guarded SET status = 'lower', version = 199 WHERE id = 1", &[]), "lower UPDATE");
    assert_eq!((same, lower), (0, 0), "UPDATEs that do not make the version newer are skipped");
    assert_eq!(row(&mut admin, "guarded", 1), Some((1, Some("v200".into()), Some(200))));

    let guards: Vec<(String, String)> = ok(
        admin.query("SELECT target::text, version_column::text FROM idempotency.version_guards", &[]),
        "idempotency.version_guards",
    )
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect();
    assert_eq!(guards, vec![("guarded".to_string(), "version".to_string())]);
}

/// Out-of-order delivery across connections: versions 4, 2, 3 of one row arrive on three
/// different sessions in that order, then 4 again on a fourth.
///
/// Guarantees, for both idem_versioned_update and idem_versioned_upsert: 4 writes (true),
/// 2 and 3 arrive late and are dropped (false), the duplicate 4 is dropped (false), and the
/// row ends at exactly (1, 'v4', 4).
#[test]
fn out_of_order_versions_across_connections_end_at_the_newest() {
    let db = db();
    type Write = fn(&mut Client, &str, i32, i64) -> Result<bool, postgres::Error>;
    let cases: [(&str, &str, Write); 2] = [
        ("idem_versioned_update", "ooo_update", versioned_update),
        ("idem_versioned_upsert", "ooo_upsert", versioned_upsert),
    ];
    for (what, table, write) in cases {
        let mut sessions: Vec<Client> = (0..4).map(|i| db.connect(&format!("ooo-{table}-{i}"))).collect();
        let mut answers = Vec::new();
        for (session, version) in sessions.iter_mut().zip([4i64, 2, 3, 4]) {
            answers.push((version, ok(write(session, table, 1, version), &format!("{what} version {version}"))));
        }
        assert_eq!(
            answers,
            vec![(4, true), (2, false), (3, false), (4, false)],
            "{what}: (version, written) in arrival order"
        );
        assert_eq!(row(&mut sessions[0], table, 1), Some((1, Some("v4".into()), Some(4))), "{what}");
    }
}

/// A role with SELECT but no UPDATE (nor INSERT) on the table: the versioned writes run
/// with the caller's privileges, so they fail with 42501 insufficient_privilege, also on a
/// session that already prepared and ran the same statement as a superuser (a plan cached
/// per backend must not carry the earlier user's rights), and the row is untouched.
#[test]
fn a_role_without_update_privilege_gets_42501() {
    const ROLE: &str = "idem_client_versioned_no_update";
    let db = db();
    let mut admin = db.connect("priv-admin");
    ok(
        admin.batch_execute(&format!(
            "DROP ROLE IF EXISTS {ROLE}; CREATE ROLE {ROLE}; GRANT SELECT ON priv_model TO {ROLE};"
        )),
        "create the role",
    );

    let mut c = db.connect("priv-client");
    // As the superuser first, so this backend has the plans of both statements cached.
    assert!(ok(versioned_update(&mut c, "priv_model", 1, 1), "update as superuser"));
    assert!(ok(versioned_upsert(&mut c, "priv_model", 1, 2), "upsert as superuser"));

    ok(c.batch_execute(&format!("SET ROLE {ROLE}")), "SET ROLE");
    let current: String = c.query_one("SELECT current_user::text", &[]).unwrap().get(0);
    assert_eq!(current, ROLE);
    expect_sqlstate(versioned_update(&mut c, "priv_model", 1, 10), "42501", "idem_versioned_update without UPDATE");
    expect_sqlstate(
        versioned_upsert(&mut c, "priv_model", 1, 11),
        "42501",
        "idem_versioned_upsert without INSERT/UPDATE",
    );
    expect_sqlstate(
        versioned_upsert(&mut c, "priv_model", 2, 1),
        "42501",
        "idem_versioned_upsert of a new row without INSERT",
    );
    // The session still works after the errors.
    assert_eq!(
        row(&mut c, "priv_model", 1),
        Some((1, Some("v2".into()), Some(2))),
        "the denied writes changed nothing"
    );
    ok(c.batch_execute("RESET ROLE"), "RESET ROLE");
    drop(c);

    // A fresh session that never ran as the superuser: the same.
    let mut fresh = db.connect("priv-fresh");
    ok(fresh.batch_execute(&format!("SET ROLE {ROLE}")), "SET ROLE");
    expect_sqlstate(
        versioned_update(&mut fresh, "priv_model", 1, 10),
        "42501",
        "idem_versioned_update without UPDATE (fresh)",
    );
    drop(fresh);

    assert_eq!(row(&mut admin, "priv_model", 1), Some((1, Some("v2".into()), Some(2))));
    ok(admin.batch_execute(&format!("DROP OWNED BY {ROLE}; DROP ROLE {ROLE};")), "drop the role");
}
