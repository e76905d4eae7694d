"""deploy/k8s/kserve: the KServe ServingRuntime and InferenceService, against attnserve and the
Deployment.

Part of check_manifests.py, whose header says what is checked. What KServe and Knative accept
(one container port named http1 or h2c, probes on it, no lifecycle hooks, the container name,
protocol versions and how an InferenceService picks its runtime) is their controllers' and
webhooks' behaviour, written down here as checks.
"""
from attnserve_flags import apply_args, apply_env, effective, number_flag, parse_port, ports_of
from checker import Checker, get
from k8s import cpu_cores, describe, of_kind

FOLDER = "deploy/k8s/kserve"
RUNTIME_KINDS = ("ServingRuntime", "ClusterServingRuntime")
# KServe merges the InferenceService's predictor into the runtime container of this name.
CONTAINER = "kserve-container"
# Where KServe's storage initializer puts the InferenceService's storageUri.
MODEL_DIR = "/mnt/models"
# Knative's names for the one serving port (KServe treats names containing grpc or h2c as gRPC).
PORT_NAMES = ("http1", "h2c")
# Ports Knative's queue-proxy and profiling take in every pod (Knative refuses them).
KNATIVE_RESERVED_PORTS = (8008, 8012, 8013, 8022, 9090, 9091)
# The protocol versions attnserve serves: transport, and the flag of the address serving it.
PROTOCOLS = {"v2": ("http", "http-address"), "grpc-v2": ("grpc", "grpc-address")}
ADDRESS_FLAG = {"http": "http-address", "grpc": "grpc-address"}
# KServe's order when it assigns an InferenceService a protocol from its runtime's list.
PROTOCOL_ORDER = ("v1", "v2", "grpc-v1", "grpc-v2")
PROBE_PATHS = {"startupProbe": "/v2/health/live", "readinessProbe": "/v2/health/ready",
               "livenessProbe": "/v2/health/live"}
# Kubernetes' default terminationGracePeriodSeconds: KServe's Standard-mode pods get it unless the
# InferenceService's predictor sets one (Knative's get the revision timeout, 300 s by default).
DEFAULT_GRACE_S = 30


def load_kserve(docs, check):
    """[(file, object)] of the resources the folder's kustomization.yaml lists."""
    file = f"{FOLDER}/kustomization.yaml"
    if not check.expect(file in docs, FOLDER, "kustomization.yaml",
                        "a kustomization of its own (deploy/k8s's does not list the folder)",
                        "no such file"):
        return []
    kustomization = (docs.get(file) or [{}])[0] or {}
    listed = [str(r) for r in kustomization.get("resources") or []]
    present = sorted(rel.rsplit("/", 1)[1] for rel in docs
                     if rel.rsplit("/", 1)[0] == FOLDER
                     and not rel.endswith(("/kustomization.yaml", "/kustomization.yml")))
    check.equal(file, "resources", present, sorted(listed), f"every manifest in {FOLDER}")
    objects = []
    for name in listed:
        rel = f"{FOLDER}/{name}"
        if check.expect(rel in docs, file, "resources", "existing, readable files", name):
            objects += [(rel, doc) for doc in docs[rel]]
    return objects


def port_protocol(port):
    name = str(port.get("name") or "")
    return "grpc" if "grpc" in name or "h2c" in name else "http"


def explicit_flags(env, args, flags):
    """{flag: value} a container sets itself (env, then args), unknown ones left out (the
    checks of effective() report those)."""
    values = {}
    scratch = Checker()
    apply_env(values, env, flags, "", "", scratch)
    apply_args(values, args, flags, "", "", scratch)
    return values


def env_of(container):
    return {e.get("name"): e.get("value") for e in container.get("env") or []}


class Runtime:
    """What an InferenceService's pods get from a ServingRuntime: formats, protocols, ports,
    flags."""

    def __init__(self, file, obj, container, values):
        self.file, self.name = file, get(obj, "metadata", "name")
        self.formats = get(obj, "spec", "supportedModelFormats") or []
        self.protocols = [str(p) for p in get(obj, "spec", "protocolVersions") or []]
        self.container, self.values = container, values
        self.ports = container.get("ports") or []
        self.env, self.args = env_of(container), [str(a) for a in container.get("args") or []]


