//! Reading the top level of a jsonb object in place: versioned writes pick their cached
//! plan by the key names alone, and each value stays a JsonbValue borrowed from the datum
//! until it is coerced into its column's type. This runs on every versioned write, so it
//! reads jsonb's documented container format directly instead of driving JsonbIterator.

use pgrx::pg_sys;

use crate::error::{IdemError, Result, SqlState};
use crate::postgres::ffi;

/// One top-level member of a jsonb object, borrowed from the detoasted datum.
pub struct Member<'a> {
    pub name: &'a str,
    pub is_null: bool,
    /// Scalars as they are, nested arrays and objects as jbvBinary containers.
    pub value: pg_sys::JsonbValue,
}

// jsonb's on-disk layout (utils/jsonb.h), which PostgreSQL keeps stable across releases: a
// container header with the member count and kind, then a JEntry per key and per value,
// then their data.
const JB_CMASK: u32 = 0x0FFF_FFFF;
const JB_FOBJECT: u32 = 0x2000_0000;
const JENTRY_OFFLENMASK: u32 = 0x0FFF_FFFF;
const JENTRY_TYPEMASK: u32 = 0x7000_0000;
const JENTRY_HAS_OFF: u32 = 0x8000_0000;
const JENTRY_ISSTRING: u32 = 0x0000_0000;
const JENTRY_ISNUMERIC: u32 = 0x1000_0000;
const JENTRY_ISBOOL_FALSE: u32 = 0x2000_0000;
const JENTRY_ISBOOL_TRUE: u32 = 0x3000_0000;
const JENTRY_ISNULL: u32 = 0x4000_0000;

/// Where child `index` starts in the container's data: JEntries hold either a length or, every
/// few entries, an end offset (getJsonbOffset).
unsafe fn offset(children: *const u32, index: usize) -> usize {
    let mut offset = 0;
    for i in (0..index).rev() {
        let entry = *children.add(i);
        offset += (entry & JENTRY_OFFLENMASK) as usize;
        if entry & JENTRY_HAS_OFF != 0 {
            break;
        }
    }
    offset
}

/// getJsonbLength.
unsafe fn length(children: *const u32, index: usize, start: usize) -> usize {
    let entry = *children.add(index);
    let field = (entry & JENTRY_OFFLENMASK) as usize;
    if entry & JENTRY_HAS_OFF != 0 {
        field - start
    } else {
        field
    }
}

const fn int_align(n: usize) -> usize {
    (n + 3) & !3
}

/// The members of a jsonb object in jsonb's own key order (stable for a given key set), read
/// straight from the container as jsonb's fillJsonbValue reads it: no iterator, no copies.
///
/// # Safety
/// `datum` must be a jsonb datum that outlives the returned borrows (an argument of the call).
pub unsafe fn object_members<'a>(datum: pg_sys::Datum, argument: &str) -> Result<Vec<Member<'a>>> {
    // pg_detoast_datum's own test, without a call for the plain values arguments usually are.
    let varlena = datum.cast_mut_ptr::<pg_sys::varlena>();
    let jsonb = if pgrx::varlena::varatt_is_4b_u(varlena) { varlena } else { pg_sys::pg_detoast_datum(varlena) }
        as *mut pg_sys::Jsonb;
    let root = &raw const (*jsonb).root;
    let header = (*root).header;
    if header & JB_FOBJECT == 0 {
        return Err(IdemError::new(SqlState::InvalidParameterValue, format!("{argument} must be a JSON object")));
    }
    let pairs = (header & JB_CMASK) as usize;
    let children = (*root).children.as_ptr();
    let data = children.add(2 * pairs) as *const u8;
    let mut members = Vec::with_capacity(pairs);
    for i in 0..pairs {
        let key_start = offset(children, i);
        let key = std::slice::from_raw_parts(data.add(key_start), length(children, i, key_start));
        let name = std::str::from_utf8(key).map_err(|_| {
            IdemError::new(SqlState::InvalidParameterValue, format!("{argument} has a key that is not UTF-8"))
        })?;
        let index = pairs + i;
        let entry = *children.add(index);
        let start = offset(children, index);
        let mut value: pg_sys::JsonbValue = std::mem::zeroed();
        match entry & JENTRY_TYPEMASK {
            JENTRY_ISNULL => value.type_ = pg_sys::jbvType::jbvNull,
            JENTRY_ISSTRING => {
                value.type_ = pg_sys::jbvType::jbvString;
                value.val.string.val = data.add(start) as *mut std::ffi::c_char;
                value.val.string.len = length(children, index, start) as i32;
            }
            JENTRY_ISNUMERIC => {
                value.type_ = pg_sys::jbvType::jbvNumeric;
                value.val.numeric = data.add(int_align(start)) as pg_sys::Numeric;
            }
            JENTRY_ISBOOL_FALSE | JENTRY_ISBOOL_TRUE => {
                value.type_ = pg_sys::jbvType::jbvBool;
                value.val.boolean = entry & JENTRY_TYPEMASK == JENTRY_ISBOOL_TRUE;
            }
            _ => {
                value.type_ = pg_sys::jbvType::jbvBinary;
                value.val.binary.data = data.add(int_align(start)) as *mut pg_sys::JsonbContainer;
                value.val.binary.len = (length(children, index, start) - (int_align(start) - start)) as i32;
            }
        }
        members.push(Member { name, is_null: value.type_ == pg_sys::jbvType::jbvNull, value });
    }
    Ok(members)
}

