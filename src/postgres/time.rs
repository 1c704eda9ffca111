//! Timestamps: the transaction's start (`now()`), the clock (`clock_timestamp()`), and calendar
//! subtraction as `timestamp - interval` does it.

use pgrx::pg_sys;

use super::{catch, ffi, PgError};

/// `now()`: when the transaction started.
pub fn transaction_start() -> pg_sys::TimestampTz {
    // SAFETY: reads a backend-local value.
    unsafe { pg_sys::GetCurrentTransactionStartTimestamp() }
}

/// `clock_timestamp()`.
pub fn clock() -> pg_sys::TimestampTz {
    // SAFETY: reads the system clock.
    unsafe { pg_sys::GetCurrentTimestamp() }
}

/// `at` less an interval on the UTC clock: calendar months first, then days, then time, as
/// `timestamp - interval` subtracts from a timestamp holding UTC (a timestamptz is UTC
/// microseconds, whatever the session's TimeZone). Raises 22008 as the operator does when the
/// result leaves the timestamp range.
pub fn utc_minus(at: pg_sys::TimestampTz, months: i32, days: i32, micros: i64) -> Result<pg_sys::TimestampTz, PgError> {
    let mut span = pg_sys::Interval { time: micros, day: days, month: months };
    // SAFETY: timestamp_mi_interval reads a timestamp by value and an interval by reference,
    // alive for the call; its ERROR is caught whole.
    let result = unsafe {
        catch(|| {
            ffi::DirectFunctionCall2Coll(
                Some(ffi::timestamp_mi_interval),
                pg_sys::InvalidOid,
                pg_sys::Datum::from(at),
                pg_sys::Datum::from(&raw mut span),
            )
        })
    }?;
    Ok(result.value() as pg_sys::TimestampTz)
}
