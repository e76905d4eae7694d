# Shared by the server benchmarks (run_server_bench.sh, run_metrics_cost.sh): sourced after
# `set -euo pipefail` with bench_name set. Provides build_dir/server_bin/cli_bin/offline_bin
# (checked), the temporary folder ${work} (removed on exit unless KEEP_LOGS=1),
# start_server/stop_server, scenario NAME "SERVER FLAGS" BENCH FLAGS... (one server, one measured
# `attnserve-cli bench` run, result in ${work}/NAME.json), offline NAME FLAGS... (the core alone,
# attnserve_offline_bench) and record_profile/print_profile (perf). Servers get --metrics-address
# 127.0.0.1:0 unless their flags set it; the flag --metrics-off means --metrics-address "".
# Environment: DURATION_S, OFFLINE_S, QUIET_WAIT_S, SERVER_FLAGS, LOAD_FLAGS, KEEP_LOGS (see the
# scripts' headers).
# shellcheck shell=bash

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build_dir="${1:-${BUILD_DIR:-${repo_root}/build}}"
server_bin="${build_dir}/server/attnserve"
cli_bin="${build_dir}/client/cli/attnserve-cli"
offline_bin="${build_dir}/tests/benchmarks/attnserve_offline_bench"
for binary in "${server_bin}" "${cli_bin}" "${offline_bin}"; do
  if [[ ! -x "${binary}" ]]; then
    echo "${bench_name}: ${binary} not found; build it first:" >&2
    echo "  cmake --build ${build_dir} -j2" \
      "--target attnserve attnserve-cli attnserve_offline_bench" >&2
    exit 1
  fi
done

duration_s="${DURATION_S:-8}"
offline_s="${OFFLINE_S:-3}"
quiet_wait_s="${QUIET_WAIT_S:-20}"
read -r -a server_extra <<<"${SERVER_FLAGS:-}"
read -r -a load_extra <<<"${LOAD_FLAGS:-}"
export OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=1000

work="$(mktemp -d -t attnserve-bench.XXXXXX)"
server_pid=""
cleanup() {
  if [[ -n "${server_pid}" ]] && kill -0 "${server_pid}" 2>/dev/null; then
    kill -TERM "${server_pid}" 2>/dev/null || true
    wait "${server_pid}" 2>/dev/null || true
  fi
  if [[ "${KEEP_LOGS:-0}" == 1 ]]; then
    echo "logs and results kept in ${work}" >&2
  else
    rm -rf "${work}"
  fi
}
trap cleanup EXIT

log() { echo "[${bench_name}] $*" >&2; }

# /proc/stat's aggregate line: user nice system idle iowait irq softirq steal, in clock ticks.
cpu_ticks() { head -1 /proc/stat | awk '{print $2, $3, $4, $5, $6, $7, $8, $9}'; }

# Busy share of all cores, in percent, over half a second.
cpu_busy_pct() {
  local a b
  a="$(cpu_ticks)"
  sleep 0.5
  b="$(cpu_ticks)"
  python3 -c '
import sys
a, b = [int(x) for x in sys.argv[1].split()], [int(x) for x in sys.argv[2].split()]
d = [y - x for x, y in zip(a, b)]
print(round(100 * (sum(d) - d[3] - d[4]) / (sum(d) or 1)))' "${a}" "${b}"
}

# Waits (up to QUIET_WAIT_S) until other processes leave the cores idle; warns if they do not.
wait_quiet() {
  local name="$1" busy waited=0
  while true; do
    busy="$(cpu_busy_pct)"
    if ((busy <= 10)); then return; fi
    if ((waited >= quiet_wait_s)); then
      log "WARNING: the machine is ${busy} % busy before ${name} (other processes)"
      return
    fi
    sleep 1.5
    waited=$((waited + 2))
  done
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# CPU seconds (user + system) the server has used so far: "total batch", where batch counts the
# threads named "attnserve-batch" (the batch threads and the OpenMP workers they spawn, which
# inherit the name) and those left unnamed ("attnserve": main, and the batch threads of servers
# that do not name them), and the rest is gRPC's named threads (default-executor, nexting_thread,
# event_engine, ...), exited ones included.
server_cpu_s() {
  python3 -c '
import glob, os, sys
hz = os.sysconf("SC_CLK_TCK")
def cpu(path):
    fields = open(path).read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / hz
batch = 0.0
for task in glob.glob(f"/proc/{sys.argv[1]}/task/*"):
    try:
        if open(f"{task}/comm").read().strip() in ("attnserve", "attnserve-batch"):
            batch += cpu(f"{task}/stat")
    except OSError:
        pass
print(cpu(f"/proc/{sys.argv[1]}/stat"), batch)' "${server_pid}"
}

# start_server LOG [attnserve flags...]: the demo model on a free port (sets port, server_pid);
# returns once it has answered one request.
port=""
start_server() {
  local server_log="$1" attempt waited
  shift
  for attempt in 1 2 3; do
    port="$(free_port)"
    # Metrics on a free port and no REST unless the flags say otherwise; "--metrics-off" stands for
    # --metrics-address "" (an empty argument cannot travel in a flags string).
    local -a flags=() metrics=(--metrics-address 127.0.0.1:0) http=(--http-address "")
    local flag
    for flag in "${server_extra[@]}" "$@"; do
      case "${flag}" in
        --metrics-off) metrics=(--metrics-address "") ;;
        --metrics-address) metrics=() flags+=("${flag}") ;;
        --http-address) http=() flags+=("${flag}") ;;
        *) flags+=("${flag}") ;;
      esac
    done
    "${server_bin}" --grpc-address "127.0.0.1:${port}" "${metrics[@]}" "${http[@]}" \
      --model-repository "${work}/no-such-repository" --model-poll-interval-s 0 \
      "${flags[@]}" >"${server_log}" 2>&1 &
    server_pid=$!
    waited=0
    while kill -0 "${server_pid}" 2>/dev/null && ! grep -qs "listening" "${server_log}"; do
      sleep 0.1
      waited=$((waited + 1))
      if ((waited > 600)); then
        log "ERROR: attnserve did not start within 60 s"
        cat "${server_log}" >&2
        exit 1
      fi
    done
    if kill -0 "${server_pid}" 2>/dev/null; then
      "${cli_bin}" --target "127.0.0.1:${port}" --timeout-s 30 -q bench --requests 1 \
        --concurrency 1 --json >/dev/null
      return
    fi
    wait "${server_pid}" || true # Exited: the port was taken meanwhile, or a real error.
    server_pid=""
    log "attnserve failed to start (attempt ${attempt}):"
    cat "${server_log}" >&2
  done
  exit 1
}

