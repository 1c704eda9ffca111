#!/usr/bin/python3
"""The benchmark report: one Markdown table and one chart from what `make bench` wrote.

Reads docs/bench/bench-pgNN.tsv (one per server version bench/run.sh ran on, committed; lines starting with
'#' carry the run's date and machine) and docs/bench/scale.md, the dated table of the last
make bench-scale. Writes docs/bench/report.md and docs/bench/ratios.png, and puts the report's table between the
README's "bench:begin" and "bench:end" markers. Run with Debian's python3, which has matplotlib
(python3-matplotlib). Usage: bench/report.py [RESULTS_DIR [README [OUT_DIR]]]
"""
import pathlib
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend is chosen first)

ROOT = pathlib.Path(__file__).resolve().parent.parent
results = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "bench"
readme = pathlib.Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "README.md"
out = pathlib.Path(sys.argv[3]) if len(sys.argv) > 3 else ROOT / "docs" / "bench"


def read_run(path):
    meta, rows = {}, []
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            key, _, value = line[1:].partition("\t")
            meta[key] = value
        elif line.strip():
            what, figure, ratio, target, verdict = (line.split("\t") + [""] * 5)[:5]
            rows.append({"what": what, "figure": figure, "ratio": float(ratio), "target": target, "verdict": verdict})
    return meta, rows


runs = {}
for path in sorted(results.glob("bench-pg*.tsv"), key=lambda p: int(re.sub(r"\D", "", p.stem))):
    runs[path.stem.removeprefix("bench-")] = read_run(path)
if not runs:
    sys.exit(f"report: no bench-pgNN.tsv under {results}; run make bench first")

versions = list(runs)
order = []  # every row's name, in the order the first run that has it lists it
for _, rows in runs.values():
    order += [r["what"] for r in rows if r["what"] not in order]
table = {v: {r["what"]: r for r in rows} for v, (_, rows) in runs.items()}


def cell(version, what):
    row = table[version].get(what)
    if row is None:
        return "–"
    verdict = f" **{row['verdict']}**" if row["verdict"] == "MISS" else (" ✓" if row["verdict"] == "PASS" else "")
    return f"{row['figure']}, {row['ratio']:.3f}×{verdict}"


def target(what):
    """The row's target or note; notes that carry a version's own figures are given per version."""
    notes = {v: table[v][what]["target"] for v in versions if what in table[v]}
    if len(set(notes.values())) <= 1:
        return next(iter(notes.values()), "")
    return "; ".join(f"{v}: {note}" for v, note in notes.items())


lines = ["| measure | " + " | ".join(versions) + " | target or note |", "|---" * (len(versions) + 2) + "|"]
lines += [f"| {what} | " + " | ".join(cell(v, what) for v in versions) + f" | {target(what)} |" for what in order]
machines = [f"- **{v}**: {meta.get('server', '?')}, {meta.get('date', '?')}; {meta.get('machine', '?')}; "
            f"{meta.get('settings', '')}" for v, (meta, _) in runs.items()]
judged = [(v, r) for v, (_, rows) in runs.items() for r in rows if r["verdict"]]
missed = [f"{r['what']} on {v} ({r['ratio']:.3f})" for v, r in judged if r["verdict"] == "MISS"]
summary = (f"{len(judged) - len(missed)} of {len(judged)} targets met" +
           (f"; missed: {', '.join(missed)}." if missed else "."))

# The chart: every judged ratio, one bar per version, its target as a tick.
judged_names = [w for w in order if any(table[v].get(w, {}).get("verdict") for v in versions)]
fig, ax = plt.subplots(figsize=(10, 0.42 * len(judged_names) + 1.5))
height = 0.8 / len(versions)
for i, v in enumerate(versions):
    ys = [n + i * height for n in range(len(judged_names))]
    ratios = [table[v][w]["ratio"] if w in table[v] else 0 for w in judged_names]
    colors = ["#2a7" if table[v].get(w, {}).get("verdict") == "PASS" else "#c43" for w in judged_names]
    ax.barh(ys, ratios, height=height, color=colors, alpha=1.0 - 0.35 * i)
    for y, ratio in zip(ys, ratios):
        ax.text(ratio * 1.02, y, f"{v} {ratio:.3g}", va="center", fontsize=7)
for n, w in enumerate(judged_names):
    goal = re.search(r"([<>]=) ([0-9.]+)", target(w))
    if goal:
        ax.plot([float(goal.group(2))] * 2, [n - 0.1, n + 0.9 - 0.1], color="black", linewidth=1.5)
ax.set_yticks([n + 0.4 - height / 2 for n in range(len(judged_names))], judged_names)
ax.invert_yaxis()
ax.axvline(1.0, color="grey", linewidth=0.5)
# Logarithmic, so that the batch's tenfold target and the ratios near 1 are both readable.
ax.set_xscale("log")
ax.set_xticks([0.5, 0.7, 0.8, 0.9, 1, 1.2, 1.5, 2, 5, 10], ["0.5", "0.7", "0.8", "0.9", "1", "1.2", "1.5", "2", "5", "10"])
ax.set_xlim(0.4, 16)
ax.set_xlabel("ratio in one run (1: parity with the hand-written SQL); black tick: the target")
ax.set_title("idempotency: make bench on " + ", ".join(versions) + " (green: met, red: missed)")
fig.tight_layout()
out.mkdir(parents=True, exist_ok=True)
fig.savefig(out / "ratios.png", dpi=90)

scale = ROOT / "docs" / "bench" / "scale.md"
scale_text = scale.read_text().strip() if scale.exists() else None
report = ["# Benchmark report", "",
          "Written by `bench/report.py` from the last `make bench` on each version (`make bench` and "
          "`make bench PG_MAJOR=18`). Each ratio compares the extension with the hand-written SQL a user "
          "would otherwise write, in one pgbench run that interleaves both, as the median of the rounds; "
          "above 1 the extension is faster. Where the runs were made:", "", *machines, "",
          summary, "", *lines, "", "![ratios](ratios.png)", ""]
if scale_text:
    report += ["## make bench-scale", "", scale_text, ""]
(out / "report.md").write_text("\n".join(report))

begin, end = "<!-- bench:begin -->", "<!-- bench:end -->"
text = readme.read_text()
if begin in text and end in text:
    block = "\n".join([begin, *machines, "", summary, "", *lines, "",
                       "![ratios of make bench](docs/bench/ratios.png)", end])
    readme.write_text(text[:text.index(begin)] + block + text[text.index(end) + len(end):])
print(f"report: {out / 'report.md'}, {out / 'ratios.png'}; {summary}")
