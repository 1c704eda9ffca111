//! Writes without SPI. A statement run through SPI from inside a function pays a second
//! executor start-up, snapshot and command-counter step, and a plan revalidation, on every
//! call; for a one-row write that is most of its cost. Here one row goes through the table and
//! index access methods in the very steps PostgreSQL's ModifyTable node takes for it
//! (nodeModifyTable.c: ExecInsert's speculative insertion, ExecUpdate's concurrent-update
//! recheck), with the same permission checks and the same errors.
//!
//! Only what the differential tester (tests/differential) proves indistinguishable from the
//! statement goes this way. [`is_plain`] sends anything with triggers (foreign keys
//! included), rules, row-level security, generated columns, partitions or inheritance
//! children to the caller's SPI statement, which lets the full executor honour them; so does
//! [`direct_allowed`] while a setting asks the executor's hooks to see nested statements.
//! The extension's own tables (the ledger's claims, the outbox's sends, the watermarks'
//! advances) are written directly only while they keep the [`Shape`] sql/ gave them.
//!
//! Error handling: every step runs inside [`catch`], so an error keeps all its fields. A
//! PostgreSQL error aborts the transaction, and the abort releases everything a [`Target`]
//! holds (memory, relation and buffer references, the snapshot, locks), so only the success
//! path cleans up, in [`Target::finish`].

use std::ffi::CStr;
use std::ptr;

use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};

use super::settings::Setting;
use super::version::{self, RangeTable};
use super::{catch, ffi, PgError};
use crate::error::{IdemError, SqlState};

type Result<T> = std::result::Result<T, PgError>;

/// `idempotency.direct_writes`: off sends every write through its SPI statement. The two
/// ways give the same results (the test suite runs both); the switch is for measuring the
/// difference and for a DBA who wants the executor's path whatever it costs.
pub static DIRECT_WRITES: GucSetting<bool> = GucSetting::<bool>::new(true);

pub fn define_settings() {
    GucRegistry::define_bool_guc(
        c"idempotency.direct_writes",
        c"Write claims, sends, watermark advances and versioned updates of plain tables without SPI.",
        c"Off runs each write as its SQL statement through SPI, with the same results and a higher cost per call.",
        &DIRECT_WRITES,
        GucContext::Userset,
        GucFlags::default(),
    );
}

thread_local! {
    static AUDIT: Setting = const { Setting::new(c"pgaudit.log") };
    static AUDIT_ROLE: Setting = const { Setting::new(c"pgaudit.role") };
}

/// Whether writes may skip the executor at all. A direct write never runs ExecutorStart or
/// ExecutorEnd, so the extensions that hook those to record nested statements would not see
/// it: while pg_stat_statements tracks all statements, auto_explain logs nested ones, or
/// pgaudit's session logging covers writes, the statement path runs instead. pgaudit's
/// object logging (pgaudit.role) needs nothing: its permission-check hook runs on both
/// paths. The rule reads settings, not whether a hook is set, because pgaudit and
/// pg_stat_statements set their hooks whenever they are loaded.
pub fn direct_allowed() -> bool {
    thread_local! {
        static TRACK: Setting = const { Setting::new(c"pg_stat_statements.track") };
        static NESTED: Setting = const { Setting::new(c"auto_explain.log_nested_statements") };
        static MIN_DURATION: Setting = const { Setting::new(c"auto_explain.log_min_duration") };
    }
    DIRECT_WRITES.get()
        // In a parallel worker, or a leader running one, the statement refuses to write
        // (25000), where a direct write would get as far as PostgreSQL's XX000.
        && !super::xact::in_parallel_mode()
        && TRACK.with(|s| s.label() != Some(c"all"))
        // auto_explain logs a nested statement when it logs nested ones at all and its
        // minimum duration (in ms; -1 switches it off) is not negative.
        && !(NESTED.with(Setting::boolean) == Some(true) && MIN_DURATION.with(Setting::integer).is_some_and(|ms| ms >= 0))
        && !audited(b"write")
}

/// Whether no one watches reads, so that a direct write (which [`direct_allowed`] let through
/// already) may also read its table without its statement. pgaudit logs a read through its
/// READ class, and through its object logging (pgaudit.role) from its permission-check hook;
/// any other ExecutorCheckPerms_hook (sepgsql's, say) is not known to let a read pass unseen,
/// so it keeps the statement. (A write calls that hook on both paths.)
fn reads_unwatched() -> bool {
    let audit_loaded = AUDIT.with(|s| s.string().is_some());
    // SAFETY: reads a backend-local function pointer, copied.
    let check_perms_hook = unsafe { pg_sys::ExecutorCheckPerms_hook };
    (check_perms_hook.is_none() || audit_loaded)
        && !audited(b"read")
        && AUDIT_ROLE.with(|s| s.string().is_none_or(|role| role.is_empty()))
}

/// Whether pgaudit is loaded and its pgaudit.log includes `class`.
fn audited(class: &[u8]) -> bool {
    AUDIT.with(|s| s.string().is_some_and(|classes| audits(classes.to_bytes(), class)))
}

/// Whether a pgaudit.log value ("write, ddl", "all, -misc") includes `class`: the classes are
/// read left to right, case-insensitively; "all" adds every class and "-class" removes one.
fn audits(classes: &[u8], wanted: &[u8]) -> bool {
    classes.split(|&b| b == b',').map(<[u8]>::trim_ascii).fold(false, |audited, class| {
        let removed = class.strip_prefix(b"-");
        match removed.unwrap_or(class) {
            c if c.eq_ignore_ascii_case(b"all") || c.eq_ignore_ascii_case(wanted) => removed.is_none(),
            _ => audited,
        }
    })
}

/// Whether a write to `rel` may bypass the executor: direct writes are allowed, and it is a
/// table with nothing attached that only the executor applies.
///
/// # Safety
/// `rel` must be an open relation.
pub unsafe fn is_plain(rel: pg_sys::Relation) -> bool {
    if !direct_allowed() {
        return false;
    }
    let class = &*(*rel).rd_rel;
    let constr = (*(*rel).rd_att).constr;
    class.relkind as u8 == pg_sys::RELKIND_RELATION
        && !class.relispartition
        // A statement on a parent also reaches its inheritance children's rows.
        && !class.relhassubclass
        && !class.relrowsecurity
        && (*rel).trigdesc.is_null()
        && (*rel).rd_rules.is_null()
        && !version::has_generated_columns(constr)
        // The executor updates a catalog's rows under the tuple lock that in-place updates
        // (VACUUM's, for one) take too (ri_needLockTagTuple); the statement keeps it. Unguarded,
        // as every claim asks: it compares the OID and raises nothing.
        && !ffi::IsCatalogRelation(rel)
}

/// The columns of `rel`, dropped ones included, in attnum order.
///
/// # Safety
/// `rel` must be open; the attributes live as long as its relcache entry.
pub unsafe fn attributes<'a>(rel: pg_sys::Relation) -> &'a [pg_sys::FormData_pg_attribute] {
    version::attributes((*rel).rd_att)
}

