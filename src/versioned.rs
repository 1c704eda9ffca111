//! Versioned writes: a write lands only when its version is newer than the stored one, which
//! settles duplicates, out-of-order delivery and concurrent writers without any ledger.
//!
//! The statements are generated from the catalog, with every identifier quoted and every
//! value passed as one jsonb parameter that PostgreSQL coerces with jsonb_populate_record,
//! so nothing in a key, a change or a column name can inject SQL. Each (table, column set)
//! is prepared once per backend; any relcache invalidation of the table (ALTER TABLE,
//! RENAME, CREATE/DROP INDEX) drops its plans, so they are rebuilt from the new catalog.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::CStr;
use std::rc::Rc;

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::OwnedPreparedStatement;
use pgrx::JsonB;
use serde_json::{Map, Value};

use crate::error::{finish, required, sqlstate_entry, IdemError, Result, SqlState};
use crate::plans::{execute, prepare, Statement};

static RELATION: Statement = Statement {
    sql: "SELECT c.relkind::text, pg_catalog.quote_ident(n.nspname) OPERATOR(pg_catalog.||) '.' \
                 OPERATOR(pg_catalog.||) pg_catalog.quote_ident(c.relname) \
          FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace \
          WHERE c.oid OPERATOR(pg_catalog.=) $1",
    args: &[pg_sys::OIDOID],
};

static COLUMNS: Statement = Statement {
    sql: "SELECT a.attname::text, a.atttypid FROM pg_catalog.pg_attribute a \
          WHERE a.attrelid OPERATOR(pg_catalog.=) $1 AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped",
    args: &[pg_sys::OIDOID],
};

static UNIQUE_KEYS: Statement = Statement {
    sql: "SELECT i.indisprimary, ARRAY(SELECT a.attname::text FROM pg_catalog.unnest(i.indkey) AS k(n) \
                 JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) i.indrelid \
                  AND a.attnum OPERATOR(pg_catalog.=) k.n) \
          FROM pg_catalog.pg_index i \
          WHERE i.indrelid OPERATOR(pg_catalog.=) $1 AND i.indisunique AND i.indisvalid \
            AND i.indpred IS NULL AND i.indexprs IS NULL",
    args: &[pg_sys::OIDOID],
};

static OPERATOR_NAME: Statement = Statement {
    sql: "SELECT 'OPERATOR(' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(n.nspname) \
                 OPERATOR(pg_catalog.||) '.' OPERATOR(pg_catalog.||) o.oprname OPERATOR(pg_catalog.||) ')' \
          FROM pg_catalog.pg_operator o JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) o.oprnamespace \
          WHERE o.oid OPERATOR(pg_catalog.=) $1",
    args: &[pg_sys::OIDOID],
};

/// A table a versioned write may target, read from the catalog.
pub struct Table {
    pub oid: pg_sys::Oid,
    pub name: String,
    columns: HashMap<String, pg_sys::Oid>,
}

impl Table {
    pub fn load(target: Option<pg_sys::Oid>) -> Result<Table> {
        let oid = required(target, "target")?;
        let (kind, name) = RELATION
            .run(&[DatumWithOid::from(oid)], |t| t.first().get_two::<String, String>().ok())
            .and_then(|(k, n)| Some((k?, n?)))
            .ok_or_else(|| IdemError::new(SqlState::UndefinedTable, format!("relation with OID {} does not exist", oid.to_u32())))?;
        if kind != "r" && kind != "p" {
            return Err(IdemError::new(SqlState::WrongObjectType, format!("{name} is not a table"))
                .detail("Versioned writes need a table (or a partitioned table) with a unique key, not a view or another relation kind.")
                .hint("Target the table the view reads from."));
        }
        let columns = COLUMNS.run(&[DatumWithOid::from(oid)], |t| {
            t.filter_map(|row| Some((row.get::<String>(1).ok()??, row.get::<pg_sys::Oid>(2).ok()??))).collect()
        });
        Ok(Table { oid, name, columns })
    }

