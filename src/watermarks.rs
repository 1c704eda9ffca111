//! Watermarks: the position an ordered stream's consumer has applied up to, per (stream,
//! partition), advanced in the same transaction as the effects of the messages up to it.
//! Where positions are ordered and one consumer owns a partition, a message at or below the
//! watermark is a redelivery: one row per partition replaces one ledger row per message, and
//! there is nothing to purge.
//!
//! An advance is `UPDATE … WHERE position < new`, the statement a consumer would write for the
//! usual case of a next message; when that updates no row (no row yet, or a duplicate), the
//! answer is `INSERT … ON CONFLICT … DO UPDATE … WHERE position < new`'s. Two transactions
//! advancing one partition queue on its row as those statements would: the second waits, then
//! compares with what the first committed (READ COMMITTED), or fails with 40001 (REPEATABLE
//! READ, SERIALIZABLE).
//!
//! The `UPDATE` runs without SPI ([`crate::postgres::write::update_where`]) while the table
//! keeps the shape sql/ gave it and nothing is attached that only the executor applies; the
//! differential tester compares the two ways. The `INSERT` always runs as its statement: it
//! happens once per partition, and for a duplicate.

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::AnyNumeric;

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crate::error::{finish, required, sqlstate_entry, IdemError, Result, SqlState};
use crate::postgres::spi::Statement;
use crate::postgres::write::{
    attnum, attributes, equality, is_plain, open_owned, unique_index, update_where, ColumnDefault, KeyLookup,
    OwnedContext, Permissions, Shape,
};
use crate::postgres::{catch, ffi};

static MOVE: Statement = Statement {
    sql: "UPDATE idempotency.watermarks SET position = $3, advanced_at = pg_catalog.now() \
          WHERE stream OPERATOR(pg_catalog.=) $1 AND partition OPERATOR(pg_catalog.=) $2 \
          AND position OPERATOR(pg_catalog.<) $3",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::NUMERICOID],
};

static ADVANCE: Statement = Statement {
    sql: "INSERT INTO idempotency.watermarks AS w (stream, partition, position) VALUES ($1, $2, $3) \
          ON CONFLICT (stream, partition) DO UPDATE \
          SET position = excluded.position, advanced_at = pg_catalog.now() \
          WHERE w.position OPERATOR(pg_catalog.<) excluded.position",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::NUMERICOID],
};

static READ: Statement = Statement {
    sql: "SELECT position FROM idempotency.watermarks \
          WHERE stream OPERATOR(pg_catalog.=) $1 AND partition OPERATOR(pg_catalog.=) $2",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTOID],
};

const STREAM: usize = 0;
const PARTITION: usize = 1;
const POSITION: usize = 2;
const ADVANCED_AT: usize = 3;

static WATERMARKS_SHAPE: Shape = Shape {
    columns: &[
        (c"stream", pg_sys::TEXTOID),
        (c"partition", pg_sys::TEXTOID),
        (c"position", pg_sys::NUMERICOID),
        (c"advanced_at", pg_sys::TIMESTAMPTZOID),
    ],
    defaults: &[(attnum(ADVANCED_AT), ColumnDefault::Now)],
};

/// MOVE without SPI, for the watermarks table of one OID: its primary key's lookups, the
/// numeric order and MOVE's privileges (SELECT on the columns it compares, UPDATE on the ones
/// it sets). Kept until the table's next relcache invalidation.
struct DirectMove {
    _context: OwnedContext,
    index: pg_sys::Oid,
    /// The stream's, then the partition's.
    keys: [KeyLookup; 2],
    order: *mut pg_sys::FmgrInfo,
    permissions: Permissions,
}

thread_local! {
    static WATERMARKS_OIDS: Cell<(pg_sys::Oid, pg_sys::Oid)> = const { Cell::new((pg_sys::InvalidOid, pg_sys::InvalidOid)) };
    /// The table's OID and its plan, None where it needs the statement. Shared with the call
    /// running it, so that an invalidation read meanwhile (a lock wait) drops only the cache's.
    static DIRECT_MOVE: RefCell<Option<(pg_sys::Oid, Option<Rc<DirectMove>>)>> = const { RefCell::new(None) };
}

/// Relcache invalidation: forget the plan of the table (of every table when relid is 0).
pub fn forget_direct_move(relid: pg_sys::Oid) {
    // Taken out before it is dropped: dropping deletes a memory context, which must not find
    // the cell borrowed.
    let stale = DIRECT_MOVE.with(|m| {
        let mut planned = m.borrow_mut();
        match &*planned {
            Some((oid, _)) if relid == pg_sys::InvalidOid || *oid == relid => planned.take(),
            _ => None,
        }
    });
    drop(stale);
}