/// Opens `schema`.`name`, a table the extension owns, with RowExclusiveLock once the caller
/// may use the schema: the checks that resolving the qualified name in SQL would make.
/// `cached` keeps the OIDs between calls; they are checked against the opened relation every
/// time, since the extension may have been dropped and created again meanwhile.
///
/// # Safety
/// Holds nothing across the calls that can raise; the caller closes the relation.
pub unsafe fn open_owned(
    schema_name: &CStr,
    name: &CStr,
    cached: &std::cell::Cell<(pg_sys::Oid, pg_sys::Oid)>,
) -> std::result::Result<pg_sys::Relation, PgError> {
    let lock = pg_sys::RowExclusiveLock as pg_sys::LOCKMODE;
    catch(|| {
        // As parsing the statement does: a REVOKE or an ALTER another session committed
        // counts from the next statement on, even with the table already locked.
        ffi::AcceptInvalidationMessages();
        let (mut schema, mut oid) = cached.get();
        if schema == pg_sys::InvalidOid {
            (schema, oid) = find_owned(schema_name, name);
            cached.set((schema, oid));
        }
        loop {
            // The name must still lead where it led: the extension may have been dropped and
            // created again, or its schema renamed and another made under the name, since the
            // OIDs were found, and the statement resolves `schema.name` afresh.
            if ffi::get_namespace_oid(schema_name.as_ptr(), true) != schema {
                (schema, oid) = find_owned(schema_name, name);
                cached.set((schema, oid));
            }
            check_schema_usage(schema);
            let rel = ffi::try_relation_open(oid, lock);
            if !rel.is_null()
                && (*(*rel).rd_rel).relnamespace == schema
                && CStr::from_ptr((*(*rel).rd_rel).relname.data.as_ptr()) == name
            {
                return rel;
            }
            if !rel.is_null() {
                ffi::relation_close(rel, lock);
            }
            (schema, oid) = find_owned(schema_name, name);
            cached.set((schema, oid));
        }
    })
}

/// USAGE on the schema `namespace`, which resolving a qualified name needs: else 42501 as
/// the name's lookup raises it. A call given a table's OID reaches the table without the
/// name, so it checks what the statement's name would have. Unguarded.
pub unsafe fn check_schema_usage(namespace: pg_sys::Oid) {
    let usage = version::namespace_aclcheck(namespace, ffi::GetUserId(), pg_sys::ACL_USAGE as pg_sys::AclMode);
    if usage != pg_sys::AclResult::ACLCHECK_OK {
        ffi::aclcheck_error(usage, pg_sys::ObjectType::OBJECT_SCHEMA, ffi::get_namespace_name(namespace));
    }
}

/// Unguarded: raises 3F000 or 42P01 as resolving the name in SQL would.
unsafe fn find_owned(schema_name: &CStr, name: &CStr) -> (pg_sys::Oid, pg_sys::Oid) {
    let schema = ffi::get_namespace_oid(schema_name.as_ptr(), false);
    let oid = ffi::get_relname_relid(name.as_ptr(), schema);
    if oid == pg_sys::InvalidOid {
        let (schema_name, name) = (schema_name.to_string_lossy(), name.to_string_lossy());
        crate::error::raise(
            IdemError::new(SqlState::UndefinedTable, format!("relation \"{schema_name}.{name}\" does not exist"))
                .hint("The extension's own table was dropped: drop and create the extension again."),
        );
    }
    (schema, oid)
}

/// The privileges a write needs, by column, as the executor checks them for the statement
/// the write replaces: a one-entry range table, built once and kept in `context` (it is
/// only read by the permission check and the executor state that points at it).
pub struct Permissions {
    range_table: RangeTable,
    /// An UPDATE's permissions, not an INSERT's.
    updates: bool,
}

impl Permissions {
    /// # Safety
    /// `context` must outlive every use of the result.
    pub unsafe fn new(
        relid: pg_sys::Oid,
        mode: u32,
        selected: &[i16],
        inserted: &[i16],
        updated: &[i16],
        context: pg_sys::MemoryContext,
    ) -> Permissions {
        let caller = pg_sys::MemoryContextSwitchTo(context);
        let range_table = RangeTable::new(
            relid,
            version::Privileges {
                required: mode as pg_sys::AclMode,
                selected: bitmap(selected),
                inserted: bitmap(inserted),
                updated: bitmap(updated),
            },
        );
        pg_sys::MemoryContextSwitchTo(caller);
        Permissions { range_table, updates: !updated.is_empty() }
    }

    /// The executor's checks before a write to `rel`, in its order: a read-only transaction
    /// (and so a hot standby) refuses it with 25006 unless the table is temporary, then a role
    /// without a privilege gets 42501 naming the table or column.
    ///
    /// # Safety
    /// `rel` must be the open relation these permissions are for.
    pub unsafe fn check(&self, rel: pg_sys::Relation) -> Result<()> {
        catch(|| self.check_unguarded(rel))
    }

    /// [`Permissions::check`], raising its errors; for a caller already inside [`catch`].
    unsafe fn check_unguarded(&self, rel: pg_sys::Relation) {
        if pg_sys::XactReadOnly && (*(*rel).rd_rel).relpersistence as u8 != pg_sys::RELPERSISTENCE_TEMP {
            ffi::PreventCommandIfReadOnly(if self.updates { c"UPDATE" } else { c"INSERT" }.as_ptr());
        }
        self.range_table.check();
    }
}

/// A table opened for writing rows within the caller's statement.
pub struct Target {
    pub rel: pg_sys::Relation,
    estate: *mut pg_sys::EState,
    rri: *mut pg_sys::ResultRelInfo,
    caller_context: pg_sys::MemoryContext,
}

/// What a speculative insertion found.
pub enum Insert {
    Inserted,
    /// A committed row, or one of this transaction's, already holds the key.
    Conflict,
    /// The key is held by a row this transaction's snapshot cannot see (REPEATABLE READ,
    /// SERIALIZABLE): the statement's serialization failure. Nothing was written; the caller
    /// runs the statement, which raises it with every field PostgreSQL gives it.
    ToStatement,
}

impl Insert {
    /// Whether the row went in, or None where the statement must decide.
    pub fn decided(self) -> Option<bool> {
        match self {
            Insert::Inserted => Some(true),
            Insert::Conflict => Some(false),
            Insert::ToStatement => None,
        }
    }
}

/// The outcome of updating one row.
pub enum Update {
    Updated,
    /// The row is gone, or no longer the one the caller looked for.
    Skipped,
    /// A concurrent transaction changed the row; its newest version is now in the old slot,
    /// locked, and the caller judges it again.
    Recheck,
    /// A concurrent transaction changed or deleted the row after this transaction's snapshot
    /// (REPEATABLE READ, SERIALIZABLE): as for [`Insert::ToStatement`].
    ToStatement,
}

fn bitmap(attnums: &[i16]) -> *mut pg_sys::Bitmapset {
    // SAFETY: bms_add_member allocates in the current context and raises only on OOM.
    attnums.iter().fold(ptr::null_mut(), |set, &attnum| unsafe {
        pg_sys::bms_add_member(set, i32::from(attnum) - pg_sys::FirstLowInvalidHeapAttributeNumber)
    })
}

fn uses_transaction_snapshot() -> bool {
    // SAFETY: reads a backend-local setting.
    unsafe { pg_sys::XactIsoLevel >= pg_sys::XACT_REPEATABLE_READ as i32 }
}

/// The snapshot of a check that must see every transaction committed before it, as
/// PostgreSQL's foreign key checks read under REPEATABLE READ and SERIALIZABLE
/// (ri_PerformCheck): the newest one there, None (the statement's own) at READ COMMITTED.
/// Unguarded.
pub(super) unsafe fn check_snapshot() -> Option<pg_sys::Snapshot> {
    uses_transaction_snapshot().then(|| ffi::GetLatestSnapshot())
}

