//! Reading the top level of a jsonb object in place: versioned writes pick their cached
//! plan by the key names alone, and each value stays a JsonbValue borrowed from the datum
//! until it is coerced into its column's type. This runs on every versioned write, so
//! idempotency-core reads jsonb's container format from the datum's bytes (and is fuzzed
//! there); this module is where a datum becomes those bytes and its members JsonbValues.

use idempotency_core::jsonb::{self as format, Error, Value};
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

/// The bytes of a varlena that is not toasted, and the PostgreSQL pointer they start at.
///
/// # Safety
/// `varlena` must point to a varlena with a 1-byte or an uncompressed 4-byte header that
/// outlives `'a`.
unsafe fn bytes<'a>(varlena: *const pg_sys::varlena) -> &'a [u8] {
    std::slice::from_raw_parts(varlena.cast::<u8>(), pgrx::varlena::varsize_any(varlena))
}

/// The members of a jsonb object in jsonb's own key order (stable for a given key set), read
/// straight from the container as jsonb's fillJsonbValue reads it: no iterator, no copies.
///
/// # Safety
/// `datum` must be a jsonb datum that outlives the returned borrows (an argument of the call).
pub unsafe fn object_members<'a>(datum: pg_sys::Datum, argument: &str) -> Result<Vec<Member<'a>>> {
    // pg_detoast_datum's own test, without a call for the plain values arguments usually are.
    let varlena = datum.cast_mut_ptr::<pg_sys::varlena>();
    let jsonb = if pgrx::varlena::varatt_is_4b_u(varlena) { varlena } else { pg_sys::pg_detoast_datum(varlena) };
    // A detoasted jsonb has a 4-byte header, then its root container.
    let root = &bytes(jsonb)[pg_sys::VARHDRSZ..];
    let members = format::object_members(root).map_err(|error| match error {
        Error::NotObject => {
            IdemError::new(SqlState::InvalidParameterValue, format!("{argument} must be a JSON object"))
        }
        Error::KeyNotUtf8 => {
            IdemError::new(SqlState::InvalidParameterValue, format!("{argument} has a key that is not UTF-8"))
        }
        Error::Corrupt => IdemError::new(SqlState::DataCorrupted, format!("{argument} is a corrupt jsonb value")),
    })?;
    Ok(members
        .into_iter()
        .map(|member| {
            let mut value = pg_sys::JsonbValue::default();
            match member.value {
                Value::Null => value.type_ = pg_sys::jbvType::jbvNull,
                Value::String(text) => {
                    value.type_ = pg_sys::jbvType::jbvString;
                    value.val.string.val = text.as_ptr().cast_mut().cast();
                    value.val.string.len = text.len() as i32;
                }
                Value::Numeric(numeric) => {
                    value.type_ = pg_sys::jbvType::jbvNumeric;
                    value.val.numeric = numeric.as_ptr().cast_mut().cast();
                }
                Value::Bool(boolean) => {
                    value.type_ = pg_sys::jbvType::jbvBool;
                    value.val.boolean = boolean;
                }
                Value::Container(container) => {
                    value.type_ = pg_sys::jbvType::jbvBinary;
                    value.val.binary.data = container.as_ptr().cast_mut().cast();
                    value.val.binary.len = container.len() as i32;
                }
            }
            Member { name: member.name, is_null: matches!(member.value, Value::Null), value }
        })
        .collect())
}

