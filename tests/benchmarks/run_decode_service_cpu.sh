#!/usr/bin/env bash
# The server's CPU per Decode step message and where it goes: starts attnserve (embedded demo model,
# d_model 512, 8 heads) on a free loopback port and runs attnserve_decode_service_cpu against it:
# one stream, SESSIONS sessions of CONTEXT prompt rows, then MESSAGES messages of SESSIONS one-row
# steps, one in flight at a time; it prints the server's CPU per message by thread name.
# `LOAD=decode tests/benchmarks/profile_server.sh` profiles the server under the same load.
#
# Usage: tests/benchmarks/run_decode_service_cpu.sh [BUILD_DIR]
#   Environment: MESSAGES (2000), SESSIONS (64), CONTEXT (128), ROUND (32: step messages between
#   reopening the sessions), and server_bench_lib.sh's SERVER_FLAGS, QUIET_WAIT_S, KEEP_LOGS.
set -euo pipefail
bench_name=run_decode_service_cpu.sh
# shellcheck source=tests/benchmarks/server_bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/server_bench_lib.sh"
load_bin="${build_dir}/tests/benchmarks/attnserve_decode_service_cpu"
if [[ ! -x "${load_bin}" ]]; then
  echo "${bench_name}: ${load_bin} not found; build it first:" >&2
  echo "  cmake --build ${build_dir} -j2 --target attnserve_decode_service_cpu" >&2
  exit 1
fi

wait_quiet decode
start_server "${work}/server.log" --metrics-off
load=("${load_bin}" --target "127.0.0.1:${port}" --server-pid "${server_pid}"
      --messages "${MESSAGES:-2000}" --sessions "${SESSIONS:-64}" --context "${CONTEXT:-128}"
      --round "${ROUND:-32}")
"${load[@]}"
stop_server
