//! Random cases: a table shape, a ledger shape, privileges, and the steps run against them.

use crate::rng::Rng;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Int2,
    Int4,
    Int8,
    Numeric,
    /// numeric(precision, scale)
    NumericTm(u8, u8),
    Text,
    Varchar(u8),
    Char(u8),
    Bool,
    Timestamptz,
    /// timestamp(precision)
    Timestamp(u8),
    Date,
    Uuid,
    Jsonb,
    Json,
    Bit(u8),
    /// Types whose cast from text is not their input function: regclass's takes no OID,
    /// "char"'s takes the first byte where the input reads an octal escape.
    Regclass,
    QuotedChar,
    /// An interval with fields, whose input reads '1' by them: a year, or a second.
    IntervalYear,
    IntervalSecond0,
}

#[derive(Clone, Debug)]
pub struct Column {
    pub name: String,
    /// The declaration after the name: type, collation, constraints, default.
    pub decl: String,
    pub kind: Kind,
    /// A GENERATED ALWAYS identity or a stored generated column: the statement refuses any
    /// value but DEFAULT (428C9).
    pub always: bool,
}

/// One JSON value and the text a hand-written literal of it holds (None: SQL NULL).
#[derive(Clone, Debug)]
pub struct Value {
    pub json: String,
    pub text: Option<String>,
}

fn string(s: impl AsRef<str>) -> Value {
    let s = s.as_ref();
    let mut json = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => json.push_str("\\\""),
            '\\' => json.push_str("\\\\"),
            c if (c as u32) < 0x20 => json.push_str(&format!("\\u{:04x}", c as u32)),
            c => json.push(c),
        }
    }
    json.push('"');
    Value { json, text: Some(s.to_string()) }
}

/// A JSON number or boolean, written as jsonb prints it, so its text is its literal.
fn bare(s: impl AsRef<str>) -> Value {
    let s = s.as_ref();
    Value { json: s.to_string(), text: Some(s.to_string()) }
}

fn null() -> Value {
    Value { json: "null".into(), text: None }
}

fn number(n: i64) -> Value {
    bare(n.to_string())
}

/// A value the column takes (or, for strings of the right kind, usually takes).
pub fn valid(kind: Kind, rng: &mut Rng) -> Value {
    match kind {
        Kind::Int2 | Kind::Int4 | Kind::Int8 => {
            let n = rng.below(9) + 1;
            if rng.chance(20) {
                string(n.to_string())
            } else {
                number(n as i64)
            }
        }
        Kind::Numeric => bare(rng.pick(&["1", "2.5", "2.50", "-3.125", "0.000001", "12345678901234567890.5"])),
        Kind::NumericTm(p, s) => {
            let whole = 10u64.pow(u32::from(p - s).min(6)) - 1;
            let frac = if s > 0 { format!(".{}", "4".repeat(s as usize)) } else { String::new() };
            bare(format!("{}{frac}", rng.below(whole as usize + 1)))
        }
        Kind::Text => {
            string(rng.pick(&["a", "A", "b", "ß", "SS", "x'y", "back\\slash", "", "😀", "line\nbreak", "ümlaut"]))
        }
        Kind::Varchar(n) | Kind::Char(n) => string(&"abcdefgh"[..rng.below(n as usize + 1).min(8)]),
        Kind::Bool => rng.pick(&[bare("true"), bare("false"), string("t"), string("no")]).clone(),
        Kind::Timestamptz => string(rng.pick(&[
            "2024-01-02 03:04:05+02",
            "2024-06-30 23:59:59.5+00",
            "1999-12-31 00:00:00-08",
            "infinity",
        ])),
        Kind::Timestamp(_) => string(rng.pick(&[
            "2024-01-02 03:04:05",
            "2024-06-30 23:59:59.123456",
            "-infinity",
            "2000-02-29 12:00:00.5",
        ])),
        Kind::Date => string(rng.pick(&["2024-02-29", "2024-01-01", "1970-01-01", "infinity"])),
        Kind::Uuid => string(rng.pick(&[
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
            "{00000000-0000-0000-0000-000000000001}",
        ])),
        Kind::Jsonb | Kind::Json => {
            let json = rng.pick(&["{\"a\": 1}", "[1, \"two\", null]", "\"s\"", "3.0", "{}", "true"]).to_string();
            Value { text: Some(json.clone()), json }
        }
        Kind::Bit(n) => string(&"1011010101"[..n as usize]),
        Kind::Regclass => string(rng.pick(&["pg_class", "1259", "pg_catalog.pg_type", "\"pg_proc\""])),
        Kind::QuotedChar => string(rng.pick(&["a", "Z", "\\101", "\\", ""])),
        Kind::IntervalYear | Kind::IntervalSecond0 => {
            string(rng.pick(&["1", "2 years 3 months", "1 day 02:03:04.567", "00:01:02.5", "-1", "7"]))
        }
    }
}

/// A value at or past the edge of the column's type: out of range, too long, near the
/// typmod, of another JSON type, or JSON null.
pub fn wild(kind: Kind, rng: &mut Rng) -> Value {
    if rng.chance(15) {
        return null();
    }
    let common = [bare("true"), bare("1.5"), string("abc"), string(" 7 "), bare("-0.0")];
    if rng.chance(15) {
        return rng.pick(&common).clone();
    }
    match kind {
        Kind::Int2 => bare(rng.pick(&["32767", "32768", "-32769", "1e2", "7.0"])),
        Kind::Int4 => bare(rng.pick(&["2147483647", "2147483648", "-2147483649", "1e9", "3.5"])),
        Kind::Int8 => bare(rng.pick(&["9223372036854775807", "9223372036854775808", "-9223372036854775809", "12.0"])),
        Kind::Numeric => string(rng.pick(&["NaN", "Infinity", "-Infinity", "1e400", "+5", "1_000"])),
        Kind::NumericTm(p, s) => {
            let edge = "9".repeat((p - s) as usize);
            let frac = "9".repeat(s as usize + 1);
            rng.pick(&[
                bare(format!("{edge}.{frac}")),
                bare(format!("1{edge}")),
                bare(format!("-{edge}")),
                string("NaN"),
            ])
        }
        Kind::Text => {
            let long = "long".repeat(600);
            rng.pick(&[
                bare("12.50"),
                Value { json: "{\"n\": [1, 2]}".into(), text: Some("{\"n\": [1, 2]}".into()) },
                string(&long),
                string("\u{1}"),
            ])
        }
        Kind::Varchar(n) | Kind::Char(n) => {
            let n = n as usize;
            rng.pick(&[
                string("x".repeat(n + 1)),
                string(format!("{}   ", "y".repeat(n))),
                string("é".repeat(n)),
                string("é".repeat(n + 1)),
            ])
        }
        Kind::Bool => rng.pick(&[string("maybe"), bare("1"), bare("2"), string("YES"), string(" off ")]),
        Kind::Timestamptz | Kind::Timestamp(_) => string(rng.pick(&[
            "2024-02-30 00:00:00",
            "2024-01-02 03:04:05.9999999",
            "294277-01-01 00:00:00",
            "2024-01-02T03:04:05Z",
            "epoch",
        ])),
        Kind::Date => string(rng.pick(&["2023-02-29", "5874898-01-01", "5874897-12-31", "epoch", "20240101"])),
        Kind::Uuid => {
            string(rng.pick(&["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1", "not-a-uuid", "a0eebc999c0b4ef8bb6d6bb9bd380a11"]))
        }
        Kind::Jsonb | Kind::Json => string("a string, not an object"),
        Kind::Bit(n) => {
            rng.pick(&[string("1".repeat(n as usize + 1)), string("12"), string("0".repeat(n as usize - 1))])
        }
        Kind::Regclass => string(rng.pick(&["no_such_table", "4294967296", "pg_class pg_type", "-1", "0"])),
        Kind::QuotedChar => string(rng.pick(&["ab", "\\1", "\\400", "é"])),
        Kind::IntervalYear | Kind::IntervalSecond0 => {
            string(rng.pick(&["abc", "178000000 years", "1 century", "P1Y2M", "1.5"]))
        }
    }
}

