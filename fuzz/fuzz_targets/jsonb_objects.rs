//! Objects written as convertJsonbObject writes them (core/tests/common.rs) are read back
//! member by member, in jsonb's order.
#![no_main]

#[path = "../../core/tests/common.rs"]
mod common;

use arbitrary::{Result, Unstructured};
use common::{encode_object, stored_order, Json, Numeric};
use idempotency_core::jsonb::{object_members, Value};
use libfuzzer_sys::fuzz_target;

fn numeric(u: &mut Unstructured) -> Result<Numeric> {
    let digits = (0..u.int_in_range(0..=6)?).map(|_| u.int_in_range(0..=9_999)).collect::<Result<_>>()?;
    Ok(Numeric::normalized(u.arbitrary()?, u.int_in_range(-8..=8)?, u.int_in_range(0..=70)?, digits))
}

fn json(u: &mut Unstructured, depth: u32) -> Result<Json> {
    Ok(match u.int_in_range(0..=if depth > 0 { 4 } else { 3 })? {
        0 => Json::Null,
        1 => Json::Bool(u.arbitrary()?),
        2 => Json::String(u.arbitrary()?),
        3 => Json::Number(numeric(u)?),
        _ => Json::Object(pairs(u, depth - 1)?),
    })
}

fn pairs(u: &mut Unstructured, depth: u32) -> Result<Vec<(String, Json)>> {
    (0..u.int_in_range(0..=80)?).map(|_| Ok((u.arbitrary()?, json(u, depth)?))).collect()
}

fn check(read: Value<'_>, written: &Json) {
    match (read, written) {
        (Value::Null, Json::Null) => {}
        (Value::Bool(read), Json::Bool(written)) => assert_eq!(read, *written),
        (Value::String(read), Json::String(written)) => assert_eq!(read, written.as_bytes()),
        (Value::Numeric(read), Json::Number(written)) => assert_eq!(read, &written.encode(true)[..]),
        (Value::Container(read), Json::Object(written)) => {
            assert_eq!(read, &encode_object(written)[..]);
            compare(read, written);
        }
        (read, written) => panic!("{read:?} read for {written:?}"),
    }
}

fn compare(root: &[u8], pairs: &[(String, Json)]) {
    let members = object_members(root).unwrap();
    let expected = stored_order(pairs);
    assert_eq!(members.len(), expected.len());
    for (member, (name, value)) in members.iter().zip(&expected) {
        assert_eq!(member.name, name);
        check(member.value, value);
    }
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    if let Ok(pairs) = pairs(&mut u, 2) {
        compare(&encode_object(&pairs), &pairs);
    }
});
