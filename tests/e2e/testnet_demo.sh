#!/usr/bin/env bash
# e2e.testnet_*: the demo across a real (virtual) network: two test hosts in network namespaces joined by a
# bridge (tests/e2e/testnet, a copy of ../shared/tools/testnet), `softrdma-demo server -d sr_eth0` in h1
# (198.18.0.1) and the client in h2, every byte and atomic result verified by both sides.
#
#   testnet_demo.sh DEMO SCENARIO
#     mtu1500   default link MTU: path MTU 1024
#     mtu9000   jumbo frames (`testnet mtu 9000`): path MTU 4096
#     drop1     h2 drops 1% of the UDP and TCP packets it receives (nftables): READ responses and ACKs
#     drop5     the same at 5%
#
# Each run has its own TESTNET_PREFIX, so runs do not collide with each other or with other suites, and
# always tears its hosts down. Exits 77 (skip) without root, `ip netns` or nftables (drop scenarios).
# Environment: TESTNET_DEMO_TIMEOUT (seconds for the whole demo run), TESTNET_DEMO_ARGS (extra options
# for both sides, e.g. "--timeout 12").
set -euo pipefail
DEMO=$(readlink -f "$1")
SCENARIO=$2
HERE=$(cd "$(dirname "$0")" && pwd)
TESTNET=$HERE/testnet
SKIP=77

case $SCENARIO in
  mtu1500) CODE=m15 MTU= DROP= MAX=8m ATOMICS=1000 PATH_MTU=1024 LIMIT=60 ;;
  mtu9000) CODE=m90 MTU=9000 DROP= MAX=8m ATOMICS=1000 PATH_MTU=4096 LIMIT=60 ;;
  drop1) CODE=d1 MTU= DROP=1 MAX=1m ATOMICS=200 PATH_MTU=1024 LIMIT=90 ;;
  drop5) CODE=d5 MTU= DROP=5 MAX=256k ATOMICS=100 PATH_MTU=1024 LIMIT=90 ;;
  *) echo "usage: $0 DEMO mtu1500|mtu9000|drop1|drop5" >&2; exit 2 ;;
esac
LIMIT=${TESTNET_DEMO_TIMEOUT:-$LIMIT}
read -r -a EXTRA <<<"${TESTNET_DEMO_ARGS:-}"

source "$HERE/testnet_lib.sh"
testnet_require ${DROP:+nft}
testnet_session "e2$CODE"
if [[ -n $MTU ]]; then "$TESTNET" mtu "$MTU"; fi
if [[ -n $DROP ]]; then "$TESTNET" drop h2 "$DROP"; fi
if ! "$TESTNET" exec h1 "$(dirname "$DEMO")/softrdma" devices | grep -q "GID\[  1\]:.*198\.18\.0\.1"; then
  "$TESTNET" exec h1 "$(dirname "$DEMO")/softrdma" devices
  echo "FAIL: no device with GID 198.18.0.1 in h1"
  exit 1
fi

start=$(date +%s.%N)
testnet_server timeout "$LIMIT" "$DEMO" server -d sr_eth0 --max-size "$MAX" -v "${EXTRA[@]}"

client_rc=0
"$TESTNET" exec h2 timeout "$LIMIT" "$DEMO" client 198.18.0.1 "$PORT" -d sr_eth0 --max-size "$MAX" \
  --atomics "$ATOMICS" -v "${EXTRA[@]}" >"$WORK/client.out" 2>&1 || client_rc=$?
server_rc=0
wait "$SERVER_PID" || server_rc=$?
SERVER_PID=
end=$(date +%s.%N)

echo "==== client (h2, 198.18.0.2)"
cat "$WORK/client.out"
echo "==== server (h1, 198.18.0.1)"
cat "$WORK/server.out"
echo "==== h2's nftables drops"
"$TESTNET" exec h2 nft list ruleset 2>/dev/null | grep -E "drop|counter" || echo "(none)"
echo "==== UDP in each host's kernel (RcvbufErrors: datagrams dropped because a socket's buffer was full)"
for h in h1 h2; do
  echo "$h: $("$TESTNET" exec $h awk '/^Udp:/ {if (!n++) split($0, k); else for (i = 2; i <= NF; i++) printf "%s=%s ", k[i], $i}' /proc/net/snmp)"
done
secs=$(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.1f", b - a}')
echo "testnet_demo $SCENARIO: client rc=$client_rc, server rc=$server_rc, $secs s (limit $LIMIT s)"

fail=0
[[ $client_rc -eq 0 ]] || { echo "FAIL: the client exited with $client_rc (124: timed out)"; fail=1; }
[[ $server_rc -eq 0 ]] || { echo "FAIL: the server exited with $server_rc (124: timed out)"; fail=1; }
grep -q "client verified every byte and atomic result; server verified .*: all correct" "$WORK/client.out" ||
  { echo "FAIL: not everything was verified"; fail=1; }
grep -q "local QP 0x[0-9a-f]* -> remote QP 0x[0-9a-f]* at 198\.18\.0\.2, path MTU $PATH_MTU\$" "$WORK/client.out" ||
  { echo "FAIL: expected sr_eth0 at 198.18.0.2 with path MTU $PATH_MTU"; fail=1; }
exit $fail
