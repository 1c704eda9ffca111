//! What the ledger stores instead of keys and payloads. These encodings are part of the
//! on-disk format: the same input gives the same digest in every session and every release,
//! and changing any of them would make every stored claim unreachable.

use pgrx::datum::Uuid;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::error::{required, IdemError, Result, SqlState};

/// A consumer claims in one scope, over and over: the last scope's id is kept per backend.
/// (Scope names are never empty, so the initial empty name never matches.)
fn scope_id(name: &str) -> i64 {
    thread_local! {
        static LAST: std::cell::RefCell<(String, i64)> = const { std::cell::RefCell::new((String::new(), 0)) };
    }
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        if last.0 != name {
            let hash = Sha256::digest(name.as_bytes());
            *last = (name.to_string(), i64::from_be_bytes(hash[..8].try_into().expect("SHA-256 has 32 bytes")));
        }
        last.1
    })
}

/// A validated scope: its name and the 64-bit id stored in every ledger row.
#[derive(Clone, Copy)]
pub struct Scope<'a> {
    pub name: &'a str,
    pub id: i64,
}

impl<'a> Scope<'a> {
    pub fn parse(name: Option<&'a str>) -> Result<Self> {
        let name = required(name, "scope")?;
        if name.is_empty() {
            return Err(IdemError::new(SqlState::InvalidParameterValue, "scope must not be empty")
                .hint("Omit the argument to use the scope 'default'."));
        }
        Ok(Scope { name, id: scope_id(name) })
    }

    /// 128 bits of SHA-256 over the length-prefixed scope and the key's bytes: keys compare
    /// byte for byte (no collation, no normalisation) and a key of any length fits the index.
    /// Accidental collisions need about 2^64 keys; crafted ones would need to break SHA-256.
    pub fn key_digest(&self, key: &str) -> Uuid {
        let mut hasher = Sha256::new();
        hasher.update((self.name.len() as u64).to_be_bytes());
        hasher.update(self.name.as_bytes());
        hasher.update(key.as_bytes());
        Uuid::from_bytes(truncate(hasher.finalize().as_slice()))
    }
}

/// Keys, scopes and steps may be megabytes long; messages quote at most their first 64
/// characters.
pub fn abbreviate(key: &str) -> String {
    match key.char_indices().nth(64) {
        Some((end, _)) => format!("{}…", &key[..end]),
        None => key.to_string(),
    }
}

/// A key argument (named `name` in messages): present and not empty.
pub fn parse_key<'a>(key: Option<&'a str>, name: &str) -> Result<&'a str> {
    let key = required(key, name)?;
    if key.is_empty() {
        return Err(IdemError::new(SqlState::InvalidParameterValue, format!("{name} must not be empty"))
            .hint("Build keys from the message's business identity, e.g. idem_key('order', order_id, 'paid')."));
    }
    Ok(key)
}

/// The fingerprint of a payload: SHA-256 of its canonical JSON, so key order, whitespace,
/// duplicate keys and trailing zeros in numbers (1.0 = 1) do not change it.
pub fn fingerprint(payload: &Value) -> Uuid {
    let mut canonical = String::new();
    write_canonical(payload, &mut canonical);
    Uuid::from_bytes(truncate(Sha256::digest(canonical.as_bytes()).as_slice()))
}

fn truncate(hash: &[u8]) -> [u8; 16] {
    hash[..16].try_into().expect("SHA-256 has 32 bytes")
}

/// A name-based UUID, version 8 (RFC 9562's custom kind), from the first 128 bits of a
/// SHA-256: what the extension gives out as ids that others store (message ids, external keys).
pub fn uuid_v8(hash: &[u8]) -> Uuid {
    let mut id = truncate(hash);
    id[6] = (id[6] & 0x0f) | 0x80;
    id[8] = (id[8] & 0x3f) | 0x80;
    Uuid::from_bytes(id)
}

/// Compact JSON with object keys in code-point order (serde_json's map is a BTreeMap) and
/// numbers without a fractional tail of zeros. jsonb never prints exponents, so stripping
/// zeros is the whole numeric normalisation.
pub fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        Value::Number(n) => out.push_str(&canonical_number(&n.to_string())),
        other => out.push_str(&other.to_string()),
    }
}

fn canonical_number(text: &str) -> String {
    let trimmed = match text.split_once('.') {
        Some((int, frac)) => {
            let frac = frac.trim_end_matches('0');
            if frac.is_empty() {
                int.to_string()
            } else {
                format!("{int}.{frac}")
            }
        }
        None => text.to_string(),
    };
    if trimmed == "-0" {
        "0".into()
    } else {
        trimmed
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::*;
    use pgrx::prelude::*;

    #[pg_test]
    fn numbers_lose_only_their_zero_tail() {
        assert_eq!(canonical_number("1.000"), "1");
        assert_eq!(canonical_number("1.50"), "1.5");
        assert_eq!(canonical_number("100"), "100");
        assert_eq!(canonical_number("-0.0"), "0");
    }

    #[pg_test]
    fn canonical_json_sorts_keys_and_drops_whitespace() {
        let v: Value = serde_json::from_str(r#"{ "b": [1.0, {"d":2,"c":"x"}], "a": null }"#).unwrap();
        let mut s = String::new();
        write_canonical(&v, &mut s);
        assert_eq!(s, r#"{"a":null,"b":[1,{"c":"x","d":2}]}"#);
    }

    #[pg_test]
    fn digest_separates_scope_from_key() {
        let ab = Scope::parse(Some("ab")).unwrap();
        let a = Scope::parse(Some("a")).unwrap();
        assert_ne!(ab.key_digest("c"), a.key_digest("bc"));
        assert_ne!(ab.id, a.id);
    }
}
