#!/usr/bin/python3
"""Checks a RoCEv2 capture with two independent decoders.

Usage: /usr/bin/python3 check_capture.py FILE.pcap [UDP_PORT...] [--require-opcodes N,N,...]
       (port defaults to 4791; several ports: every packet sent to any of them is checked)

1. scapy (scapy.contrib.roce, Debian's python3-scapy) recomputes the ICRC of every packet sent to a
   UDP_PORT and compares it with the 4 ICRC bytes on the wire. The ICRC is stored least-significant byte
   first (IBTA.md 6, gotcha 1): scapy's BTH.compute_icrc already returns the wire byte order. scapy 2.5
   cannot compute the ICRC over IPv6, so IPv6 packets are checked with the IBTA.md 6 masking here, over
   scapy's dissection, and counted apart.
2. tshark decodes the same ports as InfiniBand; every packet must have a BTH opcode, no malformed-packet
   mark and no expert info of severity warning or error.
3. With --require-opcodes, every listed BTH opcode (decimal or 0x hex; IBTA.md 4) must occur at least once.

Exits 0 when every check passes and prints a summary; otherwise prints each failure and exits 1.
"""

import collections
import struct
import subprocess
import sys
import zlib

from scapy.all import IP, UDP, IPv6, bind_layers, rdpcap, raw
from scapy.contrib.roce import BTH

# tshark's expert severities (epan/proto.h PI_SEVERITY_MASK values).
EXPERT_WARN = 0x00600000
FAIL_LIMIT = 20  # failures printed
# Heuristic dissectors that guess at the application data after the InfiniBand headers; synthetic payloads
# can look like their protocols and then "fail" as malformed. Only the IBTA headers are checked here.
PAYLOAD_GUESSERS = ["smc", "smb_direct", "rpcordma", "nvme-rdma", "lnet", "iser", "fcoib", "infiniband_sdp"]


def icrc_ipv6(pkt):
    """IBTA.md 6: 8 x 0xFF, IPv6 with traffic class, flow label and hop limit masked, UDP checksum and BTH
    byte 4 masked, everything up to the ICRC. Returns the 4 bytes as stored on the wire (LSB first)."""
    ip = pkt[IPv6]
    udp_len = ip[UDP].len
    data = bytearray(raw(ip)[: 40 + udp_len - 4])
    data[0] |= 0x0F
    data[1:4] = b"\xff\xff\xff"
    data[7] = 0xFF
    data[46:48] = b"\xff\xff"  # UDP checksum
    data[48 + 4] = 0xFF  # BTH byte 4: FECN, BECN, Resv6
    return struct.pack("<I", zlib.crc32(b"\xff" * 8 + bytes(data)) & 0xFFFFFFFF)


def check_icrc(path, ports, failures):
    """Returns (packets, Counter of opcodes, IPv6 packets, frame numbers) for packets to any of `ports`."""
    for port in ports:
        if port != 4791:
            bind_layers(UDP, BTH, dport=port)
    opcodes = collections.Counter()
    frames = []
    ipv6 = 0
    for number, pkt in enumerate(rdpcap(path), start=1):
        if UDP not in pkt or pkt[UDP].dport not in ports:
            continue
        frames.append(number)
        if BTH not in pkt:
            failures.append(f"frame {number}: scapy does not decode a BTH")
            continue
        bth = pkt[BTH]
        opcodes[bth.opcode] += 1
        wire = struct.pack("!I", bth.icrc)  # the FCS field holds the 4 wire bytes read big-endian
        if IPv6 in pkt:
            ipv6 += 1
            expected = icrc_ipv6(pkt)
        elif IP in pkt:
            expected = bth.compute_icrc(None)
        else:
            failures.append(f"frame {number}: neither IPv4 nor IPv6")
            continue
        if wire != expected:
            failures.append(f"frame {number}: ICRC on the wire {wire.hex()} != computed {expected.hex()}")
    return len(frames), opcodes, ipv6, frames


def check_tshark(path, ports, failures):
    """Returns {frame number: opcode} as tshark decodes packets to any of `ports`."""
    cmd = [
        "tshark", "-n", "-r", path,
        *[arg for p in ports for arg in ("-d", f"udp.port=={p},infiniband")],
        "-Y", " || ".join(f"udp.dstport=={p}" for p in ports),
        *[arg for p in PAYLOAD_GUESSERS for arg in ("--disable-protocol", p)],
        "-T", "fields", "-E", "separator=|", "-E", "occurrence=a", "-E", "aggregator=,",
        "-e", "frame.number", "-e", "infiniband.bth.opcode", "-e", "_ws.malformed",
        "-e", "_ws.expert.severity", "-e", "_ws.expert.message",
    ]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        failures.append(f"tshark did not run: {e}")
        return {}
    if out.returncode != 0:
        failures.append(f"tshark exited with {out.returncode}: {out.stderr.strip()}")
        return {}
    decoded = {}
    for line in out.stdout.splitlines():
        number, opcode, malformed, severities, messages = (line.split("|") + [""] * 5)[:5]
        decoded[int(number)] = opcode
        if not opcode:
            failures.append(f"frame {number}: tshark decodes no InfiniBand BTH")
        if malformed:
            failures.append(f"frame {number}: tshark marks it malformed")
        worst = max((int(s, 0) for s in severities.split(",") if s), default=0)
        if worst >= EXPERT_WARN:
            failures.append(f"frame {number}: tshark expert info: {messages}")
    return decoded


def usage():
    print("\n".join(__doc__.strip().splitlines()[2:4]), file=sys.stderr)
    return 2


def main(argv):
    args = list(argv[1:])
    required = []
    if "--require-opcodes" in args:
        i = args.index("--require-opcodes")
        if i + 1 >= len(args):
            return usage()
        try:
            required = [int(x, 0) for x in args[i + 1].split(",") if x]
        except ValueError:
            return usage()
        del args[i : i + 2]
    if not args or any(not a.isdigit() for a in args[1:]):
        return usage()
    path = args[0]
    ports = sorted({int(a) for a in args[1:]}) or [4791]
    port_text = ",".join(str(p) for p in ports)
    failures = []
    count, opcodes, ipv6, frames = check_icrc(path, ports, failures)
    decoded = check_tshark(path, ports, failures)
    if count == 0:
        failures.append(f"no UDP packets to port {port_text} in {path}")
    if sorted(decoded) != frames and decoded:
        failures.append(f"scapy sees {count} packets to port {port_text}, tshark {len(decoded)}")
    missing = [op for op in required if op not in opcodes]
    if missing:
        failures.append("required opcodes not seen: " + " ".join(str(op) for op in missing))
    for number in frames:
        if number in decoded and decoded[number] and int(decoded[number]) not in opcodes:
            failures.append(f"frame {number}: tshark opcode {decoded[number]} not seen by scapy")

    seen = " ".join(f"{op}:{n}" for op, n in sorted(opcodes.items()))
    print(f"{path} port {port_text}: {count} RoCEv2 packets ({ipv6} IPv6), {len(opcodes)} opcodes: {seen}")
    if failures:
        for f in failures[:FAIL_LIMIT]:
            print("FAIL " + f, file=sys.stderr)
        if len(failures) > FAIL_LIMIT:
            print(f"FAIL ... and {len(failures) - FAIL_LIMIT} more", file=sys.stderr)
        print(f"FAILED: {len(failures)} problem(s)", file=sys.stderr)
        return 1
    print("OK: every ICRC matches (scapy) and every packet decodes as InfiniBand without warnings (tshark)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
