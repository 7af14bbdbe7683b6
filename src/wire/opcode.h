// The one opcode table of softrdma: for every BTH opcode (0..255) its IBTA name, the extension headers it
// carries and its meaning bits. Header offsets and lengths are derived from the header list, never written
// by hand. Names follow Wireshark's `infiniband.bth.opcode` values ("RC Send First", ...).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace softrdma::wire {

// Extension headers in the order the IBTA places them after the BTH.
enum class Hdr : uint8_t { kRdeth, kDeth, kReth, kAtomicEth, kAeth, kAtomicAckEth, kImmDt, kIeth, kCount };
inline constexpr std::array<uint8_t, static_cast<size_t>(Hdr::kCount)> kHdrLen = {4, 8, 16, 28, 4, 8, 4, 4};
inline constexpr uint32_t kBthLen = 12;
inline constexpr uint32_t kIcrcLen = 4;

// Meaning bits of an opcode (besides its headers).
enum OpFlag : uint32_t {
  kHasRdeth = 1u << 0,
  kHasDeth = 1u << 1,
  kHasReth = 1u << 2,
  kHasAtomicEth = 1u << 3,
  kHasAeth = 1u << 4,
  kHasAtomicAckEth = 1u << 5,
  kHasImmDt = 1u << 6,
  kHasIeth = 1u << 7,
  kPayload = 1u << 8,    // carries data
  kFirst = 1u << 9,      // first packet of a multi-packet message
  kMiddle = 1u << 10,
  kLast = 1u << 11,
  kOnly = 1u << 12,      // the whole message in one packet
  kSend = 1u << 13,
  kWrite = 1u << 14,
  kReadReq = 1u << 15,
  kReadResp = 1u << 16,
  kAtomic = 1u << 17,    // CmpSwap / FetchAdd request
  kAck = 1u << 18,       // ACKNOWLEDGE
  kAtomicAck = 1u << 19, // ATOMIC ACKNOWLEDGE
  kRequest = 1u << 20,   // sent by a requester, handled by a responder
  kResponse = 1u << 21,  // sent by a responder, handled by a completer
  kRwqe = 1u << 22,      // consumes a receive WQE (at the start of the message)
  kRecvComp = 1u << 23,  // produces a receive completion (at the end of the message)
  kValid = 1u << 31,
};
inline constexpr uint32_t kStart = kFirst | kOnly;
inline constexpr uint32_t kEnd = kLast | kOnly;

enum class Transport : uint8_t { kRc = 0x00, kUc = 0x20, kRd = 0x40, kUd = 0x60, kCnp = 0x80, kXrc = 0xA0 };

// Operation numbers (low 5 bits of the opcode), as ib_pack.h names them.
enum Op : uint8_t {
  kOpSendFirst = 0x00,
  kOpSendMiddle = 0x01,
  kOpSendLast = 0x02,
  kOpSendLastImm = 0x03,
  kOpSendOnly = 0x04,
  kOpSendOnlyImm = 0x05,
  kOpWriteFirst = 0x06,
  kOpWriteMiddle = 0x07,
  kOpWriteLast = 0x08,
  kOpWriteLastImm = 0x09,
  kOpWriteOnly = 0x0A,
  kOpWriteOnlyImm = 0x0B,
  kOpReadRequest = 0x0C,
  kOpReadRespFirst = 0x0D,
  kOpReadRespMiddle = 0x0E,
  kOpReadRespLast = 0x0F,
  kOpReadRespOnly = 0x10,
  kOpAcknowledge = 0x11,
  kOpAtomicAcknowledge = 0x12,
  kOpCompareSwap = 0x13,
  kOpFetchAdd = 0x14,
  kOpSendLastInv = 0x16,
  kOpSendOnlyInv = 0x17,
};

constexpr uint8_t opcode(Transport t, Op op) { return static_cast<uint8_t>(static_cast<uint8_t>(t) | op); }

struct OpcodeInfo {
  std::string_view transport_name;  // "Reliable Connection (RC)"; empty when the opcode is unused
  std::string_view op_name;         // "RDMA WRITE Only"
  uint32_t flags = 0;     // OpFlag bits; kValid when softrdma knows the opcode
  uint8_t hdr_len = 0;    // BTH + extension headers
  std::array<uint8_t, static_cast<size_t>(Hdr::kCount)> offset{};  // from the BTH start; 0 = absent

  constexpr bool has(uint32_t f) const { return (flags & f) == f; }
  constexpr bool any(uint32_t f) const { return (flags & f) != 0; }
  constexpr uint8_t off(Hdr h) const { return offset[static_cast<size_t>(h)]; }
};

// Wireshark's full name: "Reliable Connection (RC) - RDMA WRITE Only" (or "Unknown (0xNN)").
std::string opcode_name(uint8_t op);

// The table itself (opcode.cc builds it at compile time).
const std::array<OpcodeInfo, 256>& opcode_table();
inline const OpcodeInfo& info(uint8_t op) { return opcode_table()[op]; }
constexpr Transport transport_of(uint8_t op) { return static_cast<Transport>(op & 0xE0); }

}  // namespace softrdma::wire
