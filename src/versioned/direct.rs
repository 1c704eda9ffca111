//! idem_versioned_update without SPI, for plain tables (see [`crate::postgres::write`]): the
//! plan names the unique index that finds the row, every column's attnum and input function,
//! and the version's ordering, so a call is one index probe, one comparison and one heap
//! update.
//!
//! Values are made as the hand-written statement's literals are made when it is parsed
//! ([`text_input`]): a JSON string's contents, a number's or boolean's text, or a nested
//! value's JSON text goes through the column type's input function, then the column's typmod;
//! a jsonb column takes the value as it is. Domains, json columns and the types
//! jsonb_populate_record builds from JSON structure (arrays, composites) keep the generated
//! statement, which [`Literals`] makes the values for first.

use std::ptr;

use pgrx::pg_sys;

use crate::jsonb::{integer, Member};
use crate::postgres::write::{
    attributes, equality, is_plain, unique_index, update_where, FoundRow, KeyLookup, OwnedContext, Permissions,
};
use crate::postgres::{catch, ffi, PgError};

/// How a JSON member becomes a value of its column.
enum Input {
    /// The member's text through the type's input function, then fitted to the typmod.
    Text { function: Box<pg_sys::FmgrInfo>, io_param: pg_sys::Oid, typmod: i32, shortcut: Shortcut, fit: Option<Fit> },
    /// A jsonb column stores the member itself.
    Jsonb,
    /// An array or composite, built from the member's JSON structure (or parsed from a JSON
    /// string) as the statement builds it: `jsonb_to_record('{"v": member}')` with a column
    /// definition list of the one column `v`, here `desc`.
    Structured { desc: pg_sys::TupleDesc },
}

/// Members whose value the input function would make from their text without any check
/// that can fail, built directly: keys and versions are mostly integers and texts, and
/// printing a number only to parse it again is a good part of a versioned write's cost.
#[derive(Clone, Copy)]
enum Shortcut {
    None,
    /// text: a JSON string's contents are the value.
    Text,
    /// int2, int4, int8: a JSON integer within the type's range is the value; anything else
    /// ("5.0", out of range, a string) takes the input function and its exact error.
    Integer {
        min: i64,
        max: i64,
    },
}

impl Shortcut {
    fn of(type_oid: pg_sys::Oid) -> Shortcut {
        match type_oid {
            pg_sys::TEXTOID => Shortcut::Text,
            pg_sys::INT2OID => Shortcut::Integer { min: i16::MIN.into(), max: i16::MAX.into() },
            pg_sys::INT4OID => Shortcut::Integer { min: i32::MIN.into(), max: i32::MAX.into() },
            pg_sys::INT8OID => Shortcut::Integer { min: i64::MIN, max: i64::MAX },
            _ => Shortcut::None,
        }
    }

    unsafe fn apply(self, value: &pg_sys::JsonbValue) -> Option<pg_sys::Datum> {
        match (self, value.type_) {
            (Shortcut::Text, pg_sys::jbvType::jbvString) => {
                Some(pg_sys::Datum::from(ffi::cstring_to_text_with_len(value.val.string.val, value.val.string.len)))
            }
            (Shortcut::Integer { min, max }, pg_sys::jbvType::jbvNumeric) => {
                integer(value.val.numeric).filter(|n| (min..=max).contains(n)).map(pg_sys::Datum::from)
            }
            _ => None,
        }
    }
}

struct Column {
    attnum: i16,
    input: Input,
}

struct KeyColumn {
    column: Column,
    /// Which of the key's members holds the column's value.
    member: usize,
    lookup: KeyLookup,
}

/// The direct write for one (table, version column, key columns, changed columns).
pub struct DirectUpdate {
    /// Owns what the input and equality functions cache between calls.
    _context: OwnedContext,
    index: pg_sys::Oid,
    /// In the unique index's column order, as its scan keys must be.
    keys: Vec<KeyColumn>,
    /// In the order of the changes' members.
    changes: Vec<Column>,
    /// Which change is the version.
    version: usize,
    version_order: *mut pg_sys::FmgrInfo,
    version_collation: pg_sys::Oid,
    /// The statement's `<` on versions runs in its executor, which counts a call in
    /// pg_stat_user_functions when track_functions is above this (its FmgrInfo's fn_stats:
    /// never for a built-in, at `all` for C and SQL functions, at `pl` for the others).
    version_less_counted_above: i32,
    /// SELECT on the key and version columns, UPDATE on the changed ones, as for the statement.
    permissions: Permissions,
    /// The order in which the values are made, the statement path's own (see [`Literals`]),
    /// so that of two bad values the same one is reported.
    coercions: Vec<Value>,
}

