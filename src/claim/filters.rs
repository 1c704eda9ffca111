//! The Bloom filter of sealed buckets (#13). A bucket is sealed once no transaction that could
//! claim into it is left and a trigger refuses every new key (sql/: the purge seals it), so its
//! set of keys no longer grows. Each backend keeps one filter of the keys of every sealed
//! bucket it has read, streamed from their indexes the first time a claim meets them, within
//! `idempotency.ledger_filter_memory`. A claim probes it once (one cache line, however many
//! buckets are sealed: [`ruled_out`]), and searches the sealed buckets only when it says the key may be in
//! one of them: about once in a thousand absent keys. A sealed bucket the filter does not
//! cover is searched, which is slower and just as exact.
//!
//! Keys that should not be in the filter (a dropped bucket's, a rewritten one's) only let more
//! absent keys through to a search, so they stay until it is rebuilt: when the keys of newly
//! sealed buckets would fill it past its capacity.

use std::cell::RefCell;
use std::collections::HashMap;

use pgrx::pg_sys;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};

use idempotency_core::bloom::Bloom;

use crate::error::Result;
use crate::postgres::unique;

use super::buckets::Sealed;

/// `idempotency.ledger_filter_memory`, in MB: what one backend's filter may take.
pub static FILTER_MEMORY: GucSetting<i32> = GucSetting::<i32>::new(64);

pub fn define_settings() {
    GucRegistry::define_int_guc(
        c"idempotency.ledger_filter_memory",
        c"Memory each session may give the filter of sealed buckets of the ledger.",
        c"2 to 3 MB per million claims in sealed buckets; past it the filter lets more absent keys through to a search, and at 0 every sealed bucket is searched.",
        &FILTER_MEMORY,
        0,
        1024 * 1024,
        GucContext::Userset,
        GucFlags::UNIT_MB,
    );
}

struct Filter {
    bloom: Bloom,
    /// The keys it was sized for.
    capacity: usize,
    /// The keys added, those no longer covered included.
    added: usize,
    /// The buckets whose keys it holds, each with the seal it had when read, and its keys.
    covered: HashMap<pg_sys::Oid, (Sealed, usize)>,
}

thread_local! {
    static FILTER: RefCell<Option<Filter>> = const { RefCell::new(None) };
    /// Sealed buckets searched without the filter, as sealed when that was decided: without
    /// memory for one, or rewritten since their seal. Not read again while so.
    static UNCOVERED: RefCell<HashMap<pg_sys::Oid, Sealed>> = RefCell::new(HashMap::new());
}

/// Makes the filter cover each of the `sealed` buckets it does not cover yet, as each is
/// sealed now: sized once for all of them from their estimated keys, with room for more, and
/// each bucket's keys read from its index. Past the memory it may take, it holds more keys than
/// it was sized for, and lets more absent keys through.
pub fn cover(sealed: impl Iterator<Item = (pg_sys::Oid, Sealed)>) -> Result<()> {
    let new: Vec<(pg_sys::Oid, Sealed)> = sealed.filter(|&(bucket, seal)| !known(bucket, seal)).collect();
    if new.is_empty() {
        return Ok(());
    }
    // A bucket sealed anew counts once, with its new keys.
    new.iter().for_each(|&(bucket, _)| forget(bucket));
    let budget = usize::try_from(FILTER_MEMORY.get()).unwrap_or(0) * 1024 * 1024;
    let most = Bloom::capacity_for(budget);
    let (mut live, room, capacity) = FILTER.with(|f| {
        f.borrow().as_ref().map_or((0, 0, 0), |f| {
            (f.covered.values().map(|&(_, n)| n).sum::<usize>(), f.capacity.saturating_sub(f.added), f.capacity)
        })
    });
    let mut taken = Vec::with_capacity(new.len());
    for (bucket, seal) in new {
        match unique::estimated_keys(bucket, c"key_digest")? {
            Some(keys) if most > 0 => {
                live += keys;
                taken.push((bucket, seal, keys));
            }
            _ => uncover(bucket, seal),
        }
    }
    if taken.is_empty() {
        return Ok(());
    }
    let wanted: usize = taken.iter().map(|&(_, _, keys)| keys).sum();
    // Half as much room again as the live keys need, so that the next seals fit; rebuilt only
    // when that makes it bigger, so that one at its limit is not read again on every seal.
    let sized = (live + live / 2).min(most).max(1);
    if FILTER.with(|f| f.borrow().is_none()) || (wanted > room && sized > capacity) {
        rebuild(sized)?;
    }
    for (bucket, seal, _) in taken {
        add(bucket, seal)?;
    }
    Ok(())
}

