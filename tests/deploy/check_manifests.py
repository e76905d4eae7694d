#!/usr/bin/env python3
"""Drift check of the deployment files (issue 7) against the server and each other.

Usage: check_manifests.py --attnserve PATH/TO/attnserve [--root REPO_ROOT]

1. Every *.yaml / *.yml under deploy/ parses (multi-document), and so does deploy/grafana/*.json.
2. `attnserve --help` gives every long flag, its type, default and environment variable.
3. The flags of deploy/k8s/deployment.yaml (args, env), deploy/compose.yaml (command,
   environment) and the Dockerfile (ENV) exist, with values their types accept, and attnserve
   itself accepts each place's variables and command line (`attnserve ARGS --help` exits 0: CLI11
   validates every value before it acts on --help). From them (or the --help defaults) come the
   gRPC and metrics ports, --shutdown-grace-s and --compute-threads.
4. Ports agree: the Dockerfile's EXPOSE, compose's ports, deploy/prometheus.yml's target, the
   Deployment's named container ports and gRPC probes, both Services and the ServiceMonitor.
5. Kubernetes: every selector (Services, PDB, ServiceMonitor) matches, the HPA targets the
   Deployment, terminationGracePeriodSeconds > preStop sleep + --shutdown-grace-s,
   --compute-threads = the CPU limit, kustomization.yaml lists every manifest.
6. Compose and Grafana: stop_grace_period > --shutdown-grace-s, the provisioned data source is
   what the dashboard's `datasource` variable picks, the dashboard provider's path holds the
   mounted deploy/grafana/attnserve.json.
Not read: a --config file named in args (its values would come between args and environment).
Each failure names the file, the field, what was expected and what was found. Exits 0 when every
check passes, 1 otherwise (2 for bad usage).
"""
import argparse
import difflib
import json
import math
import os
import pathlib
import re
import shlex
import subprocess
import sys

import yaml

PROG = "check_manifests"
# attnserve reads environment variables with this prefix only as its flags' (Env:...) names: any
# other ATTNSERVE_ variable is a typo that attnserve would silently ignore.
ENV_PREFIX = "ATTNSERVE_"
GRAFANA_PROVISIONING = "/etc/grafana/provisioning"
PROMETHEUS_CONFIG = "/etc/prometheus/prometheus.yml"
HEALTHCHECK = ["CMD", "attnserve-cli", "health", "-q"]


class Checker:
    """Counts checks and collects failures as `file: field: expected X, found Y`."""

    def __init__(self):
        self.checks = 0
        self.failures = []

    def fail(self, file, field, expected, found):
        message = f"{file}: {field}: expected {expected}, found {found}"
        if message not in self.failures:  # e.g. the Dockerfile's ENV, read for compose and k8s
            self.failures.append(message)

    def expect(self, ok, file, field, expected, found):
        self.checks += 1
        if not ok:
            self.fail(file, field, expected, found)
        return ok

    def equal(self, file, field, expected, found, why=""):
        suffix = f" ({why})" if why else ""
        return self.expect(expected == found, file, field, f"{expected!r}{suffix}", repr(found))


def get(node, *path):
    """node[path[0]][path[1]]..., or None as soon as a step is missing."""
    for key in path:
        if isinstance(node, dict):
            node = node.get(key)
        elif isinstance(node, list) and isinstance(key, int) and -len(node) <= key < len(node):
            node = node[key]
        else:
            return None
    return node


# ------------------------------------------------------------------------------------------------
# Parsing every file.


def load_files(root, check):
    """{relative path: [documents]} for every YAML under deploy/ and deploy/grafana/*.json."""
    docs = {}
    deploy = root / "deploy"
    paths = sorted(p for p in deploy.rglob("*") if p.suffix in (".yaml", ".yml", ".json"))
    for path in paths:
        rel = path.relative_to(root).as_posix()
        if path.suffix == ".json" and path.parent != deploy / "grafana":
            continue
        check.checks += 1
        try:
            text = path.read_text(encoding="utf-8")
            docs[rel] = [json.loads(text)] if path.suffix == ".json" else [
                d for d in yaml.safe_load_all(text) if d is not None]
        except (OSError, ValueError, yaml.YAMLError) as error:
            check.fail(rel, "parse", "valid " + path.suffix[1:].upper(), parse_error(error))
    return docs