/// Whether `snapshot` sees the committed row in `slot`, or it is this transaction's own: its
/// own rows are duplicates even where this command cannot see them. Unguarded.
unsafe fn snapshot_sees(rel: pg_sys::Relation, slot: *mut pg_sys::TupleTableSlot, snapshot: pg_sys::Snapshot) -> bool {
    ffi::table_tuple_satisfies_snapshot(rel, slot, snapshot) || {
        let mut isnull = false;
        let xmin = ffi::slot_getsysattr(slot, pg_sys::MinTransactionIdAttributeNumber, &mut isnull);
        pg_sys::TransactionIdIsCurrentTransactionId(pg_sys::TransactionId::from(xmin.value() as u32))
    }
}

/// Whether a conflict with the committed row in `slot` is a duplicate rather than a
/// serialization failure (ExecCheckTIDVisible): always at READ COMMITTED, and under
/// REPEATABLE READ and SERIALIZABLE when the transaction's snapshot sees it. Unguarded.
pub(super) unsafe fn row_visible(rel: pg_sys::Relation, slot: *mut pg_sys::TupleTableSlot) -> bool {
    !uses_transaction_snapshot() || snapshot_sees(rel, slot, ffi::GetTransactionSnapshot())
}

/// A new statement snapshot with the command counter advanced, as SPI takes one for every
/// statement it runs: a write sees what committed before it and what this transaction (this
/// very statement included) wrote before it.
pub struct StatementSnapshot(pg_sys::Snapshot);

impl StatementSnapshot {
    /// Unguarded: for a caller inside [`catch`].
    ///
    /// # Safety
    /// Pushes a snapshot that release() pops; an error's abort pops it too.
    unsafe fn take() -> StatementSnapshot {
        Self::push(ffi::GetTransactionSnapshot())
    }

    /// For a check: [`check_snapshot`], else the statement's. Unguarded, as take().
    ///
    /// # Safety
    /// As take().
    unsafe fn take_latest() -> StatementSnapshot {
        Self::push(check_snapshot().unwrap_or_else(|| ffi::GetTransactionSnapshot()))
    }

    /// Unguarded. PushActiveSnapshot copies a static snapshot, and the copy is what later
    /// command counter updates change.
    unsafe fn push(snapshot: pg_sys::Snapshot) -> StatementSnapshot {
        ffi::PushActiveSnapshot(snapshot);
        ffi::CommandCounterIncrement();
        ffi::UpdateActiveSnapshotCommandId();
        StatementSnapshot(ffi::GetActiveSnapshot())
    }

    pub fn get(&self) -> pg_sys::Snapshot {
        self.0
    }

    pub fn release(self) {
        // SAFETY: the snapshot take() pushed is still the active one.
        unsafe { pg_sys::PopActiveSnapshot() };
    }
}

/// A btree unique index that finds at most one row for a key: valid, immediate (a deferred
/// one may hold two rows with the same key until commit), without predicate or expressions.
pub struct UniqueIndex {
    pub oid: pg_sys::Oid,
    /// Per index column: its operator family, input type and collation.
    pub opfamilies: Vec<pg_sys::Oid>,
    pub input_types: Vec<pg_sys::Oid>,
    pub collations: Vec<pg_sys::Oid>,
}