def check_runtime(file, runtime, flags, image_env, pod, check):
    name = describe(runtime)
    containers = get(runtime, "spec", "containers") or []
    names = [c.get("name") for c in containers]
    if not check.expect(CONTAINER in names, file, f"{name} spec.containers",
                        f"a container named {CONTAINER} (the one KServe serves with)", names):
        return None
    container = containers[names.index(CONTAINER)]
    field = f"{name} containers[{CONTAINER}]"
    check.expect("command" not in container, file, f"{field}.command",
                 "none (it would replace the image's `tini -- attnserve`)",
                 container.get("command"))
    values = effective(flags, [("env", image_env, "Dockerfile", "ENV"),
                               ("env", env_of(container), file, f"{field}.env"),
                               ("args", container.get("args") or [], file, f"{field}.args")],
                       check)
    result = Runtime(file, runtime, container, values)
    check.equal(file, f"{field} --model-repository", MODEL_DIR, values.get("model-repository"),
                "where KServe's storage initializer puts the storageUri")
    check_protocols(file, name, result, check)
    check_runtime_port(file, field, result, check)
    check_runtime_probes(file, field, result, check)
    check_metrics_annotations(file, name, runtime, values, check)
    if pod is not None:
        check_like_deployment(file, field, result, pod, flags, check)
    check_runtime_cpu(file, field, container, values, check)
    return result


def check_protocols(file, name, runtime, check):
    """Every listed protocol is one attnserve serves, on an address that is on."""
    check.expect(runtime.protocols, file, f"{name} spec.protocolVersions",
                 f"the protocols attnserve serves ({sorted(PROTOCOLS)})", "none")
    for protocol in runtime.protocols:
        if not check.expect(protocol in PROTOCOLS, file, f"{name} spec.protocolVersions",
                            f"ones attnserve serves ({sorted(PROTOCOLS)})", protocol):
            continue
        flag = PROTOCOLS[protocol][1]
        check.expect(runtime.values.get(flag, "") != "", file,
                     f"{name} spec.protocolVersions {protocol}", f"--{flag} on (it serves it)",
                     f"--{flag}={runtime.values.get(flag)!r}")


def check_runtime_port(file, field, runtime, check):
    """One port (Knative's rule, and KServe's), the port of the address serving its protocol,
    which protocolVersions lists."""
    ports = runtime.ports
    if not check.expect(len(ports) == 1, file, f"{field}.ports",
                        "exactly one (KServe and Knative route to a single container port)",
                        [p.get("containerPort") for p in ports]):
        return
    port = ports[0]
    check.expect(port.get("name") in PORT_NAMES, file, f"{field}.ports[0].name",
                 f"one of {list(PORT_NAMES)} (Knative's names for HTTP/1 and cleartext HTTP/2)",
                 port.get("name"))
    transport = port_protocol(port)
    check_port_number(file, f"{field}.ports[0]", port, runtime.values, check)
    check.expect(port.get("containerPort") not in KNATIVE_RESERVED_PORTS, file,
                 f"{field}.ports[0].containerPort",
                 f"none of Knative's reserved ports {list(KNATIVE_RESERVED_PORTS)}",
                 port.get("containerPort"))
    served = [p for p in runtime.protocols if PROTOCOLS.get(p, ("",))[0] == transport]
    check.expect(served, file, f"{field}.ports[0] ({port.get('name')}: {transport})",
                 f"a protocolVersions entry speaking {transport} "
                 f"({[p for p, (t, _) in PROTOCOLS.items() if t == transport]})",
                 runtime.protocols)


def check_port_number(file, field, port, values, check):
    flag = ADDRESS_FLAG[port_protocol(port)]
    number = parse_port(values.get(flag, "") or "")
    check.equal(file, f"{field}.containerPort", number, port.get("containerPort"),
                f"the --{flag} port ({port.get('name')} speaks {port_protocol(port)})")


def check_runtime_probes(file, field, runtime, check):
    container = runtime.container
    port = (runtime.ports or [{}])[0]
    check.expect("lifecycle" not in container, file, f"{field}.lifecycle",
                 "none (Knative refuses lifecycle hooks)", container.get("lifecycle"))
    check.expect(port_protocol(port) == "http", file, f"{field} probes",
                 "the HTTP port, which serves /v2/health (Knative probes only the serving port)",
                 f"port {port.get('name')!r}")
    for probe, path in PROBE_PATHS.items():
        if probe not in container:
            check.expect(probe == "startupProbe", file, f"{field}.{probe}", "a probe", "none")
            continue
        check.equal(file, f"{field}.{probe}.httpGet.path", path,
                    get(container, probe, "httpGet", "path"), "the Open Inference Protocol's")
        check.equal(file, f"{field}.{probe}.httpGet.port", port.get("containerPort"),
                    get(container, probe, "httpGet", "port"),
                    "the container port (Knative probes no other)")


