//! Payload canonicalisation on any JSON text: the canonical form is JSON, is its own
//! canonical form, and does not depend on the order the members came in.
#![no_main]

use idempotency_core::digest::{fingerprint, write_canonical};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fn canonical(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

/// The value's text with every object's members in reverse order.
fn reversed(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let members: Vec<String> =
                map.iter().rev().map(|(k, v)| format!("{} : {}", Value::String(k.clone()), reversed(v))).collect();
            format!("{{ {} }}", members.join(" , "))
        }
        Value::Array(items) => format!("[ {} ]", items.iter().map(reversed).collect::<Vec<_>>().join(" , ")),
        other => other.to_string(),
    }
}

fuzz_target!(|text: &[u8]| {
    let Ok(value) = serde_json::from_slice::<Value>(text) else { return };
    let once = canonical(&value);
    let again: Value = serde_json::from_str(&once).expect("the canonical form is JSON");
    assert_eq!(canonical(&again), once);
    let other: Value = serde_json::from_str(&reversed(&value)).unwrap();
    assert_eq!(fingerprint(&other), fingerprint(&value));
});
