#!/bin/sh
# floor-bench's streams in a mode other than its default: splice (the zero-copy stream, README "Ways to
# speed measured and not kept"; the datagrams it builds by vmsplice and splice) or pieces (three pieces a
# packet, "One piece per message"): they must reach the server.
# usage: check_stream_splice.sh FLOOR_BENCH [splice|pieces]
set -u
fb=$1
mode=${2:-splice}
port=$(( 40000 + $$ % 20000 ))
"$fb" udp-stream-server "$port" >/dev/null &
server=$!
out=$("$fb" udp-stream-client "$port" 1048576 0.3 "$mode")
rc=$?
if [ "$rc" -ne 0 ]; then kill "$server" 2>/dev/null; fi  # it waits for the client's end otherwise
wait "$server"
echo "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: the client exited $rc"; exit 1; }
pct=$(echo "$out" | sed -n 's/.*received_pct=\([0-9.]*\).*/\1/p')
gbps=$(echo "$out" | sed -n 's/.*gbps=\([0-9.]*\).*/\1/p')
[ -n "$pct" ] && [ -n "$gbps" ] || { echo "FAIL: no figures"; exit 1; }
# What the server counted is what was sent (a loss of a few datagrams to a full buffer is tolerated).
awk -v p="$pct" -v g="$gbps" 'BEGIN { exit !(p > 90 && p <= 100 && g > 0) }' ||
  { echo "FAIL: received $pct% at $gbps GB/s"; exit 1; }
