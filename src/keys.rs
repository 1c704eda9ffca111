//! Deterministic keys from SQL: the formats themselves live in idempotency-core's `keys`,
//! where they are fuzzed; here are the arguments, their types and their errors.

use std::borrow::Cow;

use idempotency_core::keys::{child_key as join_child, join_parts as join, key_part, lookup, utc_text, uuid_text};
use pgrx::prelude::*;

use crate::digest::{abbreviate, parse_key};
use crate::error::{required, sqlstate_entry, IdemError, Result, SqlState};
use crate::postgres::args::{variadic_any, Part};

fn join_parts<'a>(parts: impl IntoIterator<Item = Result<Cow<'a, str>>>) -> Result<String> {
    join(parts)?.ok_or_else(|| IdemError::new(SqlState::InvalidParameterValue, "a key needs at least one part"))
}

fn business_key(parts: Option<Array<'_, &str>>) -> Result<String> {
    let parts = required(parts, "parts")?;
    join_parts(parts.iter().enumerate().map(|(i, part)| part.map(Into::into).ok_or_else(|| null_part(i))))
}

fn null_part(i: usize) -> IdemError {
    IdemError::new(SqlState::NullValueNotAllowed, format!("key part {} is NULL", i + 1))
        .hint("A missing field would make different messages share a key; pass the value or leave the part out.")
}

/// A key from parts of any type. Each part's text is a compatibility promise, the same in
/// every session whatever its settings, so that the function can stay IMMUTABLE and a key
/// derived today is the key derived after any upgrade. Text parts are unchanged, so keys
/// made from text by the `text[]` form are made alike here.
fn any_key(parts: Option<Vec<Part>>) -> Result<String> {
    let parts = required(parts, "parts")?;
    join_parts(parts.into_iter().enumerate().map(|(i, part)| part_text(i, part)))
}

fn part_text(i: usize, part: Part) -> Result<Cow<'static, str>> {
    Ok(match part {
        Part::Null => return Err(null_part(i)),
        Part::Text(text) | Part::Numeric(text) => text.into(),
        Part::Integer(n) => n.to_string().into(),
        Part::Bool(b) => if b { "true" } else { "false" }.into(),
        Part::Uuid(bytes) => uuid_text(&bytes).into(),
        Part::Timestamptz(micros) => utc_text(micros).into(),
        Part::Other(type_name) => {
            return Err(IdemError::new(
                SqlState::DatatypeMismatch,
                format!("key part {} is of type {type_name}, which has no fixed text form in a key", i + 1),
            )
            .hint("Cast the part to text (part::text) to choose its text yourself."))
        }
    })
}

fn child_key(parent: Option<&str>, position: Option<i32>) -> Result<String> {
    let parent = parse_key(parent, "parent")?;
    let position = required(position, "position")?;
    let position = u32::try_from(position).map_err(|_| {
        IdemError::new(SqlState::InvalidParameterValue, format!("position must be zero or more, not {position}"))
    })?;
    Ok(join_child(parent, position))
}

fn payload_key(payload: Option<pgrx::JsonB>, paths: Option<Array<'_, &str>>) -> Result<String> {
    let payload = required(payload, "payload")?.0;
    let paths = required(paths, "paths")?;
    let parts: Vec<Result<Cow<'_, str>>> = paths
        .iter()
        .map(|path| {
            let path = required(path, "path")?;
            if path.is_empty() {
                return Err(IdemError::new(SqlState::InvalidParameterValue, "path must not be empty"));
            }
            let value = lookup(&payload, path).ok_or_else(|| {
                IdemError::new(
                    SqlState::KeyMissingFromPayload,
                    format!("payload has no value at \"{}\"", abbreviate(path)),
                )
                .hint("The key cannot be derived, so the message cannot be deduplicated; reject it or send it to the DLQ.")
            })?;
            Ok(key_part(value).into())
        })
        .collect();
    join_parts(parts)
}

#[pg_extern(sql = false)]
fn idem_key(parts: Option<Array<'_, &str>>) -> Option<String> {
    crate::error::finish(business_key(parts))
}
sqlstate_entry!(idem_key_entry, pg_finfo_idem_key_entry, idem_key_wrapper);

/// `idem_key(VARIADIC parts "any")`: a V1 function of its own, as pgrx cannot declare "any".
#[pg_guard]
unsafe extern "C-unwind" fn idem_key_any(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: PostgreSQL calls this entry only through the SQL declaration VARIADIC "any".
    let parts = unsafe { variadic_any(fcinfo) };
    match crate::error::finish(any_key(parts)) {
        Some(key) => key.into_datum().expect("text always makes a datum"),
        None => {
            // SAFETY: fcinfo is the live call; a NULL result is reported through it.
            unsafe { (*fcinfo).isnull = true };
            pg_sys::Datum::from(0)
        }
    }
}
sqlstate_entry!(idem_key_any_entry, pg_finfo_idem_key_any_entry, idem_key_any);

#[pg_extern(sql = false)]
fn idem_child_key(parent: Option<&str>, position: Option<i32>) -> Option<String> {
    crate::error::finish(child_key(parent, position))
}
sqlstate_entry!(idem_child_key_entry, pg_finfo_idem_child_key_entry, idem_child_key_wrapper);

#[pg_extern(sql = false)]
fn idem_key_from(payload: Option<pgrx::JsonB>, paths: Option<Array<'_, &str>>) -> Option<String> {
    crate::error::finish(payload_key(payload, paths))
}
sqlstate_entry!(
    idem_key_from_entry,
    pg_finfo_idem_key_from_entry,
    idem_key_from_wrapper,
    checks = [crate::error::Check::Jsonb(0, "payload")]
);

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::*;

    #[pg_test]
    fn child_keys_put_the_position_last() {
        assert_eq!(child_key(Some("m#1"), Some(2)).unwrap(), "m#1#2");
        assert_eq!(child_key(Some("m"), Some(-1)).unwrap_err().state(), Some(SqlState::InvalidParameterValue));
    }
}