/// The plan for `rel`, made once per relcache entry.
///
/// # Safety
/// `rel` must be open.
unsafe fn direct_move(rel: pg_sys::Relation) -> Option<Rc<DirectMove>> {
    let relid = (*rel).rd_id;
    if let Some(plan) = DIRECT_MOVE.with(|m| match &*m.borrow() {
        Some((oid, plan)) if *oid == relid => Some(plan.clone()),
        _ => None,
    }) {
        return plan;
    }
    let before = crate::postgres::relcache::generation();
    let plan = DirectMove::plan(rel).map(Rc::new);
    if crate::postgres::relcache::generation() == before {
        let replaced = DIRECT_MOVE.with(|m| m.borrow_mut().replace((relid, plan.clone())));
        drop(replaced);
    }
    plan
}

impl DirectMove {
    /// The plan for `rel`, or None where MOVE must run as its statement: a table that lost
    /// its shape, or whose key no longer has a unique index of its own.
    ///
    /// # Safety
    /// `rel` must be open.
    unsafe fn plan(rel: pg_sys::Relation) -> Option<DirectMove> {
        if !WATERMARKS_SHAPE.fits(rel) {
            return None;
        }
        let key = [attnum(STREAM), attnum(PARTITION)];
        let (index, positions) = unique_index(rel, &key)?;
        let owned = OwnedContext::new(c"idempotency watermarks");
        let attrs = attributes(rel);
        let mut lookups = Vec::with_capacity(2);
        for (&attnum, &position) in key.iter().zip(&positions) {
            let attr = &attrs[attnum as usize - 1];
            // The statement compares with the column's collation; the index may sort by another.
            if index.collations[position] != attr.attcollation {
                return None;
            }
            lookups.push(KeyLookup {
                index_column: position as i16 + 1,
                attnum,
                equal: equality(attr.atttypid, index.opfamilies[position], index.input_types[position], owned.0)?,
                collation: index.collations[position],
            });
        }
        let numeric = pg_sys::lookup_type_cache(pg_sys::NUMERICOID, pg_sys::TYPECACHE_CMP_PROC_FINFO as i32);
        let permissions = Permissions::new(
            (*rel).rd_id,
            pg_sys::ACL_SELECT | pg_sys::ACL_UPDATE,
            &[attnum(STREAM), attnum(PARTITION), attnum(POSITION)],
            &[],
            &[attnum(POSITION), attnum(ADVANCED_AT)],
            owned.0,
        );
        Some(DirectMove {
            _context: owned,
            index: index.oid,
            keys: lookups.try_into().ok()?,
            order: &raw mut (*numeric).cmp_proc_finfo,
            permissions,
        })
    }

    /// MOVE: true when the partition's row moved to `pos`; None where the statement must
    /// decide (a serialization failure, see [`update_where`]).
    ///
    /// # Safety
    /// `rel` must be the plan's table, open with RowExclusiveLock and [`is_plain`].
    unsafe fn run(
        &self,
        rel: pg_sys::Relation,
        stream: &str,
        partition: &str,
        pos: &AnyNumeric,
    ) -> Result<Option<bool>> {
        let stream = stream.into_datum().expect("a text is a datum");
        let partition = partition.into_datum().expect("a text is a datum");
        let pos = pos.clone().into_datum().expect("a numeric is a datum");
        let now = pg_sys::Datum::from(pg_sys::GetCurrentTransactionStartTimestamp());
        let mut keys = [(&self.keys[0], stream), (&self.keys[1], partition)];
        keys.sort_by_key(|(lookup, _)| lookup.index_column);
        let changes = [(attnum(POSITION), pos, false), (attnum(ADVANCED_AT), now, false)];
        Ok(update_where(rel, self.index, &keys, &self.permissions, &changes, |row| {
            // A NULL (were NOT NULL dropped) is never `< $3`.
            let (stored, null) = row.value(attnum(POSITION));
            if null {
                return Ok(false);
            }
            // SAFETY: two numerics, compared by numeric's own order, as `position < $3` does.
            catch(|| unsafe { ffi::FunctionCall2Coll(self.order, pg_sys::InvalidOid, stored, pos).value() as i32 })
                .map(|order| order < 0)
        })?)
    }
}

