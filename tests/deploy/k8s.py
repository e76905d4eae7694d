"""deploy/k8s: the Deployment, and the Services, HPA, PDB and ServiceMonitor around it.

Part of check_manifests.py, whose header says what is checked.
"""
import math

from attnserve_flags import effective, http_port_of, number_flag, ports_of
from checker import get, whole


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

    def __init__(self, file, name, labels, container, grpc, metrics, http=None):
        self.file, self.name, self.labels, self.container = file, name, labels, container
        self.grpc, self.metrics, self.http = grpc, metrics, http
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
    http = http_port_of(values, file, check)
    pod = Pod(file, get(deployment, "metadata", "name"), labels, container, grpc, metrics, http)
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
    if check.expect(pod.http is not None, file, f"{field}.args --http-address",
                    "REST on (the Services route port http to it)", "\"\""):
        check.equal(file, f"{field}.ports[http].containerPort", pod.http,
                    pod.port_names.get("http"), "the --http-address port")


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
    # A new pod must stay ready for at least one more readiness probe before the rollout goes on.
    ready_period = get(container, "readinessProbe", "periodSeconds") or 10
    min_ready = get(deployment, "spec", "minReadySeconds")
    check.expect(isinstance(min_ready, int) and min_ready >= ready_period, file,
                 "spec.minReadySeconds", f"at least the readiness period ({ready_period} s)",
                 min_ready)


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
    wanted = {"grpc": pod.grpc, "http": pod.http}
    if not is_headless:
        wanted["metrics"] = pod.metrics
    check.equal(file, f"{name} spec.ports names", sorted(wanted), sorted(map(str, ports)))
    for port_name, number in wanted.items():
        if number is None:
            continue  # metrics or REST off: reported with the Deployment
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
    """The Pod of the Deployment (None when it could not be read), for deploy/k8s/kserve."""
    objects = load_k8s(root, docs, check)
    result = check_deployment(objects, flags, image_env, check)
    if result is None:
        return None
    pod, replicas = result
    services = check_services(objects, pod, check)
    hpa_min = check_hpa(objects, pod, replicas, check)
    check_pdb(objects, pod, hpa_min, check)
    check_service_monitor(objects, services, prometheus_config, check)
    for kind in ("HorizontalPodAutoscaler", "PodDisruptionBudget", "ServiceMonitor"):
        check.expect(of_kind(objects, kind), "deploy/k8s", kind, "one", "none")
    return pod