/// A JSON number as an i64 when its text is an integer (see [`format::integer`]): read from
/// the numeric's bytes, where printing it and parsing the text again would cost more than the
/// write.
///
/// # Safety
/// `numeric` must be a member's number as [`object_members`] read it, whose varlena header
/// the core checked against the member's own length.
pub unsafe fn integer(numeric: pg_sys::Numeric) -> Option<i64> {
    format::integer(bytes(numeric.cast()))
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
                    // Through a jsonb of its own, which copies exactly val.binary.len bytes, as
                    // a write of the member into a jsonb column does.
                    let copy = pg_sys::JsonbValueToJsonb(std::ptr::from_ref(v).cast_mut());
                    let out = pg_sys::JsonbToCString(
                        std::ptr::null_mut(),
                        &raw mut (*copy).root,
                        pgrx::varlena::varsize_any(copy.cast()) as i32,
                    );
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

    /// SplitMix64: random documents that replay from the seed a failure prints.
    struct Random(u64);

    impl Random {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        /// `least` digits and up to `more` others.
        fn digits(&mut self, least: u64, more: u64) -> String {
            let n = least + self.below(more);
            (0..n).map(|_| char::from(b'0' + self.below(10) as u8)).collect()
        }

        /// Numbers as JSON allows them, weighted to the unusual: huge, tiny, exponents,
        /// trailing zeros, negative zero, the edges of i64.
        fn number(&mut self) -> String {
            let sign = if self.below(2) == 0 { "-" } else { "" };
            match self.below(8) {
                0 => format!("{sign}{}", self.below(100_000)),
                1 => format!(
                    "{sign}{}",
                    ["9223372036854775807", "9223372036854775808", "0", "0.0"][self.below(4) as usize]
                ),
                2 => format!("{sign}1{}", self.digits(0, 40)),
                3 => format!("{sign}{}.{}", self.below(1000), self.digits(1, 20)),
                4 => format!("{sign}{}e{}{}", self.below(100), ["", "+", "-"][self.below(3) as usize], self.below(40)),
                5 => format!("{sign}0.{}1e-{}", "0".repeat(self.below(30) as usize), self.below(300)),
                6 => format!("{sign}1{}", self.digits(500, 2000)),
                _ => format!("{sign}{}.{}e{}", self.below(10), self.digits(1, 12), self.below(25)),
            }
        }

        fn string(&mut self) -> String {
            let alphabet =
                ["a", "Z", "0", " ", "\\\"", "\\\\", "\\n", "\\u00e9", "\\ud83d\\ude00", "ü", "|", "#", "'", ";", "--"];
            let len = match self.below(10) {
                0 => 0,
                1 => 2_000 + self.below(120_000),
                _ => self.below(12),
            };
            let mut text = String::from('"');
            while text.len() < len as usize + 1 {
                text.push_str(alphabet[self.below(alphabet.len() as u64) as usize]);
            }
            text.push('"');
            text
        }

        fn value(&mut self, depth: u32) -> String {
            match self.below(if depth == 0 { 5 } else { 7 }) {
                0 => "null".into(),
                1 => ["true", "false"][self.below(2) as usize].into(),
                2 => self.string(),
                3 | 4 => self.number(),
                5 => {
                    let items: Vec<String> = (0..self.below(5)).map(|_| self.value(depth - 1)).collect();
                    format!("[{}]", items.join(","))
                }
                _ => self.object(depth - 1),
            }
        }

        /// Up to 80 members, some of them repeated keys, so that the offset stride is crossed.
        fn object(&mut self, depth: u32) -> String {
            let count = if self.below(4) == 0 { 30 + self.below(50) } else { self.below(8) };
            let members: Vec<String> = (0..count)
                .map(|_| {
                    let key = if self.below(5) == 0 { format!("\"k{}\"", self.below(4)) } else { self.string() };
                    format!("{key}:{}", self.value(depth))
                })
                .collect();
            format!("{{{}}}", members.join(","))
        }

        /// A value nested `levels` deep: the reader sees only the outermost container.
        fn deep(&mut self, levels: u64) -> String {
            let mut text = self.number();
            for _ in 0..levels {
                text = if self.below(2) == 0 { format!("[{text}]") } else { format!("{{\"d\":{text}}}") };
            }
            text
        }
    }

    /// The property the fixed cases above sample: for random objects, with huge, unusual and
    /// deeply nested values, the in-place reader sees exactly what jsonb_each sees, and a
    /// number it reads as an integer prints as that integer. RUST_PROPERTY_CASES sets the count
    /// (`make fuzz` raises it), RUST_PROPERTY_SEED the first seed: pgrx's test runner passes
    /// only CARGO* and RUST* variables through sudo to the server.
    #[pg_test]
    fn random_objects_read_as_jsonb_each_reads_them() {
        let setting =
            |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
        let cases = setting("RUST_PROPERTY_CASES", 100);
        let first = setting("RUST_PROPERTY_SEED", 0x1DE4_7E57);
        for seed in first..first + cases {
            let mut random = Random(seed);
            let mut text = random.object(3);
            if random.below(4) == 0 {
                let levels = 100 + random.below(3000);
                text = format!("{{\"deep\":{},{}", random.deep(levels), &text[1..]).replace(",}", "}");
            }
            let case = || {
                let read = read(&text);
                assert_eq!(read, expected(&text), "seed {seed}");
                // SAFETY: jsonb() returns a jsonb datum of the current memory context.
                let members = unsafe { object_members(jsonb(&text), "test").unwrap() };
                for (member, described) in members.iter().zip(&read) {
                    if let Some(printed) = described.strip_prefix(&format!("{}=number:", member.name)) {
                        // SAFETY: the member is jbvNumeric, so val.numeric is the union member set.
                        let integer = unsafe { integer(member.value.val.numeric) };
                        assert_eq!(integer, printed.parse::<i64>().ok(), "seed {seed}: {printed}");
                    }
                }
            };
            // SAFETY: the case's datums live in a context of its own, deleted after it, so
            // that a long run keeps none; nothing the case makes outlives it.
            unsafe { pgrx::PgMemoryContexts::new("property case").switch_to(|_| case()) }
        }
    }
}
