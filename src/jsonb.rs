//! Reading the top level of a jsonb object in place: versioned writes need only the key
//! names (and which values are JSON null) to pick their cached statement, so the values are
//! never converted; PostgreSQL coerces them inside the statement.

use pgrx::pg_sys;

use crate::error::{IdemError, Result, SqlState};

/// One top-level member of a jsonb object, borrowed from the detoasted datum.
pub struct Member<'a> {
    pub name: &'a str,
    pub is_null: bool,
}

/// The members of a jsonb object in jsonb's own key order (stable for a given key set).
///
/// # Safety
/// `datum` must be a jsonb datum that outlives the returned borrows (an argument of the call).
pub unsafe fn object_members<'a>(datum: pg_sys::Datum, argument: &str) -> Result<Vec<Member<'a>>> {
    let jsonb = pg_sys::pg_detoast_datum(datum.cast_mut_ptr()) as *mut pg_sys::Jsonb;
    let mut iterator = pg_sys::JsonbIteratorInit(&mut (*jsonb).root);
    let mut value: pg_sys::JsonbValue = std::mem::zeroed();
    if pg_sys::JsonbIteratorNext(&mut iterator, &mut value, false) != pg_sys::JsonbIteratorToken::WJB_BEGIN_OBJECT {
        return Err(IdemError::new(SqlState::InvalidParameterValue, format!("{argument} must be a JSON object")));
    }
    let mut members = Vec::new();
    let mut name = "";
    loop {
        match pg_sys::JsonbIteratorNext(&mut iterator, &mut value, true) {
            pg_sys::JsonbIteratorToken::WJB_KEY => {
                let s = value.val.string;
                let bytes = std::slice::from_raw_parts(s.val as *const u8, s.len as usize);
                name = std::str::from_utf8(bytes).map_err(|_| {
                    IdemError::new(SqlState::InvalidParameterValue, format!("{argument} has a key that is not UTF-8"))
                })?;
            }
            pg_sys::JsonbIteratorToken::WJB_VALUE => {
                members.push(Member { name, is_null: value.type_ == pg_sys::jbvType::jbvNull });
            }
            _ => break,
        }
    }
    Ok(members)
}
