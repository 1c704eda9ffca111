//! Every difference between the PostgreSQL majors the extension builds for, and nothing else.
//! The rest of the crate calls these functions and never spells a `#[cfg(feature = "pgNN")]`.
//!
//! What moved, and where it lands here:
//! - 16: a range table entry's privileges moved into a separate RTEPermissionInfo list
//!   ([`RangeTable`]); ExecCheckRTPerms became ExecCheckPermissions; pg_namespace_aclcheck
//!   became object_aclcheck ([`namespace_aclcheck`]); table_tuple_update answers which indexes
//!   need entries as TU_UpdateIndexes rather than a bool, and ExecInsertIndexTuples takes
//!   `onlySummarizing` ([`UpdateIndexes`], [`insert_index_tuples`]); guc.c exports its lookup of
//!   a setting by name, find_option ([`find_setting`]).
//! - 17: CheckValidResultRel takes the MERGE actions ([`check_valid_result_rel`]).
//! - 18: CheckValidResultRel also takes the ON CONFLICT action; ExecInitRangeTable takes the
//!   set of unpruned relations; ExecCheckIndexConstraints takes the TID of the row being
//!   updated; index_beginscan takes an instrumentation struct; a TupleDesc's attributes sit
//!   after its new compact attributes ([`attributes`]).
//!
//! Only 15 and 18 are built and tested here; 16 and 17 follow the headers of pgrx-pg-sys's
//! bindings for them, so supporting them means building, not rewriting.

use std::ffi::CStr;
use std::ptr;

use pgrx::pg_sys;

use super::ffi::unguarded;

