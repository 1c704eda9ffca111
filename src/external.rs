//! External calls: where exactly-once ends. An external API never joins the consumer's
//! transaction, so two things are all the consumer can do:
//! - send the API the same idempotency key on every attempt at the same business step, on a
//!   redelivery, a replay from a DLQ and a backfill alike ([`external_id`]);
//! - for an API that takes no key, record that a call was begun, committed before the call is
//!   made, so that a redelivery after a crash between the call and its confirmation knows the
//!   call may have happened, and asks a person instead of calling again (the call ledger,
//!   `idempotency.external_calls`).
//!
//! The ledger's steps run in transactions of their own: a statement outside any transaction
//! block commits when it returns, before the caller can make the call. Inside a block the
//! record would wait for the block's COMMIT, and die with its ROLLBACK, so the steps refuse
//! to run there (25001).

use pgrx::datum::{DatumWithOid, TimestampWithTimeZone, Uuid};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting, JsonB};
use sha2::{Digest, Sha256};

use crate::digest::{abbreviate, parse_key, uuid_v8, Scope};
use crate::error::{finish, required, sqlstate_entry, IdemError, Result, SqlState};
use crate::postgres::spi::{Statement, StoredJsonb, CONFLICT_TRIES};
use crate::postgres::xact;

/// A UUID (version 8) from SHA-256 over the claim digest of (scope, key) and the step, so two
/// steps of one message, or one step of two scopes, never share a key.
fn external_id(key: &str, scope: &Scope<'_>, step: Option<&str>) -> Result<Uuid> {
    let step = required(step, "step")?;
    if step.is_empty() {
        return Err(IdemError::new(SqlState::InvalidParameterValue, "step must not be empty")
            .hint("Name the external call the step makes, e.g. 'charge' or 'send-receipt'."));
    }
    let mut hasher = Sha256::new();
    hasher.update(b"idempotency external key\0");
    hasher.update(scope.key_digest(key).as_bytes());
    hasher.update(step.as_bytes());
    Ok(uuid_v8(&hasher.finalize()))
}

/// One external call of the ledger: (key, scope, step) and the id they derive.
struct Call<'a> {
    key: &'a str,
    scope: Scope<'a>,
    step: &'a str,
    id: Uuid,
}

