#!/usr/bin/env bash
# The incremental-decoding figures in one run: attnserve's KV-cache decode benchmarks (and the
# machine's read bandwidth) from attnserve_core_bench, then PyTorch 1.13 on the same shapes.
#
# Usage: tests/benchmarks/run_decode_bench.sh     (BUILD_DIR: build directory, default <repo>/build)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
"${repo_root}/tests/benchmarks/run_core_bench.sh" 'Decode|MemoryRead' "$@"
OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=1000 \
  /usr/bin/python3 "${repo_root}/tests/benchmarks/torch_decode_bench.py" --threads 2
