//! What the ledger stores instead of keys and payloads, and the ids the extension gives out.
//! These encodings are part of the on-disk format: the same input gives the same digest in
//! every session and every release, and changing any of them would make every stored claim
//! unreachable.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// A scope's 64-bit id, stored in every ledger row: the first 8 bytes of its name's SHA-256.
/// A consumer claims in one scope over and over, so the last one is kept per thread.
pub fn scope_id(name: &str) -> i64 {
    thread_local! {
        static LAST: std::cell::RefCell<Option<(String, i64)>> = const { std::cell::RefCell::new(None) };
    }
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        match &*last {
            Some((cached, id)) if cached == name => *id,
            _ => {
                let hash = Sha256::digest(name.as_bytes());
                let id = i64::from_be_bytes(hash[..8].try_into().expect("SHA-256 has 32 bytes"));
                *last = Some((name.to_string(), id));
                id
            }
        }
    })
}

/// 128 bits of SHA-256 over the length-prefixed scope and the key's bytes: keys compare
/// byte for byte (no collation, no normalisation) and a key of any length fits the index.
/// The length prefix makes (scope, key) → input injective; accidental collisions need about
/// 2^64 keys, crafted ones would need to break SHA-256.
pub fn key_digest(scope: &str, key: &str) -> [u8; 16] {
    let mut hasher = Sha256::new();
    hasher.update((scope.len() as u64).to_be_bytes());
    hasher.update(scope.as_bytes());
    hasher.update(key.as_bytes());
    truncate(hasher.finalize().as_slice())
}

/// Keys, scopes and steps may be megabytes long; messages quote at most their first 64
/// characters.
pub fn abbreviate(key: &str) -> String {
    match key.char_indices().nth(64) {
        Some((end, _)) => format!("{}…", &key[..end]),
        None => key.to_string(),
    }
}

/// The fingerprint of a payload: SHA-256 of its canonical JSON, so key order, whitespace,
/// duplicate keys and trailing zeros in numbers (1.0 = 1) do not change it.
pub fn fingerprint(payload: &Value) -> [u8; 16] {
    let mut canonical = String::new();
    write_canonical(payload, &mut canonical);
    truncate(Sha256::digest(canonical.as_bytes()).as_slice())
}

fn truncate(hash: &[u8]) -> [u8; 16] {
    hash[..16].try_into().expect("SHA-256 has 32 bytes")
}

/// A name-based UUID, version 8 (RFC 9562's custom kind), from the first 128 bits of a
/// SHA-256: what the extension gives out as ids that others store (message ids, external keys).
pub fn uuid_v8(hash: &[u8]) -> [u8; 16] {
    let mut id = truncate(hash);
    id[6] = (id[6] & 0x0f) | 0x80;
    id[8] = (id[8] & 0x3f) | 0x80;
    id
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

/// A number's text without a fractional tail of zeros, and zero without a sign. jsonb never
/// prints an exponent; should one come, it is kept, and only the fraction before it trimmed.
pub fn canonical_number(text: &str) -> String {
    let (mantissa, exponent) = text.split_at(text.find(['e', 'E']).unwrap_or(text.len()));
    let trimmed = match mantissa.split_once('.') {
        Some((int, frac)) => {
            let frac = frac.trim_end_matches('0');
            if frac.is_empty() {
                int.to_string()
            } else {
                format!("{int}.{frac}")
            }
        }
        None => mantissa.to_string(),
    };
    if trimmed == "-0" && exponent.is_empty() {
        "0".into()
    } else {
        trimmed + exponent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_lose_only_their_zero_tail() {
        assert_eq!(canonical_number("1.000"), "1");
        assert_eq!(canonical_number("1.50"), "1.5");
        assert_eq!(canonical_number("100"), "100");
        assert_eq!(canonical_number("-0.0"), "0");
        // Found by fuzz/canonical_json: trimming ran into the exponent and made "7.66e".
        assert_eq!(canonical_number("7.66e0"), "7.66e0");
        assert_eq!(canonical_number("1.50E+10"), "1.5E+10");
    }

    #[test]
    fn canonical_json_sorts_keys_and_drops_whitespace() {
        let v: Value = serde_json::from_str(r#"{ "b": [1.0, {"d":2,"c":"x"}], "a": null }"#).unwrap();
        let mut s = String::new();
        write_canonical(&v, &mut s);
        assert_eq!(s, r#"{"a":null,"b":[1,{"c":"x","d":2}]}"#);
    }

    #[test]
    fn digest_separates_scope_from_key() {
        assert_ne!(key_digest("ab", "c"), key_digest("a", "bc"));
        assert_ne!(scope_id("ab"), scope_id("a"));
    }

    #[test]
    fn the_scope_id_cache_answers_for_the_name_asked() {
        let a = scope_id("a");
        assert_ne!(scope_id("b"), a);
        assert_eq!(scope_id("a"), a);
        assert_eq!(scope_id(""), i64::from_be_bytes(Sha256::digest(b"")[..8].try_into().unwrap()));
    }

    /// The on-disk encodings, pinned: escapes, control characters, non-ASCII keys and values,
    /// negative zero, long numbers and nesting. A change here makes stored claims unreachable.
    #[test]
    fn encodings_are_pinned() {
        let v: Value = serde_json::from_str(
            r#"{"b":[1.50,{"d":"\u0000\t\"\\/é😀","c":-0.0}],"a":null,"":true,"é":12345678901234567890.1230}"#,
        )
        .unwrap();
        let mut canonical = String::new();
        write_canonical(&v, &mut canonical);
        assert_eq!(
            canonical,
            r#"{"":true,"a":null,"b":[1.5,{"c":0,"d":"\u0000\t\"\\/é😀"}],"é":12345678901234567890.123}"#
        );
        let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
        assert_eq!(hex(&fingerprint(&v)), "8fb9e654725c6007ae26ac841a8cb1a5");
        assert_eq!(hex(&fingerprint(&Value::Array(vec![]))), "4f53cda18c2baa0c0354bb5f9a3ecbe5");
        assert_eq!(hex(&key_digest("billing", "order-1:paid")), "0b98cc6a085cbb6eb4755025115dc418");
        assert_eq!(hex(&key_digest("é", "😀|\\")), "d9ee8ff382028d6513f99ba21034271e");
        assert_eq!(hex(&key_digest("a", "")), "3b196fd4907bedf51c3090e9835f2f7c");
        assert_eq!(scope_id("billing"), 906_850_720_199_613_079);
        assert_eq!(scope_id("é"), 5_375_421_630_974_772_051);
    }
}