# Sends SIGTERM and checks that the server drains and exits 0.
stop_server() {
  local rc=0
  kill -TERM "${server_pid}"
  wait "${server_pid}" || rc=$?
  server_pid=""
  if ((rc != 0)); then
    log "ERROR: attnserve exited with ${rc} after SIGTERM"
    exit 1
  fi
}

# record_profile SECONDS: samples the running server's call stacks with `perf record -g` (999 Hz,
# every thread) for SECONDS into ${work}/perf.data. Needs `perf` (Debian's linux-perf).
record_profile() {
  perf record -F 999 -g -p "${server_pid}" -o "${work}/perf.data" -- sleep "$1" 2>/dev/null
}

# print_profile: ${work}/perf.data as a table of the samples' shares by thread (rows) and by the
# code they ran (columns: oneDNN's JIT kernels and library, attnserve's own code, gRPC with
# protobuf and abseil, libc/libstdc++/libgomp, the kernel), then the PERF_TOP (30) hottest symbols
# (profile_table.py).
print_profile() {
  perf report -i "${work}/perf.data" --no-children --sort comm,dso --stdio -g none -t ';' \
    2>/dev/null | python3 "${repo_root}/tests/benchmarks/profile_table.py"
  echo
  perf report -i "${work}/perf.data" --no-children --sort comm,dso,sym --stdio -g none -t ';' \
    2>/dev/null |
    python3 "${repo_root}/tests/benchmarks/profile_table.py" --symbols "${PERF_TOP:-30}"
}

# scenario NAME "SERVER FLAGS" BENCH FLAGS...: one server, one measured run of attnserve-cli bench
# (DURATION_S seconds, after 100 uncounted warm-up requests). Writes
# ${work}/NAME.json: bench's JSON report, the server's CPU seconds, and the cores the whole machine
# kept busy (what exceeds server + driver belongs to other processes or is the hypervisor's steal).
scenario() {
  local name="$1" server_flags="$2" cpu0 cpu1 ticks0 ticks1 rc=0
  local -a sflags
  shift 2
  read -r -a sflags <<<"${server_flags}"
  wait_quiet "${name}"
  log "${name}: attnserve ${server_flags:-(defaults)} | attnserve-cli bench $*"
  start_server "${work}/${name}.server.log" "${sflags[@]}"
  cpu0="$(server_cpu_s)"
  ticks0="$(cpu_ticks)"
  "${cli_bin}" --target "127.0.0.1:${port}" -q bench --duration "${duration_s}" \
    --warmup-requests 100 --json "${load_extra[@]}" "$@" >"${work}/${name}.load.json" || rc=$?
  ticks1="$(cpu_ticks)"
  cpu1="$(server_cpu_s)"
  stop_server
  if ((rc != 0)); then log "WARNING: ${name}: some requests failed (errors column)"; fi
  python3 -c '
import json, os, sys
r = json.load(open(sys.argv[1]))
c0, c1 = [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
r["server_cpu_s"] = c1[0] - c0[0]
r["server_batch_cpu_s"] = c1[1] - c0[1]
r["server_grpc_cpu_s"] = r["server_cpu_s"] - r["server_batch_cpu_s"]
r["server_flags"] = sys.argv[4]
a, b = [int(x) for x in sys.argv[5].split()], [int(x) for x in sys.argv[6].split()]
d = [y - x for x, y in zip(a, b)]
hz = os.sysconf("SC_CLK_TCK")
wall = sum(d) / hz / os.cpu_count()
busy = (sum(d) - d[3] - d[4]) / hz / wall
ours = (r["server_cpu_s"] + r["client_cpu_s"]) / r["elapsed_s"]
r["machine_busy_cores"] = busy
r["other_cores"] = max(0.0, busy - ours)
print(json.dumps(r))' "${work}/${name}.load.json" "${cpu0}" "${cpu1}" "${server_flags}" \
    "${ticks0}" "${ticks1}" >"${work}/${name}.json"
}

# offline NAME FLAGS...: the core alone (attnserve_offline_bench).
offline() {
  local name="$1"
  shift
  wait_quiet "${name}"
  log "${name}: attnserve_offline_bench $*"
  "${offline_bin}" --duration-s "${offline_s}" --json "$@" >"${work}/${name}.json"
}

