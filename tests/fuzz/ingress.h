// The packet ingress path under a fuzzer: what a received UDP payload goes through in io/udp's
// recv_socket (the length check, the ICRC check) and then Context::rx_burst (opcode, length, P_Key, QP
// lookup, QP state, peer check, responder or completer), against two soft NICs joined by the in-memory
// network, each with QPs of every type and in several states, registered MRs and requests in flight.
// Everything is deterministic (fake clock, fixed addresses, seeded MR keys), so an input replays exactly.
//
// The node under test has a peer, whose address its QPs are connected to. An input is a sequence of
// records, each
//   [flags] [arg] [length, 2 bytes big-endian] [length bytes: BTH .. ICRC, as a UDP payload]
// flags: bit 0  recompute the ICRC over the bytes first (else the ICRC in the bytes is checked as-is)
//        bit 1  from a stranger's address instead of the peer's
//        bit 2  after the burst, advance the clock by 1 us << (2 * (arg >> 4)) and run the timers
//        bit 3  retarget: write the QPN of QP (arg & 15) % kQps into the BTH first
//        bit 4  the next record joins the same receive burst (ACK coalescing, several packets per QP)
// A record cut short by the end of the input carries what is left.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace softrdma::fuzz {

inline constexpr uint8_t kFixIcrc = 1, kStranger = 2, kTick = 4, kRetarget = 8, kSameBurst = 16;
// The QPs of the node and of its peer, by index (QP i is connected to the peer's QP i).
enum QpIndex : uint32_t { kRc = 0, kUc, kUd, kRcSrq, kRcRtr, kRcInit, kRcErr, kQps };

struct IngressStats {
  size_t records = 0;  // packets in the input
  size_t checked = 0;  // passed the length and ICRC checks (went to Context::rx_burst)
  size_t reached = 0;  // of those, reached a QP's responder or completer (not dropped by the dispatch)
  size_t completions = 0;  // successful work completions (of requests set up, and of receives)
};
// Runs one input.
IngressStats run_ingress(const uint8_t* data, size_t size);

// Writes the seed corpus into `dir` (which must exist): every packet the node receives in a session in
// which it and its peer run every operation of every QP type towards each other (SEND, SEND_WITH_IMM,
// SEND_WITH_INV, RDMA WRITE, WRITE_WITH_IMM, READ, both atomics; single- and multi-packet; ACKs and
// responses), one file each, plus the whole session in one file (and again as bursts);
// and every RoCEv2 packet of the capture at `pcap_path` (kernel Soft-RoCE), retargeted at the QP of its
// transport. Returns the number of files, or -1 with `error` set.
int write_seeds(const std::string& dir, const std::string& pcap_path, std::string* error);

}  // namespace softrdma::fuzz
