#!/usr/bin/env bash
# End-to-end check of attnserve's /metrics with a real Prometheus:
#   attnserve (ephemeral gRPC and metrics ports) ← Prometheus scraping every 1 s (its config
#   derived from deploy/prometheus.yml) ← attnserve-cli bench driving ~300 unary Attend calls and
#   six short runs of decoding sessions,
#   plus calls that fail (INVALID_ARGUMENT: too long a sequence, two `attnserve-cli attend`;
#   NOT_FOUND: model "nope"). Then asks Prometheus' HTTP API for what the dashboard plots and
#   checks the answers are plausible.
# Usage: prometheus_scrape_test.sh ATTNSERVE ATTNSERVE_CLI REPO_ROOT
# Exits 0 on success, 1 on failure or without prometheus (a missing install step must fail CI,
# not skip).
# Everything listens on 127.0.0.1; every wait is bounded; the trap stops every child it started.
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 ATTNSERVE ATTNSERVE_CLI REPO_ROOT" >&2; exit 2; }
attnserve=$1 cli=$2 root=$3
# Debian's interpreter on purpose: a virtualenv's python3 earlier on PATH is not what CI has.
python=${PYTHON:-/usr/bin/python3}
[ -x "$python" ] || python=$(command -v python3)
started=$SECONDS

if ! command -v prometheus >/dev/null; then
  echo "prometheus_scrape_test: FAIL: prometheus not found (deploy/install-deps.sh installs it)" >&2
  exit 1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/attnserve-scrape.XXXXXX")
children=()
cleanup() {
  local rc=$? pid
  # TERM first so Prometheus closes its TSDB cleanly, KILL what is still there 5 s later.
  for pid in "${children[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 50); do
    local alive=0
    for pid in "${children[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive -eq 0 ] && break
    sleep 0.1
  done
  for pid in "${children[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
  exit $rc
}
trap cleanup EXIT
trap 'exit 1' INT TERM  # through the EXIT trap

fail() {
  echo "prometheus_scrape_test: FAIL: $*" >&2
  for log in attnserve.log prometheus.log; do
    [ -f "$tmp/$log" ] && { echo "--- last lines of $log:" >&2; tail -n 15 "$tmp/$log" >&2; }
  done
  exit 1
}
say() { echo "prometheus_scrape_test: [$((SECONDS - started)) s] $*"; }

# GET a URL on 127.0.0.1 and print the body (python: curl is not a build dependency).
http_get() {
  "$python" -c 'import sys, urllib.request
print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$1"
}

# 1. attnserve on ephemeral ports. The repository folder does not exist, so the embedded `demo`
#    model serves; the short grace keeps a stuck drain from eating the ctest timeout;
#    --max-sequence-length 64 lets a small request (65 tokens) be INVALID_ARGUMENT.
"$attnserve" --grpc-address 127.0.0.1:0 --http-address 127.0.0.1:0 --metrics-address 127.0.0.1:0 --log-format text \
  --model-repository "$tmp/no-models" --shutdown-grace-s 5 --max-sequence-length 64 \
  >"$tmp/attnserve.log" 2>&1 &
attnserve_pid=$!
children+=("$attnserve_pid")
grpc_port='' metrics_port=''
deadline=$((SECONDS + 30))
while [ -z "$grpc_port" ] || [ -z "$metrics_port" ]; do
  [ $SECONDS -lt $deadline ] || fail "no 'listening' and 'metrics at' lines from attnserve in 30 s"
  kill -0 "$attnserve_pid" 2>/dev/null || fail "attnserve exited during start-up"
  sleep 0.1
  log=$tmp/attnserve.log
  grpc_port=$(sed -n 's/.*attnserve listening on .*(port \([0-9]*\)).*/\1/p' "$log" | head -n 1)
  metrics_port=$(sed -n 's|.*metrics at http://[^ ]*:\([0-9]*\)/metrics.*|\1|p' "$log" | head -n 1)
done
say "attnserve pid $attnserve_pid: gRPC 127.0.0.1:$grpc_port, metrics 127.0.0.1:$metrics_port"
http_get "http://127.0.0.1:$metrics_port/metrics" >"$tmp/metrics_before.txt" ||
  fail "GET http://127.0.0.1:$metrics_port/metrics failed"

