//! The parts of the `idempotency` extension that need no PostgreSQL: reading jsonb's and
//! numeric's binary formats from bytes, deriving keys and digests, and canonicalising
//! payloads, and the Bloom filter of a bucket of the ledger. Everything here is a pure function of its input, so it is fuzzed in-process
//! (`fuzz/`, `make fuzz`) and property-tested (`tests/`); the extension wraps it at the one
//! place where a datum becomes a byte slice.
#![forbid(unsafe_code)]

pub mod bloom;
pub mod digest;
pub mod jsonb;
pub mod keys;
