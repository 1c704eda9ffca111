//! The extension's objects handed to a role that is not a superuser (`REASSIGN OWNED`, as a
//! DBA does when the role that created them goes). The purge seals buckets as the ledger's
//! owner, reading `pg_stat_activity` for the oldest transaction still running; a role sees
//! other roles' transactions there only with the privileges of `pg_read_all_stats`, which a
//! member that does not inherit them (a `NOINHERIT` role; from PostgreSQL 16 on, a grant
//! `WITH INHERIT FALSE`, the default for such a role) has as a membership alone.

mod common;

use common::{bucket_ending_now, config, count, describe, ok, sealed_after_bucket_pass, test_db, TestDb};
use postgres::{Client, NoTls};

const OWNER: &str = "idem_client_ledger_owner";
const OWNER_PASSWORD: &str = "idem-client-ledger-owner";

/// The roles are the cluster's: the creator is gone once the owner has its objects; the
/// owner stays (owning this database's), and can log in only while the test runs.
fn db() -> &'static TestDb {
    test_db(
        "ledger_owner",
        "DO $$ BEGIN CREATE ROLE idem_client_ledger_creator SUPERUSER NOLOGIN; \
                EXCEPTION WHEN duplicate_object THEN NULL; END $$; \
         DO $$ BEGIN CREATE ROLE idem_client_ledger_owner; \
                EXCEPTION WHEN duplicate_object THEN NULL; END $$; \
         ALTER ROLE idem_client_ledger_owner LOGIN PASSWORD 'idem-client-ledger-owner'; \
         DROP EXTENSION idempotency; \
         SET ROLE idem_client_ledger_creator; CREATE EXTENSION idempotency; RESET ROLE; \
         REASSIGN OWNED BY idem_client_ledger_creator TO idem_client_ledger_owner; \
         DROP OWNED BY idem_client_ledger_creator; DROP ROLE idem_client_ledger_creator",
    )
}

/// A session of the owner itself, whose transactions it sees whatever its privileges.
fn connect_as_owner(label: &str) -> Client {
    let mut config = config(&db().name, label);
    config.user(OWNER).password(OWNER_PASSWORD);
    config.connect(NoTls).unwrap_or_else(|e| panic!("cannot connect as {OWNER}: {}", describe(&e)))
}

/// Whether the owner inherits pg_read_all_stats's privileges. From PostgreSQL 16 on a grant
/// keeps the inheritance it was made with (the role's attribute then), so it is made again.
fn inherit(c: &mut Client, yes: bool) {
    let attribute = if yes { "INHERIT" } else { "NOINHERIT" };
    ok(
        c.batch_execute(&format!(
            "ALTER ROLE {OWNER} {attribute}; \
             REVOKE pg_read_all_stats FROM {OWNER}; GRANT pg_read_all_stats TO {OWNER}"
        )),
        &format!("the owner {attribute}"),
    );
    let usage = count(c, &format!("SELECT pg_has_role('{OWNER}', 'pg_read_all_stats', 'USAGE')::int::int8"));
    assert_eq!(usage, i64::from(yes), "the owner has pg_read_all_stats's privileges: {yes}");
}

/// Guarantee: a bucket is sealed only once its owner can see that no transaction that began
/// before the bucket ended is still running. A member of `pg_read_all_stats` that does not
/// inherit its privileges sees NULL for another role's transaction start, so its buckets are
/// never sealed (claims search them instead of a filter: slower, never wrong); with the
/// privileges inherited they are sealed once the older transaction ends, and not before.
#[test]
fn an_owner_that_cannot_see_every_transaction_never_seals() {
    let mut c = db().connect("ledger-owner-sealer");
    assert_eq!(
        count(&mut c, "SELECT count(*) FROM pg_class WHERE oid = 'idempotency.ledger'::regclass AND relowner = 'idem_client_ledger_owner'::regrole"),
        1,
        "the ledger belongs to {OWNER}"
    );
    bucket_ending_now(&mut c, "ledger_owner_test", Some(OWNER));
    inherit(&mut c, false);
    let mut older = db().connect("ledger-owner-older");
    let sealed = |c: &mut Client| sealed_after_bucket_pass(c, "ledger_owner_test");
    let ends_now = |c: &mut Client| {
        ok(
            c.batch_execute(
                "UPDATE idempotency.ledger_buckets SET ends_at = clock_timestamp() WHERE bucket = 'ledger_owner_test'",
            ),
            "the bucket ends now",
        )
    };

    ok(older.batch_execute("BEGIN; SELECT 1"), "a superuser's transaction, begun before the bucket ends");
    ends_now(&mut c);
    // The owner's own sessions it sees: one whose transaction began after the bucket ended
    // is the oldest it knows of.
    let mut younger = connect_as_owner("ledger-owner-younger");
    ok(younger.batch_execute("BEGIN; SELECT 1"), "the owner's transaction, begun after the bucket ended");
    assert_eq!(sealed(&mut c), 0, "the owner cannot see the older transaction, which may still claim into the bucket");
    ok(older.batch_execute("COMMIT"), "the older transaction ends");
    assert_eq!(sealed(&mut c), 0, "nor can it know that none is left: it never seals");
    ok(younger.batch_execute("COMMIT"), "the owner's transaction ends");

    inherit(&mut c, true);
    ok(older.batch_execute("BEGIN; SELECT 1"), "another older transaction");
    ends_now(&mut c);
    assert_eq!(sealed(&mut c), 0, "the owner now sees the older transaction, which may still claim");
    ok(older.batch_execute("COMMIT"), "the older transaction ends");
    assert_eq!(sealed(&mut c), 1, "no older transaction is left: sealed");
    inherit(&mut c, false);
    ok(c.batch_execute(&format!("ALTER ROLE {OWNER} NOLOGIN")), "the owner without a login again");
}