/// The version to write, around the stored ones so that both newer and stale writes occur.
pub fn version(kind: Kind, rng: &mut Rng) -> Value {
    let n = rng.below(6) as i64 + 1;
    match kind {
        Kind::Int2 | Kind::Int4 | Kind::Int8 => number(n),
        Kind::Numeric => bare(format!("{n}.{}", rng.below(3) * 5)),
        // Past the typmod, rounding down as often as up: a version that rounds down to the
        // stored one is newer than it before the rounding, and the statement applies it.
        Kind::NumericTm(..) => bare(rng.pick(&[n.to_string(), format!("{n}.4"), format!("{n}.45"), format!("{n}.6")])),
        Kind::Text | Kind::Varchar(_) | Kind::Char(_) => string(format!("v{n}")),
        Kind::Timestamptz => string(format!("2024-01-0{n} 00:00:00.5+00")),
        Kind::Timestamp(_) => string(format!(
            "2024-01-0{n} 00:00:00.{}",
            rng.pick(&["5", "55", "554", "5549", "555", "55555", "1234567"])
        )),
        Kind::Date => string(format!("2024-01-0{n}")),
        _ => number(n),
    }
}

/// A key value: a small pool, so that writes find rows and collide.
pub fn key(kind: Kind, rng: &mut Rng) -> Value {
    match kind {
        Kind::Int2 | Kind::Int4 | Kind::Int8 => {
            let n = rng.below(5) as i64 + 1;
            if rng.chance(15) {
                string(n.to_string())
            } else {
                number(n)
            }
        }
        Kind::Numeric | Kind::NumericTm(..) => bare(rng.pick(&["1", "2", "2.50", "3"])),
        Kind::Text | Kind::Varchar(_) | Kind::Char(_) => string(rng.pick(&["a", "A", "b", "ß", "ss", "c "])),
        Kind::Date => string(rng.pick(&["2024-01-01", "2024-01-02", "2024-01-03"])),
        _ => valid(kind, rng),
    }
}

/// The table every case writes to, t.tab.
#[derive(Clone, Debug)]
pub struct Table {
    /// The primary key's columns.
    pub pk: Vec<Column>,
    /// The alternate key column, and whether a plain unique index makes it a key the
    /// versioned update accepts.
    pub code: Option<(Column, bool)>,
    pub version: Column,
    /// Columns neither key nor version.
    pub others: Vec<Column>,
    /// CREATE statements after the CREATE TABLE: indexes, constraints, ALTERs.
    pub after: Vec<String>,
}

fn column(name: &str, kind: Kind, decl: String) -> Column {
    Column { name: name.into(), decl, kind, always: false }
}

fn type_name(kind: Kind) -> String {
    match kind {
        Kind::Int2 => "int2".into(),
        Kind::Int4 => "int4".into(),
        Kind::Int8 => "int8".into(),
        Kind::Numeric => "numeric".into(),
        Kind::NumericTm(p, s) => format!("numeric({p},{s})"),
        Kind::Text => "text".into(),
        Kind::Varchar(n) => format!("varchar({n})"),
        Kind::Char(n) => format!("char({n})"),
        Kind::Bool => "boolean".into(),
        Kind::Timestamptz => "timestamptz".into(),
        Kind::Timestamp(p) => format!("timestamp({p})"),
        Kind::Date => "date".into(),
        Kind::Uuid => "uuid".into(),
        Kind::Jsonb => "jsonb".into(),
        Kind::Json => "json".into(),
        Kind::Bit(n) => format!("bit({n})"),
        Kind::Regclass => "regclass".into(),
        Kind::QuotedChar => "\"char\"".into(),
        Kind::IntervalYear => "interval year".into(),
        Kind::IntervalSecond0 => "interval minute to second(0)".into(),
    }
}

const COLLATIONS: [&str; 4] = ["\"C\"", "\"und-x-icu\"", "public.ci", "\"default\""];

/// Domains every case may use; created in schema t, so each case starts without them.
pub const DOMAINS: &str = "CREATE DOMAIN t.posint AS int4 CHECK (VALUE > 0);
CREATE DOMAIN t.short_nn AS varchar(4) NOT NULL CHECK (VALUE <> 'bad');
CREATE DOMAIN t.money2 AS numeric(8,2) CHECK (VALUE >= 0);
CREATE DOMAIN t.ver AS int8";

fn payload_kind(rng: &mut Rng) -> Kind {
    rng.pick(&[
        Kind::Int2,
        Kind::Int4,
        Kind::Int8,
        Kind::Numeric,
        Kind::NumericTm(6, 2),
        Kind::NumericTm(3, 0),
        Kind::Text,
        Kind::Varchar(3),
        Kind::Char(2),
        Kind::Bool,
        Kind::Timestamptz,
        Kind::Timestamp(0),
        Kind::Timestamp(3),
        Kind::Date,
        Kind::Uuid,
        Kind::Jsonb,
        Kind::Json,
        Kind::Bit(3),
        Kind::Regclass,
        Kind::QuotedChar,
        Kind::IntervalYear,
        Kind::IntervalSecond0,
    ])
}

