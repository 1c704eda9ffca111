//! Runs a case in three databases and records everything observable about each step.

use std::collections::BTreeMap;
use std::env;

use postgres::error::DbError;
use postgres::{Client, Config, NoTls, SimpleQueryMessage};

use crate::case::{quote_literal, Case, Op, Step};

/// A statistics row's table, with the ledger's inheritance children (its buckets, #13) counted
/// as the ledger: where a claim's row goes is the layout's choice, the same in every way, and
/// the hand-written INSERT on the ledger stands for all of them.
const LEDGER_AS_ONE: &str = "CASE WHEN relid IN (SELECT i.inhrelid FROM pg_inherits AS i \
                               WHERE i.inhparent = 'idempotency.ledger'::regclass) THEN 'ledger' ELSE relname END";

const AUTOVACUUM_OFF: &str = "DO $$ DECLARE t regclass; BEGIN \
                                FOR t IN SELECT c.oid FROM pg_class AS c \
                                          WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind = 'r' \
                                            AND NOT coalesce(c.reloptions && '{autovacuum_enabled=off,autovacuum_enabled=false}', false) LOOP \
                                  EXECUTE format('ALTER TABLE %s SET (autovacuum_enabled = off)', t); \
                                END LOOP; END $$";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Way {
    Direct,
    Statement,
    Hand,
}

impl Way {
    pub const ALL: [Way; 3] = [Way::Direct, Way::Statement, Way::Hand];

    pub fn name(self) -> &'static str {
        match self {
            Way::Direct => "direct",
            Way::Statement => "statement",
            Way::Hand => "hand",
        }
    }

    fn setting(self) -> Option<&'static str> {
        match self {
            Way::Direct => Some("on"),
            Way::Statement => Some("off"),
            Way::Hand => None,
        }
    }
}

/// What one way observed: "NN what" → value, so traces line up step by step.
pub type Trace = BTreeMap<String, Observed>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub value: String,
    /// Compared between the two ways of the extension only (the raw CONTEXT).
    pub extension_only: bool,
}

/// The connections of one way: `main` runs the steps (session 1), `second` is session 2 of a
/// concurrent case, and `aux` resets, prepares the hand-written SQL and observes as the
/// superuser, so that nothing it does touches the sessions' transactions or snapshots.
pub struct Db {
    pub way: Way,
    dbname: String,
    main: Client,
    second: Client,
    aux: Client,
    /// The ledger's definition was changed by the last case.
    ledger_changed: bool,
}

fn env_or(name: &str, default: &str) -> String {
    env::var(name).ok().filter(|v| !v.is_empty()).unwrap_or_else(|| default.to_string())
}

/// A connection from the libpq environment (pg_virtualenv sets it).
pub fn connect(dbname: &str) -> Result<Client, String> {
    let mut config = Config::new();
    for host in env_or("PGHOST", "127.0.0.1").split(',') {
        config.host(host);
    }
    config.port(env_or("PGPORT", "5432").parse().map_err(|_| "PGPORT is not a port number".to_string())?);
    config.user(&env_or("PGUSER", "postgres"));
    if let Ok(password) = env::var("PGPASSWORD") {
        config.password(password);
    }
    config.dbname(dbname);
    config.application_name("differential");
    // Every step runs in UTC with ISO dates so that the three ways print values alike; the
    // timeouts turn a step that waits by mistake into an error all ways report alike.
    config.options("-c TimeZone=UTC -c DateStyle=ISO -c lock_timeout=3s -c statement_timeout=60s");
    config.connect(NoTls).map_err(|e| format!("cannot connect to {dbname}: {e}"))
}

/// The first value of the first row, or the rows a command affected.
enum Answer {
    Value(Option<String>),
    Rows(u64),
}

fn run(client: &mut Client, sql: &str) -> Result<Answer, postgres::Error> {
    let messages = client.simple_query(sql)?;
    for message in &messages {
        if let SimpleQueryMessage::Row(row) = message {
            return Ok(Answer::Value(row.get(0).map(str::to_string)));
        }
    }
    let rows =
        messages
            .iter()
            .rev()
            .find_map(|m| if let SimpleQueryMessage::CommandComplete(n) = m { Some(*n) } else { None });
    Ok(Answer::Rows(rows.unwrap_or(0)))
}

