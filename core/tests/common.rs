//! Encoders for jsonb's and numeric's binary formats, written from PostgreSQL's
//! convertJsonbObject and make_result, and a decoder of joined key parts: the oracles the
//! core is checked against by the property tests here and by the fuzz targets, which include
//! this file.
#![allow(dead_code)]

/// A numeric as PostgreSQL stores it: sign, weight of the first base-10000 digit, display
/// scale, and the digits, without leading or trailing zero digits.
#[derive(Debug, Clone)]
pub struct Numeric {
    pub negative: bool,
    pub weight: i16,
    pub scale: u16,
    pub digits: Vec<u16>,
}

impl Numeric {
    /// Digits as make_result leaves them, and a display scale that keeps every digit: what
    /// numeric_in makes of some text.
    pub fn normalized(negative: bool, weight: i16, scale: u16, mut digits: Vec<u16>) -> Numeric {
        let mut weight = weight;
        while digits.first() == Some(&0) {
            digits.remove(0);
            weight -= 1;
        }
        while digits.last() == Some(&0) {
            digits.pop();
        }
        if digits.is_empty() {
            return Numeric { negative: false, weight: 0, scale, digits };
        }
        // Digits after the units digit need display scale; dscale counts decimal digits.
        let fraction_digits = (digits.len() as i32 - 1 - i32::from(weight)).max(0) as u16;
        let scale = scale.max(fraction_digits * 4);
        Numeric { negative, weight, scale, digits }
    }

    /// The varlena, with a 4-byte header (as jsonb stores numerics): the short format where
    /// make_result would use it.
    pub fn encode(&self, short: bool) -> Vec<u8> {
        varlena(&self.body(short))
    }

    /// The same with a 1-byte header, as a packed tuple stores a short value; None when it
    /// does not fit one.
    pub fn encode_packed(&self, short: bool) -> Option<Vec<u8>> {
        let body = self.body(short);
        let size = body.len() + 1;
        #[cfg(target_endian = "little")]
        let header = (size << 1) | 1;
        #[cfg(target_endian = "big")]
        let header = size | 0x80;
        (size <= 0x7F).then(|| [&[header as u8][..], &body].concat())
    }

    fn body(&self, short: bool) -> Vec<u8> {
        let mut body = Vec::new();
        let can_be_short = self.scale <= 0x3F && (-64..=63).contains(&self.weight);
        if short && can_be_short {
            let mut header = 0x8000u16 | (self.scale << 7) | (self.weight as u16 & 0x3F);
            if self.weight < 0 {
                header |= 0x0040;
            }
            if self.negative {
                header |= 0x2000;
            }
            body.extend(header.to_ne_bytes());
        } else {
            let sign = if self.negative { 0x4000u16 } else { 0 };
            body.extend((sign | (self.scale & 0x3FFF)).to_ne_bytes());
            body.extend(self.weight.to_ne_bytes());
        }
        for digit in &self.digits {
            body.extend(digit.to_ne_bytes());
        }
        body
    }

    /// What numeric_out prints.
    pub fn text(&self) -> String {
        let mut text = String::new();
        if self.negative && !self.digits.is_empty() {
            text.push('-');
        }
        let digit = |i: i32| if i >= 0 { self.digits.get(i as usize).copied().unwrap_or(0) } else { 0 };
        if self.weight < 0 {
            text.push('0');
        } else {
            text.push_str(&digit(0).to_string());
            for i in 1..=i32::from(self.weight) {
                text.push_str(&format!("{:04}", digit(i)));
            }
        }
        if self.scale > 0 {
            text.push('.');
            let mut fraction = String::new();
            // Digit i weighs 10000^(weight - i); under a negative weight, those before the
            // first digit are zeros.
            let mut i = i32::from(self.weight) + 1;
            while fraction.len() < self.scale as usize {
                fraction.push_str(&format!("{:04}", digit(i)));
                i += 1;
            }
            fraction.truncate(self.scale as usize);
            text.push_str(&fraction);
        }
        text
    }
}

/// A 4-byte varlena header (little- or big-endian, as VARSIZE_4B reads it) and the body.
pub fn varlena(body: &[u8]) -> Vec<u8> {
    let size = (body.len() + 4) as u32;
    #[cfg(target_endian = "little")]
    let header = size << 2;
    #[cfg(target_endian = "big")]
    let header = size;
    let mut out = header.to_ne_bytes().to_vec();
    out.extend(body);
    out
}

