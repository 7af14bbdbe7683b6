#!/usr/bin/env bash
# abi.testnet_*: an unmodified rdma-core program (an ibv_*_pingpong or a perftest) on softrdma's
# libibverbs.so.1 across two test hosts (network namespaces joined by a bridge, tests/e2e/testnet): the
# server in h1 (198.18.0.1), the client in h2, device sr_eth0, GID index 1.
#
#   testnet_verbs.sh LIBDIR DROP PROGRAM [OPTION...]
#     DROP: the percentage of packets h2 drops (nftables), 0 for none
#
# Exits 77 (skip) without root, `ip netns`, nftables (when dropping) or the program.
set -euo pipefail
LIBDIR=$(readlink -f "$1")
DROP=$2
PROG=$3
shift 3
E2E=$(cd "$(dirname "$0")/../e2e" && pwd)
TESTNET=$E2E/testnet
SKIP=77
source "$E2E/testnet_lib.sh"
if [[ $DROP != 0 ]]; then testnet_require nft; else testnet_require; fi
command -v "$PROG" >/dev/null || { echo "SKIP: $PROG is not installed"; exit $SKIP; }
case $PROG in
  ib_*) GIDOPT=-x ;;
  *) GIDOPT=-g ;;
esac

testnet_session ab
if [[ $DROP != 0 ]]; then "$TESTNET" drop h2 "$DROP"; fi
PORT=18515
"$TESTNET" exec h1 env LD_LIBRARY_PATH="$LIBDIR" ${SOFTRDMA_PRELOAD:+LD_PRELOAD=$SOFTRDMA_PRELOAD} timeout 120 "$PROG" -d sr_eth0 $GIDOPT 1 -p $PORT "$@" \
  >"$WORK/server" 2>&1 &
SERVER_PID=$!
wait_listening $PORT "$TESTNET" exec h1 || true
client_rc=0
"$TESTNET" exec h2 env LD_LIBRARY_PATH="$LIBDIR" ${SOFTRDMA_PRELOAD:+LD_PRELOAD=$SOFTRDMA_PRELOAD} timeout 120 "$PROG" -d sr_eth0 $GIDOPT 1 -p $PORT "$@" 198.18.0.1 \
  >"$WORK/client" 2>&1 || client_rc=$?
server_rc=0
wait "$SERVER_PID" || server_rc=$?
SERVER_PID=
echo "==== server (h1, 198.18.0.1, exit $server_rc)"; cat "$WORK/server"
echo "==== client (h2, 198.18.0.2, exit $client_rc)"; cat "$WORK/client"
[[ $server_rc == 0 && $client_rc == 0 ]] || { echo "FAIL (124: timed out)"; exit 1; }
case $PROG in
  ib_*) grep -A1 '#bytes' "$WORK/client" | tail -1 | grep -Eq '^ *[0-9]+ +[0-9]+ +[0-9.]+' ;;
  *) grep -q "iters in" "$WORK/client" && grep -q "iters in" "$WORK/server" ;;
esac
