//! Properties of the pgrx-free core, on generated inputs (proptest): the in-place jsonb
//! and numeric readers against encoders written from PostgreSQL's own, key derivation's
//! injectivity, and the payload canonicalisation's stability. `make test` runs the default
//! case count; PROPTEST_CASES raises it (`make fuzz`).

mod common;

use std::borrow::Cow;

use common::{digest_input, encode_object, split_parts, stored_order, Json, Numeric};
use idempotency_core::digest::{canonical_number, fingerprint, key_digest, write_canonical};
use idempotency_core::jsonb::{integer, object_members, Value};
use idempotency_core::keys::{child_key, join_parts, utc_text, uuid_text};
use proptest::prelude::*;
use sha2::{Digest, Sha256};

fn numeric() -> impl Strategy<Value = Numeric> {
    (
        any::<bool>(),
        -8i16..8,
        prop_oneof![Just(0u16), 0u16..12, 60u16..70],
        prop::collection::vec(prop_oneof![0u16..10_000, Just(0), Just(9_999)], 0..7),
    )
        .prop_map(|(negative, weight, scale, digits)| Numeric::normalized(negative, weight, scale, digits))
}

fn key_text() -> impl Strategy<Value = String> {
    prop_oneof![".{0,12}", "[a-z]{0,3}", ".{30,80}"]
}

fn json(depth: u32) -> BoxedStrategy<Json> {
    let leaf = prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::Bool),
        ".{0,40}".prop_map(Json::String),
        numeric().prop_map(Json::Number),
    ];
    if depth == 0 {
        return leaf.boxed();
    }
    prop_oneof![
        4 => leaf,
        1 => prop::collection::vec((key_text(), json(depth - 1)), 0..5).prop_map(Json::Object),
    ]
    .boxed()
}

/// Up to 70 members, so that both the keys' and the values' JEntries cross the stride of 32
/// at which jsonb stores an end offset instead of a length.
fn object() -> impl Strategy<Value = Vec<(String, Json)>> {
    prop::collection::vec((key_text(), json(2)), 0..70)
}

/// Microseconds since 2000-01-01 from utc_text's fields, by days_from_civil.
fn micros_of(text: &str) -> i64 {
    let (date, time) = text.strip_suffix('Z').unwrap().split_once('T').unwrap();
    let (sign, date) = match date.strip_prefix('-') {
        Some(rest) => (-1, rest),
        None => (1, date.strip_prefix('+').unwrap_or(date)),
    };
    let fields: Vec<i64> = date.split('-').map(|f| f.parse().unwrap()).collect();
    let (y, m, d) = (sign * fields[0], fields[1], fields[2]);
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468 - 10_957;
    let (hms, micros) = time.split_once('.').unwrap();
    let hms: Vec<i64> = hms.split(':').map(|f| f.parse().unwrap()).collect();
    (days * 86_400 + hms[0] * 3600 + hms[1] * 60 + hms[2]) * 1_000_000 + micros.parse::<i64>().unwrap()
}

