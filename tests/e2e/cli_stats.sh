#!/usr/bin/env bash
# e2e.cli_stats: `softrdma stats` prints every counter of a device, and `--pid` one process's own: a
# perftest pair on sr_lo (softrdma's libibverbs) whose server drops 2% of what it receives
# (SOFTRDMA_FAULTS) must show, while it runs: on the server the injected drops and the sequence-error NAKs
# they cause, on the client those NAKs received and the retransmissions they cause.
#
#   cli_stats.sh CLI LIBDIR
set -euo pipefail
CLI=$1
LIBDIR=$(readlink -f "$2")
source "$(dirname "$0")/../util/listening.sh"
command -v ib_write_bw >/dev/null || { echo "SKIP: perftest is not installed"; exit 77; }
W=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$W"' EXIT
PORT=18602

# Every counter, by name, for the device asked for.
"$CLI" stats sr_lo >"$W/all"
grep -q '^link sr_lo/1$' "$W/all"
for c in tx_packets rx_packets retransmits retry_timeouts tx_acks tx_nak_psn_seq rx_nak_rem_access tx_rnr_nak \
         dup_requests drop_bad_icrc drop_wrong_peer drop_bad_qkey drop_socket_full drop_injected; do
  grep -Eq "^ +$c +[0-9]+ " "$W/all" || { cat "$W/all"; echo "FAIL: no counter $c"; exit 1; }
done
if "$CLI" stats --pid 0 sr_lo >/dev/null 2>&1; then echo "FAIL: --pid 0 accepted"; exit 1; fi

export LD_LIBRARY_PATH=$LIBDIR
[ -z "${SOFTRDMA_PRELOAD:-}" ] || export LD_PRELOAD=$SOFTRDMA_PRELOAD  # sanitizer runtime (tests/CMakeLists.txt)
SOFTRDMA_FAULTS=drop=0.02,seed=3 ib_write_bw -d sr_lo -x 1 -p $PORT -s 4096 -n 100000 >"$W/server" 2>&1 &
pids+=($!)
server=$!
wait_listening $PORT || { cat "$W/server"; echo "FAIL: the server does not listen"; exit 1; }
ib_write_bw -d sr_lo -x 1 -p $PORT -s 4096 -n 100000 127.0.0.1 >"$W/client" 2>&1 &
pids+=($!)
client=$!
counter() { awk -v c="$2" '$1 == c {print $2}' "$1"; }
# (Counted iterations, not perftest's -D: its SIGALRM handler calls fopen, which TSan reports.)
for _ in $(seq 1500); do
  sleep 0.02
  "$CLI" stats --pid $client sr_lo >"$W/c"
  "$CLI" stats --pid $server sr_lo >"$W/s"
  [[ $(counter "$W/c" retransmits) -gt 0 && $(counter "$W/s" tx_nak_psn_seq) -gt 0 ]] && break
done
cat "$W/c" "$W/s"
for c in tx_packets rx_packets tx_bytes retransmits rx_nak_psn_seq; do
  [[ $(counter "$W/c" $c) -gt 0 ]] || { echo "FAIL: client's $c is 0"; exit 1; }
done
for c in tx_packets rx_packets tx_acks tx_nak_psn_seq drop_injected drop_out_of_seq; do
  [[ $(counter "$W/s" $c) -gt 0 ]] || { echo "FAIL: server's $c is 0"; exit 1; }
done
[[ $(counter "$W/c" drop_injected) -eq 0 ]] || { echo "FAIL: the client injected no faults but counts some"; exit 1; }
wait $client || { cat "$W/client"; echo "FAIL: the client exited with an error"; exit 1; }
wait $server || { cat "$W/server"; echo "FAIL: the server exited with an error"; exit 1; }
echo PASS
