//! jsonb's and numeric's on-disk formats, which PostgreSQL keeps stable across releases
//! (utils/jsonb.h, utils/adt/numeric.c), read from bytes in place: no iterator, no copies.
//! Every read is bounds-checked, so a corrupt datum is an error here, never a read past it.

/// Why a container could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// An array or a scalar, where an object was expected.
    NotObject,
    /// A key that is not UTF-8: possible only in a database whose encoding is not.
    KeyNotUtf8,
    /// A length or offset that points outside the datum.
    Corrupt,
}

/// One member's value, borrowed from the container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    Null,
    /// The string's bytes, without quotes or escapes.
    String(&'a [u8]),
    /// The number as a numeric varlena, header included (see [`integer`]), whose header's
    /// size is the member's.
    Numeric(&'a [u8]),
    Bool(bool),
    /// A nested array or object: its container, as jbvBinary points to it, at least as long
    /// as its header and JEntries.
    Container(&'a [u8]),
}

/// One top-level member of an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member<'a> {
    pub name: &'a str,
    pub value: Value<'a>,
}

// A container starts with a header holding the member count and kind, then a JEntry per key
// and per value, then their data.
const JB_CMASK: u32 = 0x0FFF_FFFF;
const JB_FOBJECT: u32 = 0x2000_0000;
const JB_FARRAY: u32 = 0x4000_0000;
const JENTRY_OFFLENMASK: u32 = 0x0FFF_FFFF;
const JENTRY_TYPEMASK: u32 = 0x7000_0000;
const JENTRY_HAS_OFF: u32 = 0x8000_0000;
const JENTRY_ISSTRING: u32 = 0x0000_0000;
const JENTRY_ISNUMERIC: u32 = 0x1000_0000;
const JENTRY_ISBOOL_FALSE: u32 = 0x2000_0000;
const JENTRY_ISBOOL_TRUE: u32 = 0x3000_0000;
const JENTRY_ISNULL: u32 = 0x4000_0000;

fn word32(bytes: &[u8], at: usize) -> Result<u32, Error> {
    let end = at.checked_add(4).ok_or(Error::Corrupt)?;
    Ok(u32::from_ne_bytes(bytes.get(at..end).ok_or(Error::Corrupt)?.try_into().expect("four bytes")))
}

const fn int_align(n: usize) -> usize {
    (n + 3) & !3
}

/// The JEntries of one container: each holds either a length or, every few entries, an end
/// offset (getJsonbOffset, getJsonbLength).
struct Entries<'a> {
    entries: &'a [u8],
}

impl Entries<'_> {
    fn entry(&self, index: usize) -> u32 {
        u32::from_ne_bytes(self.entries[4 * index..4 * index + 4].try_into().expect("four bytes"))
    }

    fn start(&self, index: usize) -> usize {
        let mut offset = 0;
        for i in (0..index).rev() {
            let entry = self.entry(i);
            offset += (entry & JENTRY_OFFLENMASK) as usize;
            if entry & JENTRY_HAS_OFF != 0 {
                break;
            }
        }
        offset
    }

    /// Where child `index`'s data lies within the container's data, and its JEntry.
    fn span(&self, index: usize) -> Result<(usize, usize, u32), Error> {
        let entry = self.entry(index);
        let start = self.start(index);
        let field = (entry & JENTRY_OFFLENMASK) as usize;
        let end = if entry & JENTRY_HAS_OFF != 0 { field } else { start.checked_add(field).ok_or(Error::Corrupt)? };
        if end < start {
            return Err(Error::Corrupt);
        }
        Ok((start, end, entry))
    }
}

/// Whether a nested container holds at least its header and a JEntry per child. PostgreSQL
/// reads it further by those, so they must lie within it.
fn is_container(bytes: &[u8]) -> bool {
    word32(bytes, 0).is_ok_and(|header| {
        let children = (header & JB_CMASK) as usize;
        let entries = match header & (JB_FOBJECT | JB_FARRAY) {
            JB_FOBJECT => 2 * children,
            JB_FARRAY => children,
            _ => return false,
        };
        4 + 4 * entries <= bytes.len()
    })
}

