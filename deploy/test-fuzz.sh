#!/usr/bin/env bash
# CI's last stage (.ci/run): the libFuzzer targets of tests/fuzz, built with clang, ASan and UBSan
# in build-fuzz/ (CMakePresets.json "fuzz": only the fuzzers and the libraries they link), then
#   1. every committed input — the seeds in tests/fuzz/corpus/<name>/ and the former crashes in
#      tests/fuzz/regressions/<name>/ — run once each: none may crash;
#   2. each fuzzer for FUZZ_SECONDS (default 60; 0 replays only), one after the other (two shared
#      cores). A crash, a sanitizer report, a broken invariant, an input slower than 10 s or a
#      process over 2 GB saves the input in tests/fuzz/regressions/<name>/ (commit it with the
#      fix: step 1 replays it from then on).
# What the fuzzers find on their own goes to build-fuzz/corpus/<name>/, kept between local runs.
# Exits non-zero if anything crashed; the other fuzzers still run.
# Usage: deploy/test-fuzz.sh [NAME...]      (default: every fuzzer; NAME e.g. safetensors)
#        deploy/test-fuzz.sh --seeds        (rewrite tests/fuzz/corpus/ with the project's writers)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"  # cmake --build --preset reads CMakePresets.json from the working directory
build_dir=$root/build-fuzz
fuzz_dir=$root/tests/fuzz
seconds=${FUZZ_SECONDS:-60}
if ! [[ $seconds =~ ^[0-9]+$ ]]; then
  echo "test-fuzz.sh: FUZZ_SECONDS must be a whole number of seconds, not '$seconds'" >&2
  exit 2
fi
start=$(date +%s)

"$root/deploy/install-deps.sh"
cmake --preset fuzz >/dev/null
if [ "${1:-}" = --seeds ]; then
  cmake --build --preset fuzz --target attnserve_fuzz_seed_corpus
  "$build_dir/tests/fuzz/attnserve_fuzz_seed_corpus" "$fuzz_dir/corpus"
  echo "test-fuzz.sh: seeds written to $fuzz_dir/corpus"
  exit 0
fi
cmake --build --preset fuzz -j "${ATTNSERVE_BUILD_JOBS:-2}"
echo "test-fuzz.sh: build took $(($(date +%s) - start)) s"

names=("$@")
[ ${#names[@]} -gt 0 ] || names=(attend_request safetensors model_config)

# The request fuzzer's forward passes run on one OpenMP thread, as small batches do in the server.
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# An input slower than 10 s or a process over 2 GB is a failure too. Slow inputs are saved only as
# timeouts: libFuzzer would also save "slow-unit-" files below the timeout into regressions/.
limits=(-rss_limit_mb=2048 -timeout=10 -report_slow_units=3600)
failed=()

for name in "${names[@]}"; do
  fuzzer=$build_dir/tests/fuzz/${name}_fuzzer
  [ -x "$fuzzer" ] || { echo "test-fuzz.sh: no fuzzer '$name' ($fuzzer)" >&2; exit 2; }
  seeds=$fuzz_dir/corpus/$name
  regressions=$fuzz_dir/regressions/$name
  mkdir -p "$regressions" "$build_dir/corpus/$name" "$build_dir/replay"

  # 1. The committed inputs, once each (files as arguments: no fuzzing). A replayed crash's copy
  # goes to build-fuzz/replay/, not next to the original.
  # nullglob: an empty folder adds nothing; dotfiles (.gitkeep) are never matched.
  shopt -s nullglob
  inputs=("$seeds"/* "$regressions"/*)
  shopt -u nullglob
  if [ ${#inputs[@]} -gt 0 ] &&
    ! "$fuzzer" "${limits[@]}" -artifact_prefix="$build_dir/replay/" "${inputs[@]}" \
      >"$build_dir/replay/$name.log" 2>&1; then
    tail -n 40 "$build_dir/replay/$name.log"
    echo "test-fuzz.sh: $name: a committed input crashes (log: $build_dir/replay/$name.log)" >&2
    failed+=("$name (committed inputs)")
    continue
  fi
  echo "test-fuzz.sh: $name: ${#inputs[@]} seeds and regression inputs pass"
  [ "$seconds" -gt 0 ] || continue

  # 2. Fuzzing. The first folder collects new inputs; the committed ones are only read.
  log=$build_dir/corpus/$name.log
  if "$fuzzer" "${limits[@]}" -max_total_time="$seconds" -print_final_stats=1 \
    -artifact_prefix="$regressions/" "$build_dir/corpus/$name" "$seeds" "$regressions" \
    >"$log" 2>&1; then
    # "#N DONE cov: C ft: F corp: K/S lim: L exec/s: E rss: R"
    grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 | sed "s/^/test-fuzz.sh: $name: /"
  else
    tail -n 60 "$log"
    echo "test-fuzz.sh: $name: CRASH, input saved in $regressions/ (log: $log);" \
      "reproduce with: $fuzzer <that file>" >&2
    failed+=("$name")
  fi
done

echo "test-fuzz.sh: total $(($(date +%s) - start)) s"
if [ ${#failed[@]} -gt 0 ]; then
  echo "test-fuzz.sh: FAILED: ${failed[*]}" >&2
  exit 1
fi
