#!/usr/bin/env bash
# The service path's floor: attnserve against attnserve_echo_server (the same gRPC, protobuf and
# callback-API choices, Attend answered with its input, nothing computed) under the same
# `attnserve-cli bench` load, for 1, 16, 128 and 512 rows per request. Prints, per size, req/s and
# CPU µs per request on each side (the server's from /proc/PID/stat around the run, the client's
# from the bench's own getrusage), and what attnserve spends beyond the echo: its batch threads'
# CPU (compute, with the OpenMP team) and the rest (gRPC, conversion, hand-offs) minus the echo
# server's. Overhead is then a measured number: attnserve's non-compute CPU − the echo's.
#
# Usage: tests/benchmarks/run_echo_floor.sh [build_dir]     (default: $BUILD_DIR or <repo>/build)
# Environment: DURATION_S (seconds per run, default 8), QUIET_WAIT_S, SERVER_FLAGS, LOAD_FLAGS,
#   KEEP_LOGS=1 (as run_server_bench.sh). ~1.5 minutes on 2 cores.
set -euo pipefail

bench_name=run_echo_floor
# shellcheck source=server_bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/server_bench_lib.sh"
echo_bin="${build_dir}/tests/benchmarks/attnserve_echo_server"
if [[ ! -x "${echo_bin}" ]]; then
  echo "${bench_name}: ${echo_bin} not found; build it first:" >&2
  echo "  cmake --build ${build_dir} -j2 --target attnserve_echo_server" >&2
  exit 1
fi

# echo_scenario NAME BENCH FLAGS...: the echo server, one measured bench run, ${work}/NAME.json.
echo_scenario() {
  local name="$1" cpu0 cpu1 waited=0
  shift
  wait_quiet "${name}"
  log "${name}: attnserve_echo_server | attnserve-cli bench $*"
  port="$(free_port)"
  "${echo_bin}" --grpc-address "127.0.0.1:${port}" >"${work}/${name}.server.log" 2>&1 &
  server_pid=$!
  while ! grep -qs "listening" "${work}/${name}.server.log"; do
    sleep 0.1
    waited=$((waited + 1))
    if ((waited > 100)) || ! kill -0 "${server_pid}" 2>/dev/null; then
      log "ERROR: the echo server did not start"
      cat "${work}/${name}.server.log" >&2
      exit 1
    fi
  done
  cpu0="$(server_cpu_s)"
  "${cli_bin}" --target "127.0.0.1:${port}" -q bench --duration "${duration_s}" \
    --warmup-requests 100 --json "${load_extra[@]}" "$@" >"${work}/${name}.load.json"
  cpu1="$(server_cpu_s)"
  stop_server
  python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
r["server_cpu_s"] = float(sys.argv[3].split()[0]) - float(sys.argv[2].split()[0])
r["server_batch_cpu_s"] = 0.0
print(json.dumps(r))' "${work}/${name}.load.json" "${cpu0}" "${cpu1}" >"${work}/${name}.json"
}

start_s=${SECONDS}
sizes=(1 16 128 512)
concurrency=(64 64 16 4)
for i in "${!sizes[@]}"; do
  t=${sizes[$i]} c=${concurrency[$i]}
  echo_scenario "echo_t${t}" --seq-len "${t}" --concurrency "${c}"
  scenario "attnserve_t${t}" "" --seq-len "${t}" --concurrency "${c}"
done
elapsed_s=$((SECONDS - start_s))

python3 - "${work}" "${elapsed_s}" "$(nproc)" "${sizes[@]}" <<'PY'
import json, sys
work, elapsed, cores, sizes = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
print(f"\n## Service path against its floor ({cores} cores, d_model 512 fp32, unary Attend raw, "
      f"{elapsed} s)\n")
print("| rows | c | req/s echo / attnserve | server CPU µs/req echo / attnserve "
      "(batch threads + rest) | attnserve rest − echo | client CPU µs/req echo / attnserve |")
print("|---|---|---|---|---|---|")
for t in sizes:
    e = json.load(open(f"{work}/echo_t{t}.json"))
    a = json.load(open(f"{work}/attnserve_t{t}.json"))
    per = lambda r, key: 1e6 * r[key] / max(1, r["ok"])
    rest = per(a, "server_cpu_s") - per(a, "server_batch_cpu_s")
    print(f"| {t} | {e['concurrency']} | {e['requests_per_s']:.0f} / {a['requests_per_s']:.0f} | "
          f"{per(e, 'server_cpu_s'):.0f} / {per(a, 'server_cpu_s'):.0f} "
          f"({per(a, 'server_batch_cpu_s'):.0f} + {rest:.0f}) | "
          f"{rest - per(e, 'server_cpu_s'):+.0f} | "
          f"{per(e, 'client_cpu_s'):.0f} / {per(a, 'client_cpu_s'):.0f} |")
PY