def parse_error(error):
    mark = getattr(error, "problem_mark", None)
    if mark is None:
        return str(error)
    return f"{error.problem} at line {mark.line + 1}, column {mark.column + 1}"


# ------------------------------------------------------------------------------------------------
# attnserve --help.

# `  --name TYPE=default (Env:NAME)` then padding and the description (or the description on the
# next line). TYPE is CLI11's: TEXT, INT:POSITIVE, FLOAT:FLOAT in [0 - 3600], TEXT:{a,b}.
OPTION_LINE = re.compile(
    r"^  (?:-\w,)?--(?P<name>[a-z0-9][a-z0-9-]*)"
    r"(?: (?P<type>[A-Z]+(?::(?:\{[^}]*\}|[A-Z]+(?: in \[[^\]]*\])?))?))?"
    r"(?:=(?P<default>\S*))?"
    r"(?: \(Env:(?P<env>\w+)\))?"
    r"(?=\s|$)")


class Flag:
    def __init__(self, name, type_, default, env):
        self.name, self.type, self.default, self.env = name, type_ or "", default, env

    def takes_value(self):
        return bool(self.type) or self.name == "config"


class Flags(dict):
    """{name: Flag} of one attnserve binary, which can also be asked to parse a command line."""

    def __init__(self, binary):
        super().__init__()
        self.binary = binary

    def run_help(self, args=(), env=None):
        """(exit status, stdout, stderr) of `attnserve ARGS --help` with only ENV's ATTNSERVE_*.

        CLI11 converts and validates every value (command line and environment) before it acts
        on --help, so exit 0 means attnserve itself accepts them."""
        clean = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
        clean.update({k: str(v) for k, v in (env or {}).items() if v is not None})
        try:
            result = subprocess.run([self.binary, *args, "--help"], capture_output=True,
                                    text=True, timeout=20, env=clean, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            sys.exit(f"{PROG}: FAIL: cannot run {self.binary} --help: {error}")
        return result.returncode, result.stdout, result.stderr.strip()


def read_help(flags):
    status, out, err = flags.run_help()
    if status != 0:
        sys.exit(f"{PROG}: FAIL: {flags.binary} --help exited {status}: {err}")
    return out


def description_column(text):
    """Where CLI11 starts descriptions: the column of --help's own one."""
    match = re.search(r"^(  -h,--help +)\S", text, re.MULTILINE)
    return len(match[1]) if match else 30


def option_match(line, column):
    """OPTION_LINE's match if it spans the whole name column (nothing unexpected after it)."""
    match = OPTION_LINE.match(line)
    if match is None:
        return None
    end = match.end()
    if line[end:].strip() == "" or (end < column and line[end:column].strip() == ""
                                    and line[column:column + 1].strip()):
        return match
    return None


def parse_help(flags, check):
    text = read_help(flags)
    column = description_column(text)
    for line in text.splitlines():
        if not re.match(r"^  (?:-\w,)?--", line):
            continue
        match = option_match(line, column)
        if not check.expect(match is not None, "attnserve --help", "option line",
                            "`  --name TYPE=default (Env:NAME)` and its description", repr(line)):
            continue
        flag = Flag(match["name"], match["type"], match["default"], match["env"])
        flags[flag.name] = flag
    check.expect("grpc-address" in flags and "metrics-address" in flags, "attnserve --help",
                 "flags", "--grpc-address and --metrics-address", sorted(flags))
    return flags


def env_names(flags):
    """{ATTNSERVE_X: flag} from the (Env:...) annotations of --help."""
    return {f.env: f for f in flags.values() if f.env}


def value_problem(flag, value):
    """Why `value` is not one --flag accepts, or None. Covers CLI11's types shown by --help."""
    base, _, validator = flag.type.partition(":")
    if validator.startswith("{"):
        choices = validator[1:-1].split(",")
        return None if value in choices else f"one of {choices}"
    if base in ("INT", "FLOAT"):
        try:
            number = int(value) if base == "INT" else float(value)
        except ValueError:
            return f"{'an integer' if base == 'INT' else 'a number'} ({flag.type})"
        bounds = re.search(r"in \[(\S+) - (\S+)\]", validator)
        if validator == "POSITIVE" and not number > 0:
            return "a positive number"
        if validator == "NONNEGATIVE" and number < 0:
            return "a non-negative number"
        if bounds and not float(bounds[1]) <= number <= float(bounds[2]):
            return f"a number in [{bounds[1]}, {bounds[2]}]"
    if flag.name.endswith("-address") and value != "":
        return None if parse_port(value) is not None else "host:port"
    return None


def parse_port(address):
    host, sep, port = address.rpartition(":")
    return int(port) if sep and host and port.isdigit() and int(port) < 65536 else None


# ------------------------------------------------------------------------------------------------
# Effective flags of one place that runs attnserve: --help defaults < Dockerfile ENV < env < args.


def unknown_flag(name, flags):
    near = difflib.get_close_matches(name, flags, n=1)
    return f"unknown flag --{name}" + (f" (did you mean --{near[0]}?)" if near else "")


def apply_env(values, env, flags, file, field, check):
    names = env_names(flags)
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        flag = names.get(name)
        near = difflib.get_close_matches(name, names, n=1)
        if not check.expect(flag is not None, file, f"{field} {name}",
                            "a variable `attnserve --help` names (Env:...)",
                            "no such variable" + (f" (did you mean {near[0]}?)" if near else "")):
            continue
        if value is not None:
            set_value(values, flag, str(value), file, f"{field} {name}", check)


def apply_args(values, args, flags, file, field, check):
    index = 0
    while index < len(args):
        arg = str(args[index])
        index += 1
        if not check.expect(arg.startswith("--"), file, field, "`--long-flag[=value]` items",
                            repr(arg)):
            continue
        name, has_value, value = arg[2:].partition("=")
        flag = flags.get(name)
        if not check.expect(flag is not None, file, field, "flags of `attnserve --help`",
                            unknown_flag(name, flags)):
            continue
        if flag.takes_value() and not has_value:
            if not check.expect(index < len(args), file, field, f"a value after --{name}",
                                "the end of the list"):
                continue
            value, index = str(args[index]), index + 1
        set_value(values, flag, value, file, f"{field} --{name}", check)


def set_value(values, flag, value, file, field, check):
    problem = value_problem(flag, value)
    if check.expect(problem is None, file, field, problem, repr(value)):
        values[flag.name] = value


def effective(flags, layers, check):
    """Flag values after applying `layers`: (kind, mapping-or-list, file, field) in order.

    Also runs attnserve on the resulting environment and command line (see Flags.run_help)."""
    values = {name: f.default for name, f in flags.items() if f.default is not None}
    env, args = {}, []
    for kind, data, file, field in layers:
        if kind == "env":
            apply_env(values, data, flags, file, field, check)
            env.update({k: v for k, v in data.items() if k.startswith(ENV_PREFIX)})
        else:
            apply_args(values, data, flags, file, field, check)
            args = [str(a) for a in data]
    status, _, err = flags.run_help(args, env)
    files = [file for _, data, file, _ in layers if data] or ["Dockerfile"]
    check.expect(status == 0, files[-1], f"`attnserve {' '.join(args)} --help` with {sorted(env)}",
                 "exit 0 (attnserve accepts these flags and variables)",
                 f"exit {status}: {err.splitlines()[0] if err else ''}")
    return values


def whole(number):
    """2.0 → 2, so that messages show numbers as they are written."""
    return int(number) if number is not None and float(number).is_integer() else number


def number_flag(values, name):
    try:
        return whole(float(values.get(name)))
    except (TypeError, ValueError):
        return None


def ports_of(values, file, check):
    """(gRPC port, metrics port or None when metrics are off)."""
    grpc = parse_port(values.get("grpc-address", ""))
    check.expect(grpc not in (None, 0), file, "--grpc-address", "host:port with a fixed port",
                 values.get("grpc-address"))
    metrics_address = values.get("metrics-address", "")
    metrics = parse_port(metrics_address) if metrics_address else None
    check.expect(metrics != 0, file, "--metrics-address", "a fixed port (not 0)", metrics_address)
    return grpc, metrics


# ------------------------------------------------------------------------------------------------
# The Dockerfile (final stage only).


def read_dockerfile(root, check):
    path = root / "Dockerfile"
    if not check.expect(path.is_file(), "Dockerfile", "file", "the image's Dockerfile",
                        "no such file"):
        return None
    text = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))
    stage = []
    for line in text.splitlines():
        words = line.strip().split(None, 1)
        if not words or words[0].startswith("#"):
            continue
        if words[0].upper() == "FROM":
            stage = []
        stage.append((words[0].upper(), words[1] if len(words) > 1 else ""))
    return stage


