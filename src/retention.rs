//! Retention: how long a claim must outlive its message. Retention = broker retention + DLQ
//! retention + replay window + buffer, declared per scope (sql/retention.sql); undeclared
//! scopes use `idempotency.default_retention`. The purge itself is SQL (a procedure that
//! commits between batches); here live the setting and the late-replay guard of a claim.

use pgrx::datum::{DatumWithOid, Interval, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};

use crate::digest::{abbreviate, Scope};
use crate::error::{finish, sqlstate_entry, warn, IdemError, Result, SqlState};
use crate::postgres::spi::Statement;
use crate::postgres::time;

/// Seven days, NServiceBus's KeepDeduplicationDataFor default: long enough for a week-end's
/// DLQ to be replayed on Monday. Production scopes should declare their own.
pub const DEFAULT_RETENTION_SECONDS: i32 = 7 * 24 * 3600;

pub static DEFAULT_RETENTION: GucSetting<i32> = GucSetting::<i32>::new(DEFAULT_RETENTION_SECONDS);

pub fn define_settings() {
    GucRegistry::define_int_guc(
        c"idempotency.default_retention",
        c"How long claims of undeclared scopes are kept before idem_purge may delete them.",
        c"Declared scopes (idem_declare_scope) use broker + DLQ retention + replay window + buffer instead.",
        &DEFAULT_RETENTION,
        1,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_S,
    );
}

/// A retention setting's seconds as an interval. Whole days stay days, so the setting reads
/// back as '7 days' rather than '168:00:00'.
pub fn seconds_interval(seconds: i32) -> Interval {
    Interval::new(0, seconds / 86_400, i64::from(seconds % 86_400) * 1_000_000)
        .expect("a positive int4 number of seconds is a valid interval")
}

fn default_retention() -> Interval {
    seconds_interval(DEFAULT_RETENTION.get())
}

/// Where a retention's cutoff stops being the clock less the span: past what
/// idem_declare_scope takes (1000 years), which only a scope declared by an earlier release,
/// or restored from its dump, can hold.
const LONGEST_RETENTION_DAYS: i128 = 1000 * 12 * 30;

/// The cutoff of a retention: `at` less `span` on the UTC clock (calendar months, then days,
/// then time, as `timestamp - interval` subtracts), which the purge (idempotency.expired_before)
/// and the late-replay guard share, so that a day is 24 hours whatever a session's TimeZone
/// and its daylight-saving changes. A field of `span` below zero counts as zero, and a span
/// past 1000 years, or of nothing at all, keeps every claim (-infinity): earlier releases took
/// such spans, and subtracted as they stand they could put the cutoff after `at` (purging
/// claims before they expire) or outside the timestamp range (22008 on every purge). Either
/// way a claim is kept at least as long as its span says, never less.
pub fn cutoff(at: pg_sys::TimestampTz, span: &Interval) -> Result<TimestampWithTimeZone> {
    let (months, days, micros) = (span.months().max(0), span.days().max(0), span.micros().max(0));
    // PostgreSQL compares intervals with a month as 30 days and a day as 24 hours.
    let total_micros = (i128::from(months) * 30 + i128::from(days)) * 86_400_000_000 + i128::from(micros);
    if total_micros == 0 || total_micros > LONGEST_RETENTION_DAYS * 86_400_000_000 {
        return Ok(TimestampWithTimeZone::negative_infinity());
    }
    let utc = time::utc_minus(at, months, days, micros)?;
    Ok(TimestampWithTimeZone::try_from(utc).expect("a finite timestamp"))
}

/// idempotency.expired_before: a retention's cutoff from the transaction's start, for the
/// purge's statements.
#[pg_extern(sql = false)]
fn expired_before(span: Interval) -> Option<TimestampWithTimeZone> {
    finish(cutoff(time::transaction_start(), &span))
}
sqlstate_entry!(expired_before_entry, pg_finfo_expired_before_entry, expired_before_wrapper);

