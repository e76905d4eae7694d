#!/usr/bin/python3
"""The metrics reference (docs/OBSERVABILITY.md, the table under "## Metrics") against a live
attnserve's /metrics, so neither can drift from the other.

Starts the server on 127.0.0.1 (ephemeral ports, the demo model), sends one Attend call and one
decoding session with attnserve-cli so that the per-model and decoding series exist, reads
/metrics and checks: every family exposed has a row; every row names families that are exposed;
a row that names one family gives its type, and its labels are exactly the labels its series
carry (`le` of histogram buckets aside).

  check_metrics_reference.py --attnserve BIN --cli CLI [--root REPO]
"""
import argparse
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

DOC = "docs/OBSERVABILITY.md"
TIMEOUT_S = 60


def doc_rows(text):
    """[(names, type, labels)] of the first table after a "## Metrics" heading."""
    section = re.split(r"^## Metrics\b.*$", text, maxsplit=1, flags=re.M)
    if len(section) != 2:
        sys.exit(f"check_metrics_reference: FAIL: {DOC} has no '## Metrics' section")
    rows, started = [], False
    for line in section[1].splitlines():
        if not line.startswith("|"):
            if started:
                break
            continue
        started = True
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        names = re.findall(r"`([a-z_:][a-z0-9_:]*)`", cells[0])
        if not names or len(cells) < 3:
            continue  # the header and its rule
        rows.append((names, cells[1], set(re.findall(r"`([a-z_][a-z0-9_]*)`", cells[2]))))
    return rows


def exposed_families(text):
    """{family: (type, label names seen on its series)} from the exposition text."""
    families = {}
    for line in text.splitlines():
        match = re.match(r"# TYPE (\S+) (\S+)", line)
        if match:
            families[match[1]] = (match[2], set())
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s", line)
        if match is None:
            continue
        name = match[1]
        family = name if name in families else re.sub(r"_(bucket|sum|count)$", "", name)
        if family in families:
            labels = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', match[2] or "")) - {"le",
                                                                                      "quantile"}
            families[family][1].update(labels)
    return families


def start_server(binary, work):
    log = open(os.path.join(work, "server.log"), "w+")
    server = subprocess.Popen(
        [binary, "--grpc-address", "127.0.0.1:0", "--http-address", "", "--metrics-address",
         "127.0.0.1:0", "--model-repository", os.path.join(work, "no-models")],
        stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        log.seek(0)
        text = log.read()
        grpc = re.search(r"listening on 127\.0\.0\.1:(\d+)", text)
        metrics = re.search(r"metrics at http://127\.0\.0\.1:(\d+)/metrics", text)
        if grpc and metrics and "threads:" in text:
            return server, int(grpc[1]), int(metrics[1])
        if server.poll() is not None:
            break
        time.sleep(0.1)
    server.kill()
    log.seek(0)
    sys.exit(f"check_metrics_reference: FAIL: attnserve did not start:\n{log.read()[-2000:]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attnserve", required=True)
    parser.add_argument("--cli", required=True)
    parser.add_argument("--root", type=pathlib.Path,
                        default=pathlib.Path(__file__).resolve().parents[2])
    args = parser.parse_args()
    rows = doc_rows((args.root / DOC).read_text())
    with tempfile.TemporaryDirectory() as work:
        server, port, metrics_port = start_server(args.attnserve, work)
        try:
            target = ["--target", f"127.0.0.1:{port}", "--timeout-s", "30"]
            for command in (["attend", "--model", "demo", "--random", "4"],
                            ["decode", "--model", "demo", "--prompt-rows", "4", "--steps", "2"]):
                subprocess.run([args.cli, *target, *command], check=True, timeout=TIMEOUT_S,
                               stdout=subprocess.DEVNULL)
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with opener.open(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as answer:
                exposed = exposed_families(answer.read().decode())
        finally:
            server.terminate()
            server.wait(timeout=TIMEOUT_S)

    failures, documented = [], set()
    for names, kind, labels in rows:
        documented.update(names)
        for name in names:
            if name not in exposed:
                failures.append(f"{DOC}: `{name}` has a row but /metrics has no such family")
        if len(names) != 1 or names[0] not in exposed:
            continue
        exposed_kind, exposed_labels = exposed[names[0]]
        if kind != exposed_kind:
            failures.append(f"{DOC}: `{names[0]}`: type {kind!r}, /metrics says {exposed_kind!r}")
        if labels != exposed_labels:
            failures.append(f"{DOC}: `{names[0]}`: labels {sorted(labels)}, its series carry "
                            f"{sorted(exposed_labels)}")
    for name in sorted(set(exposed) - documented):
        failures.append(f"{DOC}: no row for `{name}` ({exposed[name][0]}), which /metrics exposes")
    for failure in failures:
        print(f"FAIL: {failure}")
    print(f"check_metrics_reference: {len(exposed)} families exposed, {len(documented)} "
          f"documented, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
