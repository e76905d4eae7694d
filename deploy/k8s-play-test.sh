#!/usr/bin/env bash
# Runs the Kubernetes Deployment's pod spec with an engine, no cluster: `podman kube play` of
# deploy/k8s/deployment.yaml with the TLS overlay (deploy/k8s/tls) applied and its Secret made from
# deploy/make-test-certs.sh certificates, using the image deploy/container-test.sh builds
# (localhost/attnserve:test; CI runs this after it). As root:
#   bash deploy/k8s-play-test.sh
#
# 1. podman as container-test.sh configures it (runc, ulimits this host allows), in a
#    containers.conf of this script's own; the host's is untouched.
# 2. The pod YAML: the Deployment with the overlay's JSON patches applied (volumes, mounts, env,
#    exec probes), the image pointed at the tested one; the Secret `attnserve-tls` as a podman
#    secret holding the Kubernetes Secret (podman's secret volumes read them so).
# 3. `podman kube play` in a network namespace of the script's own, then the engine's work is
#    checked: the probe (the liveness probe becomes the container's healthcheck, run here) passes
#    over mutual TLS; args and env reached the process (JSON logs, 2 compute threads, the
#    ATTNSERVE_TLS_* files served); the Secret volume is mounted read-only with its five keys;
#    the securityContext holds (uid/gid 10001, read-only root, no capabilities, no new
#    privileges, seccomp filter); an Attend over mutual TLS answers and a client without a
#    certificate is refused; `podman kube down` drains the server to exit 0.
# Exits non-zero, naming the failed check, on any failure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=podman-config.sh
source "$root/deploy/podman-config.sh"
image=${ATTNSERVE_IMAGE:-localhost/attnserve:test}
work=$(mktemp -d /var/tmp/attnserve-k8s-play.XXXXXX)
secret=attnserve-tls
start=$(date +%s)

log() { echo "k8s-play-test: $*"; }
fail() {
  echo "k8s-play-test: FAILED: $*" >&2
  exit 1
}

cleanup() {
  [ -f "$work/pod.yaml" ] && podman kube down "$work/pod.yaml" >/dev/null 2>&1 || true
  podman secret rm "$secret" >/dev/null 2>&1 || true
  podman volume rm -f "$secret" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

bash "$root/deploy/install-deps.sh" container

# --- 1. podman configuration (deploy/podman-config.sh, as deploy/container-test.sh) ---
write_podman_config "$work"
# The tested image, from podman's store, or from Docker's if container-test.sh built it there.
if ! podman image exists "$image" && command -v docker >/dev/null &&
  docker image inspect "$image" >/dev/null 2>&1; then
  docker save "$image" | podman load >/dev/null
fi
podman image exists "$image" || fail "no image $image: run deploy/container-test.sh first"

# --- 2. the pod and its Secret ---
bash "$root/deploy/make-test-certs.sh" "$work/certs"
python3 - "$root/deploy/k8s" "$image" "$work/certs" "$work" <<'EOF' ||
import json, shlex, sys, yaml
k8s, image, certs, work = sys.argv[1:]
pod_out, secret_out = f"{work}/pod.yaml", f"{work}/secret.json"
deployment = yaml.safe_load(open(f"{k8s}/deployment.yaml"))
overlay = yaml.safe_load(open(f"{k8s}/tls/kustomization.yaml"))
# The overlay's JSON patches (RFC 6902 add/replace on object keys and list indices), as
# kustomize applies them.
for patch in overlay["patches"]:
    assert patch["target"] == {"kind": "Deployment", "name": "attnserve"}, patch["target"]
    for op in yaml.safe_load(patch["patch"]):
        assert op["op"] in ("add", "replace"), op
        *parents, last = op["path"].strip("/").split("/")
        node = deployment
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if op["op"] == "replace":
            assert (int(last) < len(node)) if isinstance(node, list) else last in node, op["path"]
        if isinstance(node, list):
            node[int(last)] = op["value"]
        else:
            node[last] = op["value"]
deployment["spec"]["replicas"] = 1
container = deployment["spec"]["template"]["spec"]["containers"][0]
container["image"] = image
container["imagePullPolicy"] = "Never"
# podman publishes containerPorts on the host (Kubernetes only declares them) and cannot in a
# network namespace of its own; the ports are the drift check's business (deploy_manifests).
assert {p["containerPort"] for p in container.pop("ports")} == {50051, 8000, 8002}
yaml.safe_dump(deployment, open(pod_out, "w"), sort_keys=False)
# What the checks expect, for the shell: env (NAME=value lines), args, each probe's command.
with open(f"{work}/env.txt", "w") as out:
    for item in container["env"]:
        out.write(f"{item['name']}={item['value']}\n")
open(f"{work}/args.txt", "w").write(" ".join(container["args"]))
with open(f"{work}/probes.txt", "w") as out:
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        out.write(f"{probe} {shlex.join(container[probe]['exec']['command'])}\n")
# The Secret as `kubectl create secret generic attnserve-tls --from-file=...` makes it.
files = {"tls.crt": "server.pem", "tls.key": "server.key", "ca.crt": "ca.pem",
         "client.crt": "client.pem", "client.key": "client.key"}
# podman 4.3 writes each `data` value into the volume as it stands, without the base64 decoding
# Kubernetes does (and ignores `stringData`), so the values here are the PEM text itself.
data = {key: open(f"{certs}/{name}").read() for key, name in files.items()}
json.dump({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "attnserve-tls"},
           "type": "Opaque", "data": data}, open(secret_out, "w"))
