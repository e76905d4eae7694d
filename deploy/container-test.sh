#!/usr/bin/env bash
# Builds the attnserve image from the root Dockerfile and tests it for real, with Debian's podman
# (no Docker engine needed; CI runs this from .ci/run). As root:
#   bash deploy/container-test.sh
#
# 1. podman: runc as the runtime (crun fails on hosts with hybrid cgroups) and ulimits this host
#    allows, in a containers.conf of this script's own (CONTAINERS_CONF); the host's is untouched.
# 2. The FROM images: unless present, `debootstrap --variant=minbase bookworm` imported as
#    docker.io/library/debian:bookworm and :bookworm-slim (no registry is reachable here).
# 3. `podman build --pull=never --network host`; prints the build time and the image size.
# 4. Runs the image as users do (no flags but --log-level debug; default ports) in a network
#    namespace of its own, so nothing listens on the host: waits for the image's HEALTHCHECK to
#    pass, makes an Attend call with the image's attnserve-cli, scrapes /metrics, serves a model
#    repository mounted at /models, and sends SIGTERM during a bench run: every accepted request
#    must be answered OK, the rest refused with UNAVAILABLE, and the container must exit 0.
# Exits non-zero, naming the failed check, on any failure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
image=${ATTNSERVE_IMAGE:-localhost/attnserve:test}
mirror=${ATTNSERVE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
work=$(mktemp -d /var/tmp/attnserve-container-test.XXXXXX)
netns=attnserve-ct-$$
server=attnserve-ct-$$
models_server=attnserve-ct-models-$$
start=$(date +%s)

log() { echo "container-test: $*"; }
fail() {
  echo "container-test: FAILED: $*" >&2
  exit 1
}

cleanup() {
  podman rm -f -i "$server" "$models_server" >/dev/null 2>&1 || true
  ip netns delete "$netns" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

bash "$root/deploy/install-deps.sh" container

# --- 1. podman configuration ---
# A container may not get more than the host's hard limits (setting them needs CAP_SYS_RESOURCE,
# which sandboxes drop), and podman 4.3 caps its own RLIMIT_NPROC at kernel.pid_max, so the
# container's nproc must stay at or under both.
nofile=$(ulimit -Hn)
nproc=$(ulimit -Hu)
pid_max=$(cat /proc/sys/kernel/pid_max)
[ "$nproc" = unlimited ] || [ "$nproc" -gt "$pid_max" ] && nproc=$pid_max
[ "$nofile" = unlimited ] && nofile=1048576
cat >"$work/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
EOF
export CONTAINERS_CONF=$work/containers.conf

# --- 2. base images ---
if ! podman image exists docker.io/library/debian:bookworm-slim; then
  log "making the Debian base image (debootstrap --variant=minbase bookworm from $mirror)"
  debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 ||
    { tail -20 "$work/debootstrap.log"; fail "debootstrap"; }
  rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/lib/apt/lists/*
  tar -C "$work/rootfs" -c . | podman import - docker.io/library/debian:bookworm-slim >/dev/null
  rm -rf "$work/rootfs"
fi
podman image exists docker.io/library/debian:bookworm ||
  podman tag docker.io/library/debian:bookworm-slim docker.io/library/debian:bookworm
log "podman ready after $(($(date +%s) - start)) s"

# --- 3. build ---
build_start=$(date +%s)
podman build --pull=never --network host --format docker -t "$image" "$root" >"$work/build.log" 2>&1 ||
  { tail -40 "$work/build.log"; fail "podman build"; }
size_bytes=$(podman image inspect --format '{{.Size}}' "$image")
log "built $image in $(($(date +%s) - build_start)) s; image size $((size_bytes / 1000000)) MB"

# --- 4. run ---
ip netns add "$netns"
ip netns exec "$netns" ip link set lo up
network=(--network "ns:/run/netns/$netns")
# The CLI from the image, in a container of its own (no healthcheck of its own to schedule).
cli() { podman run --rm --no-healthcheck "${network[@]}" --entrypoint attnserve-cli "$image" "$@"; }
metrics() {
  ip netns exec "$netns" python3 -c \
    'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:8002/metrics", timeout=10).read().decode())'
}
# Waits up to 90 s for container $1's HEALTHCHECK to pass.
wait_healthy() {
  for _ in $(seq 90); do
    podman healthcheck run "$1" >/dev/null 2>&1 && return 0
    [ "$(podman inspect --format '{{.State.Running}}' "$1")" = true ] ||
      { podman logs "$1" 2>&1 | tail -20; fail "container $1 exited before it was healthy"; }
    sleep 1
  done
  podman logs "$1" 2>&1 | tail -20
  fail "container $1 not healthy after 90 s"
}

# podman without systemd logs that it cannot schedule the periodic healthchecks; they are run
# here by hand instead. The server runs as deploy/k8s/deployment.yaml confines it: a read-only
# root file system, no capabilities, no privilege escalation.
confined=(--read-only --cap-drop all --security-opt no-new-privileges)
podman run -d --name "$server" "${network[@]}" "${confined[@]}" "$image" --log-level debug >/dev/null 2>"$work/run.err" ||
  { cat "$work/run.err"; fail "podman run"; }
run_start=$(date +%s)
wait_healthy "$server"
log "healthy (the image's HEALTHCHECK) $(($(date +%s) - run_start)) s after podman run"
[ "$(podman exec "$server" id -u)" = 10001 ] || fail "the server does not run as uid 10001"
[ "$(podman exec "$server" cat /proc/1/comm)" = tini ] || fail "PID 1 is not tini"

attend=$(cli attend --random 4 --seed 7) || fail "attnserve-cli attend: $attend"
grep -q 'model demo (version 1)' <<<"$attend" || fail "attend did not answer from demo: $attend"
grep -q 'output \[4, 512\]' <<<"$attend" || fail "attend output is not [4, 512]: $attend"
log "Attend through the image's attnserve-cli: demo answered [4, 512]"

scrape=$(metrics) || fail "GET /metrics"
grep -Eq '^attnserve_requests_total\{.*code="OK".*method="Attend".*model="demo".*\} 1$' <<<"$scrape" ||
  fail "/metrics does not count the one Attend: $(grep attnserve_requests_total <<<"$scrape")"
grep -Eq '^attnserve_model_loaded\{model="demo"\} 1$' <<<"$scrape" || fail "/metrics: demo not loaded"
log "/metrics counts the Attend call"

# SIGTERM in the middle of a bench run (second container, same network namespace): the bench
# outlives the server, so every request's fate is seen.
cli --max-attempts 1 --timeout-s 30 -q bench --concurrency 8 --seq-len 16 --duration 3 --json \
  >"$work/bench.json" 2>"$work/bench.err" &
bench=$!
for _ in $(seq 200); do
  [ "$(podman logs "$server" 2>&1 | grep -c 'queued model=demo')" -ge 300 ] && break
  sleep 0.1
done
podman kill --signal TERM "$server" >/dev/null
code=$(timeout 90 podman wait "$server") || fail "the server did not exit within 90 s of SIGTERM"
wait "$bench" || true # the bench fails by design: requests after the drain get UNAVAILABLE
[ "$code" = 0 ] || { podman logs "$server" 2>&1 | tail -20; fail "the server exited $code after SIGTERM"; }
podman logs "$server" >"$work/server.log" 2>&1
grep -q 'SIGTERM received: draining' "$work/server.log" || fail "no drain logged"
grep -q 'drained; exiting' "$work/server.log" || fail "the drain did not finish"
queued=$(grep -c 'queued model=demo' "$work/server.log")
python3 - "$work/bench.json" "$((queued - 1))" <<'EOF' || fail "SIGTERM during bench: $(cat "$work/bench.err")"
import json, sys
summary = json.load(open(sys.argv[1]))
accepted = int(sys.argv[2])  # queued by the server during the bench (the Attend above excluded)
errors = summary["errors"]
print(f"container-test: SIGTERM during bench: {accepted} accepted, {summary['ok']} answered OK; "
      f"not accepted: {errors}")
assert accepted >= 300, f"only {accepted} requests were accepted before SIGTERM"
assert summary["ok"] == accepted, f"accepted {accepted} but answered {summary['ok']}"
# Refused by the draining or stopped server: UNAVAILABLE. The bench cancels the (at most 8)
# calls still in flight when its duration ends.
assert set(errors) <= {"UNAVAILABLE", "CANCELLED"}, f"unexpected errors: {errors}"
assert errors.get("CANCELLED", 0) <= 8, f"more cancelled calls than the bench's 8: {errors}"
EOF
log "SIGTERM: drained, every accepted request answered, exit 0"

# A model repository mounted at /models (read-only) is served instead of the demo model.
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
podman run -d --name "$models_server" "${network[@]}" "${confined[@]}" -v "$work/models:/models:ro" "$image" \
  >/dev/null 2>>"$work/run.err"
wait_healthy "$models_server"
listed=$(cli models) || fail "attnserve-cli models: $listed"
grep -q tiny <<<"$listed" || fail "the mounted model is not listed: $listed"
! grep -q demo <<<"$listed" || fail "the demo model serves although /models is mounted: $listed"
attend=$(cli attend --model tiny --random 3) || fail "attend on the mounted model: $attend"
grep -q 'output \[3, 8\]' <<<"$attend" || fail "the mounted model's output is not [3, 8]: $attend"
podman stop -t 40 "$models_server" >/dev/null 2>>"$work/run.err"
[ "$(podman inspect --format '{{.State.ExitCode}}' "$models_server")" = 0 ] ||
  fail "podman stop: the server did not exit 0"
log "a repository mounted at /models serves its model; podman stop exits 0"

log "all checks passed in $(($(date +%s) - start)) s (image $image, $((size_bytes / 1000000)) MB)"
