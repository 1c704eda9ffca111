//! The arguments of a function declared `VARIADIC "any"`, which pgrx cannot declare: each
//! argument has its own type, known only from the call's expression. They are read here as
//! the few kinds whose text the extension promises (src/keys.rs), so that no session setting
//! (TimeZone, DateStyle, extra_float_digits, lc_numeric) can change a key.

use std::ffi::CStr;

use pgrx::pg_sys;

/// One argument, by kind. A domain counts as its base type.
pub enum Part {
    Null,
    /// text, varchar, char(n) (without its padding, as its cast to text drops it), name, and
    /// an untyped literal.
    Text(String),
    /// int2, int4 and int8.
    Integer(i64),
    /// numeric without trailing zeros after its point, as PostgreSQL's numeric_normalize
    /// writes it: 42.0 is "42", and NaN and the infinities keep their names.
    Numeric(String),
    Uuid([u8; 16]),
    /// Microseconds since 2000-01-01 00:00:00 UTC; i64::MIN and i64::MAX are the infinities.
    Timestamptz(i64),
    Bool(bool),
    /// Any other type: its name, for the error.
    Other(String),
}

/// The parts a `VARIADIC "any"` call was given, in order; None when it was called with
/// `VARIADIC NULL::sometype[]`.
///
/// # Safety
/// `fcinfo` must be the current call's, of a function declared `VARIADIC "any"`.
pub unsafe fn variadic_any(fcinfo: pg_sys::FunctionCallInfo) -> Option<Vec<Part>> {
    // SAFETY: fcinfo is the live call (the caller's contract); nargs arguments follow it.
    let (flinfo, args) = unsafe {
        let nargs = usize::try_from((*fcinfo).nargs).unwrap_or(0);
        ((*fcinfo).flinfo, (*fcinfo).args.as_slice(nargs))
    };
    // SAFETY: flinfo belongs to this call; both functions only read its fn_expr.
    let explicit_array = unsafe { pg_sys::get_fn_expr_variadic(flinfo) };
    if !explicit_array {
        return Some(
            args.iter()
                .enumerate()
                .map(|(i, arg)| {
                    // SAFETY: as above; i is below nargs.
                    let typid = unsafe { pg_sys::get_fn_expr_argtype(flinfo, i as i32) };
                    // SAFETY: the datum is this argument's, of type typid.
                    unsafe { part(arg.value, arg.isnull, typid) }
                })
                .collect(),
        );
    }
    // `VARIADIC array`: the one argument is the whole array of parts.
    let arg = args.first()?;
    if arg.isnull {
        return None;
    }
    // SAFETY: the one argument is an array of the type the expression gives, not NULL.
    unsafe {
        let array_type = pg_sys::get_fn_expr_argtype(flinfo, 0);
        let element = pg_sys::get_element_type(pg_sys::getBaseType(array_type));
        let array = pg_sys::pg_detoast_datum(arg.value.cast_mut_ptr()) as *mut pg_sys::ArrayType;
        let (mut len, mut byval, mut align) = (0i16, false, 0 as std::ffi::c_char);
        pg_sys::get_typlenbyvalalign(element, &mut len, &mut byval, &mut align);
        let (mut values, mut nulls, mut count) = (std::ptr::null_mut(), std::ptr::null_mut(), 0);
        pg_sys::deconstruct_array(array, element, len.into(), byval, align, &mut values, &mut nulls, &mut count);
        let count = usize::try_from(count).unwrap_or(0);
        let values = std::slice::from_raw_parts(values, count);
        let nulls = std::slice::from_raw_parts(nulls, count);
        Some(values.iter().zip(nulls).map(|(value, null)| part(*value, *null, element)).collect())
    }
}

/// # Safety
/// `value` must be a datum of type `typid`, or `isnull` set.
unsafe fn part(value: pg_sys::Datum, isnull: bool, typid: pg_sys::Oid) -> Part {
    if isnull {
        return Part::Null;
    }
    // SAFETY (every arm): value is a datum of typid's base type, by the caller's contract;
    // by-reference values are detoasted before they are read.
    unsafe {
        match pg_sys::getBaseType(typid) {
            pg_sys::INT2OID => Part::Integer(i64::from(value.value() as i16)),
            pg_sys::INT4OID => Part::Integer(i64::from(value.value() as i32)),
            pg_sys::INT8OID => Part::Integer(value.value() as i64),
            pg_sys::BOOLOID => Part::Bool(value.value() != 0),
            pg_sys::TIMESTAMPTZOID => Part::Timestamptz(value.value() as i64),
            pg_sys::UUIDOID => Part::Uuid(*(value.cast_mut_ptr::<[u8; 16]>())),
            pg_sys::NUMERICOID => {
                let numeric = pg_sys::pg_detoast_datum(value.cast_mut_ptr()) as pg_sys::Numeric;
                Part::Numeric(CStr::from_ptr(pg_sys::numeric_normalize(numeric)).to_string_lossy().into_owned())
            }
            pg_sys::TEXTOID | pg_sys::VARCHAROID => Part::Text(text(value)),
            pg_sys::BPCHAROID => Part::Text(text(value).trim_end_matches(' ').to_string()),
            pg_sys::CHAROID => Part::Text(char_text(value.value() as u8)),
            pg_sys::NAMEOID | pg_sys::UNKNOWNOID => {
                Part::Text(CStr::from_ptr(value.cast_mut_ptr()).to_string_lossy().into_owned())
            }
            other => Part::Other(CStr::from_ptr(pg_sys::format_type_be(other)).to_string_lossy().into_owned()),
        }
    }
}

/// A `"char"` as its cast to text writes it (char_text, from PostgreSQL 15 on): NUL as
/// nothing, a byte with the high bit set as a backslash and three octal digits. With text
/// parts only, PostgreSQL resolves idem_key to its `text[]` form through that implicit cast,
/// so the `"any"` form must give the same text.
fn char_text(byte: u8) -> String {
    match byte {
        0 => String::new(),
        b if b >= 0x80 => format!("\\{b:03o}"),
        b => char::from(b).to_string(),
    }
}

/// # Safety
/// `value` must be a varlena of a text-like type, possibly toasted.
unsafe fn text(value: pg_sys::Datum) -> String {
    // SAFETY: the caller's contract; the detoasted copy lives in the current memory context.
    unsafe {
        let detoasted = pg_sys::pg_detoast_datum_packed(value.cast_mut_ptr());
        let len = pgrx::varsize_any_exhdr(detoasted);
        let bytes = std::slice::from_raw_parts(pgrx::vardata_any(detoasted) as *const u8, len);
        String::from_utf8_lossy(bytes).into_owned()
    }
}

/// Whether the array `datum` is empty, or one-dimensional with subscripts from 1.
///
/// # Safety
/// `datum` must be an array datum. An ERROR jumps out as PostgreSQL's own do (see
/// [`super::ffi`]): the caller must hold nothing with a destructor.
pub unsafe fn is_one_based_list(datum: pg_sys::Datum) -> bool {
    let array = super::ffi::pg_detoast_datum(datum.cast_mut_ptr()).cast::<pg_sys::ArrayType>();
    let dimensions = (*array).ndim;
    // ARR_DIMS follow the header, then ARR_LBOUND: with one dimension, its lower bound is the
    // second int after the header.
    dimensions == 0 || (dimensions == 1 && *array.add(1).cast::<i32>().add(1) == 1)
}
