"""The Grafana provisioning of the compose stack: data source, dashboard provider, dashboard.

Part of check_manifests.py, whose header says what is checked.
"""
import re

from checker import get, walk
from compose import compose_mounts, compose_ports, host_path

GRAFANA_PROVISIONING = "/etc/grafana/provisioning"


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
