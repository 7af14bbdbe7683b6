#!/usr/bin/env bash
# e2e.testnet_standard_port: softrdma at RoCEv2's standard port (SOFTRDMA_STANDARD_PORT=1), where kernel
# Soft-RoCE and RoCE NICs send, between two test hosts (tests/e2e/testnet: h1 198.18.0.1, h2 198.18.0.2,
# the addresses of ../shared/reference/rxe-linux-6.1.pcap).
#  1. rxe's own packets arrive: `ibv_rc_pingpong` on softrdma's libibverbs waits in h1 at 198.18.0.1:4791,
#     and h2 sends it the capture's 128 packets from rxe at 198.18.0.2 to 198.18.0.1 byte for byte (IPv4
#     IDs 0x06da.. as rxe numbered them, UDP checksum 0) on a raw socket: each passes the ICRC check (the
#     server's rx_packets count them; drop_bad_icrc stays 0), then one with a bit flipped is dropped as a
#     bad ICRC. (They belong to no QP of the server's, which drops them after the check.)
#  2. The ping-pong itself, both sides at UDP 4791 by SOFTRDMA_STANDARD_PORT=1.
#
#   testnet_standard_port.sh LIBDIR CLI PCAP
# Exits 77 (skip) without root, `ip netns`, ibverbs-utils or scapy.
set -euo pipefail
LIBDIR=$(readlink -f "$1")
CLI=$(readlink -f "$2")
PCAP=$(readlink -f "$3")
HERE=$(cd "$(dirname "$0")" && pwd)
TESTNET=$HERE/testnet
SKIP=77
source "$HERE/testnet_lib.sh"
testnet_require
command -v ibv_rc_pingpong >/dev/null || { echo "SKIP: ibverbs-utils is not installed"; exit $SKIP; }
/usr/bin/python3 -c "import scapy.all" 2>/dev/null || { echo "SKIP: python3-scapy is not installed"; exit $SKIP; }
testnet_session stp
ENVS=(env LD_LIBRARY_PATH="$LIBDIR" SOFTRDMA_STANDARD_PORT=1 ${SOFTRDMA_PRELOAD:+LD_PRELOAD=$SOFTRDMA_PRELOAD})
TCP_PORT=18611
PP=(ibv_rc_pingpong -d sr_eth0 -g 1 -p "$TCP_PORT" -n 20)

# counter NAME: the server's counter (softrdma stats --pid).
counter() {
  "$CLI" stats --pid "$PP_PID" sr_eth0 | awk -v c="$1" '$1 == c {print $2}'
}
# wait_rx N: until the server's rx_packets grew by N since $before (5 s at most).
wait_rx() {
  for _ in $(seq 100); do
    (( $(counter rx_packets) - before >= $1 )) && return 0
    sleep 0.05
  done
}

"$TESTNET" exec h1 timeout 60 "${ENVS[@]}" "${PP[@]}" >"$WORK/server.out" 2>&1 &
SERVER_PID=$!
# The QP binds UDP 4791 before the server waits for its client on TCP.
if ! wait_bound_udp 4791 "$TESTNET" exec h1; then
  cat "$WORK/server.out"; echo "FAIL: nothing bound UDP 4791 in h1"; exit 1
fi
wait_listening "$TCP_PORT" "$TESTNET" exec h1 || { cat "$WORK/server.out"; echo "FAIL: no TCP listener"; exit 1; }
PP_PID=$(pgrep -n -f "^ibv_rc_pingpong -d sr_eth0 -g 1 -p $TCP_PORT")
before=$(counter rx_packets)
bad_before=$(counter drop_bad_icrc)

"$TESTNET" exec h2 /usr/bin/python3 "$HERE/rxe_replay.py" "$PCAP" 198.18.0.2 198.18.0.1 | tee "$WORK/replay.out"
sent=$(sed -n 's/^sent \([0-9]*\) packets.*/\1/p' "$WORK/replay.out")
fail=0
wait_rx "$sent"
got=$(( $(counter rx_packets) - before ))
bad=$(( $(counter drop_bad_icrc) - bad_before ))
echo "rxe's packets: sent $sent, passed the ICRC check $got, dropped as bad ICRC $bad"
[[ $got -eq $sent && $bad -eq 0 ]] || { echo "FAIL: every one of rxe's packets must pass the ICRC check"; fail=1; }

"$TESTNET" exec h2 /usr/bin/python3 "$HERE/rxe_replay.py" "$PCAP" 198.18.0.2 198.18.0.1 --corrupt 7 >/dev/null
wait_rx $((2 * sent - 1))
got2=$(( $(counter rx_packets) - before - got ))
bad=$(( $(counter drop_bad_icrc) - bad_before ))
echo "again with one bit flipped in one: passed $got2, dropped as bad ICRC $bad"
[[ $got2 -eq $((sent - 1)) && $bad -eq 1 ]] || { echo "FAIL: the flipped packet alone must be dropped"; fail=1; }

client_rc=0
"$TESTNET" exec h2 timeout 30 "${ENVS[@]}" "${PP[@]}" 198.18.0.1 >"$WORK/client.out" 2>&1 || client_rc=$?
server_rc=0
wait "$SERVER_PID" || server_rc=$?
SERVER_PID=
echo "==== server (h1)"; cat "$WORK/server.out"
echo "==== client (h2)"; cat "$WORK/client.out"
[[ $client_rc -eq 0 && $server_rc -eq 0 ]] || { echo "FAIL: ping-pong exit codes $server_rc/$client_rc"; fail=1; }
grep -q "20 iters" "$WORK/client.out" || { echo "FAIL: the ping-pong did not finish"; fail=1; }
exit $fail