#[derive(Clone, Copy)]
enum Value {
    Change(usize),
    Key(usize),
}

unsafe fn attribute<'a>(rel: pg_sys::Relation, name: &str) -> Option<&'a pg_sys::FormData_pg_attribute> {
    attributes(rel).iter().find(|attr| {
        !attr.attisdropped && std::ffi::CStr::from_ptr(attr.attname.data.as_ptr()).to_bytes() == name.as_bytes()
    })
}

impl DirectUpdate {
    /// The direct plan, or None when this write needs the generated statement. The caller
    /// has validated names, version ordering and the key's unique index already.
    ///
    /// # Safety
    /// `rel` must be open.
    /// `order` is the order in which the values are made, as for the statement ([`Literals`]):
    /// argument 0 is the key, 1 the changes.
    pub unsafe fn plan(
        rel: pg_sys::Relation,
        key: &[Member<'_>],
        changes: &[Member<'_>],
        version: &str,
        order: &[(usize, usize, &str, Literal)],
    ) -> Option<DirectUpdate> {
        let version_position = changes.iter().position(|m| m.name == version)?;
        if !is_plain(rel) {
            return None;
        }
        // Every early return below drops the context with what was built in it.
        let owned = OwnedContext::new(c"idempotency versioned update");
        let context = owned.0;
        let mut columns = Vec::with_capacity(changes.len());
        for member in changes {
            let attr = attribute(rel, member.name)?;
            // GENERATED ALWAYS AS IDENTITY may only be set to DEFAULT: the statement's 428C9.
            if attr.attidentity as u8 == pg_sys::ATTRIBUTE_IDENTITY_ALWAYS {
                return None;
            }
            columns.push(Column { attnum: attr.attnum, input: input(attr, attr.atttypmod, context)? });
        }
        let version_attr = attribute(rel, version)?;
        // The statement compares the new version before the column's typmod rounds it.
        if version_attr.atttypmod >= 0 {
            return None;
        }
        let version_type = pg_sys::lookup_type_cache(version_attr.atttypid, pg_sys::TYPECACHE_CMP_PROC_FINFO as i32);
        if (*version_type).cmp_proc_finfo.fn_oid == pg_sys::InvalidOid {
            return None;
        }
        let version_less = pg_sys::lookup_type_cache(version_attr.atttypid, pg_sys::TYPECACHE_LT_OPR as i32);
        let mut less = std::mem::zeroed::<pg_sys::FmgrInfo>();
        pg_sys::fmgr_info_cxt(pg_sys::get_opcode((*version_less).lt_opr), &mut less, context);

        let key_attrs: Vec<&pg_sys::FormData_pg_attribute> =
            key.iter().map(|m| attribute(rel, m.name)).collect::<Option<_>>()?;
        let attnums: Vec<i16> = key_attrs.iter().map(|a| a.attnum).collect();
        let (index, positions) = unique_index(rel, &attnums)?;
        let mut keys = Vec::with_capacity(key.len());
        for (member, (attr, &position)) in key_attrs.iter().zip(&positions).enumerate() {
            // The statement compares with the column's collation; the index may sort by another.
            if index.collations[position] != attr.attcollation {
                return None;
            }
            keys.push(KeyColumn {
                column: Column { attnum: attr.attnum, input: input(attr, -1, context)? },
                member,
                lookup: KeyLookup {
                    index_column: position as i16 + 1,
                    attnum: attr.attnum,
                    equal: equality(attr.atttypid, index.opfamilies[position], index.input_types[position], context)?,
                    collation: index.collations[position],
                },
            });
        }
        keys.sort_by_key(|k| k.lookup.index_column);
        let coercions = order
            .iter()
            .map(|&(argument, position, _, _)| match argument {
                0 => keys.iter().position(|k| k.member == position).map(Value::Key),
                _ => Some(Value::Change(position)),
            })
            .collect::<Option<Vec<_>>>()?;
        let selected: Vec<i16> = attnums.iter().copied().chain([version_attr.attnum]).collect();
        let updated: Vec<i16> = columns.iter().map(|c| c.attnum).collect();
        Some(DirectUpdate {
            permissions: Permissions::new(
                (*rel).rd_id,
                pg_sys::ACL_SELECT | pg_sys::ACL_UPDATE,
                &selected,
                &[],
                &updated,
                context,
            ),
            _context: owned,
            index: index.oid,
            keys,
            changes: columns,
            version: version_position,
            version_order: &raw mut (*version_type).cmp_proc_finfo,
            version_collation: version_attr.attcollation,
            version_less_counted_above: i32::from(less.fn_stats),
            coercions,
        })
    }

    /// Runs the write; true when a row changed, None where the statement must decide (a
    /// serialization failure, see [`update_where`], or a version comparison the statement's
    /// executor counts in the function statistics). A stale or missing row is found to be
    /// so before any executor state exists: most deliveries of a busy read model are stale.
    ///
    /// # Safety
    /// `rel` must be the plan's table, open with RowExclusiveLock; the members must be those
    /// the plan was made for, in the same order.
    pub unsafe fn run(
        &self,
        rel: pg_sys::Relation,
        key: &[Member<'_>],
        changes: &[Member<'_>],
    ) -> Result<Option<bool>, PgError> {
        // Comparing directly would leave out the call the statement counts.
        // SAFETY: a GUC variable, read on the backend's own thread.
        if unsafe { pg_sys::pgstat_track_functions } > self.version_less_counted_above {
            return Ok(None);
        }
        // Values first, as a client's literals or parameters become values before the
        // statement is planned or its privileges checked.
        let mut keys: Vec<(&KeyLookup, pg_sys::Datum)> =
            self.keys.iter().map(|k| (&k.lookup, pg_sys::Datum::from(0))).collect();
        let mut new_values: Vec<(i16, pg_sys::Datum, bool)> =
            self.changes.iter().map(|c| (c.attnum, pg_sys::Datum::from(0), true)).collect();
        catch(|| {
            for value in &self.coercions {
                match *value {
                    Value::Change(i) => {
                        (new_values[i].1, new_values[i].2) = coerce(&self.changes[i].input, &changes[i].value)
                    }
                    Value::Key(i) => keys[i].1 = coerce(&self.keys[i].column.input, &key[self.keys[i].member].value).0,
                }
            }
        })?;
        let new_version = new_values[self.version].1;
        update_where(rel, self.index, &keys, &self.permissions, &new_values, |row| self.is_newer(row, new_version))
    }

    /// A stored NULL version is older than any version.
    fn is_newer(&self, row: &FoundRow, new_version: pg_sys::Datum) -> Result<bool, PgError> {
        let (stored, null) = row.value(self.changes[self.version].attnum);
        // SAFETY: both are values of the version column's type, compared by its own order.
        Ok(null
            || unsafe {
                catch(|| {
                    ffi::FunctionCall2Coll(self.version_order, self.version_collation, new_version, stored).value()
                        as i32
                        > 0
                })
            }?)
    }
}

/// How `attr` takes a JSON member, or None for types jsonb_populate_record builds from JSON
/// structure (arrays, composites, domains over them) and for json.
unsafe fn input(attr: &pg_sys::FormData_pg_attribute, typmod: i32, context: pg_sys::MemoryContext) -> Option<Input> {
    let type_oid = attr.atttypid;
    if type_oid == pg_sys::JSONBOID {
        return Some(Input::Jsonb);
    }
    // A domain's NOT NULL and CHECKs apply to JSON null too, and its casts and typmods have
    // not been proven here: domains take the statement.
    if pg_sys::get_typtype(type_oid) as u8 == pg_sys::TYPTYPE_DOMAIN || !takes_text(type_oid) {
        return None;
    }
    Some(text_input(type_oid, typmod, context))
}

/// Whether a JSON member becomes a value of the type through its text: not for json and
/// jsonb, nor for the arrays and composites jsonb_populate_record builds from JSON structure.
unsafe fn takes_text(type_oid: pg_sys::Oid) -> bool {
    type_oid != pg_sys::JSONOID
        && type_oid != pg_sys::JSONBOID
        && pg_sys::get_element_type(type_oid) == pg_sys::InvalidOid
        && pg_sys::get_typtype(type_oid) as u8 != pg_sys::TYPTYPE_COMPOSITE
}

/// How the statement makes an array or composite of `type_oid` and `typmod` from a member:
/// `jsonb_to_record` with the column definition list `(v type_oid(typmod))`.
unsafe fn structured_input(type_oid: pg_sys::Oid, typmod: i32, context: pg_sys::MemoryContext) -> Input {
    let caller = pg_sys::MemoryContextSwitchTo(context);
    let desc = pg_sys::CreateTemplateTupleDesc(1);
    pg_sys::TupleDescInitEntry(desc, 1, c"v".as_ptr(), type_oid, typmod, 0);
    pg_sys::MemoryContextSwitchTo(caller);
    Input::Structured { desc }
}

/// A value of `type_oid` made from text and fitted to `typmod` as parse_coerce.c makes a
/// literal: the input function without the typmod (interval's alone takes it), then the
/// type's length coercion as an assignment applies it. Input functions
/// check the typmod in their own order (bit's before its digits), so it is not theirs.
unsafe fn text_input(type_oid: pg_sys::Oid, typmod: i32, context: pg_sys::MemoryContext) -> Input {
    let (mut function_oid, mut io_param) = (pg_sys::InvalidOid, pg_sys::InvalidOid);
    pg_sys::getTypeInputInfo(type_oid, &mut function_oid, &mut io_param);
    let mut function = Box::new(std::mem::zeroed::<pg_sys::FmgrInfo>());
    pg_sys::fmgr_info_cxt(function_oid, &mut *function, context);
    let interval = type_oid == pg_sys::INTERVALOID;
    Input::Text {
        function,
        io_param,
        typmod: if interval { typmod } else { -1 },
        shortcut: Shortcut::of(type_oid),
        fit: if interval { None } else { fit(type_oid, typmod, context) },
    }
}

/// The length coercion of `base` to `typmod`, if the type has one and the typmod is set.
unsafe fn fit(base: pg_sys::Oid, typmod: i32, context: pg_sys::MemoryContext) -> Option<Fit> {
    let mut function_oid = pg_sys::InvalidOid;
    if typmod < 0
        || pg_sys::find_typmod_coercion_function(base, &mut function_oid)
            != pg_sys::CoercionPathType::COERCION_PATH_FUNC
    {
        return None;
    }
    let mut function = Box::new(std::mem::zeroed::<pg_sys::FmgrInfo>());
    pg_sys::fmgr_info_cxt(function_oid, &mut *function, context);
    Some(Fit { function, typmod })
}

/// What a client's literal for a column is made into when its statement is parsed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Literal {
    /// Compared with a key column: a value of the column's type.
    Key,
    /// Assigned to a column: a value of its type with its typmod, as assignment makes it. A
    /// domain's column takes a value of the base type fitted to the domain's typmod, as the
    /// assignment to the domain fits it (a too long string is refused with 22001, as
    /// jsonb_populate_record and a driver's parameter refuse it); the domain's own checks run
    /// when the row is written.
    Change,
}

/// The values of a write made as the hand-written statement's literals are made, before
/// the statement runs: the statement path makes them first, so that a bad value is the
/// error, before any privilege is checked and whether or not a row matches. Arrays and
/// composites are made as the statement makes them, from the member's JSON structure; json
/// and jsonb members cannot fail, and are left to the statement.
pub struct Literals {
    _context: OwnedContext,
    /// (argument, member position, how), in the order the statement's parse makes them.
    made: Vec<(usize, usize, Input)>,
}

/// A typmod applied by the type's length coercion function, as an assignment applies it (a
/// too long string is refused, not cut as by a cast).
struct Fit {
    function: Box<pg_sys::FmgrInfo>,
    typmod: i32,
}

impl Literals {
    /// # Safety
    /// `rel` must be open; `order` names members of the write's arguments by position.
    pub unsafe fn plan(rel: pg_sys::Relation, order: &[(usize, usize, &str, Literal)]) -> Option<Literals> {
        let owned = OwnedContext::new(c"idempotency literals");
        let mut made = Vec::with_capacity(order.len());
        for &(argument, position, name, literal) in order {
            let attr = attribute(rel, name)?;
            let mut domain_typmod = -1;
            let base = pg_sys::getBaseTypeAndTypmod(attr.atttypid, &mut domain_typmod);
            let typmod = match literal {
                Literal::Key => -1,
                Literal::Change if base == attr.atttypid => attr.atttypmod,
                Literal::Change => domain_typmod,
            };
            let input = if takes_text(base) {
                text_input(base, typmod, owned.0)
            } else if base == pg_sys::JSONOID || base == pg_sys::JSONBOID {
                continue;
            } else if base == attr.atttypid {
                // The statement's column definition list names the type without the column's
                // typmod, which the assignment applies after (interval's fields included).
                structured_input(base, -1, owned.0)
            } else {
                structured_input(base, typmod, owned.0)
            };
            made.push((argument, position, input));
        }
        Some(Literals { _context: owned, made })
    }

    /// Makes every value, raising the first bad one's error.
    pub fn make(&self, arguments: &[&[Member<'_>]]) -> Result<(), PgError> {
        // SAFETY: the inputs were built for these members' columns; a value made here is
        // dropped with the call's memory.
        unsafe {
            catch(|| {
                for (argument, position, input) in &self.made {
                    coerce(input, &arguments[*argument][*position].value);
                }
            })
        }
    }
}

/// `jsonb_to_record('{"v": value}')` called as the statement's FROM calls it, with `desc` as
/// its column definition list; the row it returns. Unguarded.
///
/// The function is looked up for each call, in the call's memory: jsonb_to_record keeps the
/// layouts of the composite types it meets in its FmgrInfo, as the statement keeps them for
/// one execution, and an ALTER TYPE of a column's type does not invalidate the table.
unsafe fn structured(desc: pg_sys::TupleDesc, value: &pg_sys::JsonbValue) -> pg_sys::Datum {
    let mut function = std::mem::zeroed::<pg_sys::FmgrInfo>();
    ffi::fmgr_info(pg_sys::Oid::from(pg_sys::F_JSONB_TO_RECORD), &mut function);
    let mut state: *mut pg_sys::JsonbParseState = ptr::null_mut();
    let mut key: pg_sys::JsonbValue = std::mem::zeroed();
    key.type_ = pg_sys::jbvType::jbvString;
    key.val.string.val = c"v".as_ptr().cast_mut();
    key.val.string.len = 1;
    ffi::pushJsonbValue(&mut state, pg_sys::JsonbIteratorToken::WJB_BEGIN_OBJECT, ptr::null_mut());
    ffi::pushJsonbValue(&mut state, pg_sys::JsonbIteratorToken::WJB_KEY, &mut key);
    ffi::pushJsonbValue(
        &mut state,
        pg_sys::JsonbIteratorToken::WJB_VALUE,
        (value as *const pg_sys::JsonbValue).cast_mut(),
    );
    let object = ffi::pushJsonbValue(&mut state, pg_sys::JsonbIteratorToken::WJB_END_OBJECT, ptr::null_mut());
    let argument = pg_sys::Datum::from(ffi::JsonbValueToJsonb(object));
    // The column definition list reaches jsonb_to_record as a set-returning call's expected
    // row type (get_call_result_type), as the executor's function scan passes it.
    let mut result_info: pg_sys::ReturnSetInfo = std::mem::zeroed();
    result_info.type_ = pg_sys::NodeTag::T_ReturnSetInfo;
    result_info.expectedDesc = desc;
    result_info.allowedModes = pg_sys::SetFunctionReturnMode::SFRM_ValuePerCall as i32;
    let size = std::mem::size_of::<pg_sys::FunctionCallInfoBaseData>() + std::mem::size_of::<pg_sys::NullableDatum>();
    let call = ffi::palloc0(size).cast::<pg_sys::FunctionCallInfoBaseData>();
    (*call).flinfo = &mut function;
    (*call).resultinfo = (&raw mut result_info).cast();
    (*call).fncollation = pg_sys::InvalidOid;
    (*call).nargs = 1;
    *(*call).args.as_mut_slice(1).get_unchecked_mut(0) = pg_sys::NullableDatum { value: argument, isnull: false };
    // The call and the row are freed with the call's memory.
    (function.fn_addr.expect("jsonb_to_record is a built-in"))(call)
}

/// numeric's output function, looked up once per backend.
fn numeric_out() -> *mut pg_sys::FmgrInfo {
    thread_local! {
        // SAFETY: allocated in TopMemoryContext, which lives as long as the backend, so the
        // pointer stays valid for every later call; numeric_out is a built-in function.
        static NUMERIC_OUT: *mut pg_sys::FmgrInfo = unsafe {
            let finfo = pg_sys::MemoryContextAllocZero(pg_sys::TopMemoryContext, std::mem::size_of::<pg_sys::FmgrInfo>()) as *mut pg_sys::FmgrInfo;
            pg_sys::fmgr_info_cxt(pg_sys::Oid::from(pg_sys::F_NUMERIC_OUT), finfo, pg_sys::TopMemoryContext);
            finfo
        };
    }
    NUMERIC_OUT.with(|f| *f)
}

/// A member's value in its column's type, and whether it is NULL. Unguarded.
unsafe fn coerce(input: &Input, value: &pg_sys::JsonbValue) -> (pg_sys::Datum, bool) {
    if value.type_ == pg_sys::jbvType::jbvNull {
        return (pg_sys::Datum::from(0), true);
    }
    match input {
        Input::Jsonb => {
            (pg_sys::Datum::from(ffi::JsonbValueToJsonb((value as *const pg_sys::JsonbValue).cast_mut())), false)
        }
        Input::Structured { desc } => (structured(*desc, value), false),
        Input::Text { function, io_param, typmod, shortcut, fit } => {
            if let Some(datum) = shortcut.apply(value) {
                return (datum, false);
            }
            let text = match value.type_ {
                pg_sys::jbvType::jbvString => ffi::pnstrdup(value.val.string.val, value.val.string.len as usize),
                pg_sys::jbvType::jbvBool => {
                    ffi::pnstrdup(if value.val.boolean { c"true" } else { c"false" }.as_ptr(), 5)
                }
                pg_sys::jbvType::jbvNumeric => {
                    ffi::OutputFunctionCall(numeric_out(), pg_sys::Datum::from(value.val.numeric))
                }
                _ => ffi::JsonbToCString(ptr::null_mut(), value.val.binary.data, value.val.binary.len),
            };
            let function = (&**function as *const pg_sys::FmgrInfo).cast_mut();
            let value = ffi::InputFunctionCall(function, text, *io_param, *typmod);
            match fit {
                None => (value, false),
                Some(fit) => {
                    let function = (&*fit.function as *const pg_sys::FmgrInfo).cast_mut();
                    (
                        ffi::FunctionCall3Coll(function, pg_sys::InvalidOid, value, fit.typmod.into(), false.into()),
                        false,
                    )
                }
            }
        }
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::*;
    use crate::jsonb::{jsonb, object_members};
    use pgrx::prelude::*;

    /// `look` at `table`, opened for the call.
    fn with_table<R>(table: &str, look: impl FnOnce(pg_sys::Relation) -> R) -> R {
        let oid = Spi::get_one::<pg_sys::Oid>(&format!("SELECT '{table}'::regclass::oid")).unwrap().unwrap();
        // SAFETY: a table that exists, opened and closed here around the call.
        unsafe {
            let rel = pg_sys::table_open(oid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
            let seen = look(rel);
            pg_sys::table_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
            seen
        }
    }

    /// Whether a versioned update of `table` with this key and these changes goes direct.
    fn is_direct(table: &str, key: &str, changes: &str) -> bool {
        with_table(table, |rel| {
            // SAFETY: jsonb datums of the current memory context, and a table open for the call.
            unsafe {
                let key = object_members(jsonb(key), "key").unwrap();
                let changes = object_members(jsonb(changes), "changes").unwrap();
                DirectUpdate::plan(rel, &key, &changes, "version", &[]).is_some()
            }
        })
    }

    #[pg_test]
    fn plain_tables_go_direct_and_the_rest_keep_the_statement() {
        Spi::run(
            "CREATE TABLE plain (id int PRIMARY KEY, code text UNIQUE, doc jsonb, tags text[], raw json, version int);
             CREATE TABLE guarded (id int PRIMARY KEY, version int);
             CREATE TRIGGER t BEFORE UPDATE ON guarded FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger();
             CREATE TABLE parent (id int PRIMARY KEY, version int);
             CREATE TABLE child (id int PRIMARY KEY, parent int REFERENCES parent, version int);
             CREATE TABLE policed (id int PRIMARY KEY, version int);
             ALTER TABLE policed ENABLE ROW LEVEL SECURITY;
             CREATE TABLE generated (id int PRIMARY KEY, x int, y int GENERATED ALWAYS AS (x * 2) STORED, version int);
             CREATE TABLE split (id int PRIMARY KEY, version int) PARTITION BY RANGE (id);
             CREATE TABLE split_1 PARTITION OF split FOR VALUES FROM (0) TO (10);
             CREATE TABLE parent_of (id int PRIMARY KEY, version int);
             CREATE TABLE inheriting () INHERITS (parent_of);
             CREATE TABLE partial (id int, version int);
             CREATE UNIQUE INDEX partial_id ON partial (id) WHERE id > 0;",
        )
        .unwrap();
        assert!(is_direct("plain", r#"{"id": 1}"#, r#"{"doc": {}, "version": 1}"#));
        assert!(is_direct("plain", r#"{"code": "a"}"#, r#"{"version": 1}"#), "any unique index finds the row");
        assert!(!is_direct("plain", r#"{"id": 1}"#, r#"{"tags": ["a"], "version": 1}"#), "arrays");
        assert!(!is_direct("plain", r#"{"id": 1}"#, r#"{"raw": {}, "version": 1}"#), "json");
        assert!(!is_direct("guarded", r#"{"id": 1}"#, r#"{"version": 1}"#), "triggers");
        assert!(!is_direct("parent", r#"{"id": 1}"#, r#"{"version": 1}"#), "referenced by a foreign key");
        assert!(!is_direct("child", r#"{"id": 1}"#, r#"{"version": 1}"#), "a foreign key");
        assert!(!is_direct("policed", r#"{"id": 1}"#, r#"{"version": 1}"#), "row-level security");
        assert!(!is_direct("generated", r#"{"id": 1}"#, r#"{"x": 1, "version": 1}"#), "generated columns");
        assert!(!is_direct("split", r#"{"id": 1}"#, r#"{"version": 1}"#), "a partitioned table");
        assert!(!is_direct("split_1", r#"{"id": 1}"#, r#"{"version": 1}"#), "a partition");
        assert!(!is_direct("parent_of", r#"{"id": 1}"#, r#"{"version": 1}"#), "inheritance children");
        assert!(!is_direct("partial", r#"{"id": 1}"#, r#"{"version": 1}"#), "a partial unique index");
        Spi::run("SET idempotency.direct_writes = off").unwrap();
        assert!(!is_direct("plain", r#"{"id": 1}"#, r#"{"doc": {}, "version": 1}"#), "direct writes off");
        Spi::run("RESET idempotency.direct_writes").unwrap();
    }

    /// Whether writes to `table` may skip the executor at all.
    fn is_plain_table(table: &str) -> bool {
        // SAFETY: a table open for the call.
        with_table(table, |rel| unsafe { crate::postgres::write::is_plain(rel) })
    }

    #[pg_test]
    fn system_catalogs_keep_the_statement() {
        Spi::run("CREATE TABLE ordinary (id int PRIMARY KEY, version int)").unwrap();
        assert!(is_plain_table("ordinary"));
        assert!(!is_plain_table("pg_catalog.pg_database"), "in-place updates lock a catalog's tuples");
        assert!(!is_plain_table("pg_catalog.pg_class"));
    }

    /// 18's virtual generated columns: computed when read, settable only to DEFAULT. A direct
    /// write would store the given value where 18 stores NULL, and succeed where the statement
    /// raises 428C9.
    #[cfg(feature = "pg18")]
    #[pg_test(error = "column \"y\" can only be updated to DEFAULT")]
    fn virtual_generated_columns_keep_the_statement() {
        Spi::run(
            "CREATE TABLE virt (id int PRIMARY KEY, x int, y int GENERATED ALWAYS AS (x * 2) VIRTUAL, version int);
             INSERT INTO virt (id, x, version) VALUES (1, 1, 1);",
        )
        .unwrap();
        assert!(!is_plain_table("virt"));
        assert!(!is_direct("virt", r#"{"id": 1}"#, r#"{"x": 2, "version": 2}"#));
        assert_eq!(
            Spi::get_one::<bool>(r#"SELECT idem_versioned_update('virt', '{"id": 1}', '{"x": 5, "version": 3}')"#),
            Ok(Some(true))
        );
        assert_eq!(Spi::get_one::<i32>("SELECT y FROM virt WHERE id = 1"), Ok(Some(10)));
        Spi::run(r#"SELECT idem_versioned_update('virt', '{"id": 1}', '{"y": 5, "version": 4}')"#).unwrap();
    }
}