/// The members of the jsonb object whose root container is `root` (the datum without its
/// varlena header), in jsonb's own key order, as fillJsonbValue reads them. A value that the
/// extension hands on to PostgreSQL, which trusts its header, is checked to lie within its
/// member: a number's varlena size, a nested container's JEntries.
pub fn object_members(root: &[u8]) -> Result<Vec<Member<'_>>, Error> {
    let header = word32(root, 0)?;
    if header & JB_FOBJECT == 0 {
        return Err(Error::NotObject);
    }
    let pairs = (header & JB_CMASK) as usize;
    let data_at = 4 + 8 * pairs;
    if data_at > root.len() {
        return Err(Error::Corrupt);
    }
    let entries = Entries { entries: &root[4..data_at] };
    let data = &root[data_at..];
    let within = |start: usize, end: usize| data.get(start..end).ok_or(Error::Corrupt);
    let mut members = Vec::with_capacity(pairs);
    for i in 0..pairs {
        let (start, end, _) = entries.span(i)?;
        let name = std::str::from_utf8(within(start, end)?).map_err(|_| Error::KeyNotUtf8)?;
        let (start, end, entry) = entries.span(pairs + i)?;
        let value = match entry & JENTRY_TYPEMASK {
            JENTRY_ISNULL => Value::Null,
            JENTRY_ISSTRING => Value::String(within(start, end)?),
            JENTRY_ISNUMERIC => {
                let numeric = within(int_align(start), end)?;
                if varlena_header(numeric).map(|(_, size)| size) != Some(numeric.len()) {
                    return Err(Error::Corrupt);
                }
                Value::Numeric(numeric)
            }
            JENTRY_ISBOOL_FALSE => Value::Bool(false),
            JENTRY_ISBOOL_TRUE => Value::Bool(true),
            _ => {
                let container = within(int_align(start), end)?;
                if !is_container(container) {
                    return Err(Error::Corrupt);
                }
                Value::Container(container)
            }
        };
        members.push(Member { name, value });
    }
    Ok(members)
}

/// The header length and total size of an in-memory varlena (one with a 1-byte or an
/// uncompressed 4-byte header), as VARSIZE_ANY reads them; None for any other header.
fn varlena_header(datum: &[u8]) -> Option<(usize, usize)> {
    let first = *datum.first()?;
    #[cfg(target_endian = "little")]
    let (one_byte, four_byte) = (first & 0x01 == 0x01 && first != 0x01, first & 0x03 == 0x00);
    #[cfg(target_endian = "big")]
    let (one_byte, four_byte) = (first & 0x80 == 0x80 && first != 0x80, first & 0xC0 == 0x00);
    if one_byte {
        #[cfg(target_endian = "little")]
        let size = (first >> 1) & 0x7F;
        #[cfg(target_endian = "big")]
        let size = first & 0x7F;
        Some((1, size as usize))
    } else if four_byte {
        let word = word32(datum, 0).ok()?;
        #[cfg(target_endian = "little")]
        let size = (word >> 2) & 0x3FFF_FFFF;
        #[cfg(target_endian = "big")]
        let size = word & 0x3FFF_FFFF;
        Some((4, size as usize))
    } else {
        None
    }
}

/// The payload of an in-memory varlena, as VARDATA_ANY and VARSIZE_ANY_EXHDR find it; None
/// for a header [`varlena_header`] does not read or a size that does not fit.
pub fn varlena_payload(datum: &[u8]) -> Option<&[u8]> {
    let (header, size) = varlena_header(datum)?;
    datum.get(header..size)
}

// numeric's header: a short one packs sign, display scale and weight into 16 bits; a long
// one has a 16-bit sign and scale, then a 16-bit weight. Digits are base-10000 int16s, the
// first one weighing 10000^weight.
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

/// A number as an i64 when its text is an integer: no fraction digits ("5", not "5.0",
/// which an integer type's input function refuses) and within i64. `numeric` is the numeric
/// varlena, header included; None for anything else, including NaN and the infinities.
pub fn integer(numeric: &[u8]) -> Option<i64> {
    let data = varlena_payload(numeric)?;
    let word = |at: usize| data.get(at..at + 2).map(|w| u16::from_ne_bytes(w.try_into().expect("two bytes")));
    let header = word(0)?;
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
        sign => (sign == NUMERIC_NEG, header & NUMERIC_DSCALE_MASK, word(2)? as i16, 4),
    };
    let digits = data.len().checked_sub(digits_at)? / 2;
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
    let mut magnitude = 0i128;
    for i in 0..=weight as usize {
        let digit = if i < digits { word(digits_at + 2 * i)? as i16 } else { 0 };
        magnitude = magnitude * NBASE + i128::from(digit);
    }
    i64::try_from(if negative { -magnitude } else { magnitude }).ok()
}
