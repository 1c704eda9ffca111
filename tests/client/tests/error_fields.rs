//! Errors reach a driver whole: every diagnostic field of an error raised inside the
//! extension's functions equals the field the equivalent hand-written statement gives, with
//! direct writes on and off. ORMs map errors by SQLSTATE and constraint name, consumers
//! retry on 40001 and 55P03, and both read these fields through their driver.

mod common;

use std::thread;

use common::{ok, test_db, wait_until_blocked, TestDb};
use postgres::error::{DbError, ErrorPosition};
use postgres::Client;

fn db() -> &'static TestDb {
    test_db(
        "error_fields",
        "CREATE TABLE members (id int PRIMARY KEY, email text CONSTRAINT members_email_key UNIQUE,
                               version int CONSTRAINT version_below_100 CHECK (version < 100));
         INSERT INTO members VALUES (1, 'a@example.com', 1), (2, 'b@example.com', 1);
         CREATE FUNCTION refuse_quota() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           RAISE EXCEPTION 'quota exceeded' USING ERRCODE = 'Q0001', DETAIL = 'quota 100', HINT = 'wait';
         END $$;",
    )
}

/// Every field a driver reads, but the statement's position and the server's source
/// location, which name where the error was raised, not what it is.
#[derive(Debug, PartialEq, Eq)]
struct Fields {
    severity: String,
    code: String,
    message: String,
    detail: Option<String>,
    hint: Option<String>,
    schema: Option<String>,
    table: Option<String>,
    column: Option<String>,
    datatype: Option<String>,
    constraint: Option<String>,
    context: Option<String>,
    /// The statement an error names beside the caller's own (QUERY in psql), with its position.
    internal_query: Option<String>,
}

impl Fields {
    fn of(error: &DbError) -> Fields {
        Fields {
            severity: error.severity().to_string(),
            code: error.code().code().to_string(),
            message: error.message().to_string(),
            detail: error.detail().map(str::to_string),
            hint: error.hint().map(str::to_string),
            schema: error.schema().map(str::to_string),
            table: error.table().map(str::to_string),
            column: error.column().map(str::to_string),
            datatype: error.datatype().map(str::to_string),
            constraint: error.constraint().map(str::to_string),
            context: error.where_().map(str::to_string),
            internal_query: match error.position() {
                Some(ErrorPosition::Internal { query, .. }) => Some(query.clone()),
                _ => None,
            },
        }
    }
}

/// The fields of the error `sql` raises, in a transaction rolled back afterwards.
fn error_of(client: &mut Client, setup: &str, sql: &str) -> Fields {
    ok(client.batch_execute("BEGIN"), "BEGIN");
    ok(client.batch_execute(setup), "setup");
    let error = match client.batch_execute(sql) {
        Ok(()) => panic!("{sql}: expected an error"),
        Err(e) => Fields::of(e.as_db_error().unwrap_or_else(|| panic!("{sql}: not a server error: {e}"))),
    };
    ok(client.batch_execute("ROLLBACK"), "ROLLBACK");
    error
}

/// Asserts that the extension's call and the hand-written statement raise the same error,
/// both ways, and returns it.
#[track_caller]
fn same_error(setup: &str, ours: &str, theirs: &str) -> Fields {
    let mut client = db().connect("error-fields");
    let expected = error_of(&mut client, setup, theirs);
    for direct in ["on", "off"] {
        let setup = format!("SET LOCAL idempotency.direct_writes = {direct}; {setup}");
        assert_eq!(
            error_of(&mut client, &setup, ours),
            expected,
            "{ours} with direct writes {direct}, against {theirs}"
        );
    }
    expected
}

