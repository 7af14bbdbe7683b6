#!/usr/bin/python3
"""Sends the IPv4 RoCEv2 packets of a capture that go from SRC to DST again, as captured (IP header with its
ID, UDP with rxe's zero checksum, ICRC), on a raw socket: what kernel Soft-RoCE at SRC put on the wire.

Usage: /usr/bin/python3 rxe_replay.py FILE.pcap SRC DST [--corrupt N]
  --corrupt N: flip one bit in the payload of the N-th such packet (from 0) before sending it

Prints "sent K packets, IP IDs A..B" and exits 0; needs CAP_NET_RAW (the test runs as root).
"""

import socket
import sys

from scapy.all import IP, UDP, rdpcap, raw


def main(argv):
    if len(argv) not in (4, 6) or (len(argv) == 6 and argv[4] != "--corrupt"):
        print(__doc__, file=sys.stderr)
        return 2
    path, src, dst = argv[1:4]
    corrupt = int(argv[5]) if len(argv) == 6 else -1
    packets = [bytearray(raw(p[IP])) for p in rdpcap(path)
               if IP in p and UDP in p and p[UDP].dport == 4791 and p[IP].src == src and p[IP].dst == dst]
    if not packets:
        print(f"no RoCEv2 packets from {src} to {dst} in {path}", file=sys.stderr)
        return 1
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)  # IP_HDRINCL: sent as given
    ids = []
    for k, ip in enumerate(packets):
        if k == corrupt:
            ip[20 + 8 + 12 + 1] ^= 0x04  # past IPv4, UDP and the BTH: a byte the ICRC covers
        ids.append(ip[4] << 8 | ip[5])
        s.sendto(bytes(ip), (dst, 0))
    s.close()
    print(f"sent {len(packets)} packets, IP IDs {min(ids):#06x}..{max(ids):#06x}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