/// The first such unique index of `rel` on exactly the columns `attnums`, and where each of
/// them sits in it.
///
/// # Safety
/// `rel` must be open.
pub unsafe fn unique_index(rel: pg_sys::Relation, attnums: &[i16]) -> Option<(UniqueIndex, Vec<usize>)> {
    let list = pg_sys::RelationGetIndexList(rel);
    let found = (0..pg_sys::list_length(list)).find_map(|n| {
        let index = pg_sys::index_open(pg_sys::list_nth_oid(list, n), pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let result = unique_on(index, attnums).map(|positions| (UniqueIndex::of(index), positions));
        pg_sys::index_close(index, pg_sys::NoLock as pg_sys::LOCKMODE);
        result
    });
    pg_sys::list_free(list);
    found
}

/// Where each of `attnums` sits in `index`, if it is such a unique index on exactly them.
///
/// # Safety
/// `index` must be open.
pub unsafe fn unique_on(index: pg_sys::Relation, attnums: &[i16]) -> Option<Vec<usize>> {
    let form = &*(*index).rd_index;
    let columns = form.indnkeyatts as usize;
    let keyed = &form.indkey.values.as_slice(columns);
    let usable = (*(*index).rd_rel).relam == pg_sys::BTREE_AM_OID
        && form.indisunique
        && form.indimmediate
        && form.indisvalid
        && form.indisready
        && form.indislive
        && columns == attnums.len()
        && pg_sys::RelationGetIndexPredicate(index).is_null()
        && pg_sys::RelationGetIndexExpressions(index).is_null();
    let positions: Option<Vec<usize>> = attnums.iter().map(|a| keyed.iter().position(|k| k == a)).collect();
    positions.filter(|_| usable)
}

impl UniqueIndex {
    /// # Safety
    /// `index` must be open.
    unsafe fn of(index: pg_sys::Relation) -> UniqueIndex {
        let columns = (*(*index).rd_index).indnkeyatts as usize;
        UniqueIndex {
            oid: (*index).rd_id,
            opfamilies: (0..columns).map(|i| *(*index).rd_opfamily.add(i)).collect(),
            input_types: (0..columns).map(|i| *(*index).rd_opcintype.add(i)).collect(),
            collations: (0..columns).map(|i| *(*index).rd_indcollation.add(i)).collect(),
        }
    }
}

/// How one key column is compared through a unique index.
pub struct KeyLookup {
    /// The column's position in the index, 1-based, as scan keys number them.
    pub index_column: i16,
    pub attnum: i16,
    /// The index's equality for the column, which must be the column type's own `=`.
    pub equal: Box<pg_sys::FmgrInfo>,
    pub collation: pg_sys::Oid,
}

impl KeyLookup {
    /// Whether the column of `row` equals `given`. Unguarded.
    unsafe fn matches(&self, row: &FoundRow, given: pg_sys::Datum) -> bool {
        let (stored, null) = row.value(self.attnum);
        let equal = (&*self.equal as *const pg_sys::FmgrInfo).cast_mut();
        !null && ffi::FunctionCall2Coll(equal, self.collation, stored, given).value() != 0
    }
}

/// A memory context of the backend's life, deleted with its owner.
pub struct OwnedContext(pub pg_sys::MemoryContext);

impl OwnedContext {
    pub fn new(name: &'static std::ffi::CStr) -> OwnedContext {
        // SAFETY: a child of TopMemoryContext, named by a static string.
        OwnedContext(unsafe {
            pg_sys::AllocSetContextCreateInternal(pg_sys::TopMemoryContext, name.as_ptr(), 0, 1024, 8 * 1024)
        })
    }
}

impl Drop for OwnedContext {
    fn drop(&mut self) {
        // SAFETY: the context is this value's own, created by it and deleted only here.
        unsafe { pg_sys::MemoryContextDelete(self.0) };
    }
}

/// The index's equality for a key column, when it is the column type's own `=` (the one the
/// generated statement would use), its function looked up in `context`.
///
/// # Safety
/// `context` must outlive the result's use.
pub unsafe fn equality(
    type_oid: pg_sys::Oid,
    opfamily: pg_sys::Oid,
    input_type: pg_sys::Oid,
    context: pg_sys::MemoryContext,
) -> Option<Box<pg_sys::FmgrInfo>> {
    let operator = pg_sys::get_opfamily_member(opfamily, input_type, input_type, pg_sys::BTEqualStrategyNumber as i16);
    let default = (*pg_sys::lookup_type_cache(type_oid, pg_sys::TYPECACHE_EQ_OPR as i32)).eq_opr;
    if operator == pg_sys::InvalidOid || operator != default {
        return None;
    }
    let mut equal = Box::new(std::mem::zeroed::<pg_sys::FmgrInfo>());
    pg_sys::fmgr_info_cxt(pg_sys::get_opcode(operator), &mut *equal, context);
    Some(equal)
}

/// `UPDATE rel SET changes WHERE key = given AND newer(row)` on a plain table, where the
/// key is that of the unique index `index`: true when a row changed. A missing row, or one
/// `newer` rejects, is found to be so before any executor state exists; a row a concurrent
/// transaction changed is followed to its newest version and judged again, as EvalPlanQual
/// does.
///
/// # Safety
/// `rel` must be open with RowExclusiveLock and [`is_plain`]; `keys` in the index's column
/// order, each change a value of its column's type, and `permissions` the statement's.
pub unsafe fn update_where(
    rel: pg_sys::Relation,
    index: pg_sys::Oid,
    keys: &[(&KeyLookup, pg_sys::Datum)],
    permissions: &Permissions,
    changes: &[(i16, pg_sys::Datum, bool)],
    newer: impl Fn(&FoundRow) -> Result<bool>,
) -> Result<Option<bool>> {
    // One guarded step for the checks and the snapshot: a write's fixed cost is mostly such
    // steps, and each catch is a sigsetjmp.
    let snapshot = catch(|| {
        permissions.check_unguarded(rel);
        // The executor's next checks, before it reads a row: a table published for updates
        // needs a replica identity (CheckValidResultRel's 55000 or 42P10, even when no row
        // matches).
        ffi::CheckCmdReplicaIdentity(rel, pg_sys::CmdType::CMD_UPDATE);
        let snapshot = StatementSnapshot::take();
        // The statement's command id counts as used whether or not a row changes, so the
        // command after it gets the next one.
        ffi::GetCurrentCommandId(true);
        snapshot
    })?;
    let given = || keys.iter().copied();
    let changed = match FoundRow::find(rel, index, given(), &snapshot)? {
        Some(row) if newer(&row)? => {
            let target = Target::begin(rel, permissions)?;
            let changed = loop {
                match target.update(&row, changes)? {
                    Update::Updated => break Some(true),
                    Update::Skipped => break Some(false),
                    Update::ToStatement => break None,
                    Update::Recheck if !(row.still_matches(given())? && newer(&row)?) => break Some(false),
                    Update::Recheck => {}
                }
            };
            target.finish()?;
            changed
        }
        _ => Some(false),
    };
    snapshot.release();
    Ok(changed)
}

/// The row a unique index found, in a slot of the table's own kind; the slot is dropped and
/// the index closed with it.
pub struct FoundRow {
    slot: *mut pg_sys::TupleTableSlot,
    index: pg_sys::Relation,
}

impl FoundRow {
    /// The row of `rel` whose key columns equal the given values, through the unique index
    /// `index_oid`, as `snapshot` sees it; `keys` in the index's column order.
    ///
    /// # Safety
    /// `rel` must be open with RowExclusiveLock; each lookup's values of its column's type.
    pub unsafe fn find<'k>(
        rel: pg_sys::Relation,
        index_oid: pg_sys::Oid,
        keys: impl ExactSizeIterator<Item = (&'k KeyLookup, pg_sys::Datum)>,
        snapshot: &StatementSnapshot,
    ) -> Result<Option<FoundRow>> {
        // On the stack, left uninitialised: a unique index has at most INDEX_MAX_KEYS
        // columns, and ScanKeyEntryInitializeWithInfo sets every field of the ones used.
        let mut scan_keys =
            [const { std::mem::MaybeUninit::<pg_sys::ScanKeyData>::uninit() }; pg_sys::INDEX_MAX_KEYS as usize];
        let used = keys.len();
        let (slot, index, found) = catch(|| {
            for (scan_key, (k, given)) in scan_keys.iter_mut().zip(keys) {
                ffi::ScanKeyEntryInitializeWithInfo(
                    scan_key.as_mut_ptr(),
                    0,
                    k.index_column,
                    pg_sys::BTEqualStrategyNumber as u16,
                    pg_sys::InvalidOid,
                    k.collation,
                    (&*k.equal as *const pg_sys::FmgrInfo).cast_mut(),
                    given,
                );
            }
            let index = ffi::index_open(index_oid, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE);
            let slot = ffi::MakeSingleTupleTableSlot((*rel).rd_att, ffi::table_slot_callbacks(rel));
            let scan = version::begin_index_scan(rel, index, snapshot.get(), used as i32);
            // The first `used` keys were initialised above; the scan copies them.
            ffi::index_rescan(scan, scan_keys.as_mut_ptr().cast(), used as i32, ptr::null_mut(), 0);
            let found = ffi::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, slot);
            ffi::index_endscan(scan);
            (slot, index, found)
        })?;
        let row = FoundRow { slot, index };
        Ok(found.then_some(row))
    }

    /// Column `attnum` of the row, and whether it is NULL.
    pub fn value(&self, attnum: i16) -> (pg_sys::Datum, bool) {
        slot_value(self.slot, attnum)
    }

    /// Whether every key column still equals its given value, after a recheck.
    ///
    /// # Safety
    /// As for [`FoundRow::find`].
    pub unsafe fn still_matches<'k>(
        &self,
        mut keys: impl Iterator<Item = (&'k KeyLookup, pg_sys::Datum)>,
    ) -> Result<bool> {
        catch(|| keys.all(|(k, given)| k.matches(self, given)))
    }
}

impl Drop for FoundRow {
    fn drop(&mut self) {
        // SAFETY: made by find, dropped once; neither call raises.
        unsafe {
            ffi::ExecDropSingleTupleTableSlot(self.slot);
            ffi::index_close(self.index, pg_sys::NoLock as pg_sys::LOCKMODE);
        }
    }
}

impl Target {
    /// Starts writing `rel` (already open with RowExclusiveLock, [`is_plain`], and its
    /// `permissions` checked) under the active snapshot: inserting, with the indexes ready
    /// for ON CONFLICT-style insertion, or updating, as the permissions say.
    ///
    /// # Safety
    /// `rel` must stay open until [`Target::finish`].
    pub unsafe fn begin(rel: pg_sys::Relation, permissions: &Permissions) -> Result<Target> {
        let updates = permissions.updates;
        let operation = if updates { pg_sys::CmdType::CMD_UPDATE } else { pg_sys::CmdType::CMD_INSERT };
        catch(|| {
            let estate = ffi::CreateExecutorState();
            let caller_context = pg_sys::MemoryContextSwitchTo((*estate).es_query_cxt);
            permissions.range_table.install(estate);

            let rri = ffi::palloc0(std::mem::size_of::<pg_sys::ResultRelInfo>()) as *mut pg_sys::ResultRelInfo;
            ffi::InitResultRelInfo(rri, rel, 1, ptr::null_mut(), 0);
            version::check_valid_result_rel(rri, operation);
            // An update opens the indexes once it needs them (see Target::update).
            if !updates {
                ffi::ExecOpenIndices(rri, true);
            }
            (*estate).es_snapshot = ffi::GetActiveSnapshot();
            (*estate).es_output_cid = ffi::GetCurrentCommandId(true);
            Target { rel, estate, rri, caller_context }
        })
    }

    /// A slot of the table's own kind, freed with the target.
    pub fn table_slot(&self) -> *mut pg_sys::TupleTableSlot {
        // SAFETY: the estate lives until finish(); allocation raises only on OOM.
        unsafe {
            pg_sys::ExecInitExtraTupleSlot(self.estate, (*self.rel).rd_att, pg_sys::table_slot_callbacks(self.rel))
        }
    }

