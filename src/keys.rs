//! Deterministic keys. A key must name the fact a message carries, never the delivery: the
//! same inputs give the same key in every session and every release (the formats below are
//! a compatibility promise), and nothing random ever enters one.

use pgrx::prelude::*;
use serde_json::Value;

use crate::digest::{parse_key, write_canonical};
use crate::error::{required, sqlstate_entry, IdemError, Result, SqlState};

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
    join_parts(parts.iter().enumerate().map(|(i, part)| {
        part.map(Into::into).ok_or_else(|| {
            IdemError::new(SqlState::NullValueNotAllowed, format!("key part {} is NULL", i + 1)).hint(
                "A missing field would make different messages share a key; pass the value or leave the part out.",
            )
        })
    }))
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
        IdemError::new(SqlState::KeyMissingFromPayload, format!("payload has no value at \"{path}\""))
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

#[pg_extern(sql = false)]
fn idem_child_key(parent: Option<&str>, position: Option<i32>) -> Option<String> {
    crate::error::finish(child_key(parent, position))
}
sqlstate_entry!(idem_child_key_entry, pg_finfo_idem_child_key_entry, idem_child_key_wrapper);

#[pg_extern(sql = false)]
fn idem_key_from(payload: Option<pgrx::JsonB>, paths: Option<Array<'_, &str>>) -> Option<String> {
    crate::error::finish(payload_key(payload, paths))
}
sqlstate_entry!(idem_key_from_entry, pg_finfo_idem_key_from_entry, idem_key_from_wrapper);

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
    fn child_keys_put_the_position_last() {
        assert_eq!(child_key(Some("m#1"), Some(2)).unwrap(), "m#1#2");
        assert_eq!(child_key(Some("m"), Some(-1)).unwrap_err().state(), Some(SqlState::InvalidParameterValue));
    }
}