/// MOVE without SPI where the table allows it; None where the statement must run.
fn move_directly(stream: &str, partition: &str, pos: &AnyNumeric) -> Result<Option<bool>> {
    // SAFETY: the relation is opened here and closed once; an error's abort closes it too.
    unsafe {
        let rel = WATERMARKS_OIDS.with(|oids| open_owned(c"idempotency", c"watermarks", oids))?;
        let plan = if is_plain(rel) { direct_move(rel) } else { None };
        let moved = match plan {
            Some(plan) => plan.run(rel, stream, partition, pos)?,
            None => None,
        };
        pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        Ok(moved)
    }
}

/// A partition, named by text or numbered (Kafka), numbered ones in decimal: partition 3 and
/// partition '3' are one partition, whichever type a driver sends.
enum Partition<'a> {
    Name(Option<&'a str>),
    Number(Option<i64>),
}

impl Partition<'_> {
    fn text(&self) -> Result<String> {
        Ok(match self {
            Partition::Name(name) => bounded(required(*name, "partition")?, "partition")?.to_string(),
            Partition::Number(number) => required(*number, "partition")?.to_string(),
        })
    }
}

/// Names are kept as they are (the primary key is on them), so each is bounded well inside a
/// btree entry's limit; brokers' own names are far shorter (Kafka: 249 characters).
const MAX_NAME: usize = 1024;

fn stream_name(stream: Option<&str>) -> Result<&str> {
    let stream = required(stream, "stream")?;
    if stream.is_empty() {
        return Err(IdemError::new(SqlState::InvalidParameterValue, "stream must not be empty")
            .hint("Name the stream as the broker does: a Kafka topic, a JetStream stream, a replication slot."));
    }
    bounded(stream, "stream")
}

fn bounded<'a>(name: &'a str, what: &str) -> Result<&'a str> {
    if name.len() > MAX_NAME {
        return Err(IdemError::new(
            SqlState::InvalidParameterValue,
            format!("{what} must be at most {MAX_NAME} bytes long, not {}", name.len()),
        ));
    }
    Ok(name)
}

/// A position is a whole number from zero up (an offset, a sequence, an LSN), stored without
/// a fractional part: 42.0 is position 42.
fn position(pos: Option<AnyNumeric>, what: &str) -> Result<AnyNumeric> {
    let pos = required(pos, what)?;
    let text = pos.to_string();
    let whole = match text.split_once('.') {
        None => text.as_str(),
        Some((whole, fraction)) if fraction.bytes().all(|b| b == b'0') => whole,
        Some(_) => "",
    };
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return Err(IdemError::new(
            SqlState::InvalidParameterValue,
            format!("a position must be a whole number from 0 up, not {}", crate::digest::abbreviate(&text)),
        )
        .hint("Pass the broker's offset or sequence as it is, or an LSN with idem_watermark_advance_lsn."));
    }
    if whole.len() == text.len() {
        return Ok(pos);
    }
    Ok(AnyNumeric::try_from(whole).expect("a string of digits is a numeric"))
}

/// `what` is the position's argument name, for the message when it is NULL.
fn advance(stream: Option<&str>, partition: Partition<'_>, pos: Option<AnyNumeric>, what: &str) -> Result<bool> {
    let stream = stream_name(stream)?;
    let partition = partition.text()?;
    let pos = position(pos, what)?;
    let moved = match move_directly(stream, &partition, &pos)? {
        Some(moved) => moved,
        None => MOVE.run(&args(stream, &partition, pos.clone()), |rows| rows.len() == 1)?,
    };
    if moved {
        return Ok(true);
    }
    Ok(ADVANCE.run(&args(stream, &partition, pos), |rows| rows.len() == 1)?)
}

fn args<'a>(stream: &'a str, partition: &'a str, pos: AnyNumeric) -> [DatumWithOid<'a>; 3] {
    [DatumWithOid::from(stream), DatumWithOid::from(partition), DatumWithOid::from(pos)]
}

fn read(stream: Option<&str>, partition: Partition<'_>) -> Result<Option<AnyNumeric>> {
    let stream = stream_name(stream)?;
    let partition = partition.text()?;
    let args = [DatumWithOid::from(stream), DatumWithOid::from(partition.as_str())];
    Ok(READ.run(&args, |rows| if rows.is_empty() { None } else { rows.get::<AnyNumeric>(0, 1) })?)
}

