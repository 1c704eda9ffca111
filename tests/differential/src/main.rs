//! Differential tester of the idempotency extension: each random case runs three ways, and
//! the three must be indistinguishable.
//!
//! - **direct**: the extension's calls with `SET idempotency.direct_writes = on` (writes
//!   through the heap and index access methods, without SPI, where the table allows it);
//! - **statement**: the same calls with `idempotency.direct_writes = off` (each write as its
//!   SQL statement through SPI);
//! - **hand**: the SQL a user would write instead, the fixed references below.
//!
//! Each way has its own database (`differential_direct`, `differential_statement`,
//! `differential_hand`): the ledger is one table per database, so claims cannot share one.
//! Every case starts each database afresh (schema `t` recreated, the ledger emptied, or the
//! extension recreated when the case changed the ledger's definition).
//!
//! References:
//! - `idem_claim(key, scope[, payload])` is `INSERT INTO idempotency.ledger (key_digest,
//!   scope_id[, fingerprint]) VALUES (idem_digest(key, scope), idem_scope_id(scope)[,
//!   idem_fingerprint(payload)]) ON CONFLICT (key_digest) DO NOTHING`, true iff it inserted a
//!   row; the fingerprint column is named only when a payload is given. Payloads are a
//!   function of the key, so the extension's ID001 never fires where the reference cannot.
//! - `idem_claim_many(keys, scope)` is that INSERT once per distinct key, in digest order;
//!   element i is true when keys\[i\] is its first occurrence and was inserted.
//! - `idem_versioned_update(t, key, changes, version)` is `UPDATE t SET col = 'value'::type, …
//!   WHERE keycol = 'value'::type AND … AND (version IS NULL OR version < 'new'::type)`, true
//!   when a row changed. `type` is the column's type without its typmod (numeric, not
//!   numeric(10,0); assignment applies the typmod to SET values), qualified and quoted, so
//!   `"pg_catalog"."bit"` means any length as the extension's cast does, not bit(1). A value's
//!   literal text is a JSON string's contents or a number's or boolean's text (json and
//!   jsonb columns: the JSON itself); JSON null is NULL.
//! - `idem_versioned_upsert(t, row, version)` is `INSERT INTO t AS t (cols) VALUES (literals)
//!   ON CONFLICT (primary key) DO UPDATE SET col = EXCLUDED.col, … WHERE t.version IS NULL OR
//!   t.version < EXCLUDED.version`.
//! - `idem_send(topic, payload, headers, ordering_key[, key => k])` is `INSERT INTO
//!   idempotency.outbox (seq, id, topic, ordering_key, payload, headers) VALUES
//!   (nextval('idempotency.outbox_seq'), id, …) ON CONFLICT (id) DO NOTHING RETURNING id`, with
//!   `id` = `idem_message_id(k, 'default', 0)` or, for the n-th message without a key after the
//!   step's claim, `idem_message_id(claim key, scope, n)`; when it inserted nothing, the stored
//!   message is read back and compared (so a role also needs SELECT on the columns compared).
//!   Outbox steps, changes and grants come from a generator of their own (`add_sends` in
//!   case.rs), so the cases without them are as they were before the outbox.
//! - `idem_watermark_advance(stream, partition, pos)` is `UPDATE idempotency.watermarks SET
//!   position = pos, advanced_at = now() WHERE stream = … AND partition = … AND position < pos
//!   RETURNING true`, and when that returns no row, `INSERT … ON CONFLICT (stream, partition)
//!   DO UPDATE … WHERE w.position < excluded.position RETURNING true`, else false. Its steps,
//!   table changes and grants come from a generator of their own too (`add_watermarks`).
//!
//! A sequential step runs in its own transaction: `BEGIN`, the setting, `SET LOCAL ROLE
//! diff_app` for steps of a role with only some column grants, `SAVEPOINT`, the call (rolled
//! back to the savepoint when it fails), then — still inside the transaction — whether it
//! has an xid and its pg_stat_xact_user_tables counts, and `COMMIT`. After the commit the
//! superuser reads every row of t.tab, of the ledger and of the outbox (now() as the step that
//! made it, in error details too), the outbox sequence's state, n_live_tup and n_dead_tup,
//! and amcheck's `bt_index_check(index, true)` of every btree index. An error is compared field by field (SQLSTATE, message, detail, hint,
//! schema, table, column, datatype, constraint, severity) and by CONTEXT, which may only
//! gain lines naming the extension's own function; the two ways of the extension must give
//! the same CONTEXT whole. Scan counts are not compared: the planner may choose either.
//!
//! A concurrent case (no sends among them yet) runs two SERIALIZABLE transactions on two
//! connections per way, interleaving claims, versioned writes and reads of overlapping keys and
//! rows so that neither ever waits for the other, and compares every answer, each COMMIT's
//! outcome (40001 or not) and the final state. Some cases first warm each session with 20 new
//! claims, and some are the one rw-cycle a duplicate claim must not close (`rw_cycle` in
//! case.rs).
//!
//! A failing case is shrunk before it is printed: steps and setup statements are dropped one
//! at a time while some difference remains. `--ignore LABEL` leaves a known difference out so
//! that the next one shows (triage only). Run on 0.1.0 (c82c07e), the generator finds each of
//! the eleven differences issue #9 lists; the closing note of #9 gives seeds and cases.
//!
//! Every difference fails. Two classes it found in the extension are fixed and stay under
//! its watch: the statement path made a value only when its statement ran (a `SET` only for
//! a matching row, after the privilege check) where the hand-written literals are made when
//! parsed; and a literal cast to a domain is fitted to the domain's typmod as an explicit
//! cast (a too long string cut), its checks run only when a row is written.

