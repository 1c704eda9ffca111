#!/usr/bin/env bash
# Every fenced code block but SQL in README.md's sections "Using it from your language" and
# "Outbox" must equal, once dedented, the excerpt of a file under examples/ between the lines
# "README:begin TAG" and "README:end TAG" ("README:begin outbox TAG" for the Outbox section; in
# the file's own comment syntax; several such regions of one file are joined by a blank line),
# where TAG is the block's language tag;
# every such excerpt must be in the README once, and each tag's examples live in examples/DIR
# (python, go, node for js, java, rust). Fails, with a diff, when the two drift. Every ```sql
# block anywhere in the README must appear, line for line, in a pg_test/sql story, and every
# ```sh block that is more than make targets in a tests/*.sh script.
# Usage: tests/readme_sync.sh [README]   (default README.md)
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 - "${1:-README.md}" <<'PY'
import difflib, pathlib, re, sys, textwrap

# Each section's language blocks, and the marker prefix of their excerpts: "README:begin python"
# for "Using it from your language", "README:begin outbox python" for the Outbox section.
SECTIONS = {"## Using it from your language": "", "## One round trip": "pipeline ", "## Outbox": "outbox ",
            "## External calls": "external "}
DIRS = {"python": "python", "go": "go", "js": "node", "java": "java", "rust": "rust"}
readme = pathlib.Path(sys.argv[1]).read_text()


def section_blocks(heading):
    parts = re.split(rf"^{re.escape(heading)}.*$", readme, maxsplit=1, flags=re.M)
    if len(parts) < 2:
        sys.exit(f"readme_sync: no section {heading!r} in {sys.argv[1]}")
    body = re.split(r"^## ", parts[1], maxsplit=1, flags=re.M)[0]
    return [(tag, text) for tag, text in re.findall(r"^```(\S*)\n(.*?)^```$", body, flags=re.S | re.M) if tag != "sql"]


excerpts = {}  # marker ("outbox python") -> (file, text)
for tag, folder in DIRS.items():
    for path in sorted(pathlib.Path("examples", folder).rglob("*")):
        if not path.is_file() or any(p in path.parts for p in ("node_modules", ".venv", "target")):
            continue
        lines = path.read_text(errors="replace").splitlines(keepends=True)
        for prefix in SECTIONS.values():
            marker = prefix + tag
            begin = [i for i, l in enumerate(lines) if re.search(rf"README:begin {re.escape(marker)}\s*$", l)]
            end = [i for i, l in enumerate(lines) if re.search(rf"README:end {re.escape(marker)}\s*$", l)]
            if not begin and not end:
                continue
            if len(begin) != len(end) or marker in excerpts or any(
                    not b < e for b, e in zip(begin, end)) or any(e > b for e, b in zip(end, begin[1:])):
                sys.exit(f"readme_sync: {path}: want 'README:begin {marker}' and 'README:end {marker}' in pairs, "
                         f"in one file of examples/{folder}")
            # Several regions of one file make one snippet, a blank line between them.
            # gofmt puts a blank line between a function and the end marker's comment.
            excerpts[marker] = (path, "\n".join(textwrap.dedent("".join(lines[b + 1:e])).rstrip("\n") + "\n"
                                                for b, e in zip(begin, end)))

failed = []
seen = set()
blocks = []
for heading, prefix in SECTIONS.items():
    for tag, body in section_blocks(heading):
        blocks.append((prefix + tag, body))
        marker = prefix + tag
        if tag not in DIRS:
            failed.append(f"a ```{tag} block in {heading!r}: no examples/ folder for that language tag")
            continue
        if marker in seen:
            failed.append(f"two ```{tag} blocks in {heading!r}; each language has one snippet there")
            continue
        seen.add(marker)
        if marker not in excerpts:
            failed.append(f"the ```{tag} block of {heading!r} has no 'README:begin {marker}' excerpt under examples/{DIRS[tag]}")
            continue
        path, text = excerpts[marker]
        if body != text:
            diff = "".join(difflib.unified_diff(text.splitlines(True), body.splitlines(True), str(path), "README.md"))
            failed.append(f"the ```{tag} block of {heading!r} differs from {path}:\n{diff}")
for marker in excerpts.keys() - seen:
    failed.append(f"{excerpts[marker][0]} has a README excerpt ({marker}) that is not in the README")
# Every SQL block anywhere in the README runs, as written, in a pg_regress story.
stories = {path: path.read_text() for path in sorted(pathlib.Path("pg_test/sql").glob("*.sql"))}
sql_blocks = re.findall(r"^```sql\n(.*?)^```$", readme, flags=re.S | re.M)
for body in sql_blocks:
    if not any(("\n" + text).find("\n" + body) >= 0 for text in stories.values()):
        failed.append(f"this ```sql block is in no pg_test/sql story, so no test runs it:\n{body}")
# Every shell block but the make targets runs, as written, in a test script.
scripts = [path.read_text() for path in sorted(pathlib.Path("tests").glob("*.sh"))]
sh_blocks = re.findall(r"^```sh\n(.*?)^```$", readme, flags=re.S | re.M)
for body in sh_blocks:
    if all(re.match(r"make |\s+#", line) for line in body.splitlines() if line.strip()):
        continue
    if not any(("\n" + text).find("\n" + body) >= 0 for text in scripts):
        failed.append(f"this ```sh block is in no tests/*.sh script, so no test runs it:\n{body}")
if failed:
    print("readme_sync: README.md and examples/ have drifted:\n" + "\n".join(failed), file=sys.stderr)
    sys.exit(1)
print(f"readme_sync: {len(blocks)} snippets in README.md equal their examples/ excerpts ({', '.join(t for t, _ in blocks)}), "
      f"and its {len(sql_blocks)} SQL blocks run in pg_test/sql stories and {len(sh_blocks)} shell blocks in tests/")
PY
