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
  >"$WORK/client" 2>&1 &
CLIENT_PID=$!
server_rc=0
wait "$SERVER_PID" || server_rc=$?
SERVER_PID=
# The pingpongs end with a race that no RDMA stack can win under loss: the server exits as soon as its
# own iterations are done, and if the ACK of the client's last SEND was lost, the client's retransmission
# reaches no one. With retry_cnt 7, which the pingpongs set, the client then retries for ever (as it does
# on rxe, which also treats 7 as "no limit"). Recognised only when the server finished every iteration and
# the client, seconds later, is still there and still retransmitting (its own counters move): a client
# that hangs without retransmitting is a failure.
shutdown_race=
if [[ $DROP != 0 && $PROG == *_pingpong && $server_rc == 0 ]] && grep -q "iters in" "$WORK/server"; then
  for _ in $(seq 50); do kill -0 "$CLIENT_PID" 2>/dev/null || break; sleep 0.1; done
  pid=$(ip netns pids "$TESTNET_PREFIX-h2" 2>/dev/null | while read -r p; do
    [[ $(cat /proc/$p/comm 2>/dev/null) == "${PROG:0:15}" ]] && echo "$p"; done | head -1)
  if kill -0 "$CLIENT_PID" 2>/dev/null && [[ -n $pid ]]; then
    timeouts() { "$(dirname "$LIBDIR")/bin/softrdma" stats --pid "$1" sr_eth0 | awk '$1 == "retry_timeouts" {print $2}'; }
    t0=$(timeouts "$pid")
    sleep 1
    t1=$(timeouts "$pid")
    echo "client still running 5 s after the server's exit: local ACK timeouts ${t0:-?} -> ${t1:-?} in 1 s"
    if [[ -n $t0 && -n $t1 && $t1 -gt $t0 ]]; then shutdown_race=1; fi
    kill "$pid" 2>/dev/null || true
  fi
fi
wait "$CLIENT_PID" || client_rc=$?
echo "==== server (h1, 198.18.0.1, exit $server_rc)"; cat "$WORK/server"
echo "==== client (h2, 198.18.0.2, exit $client_rc)"; cat "$WORK/client"
if [[ -n $shutdown_race ]]; then
  echo "PASS: the server completed every iteration; the client was retransmitting its last SEND to the exited server (the pingpong's shutdown race, see the script)"
  exit 0
fi
[[ $server_rc == 0 && $client_rc == 0 ]] || { echo "FAIL (124: timed out)"; exit 1; }
case $PROG in
  ib_*) grep -A1 '#bytes' "$WORK/client" | tail -1 | grep -Eq '^ *[0-9]+ +[0-9]+ +[0-9.]+' ;;
  *) grep -q "iters in" "$WORK/client" && grep -q "iters in" "$WORK/server" ;;
esac
