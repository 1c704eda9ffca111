//! Deterministic keys. A key must name the fact a message carries, never the delivery: the
//! same inputs give the same key in every session and every release (the formats below are
//! a compatibility promise), and nothing random ever enters one.

use pgrx::prelude::*;
use serde_json::Value;

use crate::digest::{abbreviate, parse_key, write_canonical};
use crate::error::{required, sqlstate_entry, IdemError, Result, SqlState};
use crate::postgres::args::{variadic_any, Part};

/// Joins parts with '|' after escaping '\' and '|' with a backslash, so the encoding is
/// injective: idem_key('a|b','c') and idem_key('a','b|c') differ, and it stays readable.
fn join_parts<'a>(parts: impl IntoIterator<Item = Result<std::borrow::Cow<'a, str>>>) -> Result<String> {
    let mut key = String::new();
    let mut count = 0;
    for part in parts {
        if count > 0 {
            key.push('|');
        }
        for ch in part?.chars() {
            if ch == '\\' || ch == '|' {
                key.push('\\');
            }
            key.push(ch);
        }
        count += 1;
    }
    if count == 0 {
        return Err(IdemError::new(SqlState::InvalidParameterValue, "a key needs at least one part"));
    }
    Ok(key)
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

fn part_text(i: usize, part: Part) -> Result<std::borrow::Cow<'static, str>> {
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

/// The canonical lowercase form uuid_out writes.
fn uuid_text(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

/// ISO 8601 in UTC with microseconds, `2024-01-02T03:04:05.000000Z`, whatever TimeZone and
/// DateStyle say. Years outside 0000–9999 get a sign and at least four digits (ISO 8601's
/// expanded form; year 0 is 1 BC), and the infinities keep PostgreSQL's names.
fn utc_text(micros: i64) -> String {
    const DAY: i64 = 86_400_000_000;
    match micros {
        i64::MIN => return "-infinity".into(),
        i64::MAX => return "infinity".into(),
        _ => {}
    }
    let (days, time) = (micros.div_euclid(DAY), micros.rem_euclid(DAY));
    // Days since 1970-01-01 to a civil date (Howard Hinnant's days_from_civil, inverted).
    let z = days + 10_957 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let year = if (0..=9999).contains(&year) { format!("{year:04}") } else { format!("{year:+05}") };
    let seconds = time / 1_000_000;
    format!(
        "{year}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60,
        time % 1_000_000
    )
}

fn child_key(parent: Option<&str>, position: Option<i32>) -> Result<String> {
    let parent = parse_key(parent, "parent")?;
    let position = required(position, "position")?;
    if position < 0 {
        return Err(IdemError::new(
            SqlState::InvalidParameterValue,
            format!("position must be zero or more, not {position}"),
        ));
    }
    // The position is digits only, so the last '#' always separates it from the parent.
    Ok(format!("{parent}#{position}"))
}

fn payload_key(payload: Option<pgrx::JsonB>, paths: Option<Array<'_, &str>>) -> Result<String> {
    let payload = required(payload, "payload")?.0;
    let paths = required(paths, "paths")?;
    let parts: Vec<Result<std::borrow::Cow<'_, str>>> = paths
        .iter()
        .map(|path| {
            let path = required(path, "path")?;
            key_part(lookup(&payload, path)?).map(Into::into)
        })
        .collect();
    join_parts(parts)
}

/// Follows a dotted path; a segment of digits indexes an array.
fn lookup<'v>(payload: &'v Value, path: &str) -> Result<&'v Value> {
    if path.is_empty() {
        return Err(IdemError::new(SqlState::InvalidParameterValue, "path must not be empty"));
    }
    let missing = || {
        IdemError::new(SqlState::KeyMissingFromPayload, format!("payload has no value at \"{}\"", abbreviate(path)))
            .hint("The key cannot be derived, so the message cannot be deduplicated; reject it or send it to the DLQ.")
    };
    let mut at = payload;
    for segment in path.split('.') {
        at = match at {
            Value::Object(map) => map.get(segment),
            Value::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => None,
        }
        .ok_or_else(missing)?;
    }
    if at.is_null() {
        return Err(missing());
    }
    Ok(at)
}

fn key_part(value: &Value) -> Result<String> {
    Ok(match value {
        Value::String(s) => s.clone(),
        other => {
            let mut text = String::new();
            write_canonical(other, &mut text);
            text
        }
    })
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

    fn key(parts: &[&str]) -> String {
        join_parts(parts.iter().map(|p| Ok(std::borrow::Cow::Borrowed(*p)))).unwrap()
    }

    #[pg_test]
    fn part_boundaries_never_collide() {
        assert_ne!(key(&["a|b", "c"]), key(&["a", "b|c"]));
        assert_ne!(key(&["a\\", "b"]), key(&["a", "\\b"]));
        assert_ne!(key(&["a", ""]), key(&["a"]));
        assert_eq!(key(&["order", "42", "paid"]), "order|42|paid");
    }

    #[pg_test]
    fn timestamps_are_utc_with_microseconds_across_day_and_era_boundaries() {
        assert_eq!(utc_text(0), "2000-01-01T00:00:00.000000Z");
        assert_eq!(utc_text(-1), "1999-12-31T23:59:59.999999Z");
        assert_eq!(utc_text(5_097_600_000_000), "2000-02-29T00:00:00.000000Z");
        assert_eq!(utc_text(i64::MAX), "infinity");
        assert_eq!(uuid_text(&[0xAB; 16]), "abababab-abab-abab-abab-abababababab");
    }

    #[pg_test]
    fn child_keys_put_the_position_last() {
        assert_eq!(child_key(Some("m#1"), Some(2)).unwrap(), "m#1#2");
        assert_eq!(child_key(Some("m"), Some(-1)).unwrap_err().state(), Some(SqlState::InvalidParameterValue));
    }
}