/// A constant default of the kind, as SQL.
fn default_of(kind: Kind) -> &'static str {
    match kind {
        Kind::Int2 | Kind::Int4 | Kind::Int8 | Kind::Numeric | Kind::NumericTm(..) => "7",
        Kind::Text | Kind::Varchar(_) | Kind::Char(_) => "'d'",
        Kind::Bool => "true",
        Kind::Timestamptz | Kind::Timestamp(_) => "'2020-01-01 00:00:00'",
        Kind::Date => "'2020-01-01'",
        Kind::Uuid => "'00000000-0000-0000-0000-0000000000dd'",
        Kind::Jsonb | Kind::Json => "'{\"d\": true}'",
        Kind::Bit(_) => "B'000'",
        Kind::Regclass => "'pg_class'",
        Kind::QuotedChar => "'d'",
        Kind::IntervalYear | Kind::IntervalSecond0 => "'1'",
    }
}

/// A CHECK that some values of the kind fail.
fn check_of(name: &str, kind: Kind) -> Option<String> {
    Some(match kind {
        Kind::Int2 | Kind::Int4 | Kind::Int8 | Kind::Numeric | Kind::NumericTm(..) => format!("CHECK ({name} <> 3)"),
        Kind::Text | Kind::Varchar(_) | Kind::Char(_) => format!("CHECK ({name} <> 'b')"),
        Kind::Bool => format!("CHECK ({name} OR {name} IS NULL)"),
        Kind::Date => format!("CHECK ({name} > '2000-01-01')"),
        _ => return None,
    })
}

impl Table {
    pub fn generate(rng: &mut Rng) -> Table {
        let mut after = Vec::new();
        let pk = match rng.below(12) {
            0 => vec![column("id", Kind::Int8, "int8 GENERATED ALWAYS AS IDENTITY".into())],
            1 => vec![column("id", Kind::Int4, "int4 GENERATED BY DEFAULT AS IDENTITY".into())],
            2 => vec![
                column("id", Kind::Int4, "int4".into()),
                column("part", Kind::Text, format!("text COLLATE {}", rng.pick(&COLLATIONS))),
            ],
            3 => vec![column("id", Kind::Text, format!("text COLLATE {}", rng.pick(&COLLATIONS)))],
            4 => vec![column("id", Kind::Varchar(2), "varchar(2)".into())],
            5 => vec![column("id", Kind::Numeric, "numeric".into())],
            6 => vec![column("id", Kind::Date, "date".into())],
            7 => vec![column("id", Kind::Int2, "t.posint".into()).with_kind(Kind::Int4)],
            8 => vec![column("id", Kind::Regclass, "regclass".into())],
            // Keys read by their fields ('1' is a year, '00:01:02.5' no year at all), so that
            // different inputs collide.
            9 => vec![column("id", Kind::IntervalYear, String::new())],
            10 => vec![column("id", Kind::IntervalSecond0, String::new())],
            _ => vec![column("id", rng.pick(&[Kind::Int2, Kind::Int4, Kind::Int8]), String::new())],
        };
        let pk: Vec<Column> = pk
            .into_iter()
            .map(|mut c| {
                if c.decl.is_empty() {
                    c.decl = type_name(c.kind);
                }
                c.always = c.decl.contains("ALWAYS");
                c
            })
            .collect();
        let code = rng.chance(60).then(|| {
            let kind = rng.pick(&[Kind::Text, Kind::Varchar(5)]);
            let collation = rng.pick(&COLLATIONS);
            let c = column("code", kind, format!("{} COLLATE {collation}", type_name(kind)));
            // (the index or constraint, whether a versioned update may name code as its key:
            // only a plain, immediate unique index makes it one).
            let other = rng.pick(&COLLATIONS);
            let variants = [
                ("ALTER TABLE t.tab ADD CONSTRAINT tab_code_key UNIQUE (code)".to_string(), true),
                (format!("CREATE UNIQUE INDEX tab_code_coll ON t.tab (code COLLATE {other})"), true),
                // Case-insensitive: 'a' and 'A' are one key to the index and two to the column.
                ("CREATE UNIQUE INDEX tab_code_ci ON t.tab (code COLLATE public.ci)".into(), true),
                ("CREATE UNIQUE INDEX tab_code_partial ON t.tab (code) WHERE code <> 'a'".into(), false),
                ("CREATE UNIQUE INDEX tab_code_expr ON t.tab (lower(code))".into(), false),
                ("ALTER TABLE t.tab ADD CONSTRAINT tab_code_excl EXCLUDE USING btree (code WITH =)".into(), false),
                (
                    "ALTER TABLE t.tab ADD CONSTRAINT tab_code_key UNIQUE (code) DEFERRABLE INITIALLY IMMEDIATE".into(),
                    false,
                ),
            ];
            let keyable = match variants.get(rng.below(variants.len() + 1)) {
                Some((sql, keyable)) => {
                    after.push(sql.clone());
                    *keyable
                }
                None => false,
            };
            (c, keyable)
        });
        let version = match rng.below(12) {
            0 => column("version", Kind::Int8, "t.ver".into()),
            1 => column("version", Kind::Int4, "t.posint".into()),
            2 => column("version", Kind::NumericTm(10, 0), "numeric(10,0)".into()),
            3 => column("version", Kind::Timestamp(2), "timestamp(2)".into()),
            4 => column("version", Kind::Int8, "int8 NOT NULL DEFAULT 0".into()),
            5 => column("version", Kind::Text, format!("text COLLATE {}", rng.pick(&COLLATIONS))),
            6 => column("version", Kind::Numeric, "numeric".into()),
            7 => column("version", Kind::Timestamptz, "timestamptz".into()),
            8 => column("version", Kind::Date, "date".into()),
            9 => column("version", Kind::Int2, "int2".into()),
            _ => column("version", Kind::Int4, "int4".into()),
        };
        let mut others = Vec::new();
        for i in 0..rng.below(4) + 1 {
            let name = format!("c{i}");
            let (kind, mut decl) = match rng.below(10) {
                0 => (Kind::Int4, "t.posint".to_string()),
                1 => (Kind::Varchar(4), "t.short_nn".to_string()),
                2 => (Kind::NumericTm(8, 2), "t.money2".to_string()),
                _ => {
                    let kind = payload_kind(rng);
                    (kind, type_name(kind))
                }
            };
            if matches!(kind, Kind::Text | Kind::Varchar(_)) && rng.chance(30) {
                decl.push_str(&format!(" COLLATE {}", rng.pick(&COLLATIONS)));
            }
            if rng.chance(20) {
                decl.push_str(" NOT NULL");
            }
            if rng.chance(25) {
                decl.push_str(&format!(" DEFAULT {}", default_of(kind)));
            }
            if rng.chance(25) {
                if let Some(check) = check_of(&name, kind) {
                    decl.push(' ');
                    decl.push_str(&check);
                }
            }
            others.push(column(&name, kind, decl));
        }
        match rng.below(8) {
            0 => others.push(Column {
                always: true,
                ..column("gen", Kind::Bool, "boolean GENERATED ALWAYS AS (version IS NULL) STORED".into())
            }),
            1 => others
                .push(Column { always: true, ..column("seq", Kind::Int4, "int4 GENERATED ALWAYS AS IDENTITY".into()) }),
            2 => others.push(column("seq", Kind::Int8, "int8 GENERATED BY DEFAULT AS IDENTITY".into())),
            _ => {}
        }
        if rng.chance(30) {
            after.push("ALTER TABLE t.tab DROP COLUMN dropped".into());
        }
        if rng.chance(20) {
            after.push(
                "ALTER TABLE t.tab ADD CONSTRAINT tab_check CHECK (version IS NULL OR version::text <> '4')".into(),
            );
        }
        Table { pk, code, version, others, after }
    }

