#!/bin/bash
# Runs one of rdma-core's ibv_*_pingpong programs, unmodified, on softrdma's libibverbs.so.1: a server and
# a client on 127.0.0.1 (device sr_lo, RoCE v2 GID index 1). Usage: pingpong.sh LIBDIR PROGRAM PORT [OPTION...]
set -u
. "$(dirname "$0")/../util/listening.sh"
libdir=$1 prog=$2 port=$3
shift 3
command -v "$prog" >/dev/null || { echo "$prog not installed (ibverbs-utils)"; exit 77; }
export LD_LIBRARY_PATH=$libdir
# A sanitized build (tests/abi/CMakeLists.txt) names its runtime, which these programs must load first.
[ -z "${SOFTRDMA_PRELOAD:-}" ] || export LD_PRELOAD=$SOFTRDMA_PRELOAD
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

timeout 60 "$prog" -d sr_lo -g 1 -p "$port" "$@" >"$out/server" 2>&1 &
server=$!
wait_listening "$port"
timeout 60 "$prog" -d sr_lo -g 1 -p "$port" "$@" 127.0.0.1 >"$out/client" 2>&1
client_rc=$?
wait "$server"
server_rc=$?
echo "--- server (exit $server_rc)"; cat "$out/server"
echo "--- client (exit $client_rc)"; cat "$out/client"
[ "$server_rc" = 0 ] && [ "$client_rc" = 0 ] || exit 1
grep -q "iters in" "$out/server" && grep -q "iters in" "$out/client"
