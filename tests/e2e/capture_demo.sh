#!/usr/bin/env bash
# e2e.capture_tshark_scapy: captures the demo's RoCEv2 packets on lo (tcpdump) and checks every one of them with two
# independent decoders (tests/wire/check_capture.py: scapy recomputes each ICRC, tshark decodes each packet
# as InfiniBand with no malformed mark or expert warning), and that the RC opcodes the demo must produce
# all occur.
#
#   capture_demo.sh DEMO CHECK_CAPTURE_PY [WORKDIR]
#
# Root runs it in a network namespace of its own (unshare -n) so that only the demo's packets are on that
# lo, whatever else runs on this machine; the capture is narrowed to the demo's two UDP ports anyway (a
# QP's port is its QPN >> 8; the client prints both QPNs). Exits 77 (skip) if it cannot capture.
set -euo pipefail
# softrdma hands runs of equal-size packets to the kernel as one UDP GSO message, which the kernel splits
# on any real link (each piece a RoCEv2 packet with IPv4 ID k; tests/io KernelSplitGsoSegmentsCarryIdK
# checks their ICRCs against the kernel's split). On lo a capture sees the unsplit message, so capture
# with GSO off, as README says to: one RoCEv2 packet per frame.
export SOFTRDMA_GSO=0
export SOFTRDMA_SHM=0  # a capture on lo sees only packets that take the socket path
DEMO=$1
CHECK=$2
WORK=${3:-}
SKIP=77

if [[ $(id -u) -ne 0 ]]; then echo "SKIP: capturing on lo needs root"; exit $SKIP; fi
for tool in tcpdump tshark /usr/bin/python3; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool is not installed"; exit $SKIP; }
done
/usr/bin/python3 -c 'import scapy.contrib.roce' 2>/dev/null || { echo "SKIP: python3-scapy is not installed"; exit $SKIP; }

if [[ -z ${CAPTURE_DEMO_NETNS:-} ]] && unshare -n true 2>/dev/null; then
  CAPTURE_DEMO_NETNS=1 exec unshare -n "$0" "$@"
fi
if [[ -n ${CAPTURE_DEMO_NETNS:-} ]]; then
  ip link set lo up
  echo "capture_demo: in a network namespace of its own"
fi

if [[ -z $WORK ]]; then WORK=$(mktemp -d /tmp/e2e-capture.XXXXXX); fi
mkdir -p "$WORK"
CAPTURE_PID=
cleanup() {
  if [[ -n $CAPTURE_PID ]]; then kill "$CAPTURE_PID" 2>/dev/null || true; fi
}
trap cleanup EXIT

ALL=$WORK/all.pcap
DEMO_PCAP=$WORK/demo.pcap
rm -f "$ALL" "$DEMO_PCAP"
# --immediate-mode: without it, packets reach tcpdump in blocks retired every second or when full, and the
# SIGINT that ends the capture throws away the block being filled (the demo's last milliseconds). -U writes
# each packet as it comes, so the file shows when the capture is really running. -B: a 64 MiB kernel buffer
# so that no packet is lost to a slow reader. -s 8192: the largest packet here is 4170 bytes (path MTU 4096,
# GSO off); in immediate mode libpcap's ring has one slot of the snapshot length per packet, so at the
# default 256 KiB the 64 MiB held only 256 packets, and a burst of go-back-N retransmissions on a loaded
# machine overflowed it (CI: 1426 packets counted, 957 captured). `timeout` bounds the capture if nothing
# stops it.
timeout 120 tcpdump -n -i lo --immediate-mode -U -B 65536 -s 8192 -w "$ALL" udp 2>"$WORK/tcpdump.err" &
CAPTURE_PID=$!
# Probes to the discard port until one shows in the file: then every later packet is captured.
started=
for _ in $(seq 100); do
  kill -0 "$CAPTURE_PID" 2>/dev/null || break
  echo probe 2>/dev/null >/dev/udp/127.0.0.1/9 || true
  if [[ -s $ALL ]] && tcpdump -n -r "$ALL" -c 1 2>/dev/null | grep -q .; then started=1; break; fi
  sleep 0.1
done
if [[ -z $started ]]; then cat "$WORK/tcpdump.err"; echo "FAIL: the capture did not start"; exit 1; fi

rc=0
timeout 60 "$DEMO" --max-size 65536 --atomics 10 -v >"$WORK/demo.out" 2>&1 || rc=$?
cat "$WORK/demo.out"
sleep 0.3  # the last packets reach the capture
kill -INT "$CAPTURE_PID" 2>/dev/null || true
wait "$CAPTURE_PID" || true
CAPTURE_PID=
if [[ $rc -ne 0 ]]; then echo "FAIL: the demo exited with $rc"; exit 1; fi

read -r LQPN RQPN < <(sed -n 's/.*local QP 0x\([0-9a-f]*\) -> remote QP 0x\([0-9a-f]*\).*/\1 \2/p' "$WORK/demo.out")
if [[ -z ${LQPN:-} || -z ${RQPN:-} ]]; then echo "FAIL: no QP numbers in the demo's output"; exit 1; fi
P1=$((0x$LQPN >> 8))
P2=$((0x$RQPN >> 8))
echo "capture_demo: QPs 0x$LQPN and 0x$RQPN -> UDP ports $P1 and $P2"
tcpdump -n -r "$ALL" -w "$DEMO_PCAP" "udp port $P1 and udp port $P2" 2>/dev/null
TOTAL=$(tcpdump -n -r "$ALL" 2>/dev/null | wc -l)
OURS=$(tcpdump -n -r "$DEMO_PCAP" 2>/dev/null | wc -l)
echo "capture_demo: $TOTAL UDP packets captured, $OURS between the demo's two ports"

# What both sides say they sent must all be in the capture (loopback loses nothing to the capture with
# this buffer; a mismatch means a packet went out on another path or the counters are wrong).
SENT=$(sed -n 's/.*counters:.* tx_packets=\([0-9]*\).*/\1/p' "$WORK/demo.out" | awk '{s += $1} END {print s + 0}')
echo "capture_demo: the two sides counted $SENT packets sent"
if [[ $SENT -ne $OURS ]]; then
  cat "$WORK/tcpdump.err"  # its own count of packets dropped by the kernel
  echo "FAIL: $SENT packets sent (counters) but $OURS captured"
  exit 1
fi

# RC opcodes (IBTA.md 4): SEND FIRST 0, LAST 2, ONLY 4, ONLY_IMM 5, WRITE FIRST 6, MIDDLE 7, LAST 8, ONLY 10,
# ONLY_IMM 11, READ REQUEST 12, READ RESPONSE FIRST 13, MIDDLE 14, LAST 15, ONLY 16, ACK 17, ATOMIC ACK 18,
# CmpSwap 19, FetchAdd 20.
/usr/bin/python3 "$CHECK" "$DEMO_PCAP" "$P1" "$P2" \
  --require-opcodes 0,2,4,5,6,7,8,10,11,12,13,14,15,16,17,18,19,20