    /// The CREATE TABLE, with a column to drop afterwards (dropped columns leave holes the
    /// direct path must skip).
    pub fn create(&self) -> String {
        let mut columns: Vec<String> = self.pk.iter().map(|c| format!("{} {}", c.name, c.decl)).collect();
        columns.push("dropped int DEFAULT 5".into());
        if let Some((c, _)) = &self.code {
            columns.push(format!("{} {}", c.name, c.decl));
        }
        columns.push(format!("{} {}", self.version.name, self.version.decl));
        columns.extend(self.others.iter().map(|c| format!("{} {}", c.name, c.decl)));
        let pk: Vec<&str> = self.pk.iter().map(|c| c.name.as_str()).collect();
        columns.push(format!("PRIMARY KEY ({})", pk.join(", ")));
        format!("CREATE TABLE t.tab ({}) WITH (autovacuum_enabled = off)", columns.join(", "))
    }

    /// The statements that fill the table before the steps: each its own statement, so a
    /// row one of the constraints refuses only loses that row.
    pub fn rows(&self, rng: &mut Rng) -> Vec<String> {
        let overriding = if self.pk[0].decl.contains("ALWAYS") { " OVERRIDING SYSTEM VALUE" } else { "" };
        (0..rng.below(5))
            .map(|_| {
                let mut names = Vec::new();
                let mut values = Vec::new();
                for c in &self.pk {
                    names.push(c.name.clone());
                    values.push(literal(&key(c.kind, rng)));
                }
                if let Some((c, _)) = &self.code {
                    names.push(c.name.clone());
                    values.push(literal(&key(c.kind, rng)));
                }
                names.push("version".into());
                values.push(if rng.chance(20) { "NULL".into() } else { literal(&version(self.version.kind, rng)) });
                for c in self.others.iter().filter(|c| !c.always) {
                    names.push(c.name.clone());
                    values.push(literal(&valid(c.kind, rng)));
                }
                format!("INSERT INTO t.tab ({}){overriding} VALUES ({})", names.join(", "), values.join(", "))
            })
            .collect()
    }
}

impl Column {
    fn with_kind(mut self, kind: Kind) -> Column {
        self.kind = kind;
        self
    }
}

/// An untyped SQL literal holding the value's text.
pub fn literal(value: &Value) -> String {
    match &value.text {
        None => "NULL".into(),
        Some(text) => quote_literal(text),
    }
}

pub fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// A JSON object from members already written as JSON.
pub fn object(members: &[(String, Value)]) -> String {
    let inner: Vec<String> = members.iter().map(|(k, v)| format!("{}: {}", string(k).json, v.json)).collect();
    format!("{{{}}}", inner.join(", "))
}

#[derive(Clone, Debug)]
pub enum Op {
    Claim {
        key: String,
        scope: String,
        payload: Option<String>,
    },
    ClaimMany {
        keys: Vec<String>,
        scope: String,
    },
    Update {
        key: String,
        changes: String,
    },
    Upsert {
        row: String,
    },
    /// Messages through the outbox, in one transaction: after a new claim of `claim` (key,
    /// scope) each gets the id derived from it, or each the id of its own `key =>`.
    Send {
        claim: Option<(String, String)>,
        messages: Vec<Message>,
    },
    /// idem_watermark_advance(stream, partition, pos): a text partition, or a numbered one
    /// when `numbered`; `pos` a whole number's text (the function refuses others, where the
    /// hand-written statements have no rule to compare with).
    Advance {
        stream: String,
        partition: String,
        numbered: bool,
        pos: String,
    },
    /// A read in a concurrent case: it takes predicate locks, and takes the snapshot.
    Read(String),
    /// New claims `warm-{prefix}-1` … `warm-{prefix}-{count}`: the first step of a sequential
    /// case, or a transaction of its own before a concurrent case begins. A session that has
    /// made many new claims is the one a heuristic might treat differently (0.1.0 stopped
    /// checking for a duplicate after 16).
    Warm {
        prefix: String,
        count: u32,
    },
    Begin,
    Commit,
}

/// One idem_send. Its topic, ordering key and payload are a function of its id (the claim
/// and position, or its key), so a repeat is the same message, which the statement it stands
/// for cannot tell apart from a new one; headers vary freely (the first ones stay).
#[derive(Clone, Debug)]
pub struct Message {
    pub key: Option<String>,
    pub topic: String,
    pub ordering_key: Option<String>,
    pub payload: String,
    pub headers: Option<String>,
}

#[derive(Clone, Debug)]
pub struct Step {
    /// 0 for the one session of a sequential case; 1 or 2 in a concurrent case.
    pub session: u8,
    /// Run as the limited role diff_app instead of the superuser.
    pub limited: bool,
    pub op: Op,
}

#[derive(Clone, Debug)]
pub struct Case {
    pub seed: u64,
    pub index: u64,
    /// Superuser statements run the same way in each database after its reset.
    pub setup: Vec<String>,
    /// Whether the ledger's or the outbox's definition changed, so the reset must recreate
    /// the extension.
    pub ledger_changed: bool,
    pub concurrent: bool,
    pub steps: Vec<Step>,
}

