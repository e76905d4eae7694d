#!/usr/bin/env bash
# The Open Inference Protocol over REST against the same protocol over gRPC, one server (demo
# model), closed loop at concurrency 16, the two sides interleaved so that drift on a shared
# machine falls on both alike (A B, B A, A B, ...):
#   binary: `attnserve-cli bench --protocol rest` (binary tensor data) vs `--protocol oip`
#           (ModelInfer), T=128 (target: REST >= 80 % of ModelInfer's requests/s);
#   json:   `--protocol rest-json` (JSON bodies) vs `--protocol oip`, T=16 (target: >= 50 %).
# Client and server share the machine: the REST client's own JSON work counts against it.
# Prints every run and the medians over PAIRS pairs as a markdown table.
#
# Usage: tests/benchmarks/run_rest_bench.sh [build_dir]     (default: $BUILD_DIR or <repo>/build)
# Environment: DURATION_S (default 10), PAIRS (default 3), KEEP_LOGS=1. Takes ~2-3 minutes.
set -euo pipefail

bench_name=run_rest_bench
# shellcheck source=server_bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/server_bench_lib.sh"

duration_s="${DURATION_S:-10}"
pairs="${PAIRS:-3}"

log "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
rest_port="$(free_port)"
start_server "${work}/server.log" --metrics-off --http-address "127.0.0.1:${rest_port}"
target="127.0.0.1:${port}"

# bench NAME FLAGS...: one attnserve-cli bench run, JSON in ${work}/NAME.json.
bench() {
  local name="$1"
  shift
  log "${name}: attnserve-cli bench $*"
  "${cli_bin}" --target "${target}" --timeout-s 30 -q bench --model demo --json \
    --rest-target "127.0.0.1:${rest_port}" --concurrency 16 --duration "${duration_s}" \
    --warmup-requests 100 "$@" >"${work}/${name}.json"
}

for ((pair = 1; pair <= pairs; ++pair)); do
  for kind in binary json; do
    rest=rest seq_len=128
    if [[ "${kind}" == json ]]; then rest=rest-json seq_len=16; fi
    order=(oip "${rest}")
    if ((pair % 2 == 0)); then order=("${rest}" oip); fi
    for protocol in "${order[@]}"; do
      bench "${kind}_${protocol}_${pair}" --protocol "${protocol}" --seq-len "${seq_len}"
    done
  done
done
stop_server
log "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "${work}" "${pairs}" <<'PY'
import json, statistics, sys
work, pairs = sys.argv[1], int(sys.argv[2])
load = lambda name: json.load(open(f"{work}/{name}.json"))
print("REST vs gRPC ModelInfer, demo model, closed loop, concurrency 16 (requests/s; p50 ms):\n")
print("| body | T | pair | ModelInfer req/s | REST req/s | REST / ModelInfer | ModelInfer p50 "
      "| REST p50 |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for kind, rest, t in (("binary", "rest", 128), ("json", "rest-json", 16)):
    ratios, grpc_runs, rest_runs = [], [], []
    for p in range(1, pairs + 1):
        g, r = load(f"{kind}_oip_{p}"), load(f"{kind}_{rest}_{p}")
        assert g["errors"] == {} and r["errors"] == {}, (g["errors"], r["errors"])
        ratios.append(r["requests_per_s"] / g["requests_per_s"])
        grpc_runs.append(g), rest_runs.append(r)
        print(f"| {kind} | {t} | {p} | {g['requests_per_s']:.1f} | {r['requests_per_s']:.1f} | "
              f"{ratios[-1]:.3f} | {g['latency_ms']['p50']:.2f} | {r['latency_ms']['p50']:.2f} |")
    med = lambda runs, f: statistics.median(f(x) for x in runs)
    print(f"| {kind} | {t} | **median** | {med(grpc_runs, lambda x: x['requests_per_s']):.1f} | "
          f"{med(rest_runs, lambda x: x['requests_per_s']):.1f} | "
          f"**{statistics.median(ratios):.3f}** | "
          f"{med(grpc_runs, lambda x: x['latency_ms']['p50']):.2f} | "
          f"{med(rest_runs, lambda x: x['latency_ms']['p50']):.2f} |")
PY