EOF
  fail "could not render the pod from deploy/k8s and deploy/k8s/tls"
podman secret rm "$secret" >/dev/null 2>&1 || true
podman volume rm -f "$secret" >/dev/null 2>&1 || true  # kube play keeps the secret's volume
podman secret create "$secret" "$work/secret.json" >/dev/null
log "pod spec rendered from deploy/k8s + deploy/k8s/tls; Secret $secret created"

# --- 3. play it and check ---
# --network none: the pod gets a network namespace with loopback only (nothing listens on the
# host); the checks run inside the container with `podman exec`.
podman kube play --network none "$work/pod.yaml" >"$work/play.log" 2>&1 ||
  { cat "$work/play.log"; fail "podman kube play"; }
pod=attnserve-pod-0
ctr=$pod-attnserve
podman container exists "$ctr" || fail "kube play made no container $ctr: $(cat "$work/play.log")"
in_ctr() { podman exec "$ctr" "$@"; }

# Probes. podman turns the livenessProbe into the container's healthcheck (podman without
# systemd cannot schedule it, so it is run here); startup and readiness probes it does not run,
# so their commands are run in the container as the kubelet would.
play_start=$(date +%s)
for _ in $(seq 90); do
  podman healthcheck run "$ctr" >/dev/null 2>&1 && break
  [ "$(podman inspect --format '{{.State.Running}}' "$ctr")" = true ] ||
    { podman logs "$ctr" 2>&1 | tail -5; fail "the container stopped before its probe passed"; }
  sleep 1
done
podman healthcheck run "$ctr" >/dev/null 2>&1 || { podman logs "$ctr" 2>&1 | tail -20; fail "livenessProbe (healthcheck) not passing after 90 s"; }
podman inspect --format '{{json .Config.Healthcheck.Test}}' "$ctr" | grep -q '"attnserve-cli"' ||
  fail "the healthcheck is not the livenessProbe's attnserve-cli"
while read -r probe command; do
  eval "in_ctr $command" >/dev/null 2>&1 || fail "$probe ($command) fails in the container"
done <"$work/probes.txt"
log "probes pass over mutual TLS $(($(date +%s) - play_start)) s after kube play (liveness as the healthcheck; startup, readiness run)"

# args and env reached the process.
cmdline=$(in_ctr cat /proc/1/cmdline | tr '\0' ' ')
grep -qF -- "attnserve $(cat "$work/args.txt")" <<<"$cmdline" || fail "args: PID 1 runs '$cmdline'"
while IFS= read -r pair; do
  [ "$(in_ctr printenv "${pair%%=*}")" = "${pair#*=}" ] || fail "env: ${pair%%=*} is not '${pair#*=}'"
