#!/usr/bin/env bash
# rdmacm.rcopy*: Debian's unmodified rcopy (rdmacm-utils, an rsockets program) copies a file of SIZE MiB of
# random bytes through softrdma's librdmacm.so.1 and libibverbs.so.1; the copy must equal the source (cmp).
# The server never ends by itself: it is killed once the client is done.
#
#   rcopy.sh LIBDIR PORT SIZE_MIB local     server and client on 127.0.0.1
#   rcopy.sh LIBDIR PORT SIZE_MIB testnet   server in test host h1 (198.18.0.1), client in h2 (root only)
set -uo pipefail
LIBDIR=$(readlink -f "$1")
PORT=$2 MIB=$3 WHERE=$4
SKIP=77
command -v rcopy >/dev/null || { echo "SKIP: rcopy (rdmacm-utils) is not installed"; exit $SKIP; }
if [[ $WHERE == testnet ]]; then
  E2E=$(cd "$(dirname "$0")/../e2e" && pwd)
  TESTNET=$E2E/testnet
  source "$E2E/testnet_lib.sh"
  testnet_require
  testnet_session rcp
  server_run=("$TESTNET" exec h1) client_run=("$TESTNET" exec h2) addr=198.18.0.1
else
  source "$(dirname "$0")/../util/listening.sh"
  WORK=$(mktemp -d) SERVER_PID=
  trap 'if [[ -n $SERVER_PID ]]; then kill "$SERVER_PID" 2>/dev/null; fi; rm -rf "$WORK"' EXIT
  server_run=() client_run=() addr=127.0.0.1
fi
head -c $((MIB << 20)) /dev/urandom >"$WORK/src"
pre=${SOFTRDMA_PRELOAD:+LD_PRELOAD=$SOFTRDMA_PRELOAD}  # the sanitizer runtime (tests/CMakeLists.txt)
"${server_run[@]}" env LD_LIBRARY_PATH="$LIBDIR" $pre timeout 60 stdbuf -oL rcopy -p "$PORT" >"$WORK/server" 2>&1 &
SERVER_PID=$!
if [[ $WHERE == testnet ]]; then wait_listening "$PORT" "$TESTNET" exec h1; else wait_listening "$PORT"; fi
start=$(date +%s.%N)
"${client_run[@]}" env LD_LIBRARY_PATH="$LIBDIR" $pre timeout 60 rcopy "$WORK/src" "$addr:$WORK/dst" -p "$PORT" >"$WORK/client" 2>&1
rc=$?
elapsed=$(echo "$(date +%s.%N) - $start" | bc)
kill "$SERVER_PID" 2>/dev/null
wait "$SERVER_PID" 2>/dev/null
SERVER_PID=
echo "--- server"; cat "$WORK/server"; echo
echo "--- client (exit $rc, $elapsed s)"; cat "$WORK/client"
[[ $rc == 0 ]] || { echo "FAIL: rcopy exited $rc"; exit 1; }
cmp "$WORK/src" "$WORK/dst" || { echo "FAIL: the copy differs"; exit 1; }
grep -Eq "^$((MIB << 20)) bytes in" "$WORK/client" || { echo "FAIL: no figures from the client"; exit 1; }
echo "OK: $MIB MiB copied and equal"
