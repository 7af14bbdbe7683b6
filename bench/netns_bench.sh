#!/usr/bin/env bash
# softrdma between two hosts, as near as one machine comes: two network namespaces joined by a bridge
# (tests/e2e/testnet; MTU 9000 on both ends of each link, so path MTU 4096; --mtu sets another, 1500:
# path MTU 1024, as between most hosts), perftest's server in h1
# (198.18.0.1) and its client in h2 on device sr_eth0, each case run with the default backend (the
# same-host path on, as users run it; between hosts it finds no ring and sends over UDP) and with
# SOFTRDMA_SHM=0 (the socket path that bench/run.py's socket-path targets read on loopback), the two one
# after the other in each round; and, where qperf is installed, qperf tcp_bw of 1 MiB messages between the
# same hosts (TCP, the peer the socket-path bandwidth target reads on loopback).
#
#   bench/netns_bench.sh [--runs N] [--quick] [--mtu MTU] [--build DIR]
#
# Prints per case and backend the median [min-max] of the runs: latency in microseconds (perftest's
# typical and average; ib_write_lat and ib_send_lat half a round trip, ib_read_lat a whole one), 8-byte
# ib_write_bw in million messages a second, 1 MiB ib_write_bw in MiB/s, and the default's median over
# SOFTRDMA_SHM=0's (and SOFTRDMA_SHM=0's 1 MiB over qperf's). --quick: one short run each. Needs root and
# `ip netns` (exit 77 otherwise).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
BUILD=$ROOT/build
RUNS=3
QUICK=
MTU=9000
while [[ $# -gt 0 ]]; do
  case $1 in
    --runs) RUNS=$2; shift 2 ;;
    --quick) QUICK=1; RUNS=1; shift ;;
    --mtu) MTU=$2; shift 2 ;;
    --build) BUILD=$(readlink -f "$2"); shift 2 ;;
    *) sed -n '2,17p' "$0"; exit 2 ;;
  esac
done
LIBDIR=$BUILD/lib
[[ -e $LIBDIR/libibverbs.so.1 ]] || { echo "no $LIBDIR/libibverbs.so.1: run scripts/build.sh first"; exit 1; }
for p in ib_write_lat ib_send_lat ib_read_lat ib_write_bw; do
  command -v $p >/dev/null || { echo "SKIP: $p is not installed (Debian package perftest)"; exit 77; }
done
TESTNET=$ROOT/tests/e2e/testnet
SKIP=77  # testnet_require exits with it
source "$ROOT/tests/e2e/testnet_lib.sh"
testnet_require
testnet_session nb >/dev/null
"$TESTNET" mtu "$MTU"
# The path MTU softrdma takes: the largest IBTA MTU within the link's less 80 bytes of headers (IPv6, UDP,
# BTH, extension headers, ICRC: io/netif.h kRoceHeaderRoom, as rxe): 1024 at 1500, 4096 at 9000.
PMTU=256
for m in 512 1024 2048 4096; do
  if ((MTU - 80 >= m)); then PMTU=$m; fi
done

if [[ -n $QUICK ]]; then LAT=2000 MSGS=50000 BIG=100; else LAT=20000 MSGS=1000000 BIG=2000; fi
# name | program and options | the kind of figure
CASES=(
  "ib_write_lat 8 B|ib_write_lat -s 8 -n $LAT|lat"
  "ib_send_lat 8 B|ib_send_lat -s 8 -n $LAT|lat"
  "ib_read_lat 8 B (full)|ib_read_lat -s 8 -n $LAT|lat"
  "ib_write_bw 8 B|ib_write_bw -s 8 -n $MSGS -N|rate"
  "ib_write_bw 1 MiB|ib_write_bw -s 1048576 -n $BIG -N|bw"
)
# run PORT SHM KIND ARGS...: one run between the hosts (in a subshell); prints its figures (lat: typical
# and average; rate: M/s; bw: MiB/s)
run() {
  local port=$1 shm=$2 kind=$3
  shift 3
  "$TESTNET" exec h1 env LD_LIBRARY_PATH="$LIBDIR" SOFTRDMA_SHM="$shm" timeout 120 "$@" -d sr_eth0 -x 1 \
    -p "$port" >"$WORK/server" 2>&1 &
  SERVER_PID=$!
  wait_listening "$port" "$TESTNET" exec h1 || true
  local rc=0
  "$TESTNET" exec h2 env LD_LIBRARY_PATH="$LIBDIR" SOFTRDMA_SHM="$shm" timeout 120 "$@" -d sr_eth0 -x 1 \
    -p "$port" 198.18.0.1 >"$WORK/client" 2>&1 || rc=$?
  wait "$SERVER_PID" || rc=$((rc ? rc : $?))
  SERVER_PID=
  if [[ $rc -ne 0 ]]; then
    echo "FAIL: $* (SOFTRDMA_SHM=$shm) exited with $rc" >&2
    tail -5 "$WORK/client" >&2
    return 1
  fi
  # perftest: #bytes #iterations t_min t_max t_typical t_avg ... / #bytes #iterations BW-peak BW-average MsgRate
  awk -v k="$kind" '/#bytes/ {getline; if (k == "lat") print $5, $6; else if (k == "rate") print $5; else print $4}' \
    "$WORK/client"
}

