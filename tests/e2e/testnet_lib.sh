# Sourced by the tests that run programs between two test hosts (tests/e2e/testnet): the session around
# them, written once. The caller sets TESTNET (the script's path) and SKIP (the skip exit code).

# wait_listening PORT [PREFIX...] (a server's port, checked in h1 with PREFIX "$TESTNET" exec h1)
source "$(dirname "${BASH_SOURCE[0]}")/../util/listening.sh"

# Skips (exit $SKIP) without root or `ip netns`, and without nftables when $1 is "nft".
testnet_require() {
  if [[ $(id -u) -ne 0 ]]; then echo "SKIP: network namespaces need root"; exit "$SKIP"; fi
  if ! ip netns list >/dev/null 2>&1; then echo "SKIP: ip netns is unavailable"; exit "$SKIP"; fi
  if [[ ${1:-} == nft ]] && ! command -v nft >/dev/null; then echo "SKIP: nftables (nft) is not installed"; exit "$SKIP"; fi
}

# testnet_session TAG: hosts h1 and h2 of this run, named TAG p PID (namespaces TAGpPID-h1, veth ends
# TAGpPIDv1: at most 15 characters, so keep TAG short). First removes the hosts of runs with this TAG
# that were killed before their trap ran (a ctest TIMEOUT kills with SIGKILL), i.e. whose PID is gone.
# Sets WORK (a scratch folder) and SERVER_PID; everything goes on exit.
testnet_session() {
  local tag=$1 ns prefix
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^${tag}p[0-9]+-(h[0-9]+|sw)$" || true); do
    prefix=${ns%-*}
    kill -0 "${prefix#"${tag}p"}" 2>/dev/null || TESTNET_PREFIX=$prefix "$TESTNET" down >/dev/null 2>&1 || true
  done
  export TESTNET_PREFIX=${tag}p$$
  WORK=$(mktemp -d "/tmp/testnet-$tag.XXXXXX")
  SERVER_PID=
  trap testnet_cleanup EXIT
  trap 'exit 1' INT TERM
  "$TESTNET" up 2
}

testnet_cleanup() {
  if [[ -n $SERVER_PID ]]; then kill "$SERVER_PID" 2>/dev/null || true; fi
  "$TESTNET" down >/dev/null 2>&1 || true
  rm -rf "$WORK"
}

# testnet_server CMD...: runs CMD in h1 with its output in $WORK/server.out and waits until it prints
# "listening on 0.0.0.0:PORT" (the demo and the soak do); sets SERVER_PID and PORT, or fails the test.
testnet_server() {
  "$TESTNET" exec h1 "$@" >"$WORK/server.out" 2>&1 &
  SERVER_PID=$!
  PORT=
  for _ in $(seq 100); do
    PORT=$(sed -n 's/^listening on 0\.0\.0\.0:\([0-9]*\)$/\1/p' "$WORK/server.out" 2>/dev/null || true)
    [[ -n $PORT ]] && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.05
  done
  cat "$WORK/server.out"
  echo "FAIL: the server printed no port"
  exit 1
}