    pub fn column(&self, column: &str) -> Result<pg_sys::Oid> {
        self.columns.get(column).copied().ok_or_else(|| {
            IdemError::new(SqlState::UndefinedColumn, format!("column \"{column}\" of {} does not exist", self.name))
        })
    }

    fn unique_keys(&self) -> Vec<(bool, Vec<String>)> {
        UNIQUE_KEYS.run(&[DatumWithOid::from(self.oid)], |t| {
            t.filter_map(|row| Some((row.get::<bool>(1).ok()??, row.get::<Vec<String>>(2).ok()??))).collect()
        })
    }

    /// The "newer than" operator of the version column, qualified by its own schema.
    pub fn version_order(&self, column: &str) -> Result<String> {
        self.operator(column, Operator::Less).map_err(|e| e.hint("Use an integer, numeric or timestamptz version."))
    }

    fn equality(&self, column: &str) -> Result<String> {
        self.operator(column, Operator::Equal)
    }

    /// The column type's default btree operator, from the type cache.
    fn operator(&self, column: &str, wanted: Operator) -> Result<String> {
        let typid = self.column(column)?;
        let (flag, role, missing) = match wanted {
            Operator::Less => (pg_sys::TYPECACHE_LT_OPR, "version", "ordering"),
            Operator::Equal => (pg_sys::TYPECACHE_EQ_OPR, "key", "equality"),
        };
        let entry = unsafe { &*pg_sys::lookup_type_cache(typid, flag as i32) };
        let oid = match wanted {
            Operator::Less => entry.lt_opr,
            Operator::Equal => entry.eq_opr,
        };
        if oid == pg_sys::InvalidOid {
            return Err(IdemError::new(
                SqlState::UndefinedFunction,
                format!("{role} column \"{column}\" of {} has a type without {missing}", self.name),
            ));
        }
        Ok(operator_name(oid))
    }
}

#[derive(Clone, Copy)]
enum Operator {
    Less,
    Equal,
}

fn operator_name(oid: pg_sys::Oid) -> String {
    OPERATOR_NAME
        .run(&[DatumWithOid::from(oid)], |t| t.first().get_one::<String>().ok().flatten())
        .expect("an operator from the type cache exists")
}

pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[derive(Clone, PartialEq, Eq, Hash)]
enum Shape {
    Update { key: Vec<String>, changes: Vec<String> },
    Upsert { columns: Vec<String> },
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct PlanKey {
    table: pg_sys::Oid,
    version: String,
    shape: Shape,
}

thread_local! {
    static PLANS: RefCell<HashMap<PlanKey, Rc<OwnedPreparedStatement>>> = RefCell::new(HashMap::new());
    static CALLBACK_REGISTERED: Cell<bool> = const { Cell::new(false) };
}

/// Relcache invalidation: forget the plans of the table (of every table when relid is 0).
unsafe extern "C-unwind" fn forget_plans(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    // Plans are dropped after the borrow ends: freeing one must not find the map borrowed.
    let dropped: Vec<Rc<OwnedPreparedStatement>> = PLANS.with(|p| {
        let mut plans = p.borrow_mut();
        let stale: Vec<PlanKey> =
            plans.keys().filter(|k| relid == pg_sys::InvalidOid || k.table == relid).cloned().collect();
        stale.iter().filter_map(|k| plans.remove(k)).collect()
    });
    drop(dropped);
}

fn cached_plan(key: PlanKey, build: impl FnOnce() -> Result<String>) -> Result<Rc<OwnedPreparedStatement>> {
    if !CALLBACK_REGISTERED.with(|r| r.replace(true)) {
        unsafe { pg_sys::CacheRegisterRelcacheCallback(Some(forget_plans), pg_sys::Datum::from(0)) };
    }
    if let Some(plan) = PLANS.with(|p| p.borrow().get(&key).cloned()) {
        return Ok(plan);
    }
    let plan = Rc::new(prepare(&build()?, &[pg_sys::JSONBOID]));
    PLANS.with(|p| p.borrow_mut().insert(key, plan.clone()));
    Ok(plan)
}

fn object(value: Option<JsonB>, name: &str) -> Result<Map<String, Value>> {
    match required(value, name)?.0 {
        Value::Object(map) => Ok(map),
        _ => Err(IdemError::new(SqlState::InvalidParameterValue, format!("{name} must be a JSON object"))),
    }
}

/// The version must be present and not NULL; when it is absent because the column does not
/// exist at all, that is the error worth reporting.
fn version_value(target: Option<pg_sys::Oid>, row: &Map<String, Value>, version: &str, within: &str) -> Result<()> {
    match row.get(version) {
        None => Err(Table::load(target)?.column(version).err().unwrap_or_else(|| IdemError::new(
            SqlState::InvalidParameterValue,
            format!("{within} must hold the version column \"{version}\""),
        ))),
        Some(Value::Null) => Err(IdemError::new(SqlState::NullValueNotAllowed, format!("version \"{version}\" must not be NULL"))),
        Some(_) => Ok(()),
    }
}

fn versioned_update(
    target: Option<pg_sys::Oid>,
    key: Option<JsonB>,
    changes: Option<JsonB>,
    version: Option<&str>,
) -> Result<bool> {
    let version = required(version, "version_column")?;
    let key = object(key, "key")?;
    let mut changes = object(changes, "changes")?;
    version_value(target, &changes, version, "changes")?;
    if key.is_empty() {
        return Err(IdemError::new(SqlState::InvalidColumnReference, "key must name at least one column"));
    }
    for (column, value) in &key {
        if value.is_null() {
            return Err(IdemError::new(SqlState::NullValueNotAllowed, format!("key column \"{column}\" must not be NULL")));
        }
        if column == version {
            return Err(IdemError::new(SqlState::InvalidParameterValue, format!("the version column \"{version}\" cannot be part of the key")));
        }
        // A key column repeated in changes with its own value changes nothing; another
        // value would move the row, which a versioned write must never do.
        if let Some(changed) = changes.remove(column) {
            if &changed != value {
                return Err(IdemError::new(SqlState::InvalidParameterValue, format!("changes cannot alter key column \"{column}\"")));
            }
        }
    }
    let plan_key = PlanKey {
        table: required(target, "target")?,
        version: version.to_string(),
        shape: Shape::Update { key: key.keys().cloned().collect(), changes: changes.keys().cloned().collect() },
    };
    let plan = cached_plan(plan_key, || {
        let table = Table::load(target)?;
        let newer = table.version_order(version)?;
        for column in changes.keys() {
            table.column(column)?;
        }
        let mut key_columns: Vec<&String> = key.keys().collect();
        key_columns.sort();
        let unique = table.unique_keys().into_iter().any(|(_, mut cols)| {
            cols.sort();
            cols.iter().collect::<Vec<_>>() == key_columns
        });
        for column in &key_columns {
            table.column(column)?;
        }
        if !unique {
            return Err(IdemError::new(
                SqlState::InvalidColumnReference,
                format!("no unique index of {} has exactly the key columns ({})", table.name, key.keys().cloned().collect::<Vec<_>>().join(", ")),
            )
            .hint("Pass the columns of the primary key or of a unique index, all of them and nothing else."));
        }
        let set: Vec<String> = changes.keys().map(|c| format!("{0} = r.{0}", quote_ident(c))).collect();
        let mut matches = Vec::new();
        for column in key.keys() {
            matches.push(format!("t.{0} {1} r.{0}", quote_ident(column), table.equality(column)?));
        }
        let v = quote_ident(version);
        Ok(format!(
            "UPDATE {table} AS t SET {set} \
             FROM pg_catalog.jsonb_populate_record(NULL::{table}, $1) AS r \
             WHERE {matches} AND (t.{v} IS NULL OR t.{v} {newer} r.{v})",
            table = table.name,
            set = set.join(", "),
            matches = matches.join(" AND "),
        ))
    })?;
    let mut row = key;
    row.extend(changes);
    Ok(execute(&plan, &[DatumWithOid::from(JsonB(Value::Object(row)))], |t| t.len() > 0))
}

fn versioned_upsert(target: Option<pg_sys::Oid>, row: Option<JsonB>, version: Option<&str>) -> Result<bool> {
    let version = required(version, "version_column")?;
    let row = object(row, "row")?;
    version_value(target, &row, version, "row")?;
    let plan_key = PlanKey {
        table: required(target, "target")?,
        version: version.to_string(),
        shape: Shape::Upsert { columns: row.keys().cloned().collect() },
    };
    let plan = cached_plan(plan_key, || {
        let table = Table::load(target)?;
        let newer = table.version_order(version)?;
        for column in row.keys() {
            table.column(column)?;
        }
        let primary = table.unique_keys().into_iter().find(|(primary, _)| *primary).map(|(_, cols)| cols);
        let Some(primary) = primary else {
            return Err(IdemError::new(SqlState::InvalidColumnReference, format!("{} has no primary key", table.name))
                .hint("idem_versioned_upsert finds the row by its primary key."));
        };
        if let Some(missing) = primary.iter().find(|c| !row.contains_key(*c)) {
            return Err(IdemError::new(
                SqlState::InvalidColumnReference,
                format!("row lacks primary key column \"{missing}\" of {}", table.name),
            ));
        }
        let columns: Vec<String> = row.keys().map(|c| quote_ident(c)).collect();
        let set: Vec<String> = row
            .keys()
            .filter(|c| !primary.contains(c))
            .map(|c| format!("{0} = EXCLUDED.{0}", quote_ident(c)))
            .collect();
        let v = quote_ident(version);
        Ok(format!(
            "INSERT INTO {table} AS t ({columns}) \
             SELECT {selected} FROM pg_catalog.jsonb_populate_record(NULL::{table}, $1) AS r \
             ON CONFLICT ({conflict}) DO UPDATE SET {set} \
             WHERE t.{v} IS NULL OR t.{v} {newer} EXCLUDED.{v}",
            table = table.name,
            columns = columns.join(", "),
            selected = columns.iter().map(|c| format!("r.{c}")).collect::<Vec<_>>().join(", "),
            conflict = primary.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", "),
            set = set.join(", "),
        ))
    })?;
    Ok(execute(&plan, &[DatumWithOid::from(JsonB(Value::Object(row)))], |t| t.len() > 0))
}