    /// A slot for building a row value by value, freed with the target.
    pub fn virtual_slot(&self) -> *mut pg_sys::TupleTableSlot {
        // SAFETY: as for table_slot.
        unsafe { pg_sys::ExecInitExtraTupleSlot(self.estate, (*self.rel).rd_att, &pg_sys::TTSOpsVirtual) }
    }

    /// The unique indexes `INSERT … ON CONFLICT (columns)` would take as its arbiters, as the
    /// planner infers them (infer_arbiter_indexes): valid unique indexes whose key columns
    /// are exactly `columns`, with no expression and no predicate. None when there is none,
    /// where the statement raises 42P10. Only for a target begun for inserting.
    pub fn arbiters(&self, columns: &[i16]) -> Option<*mut pg_sys::List> {
        let wanted = |attnum: i16| columns.contains(&attnum);
        // SAFETY: ExecOpenIndices filled these arrays with ri_NumIndices open indexes.
        unsafe {
            let rri = &*self.rri;
            let mut arbiters = ptr::null_mut();
            for i in 0..rri.ri_NumIndices as usize {
                let index = *rri.ri_IndexRelationDescs.add(i);
                let info = &**rri.ri_IndexRelationInfo.add(i);
                let form = &*(*index).rd_index;
                let keys = &info.ii_IndexAttrNumbers[..info.ii_NumIndexKeyAttrs as usize];
                if form.indisvalid
                    && form.indisunique
                    && info.ii_Expressions.is_null()
                    && info.ii_Predicate.is_null()
                    && keys.iter().all(|&k| wanted(k))
                    && columns.iter().all(|c| keys.contains(c))
                {
                    arbiters = pg_sys::lappend_oid(arbiters, form.indexrelid);
                }
            }
            (!arbiters.is_null()).then_some(arbiters)
        }
    }

    /// ExecInsert's ON CONFLICT DO NOTHING for the row in `slot`: a pre-check that waits for
    /// any in-progress inserter of the same key, then a speculative insertion that backs out
    /// and starts over if another one got in first. `arbiters` ([`Target::arbiters`]) decide;
    /// a conflict in another unique index is an error, as in SQL.
    ///
    /// # Safety
    /// `slot` must hold a virtual tuple of the table's row type; `scratch` is a table slot.
    pub unsafe fn insert_unless_present(
        &self,
        slot: *mut pg_sys::TupleTableSlot,
        arbiters: *mut pg_sys::List,
        scratch: *mut pg_sys::TupleTableSlot,
    ) -> Result<Insert> {
        // The index and heap code allocate as they go; each row's share lives in the
        // per-tuple context, emptied when the row is done, so a batch runs in constant memory.
        let caller = catch(|| {
            let caller =
                pg_sys::MemoryContextSwitchTo((*ffi::MakePerTupleExprContext(self.estate)).ecxt_per_tuple_memory);
            // ExecInsert names the table before the constraints run: a CHECK may read tableoid.
            (*slot).tts_tableOid = (*self.rel).rd_id;
            if !(*(*self.rel).rd_att).constr.is_null() {
                ffi::ExecConstraints(self.rri, slot, self.estate);
            }
            caller
        })?;
        let outcome = loop {
            let attempt = catch(|| {
                ffi::check_for_interrupts();
                let mut conflict = pg_sys::ItemPointerData::default();
                if !version::check_index_constraints(self.rri, slot, self.estate, &mut conflict, arbiters) {
                    return Err(conflict);
                }
                let xid = ffi::GetCurrentTransactionId();
                let token = ffi::SpeculativeInsertionLockAcquire(xid);
                ffi::table_tuple_insert_speculative(
                    self.rel,
                    slot,
                    (*self.estate).es_output_cid,
                    0,
                    ptr::null_mut(),
                    token,
                );
                let mut lost_race = false;
                version::insert_index_tuples(self.rri, slot, self.estate, false, true, &mut lost_race, arbiters, false);
                ffi::table_tuple_complete_speculative(self.rel, slot, token, !lost_race);
                ffi::SpeculativeInsertionLockRelease(xid);
                Ok(!lost_race)
            })?;
            match attempt {
                Err(mut conflict) => {
                    break if self.conflict_visible(&mut conflict, scratch)? {
                        Insert::Conflict
                    } else {
                        Insert::ToStatement
                    }
                }
                Ok(true) => break Insert::Inserted,
                Ok(false) => {}
            }
        };
        catch(|| ffi::MemoryContextReset(pg_sys::MemoryContextSwitchTo(caller)))?;
        Ok(outcome)
    }

    /// ExecCheckTIDVisible: under REPEATABLE READ and SERIALIZABLE a conflict with a row the
    /// transaction's snapshot cannot see is a serialization failure, not a duplicate; false
    /// for those, and for a conflicting row that cannot be fetched (the executor's XX000).
    unsafe fn conflict_visible(
        &self,
        tid: &mut pg_sys::ItemPointerData,
        scratch: *mut pg_sys::TupleTableSlot,
    ) -> Result<bool> {
        if !uses_transaction_snapshot() {
            return Ok(true);
        }
        let visible = catch(|| {
            if !ffi::table_tuple_fetch_row_version(self.rel, tid, &raw mut pg_sys::SnapshotAnyData, scratch) {
                return None;
            }
            let visible = snapshot_sees(self.rel, scratch, (*self.estate).es_snapshot);
            ffi::ExecClearTuple(scratch);
            Some(visible)
        })?;
        Ok(visible == Some(true))
    }

    /// ExecUpdate for `row` with `changes` (attnum, value, is NULL) over its other values:
    /// constraints, the heap update (HOT when it can), new index entries, and on a concurrent
    /// update the newest version locked into `row` for the caller to judge again, as
    /// EvalPlanQual would.
    ///
    /// # Safety
    /// `row` must come from [`FoundRow::find`] on this target's table; each change a value of
    /// its column's type.
    pub unsafe fn update(&self, row: &FoundRow, changes: &[(i16, pg_sys::Datum, bool)]) -> Result<Update> {
        let estate = self.estate;
        let old = row.slot;
        let new = self.virtual_slot();
        let mut tid = (*old).tts_tid;
        let mut failure: pg_sys::TM_FailureData = std::mem::zeroed();
        let mut lock_mode = pg_sys::LockTupleMode::LockTupleExclusive;
        let result = catch(|| {
            self.fill(old, new, changes);
            (*new).tts_tableOid = (*self.rel).rd_id;
            ffi::ExecMaterializeSlot(new);
            if !(*(*self.rel).rd_att).constr.is_null() {
                ffi::ExecConstraints(self.rri, new, estate);
            }
            let mut update_indexes = version::NO_INDEXES;
            let result = version::tuple_update(
                self.rel,
                &mut tid,
                new,
                estate,
                &mut failure,
                &mut lock_mode,
                &mut update_indexes,
            );
            let needed =
                if result == pg_sys::TM_Result::TM_Ok { version::index_entries_needed(update_indexes) } else { None };
            if let Some(only_summarizing) = needed {
                // Only now: a HOT update, which most updates of unindexed columns are, makes
                // no index entries (from 16, none but in summarizing indexes). The indexes
                // opened are the ones the heap update judged against, as nothing reads
                // invalidations in between.
                if (*self.rri).ri_IndexRelationDescs.is_null() {
                    ffi::ExecOpenIndices(self.rri, false);
                }
                if (*self.rri).ri_NumIndices > 0 {
                    version::insert_index_tuples(
                        self.rri,
                        new,
                        estate,
                        true,
                        false,
                        ptr::null_mut(),
                        ptr::null_mut(),
                        only_summarizing,
                    );
                }
            }
            result
        })?;
        match result {
            pg_sys::TM_Result::TM_Ok => Ok(Update::Updated),
            pg_sys::TM_Result::TM_SelfModified => self.modified_by_self(&failure),
            pg_sys::TM_Result::TM_Updated | pg_sys::TM_Result::TM_Deleted if uses_transaction_snapshot() => {
                Ok(Update::ToStatement)
            }
            pg_sys::TM_Result::TM_Updated => {
                let locked = catch(|| {
                    ffi::table_tuple_lock(
                        self.rel,
                        &mut tid,
                        (*estate).es_snapshot,
                        old,
                        (*estate).es_output_cid,
                        lock_mode,
                        pg_sys::LockWaitPolicy::LockWaitBlock,
                        pg_sys::TUPLE_LOCK_FLAG_FIND_LAST_VERSION as u8,
                        &mut failure,
                    )
                })?;
                match locked {
                    pg_sys::TM_Result::TM_Ok => Ok(Update::Recheck),
                    pg_sys::TM_Result::TM_Deleted => Ok(Update::Skipped),
                    pg_sys::TM_Result::TM_SelfModified => self.modified_by_self(&failure),
                    other => error!("unexpected table_tuple_lock status: {other}"),
                }
            }
            pg_sys::TM_Result::TM_Deleted => Ok(Update::Skipped),
            other => error!("unrecognized table_tuple_update status: {other}"),
        }
    }

