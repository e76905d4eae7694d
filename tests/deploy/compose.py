"""deploy/compose.yaml's services (with deploy/compose.tls.yaml and the nginx configs they mount)
and deploy/prometheus.yml, the scrape config compose mounts.

Part of check_manifests.py, whose header says what is checked.
"""
import re
import shlex

from attnserve_flags import effective, http_port_of, number_flag, ports_of
from checker import get

PROMETHEUS_CONFIG = "/etc/prometheus/prometheus.yml"
HEALTHCHECK = ["CMD", "attnserve-cli", "health", "-q"]


def compose_list(value):
    if isinstance(value, str):
        return shlex.split(value)
    return [str(v) for v in value or []]


def compose_env(value):
    if isinstance(value, dict):
        return {k: v for k, v in value.items()}
    env = {}
    for item in value or []:
        name, sep, val = str(item).partition("=")
        env[name] = val if sep else None
    return env


def compose_ports(value):
    """Container-side ports of a service's `ports` (short or long syntax)."""
    ports = []
    for item in value or []:
        if isinstance(item, dict):
            ports.append(int(item.get("target", 0)))
        else:
            ports.append(int(str(item).split("/")[0].rsplit(":", 1)[-1]))
    return ports


def compose_mounts(value):
    """[(source, target)] of a service's `volumes` (short or long syntax)."""
    mounts = []
    for item in value or []:
        if isinstance(item, dict):
            mounts.append((item.get("source"), item.get("target")))
        else:
            parts = str(item).split(":")
            mounts.append((parts[0], parts[1] if len(parts) > 1 else parts[0]))
    return mounts


def host_path(base, source):
    """A bind mount's host path, or None for a named volume."""
    if not source or not source.startswith((".", "/", "~")):
        return None
    return (base / source).resolve()