/// Ledger variations, each a change a DBA may make (README, "Extending the ledger").
const LEDGER_CHANGES: [&str; 11] = [
    // The ledger in time buckets (#13): claims go into the current one, after a search of
    // every table under the key's lock.
    "BEGIN; SET LOCAL idempotency.ledger_buckets_from = 0; SELECT idempotency.maintain_ledger_buckets(); COMMIT",
    "CREATE UNIQUE INDEX ledger_extra ON idempotency.ledger (key_digest)",
    "ALTER TABLE idempotency.ledger ALTER claimed_at SET DEFAULT '2001-02-03 04:05:06+00'",
    "ALTER TABLE idempotency.ledger ALTER claimed_at SET DEFAULT now()",
    "ALTER TABLE idempotency.ledger ALTER fingerprint SET DEFAULT '00000000-0000-0000-0000-0000000000ff'",
    "ALTER TABLE idempotency.ledger ALTER result SET DEFAULT '{\"d\": 1}'",
    "ALTER TABLE idempotency.ledger ADD COLUMN note text DEFAULT 'n'",
    "ALTER TABLE idempotency.ledger DROP CONSTRAINT ledger_pkey, ADD CONSTRAINT ledger_key UNIQUE (key_digest)",
    "ALTER TABLE idempotency.ledger DROP CONSTRAINT ledger_pkey",
    "ALTER TABLE idempotency.ledger ADD CONSTRAINT ledger_tableoid CHECK (tableoid <> 0)",
    "CREATE UNIQUE INDEX ledger_partial ON idempotency.ledger (key_digest) WHERE scope_id <> 0",
];

/// What diff_app may do with the ledger.
const LEDGER_GRANTS: [&str; 4] = [
    "GRANT SELECT, INSERT ON idempotency.ledger TO diff_app",
    "GRANT INSERT ON idempotency.ledger TO diff_app",
    "GRANT SELECT (key_digest), INSERT (key_digest, scope_id) ON idempotency.ledger TO diff_app",
    "GRANT SELECT ON idempotency.ledger TO diff_app",
];

/// Outbox variations a DBA may make: an index to search by, a changed or added default, an
/// extra column, the primary key swapped or dropped (the statement's 42P10), constraints.
const OUTBOX_CHANGES: [&str; 12] = [
    "CREATE INDEX outbox_topic ON idempotency.outbox (topic, created_at)",
    "CREATE UNIQUE INDEX outbox_extra ON idempotency.outbox (id)",
    "CREATE UNIQUE INDEX outbox_one_per_topic ON idempotency.outbox (topic) WHERE ordering_key IS NULL",
    "ALTER TABLE idempotency.outbox ALTER created_at SET DEFAULT '2001-02-03 04:05:06+00'",
    "ALTER TABLE idempotency.outbox ALTER attempts SET DEFAULT 3",
    "ALTER TABLE idempotency.outbox ALTER retry_at SET DEFAULT now()",
    "ALTER TABLE idempotency.outbox ADD COLUMN tenant text DEFAULT 'n'",
    "ALTER TABLE idempotency.outbox DROP CONSTRAINT outbox_pkey, ADD CONSTRAINT outbox_key UNIQUE (id)",
    "ALTER TABLE idempotency.outbox DROP CONSTRAINT outbox_pkey",
    "ALTER TABLE idempotency.outbox ADD CONSTRAINT outbox_short CHECK (length(topic) < 12 AND tableoid <> 0)",
    "DROP INDEX idempotency.outbox_pending",
    "ALTER SEQUENCE idempotency.outbox_seq INCREMENT 7 MAXVALUE 30",
];

/// Watermark variations a DBA may make: an index on the position (so no update is HOT), a
/// CHECK it can break, NOT NULL dropped and a NULL stored, an extra column, a new default,
/// the key's columns swapped or their collation changed, a changed type or typmod, a trigger,
/// row-level security, a second unique index, a publication whose row filter or missing
/// replica identity forbids updates.
const WATERMARK_CHANGES: [&str; 15] = [
    "CREATE INDEX watermarks_position ON idempotency.watermarks (position)",
    "ALTER TABLE idempotency.watermarks ADD CONSTRAINT watermarks_bounded CHECK (position <> 1000 AND tableoid <> 0)",
    "ALTER TABLE idempotency.watermarks ALTER position DROP NOT NULL; \
     INSERT INTO idempotency.watermarks VALUES ('orders', '2', NULL, '2000-01-01')",
    "ALTER TABLE idempotency.watermarks ADD COLUMN note text DEFAULT 'n'",
    "ALTER TABLE idempotency.watermarks ALTER advanced_at SET DEFAULT '2001-02-03 04:05:06+00'",
    "ALTER TABLE idempotency.watermarks DROP CONSTRAINT watermarks_pkey, \
     ADD CONSTRAINT watermarks_key UNIQUE (partition, stream)",
    "ALTER TABLE idempotency.watermarks ALTER stream TYPE text COLLATE \"default\"",
    "ALTER TABLE idempotency.watermarks ALTER position TYPE int8",
    "ALTER TABLE idempotency.watermarks ALTER position TYPE numeric(30,2)",
    "ALTER TABLE idempotency.watermarks ALTER position TYPE numeric(6,0)",
    "CREATE FUNCTION t.wm_touch() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN NEW.position := NEW.position + 100; \
     RETURN NEW; END$$; CREATE TRIGGER wm_touch BEFORE UPDATE ON idempotency.watermarks \
     FOR EACH ROW EXECUTE FUNCTION t.wm_touch()",
    "ALTER TABLE idempotency.watermarks ENABLE ROW LEVEL SECURITY; \
     CREATE POLICY wm_orders ON idempotency.watermarks USING (stream = 'orders')",
    "CREATE UNIQUE INDEX watermarks_extra ON idempotency.watermarks (stream, partition)",
    "SET client_min_messages = error; DROP PUBLICATION IF EXISTS wm_pub; \
     CREATE PUBLICATION wm_pub FOR TABLE idempotency.watermarks WHERE (position > 0)",
    "SET client_min_messages = error; DROP PUBLICATION IF EXISTS wm_pub; \
     CREATE PUBLICATION wm_pub FOR TABLE idempotency.watermarks; \
     ALTER TABLE idempotency.watermarks REPLICA IDENTITY NOTHING",
];

/// What diff_app may do with the watermarks.
const WATERMARK_GRANTS: [&str; 4] = [
    "GRANT SELECT, INSERT, UPDATE ON idempotency.watermarks TO diff_app",
    "GRANT SELECT (stream, partition, position), INSERT, UPDATE (position, advanced_at) ON idempotency.watermarks TO diff_app",
    "GRANT SELECT, INSERT, UPDATE (position) ON idempotency.watermarks TO diff_app",
    "GRANT INSERT, UPDATE ON idempotency.watermarks TO diff_app",
];