mod case;
mod rng;
mod run;

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use case::{Case, Op};
use run::{Db, Trace, Way};

struct Options {
    seed: u64,
    cases: Option<u64>,
    seconds: Option<u64>,
    only: Option<u64>,
    /// How many failing cases to print whole; the rest get one line each.
    show: u32,
    /// Labels to leave out of the comparison (any that contains one of these): for triage,
    /// so that one known difference does not hide another, never in `make test`.
    ignore: Vec<String>,
}

fn usage() -> ! {
    eprintln!(
        "usage: differential [--seed N] [--cases N] [--seconds N] [--case I] [--show N] [--ignore LABEL]...\n\
         --case I replays case I of the seed alone and prints its SQL for each way\n\
         --ignore LABEL leaves out every observation whose label contains LABEL (triage only)"
    );
    std::process::exit(2)
}

fn options() -> Options {
    let mut o = Options { seed: 0, cases: None, seconds: None, only: None, show: 5, ignore: Vec::new() };
    let mut seeded = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = || args.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or_else(|| usage());
        match arg.as_str() {
            "--seed" => {
                o.seed = number();
                seeded = true;
            }
            "--cases" => o.cases = Some(number()),
            "--seconds" => o.seconds = Some(number()),
            "--case" => o.only = Some(number()),
            "--show" => o.show = number() as u32,
            "--ignore" => o.ignore.push(args.next().unwrap_or_else(|| usage())),
            _ => usage(),
        }
    }
    if !seeded {
        o.seed = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
    }
    if o.cases.is_none() && o.seconds.is_none() {
        o.cases = Some(200);
    }
    o
}

/// One label on which the ways disagree.
struct Difference {
    label: String,
    values: [Option<String>; 3],
}

fn differences(traces: &[Trace; 3], ignore: &[String]) -> Vec<Difference> {
    let mut labels: Vec<&String> =
        traces.iter().flat_map(|t| t.keys()).filter(|l| !ignore.iter().any(|i| l.contains(i.as_str()))).collect();
    labels.sort();
    labels.dedup();
    labels
        .into_iter()
        .filter_map(|label| {
            let values = [0, 1, 2].map(|i| traces[i].get(label).map(|o| o.value.clone()));
            let extension_only = traces.iter().any(|t| t.get(label).is_some_and(|o| o.extension_only));
            let differ =
                if extension_only { values[0] != values[1] } else { values[0] != values[1] || values[1] != values[2] };
            differ.then(|| Difference { label: label.clone(), values })
        })
        .collect()
}

fn print_case(case: &Case, scripts: &[Vec<String>; 3]) {
    println!(
        "-- replay: cargo run -q --release -p idempotency-differential -- --seed {} --case {}",
        case.seed, case.index
    );
    println!("-- setup, in each database after `DROP SCHEMA t CASCADE; CREATE SCHEMA t;` and an empty ledger:");
    for sql in &case.setup {
        println!("{sql};");
    }
    for (way, script) in Way::ALL.iter().zip(scripts) {
        println!("-- way {}:", way.name());
        for step in script {
            println!("{step}");
            if !case.concurrent {
                println!("COMMIT;");
            }
        }
    }
}

/// The case run in each way: every trace, and the SQL each way ran.
fn run_ways(dbs: &mut [Db], case: &Case) -> Result<([Trace; 3], [Vec<String>; 3]), String> {
    let mut scripts: [Vec<String>; 3] = Default::default();
    let mut traces: Vec<Trace> = Vec::new();
    for (db, script) in dbs.iter_mut().zip(scripts.iter_mut()) {
        traces.push(db.run_case(case, script)?);
    }
    let traces: [Trace; 3] = traces.try_into().unwrap_or_else(|_| unreachable!("one trace per way"));
    Ok((traces, scripts))
}

/// The smallest case, by dropping one step or one setup statement at a time, that still
/// differs: a finding is then read off a few lines instead of a whole random case. The table
/// and the domains stay; BEGIN and COMMIT stay, so the sessions' transactions keep their shape.
fn shrink(dbs: &mut [Db], mut case: Case, ignore: &[String]) -> Result<Case, String> {
    loop {
        let mut smaller = false;
        for part in [Part::Step, Part::Setup] {
            for i in (0..part.len(&case)).rev() {
                if part.stays(&case, i) {
                    continue;
                }
                let mut candidate = case.clone();
                part.remove(&mut candidate, i);
                if !differences(&run_ways(dbs, &candidate)?.0, ignore).is_empty() {
                    case = candidate;
                    smaller = true;
                }
            }
        }
        if !smaller {
            return Ok(case);
        }
    }
}

