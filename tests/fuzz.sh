#!/usr/bin/env bash
# The in-process fuzz targets of fuzz/ (cargo fuzz, libFuzzer with coverage, on the stable
# toolchain with --sanitizer none): each first replays its saved findings (fuzz/regressions/),
# then runs for FUZZ_SECONDS from the corpus it has grown on this machine. Prints one line
# per target: executions, seconds, corpus, findings. A finding is kept under
# fuzz/artifacts/<target>/ and fails the run; replay it with
#   cargo fuzz run --sanitizer none <target> fuzz/artifacts/<target>/<file>
# Usage: tests/fuzz.sh [target ...]   (default: all of them)
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds=${FUZZ_SECONDS:-10}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo fuzz list)
cargo fuzz build --sanitizer none
host=$(rustc -vV | sed -n 's/^host: //p')  # cargo fuzz builds for the host triple
failed=0
for target in "${targets[@]}"; do
  binary=target/$host/release/$target
  if [ -d regressions/$target ]; then
    if ! "$binary" -runs=1 regressions/$target/* >/tmp/fuzz-$target.log 2>&1; then
      echo "fuzz $target: a saved finding fails again:"; tail -20 /tmp/fuzz-$target.log; failed=1; continue
    fi
  fi
  mkdir -p corpus/$target artifacts/$target
  start=$(date +%s)
  if "$binary" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix=artifacts/$target/ \
      corpus/$target >/tmp/fuzz-$target.log 2>&1; then
    outcome="0 findings"; found=0
  else
    outcome="a FINDING in fuzz/artifacts/$target/"; found=1; failed=1
  fi
  runs=$(grep -oP 'stat::number_of_executed_units:\s*\K[0-9]+' /tmp/fuzz-$target.log || echo '?')
  corpus=$(ls corpus/$target | wc -l)
  echo "fuzz $target: $runs executions in $(( $(date +%s) - start )) s, corpus $corpus, $outcome"
  [ "$found" = 0 ] || tail -30 /tmp/fuzz-$target.log
done
exit $failed