// A scope's retention and what a late replay does. Late means sent before the scope's cutoff
// ([`cutoff`]), reckoned from the clock, not the transaction's start: a purge that committed
// while this transaction ran has cut at a later time than its start, and may have removed the
// claim of an earlier delivery. Only the scopes table is read, as the SQL of every release
// has it.
static LATE: Statement = Statement {
    sql: "SELECT COALESCE(s.late_replay, 'error'), COALESCE(s.retention, $2), COALESCE(s.retention, $2)::pg_catalog.text \
          FROM (VALUES (1)) AS one(x) \
          LEFT JOIN idempotency.scopes AS s ON s.scope_id OPERATOR(pg_catalog.=) $1",
    args: &[pg_sys::INT8OID, pg_sys::INTERVALOID],
};

/// A new claim for a message sent before its scope's retention began: the record of an
/// earlier delivery may have been purged, so "new" cannot be trusted. Raises ID004, or warns
/// with it when the scope was declared with late_replay => 'warn'.
pub fn check_late_replay(scope: &Scope<'_>, sent_at: TimestampWithTimeZone) -> Result<()> {
    let args = [DatumWithOid::from(scope.id), DatumWithOid::from(default_retention())];
    let (mode, span, retention) =
        LATE.run(&args, |rows| (rows.get::<String>(0, 1), rows.get::<Interval>(0, 2), rows.get::<String>(0, 3)))?;
    let span = span.expect("a scope's retention, or the default one");
    if pg_sys::TimestampTz::from(sent_at) >= cutoff(time::clock(), &span)?.into_inner() {
        return Ok(());
    }
    let report = IdemError::new(
        SqlState::LateReplay,
        format!("message is older than the retention of scope \"{}\" ({})", abbreviate(scope.name), retention.unwrap_or_default()),
    )
    .detail(format!("It was sent at {sent_at}; the claim of an earlier delivery may already have been purged, so a duplicate of it can no longer be recognised."))
    .hint("Replay old messages only after idem_declare_scope gives the scope a replay window that covers them.");
    if mode.as_deref() == Some("warn") {
        warn(report);
        Ok(())
    } else {
        Err(report)
    }
}

#[pg_extern(sql = false)]
fn idem_default_retention() -> Interval {
    default_retention()
}

// The setting as ALTER DATABASE and ALTER ROLE stored it for this database: (for a database,
// for a role) with 0 for "any", and the value as written.
static STORED_DEFAULT_RETENTIONS: Statement = Statement {
    sql: "SELECT s.setdatabase OPERATOR(pg_catalog.<>) 0, s.setrole OPERATOR(pg_catalog.<>) 0, \
                 pg_catalog.split_part(c, '=', 2) \
          FROM pg_catalog.pg_db_role_setting AS s, pg_catalog.unnest(s.setconfig) AS c \
          WHERE s.setdatabase OPERATOR(pg_catalog.=) ANY (ARRAY[0, $1]::pg_catalog.oid[]) \
            AND pg_catalog.lower(pg_catalog.split_part(c, '=', 1)) OPERATOR(pg_catalog.=) 'idempotency.default_retention'",
    args: &[pg_sys::OIDOID],
};

// The server-wide value, which sessions get when nothing more specific is stored: this
// session's own when it came from no more specific place; else the configuration files' (as
// pg_file_settings reads them) where this role may read them, else the built-in default. The
// files are read by a statement of their own: PostgreSQL checks the EXECUTE privilege of every
// function a statement names when it starts, even in a branch that never runs.
static SERVER_DEFAULT_RETENTION: Statement = Statement {
    sql: "SELECT CASE WHEN g.source OPERATOR(pg_catalog.=) ANY \
                         (ARRAY['default', 'configuration file', 'environment variable', 'command line', 'override']) \
                      THEN g.setting END, \
                 pg_catalog.has_function_privilege('pg_catalog.pg_show_all_file_settings()', 'EXECUTE'), g.boot_val \
          FROM pg_catalog.pg_settings AS g WHERE g.name OPERATOR(pg_catalog.=) 'idempotency.default_retention'",
    args: &[],
};

