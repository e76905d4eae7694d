#!/usr/bin/env bash
# Runs attnserve_core_bench with the settings the documented numbers use: short OpenMP spinning,
# 5 repetitions, aggregates only (read the *_median rows).
#
# Usage: tests/benchmarks/run_core_bench.sh [FILTER] [extra Google Benchmark flags...]
#   FILTER     regex for --benchmark_filter (default: all benchmarks), e.g. 'BM_Forward/B:32/'
#   BUILD_DIR  build directory holding the binary (default: <repo>/build)
# Example: tests/benchmarks/run_core_bench.sh 'BM_Forward' --benchmark_out=bench.json \
#            --benchmark_out_format=json
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build_dir="${BUILD_DIR:-${repo_root}/build}"
binary="${build_dir}/tests/benchmarks/attnserve_core_bench"
if [[ ! -x "${binary}" ]]; then
  echo "run_core_bench.sh: ${binary} not found; build it first:" >&2
  echo "  cmake -S ${repo_root} -B ${build_dir} -G Ninja && cmake --build ${build_dir} -j2" >&2
  exit 1
fi

filter="${1:-.}"
shift || true

export OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=1000
exec "${binary}" \
  --benchmark_filter="${filter}" \
  --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true \
  "$@"
