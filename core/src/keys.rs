//! Deterministic keys. A key must name the fact a message carries, never the delivery: the
//! same inputs give the same key in every session and every release (the formats below are
//! a compatibility promise), and nothing random ever enters one.

use std::borrow::Cow;

use serde_json::Value;

use crate::digest::write_canonical;

/// Joins parts with '|' after escaping '\' and '|' with a backslash, so the encoding is
/// injective: ('a|b', 'c') and ('a', 'b|c') differ, and it stays readable. None for no parts,
/// and the first error of any part.
pub fn join_parts<'a, E>(parts: impl IntoIterator<Item = Result<Cow<'a, str>, E>>) -> Result<Option<String>, E> {
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
    Ok((count > 0).then_some(key))
}

/// A child key: the position is digits only, so the last '#' always separates it from the
/// parent.
pub fn child_key(parent: &str, position: u32) -> String {
    format!("{parent}#{position}")
}

/// The canonical lowercase form uuid_out writes.
pub fn uuid_text(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

/// A timestamptz (microseconds since 2000-01-01 UTC) in ISO 8601 in UTC with microseconds,
/// `2024-01-02T03:04:05.000000Z`, whatever TimeZone and DateStyle say. Years outside
/// 0000–9999 get a sign and at least four digits (ISO 8601's expanded form; year 0 is 1 BC),
/// and the infinities keep PostgreSQL's names.
pub fn utc_text(micros: i64) -> String {
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

/// The value at a dotted path, where a segment of digits indexes an array; None where the
/// path leads nowhere or to null.
pub fn lookup<'v>(payload: &'v Value, path: &str) -> Option<&'v Value> {
    let mut at = payload;
    for segment in path.split('.') {
        at = match at {
            Value::Object(map) => map.get(segment),
            // Digits only: usize's parser also takes "+1", which is no index.
            Value::Array(items) if !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit()) => {
                segment.parse::<usize>().ok().and_then(|i| items.get(i))
            }
            _ => None,
        }?;
    }
    (!at.is_null()).then_some(at)
}

/// A payload value as a key part: a string's contents, anything else as canonical JSON.
pub fn key_part(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => {
            let mut text = String::new();
            write_canonical(other, &mut text);
            text
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(parts: &[&str]) -> Option<String> {
        join_parts(parts.iter().map(|p| Ok::<_, ()>(Cow::Borrowed(*p)))).unwrap()
    }

    #[test]
    fn part_boundaries_never_collide() {
        assert_ne!(key(&["a|b", "c"]), key(&["a", "b|c"]));
        assert_ne!(key(&["a\\", "b"]), key(&["a", "\\b"]));
        assert_ne!(key(&["a", ""]), key(&["a"]));
        assert_eq!(key(&["order", "42", "paid"]).unwrap(), "order|42|paid");
        assert_eq!(key(&[]), None);
    }

    #[test]
    fn only_digits_index_an_array() {
        let payload: Value = serde_json::from_str(r#"{"items": [10, 20, 30]}"#).unwrap();
        assert_eq!(lookup(&payload, "items.1"), Some(&Value::from(20)));
        assert_eq!(lookup(&payload, "items.01"), Some(&Value::from(20)));
        for not_an_index in ["items.+1", "items.-1", "items. 1", "items.", "items.1e0"] {
            assert_eq!(lookup(&payload, not_an_index), None, "{not_an_index}");
        }
    }

    #[test]
    fn timestamps_are_utc_with_microseconds_across_day_and_era_boundaries() {
        assert_eq!(utc_text(0), "2000-01-01T00:00:00.000000Z");
        assert_eq!(utc_text(-1), "1999-12-31T23:59:59.999999Z");
        assert_eq!(utc_text(5_097_600_000_000), "2000-02-29T00:00:00.000000Z");
        assert_eq!(utc_text(i64::MAX), "infinity");
        assert_eq!(uuid_text(&[0xAB; 16]), "abababab-abab-abab-abab-abababababab");
    }
}