def check_metrics_annotations(file, name, runtime, values, check):
    _, metrics = ports_of(values, file, check)
    annotations = get(runtime, "spec", "annotations") or {}
    if metrics is None:
        return
    check.equal(file, f"{name} spec.annotations[prometheus.kserve.io/port]", str(metrics),
                annotations.get("prometheus.kserve.io/port"), "the --metrics-address port")
    check.equal(file, f"{name} spec.annotations[prometheus.kserve.io/path]", "/metrics",
                annotations.get("prometheus.kserve.io/path"))


def check_like_deployment(file, field, runtime, pod, flags, check):
    """The Deployment's image and resources, and its values of every flag both set."""
    deployment = pod.container
    for key in ("image", "imagePullPolicy", "resources"):
        check.equal(file, f"{field}.{key}", deployment.get(key), runtime.container.get(key),
                    f"the Deployment's ({pod.file})")
    ours = explicit_flags(runtime.env, runtime.args, flags)
    theirs = explicit_flags(env_of(deployment), [str(a) for a in deployment.get("args") or []],
                            flags)
    for flag in sorted(set(ours) & set(theirs)):
        check.equal(file, f"{field} --{flag}", theirs[flag], ours[flag],
                    f"the Deployment's value ({pod.file})")


def check_runtime_cpu(file, field, container, values, check):
    limit = cpu_cores(get(container, "resources", "limits", "cpu"))
    check.expect(limit is not None and limit == int(limit) and limit >= 1, file,
                 f"{field}.resources.limits.cpu", "whole cores (the compute threads' budget)",
                 get(container, "resources", "limits", "cpu"))
    check.equal(file, f"{field} --compute-threads", limit, number_flag(values, "compute-threads"),
                "the CPU limit in cores")


# ------------------------------------------------------------------------------------------------
# InferenceServices.


def pick_runtime(file, name, model, runtimes, check):
    """(runtime, format entry) KServe would give the InferenceService, or None."""
    fmt = model.get("modelFormat") or {}
    wanted, version = fmt.get("name"), fmt.get("version")
    named = model.get("runtime")

    def entry(runtime):
        for f in runtime.formats:
            if f.get("name") == wanted and (version is None or str(f.get("version")) == version):
                return f
        return None

    if named is not None:
        found = [r for r in runtimes if r.name == named]
        if not check.expect(found, file, f"{name} spec.predictor.model.runtime",
                            f"a runtime of {FOLDER} ({[r.name for r in runtimes]})", named):
            return None
        runtime = found[0]
        supported = entry(runtime)
        check.expect(supported is not None, file, f"{name} spec.predictor.model.modelFormat",
                     f"a format runtime {named} supports",
                     f"{wanted} version {version}" if version else wanted)
        return (runtime, supported) if supported else None
    candidates = [(r, entry(r)) for r in runtimes if entry(r) is not None]
    check.expect(candidates, file, f"{name} spec.predictor.model.modelFormat",
                 f"one a runtime of {FOLDER} supports "
                 f"({sorted({f.get('name') for r in runtimes for f in r.formats})})",
                 f"{wanted} version {version}" if version else wanted)
    selectable = [(r, f) for r, f in candidates if f.get("autoSelect") is True]
    if candidates:
        check.expect(selectable, file, f"{name} spec.predictor.model.modelFormat {wanted}",
                     "autoSelect: true in the runtime (no runtime is named)",
                     [f"{r.name}: autoSelect {f.get('autoSelect')}" for r, f in candidates])
    return selectable[0] if selectable else None


def model_protocol(model, runtime):
    """The protocolVersion KServe gives the predictor: its own; else, when it names the runtime,
    the runtime's first in KServe's order; else v1 (how KServe matches runtimes by format)."""
    if model.get("protocolVersion") is not None:
        return str(model["protocolVersion"])
    if model.get("runtime") is not None and runtime.protocols:
        return min(runtime.protocols,
                   key=lambda p: PROTOCOL_ORDER.index(p) if p in PROTOCOL_ORDER else 99)
    return "v1"