done <"$work/env.txt"
podman logs "$ctr" >"$work/server.log" 2>&1
head -1 "$work/server.log" | python3 -c 'import json, sys; json.loads(sys.stdin.read())' ||
  fail "--log-format=json: the log is not JSON: $(head -1 "$work/server.log")"
grep -q '2 compute thread(s)' "$work/server.log" || fail "--compute-threads=2 not in effect"
grep -q 'serving: subject' "$work/server.log" || fail "the server does not log the TLS certificate it serves"
log "args ($(cat "$work/args.txt")) and $(wc -l <"$work/env.txt") env variables in effect; TLS on"

# The Secret volume: read-only, its five keys, the certificate made above.
grep -q ' /etc/attnserve/tls [a-z0-9]* ro,' <<<"$(in_ctr cat /proc/mounts)" ||
  fail "the Secret volume is not mounted read-only at /etc/attnserve/tls"
for key in tls.crt tls.key ca.crt client.crt client.key; do
  in_ctr test -r "/etc/attnserve/tls/$key" || fail "Secret key $key not readable by the server"
done
cmp -s <(in_ctr cat /etc/attnserve/tls/tls.crt) "$work/certs/server.pem" ||
  fail "tls.crt in the volume is not the Secret's certificate"
log "Secret attnserve-tls mounted read-only at /etc/attnserve/tls with its 5 keys"

# securityContext and resources.
[ "$(in_ctr id -u):$(in_ctr id -g)" = 10001:10001 ] || fail "runAsUser/runAsGroup: $(in_ctr id)"
! in_ctr touch /probe-write 2>/dev/null || fail "readOnlyRootFilesystem: / is writable"
status=$(in_ctr cat /proc/1/status)
grep -q '^CapEff:[[:space:]]*0000000000000000$' <<<"$status" || fail "capabilities not all dropped"
grep -q '^NoNewPrivs:[[:space:]]*1$' <<<"$status" || fail "allowPrivilegeEscalation: no_new_privs unset"
grep -q '^Seccomp:[[:space:]]*2$' <<<"$status" || fail "seccompProfile RuntimeDefault: no seccomp filter"
limits=$(podman inspect --format '{{.HostConfig.Memory}} {{.HostConfig.NanoCpus}}' "$ctr")
[ "$limits" = "2147483648 2000000000" ] || fail "resources.limits (2Gi, 2 CPUs): found $limits"
log "securityContext: uid/gid 10001, read-only root, no capabilities, no_new_privs, seccomp; limits 2Gi / 2 CPUs"

# Calls: with the probe's client certificate an Attend answers; without one, refused.
attend=$(in_ctr attnserve-cli attend --random 4 --seed 7) || fail "attend over mutual TLS: $attend"
grep -q 'output \[4, 512\]' <<<"$attend" || fail "attend output is not [4, 512]: $attend"
! podman exec -e ATTNSERVE_CLI_TLS_CERT_CHAIN= -e ATTNSERVE_CLI_TLS_PRIVATE_KEY= "$ctr" \
  attnserve-cli --max-attempts 1 --timeout-s 5 health -q >/dev/null 2>&1 ||
  fail "a client without a certificate was let in (mutual TLS off?)"
log "Attend over mutual TLS answers [4, 512]; a client without a certificate is refused"

# Termination: SIGTERM (podman's stop), the drain, exit 0 within terminationGracePeriodSeconds.
podman pod stop -t 45 "$pod" >/dev/null
[ "$(podman inspect --format '{{.State.ExitCode}}' "$ctr")" = 0 ] ||
  { podman logs "$ctr" 2>&1 | tail -5; fail "the server did not exit 0 on stop"; }
podman logs "$ctr" 2>&1 | grep -q 'drained; exiting' || fail "no drain logged on stop"
log "pod stop: drained, exit 0"
log "all checks passed in $(($(date +%s) - start)) s"