unguarded! {
    #[cfg(not(feature = "pg18"))]
    fn RelationGetPrimaryKeyIndex(relation: Relation) -> Oid;
    #[cfg(feature = "pg18")]
    fn RelationGetPrimaryKeyIndex(relation: Relation, deferrable_ok: bool) -> Oid;

    #[cfg(feature = "pg15")]
    fn ExecCheckRTPerms(rangeTable: *mut List, ereport_on_violation: bool) -> bool;
    #[cfg(not(feature = "pg15"))]
    fn ExecCheckPermissions(rangeTable: *mut List, rteperminfos: *mut List, ereport_on_violation: bool) -> bool;

    #[cfg(feature = "pg15")]
    fn ExecInitRangeTable(estate: *mut EState, rangeTable: *mut List);
    #[cfg(any(feature = "pg16", feature = "pg17"))]
    fn ExecInitRangeTable(estate: *mut EState, rangeTable: *mut List, permInfos: *mut List);
    #[cfg(feature = "pg18")]
    fn ExecInitRangeTable(estate: *mut EState, rangeTable: *mut List, permInfos: *mut List, unpruned_relids: *mut Bitmapset);

    #[cfg(any(feature = "pg15", feature = "pg16"))]
    fn CheckValidResultRel(resultRelInfo: *mut ResultRelInfo, operation: CmdType::Type);
    #[cfg(feature = "pg17")]
    fn CheckValidResultRel(resultRelInfo: *mut ResultRelInfo, operation: CmdType::Type, mergeActions: *mut List);
    #[cfg(feature = "pg18")]
    fn CheckValidResultRel(resultRelInfo: *mut ResultRelInfo, operation: CmdType::Type, onConflictAction: OnConflictAction::Type, mergeActions: *mut List);

    #[cfg(feature = "pg15")]
    fn ExecInsertIndexTuples(resultRelInfo: *mut ResultRelInfo, slot: *mut TupleTableSlot, estate: *mut EState, update: bool, noDupErr: bool, specConflict: *mut bool, arbiterIndexes: *mut List) -> *mut List;
    #[cfg(not(feature = "pg15"))]
    fn ExecInsertIndexTuples(resultRelInfo: *mut ResultRelInfo, slot: *mut TupleTableSlot, estate: *mut EState, update: bool, noDupErr: bool, specConflict: *mut bool, arbiterIndexes: *mut List, onlySummarizing: bool) -> *mut List;

    #[cfg(not(feature = "pg18"))]
    fn ExecCheckIndexConstraints(resultRelInfo: *mut ResultRelInfo, slot: *mut TupleTableSlot, estate: *mut EState, conflictTid: ItemPointer, arbiterIndexes: *mut List) -> bool;
    #[cfg(feature = "pg18")]
    fn ExecCheckIndexConstraints(resultRelInfo: *mut ResultRelInfo, slot: *mut TupleTableSlot, estate: *mut EState, conflictTid: ItemPointer, tupleid: ItemPointer, arbiterIndexes: *mut List) -> bool;

    #[cfg(not(feature = "pg18"))]
    fn index_beginscan(heapRelation: Relation, indexRelation: Relation, snapshot: Snapshot, nkeys: ::core::ffi::c_int, norderbys: ::core::ffi::c_int) -> IndexScanDesc;
    #[cfg(feature = "pg18")]
    fn index_beginscan(heapRelation: Relation, indexRelation: Relation, snapshot: Snapshot, instrument: *mut IndexScanInstrumentation, nkeys: ::core::ffi::c_int, norderbys: ::core::ffi::c_int) -> IndexScanDesc;

    #[cfg(feature = "pg15")]
    fn pg_namespace_aclcheck(nsp_oid: Oid, roleid: Oid, mode: AclMode) -> AclResult::Type;
    #[cfg(not(feature = "pg15"))]
    fn object_aclcheck(classid: Oid, objectid: Oid, roleid: Oid, mode: AclMode) -> AclResult::Type;

    #[cfg(feature = "pg15")]
    #[link_name = "table_tuple_update__pgrx_cshim"]
    fn table_tuple_update(rel: Relation, otid: ItemPointer, slot: *mut TupleTableSlot, cid: CommandId, snapshot: Snapshot, crosscheck: Snapshot, wait: bool, tmfd: *mut TM_FailureData, lockmode: *mut LockTupleMode::Type, update_indexes: *mut bool) -> TM_Result::Type;
    #[cfg(not(feature = "pg15"))]
    #[link_name = "table_tuple_update__pgrx_cshim"]
    fn table_tuple_update(rel: Relation, otid: ItemPointer, slot: *mut TupleTableSlot, cid: CommandId, snapshot: Snapshot, crosscheck: Snapshot, wait: bool, tmfd: *mut TM_FailureData, lockmode: *mut LockTupleMode::Type, update_indexes: *mut TU_UpdateIndexes::Type) -> TM_Result::Type;
}

/// The one-entry range table of a write and, from 16, the privileges it needs, which the
/// executor reads from a list of their own.
pub struct RangeTable {
    pub entries: *mut pg_sys::List,
    #[cfg(not(feature = "pg15"))]
    perminfos: *mut pg_sys::List,
}

/// The privileges a write of `relid` needs, as a range table entry carries them.
pub struct Privileges {
    pub required: pg_sys::AclMode,
    pub selected: *mut pg_sys::Bitmapset,
    pub inserted: *mut pg_sys::Bitmapset,
    pub updated: *mut pg_sys::Bitmapset,
}

