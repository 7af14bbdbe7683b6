#!/bin/bash
# A client whose server does not answer learns it within the timeout it asked for (ucmatose and rping
# resolve their route with 2000 ms), from an unmodified rdmacm-utils program on softrdma's librdmacm:
#   refused: nobody listens on the port: REJECTED with the IB CM's reason 8 (invalid service ID), after
#            softrdma's grace of 1 s for a server about to listen (src/abi/rdmacm/cm.h, kRefusedGraceMs);
#   silent:  a listener that never answers (its accept queue is full, so the kernel drops the SYNs):
#            UNREACHABLE with -ETIMEDOUT (-110) after the 2 s.
# Usage: no_server.sh LIBDIR PORT refused|silent PROGRAM
set -u
. "$(dirname "$0")/../util/listening.sh"
libdir=$1 port=$2 mode=$3 prog=$4
command -v "$prog" >/dev/null || { echo "$prog not installed (rdmacm-utils)"; exit 77; }
export LD_LIBRARY_PATH=$libdir
[ -z "${SOFTRDMA_PRELOAD:-}" ] || export LD_PRELOAD=$SOFTRDMA_PRELOAD  # sanitizer runtime (tests/CMakeLists.txt)
hexport=$(printf '%04X' "$port")
if grep -qs ":$hexport [0-9A-F:]* 0A " /proc/net/tcp /proc/net/tcp6; then
  echo "port $port is in use"; exit 1
fi
helper=
if [ "$mode" = silent ]; then
  env -u LD_PRELOAD python3 - "$port" <<'PY' &
import socket, sys, time
port = int(sys.argv[1])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen(0)
fill = []  # two connections fill an accept queue of 0; later SYNs are dropped
for _ in range(2):
    c = socket.socket(); c.setblocking(False); c.connect_ex(("127.0.0.1", port)); fill.append(c)
time.sleep(20)
PY
  helper=$!
  trap 'kill $helper 2>/dev/null' EXIT
  wait_listening "$port"
  sleep 0.2
  expect='UNREACHABLE.*-110'
  min=1.5 max=5  # the 2 s, plus the program's start on a loaded machine
else
  expect='REJECTED.*error:? 8\b'
  min=0.9 max=3.5
fi
case $prog in
  ucmatose) cmd=(ucmatose -s 127.0.0.1 -p "$port") ;;
  rping) cmd=(rping -c -a 127.0.0.1 -p "$port" -v -C 1) ;;
esac
start=$(date +%s.%N)
out=$(timeout 20 "${cmd[@]}" 2>&1)
rc=$?
took=$(echo "$(date +%s.%N) - $start" | bc)
echo "$out"
echo "--- ${cmd[*]}: exit $rc after $took s (expected: $expect, in $min..$max s)"
[ "$rc" != 0 ] && [ "$rc" != 124 ] || { echo "the client did not fail as it must"; exit 1; }
echo "$out" | grep -Eq "$expect" || { echo "no $expect"; exit 1; }
(($(echo "$took >= $min && $took <= $max" | bc))) || { echo "not within $min..$max s"; exit 1; }