/// Every row, each value as text (NULL as None).
fn rows(client: &mut Client, sql: &str) -> Result<Vec<Vec<Option<String>>>, postgres::Error> {
    Ok(client
        .simple_query(sql)?
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(row) => Some((0..row.len()).map(|i| row.get(i).map(str::to_string)).collect()),
            _ => None,
        })
        .collect())
}

fn value(client: &mut Client, sql: &str) -> Result<String, postgres::Error> {
    match run(client, sql)? {
        Answer::Value(v) => Ok(v.unwrap_or_else(|| "NULL".into())),
        Answer::Rows(n) => Ok(format!("({n} rows)")),
    }
}

/// The extension's function names: a CONTEXT line naming one is the only line the
/// extension's call may add to what the hand-written statement reports.
const OWN_FUNCTIONS: [&str; 5] =
    ["idem_claim", "idem_claim_many", "idem_versioned_update", "idem_versioned_upsert", "idem_send"];

impl Db {
    pub fn open(way: Way) -> Result<Db, String> {
        let dbname = format!("differential_{}", way.name());
        let mut admin = connect(&env_or("PGDATABASE", "postgres"))?;
        // One statement each: DROP and CREATE DATABASE refuse to run in a multi-statement query.
        for sql in [
            format!("DROP DATABASE IF EXISTS {dbname} WITH (FORCE)"),
            format!("CREATE DATABASE {dbname} TEMPLATE template0 ENCODING 'UTF8'"),
            "DO $$ BEGIN CREATE ROLE diff_app; EXCEPTION WHEN duplicate_object THEN NULL; END $$".to_string(),
        ] {
            admin.batch_execute(&sql).map_err(|e| format!("creating {dbname}: {}", describe(&e)))?;
        }
        let mut aux = connect(&dbname)?;
        aux.batch_execute(
            "CREATE EXTENSION amcheck; CREATE EXTENSION idempotency;
             CREATE COLLATION public.ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)",
        )
        .map_err(|e| format!("preparing {dbname}: {}", describe(&e)))?;
        Ok(Db { way, main: connect(&dbname)?, second: connect(&dbname)?, aux, dbname, ledger_changed: false })
    }

    /// A backend that died (a crash restarts them all) is a finding; the next case needs new ones.
    fn reconnect_if_closed(&mut self) -> Result<(), String> {
        if self.main.is_closed() || self.second.is_closed() || self.aux.is_closed() {
            std::thread::sleep(std::time::Duration::from_secs(2));
            self.main = connect(&self.dbname)?;
            self.second = connect(&self.dbname)?;
            self.aux = connect(&self.dbname)?;
            self.ledger_changed = true;
        }
        Ok(())
    }

    /// Each case starts from the same state in every database: no schema t, an empty ledger
    /// and outbox as sql/ makes them, the outbox's sequence at its start, and diff_app
    /// without grants.
    fn reset(&mut self) -> Result<(), String> {
        let ledger = if self.ledger_changed {
            "DROP EXTENSION idempotency CASCADE; CREATE EXTENSION idempotency;"
        } else {
            "TRUNCATE idempotency.ledger, idempotency.outbox, idempotency.watermarks; \
             ALTER SEQUENCE idempotency.outbox_seq RESTART; \
             REVOKE ALL ON idempotency.ledger, idempotency.outbox, idempotency.watermarks FROM diff_app; \
             REVOKE ALL ON SEQUENCE idempotency.outbox_seq FROM diff_app; REVOKE ALL ON SCHEMA idempotency FROM diff_app;"
        };
        // The TRUNCATE's reset of n_live_tup is flushed before aux writes again: PostgreSQL 15
        // keeps a table's pending "truncated" mark only until the backend's next committed
        // write to it (AtEOXact_PgStat_Relations assigns it), so a setup INSERT within a second
        // (before the next unforced flush) dropped it and the previous case's counts carried
        // over, in one way's database and not another's (seen under load on 15-cassert).
        self.aux
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS t CASCADE; {ledger} CREATE SCHEMA t; SELECT pg_stat_force_next_flush()"
            ))
            .map_err(|e| format!("resetting {}: {}", self.dbname, describe(&e)))
    }

    pub fn run_case(&mut self, case: &Case, script: &mut Vec<String>) -> Result<Trace, String> {
        self.reconnect_if_closed()?;
        self.reset()?;
        self.ledger_changed = case.ledger_changed;
        let mut trace = Trace::new();
        let mut times = Vec::new();
        for (i, sql) in case.setup.iter().enumerate() {
            if let Err(e) = self.aux.batch_execute(sql) {
                record(&mut trace, &format!("setup {i:02} error"), describe(&e), false);
            }
        }
        // Autovacuum's ANALYZE replaces a table's n_live_tup with its own count, at a moment of
        // its choosing, different in each way's database (an assert-enabled server's slower
        // steps made one way's count differ): off on the extension's tables and buckets, as
        // on t.tab.
        let _ = self.aux.batch_execute(AUTOVACUUM_OFF);
        // The setup's tuple counts reach the shared statistics before anything reads them.
        let _ = self.aux.batch_execute("SELECT pg_stat_force_next_flush()");
        if case.concurrent {
            self.run_concurrent(case, &mut trace, &mut times, script);
        } else {
            for (n, step) in case.steps.iter().enumerate() {
                self.run_step(n, step, &mut trace, &mut times, script);
                self.observe(&format!("{n:02}"), &mut trace, &times);
            }
        }
        self.reconnect_if_closed()?;
        // An error's detail shows the failing row, whose now() differs per way too.
        for observed in trace.values_mut() {
            observed.value = name_times(&observed.value, &times);
        }
        Ok(trace)
    }

    fn run_step(
        &mut self,
        n: usize,
        step: &Step,
        trace: &mut Trace,
        times: &mut Vec<String>,
        script: &mut Vec<String>,
    ) {
        let label = format!("{n:02}");
        let mut begin = String::from("BEGIN;");
        if let Some(setting) = self.way.setting() {
            begin.push_str(&format!(" SET LOCAL idempotency.direct_writes = {setting};"));
        }
        if step.limited {
            begin.push_str(" SET LOCAL ROLE diff_app;");
        }
        let (statements, shape) = self.statements(&step.op);
        script.push(format!("{begin}\nSAVEPOINT step;\n{};", statements.join(";\n")));
        if let Err(e) = self.main.batch_execute(&begin) {
            record(trace, &format!("{label} begin"), describe(&e), false);
            return;
        }
        if let Ok(t) = value(&mut self.main, "SELECT now()::text") {
            times.push(t);
        }
        let _ = self.main.batch_execute("SAVEPOINT step");
        let outcome = execute(&mut self.main, &statements, &shape);
        if outcome.is_err() {
            let _ = self.main.batch_execute("ROLLBACK TO SAVEPOINT step");
        }
        record_outcome(trace, &label, outcome);
        self.record_transaction(&label, true, trace);
        match self.main.batch_execute("COMMIT") {
            Ok(()) => {}
            Err(e) => record(trace, &format!("{label} commit"), describe(&e), false),
        }
    }

    /// Whether the transaction has an xid and what it did to each table, read inside it before
    /// its COMMIT (pg_stat_xact_* counts only the current transaction).
    fn record_transaction(&mut self, label: &str, main: bool, trace: &mut Trace) {
        let client = if main { &mut self.main } else { &mut self.second };
        let sql = format!(
            "RESET ROLE; SELECT pg_current_xact_id_if_assigned() IS NOT NULL, \
             (SELECT string_agg(format('%s.%s ins=%s upd=%s del=%s hot_upd=%s', schemaname, rel, ins, upd, del, hot_upd), \
                                '; ' ORDER BY schemaname, rel) \
                FROM (SELECT schemaname, {LEDGER_AS_ONE} AS rel, sum(n_tup_ins) AS ins, sum(n_tup_upd) AS upd, \
                             sum(n_tup_del) AS del, sum(n_tup_hot_upd) AS hot_upd \
                        FROM pg_stat_xact_user_tables WHERE schemaname IN ('t', 'idempotency') GROUP BY 1, 2) AS s \
               WHERE rel IN ('tab', 'ledger', 'outbox', 'watermarks')), \
             pg_stat_force_next_flush()"
        );
        match client.simple_query(&sql) {
            Ok(messages) => {
                for message in messages {
                    if let SimpleQueryMessage::Row(row) = message {
                        record(
                            trace,
                            &format!("{label} xid assigned"),
                            row.get(0).unwrap_or("NULL").to_string(),
                            false,
                        );
                        record(trace, &format!("{label} xact stats"), row.get(1).unwrap_or("NULL").to_string(), false);
                    }
                }
            }
            Err(e) => record(trace, &format!("{label} xact stats"), describe(&e), false),
        }
    }

    /// The committed state: every row of t.tab and of the ledger (claim times as the step
    /// that made them), the live and dead tuple counts, and amcheck's verdict on every btree.
    fn observe(&mut self, label: &str, trace: &mut Trace, times: &[String]) {
        let rows = "SELECT (SELECT string_agg(r::text, E'\\n' ORDER BY r::text) FROM t.tab r) || E'\\n--\\n' || \
                    coalesce((SELECT string_agg(l::text, E'\\n' ORDER BY l::text) FROM idempotency.ledger l), '') || \
                    E'\\n--\\n' || coalesce((SELECT string_agg(o::text, E'\\n' ORDER BY o::text) FROM idempotency.outbox o), '') || \
                    E'\\n--\\n' || coalesce((SELECT format('seq %s %s', last_value, is_called) FROM idempotency.outbox_seq), '') || \
                    E'\\n--\\n' || coalesce((SELECT string_agg(w::text, E'\\n' ORDER BY w::text) FROM idempotency.watermarks w), '')";
        let state = value(&mut self.aux, rows).unwrap_or_else(|e| describe(&e));
        record(trace, &format!("{label} rows"), name_times(&state, times), false);
        let counts = format!(
            "SELECT string_agg(format('%s.%s live=%s dead=%s', schemaname, rel, live, dead), '; ' ORDER BY schemaname, rel) \
               FROM (SELECT schemaname, {LEDGER_AS_ONE} AS rel, sum(n_live_tup) AS live, sum(n_dead_tup) AS dead \
                       FROM pg_stat_user_tables WHERE schemaname IN ('t', 'idempotency') GROUP BY 1, 2) AS s \
              WHERE rel IN ('tab', 'ledger', 'outbox', 'watermarks')"
        );
        record(
            trace,
            &format!("{label} tuples"),
            value(&mut self.aux, &counts).unwrap_or_else(|e| describe(&e)),
            false,
        );
        let amcheck =
            "SELECT string_agg(c.relname || bt_index_check(i.indexrelid, true)::text, ', ' ORDER BY c.relname) \
                       FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam \
                       JOIN pg_namespace n ON n.oid = c.relnamespace \
                       WHERE a.amname = 'btree' AND n.nspname IN ('t', 'idempotency') AND i.indisvalid";
        record(
            trace,
            &format!("{label} amcheck"),
            value(&mut self.aux, amcheck).unwrap_or_else(|e| describe(&e)),
            false,
        );
    }

    fn run_concurrent(&mut self, case: &Case, trace: &mut Trace, times: &mut Vec<String>, script: &mut Vec<String>) {
        let mut aborted = [false, false];
        for (n, step) in case.steps.iter().enumerate() {
            let label = format!("{n:02}");
            let session = step.session as usize - 1;
            let (statements, shape) = match &step.op {
                Op::Begin => {
                    let mut begin = vec!["BEGIN ISOLATION LEVEL SERIALIZABLE".to_string()];
                    if let Some(setting) = self.way.setting() {
                        begin.push(format!("SET LOCAL idempotency.direct_writes = {setting}"));
                    }
                    // Takes the snapshot now, and names the claims this session makes.
                    begin.push("SELECT now()::text".into());
                    (begin, Shape::Value)
                }
                Op::Commit => {
                    self.record_transaction(&label, session == 0, trace);
                    (vec!["COMMIT".to_string()], Shape::Value)
                }
                // Before the sessions begin: a transaction of its own, whose now() names the
                // claims it makes.
                op @ Op::Warm { .. } => {
                    let (claims, shape) = self.statements(op);
                    let mut begin = vec!["BEGIN".to_string()];
                    begin.extend(self.way.setting().map(|s| format!("SET LOCAL idempotency.direct_writes = {s}")));
                    begin.push("SELECT now()::text".into());
                    let client = if session == 0 { &mut self.main } else { &mut self.second };
                    if let Ok(time) = execute(client, &begin, &Shape::Value) {
                        times.push(time);
                    }
                    script.push(format!("-- session {}\n{};", step.session, begin.join(";\n")));
                    (claims.into_iter().chain(["COMMIT".to_string()]).collect(), shape)
                }
                op => self.statements(op),
            };
            script.push(format!("-- session {}\n{};", step.session, statements.join(";\n")));
            let client = if session == 0 { &mut self.main } else { &mut self.second };
            let outcome = execute(client, &statements, &shape);
            if let Op::Warm { .. } = step.op {
                // pg_stat_xact_* also shows counts not yet flushed from earlier transactions
                // (PostgreSQL 15), so the warm-up's must be flushed before the next one reads.
                let _ = client.batch_execute("SELECT pg_stat_force_next_flush()");
            }
            if let (Op::Begin, Ok(time)) = (&step.op, &outcome) {
                times.push(time.clone());
                continue;
            }
            aborted[session] |= outcome.is_err();
            record_outcome(trace, &format!("{label} session {}", step.session), outcome);
        }
        // Each session's counts, an aborted transaction's too, reach the shared statistics
        // before they are read.
        for client in [&mut self.main, &mut self.second] {
            let _ = client.batch_execute("SELECT pg_stat_force_next_flush()");
        }
        self.observe("zz", trace, times);
    }

    /// The SQL of a step in this way, and how to read its answer.
    fn statements(&mut self, op: &Op) -> (Vec<String>, Shape) {
        let q = |s: &str| quote_literal(s);
        match (self.way, op) {
            (_, Op::Begin | Op::Commit) => unreachable!("only concurrent cases begin and commit, in run_concurrent"),
            (_, Op::Read(sql)) => (vec![sql.clone()], Shape::Value),
            (Way::Direct | Way::Statement, Op::Warm { prefix, count }) => (
                vec![format!(
                    "SELECT count(*) FILTER (WHERE idem_claim('warm-{prefix}-' || i, 'default')) FROM generate_series(1, {count}) i"
                )],
                Shape::Value,
            ),
            (Way::Hand, Op::Warm { prefix, count }) => (
                vec![format!(
                    "WITH claimed AS (INSERT INTO idempotency.ledger (key_digest, scope_id) \
                     SELECT idem_digest('warm-{prefix}-' || i, 'default'), idem_scope_id('default') \
                     FROM generate_series(1, {count}) i ON CONFLICT (key_digest) DO NOTHING RETURNING 1) \
                     SELECT count(*) FROM claimed"
                )],
                Shape::Value,
            ),
            (Way::Direct | Way::Statement, Op::Claim { key, scope, payload }) => {
                let payload = payload.as_ref().map(|p| format!(", {}::jsonb", q(p))).unwrap_or_default();
                (vec![format!("SELECT idem_claim({}, {}{payload})", q(key), q(scope))], Shape::Value)
            }
            (Way::Direct | Way::Statement, Op::ClaimMany { keys, scope }) => {
                let keys: Vec<String> = keys.iter().map(|k| q(k)).collect();
                (
                    vec![format!("SELECT idem_claim_many(ARRAY[{}]::text[], {})", keys.join(", "), q(scope))],
                    Shape::Value,
                )
            }
            (Way::Direct | Way::Statement, Op::Update { key, changes }) => (
                vec![format!(
                    "SELECT idem_versioned_update('t.tab', {}::jsonb, {}::jsonb, 'version')",
                    q(key),
                    q(changes)
                )],
                Shape::Value,
            ),
            (Way::Direct | Way::Statement, Op::Upsert { row }) => {
                (vec![format!("SELECT idem_versioned_upsert('t.tab', {}::jsonb, 'version')", q(row))], Shape::Value)
            }
            (Way::Direct | Way::Statement, Op::Send { claim, messages }) => {
                let mut statements: Vec<String> =
                    claim.iter().map(|(k, scope)| format!("SELECT idem_claim({}, {})", q(k), q(scope))).collect();
                statements.extend(messages.iter().map(|m| {
                    let key = m.key.as_ref().map(|k| format!(", key => {}", q(k))).unwrap_or_default();
                    format!(
                        "SELECT idem_send({}, {}::jsonb, {}, {}{key})",
                        q(&m.topic),
                        q(&m.payload),
                        optional(&m.headers, "::jsonb"),
                        optional(&m.ordering_key, "")
                    )
                }));
                (statements, Shape::Value)
            }
            (Way::Hand, Op::Send { claim, messages }) => {
                let mut statements: Vec<String> = claim.iter().map(|(k, scope)| claim_insert(k, scope, None)).collect();
                // The n-th message without a key of its own after the claim has position n.
                let mut derived = 0;
                statements.extend(messages.iter().flat_map(|m| {
                    let id = match (&m.key, claim) {
                        (Some(k), _) => format!("idem_message_id({}, 'default', 0)", q(k)),
                        (None, Some((k, scope))) => {
                            derived += 1;
                            format!("idem_message_id({}, {}, {derived})", q(k), q(scope))
                        }
                        (None, None) => unreachable!("a derived id needs a claim"),
                    };
                    // On a conflict idem_send compares the stored message (see Message), which
                    // reads it: SELECT on its columns.
                    [
                        format!(
                            "INSERT INTO idempotency.outbox (seq, id, topic, ordering_key, payload, headers) \
                             VALUES (nextval('idempotency.outbox_seq'), {id}, {}, {}, {}::jsonb, {}) \
                             ON CONFLICT (id) DO NOTHING RETURNING id",
                            q(&m.topic),
                            optional(&m.ordering_key, ""),
                            q(&m.payload),
                            optional(&m.headers, "::jsonb")
                        ),
                        format!(
                            "{UNLESS_ANSWERED}SELECT CASE WHEN o.topic = {} AND o.ordering_key IS NOT DISTINCT FROM {} \
                             AND o.payload = {}::jsonb THEN o.id END FROM idempotency.outbox o WHERE o.id = {id}",
                            q(&m.topic),
                            optional(&m.ordering_key, "::text"),
                            q(&m.payload)
                        ),
                    ]
                }));
                (statements, Shape::Value)
            }
            (Way::Direct | Way::Statement, Op::Advance { stream, partition, numbered, pos }) => {
                let partition = if *numbered { format!("{partition}::int8") } else { q(partition) };
                (vec![format!("SELECT idem_watermark_advance({}, {partition}, {pos})", q(stream))], Shape::Value)
            }
            (Way::Hand, Op::Advance { stream, partition, pos, .. }) => {
                let (stream, partition) = (q(stream), q(partition));
                (
                    vec![
                        format!(
                            "UPDATE idempotency.watermarks SET position = {pos}, advanced_at = now() \
                             WHERE stream = {stream} AND partition = {partition} AND position < {pos} RETURNING true"
                        ),
                        format!(
                            "{UNLESS_ANSWERED}INSERT INTO idempotency.watermarks AS w (stream, partition, position) \
                             VALUES ({stream}, {partition}, {pos}) ON CONFLICT (stream, partition) DO UPDATE \
                             SET position = excluded.position, advanced_at = now() \
                             WHERE w.position < excluded.position RETURNING true"
                        ),
                        format!("{UNLESS_ANSWERED}SELECT false"),
                    ],
                    Shape::Value,
                )
            }
            (Way::Hand, Op::Claim { key, scope, payload }) => {
                (vec![claim_insert(key, scope, payload.as_deref())], Shape::Inserted)
            }
            (Way::Hand, Op::ClaimMany { keys, scope }) => {
                // Each distinct key once, in digest order, as the batch inserts them.
                let list: Vec<String> = keys.iter().map(|k| q(k)).collect();
                let sql = format!(
                    "SELECT k FROM (SELECT DISTINCT k FROM unnest(ARRAY[{}]::text[]) k) d ORDER BY idem_digest(k, {scope})",
                    list.join(", "),
                    scope = q(scope)
                );
                let order = rows(&mut self.aux, &sql).unwrap_or_default();
                let distinct: Vec<String> = order.into_iter().filter_map(|mut r| r.remove(0)).collect();
                let statements = distinct.iter().map(|k| claim_insert(k, scope, None)).collect();
                (statements, Shape::Batch { keys: keys.clone(), distinct })
            }
            (Way::Hand, Op::Update { key, changes }) => match self.hand_update(key, changes) {
                Ok(sql) => (vec![sql], Shape::Changed),
                Err(e) => {
                    (vec![format!("SELECT 'cannot write the reference: {}'", e.replace('\'', "''"))], Shape::Value)
                }
            },
            (Way::Hand, Op::Upsert { row }) => match self.hand_upsert(row) {
                Ok(sql) => (vec![sql], Shape::Changed),
                Err(e) => {
                    (vec![format!("SELECT 'cannot write the reference: {}'", e.replace('\'', "''"))], Shape::Value)
                }
            },
        }
    }

    /// Each member of `json` as a typed literal of its column: `'text'::type` with the
    /// column's type without its typmod (assignment applies the typmod, as it does to the
    /// extension's values), JSON null as NULL::type, json and jsonb columns the JSON itself.
    /// An interval's literal to be `assigned` keeps its fields, which its input reads by (as
    /// an untyped literal assigned to the column is read: '1' is a year in `interval year`);
    /// one to be compared in a WHERE is a plain interval, as an untyped literal there is read
    /// ('1' is a second). A domain's literal is left untyped, as a client writes it: a cast to
    /// the domain would fit it to the domain's typmod as a cast does (cutting a too long
    /// string), where an assignment refuses it.
    fn literals(&mut self, json: &str, assigned: bool) -> Result<Vec<(String, String)>, String> {
        let sql = format!(
            "SELECT quote_ident(m.k), \
                    CASE WHEN jsonb_typeof(j -> m.k) = 'null' THEN 'NULL' \
                         WHEN t.typname IN ('json', 'jsonb') THEN quote_literal((j -> m.k)::text) \
                         ELSE quote_literal(j ->> m.k) END \
                    || CASE WHEN t.typtype = 'd' THEN '' \
                            WHEN a.atttypid = 'interval'::regtype AND a.atttypmod >= 0 AND {assigned} \
                            THEN '::' || format_type(a.atttypid, a.atttypmod) \
                            ELSE '::' || quote_ident(tn.nspname) || '.' || quote_ident(t.typname) END \
             FROM (SELECT {}::jsonb AS j) v, jsonb_object_keys(j) WITH ORDINALITY m(k, n) \
             JOIN pg_attribute a ON a.attrelid = 't.tab'::regclass AND a.attname = m.k AND NOT a.attisdropped \
             JOIN pg_type t ON t.oid = a.atttypid JOIN pg_namespace tn ON tn.oid = t.typnamespace ORDER BY m.n",
            quote_literal(json),
        );
        let found = rows(&mut self.aux, &sql).map_err(|e| describe(&e))?;
        Ok(found.into_iter().filter_map(|r| Some((r.first()?.clone()?, r.get(1)?.clone()?))).collect())
    }

    fn hand_update(&mut self, key: &str, changes: &str) -> Result<String, String> {
        let key = self.literals(key, false)?;
        let compared = self.literals(changes, false)?;
        let version = compared.iter().find(|(c, _)| c == "version").ok_or("no version")?.1.clone();
        let changes = self.literals(changes, true)?;
        let set: Vec<String> = changes.iter().map(|(c, l)| format!("{c} = {l}")).collect();
        let matches: Vec<String> = key.iter().map(|(c, l)| format!("{c} = {l}")).collect();
        Ok(format!(
            "UPDATE t.tab SET {} WHERE {} AND (version IS NULL OR version < {version})",
            set.join(", "),
            matches.join(" AND ")
        ))
    }

    fn hand_upsert(&mut self, row: &str) -> Result<String, String> {
        let row = self.literals(row, true)?;
        let primary = value(
            &mut self.aux,
            "SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY array_position(i.indkey::int2[], a.attnum)) \
             FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey::int2[]) \
             WHERE i.indrelid = 't.tab'::regclass AND i.indisprimary",
        )
        .map_err(|e| describe(&e))?;
        let keys: Vec<&str> = primary.split(", ").collect();
        let set: Vec<String> = row
            .iter()
            .filter(|(c, _)| !keys.contains(&c.as_str()))
            .map(|(c, _)| format!("{c} = EXCLUDED.{c}"))
            .collect();
        Ok(format!(
            "INSERT INTO t.tab AS t ({}) VALUES ({}) ON CONFLICT ({primary}) DO UPDATE SET {} \
             WHERE t.version IS NULL OR t.version < EXCLUDED.version",
            row.iter().map(|(c, _)| c.as_str()).collect::<Vec<_>>().join(", "),
            row.iter().map(|(_, l)| l.as_str()).collect::<Vec<_>>().join(", "),
            set.join(", ")
        ))
    }
}

