//! One key kept unique across several tables, none of whose unique indexes sees the others:
//! the ledger and its buckets (#13). A claimer takes the key's lock, looks for the key in
//! every table, inserts into its own, and releases the lock at once. Every claimer of a key
//! inserts under the lock, so the next one's look meets the row whether or not it has
//! committed: it reads with a dirty snapshot, as ON CONFLICT's own pre-check does
//! (check_exclusion_or_unique_constraint), and waits for an uncommitted row's transaction
//! outside the lock, as that check waits. The lock is held for microseconds and never across
//! a wait for another transaction, so a batch does not fill the lock table and no wait
//! hides behind it from the deadlock detector.

use std::ffi::CStr;
use std::ptr;

use pgrx::pg_sys;
use pgrx::prelude::*;

use super::write::{row_visible, unique_index, unique_on};
use super::{catch, ffi, version, PgError};

/// The lock of a 128-bit key among `table`'s: an exclusive lock on the object (table, the
/// key's first 32 bits, its next 16), as pg_locks shows it. Keys share a lock only when those
/// 48 bits collide, which serializes them and changes nothing else.
pub struct KeyLock {
    table: pg_sys::Oid,
    objid: pg_sys::Oid,
    objsubid: u16,
}

impl KeyLock {
    /// Waits for the lock as any lock waits (lock_timeout, cancel, deadlock detection), then
    /// takes in every invalidation committed before it was granted: what the key's last
    /// holder saw of the catalog, this one sees too.
    pub fn take(table: pg_sys::Oid, key: &[u8; 16]) -> Result<KeyLock, PgError> {
        let lock = KeyLock {
            table,
            objid: pg_sys::Oid::from(u32::from_be_bytes(key[..4].try_into().expect("4 bytes"))),
            objsubid: u16::from_be_bytes(key[4..6].try_into().expect("2 bytes")),
        };
        // SAFETY: a lock of the transaction, which an error's abort releases.
        unsafe {
            catch(|| {
                ffi::LockDatabaseObject(lock.table, lock.objid, lock.objsubid, exclusive());
                ffi::AcceptInvalidationMessages();
            })?;
        }
        Ok(lock)
    }

    /// Releases the lock before the transaction ends: what it guarded is written.
    pub fn release(self) -> Result<(), PgError> {
        // SAFETY: the lock take() got, released once.
        unsafe { catch(|| ffi::UnlockDatabaseObject(self.table, self.objid, self.objsubid, exclusive())) }
    }
}

fn exclusive() -> pg_sys::LOCKMODE {
    pg_sys::AccessExclusiveLock as pg_sys::LOCKMODE
}

/// What one table holds for a key.
pub enum Seen {
    Absent,
    /// A committed row this transaction may see, or one of its own.
    Duplicate,
    /// A committed row the transaction's snapshot cannot see (REPEATABLE READ, SERIALIZABLE):
    /// what ON CONFLICT answers with a serialization failure ([`serialization_failure`]).
    Invisible,
    /// A row another transaction is inserting or deleting: wait for it, then look again.
    Busy(Busy),
}

/// A row of a transaction still in progress.
pub struct Busy {
    xid: pg_sys::TransactionId,
    speculative_token: u32,
    table: pg_sys::Oid,
    tid: pg_sys::ItemPointerData,
}