fn canonical(value: &serde_json::Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

/// A JSON text of the test value, with object members in the given order and spacing, and
/// numbers as jsonb prints them, optionally with more trailing zeros.
fn json_text(value: &Json, reverse: bool, space: &str, zeros: usize) -> String {
    match value {
        Json::Null => "null".into(),
        Json::Bool(b) => b.to_string(),
        Json::String(s) => serde_json::Value::String(s.clone()).to_string(),
        Json::Number(n) => {
            let text = n.text();
            if zeros > 0 {
                format!("{text}{}{}", if text.contains('.') { "" } else { "." }, "0".repeat(zeros))
            } else {
                text
            }
        }
        Json::Object(pairs) => {
            let mut pairs = stored_order(pairs);
            if reverse {
                pairs.reverse();
            }
            let members: Vec<String> = pairs
                .iter()
                .map(|(k, v)| {
                    format!(
                        "{}{space}:{space}{}",
                        serde_json::Value::String(k.clone()),
                        json_text(v, reverse, space, zeros)
                    )
                })
                .collect();
            format!("{{{space}{}{space}}}", members.join(&format!(",{space}")))
        }
    }
}

proptest! {
    #[test]
    fn members_are_read_as_they_were_written(pairs in object()) {
        let root = encode_object(&pairs);
        let members = object_members(&root).unwrap();
        let expected = stored_order(&pairs);
        prop_assert_eq!(members.len(), expected.len());
        for (member, (name, value)) in members.iter().zip(&expected) {
            prop_assert_eq!(member.name, name.as_str());
            match (member.value, value) {
                (Value::Null, Json::Null) => {}
                (Value::Bool(read), Json::Bool(written)) => prop_assert_eq!(read, *written),
                (Value::String(read), Json::String(written)) => prop_assert_eq!(read, written.as_bytes()),
                (Value::Numeric(read), Json::Number(written)) => prop_assert_eq!(read, &written.encode(true)[..]),
                (Value::Container(read), Json::Object(written)) => prop_assert_eq!(read, &encode_object(written)[..]),
                (read, written) => prop_assert!(false, "{read:?} read for {written:?}"),
            }
        }
    }

    #[test]
    fn an_integer_is_read_exactly_when_its_text_is_one(n in numeric(), short in any::<bool>()) {
        let expected = if n.scale == 0 { n.text().parse::<i64>().ok() } else { None };
        prop_assert_eq!(integer(&n.encode(short)), expected, "{}", n.text());
        if let Some(packed) = n.encode_packed(short) {
            prop_assert_eq!(integer(&packed), expected, "{} with a 1-byte header", n.text());
        }
    }

    #[test]
    fn every_i64_is_read_back(value in prop_oneof![any::<i64>(), -20_000i64..20_000, Just(i64::MIN), Just(i64::MAX)]) {
        let mut digits = Vec::new();
        let mut rest = value.unsigned_abs();
        while rest > 0 {
            digits.insert(0, (rest % 10_000) as u16);
            rest /= 10_000;
        }
        let weight = digits.len() as i16 - 1;
        let n = Numeric::normalized(value < 0, weight, 0, digits);
        prop_assert_eq!(integer(&n.encode(true)), Some(value));
        prop_assert_eq!(integer(&n.encode(false)), Some(value));
    }

    #[test]
    fn any_bytes_are_read_or_refused_without_a_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        if let Ok(members) = object_members(&bytes) {
            for member in members {
                if let Value::Numeric(numeric) = member.value {
                    let _ = integer(numeric);
                }
            }
        }
        let _ = integer(&bytes);
    }

    #[test]
    fn key_parts_round_trip(parts in prop::collection::vec(".{0,8}|[|\\\\]{0,3}", 1..6)) {
        let key = join_parts(parts.iter().map(|p| Ok::<_, ()>(Cow::Borrowed(p.as_str())))).unwrap().unwrap();
        prop_assert_eq!(split_parts(&key), parts);
    }

    #[test]
    fn child_keys_split_at_their_last_hash(parent in ".{1,20}", position in any::<u32>()) {
        let key = child_key(&parent, position);
        let (p, n) = key.rsplit_once('#').unwrap();
        prop_assert_eq!((p, n.parse::<u32>().unwrap()), (parent.as_str(), position));
    }

    #[test]
    fn digests_are_the_documented_construction(scope in ".{0,20}", key in ".{0,20}", other in ".{0,20}") {
        let input = digest_input(&scope, &key);
        prop_assert_eq!(&key_digest(&scope, &key)[..], &Sha256::digest(&input)[..16]);
        // The construction is injective: the length prefix says where the scope ends.
        let length = u64::from_be_bytes(input[..8].try_into().unwrap()) as usize;
        prop_assert_eq!((&input[8..8 + length], &input[8 + length..]), (scope.as_bytes(), key.as_bytes()));
        if other != key {
            prop_assert_ne!(key_digest(&scope, &key), key_digest(&scope, &other));
        }
    }

    #[test]
    fn timestamps_read_back(micros in prop_oneof![any::<i64>(), -10i64.pow(17)..10i64.pow(17)]) {
        let text = utc_text(micros);
        match micros {
            i64::MIN => prop_assert_eq!(text, "-infinity"),
            i64::MAX => prop_assert_eq!(text, "infinity"),
            _ => prop_assert_eq!(micros_of(&text), micros, "{}", text),
        }
    }

    #[test]
    fn uuids_read_back(bytes in any::<[u8; 16]>()) {
        let text = uuid_text(&bytes);
        let hex: String = text.split('-').collect();
        prop_assert_eq!(text.len(), 36);
        prop_assert_eq!(hex, bytes.iter().map(|b| format!("{b:02x}")).collect::<String>());
    }

    #[test]
    fn the_canonical_form_ignores_order_spacing_and_zero_tails(pairs in object(), zeros in 1usize..4) {
        let value = Json::Object(pairs);
        let plain: serde_json::Value = serde_json::from_str(&json_text(&value, false, "", 0)).unwrap();
        let other: serde_json::Value = serde_json::from_str(&json_text(&value, true, " \n", zeros)).unwrap();
        let once = canonical(&plain);
        prop_assert_eq!(&canonical(&other), &once);
        prop_assert_eq!(fingerprint(&plain), fingerprint(&other));
        // Stable: the canonical form is its own canonical form.
        prop_assert_eq!(canonical(&serde_json::from_str(&once).unwrap()), once);
    }

    #[test]
    fn canonical_numbers_drop_only_zero_tails(int in "-?(0|[1-9][0-9]{0,30})", frac in "[0-9]{0,10}", zeros in 0usize..5) {
        let text = format!("{int}.{frac}{}", "0".repeat(zeros));
        let frac = frac.trim_end_matches('0');
        let expected = if frac.is_empty() { int.clone() } else { format!("{int}.{frac}") };
        let expected = if expected == "-0" { "0".to_string() } else { expected };
        prop_assert_eq!(canonical_number(&text), expected);
    }
}

/// What the extension hands on to PostgreSQL, which trusts the headers inside, must lie
/// within its member: a number whose varlena header claims more (found by review: the
/// extension read up to 64 kB past the datum), a nested object with more JEntries than bytes.
#[test]
fn a_number_or_container_larger_than_its_member_is_corrupt() {
    use idempotency_core::jsonb::Error;
    // Root header, two JEntries, the key "n", padding to 4: the numeric starts at 16.
    let number = Numeric::normalized(false, 0, 0, vec![5]);
    let mut root = encode_object(&[("n".into(), Json::Number(number))]);
    assert!(object_members(&root).is_ok());
    root[16..20].copy_from_slice(&common::varlena(&vec![0; 65_532])[..4]);
    assert_eq!(object_members(&root), Err(Error::Corrupt));

    let mut root = encode_object(&[("o".into(), Json::Object(vec![("a".into(), Json::Null)]))]);
    assert!(object_members(&root).is_ok());
    root[16..20].copy_from_slice(&(1000u32 | 0x2000_0000).to_ne_bytes());
    assert_eq!(object_members(&root), Err(Error::Corrupt));
}