/// A jsonb value built by the test, in the forms the reader tells apart.
#[derive(Debug, Clone)]
pub enum Json {
    Null,
    Bool(bool),
    String(String),
    Number(Numeric),
    Object(Vec<(String, Json)>),
}

const JB_FOBJECT: u32 = 0x2000_0000;
const JENTRY_HAS_OFF: u32 = 0x8000_0000;
const JB_OFFSET_STRIDE: usize = 32;

fn pad(buffer: &mut Vec<u8>) -> usize {
    let padding = (4 - buffer.len() % 4) % 4;
    buffer.extend(std::iter::repeat_n(0, padding));
    padding
}

/// An object's container as convertJsonbObject writes it: keys sorted by length, then bytes,
/// the last of equal keys kept; each JEntry a length, or every 32nd an end offset.
pub fn encode_object(pairs: &[(String, Json)]) -> Vec<u8> {
    let mut pairs: Vec<(String, Json)> = pairs.to_vec();
    pairs.reverse();
    pairs.sort_by(|a, b| (a.0.len(), a.0.as_bytes()).cmp(&(b.0.len(), b.0.as_bytes())));
    pairs.dedup_by(|later, earlier| later.0 == earlier.0);
    let n = pairs.len();
    let mut out = (n as u32 | JB_FOBJECT).to_ne_bytes().to_vec();
    let entries_at = out.len();
    out.resize(entries_at + 8 * n, 0);
    let mut total = 0usize;
    let mut put = |out: &mut Vec<u8>, index: usize, kind: u32, len: usize| {
        total += len;
        let entry = if index.is_multiple_of(JB_OFFSET_STRIDE) {
            kind | total as u32 | JENTRY_HAS_OFF
        } else {
            kind | len as u32
        };
        out[entries_at + 4 * index..entries_at + 4 * index + 4].copy_from_slice(&entry.to_ne_bytes());
    };
    for (i, (key, _)) in pairs.iter().enumerate() {
        out.extend(key.as_bytes());
        put(&mut out, i, 0, key.len());
    }
    for (i, (_, value)) in pairs.iter().enumerate() {
        let (kind, len) = match value {
            Json::Null => (0x4000_0000, 0),
            Json::Bool(false) => (0x2000_0000, 0),
            Json::Bool(true) => (0x3000_0000, 0),
            Json::String(s) => {
                out.extend(s.as_bytes());
                (0, s.len())
            }
            Json::Number(n) => {
                let padding = pad(&mut out);
                let bytes = n.encode(true);
                out.extend(&bytes);
                (0x1000_0000, padding + bytes.len())
            }
            Json::Object(members) => {
                let padding = pad(&mut out);
                let bytes = encode_object(members);
                out.extend(&bytes);
                (0x5000_0000, padding + bytes.len())
            }
        };
        put(&mut out, n + i, kind, len);
    }
    out
}

/// The pairs encode_object keeps, in the order it stores them.
pub fn stored_order(pairs: &[(String, Json)]) -> Vec<(String, Json)> {
    let mut pairs: Vec<(String, Json)> = pairs.to_vec();
    pairs.reverse();
    pairs.sort_by(|a, b| (a.0.len(), a.0.as_bytes()).cmp(&(b.0.len(), b.0.as_bytes())));
    pairs.dedup_by(|later, earlier| later.0 == earlier.0);
    pairs
}

/// The inverse of join_parts: split at unescaped '|', unescape.
pub fn split_parts(key: &str) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut chars = key.chars();
    while let Some(ch) = chars.next() {
        match ch {
            '\\' => parts.last_mut().unwrap().push(chars.next().expect("an escape escapes something")),
            '|' => parts.push(String::new()),
            _ => parts.last_mut().unwrap().push(ch),
        }
    }
    parts
}

/// The key_digest input, rebuilt from its documented construction.
pub fn digest_input(scope: &str, key: &str) -> Vec<u8> {
    let mut input = (scope.len() as u64).to_be_bytes().to_vec();
    input.extend(scope.as_bytes());
    input.extend(key.as_bytes());
    input
}