def merged_ports(runtime, model):
    """The runtime's ports, then the predictor's new ones (KServe merges them by containerPort)."""
    ports = list(runtime.ports)
    known = {p.get("containerPort") for p in ports}
    return ports + [p for p in model.get("ports") or [] if p.get("containerPort") not in known]


def check_inference_service(file, isvc, runtimes, flags, image_env, check):
    name = describe(isvc)
    model = get(isvc, "spec", "predictor", "model")
    if not check.expect(isinstance(model, dict), file, f"{name} spec.predictor.model",
                        "a model (modelFormat, storageUri)", model):
        return
    picked = pick_runtime(file, name, model, runtimes, check)
    uri = model.get("storageUri")
    check.expect(uri is None or (isinstance(uri, str) and "://" in uri), file,
                 f"{name} spec.predictor.model.storageUri",
                 "a URI (scheme://...) or none (the demo model)", uri)
    if picked is None:
        return
    runtime, _ = picked
    protocol = model_protocol(model, runtime)
    check.expect(protocol in runtime.protocols, file,
                 f"{name} spec.predictor.model.protocolVersion",
                 f"one of runtime {runtime.name}'s protocolVersions {runtime.protocols}"
                 " (KServe matches runtimes by it; unset = v1)", protocol)
    values = runtime.values
    env, args = model.get("env") or [], model.get("args") or []
    if env or args:
        merged_env = {**runtime.env, **{e.get("name"): e.get("value") for e in env}}
        values = effective(flags, [("env", image_env, "Dockerfile", "ENV"),
                                   ("env", merged_env, file, f"{name} predictor env (merged)"),
                                   ("args", runtime.args + [str(a) for a in args], file,
                                    f"{name} predictor args (after the runtime's)")], check)
    ports = merged_ports(runtime, model)
    # The runtime's own port was checked with the runtime's flags: again only if they changed.
    for index, port in enumerate(ports):
        if index >= len(runtime.ports) or values is not runtime.values:
            check_port_number(file, f"{name} pod ports[{index}]", port, values, check)
    if ports and protocol in PROTOCOLS:
        check.equal(file, f"{name} spec.predictor.model.protocolVersion {protocol}",
                    PROTOCOLS[protocol][0], port_protocol(ports[0]),
                    f"the transport of the port KServe routes to ({ports[0].get('name')}: "
                    f"{ports[0].get('containerPort')})")
    # KServe merges the predictor's resources into the runtime's: the limit its pods get.
    own_cpu = get(model, "resources", "limits", "cpu")
    if own_cpu is not None or values is not runtime.values:
        cpu = get(runtime.container, "resources", "limits", "cpu") if own_cpu is None else own_cpu
        check.equal(file, f"{name} predictor --compute-threads", cpu_cores(cpu),
                    number_flag(values, "compute-threads"), "its pods' CPU limit in cores")
    grace = number_flag(values, "shutdown-grace-s")
    period = get(isvc, "spec", "predictor", "terminationGracePeriodSeconds")
    period = DEFAULT_GRACE_S if period is None else period
    check.expect(grace is not None and isinstance(period, (int, float)) and period > grace, file,
                 f"{name} --shutdown-grace-s",
                 f"less than the pods' terminationGracePeriodSeconds ({period} s)", grace)


def check_kserve(docs, flags, image_env, pod, check):
    objects = load_kserve(docs, check)
    runtime_objects = [(f, o) for f, o in objects if o.get("kind") in RUNTIME_KINDS]
    services = of_kind(objects, "InferenceService")
    check.expect(runtime_objects, FOLDER, "ServingRuntime", "one (or a ClusterServingRuntime)",
                 "none")
    check.expect(services, FOLDER, "InferenceService", "an example", "none")
    runtimes = []
    for file, obj in runtime_objects:
        check.equal(file, f"{describe(obj)} apiVersion", "serving.kserve.io/v1alpha1",
                    obj.get("apiVersion"))
        runtime = check_runtime(file, obj, flags, image_env, pod, check)
        if runtime is not None:
            runtimes.append(runtime)
    for file, isvc in services:
        check.equal(file, f"{describe(isvc)} apiVersion", "serving.kserve.io/v1beta1",
                    isvc.get("apiVersion"))
        check_inference_service(file, isvc, runtimes, flags, image_env, check)