#[test]
fn a_unique_violation_names_its_schema_table_and_constraint() {
    let error = same_error(
        "",
        r#"SELECT idem_versioned_update('members', '{"id": 2}', '{"email": "a@example.com", "version": 2}')"#,
        "UPDATE members SET email = 'a@example.com', version = 2 WHERE id = 2 AND (version IS NULL OR version < 2)",
    );
    assert_eq!((error.code.as_str(), error.constraint.as_deref()), ("23505", Some("members_email_key")));
    assert_eq!((error.schema.as_deref(), error.table.as_deref()), (Some("public"), Some("members")));
}

#[test]
fn a_check_violation_names_its_constraint_and_the_failing_row() {
    let error = same_error(
        "",
        r#"SELECT idem_versioned_update('members', '{"id": 2}', '{"version": 100}')"#,
        "UPDATE members SET version = 100 WHERE id = 2 AND (version IS NULL OR version < 100)",
    );
    assert_eq!((error.code.as_str(), error.constraint.as_deref()), ("23514", Some("version_below_100")));
    assert_eq!(error.detail.as_deref(), Some("Failing row contains (2, b@example.com, 100)."));
}

#[test]
fn a_triggers_own_sqlstate_detail_hint_and_context_pass_through() {
    let ledger =
        "CREATE TRIGGER quota BEFORE INSERT ON idempotency.ledger FOR EACH ROW EXECUTE FUNCTION refuse_quota();";
    let error = same_error(
        ledger,
        "SELECT idem_claim('quota-1')",
        "INSERT INTO idempotency.ledger (key_digest, scope_id) VALUES (idem_digest('quota-1'), idem_scope_id('default'))
         ON CONFLICT (key_digest) DO NOTHING",
    );
    assert_eq!(
        (error.code.as_str(), error.detail.as_deref(), error.hint.as_deref()),
        ("Q0001", Some("quota 100"), Some("wait"))
    );
    assert_eq!(error.context.as_deref(), Some("PL/pgSQL function refuse_quota() line 3 at RAISE"));

    let target = "CREATE TRIGGER quota BEFORE UPDATE ON members FOR EACH ROW EXECUTE FUNCTION refuse_quota();";
    same_error(
        target,
        r#"SELECT idem_versioned_update('members', '{"id": 1}', '{"version": 5}')"#,
        "UPDATE members SET version = 5 WHERE id = 1 AND (version IS NULL OR version < 5)",
    );
}

/// An error raised while the extension's own statement is parsed names no statement of ours:
/// the hand-written INSERT has no internal query, and the claim's error has none either.
#[test]
fn a_claim_naming_a_renamed_column_fails_as_its_insert_does() {
    let error = same_error(
        "ALTER TABLE idempotency.ledger RENAME COLUMN fingerprint TO fp;",
        r#"SELECT idem_claim('renamed-column', payload => '{"n": 1}')"#,
        "INSERT INTO idempotency.ledger (key_digest, scope_id, fingerprint)
         VALUES (idem_digest('renamed-column'), idem_scope_id('default'), idem_fingerprint('{\"n\": 1}'))
         ON CONFLICT (key_digest) DO NOTHING",
    );
    assert_eq!((error.code.as_str(), error.internal_query.as_deref()), ("42703", None));
}

