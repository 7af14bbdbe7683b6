// What moves between the transport and an io/ backend: bursts of packets. The transport builds headers and
// points at payload memory (registered memory or a WQE's inline copy); the backend adds the pad bytes and
// the ICRC, and the IP/UDP framing (the kernel's, for io/udp).
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "wire/addr.h"

namespace softrdma::io {

inline constexpr uint32_t kMaxHdr = 64;      // BTH + extension headers (40 at most) with room to spare
inline constexpr uint32_t kMaxPayloadIov = 16;  // payload pieces per packet (SGE boundaries)

// TxPacket/RxPacket::flags. kAwaitsAck: the sender polls for the packet's ACK
// (Transport::lone_write_by_ring); only the same-host rings carry it (UDP: 0).
inline constexpr uint8_t kAwaitsAck = 1;

struct TxPacket {
  wire::Endpoint src;  // local address and the UDP port of the sending socket
  wire::Endpoint dst;
  uint32_t hdr_len = 0;
  uint32_t n_iov = 0;
  uint32_t payload_len = 0;  // sum of iov lengths
  uint8_t pad = 0;           // pad bytes (zeros) the backend appends before the ICRC; the BTH already says so
  uint8_t flags = 0;         // kAwaitsAck (what a same-host ring carries beside the packet; not on the wire)
  alignas(8) uint8_t hdr[kMaxHdr]{};  // (initialised, for constinit thread_local batches)
  iovec iov[kMaxPayloadIov]{};
};

class TxSink {
 public:
  virtual ~TxSink() = default;
  // Sends every packet, in order. Payload memory need stay valid only until this returns.
  virtual void tx_burst(std::span<TxPacket> pkts) = 0;
  // For a burst that more packets will follow: sends a prefix of it (one packet at least) and returns its
  // length; the caller passes the rest again, first, with what follows. A backend that groups packets
  // (io/udp: GSO messages) may keep back a trailing group that the next packets could fill. By default, all
  // of them.
  virtual size_t tx_burst_some(std::span<TxPacket> pkts) {
    tx_burst(pkts);
    return pkts.size();
  }
};

// A batch the transport fills; full batches (and the rest, at the end of a post or of an rx burst) go to
// the sink in one call, so one syscall carries many packets. A full one goes by tx_burst_some: what the sink
// keeps back stays, at the front, for the next call (flush() sends everything).
//
// Full is kMax packets or kFullBytes of payload, whichever comes first, and 32 packets whose payloads
// average under kSmallPayload. So 32 at path MTU 4096 (two 60 KiB UDP GSO messages and a short one that
// waits for more; 64 there, four messages a call, cost 64 QPs x 64 KiB over loopback about 15%) and 32 small
// ones (64 of them, 8-byte ib_write_bw between two testnet hosts: 4% lower), but 64 at path MTU 1024, where
// 32 made GSO messages of 32 KiB, half what one may hold: between two testnet hosts with links at MTU 1500,
// socket-path 1 MiB ib_write_bw about 25% higher (README, "Between hosts at MTU 1500").
struct TxBatch {
  static constexpr uint32_t kMax = 64;
  static constexpr uint64_t kFullBytes = 128u << 10;
  static constexpr uint64_t kSmallPayload = 512;
  TxSink* sink = nullptr;
  uint32_t n = 0;
  TxPacket pkts[kMax];

  TxPacket& next() {
    // The payload of the packets before the last one handed out (whose lengths the caller set since).
    for (; counted_ < n; ++counted_) bytes_ += pkts[counted_].payload_len;
    if (n == kMax || bytes_ >= kFullBytes || (n >= kMax / 2 && bytes_ < n * kSmallPayload)) flush_full();
    TxPacket& p = pkts[n++];
    p.n_iov = 0;
    p.payload_len = 0;
    p.pad = 0;
    return p;
  }
  void flush() {
    if (n) {
      sink->tx_burst(std::span<TxPacket>(pkts, n));
      n = 0;
    }
    counted_ = 0;
    bytes_ = 0;
  }

 private:
  uint32_t counted_ = 0;  // pkts[0, counted_) are summed in bytes_
  uint64_t bytes_ = 0;

  void flush_full() {
    const size_t sent = sink->tx_burst_some(std::span<TxPacket>(pkts, n));
    if (sent == 0) {  // a sink that broke its word: send them all
      flush();
      return;
    }
    counted_ = 0;
    bytes_ = 0;
    if (sent >= n) {
      n = 0;
      return;
    }
    const auto left = static_cast<uint32_t>(n - sent);
    for (uint32_t k = 0; k < left; ++k) {
      pkts[k] = pkts[sent + k];  // (forward: k < sent + k)
      bytes_ += pkts[k].payload_len;
    }
    n = counted_ = left;
  }
};

// The packets a driver takes from the backend per receive burst (Context::drive).
inline constexpr uint32_t kRxBurst = 32;

// A received packet after the backend checked and stripped the ICRC.
struct RxPacket {
  wire::Endpoint src;
  wire::Endpoint dst;
  uint8_t* data = nullptr;  // the BTH
  uint32_t len = 0;         // BTH .. pad (no ICRC)
  uint8_t tos = 0;          // IPv4 TOS / IPv6 traffic class, when known
  uint8_t ttl = 64;
  uint8_t flags = 0;  // TxPacket::flags as sent, through a same-host ring; else 0
};

}  // namespace softrdma::io