/// The lists of a case that shrinking drops from.
#[derive(Clone, Copy)]
enum Part {
    Step,
    Setup,
}

impl Part {
    fn len(self, case: &Case) -> usize {
        match self {
            Part::Step => case.steps.len(),
            Part::Setup => case.setup.len(),
        }
    }

    fn stays(self, case: &Case, i: usize) -> bool {
        match self {
            Part::Step => matches!(case.steps[i].op, Op::Begin | Op::Commit),
            Part::Setup => case.setup[i].starts_with("CREATE TABLE") || case.setup[i].starts_with("CREATE DOMAIN"),
        }
    }

    fn remove(self, case: &mut Case, i: usize) {
        match self {
            Part::Step => drop(case.steps.remove(i)),
            Part::Setup => drop(case.setup.remove(i)),
        }
    }
}

fn print_failures(failures: &[String]) {
    for line in failures {
        println!("{line}");
    }
}

/// A run that cannot go on still lists the cases that failed before.
fn fail_with(failures: &[String]) -> ExitCode {
    print_failures(failures);
    ExitCode::FAILURE
}

fn main() -> ExitCode {
    let o = options();
    println!("differential: seed {}", o.seed);
    let mut dbs = Vec::new();
    for way in Way::ALL {
        match Db::open(way) {
            Ok(db) => dbs.push(db),
            Err(e) => {
                eprintln!("differential: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let started = Instant::now();
    let (mut passed, mut failed, mut printed) = (0u64, 0u64, 0u32);
    // Repeated last, one line per failing case: a CI log keeps only its tail.
    let mut failures: Vec<String> = Vec::new();
    let indexes: Box<dyn Iterator<Item = u64>> = match o.only {
        Some(i) => Box::new(std::iter::once(i)),
        None => Box::new(0..),
    };
    for index in indexes {
        if o.only.is_none()
            && (o.cases.is_some_and(|n| index >= n)
                || o.seconds.is_some_and(|s| started.elapsed() >= Duration::from_secs(s)))
        {
            break;
        }
        let mut case = Case::generate(o.seed, index);
        let (mut traces, mut scripts) = match run_ways(&mut dbs, &case) {
            Ok(run) => run,
            Err(e) => {
                eprintln!("differential: case {index}: {e}");
                return fail_with(&failures);
            }
        };
        let mut found = differences(&traces, &o.ignore);
        let verdict = if found.is_empty() { "no difference" } else { "differs" };
        if found.is_empty() {
            passed += 1;
        } else {
            failed += 1;
        }
        let mut shrunk = false;
        if !found.is_empty() && printed < o.show {
            let small =
                shrink(&mut dbs, case.clone(), &o.ignore).and_then(|small| Ok((run_ways(&mut dbs, &small)?, small)));
            match small {
                // A difference that did not come back on a second run is printed as first seen.
                Ok((run, small)) if !differences(&run.0, &o.ignore).is_empty() => {
                    println!(
                        "== case {index}: shrunk from {} steps and {} setup statements to {} and {}",
                        case.steps.len(),
                        case.setup.len(),
                        small.steps.len(),
                        small.setup.len()
                    );
                    (traces, scripts) = run;
                    case = small;
                    shrunk = true;
                    found = differences(&traces, &o.ignore);
                }
                Ok(_) => println!("== case {index}: the difference did not come back when run again"),
                Err(e) => {
                    eprintln!("differential: case {index}: {e}");
                    return fail_with(&failures);
                }
            }
        }
        if !found.is_empty() {
            let labels: Vec<&str> = found.iter().map(|d| d.label.as_str()).take(8).collect();
            failures.push(format!(
                "differential: case {index} differs at {}{} (--seed {} --case {index}{})",
                labels.join(", "),
                if found.len() > labels.len() { ", …" } else { "" },
                o.seed,
                // The labels' step numbers are then the shrunk case's, printed above.
                if shrunk { "; shrunk" } else { "" }
            ));
        }
        if (!found.is_empty() && printed < o.show) || o.only.is_some() {
            printed += 1;
            println!("== case {index}: {verdict}");
            print_case(&case, &scripts);
            for d in &found {
                println!("-- {}:", d.label);
                for (way, v) in Way::ALL.iter().zip(&d.values) {
                    println!(
                        "--   {:<9} {}",
                        way.name(),
                        v.as_deref().unwrap_or("(absent)").replace('\n', "\n--             ")
                    );
                }
            }
        } else if !found.is_empty() {
            println!("== case {index}: {verdict} at {}; replay with --seed {} --case {index}", found[0].label, o.seed);
        }
    }
    print_failures(&failures);
    let elapsed = started.elapsed().as_secs_f64();
    println!("differential: {passed} passed, {failed} failed (seed {}, {elapsed:.1} s)", o.seed);
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
