//! Versioned writes: a write lands only when its version is newer than the stored one, which
//! settles duplicates, out-of-order delivery and concurrent writers without any ledger.
//!
//! The statements are generated from the catalog with every identifier quoted, and the key
//! and changes stay jsonb parameters whose members PostgreSQL coerces with each column's
//! own input rules, so nothing in a key, a change or a column name can inject SQL. Each
//! (table, column set) is prepared once per backend; any relcache invalidation of the table
//! (ALTER TABLE, RENAME, CREATE/DROP INDEX) drops its plans, so they are rebuilt from the
//! new catalog.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::CStr;
use std::rc::Rc;

use pgrx::datum::DatumWithOid;
use pgrx::fcinfo::{pg_getarg, pg_getarg_datum};
use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::error::{finish, required, sqlstate_entry, v1_finfo, IdemError, Result, SqlState};
use crate::jsonb::{object_members, Member};
use crate::postgres::relcache::triggers_named;
use crate::postgres::spi::{self, execute, prepare, Kept, Statement};
use crate::postgres::{catch, ffi};

mod direct;
use direct::{DirectUpdate, Literal, Literals};

static RELATION: Statement = Statement {
    sql: "SELECT c.relkind::pg_catalog.text, pg_catalog.quote_ident(n.nspname) OPERATOR(pg_catalog.||) '.' \
                 OPERATOR(pg_catalog.||) pg_catalog.quote_ident(c.relname) \
          FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace \
          WHERE c.oid OPERATOR(pg_catalog.=) $1",
    args: &[pg_sys::OIDOID],
};

/// Each column with its type, the type's qualified name, and how a jsonb member becomes a
/// value of it, by the type under all its domains: jsonb and json keep the JSON; arrays and
/// composites go through jsonb_to_record, which understands JSON arrays and objects, and so
/// do intervals (read by their fields, see Column) and types whose cast from text is a
/// function other than their input (regclass's takes no OID, "char"'s takes the first byte),
/// since jsonb_to_record reads text with the input function; everything else is the member's
/// text cast to the type, which is that input function.
static COLUMNS: Statement = Statement {
    sql: "SELECT a.attname::pg_catalog.text, a.atttypid, \
                 pg_catalog.quote_ident(tn.nspname) OPERATOR(pg_catalog.||) '.' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(t.typname), \
                 CASE WHEN b.oid OPERATOR(pg_catalog.=) 'pg_catalog.jsonb'::pg_catalog.regtype THEN 'jsonb' \
                      WHEN b.oid OPERATOR(pg_catalog.=) 'pg_catalog.json'::pg_catalog.regtype THEN 'json' \
                      WHEN b.typcategory OPERATOR(pg_catalog.=) 'A' OR b.typtype OPERATOR(pg_catalog.=) 'c' \
                        OR b.oid OPERATOR(pg_catalog.=) 'pg_catalog.interval'::pg_catalog.regtype \
                        OR EXISTS (SELECT FROM pg_catalog.pg_cast k \
                                   WHERE k.castsource OPERATOR(pg_catalog.=) 'pg_catalog.text'::pg_catalog.regtype \
                                     AND k.casttarget OPERATOR(pg_catalog.=) b.oid AND k.castmethod OPERATOR(pg_catalog.=) 'f') \
                      THEN 'record' \
                      ELSE 'text' END, \
                 a.attnum, \
                 CASE WHEN a.atttypid OPERATOR(pg_catalog.=) 'pg_catalog.interval'::pg_catalog.regtype \
                       AND a.atttypmod OPERATOR(pg_catalog.>=) 0 \
                      THEN pg_catalog.format_type(a.atttypid, a.atttypmod) END, \
                 pg_catalog.quote_ident(bn.nspname) OPERATOR(pg_catalog.||) '.' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(b.typname) \
          FROM pg_catalog.pg_attribute a \
          JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) a.atttypid \
          JOIN pg_catalog.pg_namespace tn ON tn.oid OPERATOR(pg_catalog.=) t.typnamespace \
          JOIN pg_catalog.pg_type b ON b.oid OPERATOR(pg_catalog.=) \
               (WITH RECURSIVE chain(oid, typtype, base) AS ( \
                  SELECT t.oid, t.typtype, t.typbasetype \
                  UNION ALL \
                  SELECT d.oid, d.typtype, d.typbasetype FROM chain \
                  JOIN pg_catalog.pg_type d ON d.oid OPERATOR(pg_catalog.=) chain.base \
                  WHERE chain.typtype OPERATOR(pg_catalog.=) 'd') \
                SELECT chain.oid FROM chain WHERE chain.typtype OPERATOR(pg_catalog.<>) 'd') \
          JOIN pg_catalog.pg_namespace bn ON bn.oid OPERATOR(pg_catalog.=) b.typnamespace \
          WHERE a.attrelid OPERATOR(pg_catalog.=) $1 AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped",
    args: &[pg_sys::OIDOID],
};