/// A claim waiting for another transaction's uncommitted claim, ended by `end` from a third
/// session, with direct writes on, off, and as the hand-written INSERT ended the same way:
/// the same error, fields and CONTEXT ("while checking … in relation "ledger"") included.
fn waiting_claim_error(key: &str, end: &str) -> Vec<Fields> {
    let db = db();
    let mut holder = db.session("fields-holder");
    let mut observer = db.connect("fields-observer");
    ok(holder.client.batch_execute("BEGIN"), "holder BEGIN");
    ok(holder.client.execute("SELECT idem_claim($1)", &[&key]), "holder claims");
    let hand_written = format!(
        "INSERT INTO idempotency.ledger (key_digest, scope_id) VALUES (idem_digest('{key}'), idem_scope_id('default'))
         ON CONFLICT (key_digest) DO NOTHING"
    );
    let ours = format!("SELECT idem_claim('{key}')");
    let mut outcomes = Vec::new();
    for (direct, sql) in [("on", &ours), ("off", &ours), ("on", &hand_written)] {
        let mut waiter = db.session("fields-waiter");
        ok(waiter.client.batch_execute(&format!("SET idempotency.direct_writes = {direct}")), "direct_writes");
        if end == "lock_timeout" {
            ok(waiter.client.batch_execute("SET lock_timeout = '100ms'"), "lock_timeout");
        }
        let error = thread::scope(|s| {
            let client = &mut waiter.client;
            let handle = s.spawn(move || client.batch_execute(sql));
            if end == "cancel" {
                wait_until_blocked(&mut observer, waiter.pid, holder.pid, || handle.is_finished());
                ok(observer.execute("SELECT pg_cancel_backend($1)", &[&waiter.pid]), "cancel");
            }
            let result = handle.join().expect("the waiter does not panic");
            Fields::of(result.expect_err("the wait ends in an error").as_db_error().expect("a server error"))
        });
        outcomes.push(error);
    }
    ok(holder.client.batch_execute("ROLLBACK"), "holder ROLLBACK");
    outcomes
}

#[test]
fn a_lock_timeout_while_waiting_for_a_claim_is_the_statements() {
    let [direct, statement, hand] =
        <[Fields; 3]>::try_from(waiting_claim_error("waited-out", "lock_timeout")).expect("three ways");
    assert_eq!((&direct, &statement), (&hand, &hand));
    assert_eq!(hand.code, "55P03");
}

#[test]
fn a_cancelled_wait_for_a_claim_is_the_statements() {
    let [direct, statement, hand] =
        <[Fields; 3]>::try_from(waiting_claim_error("cancelled", "cancel")).expect("three ways");
    assert_eq!((&direct, &statement), (&hand, &hand));
    assert_eq!(hand.code, "57014");
}

/// Where the server raised an error: source file, line and routine. Drivers pass them on
/// (psycopg's `diag.source_function`, JDBC's `ServerErrorMessage.getRoutine`), and error
/// trackers group by them.
type Source = (Option<String>, Option<u32>, Option<String>);

/// The error `sql` raises in a REPEATABLE READ transaction whose snapshot predates the
/// commit of `change`, with direct writes `direct`.
fn after_snapshot(direct: &str, change: &str, sql: &str) -> (Fields, Source) {
    let mut t1 = db().connect("serialization-t1");
    let mut t2 = db().connect("serialization-t2");
    ok(
        t2.batch_execute(&format!(
            "SET idempotency.direct_writes = {direct}; BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1"
        )),
        "T2 takes its snapshot",
    );
    ok(t1.batch_execute(change), change);
    let error = t2.batch_execute(sql).expect_err("a serialization failure");
    let error = error.as_db_error().expect("a server error");
    let source = (error.file().map(str::to_string), error.line(), error.routine().map(str::to_string));
    ok(t2.batch_execute("ROLLBACK"), "T2 ROLLBACK");
    (Fields::of(error), source)
}

/// The hand-written statement and the extension's call, direct writes on and off, each in a
/// transaction whose snapshot predates a concurrent change: the same 40001, raised at the
/// same place in PostgreSQL's source. `case(i)` gives the i-th run its own (change, ours,
/// theirs), as each run's change commits.
fn same_serialization_failure(case: impl Fn(usize) -> (String, String, String)) {
    let (change, _, theirs) = case(0);
    let expected = after_snapshot("on", &change, &theirs);
    assert_eq!(expected.0.code, "40001", "{theirs}");
    for (i, direct) in [(1, "on"), (2, "off")] {
        let (change, ours, _) = case(i);
        assert_eq!(after_snapshot(direct, &change, &ours), expected, "{ours} with direct writes {direct}");
    }
}

