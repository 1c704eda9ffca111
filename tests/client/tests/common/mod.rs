//! Shared plumbing for the client-driven tests: connections built from the libpq
//! environment, one fresh database per test file, bounded synchronisation, and a way to
//! know for certain that a session is blocked on a lock before the test acts.
//!
//! Every wait in these tests is bounded by [`WAIT_LIMIT`] and ends in a panic, so a broken
//! guarantee shows up as a failing test, never as a hung CI job.

#![allow(dead_code)] // each test file uses a different subset of the helpers

use std::env;
use std::fmt::Debug;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use postgres::types::ToSql;
use postgres::{Client, Config, NoTls};

/// The longest any test waits for anything (a peer at a barrier, a session to block, a
/// blocked call to return) before it gives up with a panic.
pub const WAIT_LIMIT: Duration = Duration::from_secs(30);

/// How often the lock-wait pollers look at pg_stat_activity / pg_locks.
const POLL_EVERY: Duration = Duration::from_millis(5);

// --- connections ----------------------------------------------------------------------

fn env_or(name: &str, default: &str) -> String {
    env::var(name).ok().filter(|v| !v.is_empty()).unwrap_or_else(|| default.to_string())
}

/// A connection config from the standard libpq variables (PGHOST, PGPORT, PGUSER,
/// PGPASSWORD; defaults 127.0.0.1:5432 as postgres), so the same tests run against the
/// developer's server and inside `pg_virtualenv` in CI. A PGHOST starting with '/' is a
/// Unix-socket directory.
pub fn config(dbname: &str, application_name: &str) -> Config {
    let mut config = Config::new();
    for host in env_or("PGHOST", "127.0.0.1").split(',') {
        config.host(host);
    }
    for port in env_or("PGPORT", "5432").split(',') {
        config.port(port.trim().parse().unwrap_or_else(|_| panic!("PGPORT {port:?} is not a port number")));
    }
    config.user(&env_or("PGUSER", "postgres"));
    if let Ok(password) = env::var("PGPASSWORD") {
        config.password(password);
    }
    config.dbname(dbname);
    config.application_name(application_name);
    config.connect_timeout(WAIT_LIMIT);
    // A safety net, not a synchronisation: if a test fails while another session is blocked
    // behind a transaction the failing thread holds, the blocked statement still ends, so
    // the test reports its failure instead of hanging. Longer than every bounded wait.
    config.options("-c statement_timeout=90s");
    config
}

/// A session on the cluster's admin database (PGDATABASE, else postgres), outside every
/// test file's database.
pub fn connect_admin(application_name: &str) -> Client {
    connect_to(&env_or("PGDATABASE", "postgres"), application_name)
}

fn connect_to(dbname: &str, application_name: &str) -> Client {
    config(dbname, application_name)
        .connect(NoTls)
        .unwrap_or_else(|e| panic!("cannot connect to database {dbname:?}: {}", describe(&e)))
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The database of one test file: created fresh (dropped first if a previous run left it)
/// with the extension installed, then shared by the tests of that file. Tests in one file
/// may run in parallel; they keep apart by using their own keys, scopes and tables.
pub struct TestDb {
    pub name: String,
}

static DB: OnceLock<TestDb> = OnceLock::new();

/// The fresh database `idem_client_<name>` for this test file; `setup` is SQL run once
/// after `CREATE EXTENSION idempotency` (e.g. the business tables).
pub fn test_db(name: &str, setup: &str) -> &'static TestDb {
    let db = DB.get_or_init(|| TestDb::create(name, setup));
    assert_eq!(db.name, format!("idem_client_{name}"), "one test file, one database name");
    db
}

impl TestDb {
    fn create(name: &str, setup: &str) -> TestDb {
        let dbname = format!("idem_client_{name}");
        let mut admin = connect_admin("idem-client-admin");
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", quote_ident(&dbname)))
            .unwrap_or_else(|e| panic!("drop {dbname}: {}", describe(&e)));
        admin
            .batch_execute(&format!("CREATE DATABASE {}", quote_ident(&dbname)))
            .unwrap_or_else(|e| panic!("create {dbname}: {}", describe(&e)));
        let mut db = connect_to(&dbname, "idem-client-setup");
        db.batch_execute("CREATE EXTENSION idempotency")
            .unwrap_or_else(|e| panic!("CREATE EXTENSION idempotency in {dbname}: {}", describe(&e)));
        if !setup.is_empty() {
            db.batch_execute(setup).unwrap_or_else(|e| panic!("setup of {dbname}: {}", describe(&e)));
        }
        TestDb { name: dbname }
    }

