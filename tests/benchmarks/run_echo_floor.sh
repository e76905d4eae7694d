#!/usr/bin/env bash
# The service path's floor: attnserve against attnserve_echo_server (the same gRPC, protobuf and
# callback-API choices, Attend answered with its input, nothing computed) under the same
# `attnserve-cli bench` load, for 1, 16, 128 and 512 rows per request. Prints, per size, req/s and
# CPU µs per request on each side (the server's from /proc/PID/stat around the run, the client's
# from the bench's own getrusage), and what attnserve spends beyond the echo: its batch threads'
# CPU (compute, with the OpenMP team) and the rest (gRPC, conversion, hand-offs) minus the echo
# server's. Beside each attnserve run, the core alone computes the batches that run formed
# (attnserve_offline_bench, one thread, as many sequences as the run's mean batch): the server's
# CPU per request against that compute plus 1.5 × the echo's CPU is the service path's target,
# and what exceeds compute + echo is the measured overhead.
#
# Usage: tests/benchmarks/run_echo_floor.sh [build_dir]     (default: $BUILD_DIR or <repo>/build)
# Environment: DURATION_S (seconds per run, default 8), COMPUTE_DTYPES (attnserve's compute
#   types, default "fp32"; "fp32 bf16" adds a bf16 server and core per size), SIZES (rows per
#   request, default "1 16 128 512"; concurrency 64, 64, 16 and 4 respectively), QUIET_WAIT_S,
#   SERVER_FLAGS, LOAD_FLAGS, KEEP_LOGS=1 (as run_server_bench.sh). ~2 minutes per compute type
#   on 2 cores.
set -euo pipefail

bench_name=run_echo_floor
# shellcheck source=server_bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/server_bench_lib.sh"
echo_bin="${build_dir}/tests/benchmarks/attnserve_echo_server"
echo_client_bin="${build_dir}/tests/benchmarks/attnserve_echo_client"
for binary in "${echo_bin}" "${echo_client_bin}"; do
  if [[ ! -x "${binary}" ]]; then
    echo "${bench_name}: ${binary} not found; build it first:" >&2
    echo "  cmake --build ${build_dir} -j2 --target attnserve_echo_server attnserve_echo_client" >&2
    exit 1
  fi
done

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
  # The client library's floor: the same calls on the bare generated stub.
  "${echo_client_bin}" --target "127.0.0.1:${port}" --duration-s "${duration_s}" \
    --warmup-requests 100 "$@" >"${work}/${name}.stub.json"
  stop_server
  python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
r["server_cpu_s"] = float(sys.argv[3].split()[0]) - float(sys.argv[2].split()[0])
r["server_batch_cpu_s"] = 0.0
print(json.dumps(r))' "${work}/${name}.load.json" "${cpu0}" "${cpu1}" >"${work}/${name}.json"
}

# core_scenario NAME RUN T DTYPE: the core alone on the batches RUN formed (its mean batch of
# sequences of T rows, at least 1), one compute thread, into ${work}/NAME.json.
core_scenario() {
  local name="$1" run="$2" t="$3" dtype="$4" batch
  batch="$(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
print(max(1, round(r.get("server", {}).get("batch_mean_sequences") or 1)))' "${work}/${run}.json")"
  offline "${name}" --sequences "${batch}" --seq-len "${t}" --compute-threads 1 \
    --compute-dtype "${dtype}"
}

read -r -a dtypes <<<"${COMPUTE_DTYPES:-fp32}"
start_s=${SECONDS}
read -r -a sizes <<<"${SIZES:-1 16 128 512}"
for t in "${sizes[@]}"; do
  case "${t}" in
    1 | 16) c=64 ;;
    128) c=16 ;;
    512) c=4 ;;
    *) echo "${bench_name}: SIZES takes 1, 16, 128 and 512, not ${t}" >&2 && exit 2 ;;
  esac
  echo_scenario "echo_t${t}" --seq-len "${t}" --concurrency "${c}"
  for dtype in "${dtypes[@]}"; do
    scenario "attnserve_${dtype}_t${t}" "--compute-dtype ${dtype}" --seq-len "${t}" \
      --concurrency "${c}"
    core_scenario "core_${dtype}_t${t}" "attnserve_${dtype}_t${t}" "${t}" "${dtype}"
  done
done
elapsed_s=$((SECONDS - start_s))

python3 - "${work}" "${elapsed_s}" "$(nproc)" "${#sizes[@]}" "${sizes[@]}" "${dtypes[@]}" <<'PY'
import json, sys
work, elapsed, cores, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
sizes, dtypes = sys.argv[5:5 + n], sys.argv[5 + n:]
load = lambda name: json.load(open(f"{work}/{name}.json"))
per = lambda r, key: 1e6 * r[key] / max(1, r["ok"])
print(f"\n## Service path against its floor ({cores} cores, d_model 512, unary Attend raw fp32 on "
      f"the wire, {elapsed} s)\n")
print("| rows | c | compute | req/s echo / attnserve | server CPU µs/req echo / attnserve "
      "(batch threads + rest) | core µs/seq (batch) | target core + 1.5 × echo | overhead: "
      "attnserve − core − echo | client CPU µs/req echo / attnserve |")
print("|---|---|---|---|---|---|---|---|---|")
for t in sizes:
    e = load(f"echo_t{t}")
    for dtype in dtypes:
        a, core = load(f"attnserve_{dtype}_t{t}"), load(f"core_{dtype}_t{t}")
        server, echo = per(a, "server_cpu_s"), per(e, "server_cpu_s")
        core_us = 1e3 * core["p50_ms"] / core["sequences"]
        target = core_us + 1.5 * echo
        print(f"| {t} | {e['concurrency']} | {dtype} | {e['requests_per_s']:.0f} / "
              f"{a['requests_per_s']:.0f} | {echo:.0f} / {server:.0f} "
              f"({per(a, 'server_batch_cpu_s'):.0f} + "
              f"{server - per(a, 'server_batch_cpu_s'):.0f}) | {core_us:.0f} ({core['sequences']}) | "
              f"{target:.0f} {'met' if server <= target else 'missed'} | "
              f"{server - core_us - echo:+.0f} | "
              f"{per(e, 'client_cpu_s'):.0f} / {per(a, 'client_cpu_s'):.0f} |")
print("\nThe client library against its floor (both against the echo server): CPU µs per "
      "request of the bare generated stub (attnserve_echo_client) and of attnserve-cli bench.\n")
print("| rows | c | bare stub | attnserve-cli | ratio |")
print("|---|---|---|---|---|")
for t in sizes:
    e, stub = load(f"echo_t{t}"), load(f"echo_t{t}.stub")
    floor, lib = per(stub, "client_cpu_s"), per(e, "client_cpu_s")
    print(f"| {t} | {e['concurrency']} | {floor:.0f} | {lib:.0f} | {lib / floor:.2f}× |")
if len(dtypes) > 1:
    print("\n| rows | req/s " + " / ".join(dtypes) + " | ratio to " + dtypes[0] + " |")
    print("|---|---|---|")
    for t in sizes:
        rps = [load(f"attnserve_{d}_t{t}")["requests_per_s"] for d in dtypes]
        print(f"| {t} | " + " / ".join(f"{x:.0f}" for x in rps) + " | " +
              " / ".join(f"{x / rps[0]:.2f}×" for x in rps[1:]) + " |")
PY
