//! The one door to PostgreSQL's internals: everything that touches the executor, the heap,
//! indexes, the relcache, SPI or the error machinery sits below this module, so the claim,
//! versioned writes and every later feature share one set of tested steps.
//!
//! - [`guard`]: calls into PostgreSQL that keep an error whole ([`catch`]), so that it can be
//!   raised again exactly as the equivalent statement raises it.
//! - [`args`]: the arguments of a `VARIADIC "any"` function, each by its own type, and the
//!   shape of an array argument.
//! - [`ffi`]: PostgreSQL functions declared without pgrx's per-call guard, for [`catch`].
//! - [`relcache`]: the one relcache callback, which tells each per-table cache to forget, and
//!   a table's triggers as committed, whatever the snapshot.
//! - [`role`]: the extension's own bookkeeping, run as the owner of the table it writes.
//! - [`settings`]: other extensions' settings, read without a lookup by name per call.
//! - [`version`]: every difference between the PostgreSQL majors, and only those.
//! - [`spi`]: statements prepared once per backend and run through SPI.
//! - [`time`]: the transaction's start, the clock, and calendar subtraction.
//! - [`xact`]: values and locks that last as long as the current transaction.
//! - [`unique`]: one key kept unique across tables none of whose indexes sees the others
//!   (the ledger's buckets), under the key's lock.
//! - [`write`]: one row written through the table and index access methods, in the
//!   executor's own steps, for tables proven plain enough ([`write::is_plain`]).

pub mod args;
pub mod ffi;
mod guard;
pub mod relcache;
pub mod role;
mod settings;
pub mod spi;
pub mod time;
pub mod unique;
mod version;
pub mod write;
pub mod xact;

pub use guard::{catch, PgError};
pub use version::attributes as descriptor_attributes;