# 2. Prometheus, configured by deploy/prometheus.yml with the target and interval swapped; the
#    replacements must each match, so a reshaped prometheus.yml fails here, not silently.
"$python" - "$root/deploy/prometheus.yml" "$tmp/prometheus.yml" "127.0.0.1:$metrics_port" <<'EOF' ||
import sys
source, dest, target = sys.argv[1:]
text = open(source).read()
# The compose replicas, found by DNS; here the one server, as a static target (Prometheus' DNS
# discovery asks DNS servers, not /etc/hosts).
dns = """    dns_sd_configs:
      - names: ["attnserve"]
        type: A
        port: 8002
"""
if text.count(dns) != 1:
    sys.exit(f"{source}: expected the DNS discovery of `attnserve` on port 8002 exactly once")
if "scrape_interval: 5s" not in text:
    sys.exit(f"{source}: expected 'scrape_interval: 5s'")
text = text.replace(dns, f'    static_configs:\n      - targets: ["{target}"]\n')
text = text.replace("        refresh_interval: 5s\n", "")
text = text.replace("scrape_interval: 5s", "scrape_interval: 1s")
text = text.replace("evaluation_interval: 5s", "evaluation_interval: 1s")
open(dest, "w").write(text)
EOF
  fail "could not derive a Prometheus config from deploy/prometheus.yml"
