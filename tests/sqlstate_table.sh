#!/usr/bin/env bash
# README.md's SQLSTATE table (section "Errors") against the raise sites: every SQLSTATE the
# extension raises itself must have a row, and every row's code must be raised somewhere in
# src/ or sql/, unless PostgreSQL raises it (the rows named "PostgreSQL's own", and those in
# RAISED_BY_POSTGRES below). Raise sites: IdemError::new(SqlState::…) with the codes of
# SqlState::code() in src/error.rs; ereport! and ErrorReport::new with a PgSqlErrorCode; RAISE
# EXCEPTION and RAISE WARNING in sql/*.sql (P0001 where no code is given). pgrx's error! (XX000)
# stays out: it marks states no caller can reach. PG_CONFIG's errcodes.txt names the codes.
# Then the check is run on two altered copies of the table, which it must refuse.
# Usage: tests/sqlstate_table.sh [README]   (default README.md)
set -euo pipefail
cd "$(dirname "$0")/.."
errcodes="$("${PG_CONFIG:-pg_config}" --sharedir)/errcodes.txt"
exec python3 - "${1:-README.md}" "$errcodes" <<'PY'
import pathlib, re, sys

readme_path, errcodes_path = sys.argv[1], sys.argv[2]
# Rows whose code PostgreSQL raises on the extension's behalf: 2D000 at the COMMIT between
# idem_purge's batches when it is CALLed inside a transaction block; 42501 from privilege checks
# and row-level security; 40001 from the statement a write runs when its snapshot cannot see the
# row it meets (src/postgres/write.rs, Insert::ToStatement).
RAISED_BY_POSTGRES = {"2D000", "42501", "40001"}

# errcodes.txt: "42P01    E    ERRCODE_UNDEFINED_TABLE    undefined_table".
by_macro, by_condition = {}, {}
for line in pathlib.Path(errcodes_path).read_text().splitlines():
    fields = line.split()
    if len(fields) >= 3 and re.fullmatch(r"[0-9A-Z]{5}", fields[0]):
        by_macro[fields[2]] = fields[0]
        if len(fields) == 4:
            by_condition[fields[3]] = fields[0]


# What the brace count passes over: comments, strings and char literals, whose braces are text.
RUST_TEXT = re.compile(r'//[^\n]*|"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])\'')


def test_modules(text):
    """(start, end) of each module under a cfg(test…) attribute: its errors are expectations."""
    spans = []
    for m in re.finditer(r"^#\[cfg\([^\n]*\btest\b[^\n]*\)\]\n(?:#\[[^\n]*\]\n)*(?:pub )?mod \w+ \{", text, re.M):
        depth, i = 1, m.end()
        while depth and i < len(text):
            skip = RUST_TEXT.match(text, i)
            if skip:
                i = skip.end()
                continue
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        spans.append((m.start(), i))
    return spans


def rust_raises():
    error_rs = pathlib.Path("src/error.rs").read_text()
    variants = dict(re.findall(r'SqlState::(\w+) => b"([0-9A-Z]{5})"', error_rs))
    raises = {}
    for path in sorted(pathlib.Path("src").rglob("*.rs")):
        text = path.read_text()
        tests = test_modules(text)
        sites = [(m.start(), variants[m.group(1)]) for m in re.finditer(r"IdemError::new\(\s*SqlState::(\w+)", text)]
        sites += [(m.start(), by_macro[m.group(1)]) for m in re.finditer(
            r"(?:ereport!\(\s*[\w:]+\s*,|ErrorReport::new\()\s*PgSqlErrorCode::(\w+)", text)]
        for at, code in sites:
            if not any(a <= at < b for a, b in tests):
                raises.setdefault(code, f"{path}:{text.count(chr(10), 0, at) + 1}")
    return raises


# Comments dropped, string literals whole, dollar quotes passed through, so that a RAISE
# inside a function body counts and the word "raises" in a COMMENT ON string does not.
SQL_TOKEN = re.compile(r"--[^\n]*|/\*.*?\*/|'(?:[^']|'')*'|\$\w*\$|\w+|\S", re.S)
LEVELS = {"debug", "log", "info", "notice", "warning", "exception"}