    /// A new, independent session (its own backend) on this test file's database. The
    /// label shows up as application_name in pg_stat_activity, which helps when debugging.
    pub fn connect(&self, label: &str) -> Client {
        connect_to(&self.name, label)
    }

    /// A new session, or the error that refused it: a server in crash recovery refuses every
    /// connection until it is consistent again.
    pub fn try_connect(&self, label: &str) -> Result<Client, postgres::Error> {
        config(&self.name, label).connect(NoTls)
    }

    /// A new session and its backend pid.
    pub fn session(&self, label: &str) -> Session {
        let mut client = self.connect(label);
        let pid = backend_pid(&mut client);
        Session { client, pid }
    }
}

/// A client and the pid of the backend serving it.
pub struct Session {
    pub client: Client,
    pub pid: i32,
}

pub fn backend_pid(client: &mut Client) -> i32 {
    client.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0)
}

// --- errors ---------------------------------------------------------------------------

/// The SQLSTATE of a server error, e.g. "40001".
pub fn sqlstate(error: &postgres::Error) -> Option<&str> {
    error.code().map(|c| c.code())
}

/// An error with its SQLSTATE, message and detail, for panic messages.
pub fn describe(error: &postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!(
            "{} {}: {}{}",
            db.severity(),
            db.code().code(),
            db.message(),
            db.detail().map(|d| format!(" (DETAIL: {d})")).unwrap_or_default()
        ),
        None => format!("{error}"),
    }
}

/// Asserts that `result` is the server error `code` and returns it.
#[track_caller]
pub fn expect_sqlstate<T: Debug>(result: Result<T, postgres::Error>, code: &str, what: &str) -> postgres::Error {
    match result {
        Ok(value) => panic!("{what}: expected SQLSTATE {code}, but it succeeded with {value:?}"),
        Err(e) => {
            assert_eq!(sqlstate(&e), Some(code), "{what}: expected SQLSTATE {code}, got {}", describe(&e));
            e
        }
    }
}

/// Unwraps a result, showing the SQLSTATE and message of a server error.
#[track_caller]
pub fn ok<T>(result: Result<T, postgres::Error>, what: &str) -> T {
    result.unwrap_or_else(|e| panic!("{what}: {}", describe(&e)))
}

// --- the API under test -----------------------------------------------------------------

