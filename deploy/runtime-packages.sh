#!/usr/bin/env bash
# Prints, one per line, the Debian packages owning the shared libraries that BINARY... load.
# The Dockerfile's run stage installs exactly these, so the image carries the runtime libraries of
# what was built and nothing of the build tool chain; the list follows the code without upkeep.
# Fails when a library belongs to no package (it would be missing at run time).
# Usage: deploy/runtime-packages.sh BINARY...
set -euo pipefail

# dpkg records a file under the path its package ships; with /lib a link to /usr/lib (merged
# /usr) ldd may name either, so ask for both.
owner() {
  local path=$1 alt
  case $path in
    /usr/*) alt=${path#/usr} ;;
    *) alt=/usr$path ;;
  esac
  dpkg-query -S "$path" 2>/dev/null || dpkg-query -S "$alt" 2>/dev/null ||
    dpkg-query -S "$(readlink -f "$path")" 2>/dev/null || {
    echo "runtime-packages: no Debian package owns $path" >&2
    return 1
  }
}

libraries=$(ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
[ -n "$libraries" ] || { echo "runtime-packages: ldd listed no libraries for $*" >&2; exit 1; }
for library in $libraries; do
  owner "$library"
done | cut -d: -f1 | sort -u