/// `text` with each step's now() named by its step, newest first, so that a time is never
/// replaced inside a longer one.
fn name_times(text: &str, times: &[String]) -> String {
    times
        .iter()
        .enumerate()
        .rev()
        .fold(text.to_string(), |text, (n, time)| text.replace(time.as_str(), &format!("<now of step {n}>")))
}

/// A literal with its cast, or NULL.
fn optional(value: &Option<String>, cast: &str) -> String {
    value.as_ref().map(|v| format!("{}{cast}", quote_literal(v))).unwrap_or_else(|| "NULL".into())
}

fn claim_insert(key: &str, scope: &str, payload: Option<&str>) -> String {
    let (key, scope) = (quote_literal(key), quote_literal(scope));
    match payload {
        None => format!(
            "INSERT INTO idempotency.ledger (key_digest, scope_id) VALUES (idem_digest({key}, {scope}), idem_scope_id({scope})) \
             ON CONFLICT (key_digest) DO NOTHING"
        ),
        Some(p) => format!(
            "INSERT INTO idempotency.ledger (key_digest, scope_id, fingerprint) \
             VALUES (idem_digest({key}, {scope}), idem_scope_id({scope}), idem_fingerprint({}::jsonb)) \
             ON CONFLICT (key_digest) DO NOTHING",
            quote_literal(p)
        ),
    }
}