/// The sealed buckets that cannot hold `key`: those the filter covers as they are sealed now
/// (the seal's relfilenode and time, which the layout read with it), when it rules the key
/// out. The filter is asked once, whatever the number of buckets.
pub fn ruled_out(key: &[u8; 16]) -> impl Fn(pg_sys::Oid, Sealed) -> bool {
    let absent = FILTER.with(|f| f.borrow().as_ref().is_some_and(|f| !f.bloom.might_hold(key)));
    move |bucket, sealed| absent && FILTER.with(|f| f.borrow().as_ref().is_some_and(|f| f.covers(bucket, sealed)))
}

/// Whether the filter covers `bucket` or has left it uncovered, as sealed now.
fn known(bucket: pg_sys::Oid, sealed: Sealed) -> bool {
    FILTER.with(|f| f.borrow().as_ref().is_some_and(|f| f.covers(bucket, sealed)))
        || UNCOVERED.with(|u| u.borrow().get(&bucket) == Some(&sealed))
}

impl Filter {
    /// Whether it holds the keys of `bucket` as sealed now.
    fn covers(&self, bucket: pg_sys::Oid, sealed: Sealed) -> bool {
        self.covered.get(&bucket).is_some_and(|&(covered, _)| covered == sealed)
    }
}

/// Keys read before they go into the filter together ([`Bloom::add_all`]).
const ADD_BATCH: usize = 4096;

/// Streams the keys of `bucket` into the filter; it covers the bucket if its rows are still
/// where they were when it was sealed. (Its keys go in either way: a key too many only sends a
/// claim to a search.)
fn add(bucket: pg_sys::Oid, sealed: Sealed) -> Result<()> {
    let mut keys = 0;
    let mut batch = Vec::with_capacity(ADD_BATCH);
    let add_batch = |batch: &mut Vec<[u8; 16]>| {
        FILTER.with(|f| f.borrow_mut().as_mut().expect("made before any key is added").bloom.add_all(batch));
        batch.clear();
    };
    let read_from = unique::each_key(bucket, c"key_digest", |key| {
        keys += 1;
        batch.push(*key);
        if batch.len() == ADD_BATCH {
            add_batch(&mut batch);
        }
    })?;
    add_batch(&mut batch);
    FILTER.with(|f| {
        let mut f = f.borrow_mut();
        let filter = f.as_mut().expect("made before any key is added");
        filter.added += keys;
        if read_from == Some(sealed.relfilenode) {
            filter.covered.insert(bucket, (sealed, keys));
        }
    });
    if read_from != Some(sealed.relfilenode) {
        uncover(bucket, sealed);
    }
    Ok(())
}

/// A new filter of `capacity` keys, holding the keys of the buckets the old one covered, read
/// again.
fn rebuild(capacity: usize) -> Result<()> {
    let covered: Vec<(pg_sys::Oid, Sealed)> = FILTER.with(|f| {
        f.borrow_mut().take().map_or_else(Vec::new, |f| f.covered.into_iter().map(|(b, (s, _))| (b, s)).collect())
    });
    FILTER.with(|f| {
        *f.borrow_mut() =
            Some(Filter { bloom: Bloom::with_capacity(capacity), capacity, added: 0, covered: HashMap::new() })
    });
    for (bucket, sealed) in covered {
        add(bucket, sealed)?;
    }
    Ok(())
}

fn uncover(bucket: pg_sys::Oid, sealed: Sealed) {
    UNCOVERED.with(|u| u.borrow_mut().insert(bucket, sealed));
}

/// Forgets the buckets no longer sealed (dropped, unsealed), as a layout is read.
pub fn keep_only(sealed: impl Fn(pg_sys::Oid) -> bool) {
    FILTER.with(|f| {
        if let Some(filter) = f.borrow_mut().as_mut() {
            filter.covered.retain(|&b, _| sealed(b));
        }
    });
    UNCOVERED.with(|u| u.borrow_mut().retain(|&b, _| sealed(b)));
}

fn forget(bucket: pg_sys::Oid) {
    FILTER.with(|f| {
        if let Some(filter) = f.borrow_mut().as_mut() {
            filter.covered.remove(&bucket);
        }
    });
    UNCOVERED.with(|u| u.borrow_mut().remove(&bucket));
}
