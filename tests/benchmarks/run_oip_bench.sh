#!/usr/bin/env bash
# The Open Inference Protocol and Python client targets, measured A/B against one server (demo
# model, T=128), the two sides of each comparison interleaved so that drift on a shared machine
# falls on both alike (A B, B A, A B, ...):
#   (1) ModelInfer vs Attend throughput: `attnserve-cli bench --protocol oip` vs `--protocol v1`,
#       closed loop, concurrency 16 and 64, DURATION_S seconds each after 100 warm-up requests
#       (target: ModelInfer within 5 % of Attend);
#   (2) Python client vs C++ client latency at concurrency 1: python_client_bench.py --mode client
#       (the attnserve package's Client.attend) vs `attnserve-cli bench` (the C++ library's
#       Client::AttendAsync), both attnserve.v1 Attend, REQUESTS requests each after 20 warm-up
#       requests (target: Python adds <= 15 %).
# Prints every run and the medians over PAIRS pairs as markdown tables.
#
# Usage: tests/benchmarks/run_oip_bench.sh [build_dir]      (default: $BUILD_DIR or <repo>/build)
# Environment: DURATION_S (default 10), REQUESTS (default 2000), PAIRS (default 3), KEEP_LOGS=1,
#   ONLY=throughput or ONLY=latency (one of the two comparisons).
# Needs Debian's python3-grpcio, python3-numpy and pip (the package is pip-installed into the
# temporary folder, no index). Takes ~4 minutes.
set -euo pipefail

bench_name=run_oip_bench
# shellcheck source=server_bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/server_bench_lib.sh"

duration_s="${DURATION_S:-10}"
requests="${REQUESTS:-2000}"
pairs="${PAIRS:-3}"
only="${ONLY:-}"
site="${work}/site"
PIP_ROOT_USER_ACTION=ignore /usr/bin/python3 -m pip install --quiet --no-build-isolation \
  --no-deps --no-index --target "${site}" "${repo_root}/client/python"

log "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
start_server "${work}/server.log" --metrics-off
target="127.0.0.1:${port}"

# cpp_bench NAME BENCH FLAGS...: one attnserve-cli bench run, JSON in ${work}/NAME.json.
cpp_bench() {
  local name="$1"
  shift
  log "${name}: attnserve-cli bench $*"
  "${cli_bin}" --target "${target}" --timeout-s 30 -q bench --model demo --seq-len 128 --json \
    "$@" >"${work}/${name}.json"
}

# python_bench NAME: one python_client_bench.py run (Client.attend), JSON in ${work}/NAME.json.
python_bench() {
  log "$1: python_client_bench.py --mode client --requests ${requests}"
  PYTHONPATH="${site}" /usr/bin/python3 "${repo_root}/tests/benchmarks/python_client_bench.py" \
    --target "${target}" --mode client --model demo --seq-len 128 --concurrency 1 \
    --requests "${requests}" --warmup-requests 20 --json >"${work}/$1.json"
}

throughput_concurrencies=(16 64)
if [[ "${only}" == latency ]]; then throughput_concurrencies=(); fi
for concurrency in "${throughput_concurrencies[@]}"; do
  for ((pair = 1; pair <= pairs; ++pair)); do
    order=(v1 oip)
    if ((pair % 2 == 0)); then order=(oip v1); fi
    for protocol in "${order[@]}"; do
      cpp_bench "tput_c${concurrency}_${protocol}_${pair}" --protocol "${protocol}" \
        --concurrency "${concurrency}" --duration "${duration_s}" --warmup-requests 100
    done
  done
done

latency_pairs="${pairs}"
if [[ "${only}" == throughput ]]; then latency_pairs=0; fi
for ((pair = 1; pair <= latency_pairs; ++pair)); do
  if ((pair % 2 == 1)); then
    cpp_bench "lat_cpp_${pair}" --concurrency 1 --requests "${requests}" --warmup-requests 20
    python_bench "lat_py_${pair}"
  else
    python_bench "lat_py_${pair}"
    cpp_bench "lat_cpp_${pair}" --concurrency 1 --requests "${requests}" --warmup-requests 20
  fi
done
stop_server
log "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "${work}" "${pairs}" "${only}" <<'EOF'
import json, statistics, sys
work, pairs, only = sys.argv[1], int(sys.argv[2]), sys.argv[3]
load = lambda name: json.load(open(f"{work}/{name}.json"))
if only != "latency":
    print("ModelInfer vs Attend, T=128, closed loop (requests/s; p50 ms):\n")
    print("| concurrency | pair | Attend req/s | ModelInfer req/s | ModelInfer / Attend "
          "| Attend p50 | ModelInfer p50 |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for c in (16, 64):
        ratios, a_all, b_all = [], [], []
        for p in range(1, pairs + 1):
            a, b = load(f"tput_c{c}_v1_{p}"), load(f"tput_c{c}_oip_{p}")
            assert a["errors"] == {} and b["errors"] == {}, (a["errors"], b["errors"])
            ratios.append(b["requests_per_s"] / a["requests_per_s"])
            a_all.append(a), b_all.append(b)
            print(f"| {c} | {p} | {a['requests_per_s']:.1f} | {b['requests_per_s']:.1f} | "
                  f"{ratios[-1]:.3f} | {a['latency_ms']['p50']:.2f} | {b['latency_ms']['p50']:.2f} |")
        med = lambda runs, f: statistics.median(f(r) for r in runs)
        print(f"| {c} | **median** | {med(a_all, lambda r: r['requests_per_s']):.1f} | "
              f"{med(b_all, lambda r: r['requests_per_s']):.1f} | **{statistics.median(ratios):.3f}** | "
              f"{med(a_all, lambda r: r['latency_ms']['p50']):.2f} | "
              f"{med(b_all, lambda r: r['latency_ms']['p50']):.2f} |")
if only != "throughput":
    print("\nPython Client.attend vs C++ client (attnserve-cli bench), T=128, concurrency 1 (ms):\n")
    print("| pair | C++ p50 | Python p50 | Python / C++ p50 | C++ mean | Python mean "
          "| Python / C++ mean | client CPU us/request C++ / Python |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    p50s, means, rows = [], [], []
    for p in range(1, pairs + 1):
        cr, yr = load(f"lat_cpp_{p}"), load(f"lat_py_{p}")
        c, y = cr["latency_ms"], yr["latency_ms"]
        c["cpu"] = 1e6 * cr["client_cpu_s"] / cr["requests"]
        y["cpu"] = 1e6 * yr["client_cpu_s"] / yr["requests"]
        p50s.append(y["p50"] / c["p50"]), means.append(y["mean"] / c["mean"]), rows.append((c, y))
        print(f"| {p} | {c['p50']:.3f} | {y['p50']:.3f} | {p50s[-1]:.3f} | {c['mean']:.3f} | "
              f"{y['mean']:.3f} | {means[-1]:.3f} | {c['cpu']:.0f} / {y['cpu']:.0f} |")
    med = lambda i, k: statistics.median(r[i][k] for r in rows)
    print(f"| **median** | {med(0, 'p50'):.3f} | {med(1, 'p50'):.3f} | "
          f"**{statistics.median(p50s):.3f}** | {med(0, 'mean'):.3f} | {med(1, 'mean'):.3f} | "
          f"**{statistics.median(means):.3f}** | {med(0, 'cpu'):.0f} / {med(1, 'cpu'):.0f} |")
EOF