#[pg_extern(sql = false)]
fn idem_watermark_advance(stream: Option<&str>, partition: Option<&str>, pos: Option<AnyNumeric>) -> Option<bool> {
    finish(advance(stream, Partition::Name(partition), pos, "pos"))
}
sqlstate_entry!(idem_watermark_advance_entry, pg_finfo_idem_watermark_advance_entry, idem_watermark_advance_wrapper);

/// pg_lsn is an unsigned 64-bit integer passed by value, which pgrx reads as an i64 datum:
/// its bits are the LSN's byte position (a position past 2^63 reads negative, hence the cast).
#[pg_extern(sql = false)]
fn idem_watermark_advance_lsn(stream: Option<&str>, partition: Option<&str>, lsn: Option<i64>) -> Option<bool> {
    finish(advance(stream, Partition::Name(partition), lsn.map(|lsn| AnyNumeric::from(lsn as u64)), "lsn"))
}
sqlstate_entry!(
    idem_watermark_advance_lsn_entry,
    pg_finfo_idem_watermark_advance_lsn_entry,
    idem_watermark_advance_lsn_wrapper
);

#[pg_extern(sql = false)]
fn idem_watermark_advance_numbered(
    stream: Option<&str>,
    partition: Option<i64>,
    pos: Option<AnyNumeric>,
) -> Option<bool> {
    finish(advance(stream, Partition::Number(partition), pos, "pos"))
}
sqlstate_entry!(
    idem_watermark_advance_numbered_entry,
    pg_finfo_idem_watermark_advance_numbered_entry,
    idem_watermark_advance_numbered_wrapper
);

#[pg_extern(sql = false)]
fn idem_watermark(stream: Option<&str>, partition: Option<&str>) -> Option<AnyNumeric> {
    finish(read(stream, Partition::Name(partition))).flatten()
}
sqlstate_entry!(idem_watermark_entry, pg_finfo_idem_watermark_entry, idem_watermark_wrapper);

#[pg_extern(sql = false)]
fn idem_watermark_numbered(stream: Option<&str>, partition: Option<i64>) -> Option<AnyNumeric> {
    finish(read(stream, Partition::Number(partition))).flatten()
}
sqlstate_entry!(idem_watermark_numbered_entry, pg_finfo_idem_watermark_numbered_entry, idem_watermark_numbered_wrapper);

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::*;

    /// Whether an advance would skip SPI now.
    fn goes_direct() -> bool {
        let oids = Cell::new((pg_sys::InvalidOid, pg_sys::InvalidOid));
        // SAFETY: the table is opened and closed here.
        unsafe {
            let rel = open_owned(c"idempotency", c"watermarks", &oids).unwrap();
            let direct = is_plain(rel) && direct_move(rel).is_some();
            pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
            direct
        }
    }

    #[pg_test]
    fn the_table_as_made_goes_direct_and_changed_ones_keep_the_statement() {
        assert!(goes_direct());
        Spi::run("CREATE INDEX by_position ON idempotency.watermarks (position)").unwrap();
        assert!(goes_direct(), "an index more only ends HOT updates, which the direct path handles");
        Spi::run("SET LOCAL idempotency.direct_writes = off").unwrap();
        assert!(!goes_direct(), "direct writes off");
        Spi::run("RESET idempotency.direct_writes").unwrap();
        Spi::run(
            "CREATE FUNCTION touch() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$;
             CREATE TRIGGER touch BEFORE UPDATE ON idempotency.watermarks FOR EACH ROW EXECUTE FUNCTION touch()",
        )
        .unwrap();
        assert!(!goes_direct(), "a trigger");
        Spi::run("DROP TRIGGER touch ON idempotency.watermarks").unwrap();
        assert!(goes_direct());
        Spi::run("ALTER TABLE idempotency.watermarks DROP CONSTRAINT watermarks_pkey, ADD UNIQUE (partition, stream)")
            .unwrap();
        assert!(goes_direct(), "a key whose columns are in another order");
        Spi::run("ALTER TABLE idempotency.watermarks ALTER stream TYPE text COLLATE \"default\"").unwrap();
        assert!(goes_direct(), "the index follows the column's new collation");
        Spi::run("ALTER TABLE idempotency.watermarks ALTER position TYPE numeric(30,2)").unwrap();
        assert!(!goes_direct(), "a typmod, which the statement's assignment applies");
        Spi::run("ALTER TABLE idempotency.watermarks ALTER position TYPE int8").unwrap();
        assert!(!goes_direct(), "a changed type");
    }
}