// numeric's on-disk header (utils/adt/numeric.c), as stable as jsonb's: a short header packs
// sign, display scale and weight into 16 bits; a long one has a 16-bit sign and scale, then a
// 16-bit weight. Digits are base-10000 int16s, the first one weighing 10000^weight.
const NUMERIC_SIGN_MASK: u16 = 0xC000;
const NUMERIC_NEG: u16 = 0x4000;
const NUMERIC_SHORT: u16 = 0x8000;
const NUMERIC_SPECIAL: u16 = 0xC000;
const NUMERIC_SHORT_SIGN_MASK: u16 = 0x2000;
const NUMERIC_SHORT_DSCALE_MASK: u16 = 0x1F80;
const NUMERIC_SHORT_DSCALE_SHIFT: u16 = 7;
const NUMERIC_SHORT_WEIGHT_SIGN_MASK: u16 = 0x0040;
const NUMERIC_SHORT_WEIGHT_MASK: u16 = 0x003F;
const NUMERIC_DSCALE_MASK: u16 = 0x3FFF;
const NBASE: i128 = 10_000;

/// A JSON number as an i64 when its text is an integer: no fraction digits ("5", not "5.0",
/// which an integer type's input function refuses) and within i64. Read from the numeric's
/// bytes, where printing it and parsing the text again would cost more than the write.
///
/// # Safety
/// `numeric` must point to a numeric value (a jsonb number, for instance).
pub unsafe fn integer(numeric: pg_sys::Numeric) -> Option<i64> {
    let varlena = numeric as *const pg_sys::varlena;
    let data = pgrx::varlena::vardata_any(varlena) as *const u8;
    let size = pgrx::varlena::varsize_any_exhdr(varlena);
    let word = |at: usize| std::ptr::read_unaligned(data.add(at) as *const u16);
    let header = word(0);
    let (negative, scale, weight, digits_at) = match header & NUMERIC_SIGN_MASK {
        NUMERIC_SPECIAL => return None,
        NUMERIC_SHORT => {
            let weight = header & NUMERIC_SHORT_WEIGHT_MASK;
            let sign_extended =
                if header & NUMERIC_SHORT_WEIGHT_SIGN_MASK != 0 { weight | !NUMERIC_SHORT_WEIGHT_MASK } else { weight };
            (
                header & NUMERIC_SHORT_SIGN_MASK != 0,
                (header & NUMERIC_SHORT_DSCALE_MASK) >> NUMERIC_SHORT_DSCALE_SHIFT,
                sign_extended as i16,
                2,
            )
        }
        sign => (sign == NUMERIC_NEG, header & NUMERIC_DSCALE_MASK, word(2) as i16, 4),
    };
    let digits = (size - digits_at) / 2;
    if scale != 0 {
        return None;
    }
    if digits == 0 {
        return Some(0);
    }
    // 10000^5 exceeds i64, and a digit past the units digit would be a fraction.
    if !(0..5).contains(&weight) || digits > weight as usize + 1 {
        return None;
    }
    let magnitude = (0..=weight as usize).fold(0i128, |value, i| {
        let digit = if i < digits { word(digits_at + 2 * i) as i16 } else { 0 };
        value * NBASE + i128::from(digit)
    });
    i64::try_from(if negative { -magnitude } else { magnitude }).ok()
}