/// Installs (or replaces) the guard trigger after checking that the column can be ordered.
fn install_guard(target: Option<pg_sys::Oid>, version: Option<&str>) -> Result<()> {
    let version = required(version, "version_column")?;
    let table = Table::load(target)?;
    table.version_order(version)?;
    let literal = format!("'{}'", version.replace('\'', "''"));
    Spi::run(&format!(
        "CREATE OR REPLACE TRIGGER idem_version_guard BEFORE UPDATE ON {} \
         FOR EACH ROW EXECUTE FUNCTION idempotency.version_guard({literal})",
        table.name
    ))
    .unwrap_or_else(|e| panic!("could not create the version guard: {e}"));
    Ok(())
}

/// The guard itself: a BEFORE UPDATE row trigger that turns an UPDATE whose version is not
/// newer than the stored one into a no-op, for every client and every ORM.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn idem_version_guard_trigger(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    let data = (*fcinfo).context as *mut pg_sys::TriggerData;
    if data.is_null() || (*data).type_ != pg_sys::NodeTag::T_TriggerData {
        error!("idempotency.version_guard() must be called as a trigger");
    }
    let data = &*data;
    let trigger = &*data.tg_trigger;
    let tupdesc = (*data.tg_relation).rd_att;
    let column = std::ffi::CStr::from_ptr(*trigger.tgargs);
    let attnum = pg_sys::SPI_fnumber(tupdesc, column.as_ptr());
    if attnum <= 0 {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN,
            format!("version column \"{}\" of a guarded table does not exist", column.to_string_lossy()),
            "Drop the guard with idem_version_unguard, or guard the renamed column again."
        );
    }
    let attr = &*(*tupdesc).attrs.as_ptr().add(attnum as usize - 1);
    let (mut old_null, mut new_null) = (false, false);
    let old = pg_sys::SPI_getbinval(data.tg_trigtuple, tupdesc, attnum, &mut old_null);
    let new = pg_sys::SPI_getbinval(data.tg_newtuple, tupdesc, attnum, &mut new_null);
    let newer = match (old_null, new_null) {
        (_, true) => false,
        (true, false) => true,
        (false, false) => {
            let entry = pg_sys::lookup_type_cache(attr.atttypid, pg_sys::TYPECACHE_CMP_PROC_FINFO as i32);
            let cmp = &mut (*entry).cmp_proc_finfo;
            pg_sys::FunctionCall2Coll(cmp, attr.attcollation, new, old).value() as i32 > 0
        }
    };
    if newer {
        pg_sys::Datum::from(data.tg_newtuple)
    } else {
        pg_sys::Datum::from(0)
    }
}

