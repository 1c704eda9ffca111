//! PostgreSQL functions declared without pgrx's per-call error guard, to be called inside
//! [`super::catch`], which keeps an error whole where pgrx's guard would keep only part of it.
//! One guard per step instead of one per call is also cheaper: a direct versioned update
//! makes some forty calls, and at about eighty instructions each the guards cost more than
//! all of its own Rust code.
//!
//! Every declaration is checked at compile time against pgrx's binding of the same function,
//! so a signature cannot drift from the headers pgrx was generated from. PostgreSQL's inline
//! functions are reached through pgrx's C shim (`*__pgrx_cshim`), which ties this list to
//! pgrx `=0.18.1`: a renamed shim fails at load time, in the first test that runs.

use pgrx::pg_sys;

/// `#[cfg]` on a declaration is for src/postgres/version.rs, the one place where the majors'
/// signatures differ.
macro_rules! unguarded {
    ($($(#[cfg($cfg:meta)])? $(#[link_name = $link:literal])? fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;)*) => {
        mod ffi {
            #![allow(non_snake_case)]
            use pgrx::pg_sys::{self, *};
            unsafe extern "C-unwind" {
                $($(#[cfg($cfg)])? $(#[link_name = $link])? pub fn $name($($arg: $ty),*) $(-> $ret)?;)*
            }
            $($(#[cfg($cfg)])? const _: unsafe fn($($ty),*) $(-> $ret)? = pg_sys::$name;)*
        }
        $($(#[cfg($cfg)])? pub use ffi::$name;)*
    };
}
pub(super) use unguarded;

unguarded! {
    fn PushActiveSnapshot(snapshot: Snapshot);
    fn GetTransactionSnapshot() -> Snapshot;
    fn GetLatestSnapshot() -> Snapshot;
    fn GetActiveSnapshot() -> Snapshot;
    fn CommandCounterIncrement();
    fn UpdateActiveSnapshotCommandId();
    fn GetCurrentCommandId(used: bool) -> CommandId;
    fn CheckCmdReplicaIdentity(rel: Relation, cmd: CmdType::Type);

    fn index_open(relationId: Oid, lockmode: LOCKMODE) -> Relation;
    fn SPI_plan_get_plan_sources(plan: SPIPlanPtr) -> *mut List;
    fn standard_ExecutorStart(queryDesc: *mut QueryDesc, eflags: ::core::ffi::c_int);
    fn fmgr_info(functionId: Oid, finfo: *mut FmgrInfo);
    fn SearchSysCache1(cacheId: ::core::ffi::c_int, key1: Datum) -> HeapTuple;
    fn ReleaseSysCache(tuple: HeapTuple);
    fn index_close(relation: Relation, lockmode: LOCKMODE);
    fn index_rescan(scan: IndexScanDesc, keys: ScanKey, nkeys: ::core::ffi::c_int, orderbys: ScanKey, norderbys: ::core::ffi::c_int);
    fn index_getnext_slot(scan: IndexScanDesc, direction: ScanDirection::Type, slot: *mut TupleTableSlot) -> bool;
    fn index_getnext_tid(scan: IndexScanDesc, direction: ScanDirection::Type) -> ItemPointer;
    fn visibilitymap_count(rel: Relation, all_visible: *mut BlockNumber, all_frozen: *mut BlockNumber);
    fn index_endscan(scan: IndexScanDesc);
    fn ItemPointerEquals(pointer1: ItemPointer, pointer2: ItemPointer) -> bool;
    fn superuser_arg(roleid: Oid) -> bool;
    fn ScanKeyEntryInitialize(entry: ScanKey, flags: ::core::ffi::c_int, attributeNumber: AttrNumber, strategy: StrategyNumber, subtype: Oid, collation: Oid, procedure: RegProcedure, argument: Datum);
    fn get_opfamily_member(opfamily: Oid, lefttype: Oid, righttype: Oid, strategy: int16) -> Oid;
    fn get_opcode(opno: Oid) -> RegProcedure;
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
    fn InitResultRelInfo(resultRelInfo: *mut ResultRelInfo, resultRelationDesc: Relation, resultRelationIndex: Index, partition_root_rri: *mut ResultRelInfo, instrument_options: ::core::ffi::c_int);
    fn ExecOpenIndices(resultRelInfo: *mut ResultRelInfo, speculative: bool);
    fn ExecCloseIndices(resultRelInfo: *mut ResultRelInfo);
    fn ExecResetTupleTable(tupleTable: *mut List, shouldFree: bool);
    fn ExecConstraints(resultRelInfo: *mut ResultRelInfo, slot: *mut TupleTableSlot, estate: *mut EState);
    fn MakePerTupleExprContext(estate: *mut EState) -> *mut ExprContext;
    fn palloc0(size: Size) -> *mut ::core::ffi::c_void;
    fn MemoryContextReset(context: MemoryContext);


    fn GetCurrentTransactionId() -> TransactionId;
    fn SpeculativeInsertionLockAcquire(xid: TransactionId) -> uint32;
    fn SpeculativeInsertionLockRelease(xid: TransactionId);
    #[link_name = "table_tuple_insert_speculative__pgrx_cshim"]
    fn table_tuple_insert_speculative(rel: Relation, slot: *mut TupleTableSlot, cid: CommandId, options: ::core::ffi::c_int, bistate: *mut BulkInsertStateData, specToken: uint32);
    #[link_name = "table_tuple_complete_speculative__pgrx_cshim"]
    fn table_tuple_complete_speculative(rel: Relation, slot: *mut TupleTableSlot, specToken: uint32, succeeded: bool);

    fn FunctionCall2Coll(flinfo: *mut FmgrInfo, collation: Oid, arg1: Datum, arg2: Datum) -> Datum;
    fn FunctionCall3Coll(flinfo: *mut FmgrInfo, collation: Oid, arg1: Datum, arg2: Datum, arg3: Datum) -> Datum;
    fn InputFunctionCall(flinfo: *mut FmgrInfo, str_: *mut ::core::ffi::c_char, typioparam: Oid, typmod: int32) -> Datum;
    fn OutputFunctionCall(flinfo: *mut FmgrInfo, val: Datum) -> *mut ::core::ffi::c_char;
    fn JsonbValueToJsonb(val: *mut JsonbValue) -> *mut Jsonb;
    fn pushJsonbValue(pstate: *mut *mut JsonbParseState, seq: JsonbIteratorToken::Type, jbval: *mut JsonbValue) -> *mut JsonbValue;
    fn JsonbToCString(out: StringInfo, in_: *mut JsonbContainer, estimated_len: ::core::ffi::c_int) -> *mut ::core::ffi::c_char;
    fn cstring_to_text_with_len(s: *const ::core::ffi::c_char, len: ::core::ffi::c_int) -> *mut text;
    fn pnstrdup(in_: *const ::core::ffi::c_char, len: Size) -> *mut ::core::ffi::c_char;

    #[link_name = "table_tuple_fetch_row_version__pgrx_cshim"]
    fn table_tuple_fetch_row_version(rel: Relation, tid: ItemPointer, snapshot: Snapshot, slot: *mut TupleTableSlot) -> bool;
    #[link_name = "table_tuple_satisfies_snapshot__pgrx_cshim"]
    fn table_tuple_satisfies_snapshot(rel: Relation, slot: *mut TupleTableSlot, snapshot: Snapshot) -> bool;
    #[link_name = "slot_getsysattr__pgrx_cshim"]
    fn slot_getsysattr(slot: *mut TupleTableSlot, attnum: ::core::ffi::c_int, isnull: *mut bool) -> Datum;

    fn PreventCommandIfReadOnly(cmdname: *const ::core::ffi::c_char);
    fn try_relation_open(relationId: Oid, lockmode: LOCKMODE) -> Relation;
    fn relation_close(relation: Relation, lockmode: LOCKMODE);
    fn aclcheck_error(aclerr: AclResult::Type, objtype: ObjectType::Type, objectname: *const ::core::ffi::c_char);
    fn GetUserId() -> Oid;
    fn pg_class_aclmask(table_oid: Oid, roleid: Oid, mask: AclMode, how: AclMaskHow::Type) -> AclMode;
    fn pg_attribute_aclcheck_all(table_oid: Oid, roleid: Oid, mode: AclMode, how: AclMaskHow::Type) -> AclResult::Type;
    fn IsCatalogRelation(relation: Relation) -> bool;
    fn get_namespace_oid(nspname: *const ::core::ffi::c_char, missing_ok: bool) -> Oid;
    fn get_relname_relid(relname: *const ::core::ffi::c_char, relnamespace: Oid) -> Oid;
    fn get_rel_namespace(relid: Oid) -> Oid;
    fn SearchSysCacheAttName(relid: Oid, attname: *const ::core::ffi::c_char) -> HeapTuple;
    fn get_collation_isdeterministic(colloid: Oid) -> bool;
    fn get_collation_name(colloid: Oid) -> *mut ::core::ffi::c_char;
    fn IsInParallelMode() -> bool;
    fn AcceptInvalidationMessages();
    fn get_namespace_name(nspid: Oid) -> *mut ::core::ffi::c_char;
    fn DirectFunctionCall1Coll(func: PGFunction, collation: Oid, arg1: Datum) -> Datum;
    fn DirectFunctionCall2Coll(func: PGFunction, collation: Oid, arg1: Datum, arg2: Datum) -> Datum;
    fn timestamp_mi_interval(fcinfo: FunctionCallInfo) -> Datum;
    fn nextval_oid(fcinfo: FunctionCallInfo) -> Datum;
    fn LockDatabaseObject(classid: Oid, objid: Oid, objsubid: uint16, lockmode: LOCKMODE);
    fn UnlockDatabaseObject(classid: Oid, objid: Oid, objsubid: uint16, lockmode: LOCKMODE);
    fn nocache_index_getattr(tup: IndexTuple, attnum: ::core::ffi::c_int, tupleDesc: TupleDesc) -> Datum;
    fn RelationGetNumberOfBlocksInFork(relation: Relation, forkNum: ForkNumber::Type) -> BlockNumber;
    fn GetAccessStrategy(btype: BufferAccessStrategyType::Type) -> BufferAccessStrategy;
    fn FreeAccessStrategy(strategy: BufferAccessStrategy);
    fn ReadBufferExtended(reln: Relation, forkNum: ForkNumber::Type, blockNum: BlockNumber, mode: ReadBufferMode::Type, strategy: BufferAccessStrategy) -> Buffer;
    fn LockBuffer(buffer: Buffer, mode: ::core::ffi::c_int);
    fn UnlockReleaseBuffer(buffer: Buffer);
    fn XactLockTableWait(xid: TransactionId, rel: Relation, ctid: ItemPointer, oper: XLTW_Oper::Type);
    fn SpeculativeInsertionWait(xid: TransactionId, token: uint32);
    fn get_attnum(relid: Oid, attname: *const ::core::ffi::c_char) -> AttrNumber;
    fn CacheInvalidateRelcacheByRelid(relid: Oid);
    fn pg_class_aclcheck(table_oid: Oid, roleid: Oid, mode: AclMode) -> AclResult::Type;
    fn ProcessInterrupts();
    #[link_name = "table_tuple_lock__pgrx_cshim"]
    fn table_tuple_lock(rel: Relation, tid: ItemPointer, snapshot: Snapshot, slot: *mut TupleTableSlot, cid: CommandId, mode: LockTupleMode::Type, wait_policy: LockWaitPolicy::Type, flags: uint8, tmfd: *mut TM_FailureData) -> TM_Result::Type;

    fn SPI_connect() -> ::core::ffi::c_int;
    fn SPI_finish() -> ::core::ffi::c_int;
    fn SPI_prepare_cursor(src: *const ::core::ffi::c_char, nargs: ::core::ffi::c_int, argtypes: *mut Oid, cursorOptions: ::core::ffi::c_int) -> SPIPlanPtr;
    fn SPI_keepplan(plan: SPIPlanPtr) -> ::core::ffi::c_int;
    fn SPI_freeplan(plan: SPIPlanPtr) -> ::core::ffi::c_int;
    fn SPI_execute(src: *const ::core::ffi::c_char, read_only: bool, tcount: ::core::ffi::c_long) -> ::core::ffi::c_int;
    fn SPI_execute_plan(plan: SPIPlanPtr, Values: *mut Datum, Nulls: *const ::core::ffi::c_char, read_only: bool, tcount: ::core::ffi::c_long) -> ::core::ffi::c_int;
    fn SPI_execute_snapshot(plan: SPIPlanPtr, Values: *mut Datum, Nulls: *const ::core::ffi::c_char, snapshot: Snapshot, crosscheck_snapshot: Snapshot, read_only: bool, fire_triggers: bool, tcount: ::core::ffi::c_long) -> ::core::ffi::c_int;

    fn CopyErrorData() -> *mut ErrorData;
    fn FlushErrorState();

    // The argument checks of the C entry points (crate::error::check_arguments) run before
    // pgrx's guard: an ERROR there (out of memory, a missing TOAST chunk) must jump as
    // PostgreSQL's own do, not unwind as a panic into PostgreSQL's frames.
    fn GetDatabaseEncoding() -> ::core::ffi::c_int;
    fn GetDatabaseEncodingName() -> *const ::core::ffi::c_char;
    fn pg_detoast_datum(datum: *mut varlena) -> *mut varlena;
    fn JsonbIteratorInit(container: *mut JsonbContainer) -> *mut JsonbIterator;
    fn JsonbIteratorNext(it: *mut *mut JsonbIterator, val: *mut JsonbValue, skipNested: bool) -> JsonbIteratorToken::Type;
}

unsafe extern "C-unwind" {
    /// Not checked against pgrx's binding, whose `-> !` a function pointer type cannot spell.
    pub fn ReThrowError(edata: *mut pg_sys::ErrorData) -> !;
    /// Not among pgrx's bindings (access/nbtree.h is not in them); `int
    /// _bt_getrootheight(Relation rel)` from 15 to 18.
    pub fn _bt_getrootheight(rel: pg_sys::Relation) -> ::core::ffi::c_int;
}

/// CHECK_FOR_INTERRUPTS(): a pending cancel or timeout is raised here, inside the caller's
/// [`super::catch`].
///
/// # Safety
/// As for any call that can raise: inside a catch, holding nothing with a destructor.
#[inline]
pub unsafe fn check_for_interrupts() {
    if pg_sys::InterruptPending != 0 {
        ProcessInterrupts();
    }
}