// Only an index's first indnkeyatts columns are its key: the INCLUDE columns of a covering
// index after them are stored, never compared, and ON CONFLICT does not name them.
static UNIQUE_KEYS: Statement = Statement {
    sql: "SELECT i.indisprimary, ARRAY(SELECT a.attname::pg_catalog.text \
                 FROM pg_catalog.unnest(i.indkey) WITH ORDINALITY AS k(n, position) \
                 JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) i.indrelid \
                  AND a.attnum OPERATOR(pg_catalog.=) k.n \
                 WHERE k.position OPERATOR(pg_catalog.<=) i.indnkeyatts ORDER BY k.position) \
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

struct Column {
    attnum: i16,
    type_oid: pg_sys::Oid,
    type_name: String,
    conversion: String,
    /// An interval column's type with its fields ("interval year"), which its input reads
    /// by: '1' is a year there, a second in a plain interval, and the typmod applied after
    /// reading would make it 00:00:00. (The grammar's own name: no search_path can move it.)
    /// A domain's fields are its own, which jsonb_to_record reads by.
    typmod_name: Option<String>,
    /// The type beneath all its domains, without a typmod: what a key or a version is
    /// compared as. `k = 'abcdef'` compares the literal as text with a `varchar(3)` domain's
    /// column; fitted to the domain it would be cut to 'abc', or fail the domain's CHECK.
    base_name: String,
}

/// What a member's value is made for (see [`Table::value_of`]).
#[derive(Clone, Copy)]
enum Use {
    /// Assigned to its column, as SET and VALUES assign it.
    Assigned,
    /// Compared with its column, as WHERE compares a literal.
    Compared,
}

/// A table a versioned write may target, read from the catalog.
pub struct Table {
    pub oid: pg_sys::Oid,
    pub name: String,
    columns: HashMap<String, Column>,
}

impl Table {
    pub fn load(target: Option<pg_sys::Oid>) -> Result<Table> {
        let oid = required(target, "target")?;
        let (kind, name) = RELATION
            .run(&[DatumWithOid::from(oid)], |rows| {
                (!rows.is_empty()).then(|| (rows.get::<String>(0, 1), rows.get::<String>(0, 2)))
            })?
            .and_then(|(k, n)| Some((k?, n?)))
            .ok_or_else(|| {
                IdemError::new(SqlState::UndefinedTable, format!("relation with OID {} does not exist", oid.to_u32()))
            })?;
        if kind != "r" && kind != "p" {
            return Err(IdemError::new(SqlState::WrongObjectType, format!("{name} is not a table"))
                .detail("Versioned writes need a table (or a partitioned table) with a unique key, not a view or another relation kind.")
                .hint("Target the table the view reads from."));
        }
        let columns = COLUMNS.run(&[DatumWithOid::from(oid)], |rows| {
            (0..rows.len())
                .filter_map(|i| {
                    let column = Column {
                        attnum: rows.get::<i16>(i, 5)?,
                        type_oid: rows.get::<pg_sys::Oid>(i, 2)?,
                        type_name: rows.get::<String>(i, 3)?,
                        conversion: rows.get::<String>(i, 4)?,
                        typmod_name: rows.get::<String>(i, 6),
                        base_name: rows.get::<String>(i, 7)?,
                    };
                    Some((rows.get::<String>(i, 1)?, column))
                })
                .collect()
        })?;
        Ok(Table { oid, name, columns })
    }

    fn get(&self, column: &str) -> Result<&Column> {
        self.columns.get(column).ok_or_else(|| {
            IdemError::new(
                SqlState::UndefinedColumn,
                format!("column \"{}\" of {} does not exist", crate::digest::abbreviate(column), self.name),
            )
        })
    }

    pub fn column(&self, column: &str) -> Result<pg_sys::Oid> {
        self.get(column).map(|c| c.type_oid)
    }

    /// The SQL expression that turns member `column` of jsonb parameter `param` into a value
    /// of the column's type, by that type's own rules; a compared value is of the type
    /// beneath the column's domains, without its typmod (see Column).
    fn value_of(&self, param: &str, column: &str, used: Use) -> Result<String> {
        let c = self.get(column)?;
        let member = quote_literal(column);
        let (type_name, record_type) = match used {
            Use::Assigned => (&c.type_name, c.typmod_name.as_ref().unwrap_or(&c.type_name)),
            Use::Compared => (&c.base_name, &c.base_name),
        };
        Ok(match c.conversion.as_str() {
            // JSON null is SQL NULL for every column type, jsonb and json included, as in
            // jsonb_populate_record.
            "jsonb" | "json" => format!(
                "(CASE WHEN pg_catalog.jsonb_typeof({param} OPERATOR(pg_catalog.->) {member}) OPERATOR(pg_catalog.<>) 'null' \
                 THEN ({param} OPERATOR(pg_catalog.->) {member}) END)::{type_name}"
            ),
            // A record of this one column, not of the table: the table's other columns
            // would be NULL in it, which a NOT NULL domain among them refuses. The typmod is
            // left to the assignment, as for text below, but an interval's (see Column).
            "record" => format!(
                "(SELECT r.v FROM pg_catalog.jsonb_to_record(pg_catalog.jsonb_build_object('v', {param} OPERATOR(pg_catalog.->) {member})) AS r(v {record_type}))"
            ),
            _ => format!("({param} OPERATOR(pg_catalog.->>) {member})::{type_name}"),
        })
    }

    /// Members, given as (argument, position, name), in attnum order with how each is made.
    fn by_attnum<'m>(
        &self,
        members: impl Iterator<Item = (usize, usize, &'m str)>,
        literal: Literal,
    ) -> Result<Vec<(usize, usize, &'m str, Literal)>> {
        let mut sorted = Vec::new();
        for (argument, position, name) in members {
            sorted.push((self.get(name)?.attnum, (argument, position, name, literal)));
        }
        sorted.sort_unstable_by_key(|(attnum, _)| *attnum);
        Ok(sorted.into_iter().map(|(_, member)| member).collect())
    }

    fn unique_keys(&self) -> Result<Vec<(bool, Vec<String>)>> {
        Ok(UNIQUE_KEYS.run(&[DatumWithOid::from(self.oid)], |rows| {
            (0..rows.len()).filter_map(|i| Some((rows.get::<bool>(i, 1)?, rows.get::<Vec<String>>(i, 2)?))).collect()
        })?)
    }

    /// The "newer than" operator of the version column, qualified by its own schema.
    pub fn version_order(&self, column: &str) -> Result<String> {
        self.operator(column, Operator::Less)
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
        // SAFETY: the type cache entry of an existing type is never freed; it is only read here.
        let entry = unsafe { &*pg_sys::lookup_type_cache(typid, flag as i32) };
        let oid = match wanted {
            Operator::Less => entry.lt_opr,
            Operator::Equal => entry.eq_opr,
        };
        if oid == pg_sys::InvalidOid {
            let error = IdemError::new(
                SqlState::UndefinedFunction,
                format!("{role} column \"{column}\" of {} has a type without {missing}", self.name),
            );
            return Err(match wanted {
                Operator::Less => error.hint("Use an integer, numeric or timestamptz version."),
                Operator::Equal => error,
            });
        }
        operator_name(oid)
    }
}

#[derive(Clone, Copy)]
enum Operator {
    Less,
    Equal,
}

fn operator_name(oid: pg_sys::Oid) -> Result<String> {
    Ok(OPERATOR_NAME
        .run(&[DatumWithOid::from(oid)], |rows| rows.get::<String>(0, 1))?
        .expect("an operator from the type cache exists"))
}

pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A string literal that means the same whatever standard_conforming_strings says.
fn quote_literal(text: &str) -> String {
    let quoted = text.replace('\'', "''");
    if quoted.contains('\\') {
        format!("E'{}'", quoted.replace('\\', "\\\\"))
    } else {
        format!("'{quoted}'")
    }
}

/// How a write of one shape is carried out.
enum Plan {
    /// The generated statement, run through SPI once its values are made.
    Statement { literals: Literals, write: Kept },
    /// The same write without SPI, for a plain table (see [`direct`]).
    Direct(DirectUpdate),
}

thread_local! {
    static PLANS: RefCell<HashMap<(pg_sys::Oid, String), Rc<Plan>>> = RefCell::new(HashMap::new());
}

/// How many write shapes a backend keeps plans for; past it they are all dropped and made
/// again as they come.
const MAX_PLANS: usize = 256;

/// Relcache invalidation: forget the plans of the table (of every table when relid is 0).
pub fn forget_plans(relid: pg_sys::Oid) {
    // Plans are dropped after the borrow ends: freeing one must not find the map borrowed.
    let dropped: Vec<Rc<Plan>> = PLANS.with(|p| {
        let mut plans = p.borrow_mut();
        let stale: Vec<_> = plans.keys().filter(|k| relid == pg_sys::InvalidOid || k.0 == relid).cloned().collect();
        stale.iter().filter_map(|k| plans.remove(k)).collect()
    });
    drop(dropped);
}

/// The plan for a write shape: its table, and a signature naming the operation, the
/// version column and the column sets. Any relcache invalidation of the table drops it, and
/// with it the decision whether the table is plain enough for a direct write.
fn cached_plan(table: pg_sys::Oid, signature: String, build: impl FnOnce() -> Result<Plan>) -> Result<Rc<Plan>> {
    let key = (table, signature);
    if let Some(plan) = PLANS.with(|p| p.borrow().get(&key).cloned()) {
        return Ok(plan);
    }
    let before = crate::postgres::relcache::generation();
    let plan = Rc::new(build()?);
    if crate::postgres::relcache::generation() != before {
        return Ok(plan);
    }
    // A statement plan takes tens of kilobytes, and every set of member names is a plan of its
    // own: a caller cycling through many shapes would grow the backend without bound.
    let evicted = PLANS.with(|p| {
        let mut plans = p.borrow_mut();
        let evicted = if plans.len() >= MAX_PLANS { std::mem::take(&mut *plans) } else { HashMap::new() };
        plans.insert(key, plan.clone());
        evicted
    });
    drop(evicted);
    Ok(plan)
}

/// A statement plan: the generated statement, and its values made as the hand-written
/// statement's literals are made when it is parsed (see [`Literals`]).
fn statement_plan(
    rel: pg_sys::Relation,
    order: &[(usize, usize, &str, Literal)],
    write: &str,
    args: &[pg_sys::Oid],
) -> Result<Plan> {
    // SAFETY: rel is the target, open; the order names the call's own members.
    let literals = unsafe { Literals::plan(rel, order) }.expect("the members' columns were checked to exist");
    Ok(Plan::Statement { literals, write: prepare(write, args)? })
}

/// Makes a statement plan's values, then runs its statement with the jsonb arguments; true
/// when a row was written.
fn run_statement(plan: &Plan, members: &[&[Member<'_>]], args: &[pg_sys::Datum]) -> Result<bool> {
    let Plan::Statement { literals, write } = plan else { unreachable!("a direct plan is run by its caller") };
    literals.make(members)?;
    // SAFETY: the datums are the caller's jsonb arguments, alive for the call.
    let args: Vec<DatumWithOid<'static>> =
        args.iter().map(|&d| unsafe { DatumWithOid::new(d, pg_sys::JSONBOID) }).collect();
    Ok(execute(write, &args, |rows| !rows.is_empty())?)
}

fn signature(operation: &str, version: &str, sets: &[&[Member<'_>]]) -> String {
    let mut signature = String::with_capacity(64);
    signature.push_str(operation);
    signature.push('\u{1}');
    signature.push_str(version);
    for set in sets {
        signature.push('\u{1}');
        for member in *set {
            signature.push_str(member.name);
            signature.push('\u{0}');
        }
    }
    signature
}

/// The version must be present and not NULL; when it is absent because the column does not
/// exist at all, that is the error worth reporting.
fn version_value(target: Option<pg_sys::Oid>, members: &[Member<'_>], version: &str, within: &str) -> Result<()> {
    match members.iter().find(|m| m.name == version) {
        None => Err(Table::load(target)?.column(version).err().unwrap_or_else(|| {
            IdemError::new(
                SqlState::InvalidParameterValue,
                format!("{within} must hold the version column \"{version}\""),
            )
        })),
        Some(m) if m.is_null => {
            Err(IdemError::new(SqlState::NullValueNotAllowed, format!("version \"{version}\" must not be NULL")))
        }
        Some(_) => Ok(()),
    }
}

fn jsonb_arg<'a>(datum: Option<pg_sys::Datum>, name: &str) -> Result<(pg_sys::Datum, Vec<Member<'a>>)> {
    let datum = required(datum, name)?;
    // SAFETY: a jsonb argument of the current call, not NULL (required above).
    Ok((datum, unsafe { object_members(datum, name)? }))
}

fn versioned_update(
    target: Option<pg_sys::Oid>,
    key: Option<pg_sys::Datum>,
    changes: Option<pg_sys::Datum>,
    version: Option<&str>,
) -> Result<bool> {
    let version = required(version, "version_column")?;
    let (key, key_members) = jsonb_arg(key, "key")?;
    let (changes, change_members) = jsonb_arg(changes, "changes")?;
    version_value(target, &change_members, version, "changes")?;
    if key_members.is_empty() {
        return Err(IdemError::new(SqlState::InvalidColumnReference, "key must name at least one column"));
    }
    for member in &key_members {
        if member.is_null {
            return Err(IdemError::new(
                SqlState::NullValueNotAllowed,
                format!("key column \"{}\" must not be NULL", member.name),
            ));
        }
        if member.name == version {
            return Err(IdemError::new(
                SqlState::InvalidParameterValue,
                format!("the version column \"{version}\" cannot be part of the key"),
            ));
        }
        // A versioned write changes a row, never which row it is.
        if change_members.iter().any(|c| c.name == member.name) {
            return Err(IdemError::new(
                SqlState::InvalidParameterValue,
                format!("changes cannot include key column \"{}\"", member.name),
            ));
        }
    }
    let table_oid = required(target, "target")?;
    let rel = open_target(table_oid)?;
    // A plan made while direct writes were not allowed is a statement: that is in its name.
    let plan_of = |direct: bool| {
        let operation = if direct { "update" } else { "update by statement" };
        cached_plan(table_oid, signature(operation, version, &[&key_members, &change_members]), || {
            update_plan(rel, target, &key_members, &change_members, version, direct)
        })
    };
    let plan = plan_of(crate::postgres::write::direct_allowed())?;
    let run = |plan: &Plan| run_statement(plan, &[&key_members, &change_members], &[key, changes]);
    let changed = match &*plan {
        // SAFETY: rel is the plan's table, open with RowExclusiveLock, and the members are
        // the ones the plan's signature names, in the same order.
        Plan::Direct(direct) => match unsafe { direct.run(rel, &key_members, &change_members)? } {
            Some(changed) => changed,
            None => run(&*plan_of(false)?)?,
        },
        statement => run(statement)?,
    };
    // SAFETY: rel was opened above and is closed once; the lock is kept to the transaction's end.
    unsafe { pg_sys::relation_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE) };
    Ok(changed)
}

/// The plan of an update of `rel` by these members: direct where `direct` and the table
/// allow it, else the generated statement.
fn update_plan(
    rel: pg_sys::Relation,
    target: Option<pg_sys::Oid>,
    key_members: &[Member<'_>],
    change_members: &[Member<'_>],
    version: &str,
    direct: bool,
) -> Result<Plan> {
    let table = Table::load(target)?;
    let newer = table.version_order(version)?;
    for member in change_members {
        table.column(member.name)?;
    }
    for member in key_members {
        table.column(member.name)?;
    }
    let mut wanted: Vec<&str> = key_members.iter().map(|m| m.name).collect();
    wanted.sort_unstable();
    let unique = table.unique_keys()?.into_iter().any(|(_, mut cols)| {
        cols.sort();
        cols.iter().map(String::as_str).eq(wanted.iter().copied())
    });
    if !unique {
        return Err(IdemError::new(
            SqlState::InvalidColumnReference,
            format!("no unique index of {} has exactly the key columns ({})", table.name, wanted.join(", ")),
        )
        .hint("Pass the columns of the primary key or of a unique index, all of them and nothing else."));
    }
    // Keys by attnum, the version, then the other changes by attnum, as parse analysis
    // takes a WHERE before its SET.
    let keys = key_members.iter().enumerate().map(|(i, m)| (0, i, m.name));
    let (versions, others): (Vec<_>, Vec<_>) =
        change_members.iter().enumerate().map(|(i, m)| (1, i, m.name)).partition(|(_, _, name)| *name == version);
    let mut order = table.by_attnum(keys, Literal::Key)?;
    order.extend(table.by_attnum(versions.into_iter(), Literal::Change)?);
    order.extend(table.by_attnum(others.into_iter(), Literal::Change)?);
    if direct {
        // SAFETY: rel is the target, open; the order names the call's own members.
        if let Some(direct) = unsafe { DirectUpdate::plan(rel, key_members, change_members, version, &order) } {
            return Ok(Plan::Direct(direct));
        }
    }
    let mut set = Vec::new();
    for member in change_members {
        set.push(format!("{} = {}", quote_ident(member.name), table.value_of("$2", member.name, Use::Assigned)?));
    }
    let mut matches = Vec::new();
    for member in key_members {
        matches.push(format!(
            "t.{} {} {}",
            quote_ident(member.name),
            table.equality(member.name)?,
            table.value_of("$1", member.name, Use::Compared)?
        ));
    }
    let v = quote_ident(version);
    let sql = format!(
        "UPDATE {table} AS t SET {set} WHERE {matches} AND (t.{v} IS NULL OR t.{v} {newer} {new_version})",
        table = table.name,
        set = set.join(", "),
        matches = matches.join(" AND "),
        new_version = table.value_of("$2", version, Use::Compared)?,
    );
    statement_plan(rel, &order, &sql, &[pg_sys::JSONBOID, pg_sys::JSONBOID])
}

/// Opens a write's target with RowExclusiveLock, before its plan is looked up, so that a
/// concurrent ALTER TABLE's invalidation has dropped a stale plan by then. The caller closes
/// it (an error's abort does too).
fn open_target(table_oid: pg_sys::Oid) -> Result<pg_sys::Relation> {
    // SAFETY: the step holds nothing with a destructor.
    let rel = unsafe {
        catch(|| {
            // The statement names the table in its schema, and resolves the name before it
            // locks the table, taking in what other sessions committed meanwhile.
            ffi::AcceptInvalidationMessages();
            let namespace = ffi::get_rel_namespace(table_oid);
            if namespace != pg_sys::InvalidOid {
                crate::postgres::write::check_schema_usage(namespace);
            }
            ffi::try_relation_open(table_oid, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE)
        })?
    };
    if rel.is_null() {
        return Err(IdemError::new(
            SqlState::UndefinedTable,
            format!("relation with OID {} does not exist", table_oid.to_u32()),
        ));
    }
    Ok(rel)
}

fn versioned_upsert(target: Option<pg_sys::Oid>, row: Option<pg_sys::Datum>, version: Option<&str>) -> Result<bool> {
    let version = required(version, "version_column")?;
    let (row, members) = jsonb_arg(row, "row")?;
    version_value(target, &members, version, "row")?;
    let table_oid = required(target, "target")?;
    let rel = open_target(table_oid)?;
    let plan = cached_plan(table_oid, signature("upsert", version, &[&members]), || {
        let table = Table::load(target)?;
        let newer = table.version_order(version)?;
        let primary = table.unique_keys()?.into_iter().find(|(primary, _)| *primary).map(|(_, cols)| cols);
        let Some(primary) = primary else {
            return Err(IdemError::new(SqlState::InvalidColumnReference, format!("{} has no primary key", table.name))
                .hint("idem_versioned_upsert finds the row by its primary key."));
        };
        let mut values = Vec::new();
        for member in &members {
            values.push(table.value_of("$1", member.name, Use::Assigned)?);
        }
        if let Some(missing) = primary.iter().find(|c| !members.iter().any(|m| m.name == c.as_str())) {
            return Err(IdemError::new(
                SqlState::InvalidColumnReference,
                format!("row lacks primary key column \"{missing}\" of {}", table.name),
            ));
        }
        let set: Vec<String> = members
            .iter()
            .filter(|m| !primary.iter().any(|p| p == m.name))
            .map(|m| format!("{0} = EXCLUDED.{0}", quote_ident(m.name)))
            .collect();
        let v = quote_ident(version);
        // A row of key columns alone (the version among them, as in a table of events keyed
        // by id and version) has nothing to update: a conflict is the same version.
        let action = if set.is_empty() {
            "DO NOTHING".to_string()
        } else {
            format!("DO UPDATE SET {} WHERE t.{v} IS NULL OR t.{v} {newer} EXCLUDED.{v}", set.join(", "))
        };
        let sql = format!(
            "INSERT INTO {table} AS t ({columns}) VALUES ({values}) ON CONFLICT ({conflict}) {action}",
            table = table.name,
            columns = members.iter().map(|m| quote_ident(m.name)).collect::<Vec<_>>().join(", "),
            values = values.join(", "),
            conflict = primary.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", "),
        );
        // In the row's order, as the hand-written INSERT's VALUES list them.
        let order: Vec<_> = members.iter().enumerate().map(|(i, m)| (0, i, m.name, Literal::Change)).collect();
        statement_plan(rel, &order, &sql, &[pg_sys::JSONBOID])
    })?;
    let written = run_statement(&plan, &[&members], &[row]);
    // SAFETY: opened above, closed once.
    unsafe { pg_sys::relation_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE) };
    written
}

/// Installs (or replaces) the guard trigger after checking that the column can be ordered.
fn install_guard(target: Option<pg_sys::Oid>, version: Option<&str>) -> Result<()> {
    let version = required(version, "version_column")?;
    let table = Table::load(target)?;
    table.version_order(version)?;
    // SAFETY: a syscache lookup of a column the table was just read to have.
    if unsafe { pg_sys::get_attgenerated(table.oid, table.get(version)?.attnum) } != 0 {
        return Err(IdemError::new(SqlState::GeneratedAlways, generated_version(version)).hint(GENERATED_HINT));
    }
    // CREATE TRIGGER's own lock, on the table and then on every partition, before the
    // check: a trigger of that name that another session created meanwhile is then committed
    // and seen, not silently replaced. The table's lock keeps partitions from being attached
    // or created meanwhile, and pg_partition_tree reads pg_inherits as committed.
    let lock = pg_sys::ShareRowExclusiveLock as pg_sys::LOCKMODE;
    let mut named = triggers_named(&[table.oid], c"idem_version_guard", lock)?;
    let tree = PARTITIONS.run(&[DatumWithOid::from(table.oid)], |rows| {
        (0..rows.len()).filter_map(|i| rows.get::<pg_sys::Oid>(i, 1)).collect::<Vec<_>>()
    })?;
    named.extend(triggers_named(&tree, c"idem_version_guard", lock)?);
    let guard = GUARD_FUNCTION.run(&[], |rows| rows.get::<pg_sys::Oid>(0, 1))?;
    if let Some(&(holder, _)) = named.iter().find(|&&(_, function)| Some(function) != guard) {
        let holder = RELATION
            .run(&[DatumWithOid::from(holder)], |rows| (!rows.is_empty()).then(|| rows.get::<String>(0, 2)).flatten())?
            // A partition created after a REPEATABLE READ snapshot is not in it.
            .unwrap_or_else(|| format!("relation with OID {}", holder.to_u32()));
        return Err(IdemError::new(
            SqlState::DuplicateObject,
            format!("{holder} has a trigger named idem_version_guard that is not the version guard"),
        )
        .hint("Rename that trigger, then guard the table."));
    }
    spi::run_once(&format!(
        "CREATE OR REPLACE TRIGGER idem_version_guard BEFORE UPDATE ON {} \
         FOR EACH ROW EXECUTE FUNCTION idempotency.version_guard({})",
        table.name,
        quote_literal(version)
    ))?;
    Ok(())
}

/// The partitions beneath a table, at every level, as committed.
static PARTITIONS: Statement = Statement {
    sql: "SELECT r.relid FROM pg_catalog.pg_partition_tree($1) r WHERE r.relid OPERATOR(pg_catalog.<>) $1",
    args: &[pg_sys::OIDOID],
};

/// The guard's trigger function. CREATE OR REPLACE TRIGGER on a partitioned table replaces
/// its partitions' triggers of the same name too, so every one of them is checked against it.
static GUARD_FUNCTION: Statement = Statement {
    // Looked up when run, not when planned: the plan outlives a DROP and CREATE EXTENSION.
    sql: "SELECT pg_catalog.to_regprocedure('idempotency.version_guard()')::pg_catalog.oid",
    args: &[],
};

/// The function the guard's errors name.
const GUARD: &str = "idem_version_guard_trigger";

/// A generated version column is computed after BEFORE triggers run, so the guard would see
/// NULL for the new version and skip every UPDATE.
fn generated_version(column: &str) -> String {
    format!("version column \"{column}\" of a guarded table is a generated column")
}
const GENERATED_HINT: &str =
    "A BEFORE UPDATE trigger cannot see a generated column's new value: guard a column that the UPDATE sets.";

/// The guard itself: a BEFORE UPDATE row trigger that turns an UPDATE whose version is not
/// newer than the stored one into a no-op, for every client and every ORM.
///
/// Any role with USAGE on the schema can attach it to a table of its own, with any timing,
/// event and arguments, so it checks how it was called before reading a tuple or an argument,
/// as PostgreSQL's own trigger functions do (39P01), and checks the column's ordering on every
/// call: the column's type may have been changed since the guard was installed.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn idem_version_guard_trigger(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    let refuse = |report: pg_sys::panic::ErrorReport, hint: &str| -> ! {
        report.set_hint(hint).report(PgLogLevel::ERROR);
        unreachable!("an ERROR does not return")
    };
    let protocol = |message: &str| -> ! {
        refuse(
            pg_sys::panic::ErrorReport::new(
                PgSqlErrorCode::ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED,
                format!("idempotency.version_guard(): {message}"),
                GUARD,
            ),
            "Install the guard with idem_version_guard(table, version_column).",
        )
    };
    let data = (*fcinfo).context as *mut pg_sys::TriggerData;
    if data.is_null() || (*data).type_ != pg_sys::NodeTag::T_TriggerData {
        protocol("must be called as a trigger");
    }
    let data = &*data;
    let event = data.tg_event;
    if event & pg_sys::TRIGGER_EVENT_TIMINGMASK != pg_sys::TRIGGER_EVENT_BEFORE
        || event & pg_sys::TRIGGER_EVENT_ROW == 0
        || event & pg_sys::TRIGGER_EVENT_OPMASK != pg_sys::TRIGGER_EVENT_UPDATE
    {
        protocol("must be fired BEFORE UPDATE FOR EACH ROW");
    }
    let trigger = &*data.tg_trigger;
    if trigger.tgnargs != 1 {
        protocol(&format!("takes the version column as its one argument, not {} arguments", trigger.tgnargs));
    }
    let tupdesc = (*data.tg_relation).rd_att;
    let column = std::ffi::CStr::from_ptr(*trigger.tgargs);
    let attnum = pg_sys::SPI_fnumber(tupdesc, column.as_ptr());
    if attnum <= 0 {
        refuse(
            pg_sys::panic::ErrorReport::new(
                PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN,
                format!("version column \"{}\" of a guarded table does not exist", column.to_string_lossy()),
                GUARD,
            ),
            "Drop the guard with idem_version_unguard, or guard the renamed column again.",
        );
    }
    let attr = &crate::postgres::descriptor_attributes(tupdesc)[attnum as usize - 1];
    if attr.attgenerated != 0 {
        refuse(
            pg_sys::panic::ErrorReport::new(
                PgSqlErrorCode::ERRCODE_GENERATED_ALWAYS,
                generated_version(&column.to_string_lossy()),
                GUARD,
            ),
            GENERATED_HINT,
        );
    }
    let (mut old_null, mut new_null) = (false, false);
    let old = pg_sys::SPI_getbinval(data.tg_trigtuple, tupdesc, attnum, &mut old_null);
    let new = pg_sys::SPI_getbinval(data.tg_newtuple, tupdesc, attnum, &mut new_null);
    // The new version against the old: NULL sorts below every version.
    let order = match (old_null, new_null) {
        (true, true) => std::cmp::Ordering::Equal,
        (false, true) => std::cmp::Ordering::Less,
        (true, false) => std::cmp::Ordering::Greater,
        (false, false) => {
            let entry = pg_sys::lookup_type_cache(attr.atttypid, pg_sys::TYPECACHE_CMP_PROC_FINFO as i32);
            if (*entry).cmp_proc == pg_sys::InvalidOid {
                refuse(
                    pg_sys::panic::ErrorReport::new(
                        PgSqlErrorCode::ERRCODE_UNDEFINED_FUNCTION,
                        format!(
                            "version column \"{}\" of a guarded table has a type without ordering",
                            column.to_string_lossy()
                        ),
                        GUARD,
                    ),
                    "Use an integer, numeric or timestamptz version, or drop the guard with idem_version_unguard.",
                );
            }
            let cmp = &mut (*entry).cmp_proc_finfo;
            (pg_sys::FunctionCall2Coll(cmp, attr.attcollation, new, old).value() as i32).cmp(&0)
        }
    };
    // A foreign key's action (ON UPDATE CASCADE, ON DELETE SET NULL or SET DEFAULT) changes the
    // referencing columns and leaves the version as it is: skipped, it would leave the row
    // pointing at a key that is gone, and no constraint would notice. PostgreSQL runs those
    // statements, and only them, in the security context SECURITY_NOFORCE_RLS (ri_triggers.c);
    // an UPDATE a trigger makes inside one inherits it, so the version must also be unchanged.
    let referential_action = order == std::cmp::Ordering::Equal && pg_sys::InNoForceRLSOperation();
    if order == std::cmp::Ordering::Greater || referential_action {
        pg_sys::Datum::from(data.tg_newtuple)
    } else {
        pg_sys::Datum::from(0)
    }
}

v1_finfo!(pg_finfo_idem_version_guard_trigger);

/// A `name` argument arrives as a NUL-terminated NameData, not as text.
fn name_arg(name: Option<&CStr>) -> Result<Option<&str>> {
    name.map(|n| {
        n.to_str().map_err(|_| IdemError::new(SqlState::InvalidParameterValue, "version_column is not valid UTF-8"))
    })
    .transpose()
}

// The jsonb arguments are read as raw datums through fcinfo: only their key names are
// looked at in Rust, and the datums go to the statement unconverted.
#[pg_extern(sql = false)]
fn idem_versioned_update(fcinfo: pg_sys::FunctionCallInfo) -> Option<bool> {
    // SAFETY: the SQL declaration gives these four arguments these types (regclass, jsonb,
    // jsonb, name); a NULL comes back as None.
    let (target, key, changes, version) = unsafe {
        (
            pg_getarg::<pg_sys::Oid>(fcinfo, 0),
            pg_getarg_datum(fcinfo, 1),
            pg_getarg_datum(fcinfo, 2),
            pg_getarg::<&CStr>(fcinfo, 3),
        )
    };
    finish(name_arg(version).and_then(|v| versioned_update(target, key, changes, v)))
}
sqlstate_entry!(idem_versioned_update_entry, pg_finfo_idem_versioned_update_entry, idem_versioned_update_wrapper);

#[pg_extern(sql = false)]
fn idem_versioned_upsert(fcinfo: pg_sys::FunctionCallInfo) -> Option<bool> {
    // SAFETY: the SQL declaration gives these three arguments these types (regclass, jsonb,
    // name); a NULL comes back as None.
    let (target, row, version) =
        unsafe { (pg_getarg::<pg_sys::Oid>(fcinfo, 0), pg_getarg_datum(fcinfo, 1), pg_getarg::<&CStr>(fcinfo, 2)) };
    finish(name_arg(version).and_then(|v| versioned_upsert(target, row, v)))
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
        assert_eq!(error.state(), Some(SqlState::WrongObjectType));
        let table = Table::load(Spi::get_one::<pg_sys::Oid>("SELECT 't'::regclass::oid").unwrap()).unwrap();
        assert_eq!(table.column("nope").unwrap_err().state(), Some(SqlState::UndefinedColumn));
    }
}
