//! PostgreSQL functions called without pgrx's per-call error guard, for the direct writes'
//! hot path (see [`crate::direct`]).
//!
//! pgrx wraps every `pg_sys` function in a guard, a sigsetjmp that turns an ERROR into a Rust
//! panic so that Rust frames unwind. A direct versioned update makes some forty such calls,
//! and at about eighty instructions each the guards cost more than all of its own Rust code.
//! So each step of a write runs its calls inside one guard, [`guarded`], through the
//! declarations below. Inside a step nothing may own a destructor and nothing may panic: an
//! ERROR longjmps straight to the step's guard, skipping the step's frames.
//!
//! Every declaration is checked at compile time against pgrx's binding of the same function,
//! so a signature cannot drift from the headers pgrx was generated from.

use pgrx::pg_sys;

/// Runs one step of a write under a single error guard.
///
/// # Safety
/// `step` must hold no value with a destructor and must not panic (see the module docs).
#[inline]
pub unsafe fn guarded<T>(step: impl FnOnce() -> T) -> T {
    pg_sys::ffi::pg_guard_ffi_boundary(step)
}

macro_rules! unguarded {
    ($($(#[link_name = $link:literal])? fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;)*) => {
        mod ffi {
            #![allow(non_snake_case)]
            use pgrx::pg_sys::{self, *};
            unsafe extern "C-unwind" {
                $($(#[link_name = $link])? pub fn $name($($arg: $ty),*) $(-> $ret)?;)*
            }
            $(const _: unsafe fn($($ty),*) $(-> $ret)? = pg_sys::$name;)*
        }
        pub use ffi::{$($name),*};
    };
}

unguarded! {
    fn PushActiveSnapshot(snapshot: Snapshot);
    fn GetTransactionSnapshot() -> Snapshot;
    fn GetActiveSnapshot() -> Snapshot;
    fn CommandCounterIncrement();
    fn UpdateActiveSnapshotCommandId();
    fn GetCurrentCommandId(used: bool) -> CommandId;

    fn index_open(relationId: Oid, lockmode: LOCKMODE) -> Relation;
    fn index_close(relation: Relation, lockmode: LOCKMODE);
    fn index_beginscan(heapRelation: Relation, indexRelation: Relation, snapshot: Snapshot, nkeys: ::core::ffi::c_int, norderbys: ::core::ffi::c_int) -> IndexScanDesc;
    fn index_rescan(scan: IndexScanDesc, keys: ScanKey, nkeys: ::core::ffi::c_int, orderbys: ScanKey, norderbys: ::core::ffi::c_int);
    fn index_getnext_slot(scan: IndexScanDesc, direction: ScanDirection::Type, slot: *mut TupleTableSlot) -> bool;
    fn index_endscan(scan: IndexScanDesc);
    fn ScanKeyEntryInitializeWithInfo(entry: ScanKey, flags: ::core::ffi::c_int, attributeNumber: AttrNumber, strategy: StrategyNumber, subtype: Oid, collation: Oid, finfo: *mut FmgrInfo, argument: Datum);

    fn table_slot_callbacks(rel: Relation) -> *const TupleTableSlotOps;
    fn MakeSingleTupleTableSlot(tupdesc: TupleDesc, tts_ops: *const TupleTableSlotOps) -> *mut TupleTableSlot;
    fn ExecDropSingleTupleTableSlot(slot: *mut TupleTableSlot);
    fn ExecStoreVirtualTuple(slot: *mut TupleTableSlot) -> *mut TupleTableSlot;
    #[link_name = "ExecClearTuple__pgrx_cshim"]
    fn ExecClearTuple(slot: *mut TupleTableSlot) -> *mut TupleTableSlot;
    #[link_name = "ExecMaterializeSlot__pgrx_cshim"]
    fn ExecMaterializeSlot(slot: *mut TupleTableSlot);
    #[link_name = "slot_getallattrs__pgrx_cshim"]
    fn slot_getallattrs(slot: *mut TupleTableSlot);
    #[link_name = "slot_getattr__pgrx_cshim"]
    fn slot_getattr(slot: *mut TupleTableSlot, attnum: ::core::ffi::c_int, isnull: *mut bool) -> Datum;

    fn CreateExecutorState() -> *mut EState;
    fn FreeExecutorState(estate: *mut EState);
    fn ExecInitRangeTable(estate: *mut EState, rangeTable: *mut List);
    fn InitResultRelInfo(resultRelInfo: *mut ResultRelInfo, resultRelationDesc: Relation, resultRelationIndex: Index, partition_root_rri: *mut ResultRelInfo, instrument_options: ::core::ffi::c_int);
    fn CheckValidResultRel(resultRelInfo: *mut ResultRelInfo, operation: CmdType::Type);
    fn ExecOpenIndices(resultRelInfo: *mut ResultRelInfo, speculative: bool);
    fn ExecCloseIndices(resultRelInfo: *mut ResultRelInfo);
    fn ExecResetTupleTable(tupleTable: *mut List, shouldFree: bool);
    fn ExecConstraints(resultRelInfo: *mut ResultRelInfo, slot: *mut TupleTableSlot, estate: *mut EState);
    fn ExecInsertIndexTuples(resultRelInfo: *mut ResultRelInfo, slot: *mut TupleTableSlot, estate: *mut EState, update: bool, noDupErr: bool, specConflict: *mut bool, arbiterIndexes: *mut List) -> *mut List;
    fn MakePerTupleExprContext(estate: *mut EState) -> *mut ExprContext;
    fn palloc0(size: Size) -> *mut ::core::ffi::c_void;
    fn MemoryContextReset(context: MemoryContext);

    #[link_name = "table_tuple_update__pgrx_cshim"]
    fn table_tuple_update(rel: Relation, otid: ItemPointer, slot: *mut TupleTableSlot, cid: CommandId, snapshot: Snapshot, crosscheck: Snapshot, wait: bool, tmfd: *mut TM_FailureData, lockmode: *mut LockTupleMode::Type, update_indexes: *mut bool) -> TM_Result::Type;

    fn ExecCheckIndexConstraints(resultRelInfo: *mut ResultRelInfo, slot: *mut TupleTableSlot, estate: *mut EState, conflictTid: ItemPointer, arbiterIndexes: *mut List) -> bool;
    fn GetCurrentTransactionId() -> TransactionId;
    fn SpeculativeInsertionLockAcquire(xid: TransactionId) -> uint32;
    fn SpeculativeInsertionLockRelease(xid: TransactionId);
    #[link_name = "table_tuple_insert_speculative__pgrx_cshim"]
    fn table_tuple_insert_speculative(rel: Relation, slot: *mut TupleTableSlot, cid: CommandId, options: ::core::ffi::c_int, bistate: *mut BulkInsertStateData, specToken: uint32);
    #[link_name = "table_tuple_complete_speculative__pgrx_cshim"]
    fn table_tuple_complete_speculative(rel: Relation, slot: *mut TupleTableSlot, specToken: uint32, succeeded: bool);

    fn FunctionCall2Coll(flinfo: *mut FmgrInfo, collation: Oid, arg1: Datum, arg2: Datum) -> Datum;
}