impl RangeTable {
    /// The range table of a statement writing `relid` alone.
    ///
    /// # Safety
    /// Allocates in the current memory context, which must outlive every use of the result.
    pub unsafe fn new(relid: pg_sys::Oid, privileges: Privileges) -> RangeTable {
        let rte = pg_sys::palloc0(std::mem::size_of::<pg_sys::RangeTblEntry>()) as *mut pg_sys::RangeTblEntry;
        (*rte).type_ = pg_sys::NodeTag::T_RangeTblEntry;
        (*rte).rtekind = pg_sys::RTEKind::RTE_RELATION;
        (*rte).relid = relid;
        (*rte).relkind = pg_sys::RELKIND_RELATION as _;
        (*rte).rellockmode = pg_sys::RowExclusiveLock as i32;
        #[cfg(feature = "pg15")]
        {
            (*rte).requiredPerms = privileges.required;
            (*rte).selectedCols = privileges.selected;
            (*rte).insertedCols = privileges.inserted;
            (*rte).updatedCols = privileges.updated;
            RangeTable { entries: pg_sys::lappend(ptr::null_mut(), rte.cast()) }
        }
        #[cfg(not(feature = "pg15"))]
        {
            let info =
                pg_sys::palloc0(std::mem::size_of::<pg_sys::RTEPermissionInfo>()) as *mut pg_sys::RTEPermissionInfo;
            (*info).type_ = pg_sys::NodeTag::T_RTEPermissionInfo;
            (*info).relid = relid;
            (*info).requiredPerms = privileges.required;
            (*info).selectedCols = privileges.selected;
            (*info).insertedCols = privileges.inserted;
            (*info).updatedCols = privileges.updated;
            // 1-based, into perminfos.
            (*rte).perminfoindex = 1;
            RangeTable {
                entries: pg_sys::lappend(ptr::null_mut(), rte.cast()),
                perminfos: pg_sys::lappend(ptr::null_mut(), info.cast()),
            }
        }
    }

    /// The executor's privilege check (with ExecutorCheckPerms_hook, which pgaudit's object
    /// logging uses), raising 42501 on a missing privilege.
    ///
    /// # Safety
    /// Unguarded: inside [`super::catch`].
    pub unsafe fn check(&self) {
        #[cfg(feature = "pg15")]
        ExecCheckRTPerms(self.entries, true);
        #[cfg(not(feature = "pg15"))]
        ExecCheckPermissions(self.entries, self.perminfos, true);
    }

    /// Makes this the range table of `estate`, as InitPlan does.
    ///
    /// # Safety
    /// Unguarded: inside [`super::catch`]; the range table must outlive `estate`.
    pub unsafe fn install(&self, estate: *mut pg_sys::EState) {
        #[cfg(feature = "pg15")]
        ExecInitRangeTable(estate, self.entries);
        #[cfg(any(feature = "pg16", feature = "pg17"))]
        ExecInitRangeTable(estate, self.entries, self.perminfos);
        // The planner never prunes a result relation, so it is always among the unpruned.
        #[cfg(feature = "pg18")]
        ExecInitRangeTable(estate, self.entries, self.perminfos, pg_sys::bms_make_singleton(1));
    }
}

/// CheckValidResultRel for a plain INSERT … ON CONFLICT DO NOTHING or UPDATE.
///
/// # Safety
/// Unguarded: inside [`super::catch`], with valid executor structures.
pub unsafe fn check_valid_result_rel(rri: *mut pg_sys::ResultRelInfo, operation: pg_sys::CmdType::Type) {
    #[cfg(any(feature = "pg15", feature = "pg16"))]
    CheckValidResultRel(rri, operation);
    #[cfg(feature = "pg17")]
    CheckValidResultRel(rri, operation, ptr::null_mut());
    #[cfg(feature = "pg18")]
    {
        // DO NOTHING asks nothing more of the table than the INSERT does; only DO UPDATE would.
        let on_conflict = if operation == pg_sys::CmdType::CMD_INSERT {
            pg_sys::OnConflictAction::ONCONFLICT_NOTHING
        } else {
            pg_sys::OnConflictAction::ONCONFLICT_NONE
        };
        CheckValidResultRel(rri, operation, on_conflict, ptr::null_mut());
    }
}

/// ExecCheckIndexConstraints for an insertion (no row being updated).
///
/// # Safety
/// Unguarded: inside [`super::catch`], with valid executor structures.
pub unsafe fn check_index_constraints(
    rri: *mut pg_sys::ResultRelInfo,
    slot: *mut pg_sys::TupleTableSlot,
    estate: *mut pg_sys::EState,
    conflict: pg_sys::ItemPointer,
    arbiters: *mut pg_sys::List,
) -> bool {
    #[cfg(not(feature = "pg18"))]
    return ExecCheckIndexConstraints(rri, slot, estate, conflict, arbiters);
    #[cfg(feature = "pg18")]
    return ExecCheckIndexConstraints(rri, slot, estate, conflict, ptr::null_mut(), arbiters);
}