    /// The new row in `new`: the old row's values with the changes over them. Unguarded.
    unsafe fn fill(
        &self,
        old: *mut pg_sys::TupleTableSlot,
        new: *mut pg_sys::TupleTableSlot,
        changes: &[(i16, pg_sys::Datum, bool)],
    ) {
        let natts = (*(*self.rel).rd_att).natts as usize;
        ffi::ExecClearTuple(new);
        ffi::slot_getallattrs(old);
        let (values, nulls) = ((*new).tts_values, (*new).tts_isnull);
        ptr::copy_nonoverlapping((*old).tts_values, values, natts);
        ptr::copy_nonoverlapping((*old).tts_isnull, nulls, natts);
        for (i, attr) in attributes(self.rel).iter().enumerate() {
            // A dropped column's old bits are not carried into the new row.
            if attr.attisdropped {
                *nulls.add(i) = true;
            }
        }
        for &(attnum, value, null) in changes {
            let i = attnum as usize - 1;
            (*values.add(i), *nulls.add(i)) = (value, null);
        }
        ffi::ExecStoreVirtualTuple(new);
    }

    /// The row was changed earlier in this transaction after our snapshot's command: by this
    /// very command it is simply done; by anything else it is the executor's error.
    unsafe fn modified_by_self(&self, failure: &pg_sys::TM_FailureData) -> Result<Update> {
        if failure.cmax != (*self.estate).es_output_cid {
            pg_sys::panic::ErrorReport::new(
                PgSqlErrorCode::ERRCODE_TRIGGERED_DATA_CHANGE_VIOLATION,
                "tuple to be updated was already modified by an operation triggered by the current command",
                "ExecUpdate",
            )
            .set_hint("Consider using an AFTER trigger instead of a BEFORE trigger to propagate changes to other rows.")
            .report(PgLogLevel::ERROR);
        }
        Ok(Update::Skipped)
    }

    /// Ends the write: indexes closed, slots released, the executor state freed.
    pub fn finish(self) -> Result<()> {
        // SAFETY: the target was begun and is finished once (finish takes it by value).
        unsafe {
            catch(|| {
                ffi::ExecCloseIndices(self.rri);
                ffi::ExecResetTupleTable((*self.estate).es_tupleTable, false);
                pg_sys::MemoryContextSwitchTo(self.caller_context);
                ffi::FreeExecutorState(self.estate);
            })
        }
    }
}

/// The attnum of the column at 0-based `index`.
pub const fn attnum(index: usize) -> i16 {
    index as i16 + 1
}

/// A column default an extension-owned table is created with, which a direct insert
/// computes itself instead of evaluating the expression.
pub enum ColumnDefault {
    /// `now()`: the transaction's start.
    Now,
    /// An int4 constant.
    Int4(i32),
}

impl ColumnDefault {
    /// Whether `node`, a cooked default expression, is this one.
    unsafe fn is(&self, node: *mut pg_sys::Node) -> bool {
        if node.is_null() {
            return false;
        }
        match *self {
            ColumnDefault::Now => {
                (*node).type_ == pg_sys::NodeTag::T_FuncExpr
                    && (*(node as *mut pg_sys::FuncExpr)).funcid == pg_sys::Oid::from(pg_sys::F_NOW)
                    && (*(node as *mut pg_sys::FuncExpr)).args.is_null()
            }
            ColumnDefault::Int4(value) => {
                let c = node as *mut pg_sys::Const;
                (*node).type_ == pg_sys::NodeTag::T_Const
                    && (*c).consttype == pg_sys::INT4OID
                    && !(*c).constisnull
                    && (*c).constvalue.value() as i32 == value
            }
        }
    }

    /// The value the default gives a row inserted now.
    fn value(&self) -> pg_sys::Datum {
        match *self {
            // SAFETY: reads the transaction's start, set when it began.
            ColumnDefault::Now => pg_sys::Datum::from(unsafe { pg_sys::GetCurrentTransactionStartTimestamp() }),
            ColumnDefault::Int4(value) => pg_sys::Datum::from(value),
        }
    }
}

/// The columns an extension-owned table is created with (sql/), in table order, and their
/// defaults. A table that no longer has exactly this shape (a column a DBA added or renamed,
/// a default changed or added, a typmod, an identity or generated column) needs the INSERT
/// statement to fill its rows in, or to fail as it does; so does one with a CHECK or an index
/// that calls a function that is not immutable ([`runs_mutable_functions`]).
pub struct Shape {
    /// (name, type) of each column.
    pub columns: &'static [(&'static CStr, pg_sys::Oid)],
    /// (attnum, default) of each column that has one.
    pub defaults: &'static [(i16, ColumnDefault)],
}