impl<'a> Call<'a> {
    fn parse(key: Option<&'a str>, scope: Option<&'a str>, step: Option<&'a str>) -> Result<Call<'a>> {
        let key = parse_key(key, "key")?;
        let scope = Scope::parse(scope)?;
        let id = external_id(key, &scope, step)?;
        Ok(Call { key, scope, step: step.expect("external_id refuses NULL"), id })
    }

    /// How messages name the call: its step and (the start of) its key.
    fn named(&self) -> String {
        format!("step \"{}\" of key \"{}\"", abbreviate(self.step), abbreviate(self.key))
    }

    fn not_begun(&self) -> IdemError {
        IdemError::new(
            SqlState::NotClaimed,
            format!("no external call was begun for {} in scope \"{}\"", self.named(), abbreviate(self.scope.name)),
        )
        .hint("Call idem_call_begin before the call, and confirm only what it answered 'new' for.")
    }
}

// The backend that begins a call is recorded, so that idempotency.unconfirmed_calls can tell a
// call whose consumer is still connected (perhaps still calling) from one whose consumer died.
static BEGIN_CALL: Statement = Statement {
    sql: "INSERT INTO idempotency.external_calls (call_key, scope, key, step, pid, backend_start) \
          VALUES ($1, $2, $3, $4, pg_catalog.pg_backend_pid(), $5) \
          ON CONFLICT (call_key) DO NOTHING RETURNING begun_at",
    args: &[pg_sys::UUIDOID, pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::TIMESTAMPTZOID],
};

static READ_CALL: Statement = Statement {
    sql: "SELECT begun_at, confirmed_at IS NOT NULL, response FROM idempotency.external_calls \
          WHERE call_key OPERATOR(pg_catalog.=) $1",
    args: &[pg_sys::UUIDOID],
};

static CONFIRM_CALL: Statement = Statement {
    sql: "UPDATE idempotency.external_calls SET confirmed_at = pg_catalog.now(), response = $2 \
          WHERE call_key OPERATOR(pg_catalog.=) $1 AND confirmed_at IS NULL",
    args: &[pg_sys::UUIDOID, pg_sys::JSONBOID],
};

static FORGET_CALL: Statement = Statement {
    sql: "DELETE FROM idempotency.external_calls \
          WHERE call_key OPERATOR(pg_catalog.=) $1 AND confirmed_at IS NULL",
    args: &[pg_sys::UUIDOID],
};

static SYNCHRONOUS_COMMIT: Statement =
    Statement { sql: "SELECT pg_catalog.set_config('synchronous_commit', 'on', true)", args: &[] };

/// What the ledger holds of a call. `begun_at` is NULL only where a DBA dropped its NOT NULL.
struct Recorded {
    begun_at: Option<TimestampWithTimeZone>,
    confirmed: bool,
    response: Option<StoredJsonb>,
}

fn recorded(call: &Call<'_>) -> Result<Option<Recorded>> {
    Ok(READ_CALL.run(&[DatumWithOid::from(call.id)], |rows| {
        (!rows.is_empty()).then(|| Recorded {
            begun_at: rows.get(0, 1),
            confirmed: rows.get(0, 2).expect("IS NOT NULL is a boolean"),
            response: rows.get_jsonb(0, 3),
        })
    })?)
}

/// Refuses a step inside a transaction block (or a subtransaction: a PL/pgSQL exception block
/// may still roll the record back), and makes the statement's own commit wait for
/// the WAL flush even where synchronous_commit is off: after a server crash, a lost "begun"
/// would let the redelivery call again.
fn own_transaction(function: &str) -> Result<()> {
    // A parallel query is refused by the step's own statement, with PostgreSQL's 25000.
    if xact::in_parallel_mode() {
        return Ok(());
    }
    if xact::in_transaction_block() {
        return Err(IdemError::new(SqlState::ActiveTransaction, format!("{function} cannot run inside a transaction block"))
            .detail("What it records must be committed before the external call is made, and a transaction block commits only at its end, or never.")
            .hint("Run it on a connection in autocommit mode, as a statement of its own, before the consumer's BEGIN (or on a second connection)."));
    }
    // SAFETY: reads a backend-local setting.
    if unsafe { pg_sys::synchronous_commit } == pg_sys::SyncCommitLevel::SYNCHRONOUS_COMMIT_OFF as i32 {
        SYNCHRONOUS_COMMIT.run(&[], |_| ())?;
    }
    Ok(())
}

type CallState = (Option<String>, Option<String>, Option<StoredJsonb>, Option<TimestampWithTimeZone>);

fn begin(call: &Call<'_>) -> Result<CallState> {
    own_transaction("idem_call_begin")?;
    // SAFETY: reads the time this backend started, set once at its start.
    let backend_start = TimestampWithTimeZone::try_from(unsafe { pg_sys::MyStartTimestamp })
        .expect("the backend's start is a valid timestamp");
    let args = [
        DatumWithOid::from(call.id),
        DatumWithOid::from(call.scope.name),
        DatumWithOid::from(call.key),
        DatumWithOid::from(call.step),
        DatumWithOid::from(backend_start),
    ];
    // A resolution that forgets the call may delete it between the two statements: then the
    // call is new again. Only a row that conflicts and yet cannot be read (a row-level security
    // policy of the DBA's that hides it) makes that happen every time.
    for _ in 0..CONFLICT_TRIES {
        if let Some(begun_at) = BEGIN_CALL.run(&args, |rows| (!rows.is_empty()).then(|| rows.get(0, 1)))? {
            return Ok((Some("new".into()), Some(call.id.to_string()), None, begun_at));
        }
        if let Some(r) = recorded(call)? {
            let state = if r.confirmed { "confirmed" } else { "in_doubt" };
            return Ok((Some(state.into()), Some(call.id.to_string()), r.response, r.begun_at));
        }
    }
    Err(IdemError::new(
        SqlState::ObjectNotInPrerequisiteState,
        format!("the external call for {} exists but cannot be read", call.named()),
    )
    .hint("A row-level security policy on idempotency.external_calls may hide it from this role."))
}

/// CONFIRM_CALL's arguments: the call and its response.
fn confirmation<'a>(call: &Call<'_>, response: Option<JsonB>) -> Result<[DatumWithOid<'a>; 2]> {
    let response = required(response, "response")?;
    Ok([DatumWithOid::from(call.id), DatumWithOid::from(response)])
}

fn confirm(call: &Call<'_>, response: Option<JsonB>) -> Result<bool> {
    let args = confirmation(call, response)?;
    own_transaction("idem_call_confirm")?;
    match change(call, || Ok(CONFIRM_CALL.run(&args, |rows| rows.len() == 1)?))? {
        Found::Changed => Ok(true),
        Found::Confirmed => Ok(false),
        Found::NotBegun => Err(call.not_begun().detail(
            "If idem_call_resolve forgot it (happened => false) while this call was in flight, the call may now be made twice.",
        )),
    }
}

fn resolve(call: &Call<'_>, happened: Option<bool>, response: Option<JsonB>) -> Result<()> {
    let happened = required(happened, "happened")?;
    if !happened && response.is_some() {
        return Err(IdemError::new(SqlState::InvalidParameterValue, "a call that did not happen has no response")
            .hint("Pass response only with happened => true."));
    }
    let found = if happened {
        let args = confirmation(call, response)?;
        change(call, || Ok(CONFIRM_CALL.run(&args, |rows| rows.len() == 1)?))?
    } else {
        let args = [DatumWithOid::from(call.id)];
        change(call, || Ok(FORGET_CALL.run(&args, |rows| rows.len() == 1)?))?
    };
    match found {
        Found::Changed => Ok(()),
        Found::NotBegun => Err(call.not_begun()),
        Found::Confirmed => Err(IdemError::new(
            SqlState::ObjectNotInPrerequisiteState,
            format!("the external call for {} is already confirmed", call.named()),
        )
        .detail("Its response is stored, and a redelivery reuses it; it cannot become unconfirmed again.")),
    }
}

