#!/bin/bash
# Runs an rdma_cm server and its client, unmodified programs (rdmacm-utils, perftest), on softrdma's
# librdmacm.so.1 and libibverbs.so.1 through LD_LIBRARY_PATH, on 127.0.0.1. The client starts once the
# server listens on its TCP port (softrdma's rdma_listen is a TCP listener on the rdma_cm port). Both must
# exit 0 within their timeout and the client's output must match PATTERN (grep -E). With PAIR_SERVER_STAYS=1
# the server is one that never ends by itself (cmtime's): it is killed once the client is done. With
# PAIR_UDP=1 the server's port is a UDP one (udpong's datagram rsockets).
# Usage: pair.sh LIBDIR PORT PATTERN SERVER-COMMAND... -- CLIENT-COMMAND...
set -u
. "$(dirname "$0")/../util/listening.sh"
libdir=$1 port=$2 pattern=$3
shift 3
server=() client=()
while (($#)) && [ "$1" != "--" ]; do server+=("$1"); shift; done
shift
client=("$@")
for p in "${server[0]}" "${client[0]}"; do
  command -v "$p" >/dev/null || { echo "$p not installed (rdmacm-utils, perftest)"; exit 77; }
done
export LD_LIBRARY_PATH=$libdir
[ -z "${SOFTRDMA_PRELOAD:-}" ] || export LD_PRELOAD=$SOFTRDMA_PRELOAD  # sanitizer runtime (tests/CMakeLists.txt)
limit=${PAIR_TIMEOUT:-60}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

timeout "$limit" stdbuf -oL -eL "${server[@]}" >"$out/server" 2>&1 &
pid=$!
if [ "${PAIR_UDP:-0}" = 1 ]; then wait_bound_udp "$port"; else wait_listening "$port"; fi
start=$(date +%s.%N)
timeout "$limit" stdbuf -oL -eL "${client[@]}" >"$out/client" 2>&1
client_rc=$?
if [ "${PAIR_SERVER_STAYS:-0}" = 1 ] && kill -0 "$pid" 2>/dev/null; then
  kill "$pid"
  wait "$pid"
  server_rc=0
else
  wait "$pid"
  server_rc=$?
fi
echo "--- server: ${server[*]} (exit $server_rc)"; tail -n 40 "$out/server"
echo "--- client: ${client[*]} (exit $client_rc, $(echo "$(date +%s.%N) - $start" | bc) s)"; tail -n 40 "$out/client"
[ "$server_rc" = 0 ] && [ "$client_rc" = 0 ] || exit 1
grep -Eq "$pattern" "$out/client" || { echo "client output does not match: $pattern"; exit 1; }