def dockerfile_env(stage):
    env = {}
    for instruction, rest in stage or []:
        if instruction != "ENV":
            continue
        words = shlex.split(rest)
        if words and "=" not in words[0]:
            env[words[0]] = " ".join(words[1:])
        else:
            env.update(w.split("=", 1) for w in words if "=" in w)
    return env


def dockerfile_exposed(stage):
    ports = []
    for instruction, rest in stage or []:
        if instruction == "EXPOSE":
            ports += [int(p.split("/")[0]) for p in rest.split() if p.split("/")[0].isdigit()]
    return ports


def check_dockerfile(stage, image_ports, check):
    if stage is None:
        return
    exposed = dockerfile_exposed(stage)
    check.equal("Dockerfile", "EXPOSE", sorted(p for p in image_ports if p), sorted(exposed),
                "the gRPC and metrics ports of --help's defaults and the Dockerfile's ENV")


# ------------------------------------------------------------------------------------------------
# Compose.


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
    for name in ("attnserve", "prometheus", "grafana"):
        check.expect(name in services, file, "services", f"a service `{name}`", sorted(services))
    for name in ("prometheus", "grafana"):
        image = str(get(services, name, "image") or "")
        check.expect(":" in image and not image.endswith(":latest"), file,
                     f"services.{name}.image", "a pinned tag", repr(image))
    metrics = check_compose_attnserve(root, file, services.get("attnserve") or {}, flags,
                                      image_env, stage, image_grpc, check)
    check_compose_prometheus(root, file, services.get("prometheus") or {}, check)
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
    check.equal(file, f"{field}.ports (container side)", sorted(p for p in (grpc, metrics) if p),
                sorted(compose_ports(service.get("ports"))), "the gRPC and metrics ports")
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
    return metrics


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
    check.expect(targets, file, "scrape_configs[attnserve].static_configs", "a target",
                 "none")
    for target in targets:
        host, _, port = str(target).rpartition(":")
        check.expect(host in compose_services, file, f"target {target!r} host",
                     f"a service of deploy/compose.yaml {sorted(compose_services)}", host)
        check.equal(file, f"target {target!r} port", metrics_port,
                    int(port) if port.isdigit() else port, "attnserve's --metrics-address port")
    return config


