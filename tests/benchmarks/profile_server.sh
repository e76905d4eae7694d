#!/usr/bin/env bash
# Where the server's CPU goes under load: starts attnserve (embedded demo model, d_model 512,
# 8 heads) on a free loopback port, puts it under one `attnserve-cli bench` load, samples every
# server thread's call stacks with `perf record -g` for PERF_S seconds of it, and prints the
# samples' shares by thread and by code (oneDNN, attnserve, gRPC, libc, kernel) and the hottest
# symbols. With OUT set, keeps OUT/perf.data, oneDNN's JIT symbol map and OUT/perf-script.txt,
# the stacks as text that flame-graph viewers read (speedscope, the Firefox Profiler, FlameGraph's
# stackcollapse-perf.pl).
# Needs `perf` (Debian's linux-perf; not installed by deploy/install-deps.sh: nothing in CI runs
# this).
#
# Usage: tests/benchmarks/profile_server.sh [BUILD_DIR]
#   Environment: LOAD (attend: `attnserve-cli bench`, unary Attend of SEQ_LEN rows (16) at
#   CONCURRENCY (64), plus LOAD_FLAGS; decode: attnserve_decode_service_cpu, one stream stepping
#   SESSIONS (64) sessions of CONTEXT (64) prompt rows, reopened every ROUND (128) messages),
#   COMPUTE_DTYPE (fp32), PERF_S (8), PERF_TOP (30), OUT, and server_bench_lib.sh's SERVER_FLAGS,
#   QUIET_WAIT_S, KEEP_LOGS.
set -euo pipefail
bench_name=profile_server.sh
# shellcheck source=tests/benchmarks/server_bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/server_bench_lib.sh"
if ! command -v perf >/dev/null; then
  log "ERROR: perf not found (apt-get install linux-perf)"
  exit 1
fi

perf_s="${PERF_S:-8}"
case "${LOAD:-attend}" in
  attend)
    load=("${cli_bin}" --target 127.0.0.1:PORT -q bench --duration "$((perf_s + 6))"
          --seq-len "${SEQ_LEN:-16}" --concurrency "${CONCURRENCY:-64}" "${load_extra[@]}")
    ;;
  decode)
    if [[ ! -x "${build_dir}/tests/benchmarks/attnserve_decode_service_cpu" ]]; then
      log "ERROR: build attnserve_decode_service_cpu first (cmake --build ${build_dir} -j2)"
      exit 1
    fi
    # Sessions reopened every ROUND messages, their past growing from CONTEXT to CONTEXT + ROUND;
    # more messages than the profile lasts: the load is stopped after it.
    load=("${build_dir}/tests/benchmarks/attnserve_decode_service_cpu" --target 127.0.0.1:PORT
          --server-pid PID --sessions "${SESSIONS:-64}" --context "${CONTEXT:-64}"
          --messages 1000000 --round "${ROUND:-128}")
    ;;
  *)
    log "ERROR: LOAD must be attend or decode, not '${LOAD}'"
    exit 1
    ;;
esac

wait_quiet profile
# oneDNN writes its JIT kernels' names to /tmp/perf-PID.map, where perf finds them.
export DNNL_JIT_PROFILE=2
start_server "${work}/server.log" --metrics-off --compute-dtype "${COMPUTE_DTYPE:-fp32}"
jit_map="/tmp/perf-${server_pid}.map"
trap 'rm -f "${jit_map}"; cleanup' EXIT
load=("${load[@]/PORT/${port}}")
load=("${load[@]/PID/${server_pid}}")
log "attnserve --compute-dtype ${COMPUTE_DTYPE:-fp32} | ${load[*]##*/}; perf record for ${perf_s} s"
"${load[@]}" >"${work}/load.out" &
load_pid=$!
sleep 4 # Past the warm-up (and the decode load's prompts).
record_profile "${perf_s}"
kill -TERM "${load_pid}" 2>/dev/null || true
wait "${load_pid}" 2>/dev/null || true
stop_server

print_profile
if [[ -n "${OUT:-}" ]]; then
  mkdir -p "${OUT}"
  cp "${work}/perf.data" "${jit_map}" "${OUT}/"
  perf script -i "${OUT}/perf.data" >"${OUT}/perf-script.txt" 2>/dev/null
  log "kept ${OUT}/perf.data, ${OUT}/perf-script.txt and ${OUT}/${jit_map##*/} (copy it back" \
    "to /tmp for perf report to name oneDNN's kernels)"
fi