: >"$WORK/results"
PORT=18600
for _ in $(seq "$RUNS"); do
  for c in "${CASES[@]}"; do
    IFS='|' read -r name cmd kind <<<"$c"
    for shm in 1 0; do
      PORT=$((PORT + 1))
      # shellcheck disable=SC2086  # the options split into words
      fig=$(run $PORT $shm "$kind" $cmd)
      [[ -n $fig ]] || { echo "FAIL: no figures from $name (SOFTRDMA_SHM=$shm)" >&2; exit 1; }
      echo "$name|$kind|$shm|$fig" >>"$WORK/results"
    done
  done
  if command -v qperf >/dev/null; then
    # (SERVER_PID: testnet_cleanup stops it if this script dies first)
    "$TESTNET" exec h1 timeout 60 qperf >/dev/null 2>&1 &
    SERVER_PID=$!
    sleep 0.3
    # qperf prints "bw  =  3.07 GB/sec" (10^9 B/s; MB/sec below 1 GB/s): as MiB/s
    fig=$("$TESTNET" exec h2 timeout 60 qperf 198.18.0.1 -t "$([[ -n $QUICK ]] && echo 1 || echo 2)" -m 1048576 \
      tcp_bw 2>/dev/null | awk '$1 == "bw" {m = $4 == "GB/sec" ? 1e9 : $4 == "MB/sec" ? 1e6 : 1e3;
        printf "%.2f", $3 * m / 1048576}')
    # Its own server only (the namespaces share the PID space: a pkill would stop any qperf of the machine,
    # such as bench/run.py's in a parallel ctest); timeout passes the TERM on to qperf.
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" || true
    SERVER_PID=
    [[ -n $fig ]] || { echo "FAIL: no figure from qperf tcp_bw" >&2; exit 1; }
    echo "ib_write_bw 1 MiB|bw|tcp|$fig" >>"$WORK/results"
  fi
done

/usr/bin/python3 - "$WORK/results" "$RUNS" "$MTU" "$PMTU" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("|") for l in open(sys.argv[1]) if l.strip()]
names = list(dict.fromkeys(r[0] for r in rows))
unit = {"lat": "us typical (average)", "rate": "M messages/s", "bw": "MiB/s"}
print(f"softrdma between two network namespaces (perftest, device sr_eth0, links at MTU {sys.argv[3]}, "
      f"path MTU {sys.argv[4]}), {sys.argv[2]} run(s) each")
print(f"{'case':<24} {'backend':<17} {'median [min-max]':<40} unit")
for n in names:
    kind = next(r[1] for r in rows if r[0] == n)
    med = {}
    for shm, label in (("1", "default"), ("0", "SOFTRDMA_SHM=0")):
        figs = [[float(x) for x in r[3].split()] for r in rows if r[0] == n and r[2] == shm]
        main = [f[0] for f in figs]
        med[shm] = statistics.median(main)
        s = f"{med[shm]:.2f} [{min(main):.2f}-{max(main):.2f}]"
        if kind == "lat":
            avg = [f[1] for f in figs]
            s += f" ({statistics.median(avg):.2f} [{min(avg):.2f}-{max(avg):.2f}])"
        print(f"{n:<24} {label:<17} {s:<40} {unit[kind]}")
    print(f"{'':<24} {'default / SHM=0':<17} {med['1'] / med['0']:.2f}")
    tcp = [float(r[3]) for r in rows if r[0] == n and r[2] == "tcp"]
    if tcp:
        t = statistics.median(tcp)
        s = f"{t:.2f} [{min(tcp):.2f}-{max(tcp):.2f}]"
        print(f"{'':<24} {'qperf tcp_bw':<17} {s:<40} {unit[kind]} (TCP between the same hosts, 1 MiB messages)")
        print(f"{'':<24} {'SHM=0 / qperf':<17} {med['0'] / t:.2f}")
PY
