#!/bin/bash
# A server killed with SIGKILL in the middle of a connection: its TCP connection closes with the process,
# and the client (rping, unmodified, on softrdma's librdmacm) gets DISCONNECTED and ends within seconds
# instead of hanging. Usage: server_killed.sh LIBDIR PORT
set -u
. "$(dirname "$0")/../util/listening.sh"
libdir=$1 port=$2
command -v rping >/dev/null || { echo "rping not installed (rdmacm-utils)"; exit 77; }
export LD_LIBRARY_PATH=$libdir
[ -z "${SOFTRDMA_PRELOAD:-}" ] || export LD_PRELOAD=$SOFTRDMA_PRELOAD  # sanitizer runtime (tests/CMakeLists.txt)
out=$(mktemp -d)
trap 'rm -rf "$out"; kill -9 $server $client 2>/dev/null' EXIT
hexport=$(printf '%04X' "$port")

rping -s -a 127.0.0.1 -p "$port" -C 100000000 >"$out/server" 2>&1 &
server=$!
wait_listening "$port"
timeout 60 stdbuf -oL -eL rping -c -a 127.0.0.1 -p "$port" -C 100000000 >"$out/client" 2>&1 &
client=$!
# Connected when the client's TCP connection to the port is established (state 01); then let it ping.
for _ in $(seq 200); do
  grep -qs "[0-9A-F]*:[0-9A-F]* [0-9A-F]*:$hexport 01 " /proc/net/tcp && break
  sleep 0.05
done
sleep 1
kill -0 "$client" 2>/dev/null || { echo "the client ended before the kill"; cat "$out/client"; exit 1; }
kill -9 "$server"
wait "$server" 2>/dev/null
start=$(date +%s.%N)
for _ in $(seq 100); do
  kill -0 "$client" 2>/dev/null || break
  sleep 0.1
done
took=$(echo "$(date +%s.%N) - $start" | bc)
if kill -0 "$client" 2>/dev/null; then
  echo "the client still runs $took s after its server was killed"; cat "$out/client"; exit 1
fi
wait "$client"
echo "--- client (exit $?) ended $took s after the server's SIGKILL"; cat "$out/client"
grep -q "DISCONNECT EVENT" "$out/client" || { echo "no DISCONNECTED event"; exit 1; }