fn one_bool(client: &mut Client, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<bool, postgres::Error> {
    let row = client.query_one(sql, params)?;
    Ok(row.get::<_, Option<bool>>(0).unwrap_or_else(|| panic!("{sql} returned NULL")))
}

/// `idem_claim(key)` in the default scope.
pub fn claim(client: &mut Client, key: &str) -> Result<bool, postgres::Error> {
    one_bool(client, "SELECT idem_claim($1)", &[&key])
}

/// `idem_claim(key, scope, payload)`; the payload is JSON text.
pub fn claim_with_payload(client: &mut Client, key: &str, payload: &str) -> Result<bool, postgres::Error> {
    one_bool(client, "SELECT idem_claim($1, 'default', $2::text::jsonb)", &[&key, &payload])
}

/// `idem_claim_nowait(key)` in the default scope.
pub fn claim_nowait(client: &mut Client, key: &str) -> Result<bool, postgres::Error> {
    one_bool(client, "SELECT idem_claim_nowait($1)", &[&key])
}

/// `idem_claim_many(keys, scope)`.
pub fn claim_many(client: &mut Client, keys: &[String], scope: &str) -> Result<Vec<bool>, postgres::Error> {
    let row = client.query_one("SELECT idem_claim_many($1::text[], $2)", &[&keys, &scope])?;
    let answers: Vec<Option<bool>> = row.get(0);
    Ok(answers
        .into_iter()
        .enumerate()
        .map(|(i, a)| a.unwrap_or_else(|| panic!("idem_claim_many returned NULL at position {}", i + 1)))
        .collect())
}

/// How many ledger rows hold (scope 'default', key).
pub fn ledger_rows(client: &mut Client, key: &str) -> i64 {
    client
        .query_one("SELECT count(*) FROM idempotency.ledger WHERE key_digest = idem_digest($1)", &[&key])
        .unwrap()
        .get(0)
}

/// The single number `sql` reads.
pub fn count(client: &mut Client, sql: &str) -> i64 {
    ok(client.query_one(sql, &[]), sql).get(0)
}

/// A bucket `name` of the undeclared scopes' lane that began an hour ago and ends now, owned
/// by `owner` (else by the session's role): the purge's bucket pass seals it once no
/// transaction that began before it ended can still claim into it.
pub fn bucket_ending_now(client: &mut Client, name: &str, owner: Option<&str>) {
    let owned = owner.map(|o| format!("ALTER TABLE idempotency.{name} OWNER TO {o};")).unwrap_or_default();
    ok(
        client.batch_execute(&format!(
            "CREATE TABLE idempotency.{name} (PRIMARY KEY (key_digest)) INHERITS (idempotency.ledger); {owned} \
             INSERT INTO idempotency.ledger_buckets VALUES ('{name}', NULL, now() - interval '1 hour', clock_timestamp()); \
             SELECT idempotency.ledger_layout_changed()"
        )),
        &format!("bucket {name}, which ends now"),
    );
}

/// The purge's bucket pass, then whether bucket `name` is sealed: 1, or 0.
pub fn sealed_after_bucket_pass(client: &mut Client, name: &str) -> i64 {
    ok(client.batch_execute("SELECT idempotency.maintain_ledger_buckets()"), "the purge's bucket pass");
    count(
        client,
        &format!("SELECT count(*) FROM idempotency.ledger_buckets WHERE bucket = '{name}' AND sealed_at IS NOT NULL"),
    )
}

/// Asserts that amcheck finds each of `tables` intact: its heap, and every one of its indexes
/// (btree, each checked against the heap with heapallindexed).
#[track_caller]
pub fn assert_intact(client: &mut Client, tables: &[&str]) {
    for table in tables {
        let indexes: Vec<String> = ok(
            client
                .query("SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = $1::text::regclass", &[table]),
            &format!("the indexes of {table}"),
        )
        .iter()
        .map(|r| r.get(0))
        .collect();
        // Every checked table has one, so an empty list means the query missed them.
        assert!(!indexes.is_empty(), "{table} has no index to check");
        for index in &indexes {
            ok(
                client.execute("SELECT bt_index_check($1::text::regclass, true)", &[index]),
                &format!("bt_index_check {index}"),
            );
        }
        let corrupt = ok(
            client.query("SELECT * FROM verify_heapam($1::text::regclass)", &[table]),
            &format!("verify_heapam {table}"),
        );
        assert!(corrupt.is_empty(), "verify_heapam({table}) reports {} problems", corrupt.len());
    }
}

// --- deterministic "randomness" -----------------------------------------------------------

/// A 64-bit LCG (Knuth's MMIX constants), so every run makes the same "random" choices and a
/// failure can be replayed.
pub struct Lcg(u64);

impl Lcg {
    pub fn new(seed: u64) -> Self {
        Lcg(seed)
    }

    /// The next number below `bound`.
    pub fn below(&mut self, bound: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        // The high bits are the well-mixed ones.
        (self.0 >> 33) % bound
    }
}

/// A deterministic permutation of `items` (Fisher-Yates driven by [`Lcg`]).
pub fn shuffled<T>(mut items: Vec<T>, seed: u64) -> Vec<T> {
    let mut lcg = Lcg::new(seed);
    for i in (1..items.len()).rev() {
        let j = lcg.below(i as u64 + 1) as usize;
        items.swap(i, j);
    }
    items
}

// --- synchronisation ---------------------------------------------------------------------

/// A reusable barrier whose wait gives up (panics) after [`WAIT_LIMIT`], so that one
/// panicking thread fails the test instead of leaving its peers waiting forever.
pub struct Barrier {
    parties: usize,
    state: Mutex<(usize, u64)>, // (arrived in this generation, generation)
    turned: Condvar,
}

impl Barrier {
    pub fn new(parties: usize) -> Self {
        Barrier { parties, state: Mutex::new((0, 0)), turned: Condvar::new() }
    }

    pub fn wait(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let generation = state.1;
        state.0 += 1;
        if state.0 == self.parties {
            *state = (0, generation + 1);
            self.turned.notify_all();
            return;
        }
        let deadline = Instant::now() + WAIT_LIMIT;
        while state.1 == generation {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "barrier: peers did not arrive within {WAIT_LIMIT:?}");
            state = self.turned.wait_timeout(state, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

/// What pg_stat_activity and pg_locks say about one backend right now.
#[derive(Debug)]
pub struct LockWait {
    pub wait_event_type: Option<String>,
    pub wait_event: Option<String>,
    /// pids that pg_blocking_pids() reports as blocking it.
    pub blocked_by: Vec<i32>,
    /// Its ungranted locks in pg_locks, as "locktype mode".
    pub waiting_for: Vec<String>,
}

pub fn lock_wait(observer: &mut Client, pid: i32) -> LockWait {
    let row = observer
        .query_one(
            "SELECT a.wait_event_type, a.wait_event, pg_blocking_pids(a.pid), \
                    ARRAY(SELECT l.locktype || ' ' || l.mode FROM pg_locks l \
                          WHERE l.pid = a.pid AND NOT l.granted) \
             FROM pg_stat_activity a WHERE a.pid = $1",
            &[&pid],
        )
        .unwrap_or_else(|e| panic!("pg_stat_activity has no backend {pid}: {}", describe(&e)));
    LockWait { wait_event_type: row.get(0), wait_event: row.get(1), blocked_by: row.get(2), waiting_for: row.get(3) }
}

impl LockWait {
    /// Waiting on a heavyweight lock (wait_event_type = 'Lock', an ungranted row in
    /// pg_locks) that `holder` holds.
    pub fn is_blocked_by(&self, holder: i32) -> bool {
        self.wait_event_type.as_deref() == Some("Lock")
            && !self.waiting_for.is_empty()
            && self.blocked_by.contains(&holder)
    }
}

/// Returns once backend `waiter` is waiting on a lock held by backend `holder`. Panics if
/// `finished()` says the waiting call already returned (it did not block, which is itself
/// the failure), or after [`WAIT_LIMIT`].
#[track_caller]
pub fn wait_until_blocked(observer: &mut Client, waiter: i32, holder: i32, finished: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT_LIMIT;
    loop {
        let state = lock_wait(observer, waiter);
        if state.is_blocked_by(holder) {
            return;
        }
        assert!(!finished(), "backend {waiter} was expected to block on backend {holder}, but its call returned first");
        assert!(
            Instant::now() < deadline,
            "backend {waiter} did not block on backend {holder} within {WAIT_LIMIT:?}; last seen: {state:?}"
        );
        std::thread::sleep(POLL_EVERY);
    }
}

/// Asserts that backend `waiter` is, at this moment, still blocked on `holder` and its
/// call has not returned.
#[track_caller]
pub fn assert_still_blocked(observer: &mut Client, waiter: i32, holder: i32, finished: impl Fn() -> bool) {
    let state = lock_wait(observer, waiter);
    assert!(!finished(), "backend {waiter}'s blocked call returned while {holder} still held the key");
    assert!(state.is_blocked_by(holder), "backend {waiter} is no longer blocked on {holder}: {state:?}");
}

/// Waits (bounded) until `finished()` is true, e.g. for a thread's blocked call to return
/// after the test released what it waited for.
#[track_caller]
pub fn wait_until(what: &str, mut finished: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT_LIMIT;
    while !finished() {
        assert!(Instant::now() < deadline, "{what}: still not done after {WAIT_LIMIT:?}");
        std::thread::sleep(POLL_EVERY);
    }
}

/// Joins a scoped thread after waiting (bounded) for it to finish; a panic in the thread
/// is re-raised here with its own message.
#[track_caller]
pub fn join<'scope, T>(what: &str, handle: std::thread::ScopedJoinHandle<'scope, T>) -> T {
    wait_until(what, || handle.is_finished());
    handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Waits (bounded) until backend `pid` has left pg_stat_activity.
#[track_caller]
pub fn wait_until_gone(observer: &mut Client, pid: i32) {
    wait_until(&format!("backend {pid} to exit"), || {
        let n: i64 =
            observer.query_one("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", &[&pid]).unwrap().get(0);
        n == 0
    });
}