#[no_mangle]
#[doc(hidden)]
pub extern "C" fn pg_finfo_idem_version_guard_trigger() -> &'static pg_sys::Pg_finfo_record {
    const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1
}

/// A `name` argument arrives as a NUL-terminated NameData, not as text.
fn name_arg(name: Option<&CStr>) -> Result<Option<&str>> {
    name.map(|n| {
        n.to_str().map_err(|_| IdemError::new(SqlState::InvalidParameterValue, "version_column is not valid UTF-8"))
    })
    .transpose()
}

#[pg_extern(sql = false)]
fn idem_versioned_update(
    target: Option<pg_sys::Oid>,
    key: Option<JsonB>,
    changes: Option<JsonB>,
    version_column: Option<&CStr>,
) -> Option<bool> {
    finish(name_arg(version_column).and_then(|v| versioned_update(target, key, changes, v)))
}
sqlstate_entry!(idem_versioned_update_entry, pg_finfo_idem_versioned_update_entry, idem_versioned_update_wrapper);

#[pg_extern(sql = false)]
fn idem_versioned_upsert(target: Option<pg_sys::Oid>, row: Option<JsonB>, version_column: Option<&CStr>) -> Option<bool> {
    finish(name_arg(version_column).and_then(|v| versioned_upsert(target, row, v)))
}
sqlstate_entry!(idem_versioned_upsert_entry, pg_finfo_idem_versioned_upsert_entry, idem_versioned_upsert_wrapper);

#[pg_extern(sql = false)]
fn idem_version_guard(target: Option<pg_sys::Oid>, version_column: Option<&CStr>) {
    finish(name_arg(version_column).and_then(|v| install_guard(target, v)));
}
sqlstate_entry!(idem_version_guard_entry, pg_finfo_idem_version_guard_entry, idem_version_guard_wrapper);

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::*;

    #[pg_test]
    fn identifiers_are_always_quoted() {
        assert_eq!(quote_ident("version"), "\"version\"");
        assert_eq!(quote_ident("a\"; DROP TABLE t; --"), "\"a\"\"; DROP TABLE t; --\"");
    }

    #[pg_test]
    fn a_view_is_not_a_target() {
        Spi::run("CREATE TABLE t (id int PRIMARY KEY, version int); CREATE VIEW v AS SELECT * FROM t").unwrap();
        let view = Spi::get_one::<pg_sys::Oid>("SELECT 'v'::regclass::oid").unwrap();
        let error = Table::load(view).err().expect("a view is refused");
        assert_eq!(error.state, SqlState::WrongObjectType);
        let table = Table::load(Spi::get_one::<pg_sys::Oid>("SELECT 't'::regclass::oid").unwrap()).unwrap();
        assert_eq!(table.column("nope").unwrap_err().state, SqlState::UndefinedColumn);
    }
}
