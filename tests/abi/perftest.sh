#!/bin/bash
# Runs one perftest program, unmodified, on softrdma's libibverbs.so.1 (its libmlx5/libefa dependencies
# load against it too): server and client on 127.0.0.1, device sr_lo, GID index 1. Both must exit 0 and
# the client must report figures. Usage: perftest.sh LIBDIR PROGRAM PORT [OPTION...]
set -u
. "$(dirname "$0")/../util/listening.sh"
libdir=$1 prog=$2 port=$3
shift 3
command -v "$prog" >/dev/null || { echo "$prog not installed (perftest)"; exit 77; }
export LD_LIBRARY_PATH=$libdir
# A sanitized build (tests/abi/CMakeLists.txt) names its runtime, which these programs must load first.
[ -z "${SOFTRDMA_PRELOAD:-}" ] || export LD_PRELOAD=$SOFTRDMA_PRELOAD
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

timeout 90 stdbuf -oL -eL "$prog" -d sr_lo -x 1 -p "$port" "$@" >"$out/server" 2>&1 &
server=$!
wait_listening "$port"
timeout 90 stdbuf -oL -eL "$prog" -d sr_lo -x 1 -p "$port" "$@" 127.0.0.1 >"$out/client" 2>&1
client_rc=$?
wait "$server"
server_rc=$?
echo "--- server (exit $server_rc)"; cat "$out/server"
echo "--- client (exit $client_rc)"; cat "$out/client"
if [ "$server_rc" != 0 ] || [ "$client_rc" != 0 ]; then
  # For the diagnosis: the device's loss and drop counters (cumulative, other tests' included).
  echo "--- softrdma stats sr_lo (non-zero drops and retransmissions)"
  "$libdir/../bin/softrdma" stats sr_lo | grep -E 'drop|retrans|timeout' | grep -Ev ' 0 '
  exit 1
fi
# The figures: a line of numbers after the "#bytes" header.
grep -A1 '#bytes' "$out/client" | tail -1 | grep -Eq '^ *[0-9]+ +[0-9]+ +[0-9.]+'
