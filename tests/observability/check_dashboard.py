#!/usr/bin/env python3
"""Static check of the Grafana dashboard's PromQL (run by check_dashboard.sh).

1. Collects every `expr` anywhere in the dashboard JSON (panels, panels nested in rows, any future
   place) plus the template variables' queries. Grafana's `label_values(SELECTOR, label)` is not
   PromQL, so it is converted to its SELECTOR (which must parse and name a known metric);
   `label_values(label)` has no PromQL part and is skipped.
2. Replaces Grafana variables ($__rate_interval, $__interval, $__range → 1m; $model, ${model},
   ${model:regex}, [[model]] → .* for the dashboard's own variables). An unknown variable is an
   error, since Grafana would send it unreplaced.
3. Writes the queries as recording rules and runs `promtool check rules`: one that does not parse
   fails the check (and is then named, by checking each one alone).
4. Checks every metric name used is one attnserve exports (the list below), so the dashboard
   cannot drift from the server.
Exits 0 when all is well, 1 otherwise.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

# The names attnserve exports. Histograms are used through their series' suffixes.
HISTOGRAMS = [
    "attnserve_request_duration_seconds",
    "attnserve_queue_duration_seconds",
    "attnserve_compute_duration_seconds",
    "attnserve_batch_sequences",
    "attnserve_batch_tokens",
    "attnserve_decode_step_latency_seconds",
    "attnserve_decode_iteration_tokens",
    "attnserve_decode_iteration_seconds",
]
PLAIN = [
    "attnserve_requests_total",
    "attnserve_queue_depth",
    "attnserve_inflight_requests",
    "attnserve_tokens_total",
    "attnserve_model_loaded",
    "attnserve_model_load_failures_total",
    "attnserve_model_info",
    "attnserve_build_info",
    "attnserve_kv_cache_bytes",
    "attnserve_decode_sessions_open",
    "attnserve_decode_sessions_closed_total",
    "attnserve_decode_tokens_total",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_cpu_seconds_total",
    "process_start_time_seconds",
    "process_open_fds",
]
KNOWN_METRICS = set(PLAIN) | {h + s for h in HISTOGRAMS for s in ("_bucket", "_sum", "_count")}

# Grafana's built-in interval variables; 1m is a valid PromQL duration, which is all that matters.
BUILTINS = {
    "__rate_interval": "1m", "__interval": "1m", "__range": "1m",
    "__interval_ms": "60000", "__range_ms": "60000", "__range_s": "60",
}
VAR_RE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)(?::[^\]]*)?\]\]")

# PromQL words that are not metric names when not followed by "(": aggregators are caught here
# because `sum by (le) (...)` puts `by`, not "(", after `sum`.
KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "offset", "bool", "inf", "nan", "atan2", "sum", "min", "max", "avg", "group", "stddev",
    "stdvar", "count", "count_values", "bottomk", "topk", "quantile",
}


def collect(dashboard):
    """Returns [(where, query, is_template)] for every expr and template-variable query."""
    found = []

    def walk(node, where):
        if isinstance(node, dict):
            if isinstance(node.get("title"), str):
                where = node["title"]
            if isinstance(node.get("expr"), str):
                found.append((f"panel '{where}' ref {node.get('refId', '?')}", node["expr"], False))
            for key, value in node.items():
                if key != "templating":  # handled below: their queries are not all PromQL
                    walk(value, where)
        elif isinstance(node, list):
            for item in node:
                walk(item, where)

    walk(dashboard, "dashboard")
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue  # datasource, custom, interval, ...: no PromQL
        query = var.get("query")
        if isinstance(query, dict):
            query = query.get("query", "")
        query = (query or var.get("definition", "")).strip()
        where = f"variable '{var.get('name')}'"
        m = re.fullmatch(r"label_values\((.*),\s*(\w+)\s*\)", query, re.S)
        if m:
            found.append((where + " (label_values selector)", m.group(1), True))
        elif re.fullmatch(r"label_values\(\s*\w+\s*\)", query):
            print(f"  skipped {where}: {query} (no PromQL part)")
        elif m := re.fullmatch(r"query_result\((.*)\)", query, re.S):
            found.append((where + " (query_result)", m.group(1), True))
        else:
            found.append((where, query, True))
    return found


def substitute(expr, variables):
    """Replaces Grafana variables; returns (expr, [errors])."""
    errors = []

    def repl(m):
        name = m.group(1) or m.group(2) or m.group(3)
        if name in BUILTINS:
            return BUILTINS[name]
        if name in variables:
            return ".*"  # a regex any label value matches: dashboard variables go into =~ matchers
        errors.append(f"unknown variable ${name}")
        return m.group(0)

    return VAR_RE.sub(repl, expr), errors


def metric_names(expr):
    """Metric names in a PromQL expression (a small tokenizer; promtool has validated syntax)."""
    s = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`', '""', expr)  # strings
    if "__name__" in s:
        raise ValueError("uses __name__: name metrics directly so this check can see them")
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)  # ranges and subqueries
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", s)
    names = []
    for m in re.finditer(r"(?P<num>\d[\d.]*(?:[eE][+-]?\d+)?\w*)|(?P<id>[A-Za-z_:][\w:]*)", s):
        if m.group("id") is None:
            continue
        word = m.group("id")
        followed_by_call = s[m.end():].lstrip().startswith("(")
        if not followed_by_call and word.lower() not in KEYWORDS:
            names.append(word)
    return names


def multi_var_with_equals(expr, multi_vars):
    """A multi-value variable in an = matcher breaks as soon as two values are picked."""
    return [v for v in multi_vars
            if re.search(r'!?=\s*"[^"]*(\$\{?' + v + r'\b|\[\[' + v + r')', expr)]


def promtool_check(promtool, items):
    """Writes items [(where, expr)] as recording rules; returns promtool's (rc, output)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "dashboard_rules.yml")
        with open(path, "w") as f:
            f.write("groups:\n  - name: attnserve_dashboard\n    rules:\n")
            for i, (where, expr) in enumerate(items):
                # json.dumps gives a double-quoted string that YAML reads the same way.
                f.write(f"      # {where}\n")
                f.write(f"      - record: attnserve_dashboard:query_{i}\n")
                f.write(f"        expr: {json.dumps(expr)}\n")
        run = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True)
        return run.returncode, (run.stdout + run.stderr).strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dashboard")
    parser.add_argument("--promtool", default="promtool")
    args = parser.parse_args()

    with open(args.dashboard) as f:
        dashboard = json.load(f)
    var_list = dashboard.get("templating", {}).get("list", [])
    variables = {v["name"] for v in var_list}
    multi_vars = [v["name"] for v in var_list if v.get("multi") or v.get("includeAll")]

    failures = []
    items = []
    used = set()
    from_variables = 0
    for where, raw, is_template in collect(dashboard):
        from_variables += is_template
        expr, errors = substitute(raw, variables)
        failures += [f"{where}: {e} in {raw!r}" for e in errors]
        failures += [f"{where}: multi-value ${v} used with = (use =~) in {raw!r}"
                     for v in multi_var_with_equals(raw, multi_vars)]
        try:
            names = metric_names(expr)
        except ValueError as e:
            failures.append(f"{where}: {e}")
            names = []
        if not names:
            failures.append(f"{where}: names no metric: {raw!r}")
        for name in names:
            used.add(name)
            if name not in KNOWN_METRICS:
                failures.append(f"{where}: metric {name!r} is not one attnserve exports")
        items.append((where, expr))

    if not items:
        failures.append("no queries found in the dashboard")
    rc, output = promtool_check(args.promtool, items)
    if rc != 0:
        failures.append("promtool check rules rejected the dashboard's queries:\n" + output)
        for where, expr in items:  # name the culprit(s)
            one_rc, one_out = promtool_check(args.promtool, [(where, expr)])
            if one_rc != 0:
                failures.append(f"{where}: does not parse: {expr!r}\n{one_out}")

    print(f"  {len(items)} queries ({from_variables} from variables); "
          f"promtool check rules rc={rc}; metrics used: {', '.join(sorted(used))}")
    unused = sorted(KNOWN_METRICS - used - {h + "_count" for h in HISTOGRAMS}
                    - {h + "_sum" for h in HISTOGRAMS})
    if unused:
        print(f"  (exported but not on the dashboard: {', '.join(unused)})")
    if failures:
        print("check_dashboard: FAILED", file=sys.stderr)
        for failure in failures:
            print("  - " + failure, file=sys.stderr)
        return 1
    print("check_dashboard: dashboard queries parse and use only exported metrics")
    return 0


if __name__ == "__main__":
    sys.exit(main())