# A free port: bind port 0, read it, close (the tiny race with another process is acceptable).
prom_port=$("$python" -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
prom="http://127.0.0.1:$prom_port"
prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/data" \
  --web.listen-address="127.0.0.1:$prom_port" >"$tmp/prometheus.log" 2>&1 &
prom_pid=$!
children+=("$prom_pid")
deadline=$((SECONDS + 30))
until http_get "$prom/-/ready" >/dev/null 2>&1; do
  [ $SECONDS -lt $deadline ] || fail "Prometheus not ready on $prom within 30 s"
  kill -0 "$prom_pid" 2>/dev/null || fail "Prometheus exited during start-up"
  sleep 0.2
done
say "Prometheus pid $prom_pid ready on $prom (scraping every 1 s)"
# Ready is not scraping: Prometheus applies new targets on a 5 s tick, so load sent now could all
# land before the first scrape and rate() would see a flat series (p99 NaN). Wait for up == 1.
deadline=$((SECONDS + 20))
until [ "$(http_get "$prom/api/v1/query?query=up%7Bjob%3D%22attnserve%22%7D" 2>/dev/null |
  "$python" -c 'import json, sys
r = json.load(sys.stdin)["data"]["result"]
print(r[0]["value"][1] if r else "")' 2>/dev/null)" = 1 ]; do
  [ $SECONDS -lt $deadline ] || fail "Prometheus did not scrape 127.0.0.1:$metrics_port within 20 s"
  sleep 0.2
done
say "first scrape done after $((SECONDS - started)) s (up == 1)"

# 3. Load. Six rounds of 50 spread over ~3 s, so rate() sees the counters grow between several
#    scrapes (one burst between two scrapes gives a rate from a single increase, or none for
#    series born with their first request, such as the error codes).
#    `timeout 30` bounds each run whatever attnserve-cli's own deadlines do (each takes ~50 ms).
#    --max-attempts 1: no retries, so the server sees exactly the calls the client accounts for.
cli_call() { timeout 30 "$cli" --target "127.0.0.1:$grpc_port" --max-attempts 1 -q "$@"; }
ok_sent=0
for round in 1 2 3 4 5 6; do
  cli_call bench --seq-len 16 --concurrency 4 --requests 50 --json >"$tmp/load_$round.json" \
    2>"$tmp/load_$round.err" ||
    fail "attnserve-cli bench round $round failed:" \
      "$(cat "$tmp/load_$round.err" "$tmp/load_$round.json")"
  ok=$("$python" -c 'import json, sys
r = json.load(open(sys.argv[1]))
sys.exit("errors: " + json.dumps(r["errors"])) if r["errors"] else print(r["ok"])' \
    "$tmp/load_$round.json") ||
    fail "attnserve-cli bench round $round: $ok"
  ok_sent=$((ok_sent + ok))
  # Decoding sessions too (the dashboard's decoding row): 4 sessions, 8-row prompts, 8 steps.
  cli_call bench --model demo --sessions 4 --context 8 --steps 8 --json \
    >"$tmp/decode_$round.json" 2>"$tmp/decode_$round.err" ||
    fail "attnserve-cli bench --sessions round $round failed:" \
      "$(cat "$tmp/decode_$round.err" "$tmp/decode_$round.json")"
  sleep 0.5
done
# Failures the server must count: a sequence over --max-sequence-length (64 here) is
# INVALID_ARGUMENT on Attend; model "nope" is NOT_FOUND on GetModel, under model="<unknown>".
# attnserve-cli exits 1 for each, as expected; its error message is checked instead. bench
# refuses a --seq-len over the model's limit before sending, so `attend` sends the long ones.
for call in 1 2; do
  cli_call attend --random 65 >"$tmp/attend_invalid_$call.txt" 2>&1 && rc=0 || rc=$?
  [ $rc -eq 1 ] && grep -q INVALID_ARGUMENT "$tmp/attend_invalid_$call.txt" ||
    fail "expected INVALID_ARGUMENT for 65 rows (exit 1), got exit $rc:" \
      "$(cat "$tmp/attend_invalid_$call.txt")"
done
cli_call bench --model nope --requests 1 >"$tmp/load_nope.txt" 2>&1 || true
grep -q NOT_FOUND "$tmp/load_nope.txt" ||
  fail "expected NOT_FOUND for model nope: $(cat "$tmp/load_nope.txt")"
say "sent $ok_sent OK Attend calls, 2 INVALID_ARGUMENT Attend calls, 1 NOT_FOUND GetModel"

# 4. Ask Prometheus (bounded polling: scrapes land every second) and judge the answers.
"$python" - "$prom" "$ok_sent" "$root" <<'EOF' || fail "Prometheus' answers are implausible (above)"
import json, math, sys, time, urllib.parse, urllib.request
prom, ok_sent, root = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def query(q):
    url = f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    body = json.load(urllib.request.urlopen(url, timeout=5))
    if body.get("status") != "success":
        raise RuntimeError(f"{q}: {body}")
    return [(s["metric"], float(s["value"][1])) for s in body["data"]["result"]]

def total(q):
    return sum(v for _, v in query(q))

P99 = 'histogram_quantile(0.99, sum by (le) (rate(attnserve_request_duration_seconds_bucket[1m])))'
OK = 'attnserve_requests_total{job="attnserve", code="OK", method="Attend"}'
INVALID = 'attnserve_requests_total{job="attnserve", code="INVALID_ARGUMENT", method="Attend"}'
UNKNOWN = 'attnserve_requests_total{job="attnserve", code="NOT_FOUND", model="<unknown>"}'
# Decoding: six runs of 4 sessions, each an 8-row prompt then 8 one-row steps, closed at the end.
decode_counts = {
    'attnserve_decode_tokens_total{job="attnserve", kind="prefill"}': 6 * 4 * 8,
    'attnserve_decode_tokens_total{job="attnserve", kind="decode"}': 6 * 4 * 8,
    'attnserve_decode_step_latency_seconds_count{job="attnserve"}': 6 * 4 * 9,
    'attnserve_decode_sessions_closed_total{job="attnserve"}': 6 * 4,
}
# Wait until the last requests are scraped: all counts reached and a finite p99.
poll_start = time.monotonic()
deadline = poll_start + 20
while True:
    p99 = query(P99)
    got = {"ok": total(OK), "invalid": total(INVALID), "unknown": total(UNKNOWN)}
    done = (p99 and math.isfinite(p99[0][1]) and got["ok"] >= ok_sent and got["invalid"] >= 2
            and got["unknown"] >= 1
            and all(total(q) >= expected for q, expected in decode_counts.items()))
    if done or time.monotonic() > deadline:
        break
    time.sleep(0.5)
failures = []
print(f"  p99 request latency: {p99} (polled {time.monotonic() - poll_start:.1f} s)")
print(f"  requests_total: Attend OK {got['ok']:.0f} (sent {ok_sent}), Attend INVALID_ARGUMENT "
      f"{got['invalid']:.0f} (sent 2), NOT_FOUND under <unknown> {got['unknown']:.0f} (sent 1)")
if not p99 or not (math.isfinite(p99[0][1]) and 0 < p99[0][1] < 10):
    failures.append(f"p99 should be a finite number in (0, 10) s, got {p99}")
if got["ok"] < ok_sent:
    failures.append(f"Attend OK count {got['ok']} < {ok_sent} sent")
if got["invalid"] < 2:
    failures.append(f"Attend INVALID_ARGUMENT count {got['invalid']} < 2 sent")
if got["unknown"] < 1:
    failures.append('no NOT_FOUND counted under model="<unknown>"')
print("  by code: " + ", ".join(f"{m.get('method')}/{m.get('code')}/{m.get('model')}={v:.0f}"
                                for m, v in query('attnserve_requests_total{job="attnserve"}')))

rss = query('process_resident_memory_bytes{job="attnserve"}')
print(f"  process_resident_memory_bytes: {rss}")
if not rss or not rss[0][1] > 1e6:
    failures.append(f"process_resident_memory_bytes should be > 1e6, got {rss}")
build = query('attnserve_build_info{job="attnserve"}')
print(f"  attnserve_build_info: {build}")
if len(build) != 1 or build[0][1] != 1:
    failures.append(f"attnserve_build_info should be one series equal to 1, got {build}")
# The dashboard's other families: each must have been scraped (a misnamed one shows up here).
for name in ["attnserve_queue_duration_seconds_count", "attnserve_compute_duration_seconds_count",
             "attnserve_batch_sequences_count", "attnserve_batch_tokens_count",
             "attnserve_queue_depth", "attnserve_inflight_requests", "attnserve_tokens_total",
             "attnserve_model_loaded", "process_cpu_seconds_total", "process_start_time_seconds",
             "process_open_fds", "process_virtual_memory_bytes"]:
    found = query(f'{name}{{job="attnserve"}}')
    if not found:
        failures.append(f"{name}: no series scraped")
tokens = total('attnserve_tokens_total{job="attnserve"}')
if tokens < 16 * ok_sent:
    failures.append(f"attnserve_tokens_total {tokens} < 16 tokens x {ok_sent} requests")
for q, expected in decode_counts.items():
    if total(q) < expected:
        failures.append(f"{q}: {total(q):.0f}, expected >= {expected}")
iterations = total('attnserve_decode_iteration_seconds_count{job="attnserve"}')
compute = total('attnserve_decode_iteration_seconds_sum{job="attnserve"}')
print(f"  decoding: {iterations:.0f} iterations, {compute * 1e3:.1f} ms of compute")
if not (iterations >= 6 * 9 and compute > 0):
    failures.append(f"attnserve_decode_iteration_seconds: {iterations} iterations (expected"
                    f" >= {6 * 9}), sum {compute} s (expected > 0)")
loaded = query('attnserve_model_loaded{job="attnserve", model="demo"}')
if [v for _, v in loaded] != [1.0]:
    failures.append(f'attnserve_model_loaded{{model="demo"}} should be 1, got {loaded}')
# Every query of the Grafana dashboard, as check_dashboard.py substitutes it, must find data:
# this catches a label or metric the dashboard expects and the server does not export.
sys.path.insert(0, f"{root}/tests/observability")
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import check_dashboard
dashboard = json.load(open(f"{root}/deploy/grafana/attnserve.json"))
variables = {v["name"] for v in dashboard["templating"]["list"]}
queries = check_dashboard.collect(dashboard)
for where, raw, _ in queries:
    if not query(check_dashboard.substitute(raw, variables)[0]):
        failures.append(f"dashboard {where}: no data for {raw!r}")
print(f"  dashboard: {len(queries)} queries evaluated against the scraped data")
for f in failures:
    print("  FAIL: " + f)  # stdout, so it reads in order with the values above
sys.exit(1 if failures else 0)
EOF

# 5. SIGTERM drains and exits 0 (bounded: --shutdown-grace-s 5).
kill -TERM "$attnserve_pid"
deadline=$((SECONDS + 20))
while kill -0 "$attnserve_pid" 2>/dev/null; do
  [ $SECONDS -lt $deadline ] || fail "attnserve still running 20 s after SIGTERM"
  sleep 0.1
done
rc=0
wait "$attnserve_pid" || rc=$?
children=("$prom_pid")  # reaped: its pid must not be signalled again by the trap
[ $rc -eq 0 ] || fail "attnserve exited $rc after SIGTERM, expected 0"
say "attnserve exited 0 after SIGTERM"
say "PASS in $((SECONDS - started)) s"