/// index_beginscan without instrumentation (EXPLAIN ANALYZE's, which a write never reports).
///
///
/// # Safety
/// Unguarded: inside [`super::catch`], with valid executor structures.
pub unsafe fn begin_index_scan(
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
    nkeys: i32,
) -> pg_sys::IndexScanDesc {
    #[cfg(not(feature = "pg18"))]
    return index_beginscan(heap, index, snapshot, nkeys, 0);
    #[cfg(feature = "pg18")]
    return index_beginscan(heap, index, snapshot, ptr::null_mut(), nkeys, 0);
}

/// Whether `role` may use the schema `namespace`.
///
/// # Safety
/// Unguarded: inside [`super::catch`], with valid executor structures.
pub unsafe fn namespace_aclcheck(
    namespace: pg_sys::Oid,
    role: pg_sys::Oid,
    mode: pg_sys::AclMode,
) -> pg_sys::AclResult::Type {
    #[cfg(feature = "pg15")]
    return pg_namespace_aclcheck(namespace, role, mode);
    #[cfg(not(feature = "pg15"))]
    return object_aclcheck(pg_sys::NamespaceRelationId, namespace, role, mode);
}

/// Which indexes an updated row needs new entries in, as table_tuple_update answers.
#[cfg(feature = "pg15")]
pub type UpdateIndexes = bool;
#[cfg(not(feature = "pg15"))]
pub type UpdateIndexes = pg_sys::TU_UpdateIndexes::Type;

/// Before table_tuple_update: none until it says otherwise.
#[cfg(feature = "pg15")]
pub const NO_INDEXES: UpdateIndexes = false;
#[cfg(not(feature = "pg15"))]
pub const NO_INDEXES: UpdateIndexes = pg_sys::TU_UpdateIndexes::TU_None;

/// table_tuple_update through pgrx's shim, waiting for a concurrent updater.
///
/// # Safety
/// Unguarded: inside [`super::catch`], with valid executor structures.
pub unsafe fn tuple_update(
    rel: pg_sys::Relation,
    tid: pg_sys::ItemPointer,
    slot: *mut pg_sys::TupleTableSlot,
    estate: *mut pg_sys::EState,
    failure: *mut pg_sys::TM_FailureData,
    lock_mode: *mut pg_sys::LockTupleMode::Type,
    update_indexes: *mut UpdateIndexes,
) -> pg_sys::TM_Result::Type {
    table_tuple_update(
        rel,
        tid,
        slot,
        (*estate).es_output_cid,
        (*estate).es_snapshot,
        ptr::null_mut(),
        true,
        failure,
        lock_mode,
        update_indexes,
    )
}

/// After a successful update: None when no index needs an entry for the new row version (a
/// HOT update of unindexed columns), else whether only the summarizing indexes (BRIN) do.
/// From 16 a HOT update may still need summarizing entries; inserting into every index then
/// would add entries the executor does not, pointing other indexes at a HOT chain member.
pub fn index_entries_needed(update_indexes: UpdateIndexes) -> Option<bool> {
    #[cfg(feature = "pg15")]
    return update_indexes.then_some(false);
    #[cfg(not(feature = "pg15"))]
    return match update_indexes {
        pg_sys::TU_UpdateIndexes::TU_None => None,
        pg_sys::TU_UpdateIndexes::TU_Summarizing => Some(true),
        pg_sys::TU_UpdateIndexes::TU_All => Some(false),
        // Guessing either way writes wrong index entries without a word.
        other => panic!("table_tuple_update answered an unknown TU_UpdateIndexes {other}"),
    };
}