impl Busy {
    /// Waits for the row's transaction (or its speculative insertion) to end, as a unique
    /// check waits: a lock wait, which lock_timeout ends with 55P03. The table is only named
    /// in the wait's CONTEXT line, while it still exists.
    pub fn wait(mut self) -> Result<(), PgError> {
        // SAFETY: waits on a transaction's lock; the relation is opened only for its name.
        unsafe {
            catch(|| {
                if self.speculative_token != 0 {
                    ffi::SpeculativeInsertionWait(self.xid, self.speculative_token);
                    return;
                }
                let rel = ffi::try_relation_open(self.table, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
                ffi::XactLockTableWait(self.xid, rel, &mut self.tid, pg_sys::XLTW_Oper::XLTW_InsertIndex);
                if !rel.is_null() {
                    ffi::relation_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
                }
            })
        }
    }
}

/// `rel`'s unique btree index on `column` alone, opened with AccessShareLock: its primary
/// key, which the relcache keeps, if it is that; else the first such index. Null for none.
/// Unguarded.
///
/// # Safety
/// `rel` must be open; the caller closes the index.
pub unsafe fn open_key_index(rel: pg_sys::Relation, column: &CStr) -> pg_sys::Relation {
    let attnum = ffi::get_attnum((*rel).rd_id, column.as_ptr());
    let primary = version::primary_key_index(rel);
    if primary != pg_sys::InvalidOid {
        let index = ffi::index_open(primary, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        if unique_on(index, &[attnum]).is_some() {
            return index;
        }
        ffi::index_close(index, pg_sys::NoLock as pg_sys::LOCKMODE);
    }
    match unique_index(rel, &[attnum]) {
        Some((index, _)) => ffi::index_open(index.oid, pg_sys::AccessShareLock as pg_sys::LOCKMODE),
        None => ptr::null_mut(),
    }
}

/// The serialization failure ON CONFLICT raises for a conflicting row the transaction's
/// snapshot cannot see (ExecCheckTIDVisible), with its message.
pub fn serialization_failure() -> PgError {
    // SAFETY: raises and catches an ERROR, so that it carries every field a raised one has.
    let raised = unsafe {
        catch::<()>(|| {
            pgrx::ereport!(
                ERROR,
                PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
                "could not serialize access due to concurrent update"
            );
        })
    };
    raised.expect_err("ereport(ERROR) does not return")
}

/// What `table` holds for `key` in its column `column`, looked up through the table's unique
/// btree index on that column alone. A table dropped meanwhile holds nothing; one without
/// such an index is refused (55000), since without it the table cannot be searched as a
/// claim must be.
pub fn look_up(table: pg_sys::Oid, column: &CStr, key: pg_sys::Datum) -> Result<Seen, PgError> {
    // SAFETY: the table is open for the call; nothing with a destructor is held.
    let seen = unsafe {
        with_table(table, |rel| {
            with_key_index(rel, column, |index_rel| {
                // The buckets ahead, and a lane's unused ones: an index without a root holds no
                // entry, so the scan would find nothing. A table without the index is refused
                // unless it has no blocks: then it holds no row, not even an uncommitted one
                // (an insert extends the file before it writes the row).
                let empty = if index_rel.is_null() {
                    ffi::RelationGetNumberOfBlocksInFork(rel, pg_sys::ForkNumber::MAIN_FORKNUM) == 0
                } else {
                    btree_is_empty(index_rel)
                };
                if empty {
                    return Seen::Absent;
                }
                look_up_in(rel, index_rel, column, table, key)
            })
        })
    }?;
    Ok(seen.unwrap_or(Seen::Absent))
}

/// Whether the btree `index` has no root page, so that no search of it finds an entry: read
/// from its metapage, which _bt_getrootheight caches in the relcache entry (rd_amcache) once
/// there is a root, and only then. No syscall, where the table's size would take an lseek on
/// every claim. Unguarded.
///
/// # Safety
/// `index` must be an open btree index.
unsafe fn btree_is_empty(index: pg_sys::Relation) -> bool {
    // SAFETY: reads the metapage of an open btree under its buffer lock.
    unsafe {
        ffi::_bt_getrootheight(index);
        (*index).rd_amcache.is_null()
    }
}

/// Whether no snapshot, of this server or of a standby it keeps (or will cancel queries of),
/// can see a version of a row of `table`. VACUUM alone vouches for that, and what it leaves
/// tells: every block marked all-visible (it marks a block so only once no snapshot sees a
/// version it removed, and logs the horizon for standbys), and no entry at all in the key
/// index, not even one a scan marked dead (a mark no standby hears of, made by the primary's
/// horizon) or one a rebuilt index left out (a rebuild skips rows only this server's
/// snapshots no longer see, but they stay on blocks not all-visible). The index is read with
/// SnapshotAny from its first leaf rightwards, where VACUUM unlinks the leaves it empties, so
/// that an emptied index takes a page or two, and a full one stops at its first entry. None
/// when the table is gone or has no key index.
pub fn holds_no_row_version(table: pg_sys::Oid, column: &CStr) -> Result<Option<bool>, PgError> {
    // SAFETY: the scan is ended before the index closes; an error's abort releases both.
    unsafe {
        with_key_indexed(table, column, |rel, index| {
            let (mut all_visible, mut all_frozen) = (0, 0);
            ffi::visibilitymap_count(rel, &raw mut all_visible, &raw mut all_frozen);
            if all_visible != ffi::RelationGetNumberOfBlocksInFork(rel, pg_sys::ForkNumber::MAIN_FORKNUM) {
                return false;
            }
            let scan = version::begin_index_scan(rel, index, &raw mut pg_sys::SnapshotAnyData, 0);
            (*scan).ignore_killed_tuples = false;
            ffi::index_rescan(scan, ptr::null_mut(), 0, ptr::null_mut(), 0);
            let entry = ffi::index_getnext_tid(scan, pg_sys::ScanDirection::ForwardScanDirection);
            ffi::index_endscan(scan);
            entry.is_null()
        })
    }
}

/// [`look_up`] in an open table through its key index. Unguarded.
///
/// # Safety
/// Both must be open; the key is a datum of the column's type.
unsafe fn look_up_in(
    rel: pg_sys::Relation,
    index_rel: pg_sys::Relation,
    column: &CStr,
    table: pg_sys::Oid,
    key: pg_sys::Datum,
) -> Seen {
    // SAFETY: the slot and scan are released before it returns; an error's abort releases
    // them otherwise.
    unsafe {
        if index_rel.is_null() {
            pg_sys::panic::ErrorReport::new(
                PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!(
                    "table \"{}\" has no unique index on {} alone",
                    CStr::from_ptr((*(*rel).rd_rel).relname.data.as_ptr()).to_string_lossy(),
                    column.to_string_lossy()
                ),
                "idempotency",
            )
            .set_hint("Each table of the ledger is searched through its own unique index on the key; restore its primary key.")
            .report(pgrx::PgLogLevel::ERROR);
        }
        let (family, input) = (*(*index_rel).rd_opfamily, *(*index_rel).rd_opcintype);
        let mut scan_key = std::mem::MaybeUninit::<pg_sys::ScanKeyData>::uninit();
        ffi::ScanKeyEntryInitialize(
            scan_key.as_mut_ptr(),
            0,
            1,
            pg_sys::BTEqualStrategyNumber as u16,
            pg_sys::InvalidOid,
            *(*index_rel).rd_indcollation,
            ffi::get_opcode(ffi::get_opfamily_member(family, input, input, pg_sys::BTEqualStrategyNumber as i16)),
            key,
        );
        let mut dirty: pg_sys::SnapshotData = std::mem::zeroed();
        dirty.snapshot_type = pg_sys::SnapshotType::SNAPSHOT_DIRTY;
        let slot = ffi::MakeSingleTupleTableSlot((*rel).rd_att, ffi::table_slot_callbacks(rel));
        let scan = version::begin_index_scan(rel, index_rel, &mut dirty, 1);
        ffi::index_rescan(scan, scan_key.as_mut_ptr(), 1, ptr::null_mut(), 0);
        let seen = if !ffi::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, slot) {
            Seen::Absent
        } else {
            // A dirty snapshot names the transaction still inserting (xmin) or deleting
            // (xmax) the row; this transaction's own rows come back without either.
            let waiting = if dirty.xmin != pg_sys::InvalidTransactionId { dirty.xmin } else { dirty.xmax };
            if waiting != pg_sys::InvalidTransactionId {
                Seen::Busy(Busy {
                    xid: waiting,
                    speculative_token: dirty.speculativeToken,
                    table,
                    tid: (*slot).tts_tid,
                })
            } else if row_visible(rel, slot) {
                Seen::Duplicate
            } else {
                Seen::Invisible
            }
        };
        ffi::index_endscan(scan);
        ffi::ExecDropSingleTupleTableSlot(slot);
        seen
    }
}

/// Every key `table`'s unique btree index on `column` (a uuid) holds an entry for, dead or
/// alive, handed to `each`, read from the index alone; with the table's relfilenode, which
/// changes when its rows are rewritten or truncated. None when the table is gone or has no
/// such index. The index's leaf pages are read in their order on disk, through a small ring
/// of buffers: a key-order scan reads them in random order and pushes the claims' own hot
/// pages out of shared_buffers.
pub fn each_key(
    table: pg_sys::Oid,
    column: &CStr,
    mut each: impl FnMut(&[u8; 16]),
) -> Result<Option<pg_sys::Oid>, PgError> {
    // SAFETY: each page is read under its buffer's share lock, released before the next; an
    // error's abort releases them otherwise. Each entry's key is a uuid, 16 bytes by value;
    // `each` is only borrowed.
    unsafe {
        with_key_indexed(table, column, |rel, index_rel| {
            let descriptor = (*index_rel).rd_att;
            each_leaf_entry(index_rel, |entry| each(&entry_key(entry, descriptor)), |_| ());
            (*(*rel).rd_rel).relfilenode
        })
    }
}

/// The uuid an entry of a key index holds in its first column.
///
/// # Safety
/// `entry` is a tuple of the index whose descriptor is `descriptor`, whose first column is a
/// uuid: 16 bytes, passed by reference.
unsafe fn entry_key(entry: pg_sys::IndexTuple, descriptor: pg_sys::TupleDesc) -> [u8; 16] {
    // SAFETY: as the caller promises; the bytes are copied out while the page is locked.
    unsafe { *ffi::nocache_index_getattr(entry, 1, descriptor).cast_mut_ptr::<[u8; 16]>() }
}

/// The special space of a btree page (access/nbtree.h, not among pgrx's bindings), the same
/// from 14 to 18. Only read through a pointer to a page, so some fields are never named.
#[repr(C)]
#[allow(dead_code)]
struct BTPageOpaqueData {
    btpo_prev: pg_sys::BlockNumber,
    btpo_next: pg_sys::BlockNumber,
    btpo_level: u32,
    btpo_flags: u16,
    btpo_cycleid: u16,
}

const BTP_LEAF: u16 = 1 << 0;
const BTP_DELETED: u16 = 1 << 2;
const BTP_HALF_DEAD: u16 = 1 << 4;
const LP_NORMAL: u32 = 1;
const LP_DEAD: u32 = 3;

/// Every entry of the btree `index`'s leaf pages (its high keys aside), live or killed, read
/// in block order. An entry added meanwhile (an UPDATE that is not HOT adds one even where no
/// new key may go) can split a page not read yet and move entries to a page already passed
/// or past the last block: the page keeps a right link to it, and after the pass every right
/// link to a page not read as a leaf is followed. (A page deleted after this transaction
/// began is not reused while it runs, so a page read as a leaf still is the one read.)
/// `after_page` runs after each block of the pass, with no page locked: a test splits pages
/// not read yet there. Unguarded.
///
/// # Safety
/// `index` must be an open btree index; `each` may use an entry only for the call.
unsafe fn each_leaf_entry(
    index: pg_sys::Relation,
    mut each: impl FnMut(pg_sys::IndexTuple),
    mut after_page: impl FnMut(pg_sys::BlockNumber),
) {
    // SAFETY: each page is pinned and share-locked while it is read.
    unsafe {
        let strategy = ffi::GetAccessStrategy(pg_sys::BufferAccessStrategyType::BAS_BULKREAD);
        let blocks = ffi::RelationGetNumberOfBlocksInFork(index, pg_sys::ForkNumber::MAIN_FORKNUM);
        let mut read = vec![false; blocks as usize];
        let mut links = Vec::new();
        // Block 0 is the metapage.
        for block in 1..blocks {
            if let Page::Leaf(next) = read_page(index, block, strategy, &mut each) {
                read[block as usize] = true;
                links.push(next);
            }
            after_page(block);
        }
        // Each page is visited once: a chain that meets a page visited before (read in the
        // pass, or followed from another link) goes no further than that one went.
        for mut next in links {
            while next != 0 && !read.get(next as usize).copied().unwrap_or(false) {
                // Past the last block when the pass began, if the index grew since.
                if next as usize >= read.len() {
                    read.resize(next as usize + 1, false);
                }
                read[next as usize] = true;
                next = match read_page(index, next, strategy, &mut each) {
                    // A deleted page keeps its right link too.
                    Page::Leaf(further) | Page::Deleted(further) => further,
                    Page::Other => 0,
                };
            }
        }
        ffi::FreeAccessStrategy(strategy);
    }
}

/// What a block of a btree index was when read, with its right link (0 for none).
enum Page {
    /// A live leaf page, whose entries were handed on.
    Leaf(pg_sys::BlockNumber),
    /// A deleted or half-dead page.
    Deleted(pg_sys::BlockNumber),
    /// The metapage, an inner page or a new one.
    Other,
}

/// Reads block `block` of `index`: if it is a live leaf page, hands each of its entries (its
/// high key aside) to `each`. Unguarded.
///
/// # Safety
/// As for [`each_leaf_entry`].
unsafe fn read_page(
    index: pg_sys::Relation,
    block: pg_sys::BlockNumber,
    strategy: pg_sys::BufferAccessStrategy,
    each: &mut impl FnMut(pg_sys::IndexTuple),
) -> Page {
    // SAFETY: the page is pinned and share-locked while its entries are read; its line
    // pointers and special space are within it, as PageInit laid them out.
    unsafe {
        with_page(index, block, strategy, |page, header, opaque| {
            let Some(opaque) = opaque else { return Page::Other };
            if opaque.btpo_flags & (BTP_DELETED | BTP_HALF_DEAD) != 0 {
                return Page::Deleted(opaque.btpo_next);
            }
            if opaque.btpo_flags & BTP_LEAF == 0 {
                return Page::Other;
            }
            // A page with a right sibling keeps its high key first.
            let first = usize::from(opaque.btpo_next != 0);
            let items = (usize::from(header.pd_lower) - std::mem::offset_of!(pg_sys::PageHeaderData, pd_linp))
                / std::mem::size_of::<pg_sys::ItemIdData>();
            for item in std::slice::from_raw_parts(header.pd_linp.as_ptr(), items).iter().skip(first) {
                if item.lp_len() > 0 && matches!(item.lp_flags(), LP_NORMAL | LP_DEAD) {
                    each(page.add(item.lp_off() as usize).cast_mut().cast());
                }
            }
            Page::Leaf(opaque.btpo_next)
        })
    }
}

/// `with` run on block `block` of `index`, pinned and share-locked for the call: the page, its
/// header, and its btree special space unless it is a new page. Unguarded.
///
/// # Safety
/// As for [`each_leaf_entry`]; `with` may use the page only for the call.
unsafe fn with_page<T>(
    index: pg_sys::Relation,
    block: pg_sys::BlockNumber,
    strategy: pg_sys::BufferAccessStrategy,
    with: impl FnOnce(*const u8, &pg_sys::PageHeaderData, Option<&BTPageOpaqueData>) -> T,
) -> T {
    // SAFETY: the buffer is pinned and locked until the call returns; an error's abort
    // releases both otherwise.
    unsafe {
        ffi::check_for_interrupts();
        let buffer = ffi::ReadBufferExtended(
            index,
            pg_sys::ForkNumber::MAIN_FORKNUM,
            block,
            pg_sys::ReadBufferMode::RBM_NORMAL,
            strategy,
        );
        ffi::LockBuffer(buffer, pg_sys::BUFFER_LOCK_SHARE as i32);
        let page = pg_sys::BufferGetPage(buffer).cast::<u8>().cast_const();
        let header = &*page.cast::<pg_sys::PageHeaderData>();
        // A new page (pd_upper 0) is not yet initialized.
        let opaque =
            (header.pd_upper != 0).then(|| &*page.add(usize::from(header.pd_special)).cast::<BTPageOpaqueData>());
        let result = with(page, header, opaque);
        ffi::UnlockReleaseBuffer(buffer);
        result
    }
}

/// About how many keys `table` holds, for sizing a filter of them: the planner's count
/// (`reltuples`, from its last VACUUM or ANALYZE) where it has one, else the most that its
/// unique index on `column` (a uuid) can hold, 292 entries a block. None when it has no such
/// index (or is gone).
pub fn estimated_keys(table: pg_sys::Oid, column: &CStr) -> Result<Option<usize>, PgError> {
    // SAFETY: reads the size and the statistics of an open table and index.
    unsafe {
        with_key_indexed(table, column, |rel, index| {
            let counted = (*(*rel).rd_rel).reltuples;
            if counted >= 0.0 {
                counted as usize
            } else {
                ffi::RelationGetNumberOfBlocksInFork(index, pg_sys::ForkNumber::MAIN_FORKNUM) as usize * 292
            }
        })
    }
}

/// `with` run on `table`, open with AccessShareLock for the call and closed after, keeping
/// its lock; None when the table is gone. An ERROR raised within is caught whole, and the
/// transaction's abort closes the table.
///
/// # Safety
/// As for [`catch`]: `with` holds no value with a destructor across a call that can raise.
/// It may use the relation only for the call.
unsafe fn with_table<T>(table: pg_sys::Oid, with: impl FnOnce(pg_sys::Relation) -> T) -> Result<Option<T>, PgError> {
    // SAFETY: the relation is open between its open and close.
    unsafe {
        catch(|| {
            let rel = ffi::try_relation_open(table, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
            if rel.is_null() {
                return None;
            }
            let result = with(rel);
            ffi::relation_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
            Some(result)
        })
    }
}

/// `with` run on `rel`'s key index ([`open_key_index`]), null when it has none, closed after.
/// Unguarded.
///
/// # Safety
/// `rel` must be open; `with` may only use the index for the call.
unsafe fn with_key_index<T>(rel: pg_sys::Relation, column: &CStr, with: impl FnOnce(pg_sys::Relation) -> T) -> T {
    let index = open_key_index(rel, column);
    let result = with(index);
    if !index.is_null() {
        ffi::index_close(index, pg_sys::NoLock as pg_sys::LOCKMODE);
    }
    result
}

/// `with` run on `table` and its key index ([`open_key_index`]), both open for the call; None
/// when the table is gone or has no such index.
///
/// # Safety
/// `with` may only use the relations for the call.
unsafe fn with_key_indexed<T>(
    table: pg_sys::Oid,
    column: &CStr,
    with: impl FnOnce(pg_sys::Relation, pg_sys::Relation) -> T,
) -> Result<Option<T>, PgError> {
    let result = with_table(table, |rel| {
        with_key_index(rel, column, |index| if index.is_null() { None } else { Some(with(rel, index)) })
    })?;
    Ok(result.flatten())
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Keys inserted while the leaves are read split pages the pass has not reached, and move
    /// half their entries to new pages past the last block it counted: only the split
    /// pages' right links lead there. Every key stored before the read began is handed on.
    #[pg_test]
    fn keys_moved_by_a_split_during_the_read_are_still_read() {
        Spi::run(
            "CREATE TABLE split_read (k uuid PRIMARY KEY, old bool); \
             INSERT INTO split_read SELECT gen_random_uuid(), true FROM generate_series(1, 20000)",
        )
        .unwrap();
        let table = Spi::get_one::<pg_sys::Oid>("SELECT 'split_read'::regclass::oid").unwrap().unwrap();
        let blocks = || Spi::get_one::<i64>("SELECT pg_relation_size('split_read_pkey') / 8192").unwrap().unwrap();
        let blocks_before = blocks();
        let mut seen = HashSet::new();
        // SAFETY: the table and its index are open for the call; the entries are uuids.
        unsafe {
            with_table(table, |rel| {
                with_key_index(rel, c"k", |index| {
                    let descriptor = (*index).rd_att;
                    each_leaf_entry(
                        index,
                        |entry| {
                            seen.insert(entry_key(entry, descriptor));
                        },
                        |block| {
                            if block == 1 {
                                Spi::run(
                                    "INSERT INTO split_read SELECT gen_random_uuid(), false \
                                     FROM generate_series(1, 20000)",
                                )
                                .unwrap();
                            }
                        },
                    );
                })
            })
            .unwrap()
            .unwrap();
        }
        assert!(blocks() > blocks_before * 3 / 2, "the inserts split pages");
        let old = Spi::get_one::<Vec<pgrx::Uuid>>("SELECT array_agg(k) FROM split_read WHERE old").unwrap().unwrap();
        let missed = old.iter().filter(|k| !seen.contains(k.as_bytes())).count();
        assert_eq!((old.len(), missed), (20000, 0));
    }
}
