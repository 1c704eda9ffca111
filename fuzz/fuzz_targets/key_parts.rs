//! Key derivation: parts join injectively (they split back), child keys split at their last
//! '#', and the ledger digest is SHA-256 of the length-prefixed scope and the key.
#![no_main]

#[path = "../../core/tests/common.rs"]
mod common;

use std::borrow::Cow;

use common::{digest_input, split_parts};
use idempotency_core::digest::key_digest;
use idempotency_core::keys::{child_key, join_parts};
use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};

fuzz_target!(|input: (Vec<String>, String, u32)| {
    let (parts, scope, position) = input;
    let key = join_parts(parts.iter().map(|p| Ok::<_, ()>(Cow::Borrowed(p.as_str())))).unwrap();
    let Some(key) = key else {
        assert!(parts.is_empty());
        return;
    };
    assert_eq!(split_parts(&key), parts);
    let child = child_key(&key, position);
    assert_eq!(child.rsplit_once('#'), Some((key.as_str(), position.to_string().as_str())));
    assert_eq!(&key_digest(&scope, &key)[..], &Sha256::digest(digest_input(&scope, &key))[..16]);
});