/// ExecInsertIndexTuples; `only_summarizing` must be false on 15, which has no such case.
///
/// # Safety
/// Unguarded: inside [`super::catch`], with valid executor structures.
#[allow(clippy::too_many_arguments)]
pub unsafe fn insert_index_tuples(
    rri: *mut pg_sys::ResultRelInfo,
    slot: *mut pg_sys::TupleTableSlot,
    estate: *mut pg_sys::EState,
    update: bool,
    no_dup_err: bool,
    spec_conflict: *mut bool,
    arbiters: *mut pg_sys::List,
    only_summarizing: bool,
) -> *mut pg_sys::List {
    #[cfg(feature = "pg15")]
    {
        debug_assert!(!only_summarizing, "PostgreSQL 15 has no summarizing-only index update");
        ExecInsertIndexTuples(rri, slot, estate, update, no_dup_err, spec_conflict, arbiters)
    }
    #[cfg(not(feature = "pg15"))]
    ExecInsertIndexTuples(rri, slot, estate, update, no_dup_err, spec_conflict, arbiters, only_summarizing)
}

/// Whether a table has generated columns, whose values only the executor computes: stored
/// ones on every version, and from 18 virtual ones too, which a statement may only set to
/// DEFAULT (428C9) and which are computed when read.
///
/// # Safety
/// `constr` must be null or a tuple descriptor's constraints.
pub unsafe fn has_generated_columns(constr: *const pg_sys::TupleConstr) -> bool {
    if constr.is_null() {
        return false;
    }
    #[cfg(not(feature = "pg18"))]
    return (*constr).has_generated_stored;
    #[cfg(feature = "pg18")]
    return (*constr).has_generated_stored || (*constr).has_generated_virtual;
}

/// The columns of a tuple descriptor, dropped ones included, in attnum order.
///
/// # Safety
/// `desc` must be a valid descriptor; the attributes live as long as it does.
pub unsafe fn attributes<'a>(desc: pg_sys::TupleDesc) -> &'a [pg_sys::FormData_pg_attribute] {
    let natts = (*desc).natts as usize;
    #[cfg(not(feature = "pg18"))]
    return (*desc).attrs.as_slice(natts);
    // 18 keeps a CompactAttribute per column first and the full attributes after them, all in
    // one allocation (TupleDescAttrAddress in access/tupdesc.h).
    #[cfg(feature = "pg18")]
    {
        let first = (*desc).compact_attrs.as_ptr().add(natts).cast::<pg_sys::FormData_pg_attribute>();
        std::slice::from_raw_parts(first, natts)
    }
}

/// The definition of the setting `name` (case-insensitive, as SHOW finds it), a placeholder
/// included; null when there is none.
///
/// # Safety
/// Reads guc.c's tables, which only the backend's own thread changes.
pub unsafe fn find_setting(name: &CStr) -> *mut pg_sys::config_generic {
    // 15 keeps no exported lookup by name: its sorted array is searched here.
    #[cfg(feature = "pg15")]
    {
        let all = std::slice::from_raw_parts(pg_sys::get_guc_variables(), pg_sys::GetNumConfigOptions() as usize);
        all.iter()
            .copied()
            .find(|&conf| CStr::from_ptr((*conf).name).to_bytes().eq_ignore_ascii_case(name.to_bytes()))
            .unwrap_or(ptr::null_mut())
    }
    #[cfg(not(feature = "pg15"))]
    {
        pg_sys::find_option(name.as_ptr(), false, true, pgrx::PgLogLevel::ERROR as i32)
    }
}

/// The relcache's primary key index of `rel`, or InvalidOid: from 18 a deferrable one is not
/// counted unless asked for, which a search by key must not use anyway.
///
/// # Safety
/// `rel` must be open. Unguarded.
pub unsafe fn primary_key_index(rel: pg_sys::Relation) -> pg_sys::Oid {
    #[cfg(not(feature = "pg18"))]
    return RelationGetPrimaryKeyIndex(rel);
    #[cfg(feature = "pg18")]
    return RelationGetPrimaryKeyIndex(rel, false);
}
