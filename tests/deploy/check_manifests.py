#!/usr/bin/env python3
"""Drift check of the deployment files against the server and each other.

Usage: check_manifests.py --attnserve PATH/TO/attnserve [--root REPO_ROOT]

1. Every *.yaml / *.yml under deploy/ parses (multi-document), and so does deploy/grafana/*.json.
2. `attnserve --help` gives every long flag, its type, default and environment variable.
3. The flags of deploy/k8s/deployment.yaml (args, env), deploy/compose.yaml (command,
   environment) and the Dockerfile (ENV) exist, with values their types accept, and attnserve
   itself accepts each place's variables and command line (`attnserve ARGS --help` exits 0: CLI11
   validates every value before it acts on --help). From them (or the --help defaults) come the
   gRPC, metrics and REST (--http-address) ports, --shutdown-grace-s and --compute-threads.
4. Ports agree: the Dockerfile's EXPOSE, compose's ports/expose, deploy/prometheus.yml's target
   (static or DNS discovery), the nginx configs compose mounts (upstream `server attnserve:<gRPC
   port>`, `listen` = the published port), the Deployment's named container ports (grpc,
   metrics, http) and gRPC probes, both Services and the ServiceMonitor.
5. Kubernetes: every selector (Services, PDB, ServiceMonitor) matches, the HPA targets the
   Deployment, terminationGracePeriodSeconds > preStop sleep + --shutdown-grace-s,
   --compute-threads = the CPU limit, kustomization.yaml lists every manifest.
6. Compose and Grafana: deploy/compose.tls.yaml's server variables exist and every /run/secrets/
   file it or the TLS nginx config names is a secret of that service backed by a file;
   stop_grace_period > --shutdown-grace-s, the provisioned data source is
   what the dashboard's `datasource` variable picks, the dashboard provider's path holds the
   mounted deploy/grafana/attnserve.json.
7. KServe (deploy/k8s/kserve, its own kustomization.yaml listing every manifest there): the
   ServingRuntime's flags (env, args) exist and attnserve accepts them, agree with the
   Deployment's where both set one, --model-repository is /mnt/models; image, pull policy and
   resources are the Deployment's, --compute-threads = its CPU limit; its protocolVersions are
   ones attnserve serves (v2 on --http-address, grpc-v2 on --grpc-address) on addresses that are
   on; one container port, named http1 or h2c, = the port of the address serving that protocol,
   which protocolVersions lists, not one Knative reserves; startup/readiness/liveness probes on
   that port's /v2/health/live|ready, no lifecycle hook, container `kserve-container`, the
   prometheus.kserve.io annotations = the metrics port. Each InferenceService's modelFormat (and
   version) is supported by a runtime there (named, or with autoSelect), its protocolVersion
   (unset = v1, as KServe matches) is in the runtime's list and speaks the transport of the port
   KServe routes to; with its env/args merged as KServe merges them, attnserve still accepts the
   flags, its extra ports are the address flags' ports, --compute-threads = its CPU limit and
   --shutdown-grace-s < its terminationGracePeriodSeconds (30 s unless set).
Not read: a --config file named in args (its values would come between args and environment).
Each failure names the file, the field, what was expected and what was found. Exits 0 when every
check passes, 1 otherwise (2 for bad usage).

The checks live next to this file: checker.py (counting, failures, parsing every file),
attnserve_flags.py (--help, values, effective flags and ports), dockerfile.py, compose.py
(with deploy/prometheus.yml), grafana.py, k8s.py and kserve.py.
"""
import argparse
import pathlib
import sys

from attnserve_flags import Flags, effective, http_port_of, parse_help, ports_of
from checker import PROG, Checker, get, load_files
from compose import check_compose, check_prometheus_yml
from dockerfile import check_dockerfile, dockerfile_env, read_dockerfile
from grafana import check_grafana
from k8s import check_k8s
from kserve import check_kserve


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--attnserve", required=True, help="the attnserve binary")
    parser.add_argument("--root", default=pathlib.Path(__file__).resolve().parents[2],
                        type=pathlib.Path, help="repository root (default: this file's)")
    args = parser.parse_args()
    root = args.root.resolve()
    check = Checker()

    docs = load_files(root, check)
    flags = parse_help(Flags(args.attnserve), check)
    stage = read_dockerfile(root, check)
    image_env = dockerfile_env(stage)
    image_values = effective(flags, [("env", image_env, "Dockerfile", "ENV")], check)
    image_ports = ports_of(image_values, "Dockerfile", check)
    image_http = http_port_of(image_values, "Dockerfile", check)
    check_dockerfile(stage, (*image_ports, image_http), check)
    compose_result = check_compose(root, docs, flags, image_env, stage, image_ports[0], check)
    compose, metrics = compose_result or ({}, None)
    prometheus_config = check_prometheus_yml(docs, get(compose, "services") or {}, metrics, check)
    check_grafana(root, docs, compose, prometheus_config, check)
    pod = check_k8s(root, docs, flags, image_env, prometheus_config, check)
    check_kserve(docs, flags, image_env, pod, check)

    for failure in check.failures:
        print(f"{PROG}: FAIL: {failure}", file=sys.stderr)
    if check.failures:
        print(f"{PROG}: {len(check.failures)} of {check.checks} checks failed")
    else:
        print(f"{PROG}: OK, {check.checks} checks")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
