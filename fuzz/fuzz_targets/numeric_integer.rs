//! A numeric is read as an i64 exactly when numeric_out's text for it is an integer within
//! i64, in both numeric header formats and both varlena header sizes.
#![no_main]

#[path = "../../core/tests/common.rs"]
mod common;

use arbitrary::Unstructured;
use common::Numeric;
use idempotency_core::jsonb::integer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok((negative, weight, scale, short, count)) = (|| {
        Ok::<_, arbitrary::Error>((
            u.arbitrary::<bool>()?,
            u.int_in_range(-10i16..=10)?,
            u.int_in_range(0u16..=80)?,
            u.arbitrary::<bool>()?,
            u.int_in_range(0..=8)?,
        ))
    })() else {
        return;
    };
    let digits: Vec<u16> = (0..count).map_while(|_| u.int_in_range(0..=9_999).ok()).collect();
    let n = Numeric::normalized(negative, weight, scale, digits);
    let expected = if n.scale == 0 { n.text().parse::<i64>().ok() } else { None };
    assert_eq!(integer(&n.encode(short)), expected, "{}", n.text());
    if let Some(packed) = n.encode_packed(short) {
        assert_eq!(integer(&packed), expected, "{} with a 1-byte header", n.text());
    }
});