thread_local! {
    /// Whether the table of an OID has its shape, until the next invalidation of its relcache
    /// entry (ALTER TABLE, a new default, a new index). A list: it holds one entry per owned
    /// table, searched on every write.
    static SHAPED: std::cell::RefCell<Vec<(pg_sys::Oid, bool)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Forgets whether the table `relid` (every table when 0) has its shape.
pub fn forget_shape(relid: pg_sys::Oid) {
    SHAPED.with(|shaped| shaped.borrow_mut().retain(|(oid, _)| relid != pg_sys::InvalidOid && *oid != relid));
}

impl Shape {
    /// Whether `rel` has this shape.
    ///
    /// # Safety
    /// `rel` must be open.
    pub unsafe fn fits(&self, rel: pg_sys::Relation) -> bool {
        let relid = (*rel).rd_id;
        if let Some(fits) = SHAPED.with(|s| s.borrow().iter().find(|(oid, _)| *oid == relid).map(|(_, fits)| *fits)) {
            return fits;
        }
        let before = super::relcache::generation();
        let attrs = attributes(rel);
        let n = self.columns.len();
        let has_default = |attnum: i16| self.defaults.iter().any(|(a, _)| *a == attnum);
        let fits = attrs.len() >= n
            // A typmod (numeric(30,2), timestamptz(0)) is applied by the statement's assignment.
            && self.columns.iter().zip(attrs).all(|(&(name, type_oid), attr)| {
                !attr.attisdropped
                    && attr.atttypid == type_oid
                    && attr.atttypmod < 0
                    && CStr::from_ptr(attr.attname.data.as_ptr()) == name
            })
            && attrs[n..].iter().all(|attr| attr.attisdropped)
            && attrs.iter().all(|attr| attr.attidentity == 0 && attr.attgenerated == 0)
            && attrs.iter().all(|attr| attr.atthasdef == has_default(attr.attnum))
            && self.defaults.iter().all(|(attnum, default)| default_is(rel, *attnum, default))
            && !runs_mutable_functions(rel);
        if super::relcache::generation() == before {
            SHAPED.with(|s| s.borrow_mut().push((relid, fits)));
        }
        fits
    }
}

/// Whether a CHECK constraint, an index expression or an index predicate of `rel` calls a
/// function that is not immutable. Such a function may read tables, and it would read them
/// under the caller's snapshot and command where the statement, run through SPI, takes a new
/// snapshot after a command-counter step: a direct insert would see less than the statement.
unsafe fn runs_mutable_functions(rel: pg_sys::Relation) -> bool {
    let constr = (*(*rel).rd_att).constr;
    let checks = if constr.is_null() || (*constr).num_check == 0 {
        &[][..]
    } else {
        std::slice::from_raw_parts((*constr).check, (*constr).num_check as usize)
    };
    if checks.iter().any(|c| pg_sys::contain_mutable_functions(pg_sys::stringToNode(c.ccbin).cast())) {
        return true;
    }
    let list = pg_sys::RelationGetIndexList(rel);
    let mutable = (0..pg_sys::list_length(list)).any(|n| {
        let index = pg_sys::index_open(pg_sys::list_nth_oid(list, n), pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let mutable = [pg_sys::RelationGetIndexExpressions(index), pg_sys::RelationGetIndexPredicate(index)]
            .into_iter()
            .any(|exprs| !exprs.is_null() && pg_sys::contain_mutable_functions(exprs.cast()));
        pg_sys::index_close(index, pg_sys::NoLock as pg_sys::LOCKMODE);
        mutable
    });
    pg_sys::list_free(list);
    mutable
}

/// Whether column `attnum`'s default is `default`.
unsafe fn default_is(rel: pg_sys::Relation, attnum: i16, default: &ColumnDefault) -> bool {
    let constr = (*(*rel).rd_att).constr;
    if constr.is_null() {
        return false;
    }
    let defaults = std::slice::from_raw_parts((*constr).defval, (*constr).num_defval as usize);
    defaults
        .iter()
        .filter(|d| d.adnum == attnum)
        .any(|d| default.is(pg_sys::stringToNode(d.adbin) as *mut pg_sys::Node))
}

/// The privileges of `INSERT … ON CONFLICT (arbiter) DO NOTHING`: INSERT on the named
/// columns, and SELECT on the arbiter's, which the conflict reads.
pub struct InsertPrivileges {
    pub inserted: &'static [i16],
    pub arbiter: &'static [i16],
}

/// The permission checks of a table's kinds of insert, built once per backend (and again if
/// the extension is recreated; the old ones' few bytes stay in TopMemoryContext).
pub struct PermissionCache(std::cell::RefCell<Option<(pg_sys::Oid, Vec<Permissions>)>>);

impl PermissionCache {
    pub const fn new() -> PermissionCache {
        PermissionCache(std::cell::RefCell::new(None))
    }

    /// Runs `with` on the check of `kinds[kind]` for the table `relid`.
    pub fn with<R>(
        &self,
        relid: pg_sys::Oid,
        kinds: &[InsertPrivileges],
        kind: usize,
        with: impl FnOnce(&Permissions) -> R,
    ) -> R {
        let mut cache = self.0.borrow_mut();
        if !matches!(&*cache, Some((oid, _)) if *oid == relid) {
            // SAFETY: TopMemoryContext lives as long as the backend, and relid is the caller's
            // open table.
            let build = |k: &InsertPrivileges| unsafe {
                Permissions::new(
                    relid,
                    pg_sys::ACL_INSERT | pg_sys::ACL_SELECT,
                    k.arbiter,
                    k.inserted,
                    &[],
                    pg_sys::TopMemoryContext,
                )
            };
            *cache = Some((relid, kinds.iter().map(build).collect()));
        }
        let (_, permissions) = cache.as_ref().expect("just filled");
        with(&permissions[kind])
    }
}

/// What an index must be for a scan of it to stand for a query's WHERE on the same columns:
/// a valid btree whose keys are `columns`, in order, each ascending with NULLs last (so a scan
/// meets rows in the order a query's ORDER BY on them gives), compared by the operator family
/// given with it (its type's default one, which holds the `=`, `<` and `>=` a query uses) and
/// the column's own collation, with no expression and with the predicate `column IS NULL`
/// for exactly the `null_columns`. Its entries are then the rows that predicate selects: an
/// update of a column a predicate reads is never HOT, so a row reached through an entry
/// still satisfies it.
pub struct IndexShape {
    /// (attnum, operator family)
    pub columns: &'static [(i16, pg_sys::Oid)],
    pub null_columns: &'static [i16],
}

impl IndexShape {
    /// Unguarded: reads the catalog's caches.
    unsafe fn fits(&self, rel: pg_sys::Relation, index: pg_sys::Relation, info: &pg_sys::IndexInfo) -> bool {
        let form = &*(*index).rd_index;
        let keys = &info.ii_IndexAttrNumbers[..info.ii_NumIndexKeyAttrs as usize];
        let attributes = attributes(rel);
        (*(*index).rd_rel).relam == pg_sys::BTREE_AM_OID
            && form.indisvalid
            // An index built over broken HOT chains misses rows older snapshots still see:
            // the planner uses it only in transactions younger than it (get_relation_info).
            && (!form.indcheckxmin
                || pg_sys::TransactionIdPrecedes(
                    pg_sys::submodules::htup::HeapTupleHeaderGetXmin((*(*index).rd_indextuple).t_data),
                    pg_sys::TransactionXmin,
                ))
            && info.ii_Expressions.is_null()
            && keys.len() == self.columns.len()
            && self.columns.iter().enumerate().all(|(i, &(attnum, family))| {
                keys[i] == attnum
                    && *(*index).rd_indoption.add(i) == 0
                    && *(*index).rd_opfamily.add(i) == family
                    && *(*index).rd_indcollation.add(i) == attributes[attnum as usize - 1].attcollation
            })
            && self.predicate_fits(info.ii_Predicate)
    }

    /// Whether an index predicate (its implicitly ANDed clauses) is `column IS NULL` for each
    /// of the null columns, once each, and nothing else.
    unsafe fn predicate_fits(&self, predicate: *mut pg_sys::List) -> bool {
        let clauses = pgrx::PgList::<pg_sys::Node>::from_pg(predicate);
        let mut tested: Vec<i16> = clauses
            .iter_ptr()
            .filter_map(|clause| {
                if (*clause).type_ != pg_sys::NodeTag::T_NullTest {
                    return None;
                }
                let test = &*clause.cast::<pg_sys::NullTest>();
                let var = test.arg.cast::<pg_sys::Var>();
                (test.nulltesttype == pg_sys::NullTestType::IS_NULL
                    && !test.argisrow
                    && (*var).xpr.type_ == pg_sys::NodeTag::T_Var
                    && (*var).varlevelsup == 0)
                    .then_some((*var).varattno)
            })
            .collect();
        tested.sort_unstable();
        let mut wanted = self.null_columns.to_vec();
        wanted.sort_unstable();
        clauses.len() == tested.len() && tested == wanted
    }
}

/// A row an index scan found, valid until the scan moves on.
pub struct ScannedRow(*mut pg_sys::TupleTableSlot);

impl ScannedRow {
    /// Column `attnum` of the row, and whether it is NULL.
    pub fn value(&self, attnum: i16) -> (pg_sys::Datum, bool) {
        slot_value(self.0, attnum)
    }
}

/// Column `attnum` of the row in `slot`, and whether it is NULL.
fn slot_value(slot: *mut pg_sys::TupleTableSlot, attnum: i16) -> (pg_sys::Datum, bool) {
    let mut null = false;
    // SAFETY: the slot holds a row of the table; deforming a stored row raises nothing.
    let value = unsafe { ffi::slot_getattr(slot, i32::from(attnum), &mut null) };
    (value, null)
}

/// An extension-owned table opened for `INSERT … ON CONFLICT (arbiter) DO NOTHING` of one
/// row at a time without SPI; the statement stays the way in whenever the table is not plain
/// ([`is_plain`]) or not of its [`Shape`].
pub struct DirectInsert {
    target: Target,
    /// The shape's defaults, which every row gets unless `fill` sets the column.
    defaults: &'static [(i16, ColumnDefault)],
    row: *mut pg_sys::TupleTableSlot,
    scratch: *mut pg_sys::TupleTableSlot,
    arbiters: *mut pg_sys::List,
}

impl DirectInsert {
    /// Starts inserting into `rel` after the checks the statement makes before it evaluates
    /// a value; None, with `rel` closed, when the statement must run instead.
    ///
    /// # Safety
    /// `rel` must be open with RowExclusiveLock; [`DirectInsert::finish`] closes it.
    pub unsafe fn open(
        rel: pg_sys::Relation,
        shape: &'static Shape,
        permissions: &Permissions,
        arbiter: &[i16],
    ) -> Result<Option<DirectInsert>> {
        let close = || pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        if !is_plain(rel) || !shape.fits(rel) {
            close();
            return Ok(None);
        }
        let target = Target::begin(rel, permissions)?;
        // The statement finds its arbiters when it is planned, before its privileges are
        // checked: without one it is the statement's 42P10, whatever the role may do.
        let Some(arbiters) = target.arbiters(arbiter) else {
            target.finish()?;
            close();
            return Ok(None);
        };
        permissions.check(rel)?;
        let row = target.virtual_slot();
        let scratch = target.table_slot();
        Ok(Some(DirectInsert { target, defaults: shape.defaults, row, scratch, arbiters }))
    }

    /// The first row, in index order, that the table's index of `shape` holds within `bounds`
    /// (one per index column: a btree strategy and a value of the column's type, compared by
    /// the index's own operators), other than the row this insert wrote, and that `take`
    /// takes: what the caller's query, run now as the table's owner with the newest snapshot
    /// ([`crate::postgres::spi::Statement::run_latest`]), would find through that index, with
    /// its reads and statistics. Ok(None), and the caller runs its
    /// query, where the two could be told apart:
    /// - the table has no index of the shape;
    /// - the owner is not a superuser: the query checks the owner's privileges (USAGE on the
    ///   schema, SELECT on the columns), which a superuser always has;
    /// - something watches reads ([`reads_unwatched`]);
    /// - SERIALIZABLE: the query's predicate locks follow its plan.
    pub fn probe<R>(
        &self,
        shape: &IndexShape,
        bounds: &[(u16, pg_sys::Datum)],
        mut take: impl FnMut(&ScannedRow) -> Option<R>,
    ) -> Result<Option<Option<R>>> {
        let target = &self.target;
        // SAFETY: ExecOpenIndices filled the arrays with ri_NumIndices open indexes; the slot
        // is the table's, free once the insert is done; each bound is of its column's type.
        unsafe {
            let rri = &*target.rri;
            let found = catch(|| {
                if !reads_unwatched()
                    || pg_sys::XactIsoLevel == pg_sys::XACT_SERIALIZABLE as i32
                    || !ffi::superuser_arg((*(*target.rel).rd_rel).relowner)
                {
                    return None;
                }
                (0..rri.ri_NumIndices as usize).find(|&i| {
                    shape.fits(target.rel, *rri.ri_IndexRelationDescs.add(i), &**rri.ri_IndexRelationInfo.add(i))
                })
            })?;
            let Some(index) = found.map(|i| *rri.ri_IndexRelationDescs.add(i)) else { return Ok(None) };
            let mut scan_keys =
                [const { std::mem::MaybeUninit::<pg_sys::ScanKeyData>::uninit() }; pg_sys::INDEX_MAX_KEYS as usize];
            // One guarded step for the snapshot and the scan (each catch is a sigsetjmp).
            let (snapshot, found) = catch(|| {
                let snapshot = StatementSnapshot::take_latest();
                for (column, (scan_key, &(strategy, value))) in scan_keys.iter_mut().zip(bounds).enumerate() {
                    let family = *(*index).rd_opfamily.add(column);
                    let input = *(*index).rd_opcintype.add(column);
                    let operator = ffi::get_opfamily_member(family, input, input, strategy as i16);
                    ffi::ScanKeyEntryInitialize(
                        scan_key.as_mut_ptr(),
                        0,
                        column as i16 + 1,
                        strategy,
                        pg_sys::InvalidOid,
                        *(*index).rd_indcollation.add(column),
                        ffi::get_opcode(operator),
                        value,
                    );
                }
                let scan = version::begin_index_scan(target.rel, index, snapshot.get(), bounds.len() as i32);
                ffi::index_rescan(scan, scan_keys.as_mut_ptr().cast(), bounds.len() as i32, ptr::null_mut(), 0);
                let row = ScannedRow(self.scratch);
                let written = &raw mut (*self.row).tts_tid;
                let found = loop {
                    if !ffi::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, self.scratch) {
                        break None;
                    }
                    // The written row is read, and passed over, as the query's filter does.
                    if ffi::ItemPointerEquals(&raw mut (*self.scratch).tts_tid, written) {
                        continue;
                    }
                    if let Some(found) = take(&row) {
                        break Some(found);
                    }
                };
                ffi::index_endscan(scan);
                ffi::ExecClearTuple(self.scratch);
                (snapshot, found)
            })?;
            snapshot.release();
            Ok(Some(found))
        }
    }

    /// Inserts the row `fill` sets (every column starts NULL, or with its default where the
    /// shape has one, as the INSERT fills the columns it does not name) unless an arbiter
    /// already holds its key.
    pub fn insert(&self, fill: impl FnOnce(&mut [pg_sys::Datum], &mut [bool])) -> Result<Insert> {
        // SAFETY: the slot is the table's, built for its row type; its arrays hold natts entries.
        unsafe {
            let row = self.row;
            pg_sys::ExecClearTuple(row);
            let natts = (*(*self.target.rel).rd_att).natts as usize;
            let values = std::slice::from_raw_parts_mut((*row).tts_values, natts);
            let nulls = std::slice::from_raw_parts_mut((*row).tts_isnull, natts);
            nulls.fill(true);
            for (attnum, default) in self.defaults {
                let i = *attnum as usize - 1;
                (values[i], nulls[i]) = (default.value(), false);
            }
            fill(values, nulls);
            pg_sys::ExecStoreVirtualTuple(row);
            self.target.insert_unless_present(row, self.arbiters, self.scratch)
        }
    }

    /// Ends the insert and closes the table.
    pub fn finish(self) -> Result<()> {
        let rel = self.target.rel;
        self.target.finish()?;
        // SAFETY: opened by the caller of open, closed once.
        unsafe { pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE) };
        Ok(())
    }
}
