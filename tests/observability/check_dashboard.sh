#!/usr/bin/env bash
# Static checks of the operator files, no server needed:
#   1. promtool check config deploy/prometheus.yml
#   2. every query of deploy/grafana/attnserve.json parses as PromQL (via promtool check rules)
#      and names only metrics attnserve exports — see check_dashboard.py for how.
# Usage: check_dashboard.sh [REPO_ROOT]   (default: two levels above this script)
# Exits 0 on success, 1 on a failed check or without promtool (a missing install step must fail
# CI, not skip).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "${1:-$here/../..}" && pwd)
# Debian's interpreter on purpose: a virtualenv's python3 earlier on PATH is not what CI has.
python=${PYTHON:-/usr/bin/python3}
[ -x "$python" ] || python=$(command -v python3 || true)

if ! command -v promtool >/dev/null; then
  echo "check_dashboard: FAIL: promtool not found (deploy/install-deps.sh installs prometheus)" >&2
  exit 1
fi
[ -n "$python" ] || { echo "check_dashboard: python3 not found" >&2; exit 1; }

echo "check_dashboard: promtool check config deploy/prometheus.yml"
promtool check config "$root/deploy/prometheus.yml"

echo "check_dashboard: queries of deploy/grafana/attnserve.json"
"$python" "$here/check_dashboard.py" --promtool "$(command -v promtool)" \
  "$root/deploy/grafana/attnserve.json"