/// A claim of `key` committed after the snapshot, then `ours` (with `{key}` for the key).
fn claim_after(key: &str, ours: &str) {
    same_serialization_failure(|i| {
        let key = format!("{key}-{i}");
        (
            format!("SELECT idem_claim('{key}')"),
            ours.replace("{key}", &key),
            format!(
                "INSERT INTO idempotency.ledger (key_digest, scope_id) VALUES (idem_digest('{key}'), idem_scope_id('default'))
                 ON CONFLICT (key_digest) DO NOTHING"
            ),
        )
    });
}

#[test]
fn a_claim_committed_after_the_snapshot_fails_where_the_insert_fails() {
    claim_after("serialization-claim", "SELECT idem_claim('{key}')");
}

/// The batch's keys whose digests sort before the conflicting one's are claimed directly; the
/// statement takes the rest, and raises.
#[test]
fn a_batch_claim_committed_after_the_snapshot_fails_where_the_insert_fails() {
    claim_after("serialization-batch", "SELECT idem_claim_many(ARRAY['{key}-a', '{key}', '{key}-z'])");
}

#[test]
fn a_send_committed_after_the_snapshot_fails_where_the_insert_fails() {
    same_serialization_failure(|i| {
        let key = format!("serialization-send-{i}");
        let send = format!("SELECT idem_send('orders', '{{}}', key => '{key}')");
        (
            send.clone(),
            send,
            format!(
                "INSERT INTO idempotency.outbox (seq, id, topic, ordering_key, payload, headers)
                 VALUES (nextval('idempotency.outbox_seq'), idem_message_id('{key}', n => 0), 'orders', NULL, '{{}}', NULL)
                 ON CONFLICT (id) DO NOTHING"
            ),
        )
    });
}

/// A row of `members` of its own for run `i` of `test`, committed before T2's snapshot.
fn member(test: usize, i: usize) -> i32 {
    let id = 1000 + 10 * test as i32 + i as i32;
    let mut client = db().connect("serialization-setup");
    ok(client.execute("INSERT INTO members (id, version) VALUES ($1, 1)", &[&id]), "a member");
    id
}