def go_duration(text):
    """Seconds of a compose duration such as `40s`, `1m30s`, `500ms`; None if unreadable."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|ns|h|m|s)", str(text))
    if not parts or "".join(a + b for a, b in parts) != str(text):
        return None
    return sum(float(a) * units[b] for a, b in parts)


def check_compose(root, docs, flags, image_env, stage, image_grpc, check):
    file = "deploy/compose.yaml"
    compose = (docs.get(file) or [None])[0]
    if not check.expect(isinstance(compose, dict), file, "document", "a compose file",
                        "nothing readable"):
        return None
    check.expect("version" not in compose, file, "version", "no `version:` key (Compose spec)",
                 compose.get("version"))
    services = compose.get("services") or {}
    for name in ("attnserve", "nginx", "prometheus", "grafana"):
        check.expect(name in services, file, "services", f"a service `{name}`", sorted(services))
    for name in ("prometheus", "grafana"):
        image = str(get(services, name, "image") or "")
        check.expect(":" in image and not image.endswith(":latest"), file,
                     f"services.{name}.image", "a pinned tag", repr(image))
    grpc, metrics = check_compose_attnserve(root, file, services.get("attnserve") or {}, flags,
                                            image_env, stage, image_grpc, check)
    check_compose_nginx(root, file, services.get("nginx") or {}, "attnserve-grpc.conf", grpc,
                        check)
    check_compose_prometheus(root, file, services.get("prometheus") or {}, check)
    check_compose_tls(root, docs, flags, image_env, compose, grpc, check)
    return compose, metrics


def check_compose_attnserve(root, file, service, flags, image_env, stage, image_grpc, check):
    field = "services.attnserve"
    context = (root / "deploy" / str(get(service, "build", "context") or "")).resolve()
    check.equal(file, f"{field}.build.context", str(root.resolve()), str(context),
                "the repository root, where the Dockerfile is")
    if stage is not None:
        dockerfile = context / str(get(service, "build", "dockerfile") or "Dockerfile")
        check.expect(dockerfile.is_file(), file, f"{field}.build.dockerfile", "an existing file",
                     str(dockerfile))
    values = effective(flags, [
        ("env", image_env, "Dockerfile", "ENV"),
        ("env", compose_env(service.get("environment")), file, f"{field}.environment"),
        ("args", compose_list(service.get("command")), file, f"{field}.command"),
    ], check)
    grpc, metrics = ports_of(values, file, check)
    http = http_port_of(values, file, check)
    # Replicas publish no host port (nginx fronts them): `expose` lists the container's ports.
    exposed = compose_ports(service.get("ports")) + [int(str(p)) for p in service.get("expose") or []]
    check.equal(file, f"{field}.ports + expose (container side)",
                sorted(p for p in (grpc, metrics, http) if p), sorted(exposed),
                "the gRPC, metrics and REST ports")
    grace = number_flag(values, "shutdown-grace-s")
    stop = go_duration(service.get("stop_grace_period", "10s"))
    check.expect(stop is not None and grace is not None and stop > grace, file,
                 f"{field}.stop_grace_period", f"more than --shutdown-grace-s ({grace} s)",
                 service.get("stop_grace_period", "10s (Docker's default)"))
    if "healthcheck" in service:
        test = get(service, "healthcheck", "test")
        check.expect(isinstance(test, list) and test[:2] == HEALTHCHECK[:2] and "health" in test,
                     file, f"{field}.healthcheck.test", f"{HEALTHCHECK} (options may come before"
                     " `health`)", test)
    else:
        check.equal(file, f"{field}.command --grpc-address", image_grpc, grpc,
                    "the image's HEALTHCHECK probes its own gRPC port; with another one, add a"
                    " healthcheck running attnserve-cli --target 127.0.0.1:<port> health -q")
    return grpc, metrics


def check_compose_nginx(root, file, service, config_name, grpc, check, field="services.nginx"):
    """nginx mounts deploy/nginx/<config_name>, which balances over `attnserve` on the gRPC port
    and listens on the port compose publishes."""
    if "build" in service:
        context = root / "deploy" / str(get(service, "build", "context") or "")
        check.expect((context / "Dockerfile").is_file(), file, f"{field}.build.context",
                     "a folder with a Dockerfile", str(context))
    expected = root / "deploy" / "nginx" / config_name
    mounted = [host_path(root / "deploy", source) for source, target in
               compose_mounts(service.get("volumes")) if str(target).startswith("/etc/nginx/")]
    if not check.expect(expected.resolve() in mounted, file, f"{field}.volumes",
                        f"{expected.relative_to(root)} mounted under /etc/nginx/",
                        [str(m) for m in mounted]):
        return None
    text = expected.read_text()
    servers = re.findall(r"^\s*server\s+([\w.-]+):(\d+)\b", text, re.M)
    check.equal(str(expected.relative_to(root)), "upstream server", [("attnserve", grpc)],
                [(host, int(port)) for host, port in servers],
                "the compose service `attnserve` on its gRPC port")
    listen = [int(p) for p in re.findall(r"^\s*listen\s+(\d+)\b", text, re.M)]
    check.equal(file, f"{field}.ports (container side)", listen,
                compose_ports(service.get("ports")),
                f"the `listen` port of {expected.relative_to(root)}")
    return text


def check_compose_tls(root, docs, flags, image_env, compose, grpc, check):
    """deploy/compose.tls.yaml: server variables exist, every /run/secrets/ file it or the TLS
    nginx config names is a secret of that service, backed by a file."""
    file = "deploy/compose.tls.yaml"
    overlay = (docs.get(file) or [None])[0]
    if not check.expect(isinstance(overlay, dict), file, "document", "a compose file",
                        "nothing readable"):
        return
    secrets = overlay.get("secrets") or {}
    for name, secret in secrets.items():
        check.expect("file" in (secret or {}), file, f"secrets.{name}", "a `file:`", secret)
    services = overlay.get("services") or {}
    base = (compose.get("services") or {}).get("attnserve") or {}
    env = compose_env(get(services, "attnserve", "environment"))
    # ATTNSERVE_CLI_* are attnserve-cli's (the HEALTHCHECK's), not the server's.
    server_env = {k: v for k, v in env.items() if not k.startswith("ATTNSERVE_CLI_")}
    effective(flags, [
        ("env", image_env, "Dockerfile", "ENV"),
        ("env", compose_env(base.get("environment")), "deploy/compose.yaml",
         "services.attnserve.environment"),
        ("env", server_env, file, "services.attnserve.environment"),
        ("args", compose_list(base.get("command")), "deploy/compose.yaml",
         "services.attnserve.command"),
    ], check)
    nginx = {**((compose.get("services") or {}).get("nginx") or {}), **(services.get("nginx") or {})}
    nginx_text = check_compose_nginx(root, file, nginx,
                                     "attnserve-grpc-tls.conf", grpc, check) or ""
    for service, used in (("attnserve", " ".join(str(v) for v in env.values())),
                          ("nginx", nginx_text)):
        granted = set(get(services, service, "secrets") or [])
        used = re.sub(r"#.*", "", used)  # not in comments
        for name in sorted(set(re.findall(r"/run/secrets/([\w-]+)", used))):
            check.expect(name in granted and name in secrets, file,
                         f"services.{service}.secrets", f"`{name}` (used by {service})",
                         sorted(granted))


def check_compose_prometheus(root, file, service, check):
    field = "services.prometheus.volumes"
    config = None
    for source, target in compose_mounts(service.get("volumes")):
        if target == PROMETHEUS_CONFIG:
            config = host_path(root / "deploy", source)
    check.equal(file, f"{field} ({PROMETHEUS_CONFIG})", str(root / "deploy" / "prometheus.yml"),
                str(config) if config else None, "the repository's scrape config")


def check_prometheus_yml(docs, compose_services, metrics_port, check):
    """deploy/prometheus.yml scrapes the compose service `attnserve` on its metrics port."""
    file = "deploy/prometheus.yml"
    config = (docs.get(file) or [{}])[0] or {}
    jobs = {get(j, "job_name"): j for j in config.get("scrape_configs") or []}
    job = jobs.get("attnserve")
    if not check.expect(job is not None, file, "scrape_configs", "a job `attnserve`",
                        sorted(map(str, jobs))):
        return config
    check.equal(file, "scrape_configs[attnserve].metrics_path", "/metrics",
                job.get("metrics_path", "/metrics"))
    targets = [t for sc in job.get("static_configs") or [] for t in sc.get("targets") or []]
    # Compose replicas: DNS discovery, one A record per replica.
    targets += [f"{name}:{sd.get('port')}" for sd in job.get("dns_sd_configs") or []
                for name in sd.get("names") or []]
    check.expect(targets, file, "scrape_configs[attnserve]", "a static or DNS target", "none")
    for target in targets:
        host, _, port = str(target).rpartition(":")
        check.expect(host in compose_services, file, f"target {target!r} host",
                     f"a service of deploy/compose.yaml {sorted(compose_services)}", host)
        check.equal(file, f"target {target!r} port", metrics_port,
                    int(port) if port.isdigit() else port, "attnserve's --metrics-address port")
    return config
