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

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::AnyNumeric;

use crate::error::{finish, required, sqlstate_entry, IdemError, Result, SqlState};
use crate::postgres::spi::Statement;

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
fn position(pos: Option<AnyNumeric>) -> Result<AnyNumeric> {
    let pos = required(pos, "pos")?;
    let text = pos.to_string();
    let whole = match text.split_once('.') {
        None => text.as_str(),
        Some((whole, fraction)) if fraction.bytes().all(|b| b == b'0') => whole,
        Some(_) => "",
    };
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return Err(IdemError::new(
            SqlState::InvalidParameterValue,
            format!("a position must be a whole number from 0 up, not {text}"),
        )
        .hint("Pass the broker's offset or sequence as it is, or an LSN with idem_watermark_advance_lsn."));
    }
    if whole.len() == text.len() {
        return Ok(pos);
    }
    Ok(AnyNumeric::try_from(whole).expect("a string of digits is a numeric"))
}

fn advance(stream: Option<&str>, partition: Partition<'_>, pos: Option<AnyNumeric>) -> Result<bool> {
    let stream = stream_name(stream)?;
    let partition = partition.text()?;
    let pos = position(pos)?;
    let args = [DatumWithOid::from(stream), DatumWithOid::from(partition.as_str()), DatumWithOid::from(pos)];
    if MOVE.run(&args, |rows| rows.len() == 1)? {
        return Ok(true);
    }
    Ok(ADVANCE.run(&args, |rows| rows.len() == 1)?)
}

fn read(stream: Option<&str>, partition: Partition<'_>) -> Result<Option<AnyNumeric>> {
    let stream = stream_name(stream)?;
    let partition = partition.text()?;
    let args = [DatumWithOid::from(stream), DatumWithOid::from(partition.as_str())];
    Ok(READ.run(&args, |rows| if rows.is_empty() { None } else { rows.get::<AnyNumeric>(0, 1) })?)
}

#[pg_extern(sql = false)]
fn idem_watermark_advance(stream: Option<&str>, partition: Option<&str>, pos: Option<AnyNumeric>) -> Option<bool> {
    finish(advance(stream, Partition::Name(partition), pos))
}
sqlstate_entry!(idem_watermark_advance_entry, pg_finfo_idem_watermark_advance_entry, idem_watermark_advance_wrapper);

#[pg_extern(sql = false)]
fn idem_watermark_advance_numbered(
    stream: Option<&str>,
    partition: Option<i64>,
    pos: Option<AnyNumeric>,
) -> Option<bool> {
    finish(advance(stream, Partition::Number(partition), pos))
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