static FILE_DEFAULT_RETENTION: Statement = Statement {
    sql: "SELECT f.setting FROM pg_catalog.pg_show_all_file_settings() AS f \
          WHERE pg_catalog.lower(f.name) OPERATOR(pg_catalog.=) 'idempotency.default_retention' AND f.applied \
          ORDER BY f.seqno DESC LIMIT 1",
    args: &[],
};

/// A stored value as a session would read it; None for one no session could parse (those
/// sessions fall back to the value below it).
fn parse_retention(value: &str) -> Option<i32> {
    let value = std::ffi::CString::new(value).ok()?;
    let mut seconds = 0;
    // SAFETY: parses a C string into an int, as the setting's own check would.
    let parsed =
        unsafe { pg_sys::parse_int(value.as_ptr(), &mut seconds, pg_sys::GUC_UNIT_S as i32, std::ptr::null_mut()) };
    (parsed && seconds >= 1).then_some(seconds)
}

/// The longest retention any session of this database gets for undeclared scopes, without a
/// SET of its own: every role's stored value, and the value of roles with none (the
/// database's, else ALTER ROLE ALL's, else the server-wide one). The purge runs as a role of
/// its own (pg_cron's, a superuser), while a consumer's role may keep claims longer, by which
/// its late-replay guard trusts them. The purging session's own value counts only where it is
/// the server-wide one: a SET, or a value of the purging role's, is nobody else's.
fn longest_default_retention() -> Result<Interval> {
    // SAFETY: reads the backend's database OID, set once connected.
    let database = unsafe { pg_sys::MyDatabaseId };
    let stored: Vec<(bool, bool, String)> = STORED_DEFAULT_RETENTIONS.run(&[DatumWithOid::from(database)], |rows| {
        (0..rows.len())
            .filter_map(|i| Some((rows.get::<bool>(i, 1)?, rows.get::<bool>(i, 2)?, rows.get::<String>(i, 3)?)))
            .collect()
    })?;
    let value_of = |in_database: bool, for_role: bool| {
        stored.iter().filter(|(d, r, _)| (*d, *r) == (in_database, for_role)).find_map(|(_, _, v)| parse_retention(v))
    };
    let base = match value_of(true, false).or_else(|| value_of(false, false)) {
        Some(seconds) => seconds,
        None => server_default_retention()?.as_deref().and_then(parse_retention).ok_or_else(|| {
            IdemError::new(
                SqlState::ObjectNotInPrerequisiteState,
                "the purge cannot read the server-wide idempotency.default_retention",
            )
            .detail("This session's value comes from its role or a SET, and the configuration files are not readable to this role.")
            .hint("Purge as a role without a value of its own or as a superuser, or set the value per database (ALTER DATABASE … SET).")
        })?,
    };
    let longest = stored
        .iter()
        .filter(|(_, for_role, _)| *for_role)
        .filter_map(|(_, _, v)| parse_retention(v))
        .fold(base, i32::max);
    Ok(seconds_interval(longest))
}

/// The server-wide value (see [`SERVER_DEFAULT_RETENTION`]); None when it comes from
/// somewhere more specific and this role may not read the configuration files.
fn server_default_retention() -> Result<Option<String>> {
    let (own, may_read_files, built_in) = SERVER_DEFAULT_RETENTION
        .run(&[], |rows| (rows.get::<String>(0, 1), rows.get::<bool>(0, 2), rows.get::<String>(0, 3)))?;
    Ok(match (own, may_read_files) {
        (Some(own), _) => Some(own),
        (None, Some(true)) => FILE_DEFAULT_RETENTION
            .run(&[], |rows| (!rows.is_empty()).then(|| rows.get::<String>(0, 1)).flatten())?
            .or(built_in),
        (None, _) => None,
    })
}

#[pg_extern(sql = false)]
fn idem_longest_default_retention() -> Option<Interval> {
    crate::error::finish(longest_default_retention())
}
sqlstate_entry!(
    idem_longest_default_retention_entry,
    pg_finfo_idem_longest_default_retention_entry,
    idem_longest_default_retention_wrapper
);
