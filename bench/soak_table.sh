#!/usr/bin/env bash
# The reliability table: softrdma-soak between two test hosts (network namespaces, tests/e2e/testnet) under
# each fault kind at 0.1%, 1% and 5%: injected by softrdma itself in both processes (SOFTRDMA_FAULTS: drop,
# dup, reorder, delay, corrupt) or dropped by nftables in h2 (loss the stack does not know about). Prints
# one row per run: goodput, retransmitted packets, the worst completion delay, bytes verified and the
# errors that reached the application (the soak checks every byte and atomic result; must be 0).
#
#   bench/soak_table.sh [SECONDS per run (default 5)] [QPS (default 8)]
#
# Needs root (network namespaces) and nftables; run after scripts/build.sh.
set -euo pipefail
SECONDS_PER_RUN=${1:-5}
QPS=${2:-8}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SOAK=$ROOT/build/bin/softrdma-soak
E2E=$ROOT/tests/e2e
TESTNET=$E2E/testnet
SKIP=77
[[ -x $SOAK ]] || { echo "build first: scripts/build.sh"; exit 1; }
source "$E2E/testnet_lib.sh"
testnet_require nft
testnet_session stb
LIMIT=$((SECONDS_PER_RUN * 4 + 30))

field() { sed -n "s/.*[ :]$1=\([^ ]*\).*/\1/p" <<<"$2" | head -1; }

printf '%-8s %6s %14s %12s %14s %16s %7s\n' fault rate "goodput MiB/s" retransmits "worst compl ms" "bytes verified" errors
for kind in drop dup reorder delay corrupt nft-drop; do
  for rate in 0.001 0.01 0.05; do
    faults=""
    case $kind in
      nft-drop) "$TESTNET" drop h2 "$(awk "BEGIN {print $rate * 100}")" ;;
      delay) faults="delay=$rate:2ms,seed=7" ;;
      *) faults="$kind=$rate,seed=7" ;;
    esac
    testnet_server env SOFTRDMA_FAULTS="$faults" timeout "$LIMIT" "$SOAK" server -d sr_eth0
    rc=0
    out=$("$TESTNET" exec h2 env SOFTRDMA_FAULTS="$faults" timeout "$LIMIT" "$SOAK" client 198.18.0.1 "$PORT" \
      -d sr_eth0 --qps "$QPS" --seconds "$SECONDS_PER_RUN" --ops 1000000 2>&1) || rc=$?
    wait "$SERVER_PID" || rc=$((rc ? rc : 1))
    SERVER_PID=
    [[ $kind == nft-drop ]] && "$TESTNET" clear h2
    line=$(grep '^soak: ops=' <<<"$out" || true)
    if [[ -z $line ]]; then
      printf '%-8s %6s  FAILED (exit %s): %s\n' "$kind" "$rate" "$rc" "$(tail -1 <<<"$out")"
      continue
    fi
    printf '%-8s %6s %14s %12s %14s %16s %7s\n' "$kind" "$rate" "$(field goodput_MiBps "$line")" \
      "$(field retransmits "$line")" "$(field worst_completion_ms "$line")" "$(field bytes_verified "$line")" \
      "$(field errors "$line")$([[ $rc == 0 ]] || echo " (exit $rc)")"
  done
done