/// What diff_app may do with the outbox and its sequence.
const OUTBOX_GRANTS: [&str; 5] = [
    "GRANT SELECT, INSERT ON idempotency.outbox TO diff_app; GRANT USAGE ON SEQUENCE idempotency.outbox_seq TO diff_app",
    "GRANT INSERT ON idempotency.outbox TO diff_app; GRANT USAGE ON SEQUENCE idempotency.outbox_seq TO diff_app",
    "GRANT SELECT, INSERT ON idempotency.outbox TO diff_app",
    "GRANT SELECT (id), INSERT (seq, id, topic, ordering_key, payload, headers) ON idempotency.outbox TO diff_app; \
     GRANT UPDATE ON SEQUENCE idempotency.outbox_seq TO diff_app",
    "GRANT SELECT (id), INSERT (seq, id, topic, payload) ON idempotency.outbox TO diff_app; \
     GRANT USAGE ON SEQUENCE idempotency.outbox_seq TO diff_app",
];

const CLAIM_KEYS: [&str; 7] = ["k1", "k2", "k3", "K1", "order-42:paid", "ü", ""];
const SCOPES: [&str; 3] = ["default", "billing", "ß"];

fn claim_key(rng: &mut Rng) -> String {
    // Empty keys are refused (22023) by idem_digest and the claim alike; keep them rare.
    if rng.chance(3) {
        String::new()
    } else {
        rng.pick(&CLAIM_KEYS[..6]).to_string()
    }
}

/// The payload a key is claimed with: a function of the key, so that the reference (which
/// never compares fingerprints) and the claim (which raises ID001 on a mismatch) agree.
fn payload_of(key: &str) -> String {
    format!("{{\"key\": {}, \"n\": 1.0}}", string(key).json)
}

impl Case {
    pub fn generate(seed: u64, index: u64) -> Case {
        let mut rng = Rng::for_case(seed, index);
        if rng.chance(15) {
            return Case::concurrent(seed, index, rng);
        }
        let table = Table::generate(&mut rng);
        let mut setup = vec![DOMAINS.to_string(), table.create()];
        setup.extend(table.after.iter().cloned());
        setup.extend(table.rows(&mut rng));
        if rng.chance(25) {
            setup.push("ALTER TABLE t.tab ADD COLUMN late text DEFAULT 'late'".into());
        }
        let mut ledger_changed = false;
        let mut fingerprint_default = false;
        for _ in 0..(if rng.chance(35) { rng.below(2) + 1 } else { 0 }) {
            let change = rng.pick(&LEDGER_CHANGES);
            fingerprint_default |= change.contains("fingerprint");
            ledger_changed = true;
            setup.push(change.to_string());
        }
        let limited = rng.chance(30);
        if limited {
            setup.push("GRANT USAGE ON SCHEMA t, idempotency TO diff_app".into());
            setup.push(rng.pick(&LEDGER_GRANTS).to_string());
            setup.push(table_grants(&table, &mut rng));
        }
        let mut steps: Vec<Step> = (0..rng.below(6) + 2)
            .map(|_| Step {
                session: 0,
                limited: limited && rng.chance(70),
                op: sequential_op(&table, fingerprint_default, &mut rng),
            })
            .collect();
        if rng.chance(25) {
            steps.insert(0, Step { session: 0, limited: false, op: Op::Warm { prefix: "s0".into(), count: 20 } });
        }
        let mut case = Case { seed, index, setup, ledger_changed, concurrent: false, steps };
        case.add_sends(limited);
        case.add_watermarks(limited);
        case
    }

    /// Watermark advances, changes and grants in some sequential cases, from a generator of
    /// their own (as for sends).
    fn add_watermarks(&mut self, limited: bool) {
        let mut rng = Rng::for_case(self.seed ^ 0x776d_6172_6b73, self.index);
        if !rng.chance(35) {
            return;
        }
        self.setup.push(
            "INSERT INTO idempotency.watermarks (stream, partition, position, advanced_at) \
             VALUES ('orders', '0', 5, '2000-01-01'), ('orders', '1', 0, '2000-01-01'), ('ü', 'p', 99999, '2000-01-01')"
                .to_string(),
        );
        let mut changes: Vec<&str> = Vec::new();
        for _ in 0..(if rng.chance(50) { rng.below(2) + 1 } else { 0 }) {
            changes.push(rng.pick(&WATERMARK_CHANGES));
        }
        // A table that refuses every update and a position its type refuses are two errors at
        // once; which one is reported is left out, as for two bad values of a versioned write.
        if changes.iter().any(|c| c.contains("PUBLICATION")) {
            changes.retain(|c| !c.contains(" TYPE "));
        }
        self.ledger_changed |= !changes.is_empty();
        self.setup.extend(changes.into_iter().map(str::to_string));
        if limited {
            self.setup.push(rng.pick(&WATERMARK_GRANTS).to_string());
        }
        for _ in 0..rng.below(6) + 1 {
            let numbered = rng.chance(40);
            let partition = if numbered {
                rng.pick(&["0", "1", "2", "7"]).to_string()
            } else {
                rng.pick(&["0", "1", "2", "p", "P", "ü"]).to_string()
            };
            let pos = match rng.below(10) {
                0 => "18446744073709551616".to_string(),
                1 => "1000".to_string(),
                _ => (rng.below(12)).to_string(),
            };
            let op =
                Op::Advance { stream: rng.pick(&["orders", "Orders", "ü"]).to_string(), partition, numbered, pos };
            let step = Step { session: 0, limited: limited && rng.chance(70), op };
            let at = rng.below(self.steps.len() + 1);
            self.steps.insert(at, step);
        }
    }

