//! The ledger's digests and the ids the extension gives out, as PostgreSQL values: the
//! encodings themselves live in idempotency-core, where they are fuzzed.

use idempotency_core::digest;
use pgrx::datum::Uuid;
use serde_json::Value;

pub use idempotency_core::digest::abbreviate;

use crate::error::{required, IdemError, Result, SqlState};

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
        Ok(Scope { name, id: digest::scope_id(name) })
    }

    /// The ledger's key: see [`digest::key_digest`].
    pub fn key_digest(&self, key: &str) -> Uuid {
        Uuid::from_bytes(digest::key_digest(self.name, key))
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

/// A payload's fingerprint: see [`digest::fingerprint`].
pub fn fingerprint(payload: &Value) -> Uuid {
    Uuid::from_bytes(digest::fingerprint(payload))
}

/// An id from a SHA-256: see [`digest::uuid_v8`].
pub fn uuid_v8(hash: &[u8]) -> Uuid {
    Uuid::from_bytes(digest::uuid_v8(hash))
}