# ------------------------------------------------------------------------------------------------
# Grafana provisioning.


def check_grafana(root, docs, compose, prometheus_config, check):
    file = "deploy/compose.yaml"
    grafana = get(compose, "services", "grafana") or {}
    mounts = [(host_path(root / "deploy", s), t) for s, t in compose_mounts(grafana.get("volumes"))]
    provisioning = (get(grafana, "environment") or {}).get("GF_PATHS_PROVISIONING",
                                                            GRAFANA_PROVISIONING)
    mounted = [s for s, t in mounts if t == provisioning]
    check.equal(file, f"services.grafana.volumes ({provisioning})",
                str(root / "deploy/grafana/provisioning"), str(mounted[0]) if mounted else None)
    home = get(grafana, "environment", "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home is not None:
        check.expect(home in [t for _, t in mounts], file,
                     "services.grafana.environment GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH",
                     "a file services.grafana.volumes mounts", home)
    datasource = check_datasources(docs, compose, prometheus_config, check)
    dashboard = check_dashboard_provider(root, docs, mounts, check)
    if dashboard:
        check_dashboard_datasources(dashboard, datasource, check)


def check_datasources(docs, compose, prometheus_config, check):
    """The provisioned Prometheus data source the dashboard's variable picks (its uid)."""
    file = "deploy/grafana/provisioning/datasources/prometheus.yaml"
    sources = get((docs.get(file) or [None])[0], "datasources") or []
    prometheus = [s for s in sources if s.get("type") == "prometheus"]
    if not check.expect(len(prometheus) == 1, file, "datasources", "one of type prometheus",
                        len(prometheus)):
        return None
    source = prometheus[0]
    check.expect(source.get("uid"), file, "datasources[0].uid", "a fixed uid", source.get("uid"))
    # The dashboard's `datasource` variable has no saved value: Grafana picks the default one.
    check.equal(file, "datasources[0].isDefault", True, source.get("isDefault"),
                "deploy/grafana/attnserve.json's `datasource` variable has no saved value")
    url = re.match(r"^https?://([^:/]+):(\d+)/?$", str(source.get("url")))
    services = get(compose, "services") or {}
    if check.expect(url is not None, file, "datasources[0].url", "http://<service>:<port>",
                    source.get("url")):
        host, port = url[1], int(url[2])
        check.expect(host in services, file, "datasources[0].url host",
                     f"a service of deploy/compose.yaml {sorted(services)}", host)
        check.expect(port in compose_ports(get(services, host, "ports")), file,
                     "datasources[0].url port", f"a container port of service {host}", port)
    interval = get(source, "jsonData", "timeInterval")
    if interval is not None:
        check.equal(file, "datasources[0].jsonData.timeInterval",
                    get(prometheus_config, "global", "scrape_interval"), interval,
                    "deploy/prometheus.yml's scrape_interval")
    return source


def check_dashboard_provider(root, docs, mounts, check):
    """The dashboard file the provider loads inside the container, or None."""
    file = "deploy/grafana/provisioning/dashboards/attnserve.yaml"
    providers = get((docs.get(file) or [None])[0], "providers") or []
    if not check.expect(len(providers) == 1, file, "providers", "one provider", len(providers)):
        return None
    provider = providers[0]
    check.equal(file, "providers[0].type", "file", provider.get("type"))
    path = str(get(provider, "options", "path") or "")
    loaded = [s for s, t in mounts if s and (t == path or t.startswith(path.rstrip("/") + "/"))
              and t.endswith(".json")]
    expected = root / "deploy/grafana/attnserve.json"
    found = [str(s) for s in loaded]
    if not check.expect(str(expected) in found, file, "providers[0].options.path",
                        f"a folder where deploy/compose.yaml mounts {expected.name}",
                        f"{path!r} holding {found}"):
        return None
    check.expect(expected.is_file(), "deploy/grafana/attnserve.json", "file", "the dashboard",
                 "no such file")
    return (docs.get("deploy/grafana/attnserve.json") or [None])[0]


def walk(node):
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def check_dashboard_datasources(dashboard, source, check):
    """Every data source reference resolves to the `datasource` variable or a provisioned uid."""
    file = "deploy/grafana/attnserve.json"
    variables = {v.get("name"): v for v in get(dashboard, "templating", "list") or []}
    variable = variables.get("datasource")
    if check.expect(variable is not None and variable.get("type") == "datasource", file,
                    "templating.list[datasource]", "a variable of type datasource",
                    variable and variable.get("type")) and source is not None:
        check.equal(file, "templating.list[datasource].query", source and source.get("type"),
                    variable.get("query"), "the provisioned data source's type")
    known = {"${datasource}", "$datasource", source and source.get("uid")}
    for node in walk(dashboard):
        reference = node.get("datasource")
        if isinstance(reference, dict) and "uid" in reference:
            check.expect(reference["uid"] in known, file, "datasource.uid",
                         f"one of {sorted(filter(None, known))}", reference["uid"])


# ------------------------------------------------------------------------------------------------
# Kubernetes.


def load_k8s(root, docs, check):
    """[(file, object)] of the resources kustomization.yaml lists."""
    file = "deploy/k8s/kustomization.yaml"
    kustomization = (docs.get(file) or [{}])[0] or {}
    listed = [str(r) for r in kustomization.get("resources") or []]
    present = sorted(p.name for p in (root / "deploy/k8s").glob("*.y*ml")
                     if p.name not in ("kustomization.yaml", "kustomization.yml"))
    check.equal(file, "resources", present, sorted(listed), "every manifest in deploy/k8s")
    objects = []
    for name in listed:
        rel = f"deploy/k8s/{name}"
        if check.expect(rel in docs, file, "resources", "existing, readable files", name):
            objects += [(rel, doc) for doc in docs[rel]]
    return objects


def of_kind(objects, kind):
    return [(f, o) for f, o in objects if o.get("kind") == kind]


def describe(obj):
    return f"{obj.get('kind')} {get(obj, 'metadata', 'name')}"


def subset(labels, of):
    return bool(labels) and all((of or {}).get(k) == v for k, v in labels.items())


def cpu_cores(quantity):
    text = str(quantity)
    try:
        return whole(float(text[:-1]) / 1000 if text.endswith("m") else float(text))
    except ValueError:
        return None


class Pod:
    """What the other resources must agree with: the Deployment's pod template and flags."""

    def __init__(self, name, labels, container, grpc, metrics):
        self.name, self.labels, self.container = name, labels, container
        self.grpc, self.metrics = grpc, metrics
        self.port_names = {p.get("name"): p.get("containerPort")
                           for p in container.get("ports") or []}


def check_deployment(objects, flags, image_env, check):
    deployments = of_kind(objects, "Deployment")
    if not check.expect(len(deployments) == 1, "deploy/k8s", "Deployment", "exactly one",
                        len(deployments)):
        return None
    file, deployment = deployments[0]
    labels = get(deployment, "spec", "template", "metadata", "labels") or {}
    selector = get(deployment, "spec", "selector", "matchLabels") or {}
    check.expect(subset(selector, labels), file, "spec.selector.matchLabels",
                 f"labels of the pod template {labels}", selector)
    containers = get(deployment, "spec", "template", "spec", "containers") or []
    if not check.expect(len(containers) == 1, file, "spec.template.spec.containers",
                        "one container", len(containers)):
        return None
    container = containers[0]
    field = f"containers[{container.get('name')}]"
    check.expect("command" not in container, file, f"{field}.command",
                 "none (it would replace the image's `tini -- attnserve`; use args)",
                 container.get("command"))
    env = {e.get("name"): e.get("value") for e in container.get("env") or []}
    values = effective(flags, [("env", image_env, "Dockerfile", "ENV"),
                               ("env", env, file, f"{field}.env"),
                               ("args", container.get("args") or [], file, f"{field}.args")],
                       check)
    grpc, metrics = ports_of(values, file, check)
    pod = Pod(get(deployment, "metadata", "name"), labels, container, grpc, metrics)
    check_container_ports(file, field, pod, check)
    check_probes(file, field, container, grpc, check)
    check_termination(file, field, deployment, container, values, check)
    check_cpu(file, field, container, values, check)
    return pod, get(deployment, "spec", "replicas")


def check_container_ports(file, field, pod, check):
    check.equal(file, f"{field}.ports[grpc].containerPort", pod.grpc, pod.port_names.get("grpc"),
                "the --grpc-address port")
    if check.expect(pod.metrics is not None, file, f"{field}.args --metrics-address",
                    "metrics on (the ServiceMonitor scrapes them)", "\"\""):
        check.equal(file, f"{field}.ports[metrics].containerPort", pod.metrics,
                    pod.port_names.get("metrics"), "the --metrics-address port")


def check_probes(file, field, container, grpc, check):
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        check.equal(file, f"{field}.{probe}.grpc.port", grpc, get(container, probe, "grpc", "port"),
                    "the --grpc-address port, where the health service answers")


def prestop_sleep(container):
    command = get(container, "lifecycle", "preStop", "exec", "command") or []
    if len(command) == 2 and command[0] == "sleep":
        return cpu_cores(command[1])
    return None


def check_termination(file, field, deployment, container, values, check):
    sleep = prestop_sleep(container)
    check.expect(sleep is not None and sleep > 0, file, f"{field}.lifecycle.preStop.exec.command",
                 "[\"sleep\", \"<seconds>\"]",
                 get(container, "lifecycle", "preStop", "exec", "command"))
    grace = number_flag(values, "shutdown-grace-s")
    period = get(deployment, "spec", "template", "spec", "terminationGracePeriodSeconds")
    period = 30 if period is None else period
    needed = (sleep or 0) + (grace or 0)
    check.expect(isinstance(period, (int, float)) and period > needed, file,
                 "spec.template.spec.terminationGracePeriodSeconds",
                 f"more than preStop sleep {sleep} + --shutdown-grace-s {grace} = {needed}", period)


def check_cpu(file, field, container, values, check):
    limit = cpu_cores(get(container, "resources", "limits", "cpu"))
    request = cpu_cores(get(container, "resources", "requests", "cpu"))
    check.expect(limit is not None and limit == math.floor(limit) and limit >= 1, file,
                 f"{field}.resources.limits.cpu", "whole cores (the compute threads' budget)",
                 get(container, "resources", "limits", "cpu"))
    check.equal(file, f"{field}.resources.requests.cpu", limit, request,
                "= the limit: the HPA's utilization is relative to the request")
    threads = number_flag(values, "compute-threads")
    check.equal(file, f"{field}.args --compute-threads", limit, threads,
                "the CPU limit in cores")


def check_services(objects, pod, check):
    services = of_kind(objects, "Service")
    headless = [(f, s) for f, s in services if get(s, "spec", "clusterIP") == "None"]
    cluster = [(f, s) for f, s in services if get(s, "spec", "clusterIP") != "None"]
    check.expect(len(headless) == 1 and len(cluster) == 1, "deploy/k8s", "Services",
                 "one headless (clusterIP: None) and one ClusterIP",
                 [describe(s) for _, s in services])
    for file, service in services:
        check_service(file, service, pod, service in (s for _, s in headless), check)
    return services


def check_service(file, service, pod, is_headless, check):
    name = describe(service)
    selector = get(service, "spec", "selector") or {}
    check.expect(subset(selector, pod.labels), file, f"{name} spec.selector",
                 f"a subset of the pod labels {pod.labels}", selector)
    ports = {p.get("name"): p for p in get(service, "spec", "ports") or []}
    wanted = {"grpc": pod.grpc} if is_headless else {"grpc": pod.grpc, "metrics": pod.metrics}
    check.equal(file, f"{name} spec.ports names", sorted(wanted), sorted(map(str, ports)))
    for port_name, number in wanted.items():
        if number is None:
            continue  # metrics off: reported with the Deployment
        port = ports.get(port_name) or {}
        target = port.get("targetPort", port.get("port"))
        resolved = pod.port_names.get(target, target) if isinstance(target, str) else target
        check.expect(resolved == number, file, f"{name} spec.ports[{port_name}].targetPort",
                     f"{number} (container port {port_name})",
                     f"{target!r} (no container port of that name)"
                     if isinstance(resolved, str) else repr(resolved))
        if is_headless:
            # DNS gives clients the pod IPs: they dial `port` on the pods themselves.
            check.equal(file, f"{name} spec.ports[{port_name}].port", number, port.get("port"),
                        "a headless service's clients connect to the pods on this port")


def check_pdb(objects, pod, hpa_min, check):
    for file, pdb in of_kind(objects, "PodDisruptionBudget"):
        selector = get(pdb, "spec", "selector", "matchLabels") or {}
        check.expect(subset(selector, pod.labels), file, f"{describe(pdb)} spec.selector",
                     f"a subset of the pod labels {pod.labels}", selector)
        minimum = get(pdb, "spec", "minAvailable")
        if isinstance(minimum, int) and hpa_min is not None:
            check.expect(minimum < hpa_min, file, f"{describe(pdb)} spec.minAvailable",
                         f"less than the HPA's minReplicas {hpa_min} (else drains block)", minimum)


def check_hpa(objects, pod, replicas, check):
    minimum = None
    for file, hpa in of_kind(objects, "HorizontalPodAutoscaler"):
        name = describe(hpa)
        target = get(hpa, "spec", "scaleTargetRef") or {}
        check.equal(file, f"{name} spec.scaleTargetRef",
                    {"apiVersion": "apps/v1", "kind": "Deployment", "name": pod.name},
                    {k: target.get(k) for k in ("apiVersion", "kind", "name")})
        minimum, maximum = get(hpa, "spec", "minReplicas"), get(hpa, "spec", "maxReplicas")
        check.expect(isinstance(minimum, int) and isinstance(maximum, int)
                     and minimum <= maximum and minimum <= (replicas or 1) <= maximum, file,
                     f"{name} spec.minReplicas/maxReplicas",
                     f"min <= the Deployment's replicas ({replicas}) <= max",
                     f"{minimum}/{maximum}")
        cpu_metrics = [m for m in get(hpa, "spec", "metrics") or []
                       if get(m, "resource", "name") == "cpu"]
        if cpu_metrics:
            check.expect(get(pod.container, "resources", "requests", "cpu") is not None, file,
                         f"{name} spec.metrics[cpu]", "a CPU request on the container",
                         "none")
    return minimum


def check_service_monitor(objects, services, prometheus_config, check):
    for file, monitor in of_kind(objects, "ServiceMonitor"):
        name = describe(monitor)
        selector = get(monitor, "spec", "selector", "matchLabels") or {}
        selected = [s for _, s in services if subset(selector, get(s, "metadata", "labels"))]
        for index, endpoint in enumerate(get(monitor, "spec", "endpoints") or []):
            field = f"{name} spec.endpoints[{index}]"
            port = endpoint.get("port")
            with_port = [describe(s) for s in selected
                         if port in [p.get("name") for p in get(s, "spec", "ports") or []]]
            check.expect(len(with_port) == 1, file, f"{field}.port {port!r}",
                         f"one Service matching {selector} with that port (each pod scraped once)",
                         with_port)
            check.equal(file, f"{field}.port", "metrics", port)
            check.equal(file, f"{field}.path", "/metrics", endpoint.get("path", "/metrics"))
            check.equal(file, f"{field}.interval",
                        get(prometheus_config, "global", "scrape_interval"),
                        endpoint.get("interval"), "deploy/prometheus.yml's scrape_interval")


def check_k8s(root, docs, flags, image_env, prometheus_config, check):
    objects = load_k8s(root, docs, check)
    result = check_deployment(objects, flags, image_env, check)
    if result is None:
        return
    pod, replicas = result
    services = check_services(objects, pod, check)
    hpa_min = check_hpa(objects, pod, replicas, check)
    check_pdb(objects, pod, hpa_min, check)
    check_service_monitor(objects, services, prometheus_config, check)
    for kind in ("HorizontalPodAutoscaler", "PodDisruptionBudget", "ServiceMonitor"):
        check.expect(of_kind(objects, kind), "deploy/k8s", kind, "one", "none")


# ------------------------------------------------------------------------------------------------


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
    check_dockerfile(stage, image_ports, check)
    compose_result = check_compose(root, docs, flags, image_env, stage, image_ports[0], check)
    compose, metrics = compose_result or ({}, None)
    prometheus_config = check_prometheus_yml(docs, get(compose, "services") or {}, metrics, check)
    check_grafana(root, docs, compose, prometheus_config, check)
    check_k8s(root, docs, flags, image_env, prometheus_config, check)

    for failure in check.failures:
        print(f"{PROG}: FAIL: {failure}", file=sys.stderr)
    if check.failures:
        print(f"{PROG}: {len(check.failures)} of {check.checks} checks failed")
    else:
        print(f"{PROG}: OK, {check.checks} checks")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