    /// Outbox sends, changes and grants in some sequential cases, drawn from a generator of
    /// their own so that the cases without them stay as they were.
    fn add_sends(&mut self, limited: bool) {
        let mut rng = Rng::for_case(self.seed ^ 0x6f75_7462_6f78, self.index);
        if !rng.chance(40) {
            return;
        }
        for _ in 0..(if rng.chance(40) { rng.below(2) + 1 } else { 0 }) {
            self.setup.push(rng.pick(&OUTBOX_CHANGES).to_string());
            self.ledger_changed = true;
        }
        if limited {
            self.setup.push(rng.pick(&OUTBOX_GRANTS).to_string());
        }
        for n in 0..rng.below(4) + 1 {
            let claim = rng.chance(60).then(|| (format!("send-{n}"), rng.pick(&SCOPES).to_string()));
            // Only the messages without a key of their own count after the claim.
            let mut derived = 0;
            let messages = (0..rng.below(3) + 1)
                .map(|_| {
                    let key = match &claim {
                        Some(_) if rng.chance(80) => None,
                        _ => Some(rng.pick(&["m1", "m2", "M1", "ü"]).to_string()),
                    };
                    derived += usize::from(key.is_none());
                    message(key, &claim, derived, &mut rng)
                })
                .collect();
            let step = Step { session: 0, limited: limited && rng.chance(70), op: Op::Send { claim, messages } };
            let at = rng.below(self.steps.len() + 1);
            self.steps.insert(at, step);
        }
    }

    /// Two SERIALIZABLE transactions over overlapping keys and rows. No step ever waits for
    /// the other session: a key or row one open transaction wrote is only read by the other
    /// until the writer ends, so the steps run in order on two connections.
    fn concurrent(seed: u64, index: u64, mut rng: Rng) -> Case {
        let setup = concurrent_setup();
        let mut steps = Vec::new();
        if rng.chance(50) {
            steps.extend([1, 2].map(warm));
        }
        if rng.chance(30) {
            steps.extend(rw_cycle(&mut rng));
            return Case { seed, index, setup, ledger_changed: false, concurrent: true, steps };
        }
        steps.extend([
            Step { session: 1, limited: false, op: Op::Begin },
            Step { session: 2, limited: false, op: Op::Begin },
        ]);
        // Per session: open?, the claim keys and row ids it wrote.
        let mut open = [true, true];
        let mut wrote: [Vec<String>; 2] = [Vec::new(), Vec::new()];
        let keys = ["k1", "k2", "k3"];
        while open.iter().any(|&o| o) {
            let s = if open[0] && open[1] {
                rng.below(2)
            } else if open[0] {
                0
            } else {
                1
            };
            let other = 1 - s;
            let busy = |thing: &String| open[other] && wrote[other].contains(thing);
            let op = match rng.below(9) {
                0 if wrote[s].len() + 1 >= 2 || rng.chance(30) => {
                    open[s] = false;
                    Op::Commit
                }
                1 | 2 => {
                    let key = rng.pick(&keys).to_string();
                    if busy(&key) {
                        Op::Read(read_claim(&key))
                    } else {
                        wrote[s].push(key.clone());
                        Op::Claim { key, scope: "default".into(), payload: None }
                    }
                }
                3 => Op::Read(read_claim(rng.pick(&keys))),
                // A scan of the whole ledger: any row written to it, even one backed out,
                // is then an rw-conflict with the other session.
                8 if rng.chance(50) => Op::Read("SELECT count(*) FROM idempotency.ledger".into()),
                4 | 5 => {
                    let id = (rng.below(4) + 1).to_string();
                    if busy(&id) {
                        Op::Read(format!("SELECT version FROM t.tab WHERE id = {id}"))
                    } else {
                        wrote[s].push(id.clone());
                        let version = rng.below(4) + 1;
                        if rng.chance(50) {
                            Op::Update {
                                key: format!("{{\"id\": {id}}}"),
                                changes: format!("{{\"val\": \"s{s}\", \"version\": {version}}}"),
                            }
                        } else {
                            Op::Upsert { row: format!("{{\"id\": {id}, \"val\": \"u{s}\", \"version\": {version}}}") }
                        }
                    }
                }
                6 => Op::Read("SELECT count(*) FROM t.tab WHERE version > 1".into()),
                _ => Op::Read(format!("SELECT val FROM t.tab WHERE id = {}", rng.below(4) + 1)),
            };
            steps.push(Step { session: s as u8 + 1, limited: false, op });
        }
        Case { seed, index, setup, ledger_changed: false, concurrent: true, steps }
    }
}

/// A message whose topic, ordering key and payload follow from its id's source: its key, or
/// its claim and position.
fn message(key: Option<String>, claim: &Option<(String, String)>, position: usize, rng: &mut Rng) -> Message {
    let source = match (&key, claim) {
        (Some(k), _) => k.clone(),
        (None, Some((k, scope))) => format!("{k}/{scope}/{position}"),
        (None, None) => unreachable!("a derived id needs a claim"),
    };
    let digest = source.bytes().fold(7usize, |h, b| h.wrapping_mul(31).wrapping_add(b as usize));
    let topics = ["orders.paid", "a-much-longer-topic.name", "ü.topic"];
    let keys = [None, Some("order-1"), Some("order-2"), Some("Ω")];
    let payloads = [
        format!("{{\"source\": {}}}", string(&source).json),
        "[1, \"two\", null]".to_string(),
        // Past the TOAST threshold: stored compressed, by the statement and the direct path alike.
        format!("{{\"pad\": \"{}\", \"n\": 1.0}}", "x".repeat(2100)),
    ];
    let headers = [None, Some("{\"trace\": \"abc\"}".to_string()), Some("{}".to_string())];
    Message {
        key,
        topic: topics[digest % topics.len()].to_string(),
        ordering_key: keys[(digest / 3) % keys.len()].map(str::to_string),
        payload: payloads[(digest / 12) % payloads.len()].clone(),
        headers: rng.pick(&headers),
    }
}

/// t.tab with three rows, and k1 already claimed.
fn concurrent_setup() -> Vec<String> {
    vec![
        "CREATE TABLE t.tab (id int4 PRIMARY KEY, val text, version int4) WITH (autovacuum_enabled = off)".to_string(),
        "INSERT INTO t.tab VALUES (1, 'one', 1), (2, 'two', 1), (3, 'three', NULL)".to_string(),
        "INSERT INTO idempotency.ledger (key_digest, scope_id, claimed_at) \
         VALUES (idem_digest('k1', 'default'), idem_scope_id('default'), '2000-01-01')"
            .to_string(),
    ]
}

fn warm(session: u8) -> Step {
    Step { session, limited: false, op: Op::Warm { prefix: format!("s{session}"), count: 20 } }
}

