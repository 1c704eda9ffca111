//! Any bytes as a jsonb root container: read or refused, never a panic or a read outside.
#![no_main]

use idempotency_core::jsonb::{integer, object_members, Value};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|root: &[u8]| {
    if let Ok(members) = object_members(root) {
        let count = u32::from_ne_bytes(root[..4].try_into().unwrap()) & 0x0FFF_FFFF;
        assert_eq!(members.len(), count as usize);
        for member in members {
            if let Value::Numeric(numeric) = member.value {
                let _ = integer(numeric);
            }
        }
    }
    let _ = integer(root);
});