def sql_raises():
    raises = {}
    for path in sorted(pathlib.Path("sql").glob("*.sql")):
        text = path.read_text()
        tokens = [m for m in SQL_TOKEN.finditer(text) if not m.group().startswith(("--", "/*", "$"))]
        for i, m in enumerate(tokens):
            if m.group().lower() != "raise":
                continue
            statement = []
            for t in tokens[i + 1:]:
                if t.group() == ";":
                    break
                statement.append(t.group())
            words = [w.lower() for w in statement]
            level = words.pop(0) if words and words[0] in LEVELS else "exception"
            if level not in ("exception", "warning") or not words:
                continue  # a notice, or a bare RAISE re-raising the error being handled
            if "errcode" in words:  # USING ERRCODE = '…' (or :=)
                after = statement[len(statement) - len(words) + words.index("errcode") + 1:]
                value = next(t for t in after if t not in ("=", ":")).strip("'")
                code = value if re.fullmatch(r"[0-9A-Z]{5}", value) else by_condition[value]
            elif words[0] == "sqlstate":
                code = words[1].strip("'").upper()
            elif words[0] != "using" and not words[0].startswith("'"):
                code = by_condition[words[0]]
            else:
                code = "P0001"
            raises.setdefault(code, f"{path}:{text.count(chr(10), 0, m.start()) + 1}")
    return raises


def table(readme):
    parts = re.split(r"^### Errors\n", readme, maxsplit=1, flags=re.M)
    if len(parts) < 2:
        return {}, set()
    documented, postgres_own = {}, set()
    for row in re.findall(r"^\|(.*)\|$", re.split(r"^#", parts[1], maxsplit=1, flags=re.M)[0], re.M):
        cells = [c.strip() for c in row.split(" | ", 2)]
        if len(cells) < 3:
            continue  # the line under the header
        codes = re.findall(r"`([0-9A-Z]{5})`", cells[0])
        for code in codes:
            documented.setdefault(code, cells[1])
        if cells[1] == "PostgreSQL's own":
            postgres_own.update(codes)
    return documented, postgres_own


def problems(readme, raised):
    documented, postgres_own = table(readme)
    found = [f"{code}, raised at {site}, has no row in the table" for code, site in sorted(raised.items())
             if code not in documented]
    found += [f"{code} ({name}) has a row but is raised nowhere in src/ or sql/"
              for code, name in sorted(documented.items())
              if code not in raised and code not in postgres_own and code not in RAISED_BY_POSTGRES]
    return found


raised = {**sql_raises(), **rust_raises()}
readme = pathlib.Path(readme_path).read_text()
failed = problems(readme, raised)
if failed:
    print(f"sqlstate_table: {readme_path}'s SQLSTATE table (### Errors) and the raise sites disagree:\n  "
          + "\n  ".join(failed), file=sys.stderr)
    sys.exit(1)

# The check must refuse a table without the row of a code the extension raises, and one with
# a row for a code nothing raises.
code = min(c for c in raised if c.startswith("ID"))  # class ID: one row a code
row = re.compile(rf"^\| `{code}` \|.*\n", re.M)
without_row = row.sub("", readme)
extra_row = row.sub(lambda m: m.group() + "| `ID999` | never raised | nothing |\n", readme)
for name, copy, expect in (("without the row of " + code, without_row, code + ", raised at"),
                           ("with a row for ID999", extra_row, "ID999 (never raised)")):
    if not any(p.startswith(expect) for p in problems(copy, raised)):
        sys.exit(f"sqlstate_table: a table {name} passes the check, so the check cannot fail")
print(f"sqlstate_table: the {len(table(readme)[0])} SQLSTATEs of {readme_path}'s table and the {len(raised)} "
      "the extension raises agree (and a table with a row missing or one too many is refused)")
PY