/// Whether the jsonb `datum` nests arrays and objects more than `limit` levels deep. A
/// container takes at least a header and its parent's JEntry, 8 bytes, so an inline value
/// smaller than that per level cannot, and is neither copied nor walked: this runs on every
/// claim with a payload.
///
/// # Safety
/// `datum` must be a jsonb datum. An ERROR jumps out of this function as PostgreSQL's own
/// do (see [`ffi`]): its caller must hold nothing with a destructor.
pub unsafe fn nests_deeper_than(datum: pg_sys::Datum, limit: usize) -> bool {
    let raw = datum.cast_mut_ptr::<pg_sys::varlena>();
    let toasted = pgrx::varlena::varatt_is_1b_e(raw) || pgrx::varlena::varatt_is_4b_c(raw);
    if !toasted && pgrx::varlena::varsize_any(raw) <= 8 * limit {
        return false;
    }
    let jsonb = ffi::pg_detoast_datum(raw).cast::<pg_sys::Jsonb>();
    // JsonbIteratorNext keeps one frame per open container, not one per level of Rust stack.
    let mut iterator = ffi::JsonbIteratorInit(&raw mut (*jsonb).root);
    let mut value = pg_sys::JsonbValue::default();
    let mut depth = 0;
    loop {
        match ffi::JsonbIteratorNext(&mut iterator, &mut value, false) {
            pg_sys::JsonbIteratorToken::WJB_BEGIN_ARRAY | pg_sys::JsonbIteratorToken::WJB_BEGIN_OBJECT => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            pg_sys::JsonbIteratorToken::WJB_END_ARRAY | pg_sys::JsonbIteratorToken::WJB_END_OBJECT => depth -= 1,
            pg_sys::JsonbIteratorToken::WJB_DONE => return false,
            _ => {}
        }
    }
}