/// A versioned update of its own row of `members`, which `change` (with `{id}` for the row)
/// changed after the snapshot.
fn versioned_update_after(test: usize, change: &str) {
    same_serialization_failure(|i| {
        let id = member(test, i);
        (
            change.replace("{id}", &id.to_string()),
            format!(r#"SELECT idem_versioned_update('members', '{{"id": {id}}}', '{{"version": 50}}')"#),
            format!("UPDATE members SET version = 50 WHERE id = {id} AND (version IS NULL OR version < 50)"),
        )
    });
}

#[test]
fn a_versioned_update_of_a_row_updated_after_the_snapshot_fails_where_the_update_fails() {
    versioned_update_after(0, "UPDATE members SET version = 2 WHERE id = {id}");
}

#[test]
fn a_versioned_update_of_a_row_deleted_after_the_snapshot_fails_where_the_update_fails() {
    versioned_update_after(1, "DELETE FROM members WHERE id = {id}");
}

#[test]
fn a_watermark_advanced_after_the_snapshot_fails_where_the_update_fails() {
    same_serialization_failure(|i| {
        let stream = format!("serialization-{i}");
        let mut client = db().connect("serialization-setup");
        ok(client.execute("SELECT idem_watermark_advance($1, 'p', 1)", &[&stream]), "the first position");
        (
            format!("SELECT idem_watermark_advance('{stream}', 'p', 2)"),
            format!("SELECT idem_watermark_advance('{stream}', 'p', 3)"),
            format!(
                "UPDATE idempotency.watermarks SET position = 3, advanced_at = now()
                 WHERE stream = '{stream}' AND partition = 'p' AND position < 3"
            ),
        )
    });
}

/// The role the revoke tests take privileges from.
const REVOKED: &str = "fields_revoked";

/// The error of `sql`, run as REVOKED inside a transaction that ran `warm` (so that plans are
/// kept and tables locked) before another session committed `revoke`.
fn after_revoke(direct: &str, warm: &str, revoke: &str, sql: &str) -> Fields {
    let mut admin = db().connect("revoke-admin");
    ok(
        admin.batch_execute(&format!(
            "DO $$ BEGIN CREATE ROLE {REVOKED}; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             GRANT USAGE ON SCHEMA idempotency TO {REVOKED};
             GRANT SELECT, INSERT, UPDATE ON idempotency.ledger TO {REVOKED};
             GRANT SELECT, UPDATE ON members TO {REVOKED};"
        )),
        "grants",
    );
    let mut consumer = db().connect("revoke-consumer");
    ok(
        consumer.batch_execute(&format!("SET idempotency.direct_writes = {direct}; SET ROLE {REVOKED}; BEGIN; {warm}")),
        warm,
    );
    ok(admin.batch_execute(revoke), revoke);
    let error = consumer.batch_execute(sql).expect_err("refused after the revoke");
    ok(consumer.batch_execute("ROLLBACK"), "ROLLBACK");
    Fields::of(error.as_db_error().expect("a server error"))
}

/// A REVOKE another session commits while a consumer's transaction is open counts from the
/// consumer's next call, as it does from its next hand-written statement, on both paths.
/// `case(i)` gives run i its (warm-up ours, warm-up by hand, revoke, ours, by hand).
fn same_error_after_revoke(case: impl Fn(usize) -> [String; 5]) {
    let [_, warm, revoke, _, theirs] = case(0);
    let expected = after_revoke("on", &warm, &revoke, &theirs);
    assert_eq!(expected.code, "42501", "{theirs}");
    for (i, direct) in [(1, "on"), (2, "off")] {
        let [warm, _, revoke, ours, _] = case(i);
        assert_eq!(after_revoke(direct, &warm, &revoke, &ours), expected, "{ours} with direct writes {direct}");
    }
}

#[test]
fn a_revoke_committed_meanwhile_refuses_the_next_claim() {
    same_error_after_revoke(|i| {
        let insert = |key: &str| {
            format!(
                "INSERT INTO idempotency.ledger (key_digest, scope_id) VALUES (idem_digest('{key}'), idem_scope_id('default'))
                 ON CONFLICT (key_digest) DO NOTHING"
            )
        };
        [
            format!("SELECT idem_claim('revoked-warm-{i}')"),
            insert(&format!("revoked-warm-{i}")),
            format!("REVOKE INSERT ON idempotency.ledger FROM {REVOKED}"),
            format!("SELECT idem_claim('revoked-{i}')"),
            insert(&format!("revoked-{i}")),
        ]
    });
}

#[test]
fn a_revoke_committed_meanwhile_refuses_the_next_stored_result() {
    same_error_after_revoke(|i| {
        let key = format!("revoked-result-{i}");
        let store = |result: &str| {
            format!("UPDATE idempotency.ledger SET result = '{result}' WHERE key_digest = idem_digest('{key}')")
        };
        [
            format!("SELECT idem_claim('{key}'); SELECT idem_set_result('{key}', '{{}}')"),
            format!("SELECT idem_claim('{key}'); {}", store("{}")),
            format!("REVOKE UPDATE ON idempotency.ledger FROM {REVOKED}"),
            format!(r#"SELECT idem_set_result('{key}', '{{"b": 1}}')"#),
            store(r#"{"b": 1}"#),
        ]
    });
}

#[test]
fn a_revoke_committed_meanwhile_refuses_the_next_versioned_update() {
    same_error_after_revoke(|_| {
        let update = |version: i32| {
            format!("UPDATE members SET version = {version} WHERE id = 2 AND (version IS NULL OR version < {version})")
        };
        [
            r#"SELECT idem_versioned_update('members', '{"id": 2}', '{"version": 2}')"#.to_string(),
            update(2),
            format!("REVOKE UPDATE ON members FROM {REVOKED}"),
            r#"SELECT idem_versioned_update('members', '{"id": 2}', '{"version": 3}')"#.to_string(),
            update(3),
        ]
    });
}
