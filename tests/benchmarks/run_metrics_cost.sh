#!/usr/bin/env bash
# What metrics cost: the same load against attnserve with metrics on (--metrics-address
# 127.0.0.1:0, scraped every second meanwhile, as a busy Prometheus would) and off
# (--metrics-address ""), alternating on/off ROUNDS times in one run so that drifts of the machine
# hit both alike. Two loads: many small requests (T=16, concurrency 64: the most requests per
# second, so the most metric updates per unit of work) and 128-token requests at concurrency 1
# (latency). Prints a markdown table: median requests/s and p50 latency, on vs off.
#
# Usage: tests/benchmarks/run_metrics_cost.sh [build_dir]    (default: $BUILD_DIR or <repo>/build)
# Environment: ROUNDS (default 3), DURATION_S (seconds per load run, default 8), QUIET_WAIT_S,
#   SERVER_FLAGS, LOAD_FLAGS (attnserve-cli bench flags), KEEP_LOGS=1 (as in run_server_bench.sh).
# Takes ~2 minutes with the defaults on 2 cores.
set -euo pipefail

bench_name=run_metrics_cost
# shellcheck source=server_bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/server_bench_lib.sh"

rounds="${ROUNDS:-3}"

# Scrapes the running server's /metrics once a second until killed (a Prometheus at 1 s). One
# long-lived process, so that the scraper itself costs the shared cores little.
scraper_pid=""
start_scraper() {
  python3 - "$1" <<'PY' &
import re, sys, time, urllib.request
log, url = sys.argv[1], None
while True:
    if url is None:
        try:
            found = re.search(r"metrics at (http://\S+)", open(log).read())
            url = found.group(1) if found else None
        except OSError:
            pass
    if url is not None:
        try:
            urllib.request.urlopen(url, timeout=5).read()
        except OSError:
            url = None  # The server of this scenario is gone; the next one logs a new port.
    time.sleep(1)
PY
  scraper_pid=$!
}
stop_scraper() {
  kill "${scraper_pid}" 2>/dev/null || true
  wait "${scraper_pid}" 2>/dev/null || true
}

for round in $(seq 1 "${rounds}"); do
  for mode in on off; do
    flags="--metrics-address 127.0.0.1:0"
    if [[ "${mode}" == off ]]; then flags="--metrics-off"; fi
    # The scraper reads the log start_server writes; it waits for the metrics line itself.
    if [[ "${mode}" == on ]]; then start_scraper "${work}/small_${mode}_${round}.server.log"; fi
    scenario "small_${mode}_${round}" "${flags}" --seq-len 16 --concurrency 64
    if [[ "${mode}" == on ]]; then
      stop_scraper
      start_scraper "${work}/long_${mode}_${round}.server.log"
    fi
    scenario "long_${mode}_${round}" "${flags}" --seq-len 128 --concurrency 1
    if [[ "${mode}" == on ]]; then stop_scraper; fi
  done
done

python3 - "${work}" "${rounds}" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
def runs(load, mode):
    return [json.load(open(f"{work}/{load}_{mode}_{r}.json")) for r in range(1, rounds + 1)]
print("| load | metrics | requests/s (each run) | median requests/s | p50 ms (median) | errors |")
print("|---|---|---|---|---|---|")
for load, title in (("small", "T=16, concurrency 64"), ("long", "T=128, concurrency 1")):
    medians = {}
    for mode in ("on", "off"):
        rs = runs(load, mode)
        rps = [r["requests_per_s"] for r in rs]
        p50 = statistics.median(r["latency_ms"]["p50"] for r in rs)
        medians[mode] = statistics.median(rps)
        errors = sum(sum(r["errors"].values()) for r in rs)
        print(f"| {title} | {mode} | {' / '.join(f'{x:,.0f}' for x in rps)} | "
              f"{medians[mode]:,.0f} | {p50:.3f} | {errors} |")
    diff = 100 * (medians["on"] - medians["off"]) / medians["off"]
    print(f"| {title} | on vs off | | {diff:+.1f} % | | |")
PY
