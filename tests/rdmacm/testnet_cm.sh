#!/usr/bin/env bash
# rdmacm.testnet_*: an unmodified rdma_cm program (rdmacm-utils, perftest -R) on softrdma's librdmacm.so.1
# and libibverbs.so.1 across two test hosts (network namespaces joined by a bridge, tests/e2e/testnet):
# the server in h1 (198.18.0.1, device sr_eth0), the client in h2. Both must exit 0 and the client's
# output must match PATTERN (grep -E). SERVER_IP in a command stands for 198.18.0.1.
#
#   testnet_cm.sh LIBDIR DROP PORT PATTERN SERVER-COMMAND... -- CLIENT-COMMAND...
#     DROP: the percentage of packets h2 drops (nftables), 0 for none
#
# PAIR_UDP=1: the server's port is a UDP one; PAIR_SERVER_STAYS=1: the server never ends by itself and is
# killed once the client is done (udpong's).
# Exits 77 (skip) without root, `ip netns`, nftables (when dropping) or the programs.
set -euo pipefail
LIBDIR=$(readlink -f "$1")
DROP=$2 PORT=$3 PATTERN=$4
shift 4
server=() client=()
while (($#)) && [[ $1 != -- ]]; do server+=("${1//SERVER_IP/198.18.0.1}"); shift; done
shift
for a in "$@"; do client+=("${a//SERVER_IP/198.18.0.1}"); done
E2E=$(cd "$(dirname "$0")/../e2e" && pwd)
TESTNET=$E2E/testnet
SKIP=77
source "$E2E/testnet_lib.sh"
if [[ $DROP != 0 ]]; then testnet_require nft; else testnet_require; fi
for p in "${server[0]}" "${client[0]}"; do
  command -v "$p" >/dev/null || { echo "SKIP: $p is not installed"; exit $SKIP; }
done

testnet_session cm
if [[ $DROP != 0 ]]; then "$TESTNET" drop h2 "$DROP"; fi
"$TESTNET" exec h1 env LD_LIBRARY_PATH="$LIBDIR" ${SOFTRDMA_PRELOAD:+LD_PRELOAD=$SOFTRDMA_PRELOAD} timeout 120 stdbuf -oL -eL "${server[@]}" >"$WORK/server" 2>&1 &
SERVER_PID=$!
if [[ ${PAIR_UDP:-0} == 1 ]]; then wait_bound_udp "$PORT" "$TESTNET" exec h1 || true
else wait_listening "$PORT" "$TESTNET" exec h1 || true; fi
client_rc=0
"$TESTNET" exec h2 env LD_LIBRARY_PATH="$LIBDIR" ${SOFTRDMA_PRELOAD:+LD_PRELOAD=$SOFTRDMA_PRELOAD} timeout 120 stdbuf -oL -eL "${client[@]}" >"$WORK/client" 2>&1 ||
  client_rc=$?
server_rc=0
if [[ ${PAIR_SERVER_STAYS:-0} == 1 ]]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" || true
else wait "$SERVER_PID" || server_rc=$?; fi
SERVER_PID=
echo "==== server (h1, 198.18.0.1, exit $server_rc): ${server[*]}"; tail -n 40 "$WORK/server"
echo "==== client (h2, 198.18.0.2, exit $client_rc): ${client[*]}"; tail -n 40 "$WORK/client"
[[ $server_rc == 0 && $client_rc == 0 ]] || { echo "FAIL (124: timed out)"; exit 1; }
grep -Eq "$PATTERN" "$WORK/client" || { echo "FAIL: the client's output does not match $PATTERN"; exit 1; }