/// How a step's statements answer, as the text the extension's function would return.
enum Shape {
    /// The first value of the first row.
    Value,
    /// One INSERT: "t" when it inserted a row.
    Inserted,
    /// One UPDATE or INSERT … ON CONFLICT DO UPDATE: "t" when it wrote a row.
    Changed,
    /// One INSERT per distinct key: the boolean[] idem_claim_many returns.
    Batch { keys: Vec<String>, distinct: Vec<String> },
}

/// Marks a statement that runs only when the one before it returned no row.
const UNLESS_ANSWERED: &str = "-- unless answered\n";

fn execute(client: &mut Client, statements: &[String], shape: &Shape) -> Result<String, postgres::Error> {
    let mut answers: Vec<Answer> = Vec::new();
    for sql in statements {
        if sql.starts_with(UNLESS_ANSWERED) && matches!(answers.last(), Some(Answer::Value(_))) {
            continue;
        }
        answers.push(run(client, sql)?);
    }
    let written = |a: &Answer| matches!(a, Answer::Rows(n) if *n > 0);
    Ok(match shape {
        // The last statement that returned a row, as a transaction's answer is its SELECT's
        // and not its COMMIT's.
        Shape::Value => match answers.iter().rev().find(|a| matches!(a, Answer::Value(_))).or(answers.last()) {
            Some(Answer::Value(v)) => v.clone().unwrap_or_else(|| "NULL".into()),
            Some(Answer::Rows(n)) => format!("({n} rows)"),
            None => String::new(),
        },
        Shape::Inserted | Shape::Changed => if answers.first().is_some_and(written) { "t" } else { "f" }.to_string(),
        Shape::Batch { keys, distinct } => {
            let new: Vec<&String> = distinct.iter().zip(&answers).filter(|(_, a)| written(a)).map(|(k, _)| k).collect();
            let flags: Vec<&str> = keys
                .iter()
                .enumerate()
                .map(|(i, k)| if keys.iter().position(|x| x == k) == Some(i) && new.contains(&k) { "t" } else { "f" })
                .collect();
            format!("{{{}}}", flags.join(","))
        }
    })
}