/// A jsonb datum parsed from text, living in the current memory context: for tests that read
/// members the way the extension's functions read their arguments.
#[cfg(any(test, feature = "pg_test"))]
pub fn jsonb(text: &str) -> pg_sys::Datum {
    let text = std::ffi::CString::new(text).unwrap();
    // SAFETY: jsonb_in reads the NUL-terminated text, alive for the call.
    unsafe {
        pg_sys::OidInputFunctionCall(
            pg_sys::Oid::from(pg_sys::F_JSONB_IN),
            text.as_ptr().cast_mut(),
            pg_sys::InvalidOid,
            -1,
        )
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::*;
    use pgrx::prelude::*;

    /// A member as "name=type:value", the value as jsonb_each's `value #>> '{}'` shows it.
    fn describe(member: &Member<'_>) -> String {
        let v = &member.value;
        // SAFETY: each arm reads the union member its type_ names, as jsonb's iterator set it.
        let (kind, text) = unsafe {
            match v.type_ {
                pg_sys::jbvType::jbvNull => ("null", String::new()),
                pg_sys::jbvType::jbvString => {
                    let bytes = std::slice::from_raw_parts(v.val.string.val as *const u8, v.val.string.len as usize);
                    ("string", String::from_utf8(bytes.to_vec()).unwrap())
                }
                pg_sys::jbvType::jbvNumeric => {
                    let out = pg_sys::OidOutputFunctionCall(
                        pg_sys::Oid::from(pg_sys::F_NUMERIC_OUT),
                        pg_sys::Datum::from(v.val.numeric),
                    );
                    ("number", std::ffi::CStr::from_ptr(out).to_string_lossy().into_owned())
                }
                pg_sys::jbvType::jbvBool => ("boolean", v.val.boolean.to_string()),
                _ => {
                    let out = pg_sys::JsonbToCString(std::ptr::null_mut(), v.val.binary.data, v.val.binary.len);
                    let text = std::ffi::CStr::from_ptr(out).to_string_lossy().into_owned();
                    (if text.starts_with('[') { "array" } else { "object" }, text)
                }
            }
        };
        format!("{}={kind}:{text}", member.name)
    }

    /// What PostgreSQL itself says the members are, in its own order.
    fn expected(text: &str) -> Vec<String> {
        let query = format!(
            "SELECT coalesce(array_agg(key || '=' || jsonb_typeof(value) || ':' || coalesce(value #>> '{{}}', '') ORDER BY n), '{{}}')
             FROM jsonb_each({}::jsonb) WITH ORDINALITY AS e(key, value, n)",
            pgrx::spi::quote_literal(text)
        );
        Spi::get_one::<Vec<String>>(&query).unwrap().unwrap()
    }

    fn read(text: &str) -> Vec<String> {
        // SAFETY: jsonb() returns a jsonb datum of the current memory context.
        unsafe { object_members(jsonb(text), "test").unwrap() }.iter().map(describe).collect()
    }

    #[pg_test]
    fn members_match_jsonb_each_for_every_kind_of_value() {
        for text in [
            r#"{}"#,
            r#"{"id": 1, "status": "paid", "version": 7}"#,
            r#"{"n": -12.50, "big": 123456789012345678901234567890, "t": true, "f": false, "z": null}"#,
            r#"{"nested": {"a": [1, {"b": null}]}, "list": [], "empty": {}, "s": "", "ünï": "çødé"}"#,
        ] {
            assert_eq!(read(text), expected(text), "{text}");
        }
    }

    #[pg_test]
    fn members_past_the_offset_stride_are_found() {
        // jsonb stores an offset instead of a length in every 32nd JEntry; forty members
        // of mixed kinds and lengths cross that boundary for keys and for values.
        let members: Vec<String> = (0..40)
            .map(|i| match i % 4 {
                0 => format!(r#""key{i}": {i}.{i}"#),
                1 => format!(r#""k{i}": "{}""#, "x".repeat(i)),
                2 => format!(r#""long_key_number_{i}": [{i}, "{i}"]"#),
                _ => format!(r#""{i}": null"#),
            })
            .collect();
        let text = format!("{{{}}}", members.join(", "));
        assert_eq!(read(&text), expected(&text));
    }

    #[pg_test]
    fn integers_read_from_numeric_bytes_match_their_text() {
        // What an integer column's input function makes of numeric's own text for the number.
        let texts = [
            "0",
            "-0",
            "1",
            "-1",
            "7",
            "9999",
            "10000",
            "10001",
            "-10000",
            "99999999",
            "100000000",
            "123456789",
            "1e3",
            "1.5e1",
            "-2.5e3",
            "1.0",
            "0.5",
            "-0.0",
            "1e-2",
            "120e-1",
            "123456789012345678",
            "9223372036854775807",
            "9223372036854775808",
            "-9223372036854775808",
            "-9223372036854775809",
            "1e18",
            "1e19",
            "-1e19",
            "1e30",
            "12345678901234567890123",
            "100000000000000000000000000000000",
            "0.000001",
            "31415926535897932384626433832795e-31",
        ];
        for text in texts {
            let document = format!(r#"{{"n": {text}}}"#);
            let printed = Spi::get_one::<String>(&format!("SELECT '{document}'::jsonb ->> 'n'")).unwrap().unwrap();
            // SAFETY: a jsonb datum of the current memory context, whose one member is a number.
            let members = unsafe { object_members(jsonb(&document), "test").unwrap() };
            // SAFETY: the member is jbvNumeric, so val.numeric is the union member set.
            let read = unsafe { integer(members[0].value.val.numeric) };
            assert_eq!(read, printed.parse::<i64>().ok(), "{text} prints as {printed}");
        }
    }

    #[pg_test]
    fn only_objects_have_members() {
        for text in ["[1, 2]", "5", r#""text""#, "null"] {
            // SAFETY: jsonb() returns a jsonb datum of the current memory context.
            let error = unsafe { object_members(jsonb(text), "key") }.err().expect(text);
            let IdemError::Own(report) = error else { panic!("an own error") };
            assert_eq!(report.state, SqlState::InvalidParameterValue);
            assert_eq!(report.message, "key must be a JSON object");
        }
    }
}
