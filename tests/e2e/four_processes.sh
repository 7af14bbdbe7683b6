#!/usr/bin/env bash
# e2e.four_processes_one_device: two demo pairs at once on sr_lo, four processes, each with its own UDP
# socket on 127.0.0.1 (no daemon, no shared socket): pair A is `softrdma-demo` (it forks its server), pair B
# is `softrdma-demo server` and `softrdma-demo client 127.0.0.1 PORT`. Both pairs must verify everything.
#
#   four_processes.sh DEMO [DEMO OPTIONS...]
set -uo pipefail
DEMO=$1
shift
OPTS=("$@")
WORK=$(mktemp -d /tmp/e2e-four.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# Pair B's server first: it prints its port.
timeout 100 "$DEMO" server "${OPTS[@]}" >"$WORK/b-server.out" 2>&1 &
BSERVER=$!
PIDS+=("$BSERVER")
port=
for _ in $(seq 100); do
  port=$(sed -n 's/^listening on 0\.0\.0\.0:\([0-9]*\)$/\1/p' "$WORK/b-server.out" 2>/dev/null || true)
  [[ -n $port ]] && break
  sleep 0.05
done
if [[ -z $port ]]; then cat "$WORK/b-server.out"; echo "FAIL: pair B's server printed no port"; exit 1; fi

start=$(date +%s.%N)
timeout 100 "$DEMO" "${OPTS[@]}" >"$WORK/a.out" 2>&1 &
A=$!
PIDS+=("$A")
timeout 100 "$DEMO" client 127.0.0.1 "$port" "${OPTS[@]}" >"$WORK/b-client.out" 2>&1 &
BCLIENT=$!
PIDS+=("$BCLIENT")

wait "$A"; rc_a=$?
wait "$BCLIENT"; rc_bc=$?
wait "$BSERVER"; rc_bs=$?
end=$(date +%s.%N)

for f in a b-client b-server; do
  echo "==== $f"
  cat "$WORK/$f.out"
done
fail=0
qpns=$(sed -n 's/.*local QP 0x\([0-9a-f]*\) -> remote QP 0x\([0-9a-f]*\).*/\1 \2/p' "$WORK/a.out" "$WORK/b-client.out" | tr ' ' '\n' | sort -u | wc -l)
echo "four_processes: pair A rc=$rc_a, pair B client rc=$rc_bc server rc=$rc_bs, $qpns distinct QPNs, $(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.1f", b - a}') s"
[[ $rc_a -eq 0 && $rc_bc -eq 0 && $rc_bs -eq 0 ]] || { echo "FAIL: a demo process failed"; fail=1; }
for f in a b-client; do
  grep -q "client verified every byte and atomic result; server verified .*: all correct" "$WORK/$f.out" ||
    { echo "FAIL: $f did not verify everything"; fail=1; }
done
[[ $qpns -eq 4 ]] || { echo "FAIL: expected 4 distinct QP numbers (4 processes), saw $qpns"; fail=1; }
exit $fail