fn record(trace: &mut Trace, label: &str, value: String, extension_only: bool) {
    trace.insert(label.to_string(), Observed { value, extension_only });
}

fn record_outcome(trace: &mut Trace, label: &str, outcome: Result<String, postgres::Error>) {
    match outcome {
        Ok(v) => record(trace, &format!("{label} result"), v, false),
        Err(e) => match e.as_db_error() {
            Some(db) => record_error(trace, label, db),
            None => record(trace, &format!("{label} error"), e.to_string(), false),
        },
    }
}

/// Every field a driver reads, but the position and the server's source location. CONTEXT is
/// compared without the lines naming the extension's own functions, and whole between the
/// two ways of the extension.
fn record_error(trace: &mut Trace, label: &str, e: &DbError) {
    let fields: [(&str, Option<&str>); 10] = [
        ("sqlstate", Some(e.code().code())),
        ("message", Some(e.message())),
        ("detail", e.detail()),
        ("hint", e.hint()),
        ("schema", e.schema()),
        ("table", e.table()),
        ("column", e.column()),
        ("datatype", e.datatype()),
        ("constraint", e.constraint()),
        ("severity", Some(e.severity())),
    ];
    for (name, v) in fields {
        let mut v = v.unwrap_or("-").to_string();
        // A serialization failure's detail names the pivot's xid, which differs per database.
        if name == "detail" && e.code().code() == "40001" {
            v = v.split(|c: char| c.is_ascii_digit()).filter(|p| !p.is_empty()).collect::<Vec<_>>().join("N");
        }
        record(trace, &format!("{label} error {name}"), v, false);
    }
    let context = e.where_().unwrap_or("");
    let own = |line: &&str| OWN_FUNCTIONS.iter().any(|f| line.contains(f));
    let shared: Vec<&str> = context.lines().filter(|l| !own(l)).collect();
    record(trace, &format!("{label} error context"), shared.join("\n"), false);
    record(trace, &format!("{label} error context (whole)"), context.to_string(), true);
}

pub fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}
