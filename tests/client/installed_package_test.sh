#!/usr/bin/env bash
# The client library as a user gets it: installs the `client` component of BUILD_DIR into a
# temporary prefix, builds client/examples against it with find_package(attnserve_client), and
# runs the example against a live attnserve (127.0.0.1, ephemeral port).
# Usage: installed_package_test.sh BUILD_DIR SOURCE_DIR ATTNSERVE
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 BUILD_DIR SOURCE_DIR ATTNSERVE" >&2; exit 2; }
build=$1 source=$2 attnserve=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/attnserve-package.XXXXXX")
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill -KILL "$server_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "installed_package_test: FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$tmp/install" --component client >/dev/null
for file in include/attnserve/client/client.h lib/libattnserve_client.a \
  lib/cmake/attnserve_client/attnserve_clientConfig.cmake; do
  [ -f "$tmp/install/$file" ] || fail "not installed: $file"
done
cmake -S "$source/client/examples" -B "$tmp/example" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$tmp/install" >"$tmp/configure.log" 2>&1 ||
  { cat "$tmp/configure.log" >&2; fail "the example does not configure against the package"; }
cmake --build "$tmp/example" >"$tmp/build.log" 2>&1 ||
  { cat "$tmp/build.log" >&2; fail "the example does not build against the package"; }

"$attnserve" --grpc-address 127.0.0.1:0 --http-address "" --metrics-address "" >"$tmp/server.log" 2>&1 &
server_pid=$!
port=""
for _ in $(seq 300); do  # 30 s
  port=$(sed -n 's/.*attnserve listening on .*(port \([0-9]*\)).*/\1/p' "$tmp/server.log")
  [ -n "$port" ] && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$tmp/server.log" >&2; fail "attnserve exited"; }
  sleep 0.1
done
[ -n "$port" ] || fail "attnserve did not start within 30 s"
output=$(timeout 60 "$tmp/example/attend_example" "127.0.0.1:$port") ||
  { echo "$output" >&2; fail "attend_example failed"; }
echo "$output"
grep -q "unary: output \[8, 512\]" <<<"$output" || fail "unexpected output"
grep -q "stream: same answer: yes" <<<"$output" || fail "the stream's answer differs"
grep -q "decode: same answer as causal Attend: yes" <<<"$output" ||
  fail "the decoding session's answer differs"
kill -TERM "$server_pid"
wait "$server_pid" || fail "attnserve did not exit 0 after SIGTERM"
server_pid=""
echo "installed_package_test: OK"
