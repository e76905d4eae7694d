#!/usr/bin/env bash
# Builds the attnserve image from the root Dockerfile with a real Docker engine (Debian's docker.io)
# and tests it as users run it; then runs the same checks on the same image with podman, a second
# engine. CI runs this from .ci/run. As root:
#   bash deploy/container-test.sh
#   ATTNSERVE_CONTAINER_ENGINES=docker bash deploy/container-test.sh     # Docker only
#
# 1. The engine: the Docker daemon already answering (DOCKER_HOST or the default socket), or else
#    one this script starts and stops: `dockerd --iptables=false --bridge=none` with its own socket,
#    data root (/var/lib/attnserve-container-test/docker, kept: base images and build cache) and
#    exec root; the host's Docker configuration is untouched.
# 2. The FROM images: unless present, `debootstrap --variant=minbase bookworm` imported with
#    `docker import` as debian:bookworm-slim and debian:bookworm (no registry is reachable).
# 3. `docker build --network host`; prints the build time and the image size.
# 4. For each engine (podman gets the image with `docker save | podman load`): runs the image as
#    the README does (no flags but --log-level debug; default ports; read-only, no capabilities)
#    with `--network none`, its own network namespace. Instead of `-p` (an engine without a bridge
#    cannot publish ports) a second container from the image, in a namespace of its own too, is
#    linked to it by a veth pair with link-local addresses (169.254.50.0/30, no private range):
#    what `-p` gives, the ports reached from outside the container. Checks: the image's
#    HEALTHCHECK reaches `healthy`; uid 10001, tini as PID 1; an Attend call with the image's
#    attnserve-cli, from the other container and with `docker exec`; the REST port (8000) from
#    outside: GET /v2/health/ready 200 and a JSON infer 200 with `outputs`; /metrics from outside
#    (counting both Attends and the REST infer); a model repository mounted at /models; SIGTERM
#    (`docker stop -t 40`) during a bench run: every accepted request answered OK, the rest
#    refused with UNAVAILABLE, exit 0, stop time printed.
# Exits non-zero, naming the engine and the failed check, on any failure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=podman-config.sh
source "$root/deploy/podman-config.sh"
image=${ATTNSERVE_IMAGE:-localhost/attnserve:test}
engines=${ATTNSERVE_CONTAINER_ENGINES:-docker podman}
mirror=${ATTNSERVE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
state=/var/lib/attnserve-container-test # the data root of the dockerd this script starts
run_dir=/run/attnserve-container-test   # its socket, pidfile and exec root
work=$(mktemp -d /var/tmp/attnserve-container-test.XXXXXX)
start=$(date +%s)
engine=docker
started_dockerd=""
containers=()

log() { echo "container-test: $*"; }
fail() {
  echo "container-test: FAILED ($engine): $*" >&2
  exit 1
}
# Seconds since $1 (a `date +%s.%N`), with two decimals.
since() { python3 -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.2f}')" "$1"; }

stop_dockerd() {
  kill -TERM "$started_dockerd" 2>/dev/null || return 0
  for _ in $(seq 300); do
    kill -0 "$started_dockerd" 2>/dev/null || return 0
    sleep 0.1
  done
  echo "container-test: dockerd $started_dockerd still running 30 s after SIGTERM; killing it" >&2
  kill -KILL "$started_dockerd" 2>/dev/null || true
}
cleanup() {
  for c in "${containers[@]}"; do
    "${c%%:*}" rm -f "${c#*:}" >/dev/null 2>&1 || true # (already removed when its checks passed)
  done
  [ -z "$started_dockerd" ] || stop_dockerd
  rm -rf "$work"
}
trap cleanup EXIT

bash "$root/deploy/install-deps.sh" container
# Debian's client (docker.io), whatever else is first on PATH.
docker() { /usr/bin/docker "$@"; }
# One lock for the whole test: two runs would share the dockerd, the data root and the image tag.
mkdir -p "$state" "$run_dir"
exec 9>"$state/lock"
flock 9

# --- 1. the Docker engine ---
if ! timeout 10 docker info >/dev/null 2>&1; then
  export DOCKER_HOST=unix://$run_dir/docker.sock
  if [ -s "$run_dir/dockerd.pid" ] && timeout 10 docker info >/dev/null 2>&1; then
    started_dockerd=$(cat "$run_dir/dockerd.pid") # an earlier run's, left behind: stopped at exit
  else
    log "no Docker engine answers: starting dockerd --iptables=false --bridge=none"
    rm -f "$run_dir/dockerd.pid" "$run_dir/docker.sock"
    dockerd --iptables=false --bridge=none --host "$DOCKER_HOST" --data-root "$state/docker" \
      --exec-root "$run_dir/exec" --pidfile "$run_dir/dockerd.pid" >"$work/dockerd.log" 2>&1 &
    started_dockerd=$!
    for _ in $(seq 60); do
      timeout 10 docker info >/dev/null 2>&1 && break
      kill -0 "$started_dockerd" 2>/dev/null || { tail -20 "$work/dockerd.log"; fail "dockerd exited"; }
      sleep 1
    done
    timeout 10 docker info >/dev/null 2>&1 || { tail -20 "$work/dockerd.log"; fail "dockerd not answering after 60 s"; }
  fi
fi
log "Docker $(docker version --format '{{.Server.Version}}') answering on ${DOCKER_HOST:-the default socket}"

# --- 2. base images ---
if ! docker image inspect debian:bookworm-slim >/dev/null 2>&1; then
  log "making the Debian base image (debootstrap --variant=minbase bookworm from $mirror)"
  debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 ||
    { tail -20 "$work/debootstrap.log"; fail "debootstrap"; }
  rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/lib/apt/lists/*
  tar -C "$work/rootfs" -c . | docker import - debian:bookworm-slim >/dev/null
  rm -rf "$work/rootfs"
fi
docker image inspect debian:bookworm >/dev/null 2>&1 || docker tag debian:bookworm-slim debian:bookworm
log "engine and base images ready after $(($(date +%s) - start)) s"

# --- 3. build ---
build_start=$(date +%s)
revision=$(git -c safe.directory="$root" -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
docker build --network host --build-arg "ATTNSERVE_GIT_REVISION=$revision" -t "$image" "$root" \
  >"$work/build.log" 2>&1 ||
  { tail -40 "$work/build.log"; fail "docker build"; }
size_bytes=$(docker image inspect --format '{{.Size}}' "$image")
log "built $image in $(($(date +%s) - build_start)) s; image size $((size_bytes / 1000000)) MB"
# The image reports the release and the revision it was built from.
version_line=$(docker run --rm --network none "$image" --version | head -1)
[[ $version_line == "attnserve "*" (git $revision)" ]] ||
  fail "attnserve --version in the image says '$version_line', not the revision $revision"
log "image: $version_line"

# --- 4. run ---
# podman: a containers.conf of this script's own (deploy/podman-config.sh), then the image Docker
# built.
setup_podman() {
  write_podman_config "$work"
  docker save "$image" | podman load >"$work/podman-load.log" 2>&1 ||
    { cat "$work/podman-load.log"; fail "docker save | podman load"; }
}

# Starts a container of the image with `$engine run -d --name $1 --network none` and the rest of
# the arguments; it is removed at exit.
run() {
  local name=$1
  shift
  containers+=("$engine:$name")
  "$engine" run -d --name "$name" --network none "$@" >/dev/null 2>"$work/run.err" ||
    { cat "$work/run.err"; fail "$engine run $name"; }
}
pid_of() { "$engine" inspect --format '{{.State.Pid}}' "$1"; }

# Links container $1 (the server, 169.254.50.2) to the client container (169.254.50.1) with a
# veth pair; it goes away with the server's network namespace.
link_to_client() {
  local server_pid client_pid
  server_pid=$(pid_of "$1")
  client_pid=$(pid_of "$client")
  ip link add "ct$$-c" type veth peer name "ct$$-s"
  ip link set "ct$$-c" netns "$client_pid"
  ip link set "ct$$-s" netns "$server_pid"
  nsenter -t "$client_pid" -n ip addr add 169.254.50.1/30 dev "ct$$-c"
  nsenter -t "$client_pid" -n ip link set "ct$$-c" up
  nsenter -t "$server_pid" -n ip addr add 169.254.50.2/30 dev "ct$$-s"
  nsenter -t "$server_pid" -n ip link set "ct$$-s" up
}

# The image's attnserve-cli in the client container, calling the server over the veth.
cli() { "$engine" exec "$client" attnserve-cli --target 169.254.50.2:50051 "$@"; }
# /metrics from the client container's network namespace (with the host's python3: the image has
# no HTTP client).
metrics() {
  nsenter -t "$(pid_of "$client")" -n python3 -c \
    'import urllib.request; print(urllib.request.urlopen("http://169.254.50.2:8002/metrics", timeout=10).read().decode())'
}
# The Open Inference Protocol's REST port (--http-address, 8000) from the client container's
# network namespace (the host's python3, as for /metrics): GET /v2/health/ready must answer 200
# {"ready": true}, and one JSON infer to the demo model (d_model 512) 200 with an `outputs` field
# holding "output" [1, 512]. Prints the answer's model, version and output shape.
rest() {
  nsenter -t "$(pid_of "$client")" -n python3 - <<'EOF'
import json, urllib.error, urllib.request
base = "http://169.254.50.2:8000"
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy
def call(path, body=None):
    headers = {"Content-Type": "application/json"} if body is not None else {}
    try:
        with opener.open(urllib.request.Request(base + path, data=body, headers=headers),
                         timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:  # a status other than 2xx: reported below
        return error.code, error.read().decode()
status, text = call("/v2/health/ready")
assert status == 200, f"GET /v2/health/ready: HTTP {status} {text}"
assert json.loads(text).get("ready") is True, f"GET /v2/health/ready: {text}"
body = {"inputs": [{"name": "input", "shape": [1, 512], "datatype": "FP32",
                    "data": [(i % 17 - 8) / 16 for i in range(512)]}]}
status, text = call("/v2/models/demo/infer", json.dumps(body).encode())
assert status == 200, f"POST /v2/models/demo/infer: HTTP {status} {text[:300]}"
answer = json.loads(text)
assert "outputs" in answer, f"POST /v2/models/demo/infer: no `outputs` in {text[:300]}"
output = {o.get("name"): o for o in answer["outputs"]}.get("output")
assert output is not None, f"no output named `output`: {[o.get('name') for o in answer['outputs']]}"
assert output.get("shape") == [1, 512] and len(output.get("data") or []) == 512, \
    f"output shape {output.get('shape')}, {len(output.get('data') or [])} values, not [1, 512]"
print(f"model {answer.get('model_name')} (version {answer.get('model_version')}): "
      f"output {output['shape']}")
EOF
}

# Waits up to 90 s for the image's HEALTHCHECK to make container $1 healthy. Docker runs it every
# 10 s (the image's interval); podman without systemd cannot schedule it, so it is run here.
wait_healthy() {
  local status
  for _ in $(seq 90); do
    # Not a check (the status below is): a run that finds the server still starting exits 1, and
    # under `set -e` a failing last command of an && list ended this script without a word.
    if [ "$engine" = podman ]; then podman healthcheck run "$1" >/dev/null 2>&1 || true; fi
    status=$("$engine" inspect --format '{{.State.Health.Status}}' "$1")
    [ "$status" = healthy ] && return 0
    [ "$("$engine" inspect --format '{{.State.Running}}' "$1")" = true ] ||
      { "$engine" logs "$1" 2>&1 | tail -20; fail "container $1 exited before it was healthy"; }
    sleep 1
  done
  "$engine" logs "$1" 2>&1 | tail -20
  fail "container $1 is $status, not healthy, after 90 s"
}

# `$engine stop -t 40` (SIGTERM, the image's STOPSIGNAL; SIGKILL after 40 s), timed; the container
# must exit 0. Sets stop_seconds (the command's round trip) and drain_seconds (the server's own
# SIGTERM-to-exit, from its log) and leaves the log in $work/server.log.
stop_timed() {
  local t0 code
  t0=$(date +%s.%N)
  "$engine" stop -t 40 "$1" >/dev/null 2>>"$work/run.err" || fail "$engine stop $1"
  stop_seconds=$(since "$t0")
  code=$("$engine" inspect --format '{{.State.ExitCode}}' "$1")
  [ "$code" = 0 ] || { "$engine" logs "$1" 2>&1 | tail -20; fail "$1 exited $code after SIGTERM"; }
  "$engine" logs "$1" >"$work/server.log" 2>&1
  grep -q 'SIGTERM received: draining' "$work/server.log" || fail "no drain logged"
  grep -q 'drained; exiting' "$work/server.log" || fail "the drain did not finish"
  drain_seconds=$(python3 -c '
import datetime, sys
def at(marker):  # the log line time stamp, "YYYY-MM-DD HH:MM:SS.mmm"
    line = next(l for l in open(sys.argv[1]) if marker in l)
    return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S.%f")
drain = at("drained; exiting") - at("SIGTERM received: draining")
print(f"{drain.total_seconds():.3f}")
' "$work/server.log")
}

check_engine() {
  engine=$1
  local server=attnserve-ct-$engine-$$ models_server=attnserve-ct-$engine-models-$$
  client=attnserve-ct-$engine-client-$$
  [ "$engine" = docker ] || setup_podman
  # The client: the image's tini keeping `sleep infinity` alive, in a network namespace of its own.
  run "$client" --entrypoint /usr/bin/tini "$image" -- sleep infinity

  # The server runs as deploy/k8s/deployment.yaml confines it: a read-only root file system, no
  # capabilities, no privilege escalation (the README's command, with --network none for -p).
  local confined=(--read-only --cap-drop all --security-opt no-new-privileges)
  local run_start
  run_start=$(date +%s.%N)
  run "$server" "${confined[@]}" "$image" --log-level debug
  link_to_client "$server"
  wait_healthy "$server"
  log "$engine: healthy (the image's HEALTHCHECK) $(since "$run_start") s after $engine run"
  [ "$("$engine" exec "$server" id -u)" = 10001 ] || fail "the server does not run as uid 10001"
  [ "$("$engine" exec "$server" cat /proc/1/comm)" = tini ] || fail "PID 1 is not tini"

  local attend
  attend=$(cli attend --random 4 --seed 7) || fail "attnserve-cli attend: $attend"
  grep -q 'model demo (version 1)' <<<"$attend" || fail "attend did not answer from demo: $attend"
  grep -q 'output \[4, 512\]' <<<"$attend" || fail "attend output is not [4, 512]: $attend"
  attend=$("$engine" exec "$server" attnserve-cli attend --random 4 --seed 7) ||
    fail "$engine exec attnserve-cli attend: $attend"
  grep -q 'output \[4, 512\]' <<<"$attend" || fail "attend (exec) output is not [4, 512]: $attend"
  log "$engine: Attend through the image's attnserve-cli, over the veth and with $engine exec: [4, 512]"

  # The REST port from outside, as `-p 8000:8000` gives it: readiness and one JSON infer.
  local answered
  answered=$(rest 2>&1) || fail "REST on port 8000: $answered"
  log "$engine: REST over the veth: GET /v2/health/ready 200; POST /v2/models/demo/infer 200, $answered"

  local scrape
  scrape=$(metrics) || fail "GET /metrics"
  grep -Eq '^attnserve_requests_total\{.*code="OK".*method="Attend".*model="demo".*\} 2$' <<<"$scrape" ||
    fail "/metrics does not count the two Attend calls: $(grep attnserve_requests_total <<<"$scrape")"
  grep -Eq '^attnserve_requests_total\{.*code="OK".*method="RestInfer".*model="demo".*\} 1$' <<<"$scrape" ||
    fail "/metrics does not count the REST infer: $(grep attnserve_requests_total <<<"$scrape")"
  grep -Eq '^attnserve_model_loaded\{model="demo"\} 1$' <<<"$scrape" || fail "/metrics: demo not loaded"
  log "$engine: /metrics, scraped over the veth, counts the Attend calls and the REST infer"

  # SIGTERM in the middle of a bench run (from the client container): the bench outlives the
  # server, so every request's fate is seen.
  cli --max-attempts 1 --timeout-s 30 -q bench --concurrency 8 --seq-len 16 --duration 5 --json \
    >"$work/bench.json" 2>"$work/bench.err" &
  local bench=$!
  for _ in $(seq 200); do
    [ "$("$engine" logs "$server" 2>&1 | grep -c 'queued model=demo')" -ge 300 ] && break
    sleep 0.1
  done
  stop_timed "$server"
  wait "$bench" || true # the bench fails by design: requests after the drain get UNAVAILABLE
  local queued
  queued=$(grep -c 'queued model=demo' "$work/server.log")
  python3 - "$work/bench.json" "$((queued - 3))" "$engine" <<'EOF' || fail "SIGTERM during bench: $(cat "$work/bench.err")"
import json, sys
summary = json.load(open(sys.argv[1]))
accepted = int(sys.argv[2])  # queued during the bench (the two Attends, the REST infer excluded)
errors = summary["errors"]
print(f"container-test: {sys.argv[3]}: SIGTERM during bench: {accepted} accepted, "
      f"{summary['ok']} answered OK; not accepted: {errors}")
assert accepted >= 300, f"only {accepted} requests were accepted before SIGTERM"
assert errors.get("UNAVAILABLE", 0) > 0, "SIGTERM came after the bench: no call was refused"
assert summary["ok"] == accepted, f"accepted {accepted} but answered {summary['ok']}"
# Refused by the draining or stopped server: UNAVAILABLE. CANCELLED: calls in flight at two
# moments, at most the bench's 8 each: when the stopping server's gRPC shut down (calls that had
# reached the transport but no handler, so never accepted), and when the bench's duration ended.
assert set(errors) <= {"UNAVAILABLE", "CANCELLED"}, f"unexpected errors: {errors}"
assert errors.get("CANCELLED", 0) <= 2 * 8, f"more cancelled calls than 2 x the bench's 8: {errors}"
EOF
  log "$engine: SIGTERM under load: drained, every accepted request answered, exit 0; $engine stop took $stop_seconds s (the drain $drain_seconds s)"

  # A model repository mounted at /models (read-only) is served instead of the demo model.
  run "$models_server" "${confined[@]}" -v "$work/models:/models:ro" "$image"
  link_to_client "$models_server"
  wait_healthy "$models_server"
  local listed
  listed=$(cli models) || fail "attnserve-cli models: $listed"
  grep -q tiny <<<"$listed" || fail "the mounted model is not listed: $listed"
  ! grep -q demo <<<"$listed" || fail "the demo model serves although /models is mounted: $listed"
  attend=$(cli attend --model tiny --random 3) || fail "attend on the mounted model: $attend"
  grep -q 'output \[3, 8\]' <<<"$attend" || fail "the mounted model's output is not [3, 8]: $attend"
  stop_timed "$models_server"
  log "$engine: a repository mounted at /models serves its model; idle $engine stop: exit 0; $engine stop took $stop_seconds s (the drain $drain_seconds s)"
  # Not a check: a removal that fails (a busy mount on a loaded machine) is retried at exit. (podman
  # without systemd logs that it has no healthcheck timer to remove.)
  "$engine" rm -f "$server" "$models_server" "$client" >/dev/null 2>"$work/rm.err" ||
    log "$engine: warning: $engine rm -f failed, retried at exit: $(tail -3 "$work/rm.err")"
}

mkdir -p "$work/models/tiny"
python3 - "$work/models/tiny" <<'EOF'
import json, random, struct, sys
folder, d = sys.argv[1], 8
json.dump({"d_model": d, "num_heads": 2}, open(f"{folder}/config.json", "w"))
names = ["W_Q", "W_K", "W_V", "W_O"]
header, offset = {}, 0
for name in names:
    header[name] = {"dtype": "F32", "shape": [d, d], "data_offsets": [offset, offset + 4 * d * d]}
    offset += 4 * d * d
meta = json.dumps(header).encode()
rng = random.Random(1)
with open(f"{folder}/weights.safetensors", "wb") as out:
    out.write(struct.pack("<Q", len(meta)) + meta)
    out.write(struct.pack(f"<{4 * d * d}f", *(rng.uniform(-0.5, 0.5) for _ in range(4 * d * d))))
EOF
chmod -R a+rX "$work/models"
chmod a+x "$work"

for e in $engines; do
  case $e in
    docker | podman) check_engine "$e" ;;
    *) fail "unknown engine '$e' in ATTNSERVE_CONTAINER_ENGINES (docker, podman)" ;;
  esac
done

log "all checks passed with $engines in $(($(date +%s) - start)) s (image $image, $((size_bytes / 1000000)) MB)"