/// The serialization anomaly a duplicate claim must not create: one session scans the ledger
/// while the other claims a key that already exists and reads a row the first then writes. A
/// duplicate claim writes nothing, so the statement path has only one rw-dependency and both
/// commit; a duplicate recorded as a write closes the cycle and one COMMIT fails with 40001.
fn rw_cycle(rng: &mut Rng) -> Vec<Step> {
    let (reader, claimer) = if rng.chance(50) { (1, 2) } else { (2, 1) };
    let step = |session: u8, op: Op| Step { session, limited: false, op };
    let write = if rng.chance(50) {
        Op::Update { key: "{\"id\": 1}".into(), changes: "{\"val\": \"w\", \"version\": 2}".into() }
    } else {
        Op::Upsert { row: "{\"id\": 1, \"val\": \"w\", \"version\": 2}".into() }
    };
    let scan = rng.pick(&[
        "SELECT count(*) FROM idempotency.ledger".to_string(),
        "SELECT count(*) FROM idempotency.ledger WHERE claimed_at > '2001-01-01'".to_string(),
        read_claim("k1"),
    ]);
    let mut steps = vec![
        step(reader, Op::Begin),
        step(claimer, Op::Begin),
        step(reader, Op::Read(scan)),
        step(claimer, Op::Claim { key: "k1".into(), scope: "default".into(), payload: None }),
        step(claimer, Op::Read("SELECT val FROM t.tab WHERE id = 1".into())),
        step(reader, write),
    ];
    let first = if rng.chance(50) { reader } else { claimer };
    steps.push(step(first, Op::Commit));
    steps.push(step(3 - first, Op::Commit));
    steps
}

fn read_claim(key: &str) -> String {
    format!("SELECT count(*) FROM idempotency.ledger WHERE key_digest = idem_digest({}, 'default')", quote_literal(key))
}

/// Column grants on t.tab: some columns readable, some writable, so that some writes are
/// refused for one column only.
fn table_grants(table: &Table, rng: &mut Rng) -> String {
    let mut all: Vec<&Column> = table.pk.iter().collect();
    all.extend(table.code.iter().map(|(c, _)| c));
    all.push(&table.version);
    all.extend(table.others.iter());
    let pick = |rng: &mut Rng| -> Vec<String> {
        all.iter().filter(|_| rng.chance(80)).map(|c| c.name.clone()).collect::<Vec<_>>()
    };
    let mut grants = Vec::new();
    for privilege in ["SELECT", "UPDATE", "INSERT"] {
        let columns = pick(rng);
        if !columns.is_empty() {
            grants.push(format!("GRANT {privilege} ({}) ON t.tab TO diff_app", columns.join(", ")));
        }
    }
    if grants.is_empty() {
        grants.push("GRANT SELECT ON t.tab TO diff_app".into());
    }
    grants.join(";\n")
}

/// A value for a changed column: mostly one it takes, sometimes one at its edge, but at most
/// one edge per call (`wild_left`): which of two refused values is reported first is a
/// separate question, left out here.
fn change_value(c: &Column, rng: &mut Rng, wild_left: &mut bool) -> Value {
    if *wild_left && rng.chance(20) {
        *wild_left = false;
        // Only the domain refuses JSON null for a NOT NULL domain's column: try it often.
        if c.decl.starts_with("t.short_nn") && rng.chance(50) {
            return null();
        }
        wild(c.kind, rng)
    } else {
        valid(c.kind, rng)
    }
}

/// Whether a GENERATED ALWAYS column (refused by the statement with 428C9) may be written:
/// it counts as the call's one refused value.
fn take_always(c: &Column, rng: &mut Rng, wild_left: &mut bool) -> bool {
    if !c.always {
        return rng.chance(50);
    }
    let take = *wild_left && rng.chance(10);
    *wild_left &= !take;
    take
}

fn sequential_op(table: &Table, fingerprint_default: bool, rng: &mut Rng) -> Op {
    let mut wild_left = true;
    match rng.below(20) {
        // A key the warm-up step claims: a duplicate of the kind a warm session makes.
        0 if rng.chance(40) => Op::Claim { key: "warm-s0-1".into(), scope: "default".into(), payload: None },
        0..=4 => {
            let key = claim_key(rng);
            let payload = (!fingerprint_default && rng.chance(40)).then(|| payload_of(&key));
            Op::Claim { key, scope: rng.pick(&SCOPES).to_string(), payload }
        }
        5..=6 => {
            let keys = (0..rng.below(5) + 1).map(|_| rng.pick(&CLAIM_KEYS[..6]).to_string()).collect();
            Op::ClaimMany { keys, scope: rng.pick(&SCOPES).to_string() }
        }
        7..=15 => {
            // By the primary key, or by the alternate key when a plain unique index makes it one.
            let by_code = matches!(&table.code, Some((_, true))) && rng.chance(40);
            let key_columns: Vec<&Column> =
                if by_code { vec![&table.code.as_ref().unwrap().0] } else { table.pk.iter().collect() };
            let key_members: Vec<(String, Value)> =
                key_columns.iter().map(|c| (c.name.clone(), key(c.kind, rng))).collect();
            let mut changeable: Vec<&Column> = table.others.iter().collect();
            if by_code {
                changeable.extend(table.pk.iter());
            } else if let Some((c, _)) = &table.code {
                changeable.push(c);
            }
            changeable.retain(|c| take_always(c, rng, &mut wild_left));
            let mut changes: Vec<(String, Value)> = changeable
                .iter()
                .map(|c| {
                    let value =
                        if key_columns.iter().any(|k| k.name == c.name) || table.pk.iter().any(|k| k.name == c.name) {
                            key(c.kind, rng)
                        } else {
                            change_value(c, rng, &mut wild_left)
                        };
                    (c.name.clone(), value)
                })
                .collect();
            let version = if wild_left && rng.chance(8) {
                wild(table.version.kind, rng)
            } else {
                version(table.version.kind, rng)
            };
            // A NULL version is refused by the function (22004) and not by the statement.
            let version = if version.text.is_none() { number(1) } else { version };
            changes.push(("version".into(), version));
            Op::Update { key: object(&key_members), changes: object(&changes) }
        }
        _ => {
            // An explicit value for a GENERATED ALWAYS primary key is refused (428C9).
            wild_left &= !table.pk.iter().any(|c| c.always);
            let mut row: Vec<(String, Value)> = table.pk.iter().map(|c| (c.name.clone(), key(c.kind, rng))).collect();
            if let Some((c, _)) = &table.code {
                if rng.chance(60) {
                    row.push((c.name.clone(), key(c.kind, rng)));
                }
            }
            for c in &table.others {
                // A NOT NULL domain's column left out is NULL, refused (23502) like a value.
                if c.decl.starts_with("t.short_nn") || take_always(c, rng, &mut wild_left) {
                    row.push((c.name.clone(), change_value(c, rng, &mut wild_left)));
                }
            }
            let version = version(table.version.kind, rng);
            row.push(("version".into(), version));
            Op::Upsert { row: object(&row) }
        }
    }
}
