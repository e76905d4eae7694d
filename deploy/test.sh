#!/usr/bin/env bash
# Quick start, part 2: install, build, and run every test (CTest), then check formatting.
# Exits non-zero on any failure. CI (.ci/run) runs exactly this.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${ATTNSERVE_BUILD_DIR:-$root/build}

start=$(date +%s)
# Every target: tests, benchmarks and tools (switched back on if deploy/run.sh built this folder).
"$root/deploy/build.sh" -DATTNSERVE_BUILD_TESTS=ON -DATTNSERVE_BUILD_BENCHMARKS=ON \
  -DATTNSERVE_BUILD_TOOLS=ON
echo "test.sh: build took $(($(date +%s) - start)) s"

# Idle OpenMP workers spin only briefly, then sleep: tests run two at a time on two cores.
export OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=1000
ctest --test-dir "$build_dir" --output-on-failure -j 2 --timeout 600

# Formatting is part of the contract: the repo's .clang-format (Google-based).
# $(...) in an assignment keeps git's failure fatal under set -e (a process substitution would
# not), and clang-format given no files would read stdin: an empty list is an error.
listed=$(cd "$root" && git -c safe.directory="$root" ls-files -co --exclude-standard -- '*.h' '*.cc')
[ -n "$listed" ] || { echo "test.sh: git listed no *.h/*.cc files under $root" >&2; exit 1; }
mapfile -t sources <<<"$listed"
(cd "$root" && clang-format --dry-run --Werror "${sources[@]}")
echo "test.sh: clang-format clean (${#sources[@]} files); total $(($(date +%s) - start)) s"
