#!/usr/bin/env bash
# Where a decoding round's time goes, phase by phase: starts attnserve (embedded demo model) on a
# free loopback port, puts uprobes on the functions a round passes through (the Decode message
# read, its steps queued, the iteration and its forward pass, the answer built and written), and
# records them with perf while one `attnserve-cli bench --sessions SESSIONS` stream steps its
# sessions round after round; prints each phase's median and mean (round_phases.py). Unlike
# sampling, the probes time every round, so the phases can be compared between builds in a VM
# whose speed drifts from minute to minute.
# Needs root (uprobes through /sys/kernel/tracing) and perf (Debian's linux-perf; not installed by
# deploy/install-deps.sh: nothing in CI runs this).
#
# Usage: tests/benchmarks/profile_decode_round.sh [BUILD_DIR]
#   Environment: COMPUTE_DTYPE (bf16), SESSIONS (64), CONTEXT (64), STEPS (128), and
#   server_bench_lib.sh's SERVER_FLAGS, QUIET_WAIT_S, KEEP_LOGS.
set -euo pipefail
bench_name=profile_decode_round.sh
# shellcheck source=tests/benchmarks/server_bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/server_bench_lib.sh"
events=/sys/kernel/tracing/uprobe_events
group=attnserve_round
if [[ ! -w "${events}" ]]; then
  log "ERROR: ${events} is not writable (needs root and tracefs)"
  exit 1
fi
if ! command -v perf >/dev/null; then
  log "ERROR: perf not found (apt-get install linux-perf)"
  exit 1
fi

# Event name and function (nm -C's name, up to its parameters), in the order a round meets them.
probes=(
  "onmsg attnserve::server::DecodeStreamReactor::OnMessage"
  "append attnserve::decoding::DecodeRuntime::AppendAll"
  "run attnserve::decoding::IterationRunner::Run"
  "fwd attnserve::core::CachedAttentionExecutor::Forward"
  "ans attnserve::server::FlowControlledStream::Answer"
)
binary=$(realpath "${server_bin}")  # Uprobes name the file by its absolute path.
# Uprobes take file offsets: a symbol's address less its executable segment's address plus the
# segment's offset in the file.
read -r seg_addr seg_offset < <(readelf -lW "${server_bin}" |
  awk '!found && $1 == "LOAD" && / E / {print $3, $2; found = 1}')
remove_probes() {
  local event
  for event in $(grep -o "${group}/[a-z_]*" "${events}" 2>/dev/null); do
    echo "-:${event}" >>"${events}"
  done
}
trap 'remove_probes || true; cleanup' EXIT
remove_probes || true
for probe in "${probes[@]}"; do
  read -r name function <<<"${probe}"
  address=$(nm -C --defined-only "${server_bin}" |
    awk -v f="${function}(" '!found && $2 == "T" && index($0, f) > 0 {print $1; found = 1}')
  if [[ -z "${address}" ]]; then
    log "ERROR: ${function} not found in ${server_bin}"
    exit 1
  fi
  offset=$(printf '0x%x' $((0x${address} - seg_addr + seg_offset)))
  echo "p:${group}/${name} ${binary}:${offset}" >>"${events}"
  echo "r:${group}/${name}_r ${binary}:${offset}" >>"${events}"
done

wait_quiet round
start_server "${work}/server.log" --metrics-off --compute-dtype "${COMPUTE_DTYPE:-bf16}"
perf record -q -o "${work}/perf.data" -e "${group}:*" -p "${server_pid}" >/dev/null 2>&1 &
perf_pid=$!
sleep 0.5
log "attnserve --compute-dtype ${COMPUTE_DTYPE:-bf16} | attnserve-cli bench --sessions" \
  "${SESSIONS:-64} --context ${CONTEXT:-64} --steps ${STEPS:-128}"
"${cli_bin}" --target "127.0.0.1:${port}" -q bench --model demo --sessions "${SESSIONS:-64}" \
  --context "${CONTEXT:-64}" --steps "${STEPS:-128}" --json >"${work}/bench.json"
kill -INT "${perf_pid}"
wait "${perf_pid}" || true
stop_server
perf script -i "${work}/perf.data" -F time,event 2>/dev/null |
  /usr/bin/python3 "${repo_root}/tests/benchmarks/round_phases.py"