/// What a confirmation or a resolution found.
enum Found {
    /// It changed the unconfirmed call.
    Changed,
    /// The call was confirmed already.
    Confirmed,
    /// The call is not in the ledger.
    NotBegun,
}

/// Runs `write` (CONFIRM_CALL or FORGET_CALL, which change the call only while it is
/// unconfirmed) until it changes the call, or the call is found confirmed or gone. A call
/// still unconfirmed after a write that changed nothing was forgotten and begun again
/// meanwhile, and the write is tried again; only a write that never reaches the row ends the
/// tries, with nothing recorded: a BEFORE trigger of the DBA's that returns NULL, or a
/// row-level security policy that lets the role read the call but not change it.
fn change(call: &Call<'_>, mut write: impl FnMut() -> Result<bool>) -> Result<Found> {
    for _ in 0..CONFLICT_TRIES {
        if write()? {
            return Ok(Found::Changed);
        }
        match recorded(call)? {
            None => return Ok(Found::NotBegun),
            Some(r) if r.confirmed => return Ok(Found::Confirmed),
            Some(_) => {}
        }
    }
    Err(IdemError::new(
        SqlState::ObjectNotInPrerequisiteState,
        format!("the external call for {} is unconfirmed, and could not be changed", call.named()),
    )
    .detail("Its UPDATE or DELETE changed no row three times, though the call can be read and is not confirmed: nothing was recorded.")
    .hint("A BEFORE UPDATE or DELETE trigger on idempotency.external_calls that returns NULL, or a row-level security policy that lets this role read the call but not change it, would do this."))
}

/// How long a begun call may stay unconfirmed before idempotency.unconfirmed_calls lists it.
pub static UNCONFIRMED_AFTER: GucSetting<i32> = GucSetting::<i32>::new(60);

pub fn define_settings() {
    GucRegistry::define_int_guc(
        c"idempotency.unconfirmed_after",
        c"How long an external call may stay begun and unconfirmed before idempotency.unconfirmed_calls lists it.",
        c"Set it above the longest time a call and its confirmation take, so that a call still in flight is not listed.",
        &UNCONFIRMED_AFTER,
        0,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_S,
    );
}

#[pg_extern(sql = false)]
fn idem_external_uuid(key: Option<&str>, scope: Option<&str>, step: Option<&str>) -> Option<Uuid> {
    finish(Call::parse(key, scope, step).map(|c| c.id))
}
sqlstate_entry!(idem_external_uuid_entry, pg_finfo_idem_external_uuid_entry, idem_external_uuid_wrapper);

/// The same key as text, for an `Idempotency-Key` header: the UUID's 36 lowercase characters,
/// so a key logged by the API and one logged by the consumer compare equal as text.
#[pg_extern(sql = false)]
fn idem_external_key(key: Option<&str>, scope: Option<&str>, step: Option<&str>) -> Option<String> {
    finish(Call::parse(key, scope, step).map(|c| c.id.to_string()))
}
sqlstate_entry!(idem_external_key_entry, pg_finfo_idem_external_key_entry, idem_external_key_wrapper);

// pgrx reads the row's column names from this signature: it cannot be a type alias.
#[allow(clippy::type_complexity)]
#[pg_extern(sql = false)]
fn idem_call_begin(
    key: Option<&str>,
    scope: Option<&str>,
    step: Option<&str>,
) -> TableIterator<
    'static,
    (
        name!(state, Option<String>),
        name!(call_key, Option<String>),
        name!(response, Option<StoredJsonb>),
        name!(begun_at, Option<TimestampWithTimeZone>),
    ),
> {
    TableIterator::new(finish(Call::parse(key, scope, step).and_then(|c| begin(&c))))
}
sqlstate_entry!(idem_call_begin_entry, pg_finfo_idem_call_begin_entry, idem_call_begin_wrapper);

#[pg_extern(sql = false)]
fn idem_call_confirm(
    key: Option<&str>,
    scope: Option<&str>,
    step: Option<&str>,
    response: Option<JsonB>,
) -> Option<bool> {
    finish(Call::parse(key, scope, step).and_then(|c| confirm(&c, response)))
}
sqlstate_entry!(
    idem_call_confirm_entry,
    pg_finfo_idem_call_confirm_entry,
    idem_call_confirm_wrapper,
    checks = [crate::error::Check::Jsonb(3, "response")]
);

#[pg_extern(sql = false)]
fn idem_call_resolve(
    key: Option<&str>,
    scope: Option<&str>,
    step: Option<&str>,
    happened: Option<bool>,
    response: Option<JsonB>,
) {
    finish(Call::parse(key, scope, step).and_then(|c| resolve(&c, happened, response)));
}
sqlstate_entry!(
    idem_call_resolve_entry,
    pg_finfo_idem_call_resolve_entry,
    idem_call_resolve_wrapper,
    checks = [crate::error::Check::Jsonb(4, "response")]
);
