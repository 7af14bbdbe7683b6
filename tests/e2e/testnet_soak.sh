#!/usr/bin/env bash
# e2e.soak_testnet_*: softrdma-soak between two test hosts (network namespaces, tests/e2e/testnet):
# `softrdma-soak server -d sr_eth0` in h1 (198.18.0.1), the client in h2, with h2 dropping PCT percent of
# the UDP and TCP packets it receives (nftables: loss the stack does not know about). Every byte and atomic
# result is verified by the soak itself; this script checks that it says PASS and that the loss was real.
#
#   testnet_soak.sh SOAK PCT [SOAK OPTIONS...]
#
# Its own TESTNET_PREFIX (e2s<PCT>p<PID>), hosts always torn down. Exits 77 (skip) without root, `ip netns`
# or nftables.
set -euo pipefail
SOAK=$(readlink -f "$1")
PCT=$2
shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
TESTNET=$HERE/testnet
SKIP=77
LIMIT=${TESTNET_SOAK_TIMEOUT:-60}

source "$HERE/testnet_lib.sh"
testnet_require nft
testnet_session "e2s$PCT"
"$TESTNET" drop h2 "$PCT"

testnet_server timeout "$LIMIT" "$SOAK" server -d sr_eth0

client_rc=0
"$TESTNET" exec h2 timeout "$LIMIT" "$SOAK" client 198.18.0.1 "$PORT" -d sr_eth0 -v "$@" >"$WORK/client.out" 2>&1 ||
  client_rc=$?
server_rc=0
wait "$SERVER_PID" || server_rc=$?
SERVER_PID=

echo "==== client (h2, 198.18.0.2)"
cat "$WORK/client.out"
echo "==== server (h1, 198.18.0.1)"
cat "$WORK/server.out"
echo "==== h2's nftables drops"
drops=$("$TESTNET" exec h2 nft list ruleset 2>/dev/null | sed -n 's/.*counter packets \([0-9]*\).*drop.*/\1/p' | head -1)
echo "packets dropped by nftables in h2: ${drops:-?}"

fail=0
[[ $client_rc -eq 0 ]] || { echo "FAIL: the client exited with $client_rc (124: timed out)"; fail=1; }
[[ $server_rc -eq 0 ]] || { echo "FAIL: the server exited with $server_rc (124: timed out)"; fail=1; }
grep -q "^soak: PASS" "$WORK/client.out" || { echo "FAIL: the soak did not pass"; fail=1; }
grep -q "^softrdma-soak: sr_eth0 at 198\.18\.0\.2" "$WORK/client.out" || { echo "FAIL: not on sr_eth0 in h2"; fail=1; }
# The loss must have happened and been repaired: nftables dropped packets and the stack retransmitted.
[[ ${drops:-0} -gt 0 ]] || { echo "FAIL: nftables dropped nothing"; fail=1; }
grep -Eq "retransmits=[1-9]" "$WORK/client.out" || { echo "FAIL: no retransmission under loss"; fail=1; }
exit $fail
