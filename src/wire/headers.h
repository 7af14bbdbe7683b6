// Accessors for the IBTA transport headers (BTH and extension headers) in a packet buffer that starts at the
// BTH. All multi-byte fields are big-endian on the wire; byte order is converted here and nowhere else.
// Field positions come from IBTA.md section 2; header offsets come from the opcode table.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>

#include "wire/opcode.h"

namespace softrdma::wire {

inline uint16_t load_be16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }
inline uint32_t load_be24(const uint8_t* p) { return uint32_t{p[0]} << 16 | uint32_t{p[1]} << 8 | p[2]; }
inline uint32_t load_be32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return __builtin_bswap32(v);
}
inline uint64_t load_be64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return __builtin_bswap64(v);
}
inline void store_be16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
inline void store_be24(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v >> 16);
  p[1] = static_cast<uint8_t>(v >> 8);
  p[2] = static_cast<uint8_t>(v);
}
inline void store_be32(uint8_t* p, uint32_t v) {
  v = __builtin_bswap32(v);
  std::memcpy(p, &v, 4);
}
inline void store_be64(uint8_t* p, uint64_t v) {
  v = __builtin_bswap64(v);
  std::memcpy(p, &v, 8);
}

inline constexpr uint32_t kPsnMask = 0xFFFFFF;
inline constexpr uint32_t kQpnMask = 0xFFFFFF;
inline constexpr uint16_t kDefaultPkey = 0xFFFF;
inline constexpr uint32_t kMulticastQpn = 0xFFFFFF;
inline constexpr uint16_t kRoceV2Port = 4791;
inline constexpr uint32_t kGsiQkey = 0x80010000;

// AETH syndrome (IBTA.md 3a/3d).
enum class AckType : uint8_t { kAck = 0, kRnrNak = 1, kReserved = 2, kNak = 3 };
enum NakCode : uint8_t {
  kNakPsnSeqErr = 0,
  kNakInvalidRequest = 1,
  kNakRemoteAccessErr = 2,
  kNakRemoteOpErr = 3,
  kNakInvalidRdRequest = 4,
};
inline constexpr uint8_t kAckUnlimitedCredit = 0x1F;
constexpr AckType syndrome_type(uint8_t s) { return static_cast<AckType>((s >> 5) & 3); }
constexpr uint8_t syndrome_value(uint8_t s) { return s & 0x1F; }
constexpr uint8_t make_syndrome(AckType t, uint8_t v) {
  return static_cast<uint8_t>(static_cast<uint8_t>(t) << 5 | (v & 0x1F));
}

// 24-bit PSN arithmetic (IBTA.md 5): the sign of (a-b) in 24 bits.
constexpr int32_t psn_diff(uint32_t a, uint32_t b) { return static_cast<int32_t>((a - b) << 8) >> 8; }
constexpr uint32_t psn_add(uint32_t a, uint32_t n) { return (a + n) & kPsnMask; }

// A view of one packet from its BTH to the end of its payload and pad (the ICRC excluded). `len` counts
// those bytes; the view never reads beyond them once `valid_length()` has said the headers fit.
class PacketView {
 public:
  PacketView(uint8_t* p, uint32_t len) : p_(p), len_(len) {}

  uint8_t* data() const { return p_; }
  uint32_t length() const { return len_; }
  const OpcodeInfo& info() const { return wire::info(opcode()); }
  // True when the buffer holds the BTH, the opcode's headers and the pad it announces.
  bool valid_length() const {
    return len_ >= kBthLen && info().has(kValid) && len_ >= info().hdr_len + pad();
  }

  // BTH (IBTA.md 2a)
  uint8_t opcode() const { return p_[0]; }
  bool se() const { return p_[1] & 0x80; }
  bool mig() const { return p_[1] & 0x40; }
  uint8_t pad() const { return (p_[1] >> 4) & 3; }
  uint8_t tver() const { return p_[1] & 0xF; }
  uint16_t pkey() const { return load_be16(p_ + 2); }
  uint8_t bth_byte4() const { return p_[4]; }  // FECN, BECN, resv6
  uint32_t dest_qpn() const { return load_be24(p_ + 5); }
  bool ack_req() const { return p_[8] & 0x80; }
  uint8_t resv7() const { return p_[8] & 0x7F; }
  uint32_t psn() const { return load_be24(p_ + 9); }

  void set_opcode(uint8_t v) { p_[0] = v; }
  void set_bth(uint8_t op, bool se, uint8_t pad, uint16_t pkey, uint32_t dqpn, bool ack_req, uint32_t psn) {
    p_[0] = op;
    p_[1] = static_cast<uint8_t>((se ? 0x80 : 0) | (pad & 3) << 4);
    store_be16(p_ + 2, pkey);
    p_[4] = 0;
    store_be24(p_ + 5, dqpn & kQpnMask);
    p_[8] = ack_req ? 0x80 : 0;
    store_be24(p_ + 9, psn & kPsnMask);
  }
  void set_raw_bth_flags(uint8_t byte1, uint8_t byte4, uint8_t byte8) {
    p_[1] = byte1;
    p_[4] = byte4;
    p_[8] = byte8;
  }
  void set_ack_req(bool v) { p_[8] = static_cast<uint8_t>((p_[8] & 0x7F) | (v ? 0x80 : 0)); }
  void set_psn(uint32_t v) { store_be24(p_ + 9, v & kPsnMask); }

  // RETH (16 B)
  uint64_t reth_va() const { return load_be64(h(Hdr::kReth)); }
  uint32_t reth_rkey() const { return load_be32(h(Hdr::kReth) + 8); }
  uint32_t reth_len() const { return load_be32(h(Hdr::kReth) + 12); }
  void set_reth(uint64_t va, uint32_t rkey, uint32_t len) {
    uint8_t* q = h(Hdr::kReth);
    store_be64(q, va);
    store_be32(q + 8, rkey);
    store_be32(q + 12, len);
  }

  // AETH (4 B)
  uint8_t aeth_syndrome() const { return h(Hdr::kAeth)[0]; }
  uint32_t aeth_msn() const { return load_be24(h(Hdr::kAeth) + 1); }
  void set_aeth(uint8_t syndrome, uint32_t msn) {
    uint8_t* q = h(Hdr::kAeth);
    q[0] = syndrome;
    store_be24(q + 1, msn & 0xFFFFFF);
  }

  // AtomicETH (28 B)
  uint64_t atomic_va() const { return load_be64(h(Hdr::kAtomicEth)); }
  uint32_t atomic_rkey() const { return load_be32(h(Hdr::kAtomicEth) + 8); }
  uint64_t atomic_swap_add() const { return load_be64(h(Hdr::kAtomicEth) + 12); }
  uint64_t atomic_compare() const { return load_be64(h(Hdr::kAtomicEth) + 20); }
  void set_atomic_eth(uint64_t va, uint32_t rkey, uint64_t swap_add, uint64_t compare) {
    uint8_t* q = h(Hdr::kAtomicEth);
    store_be64(q, va);
    store_be32(q + 8, rkey);
    store_be64(q + 12, swap_add);
    store_be64(q + 20, compare);
  }

  // AtomicAckETH (8 B)
  uint64_t atomic_ack_orig() const { return load_be64(h(Hdr::kAtomicAckEth)); }
  void set_atomic_ack_orig(uint64_t v) { store_be64(h(Hdr::kAtomicAckEth), v); }

  // ImmDt (4 B): kept in network order, as ibv_wc.imm_data is (__be32).
  uint32_t imm_be() const {
    uint32_t v;
    std::memcpy(&v, h(Hdr::kImmDt), 4);
    return v;
  }
  void set_imm_be(uint32_t v) { std::memcpy(h(Hdr::kImmDt), &v, 4); }

  // IETH (4 B)
  uint32_t ieth_rkey() const { return load_be32(h(Hdr::kIeth)); }
  void set_ieth_rkey(uint32_t v) { store_be32(h(Hdr::kIeth), v); }

  // DETH (8 B)
  uint32_t deth_qkey() const { return load_be32(h(Hdr::kDeth)); }
  uint32_t deth_src_qpn() const { return load_be24(h(Hdr::kDeth) + 5); }
  void set_deth(uint32_t qkey, uint32_t src_qpn) {
    uint8_t* q = h(Hdr::kDeth);
    store_be32(q, qkey);
    q[4] = 0;
    store_be24(q + 5, src_qpn & kQpnMask);
  }

  // Payload: after the headers, before the pad.
  uint32_t payload_len() const { return len_ - info().hdr_len - pad(); }
  uint8_t* payload() const { return p_ + info().hdr_len; }

 private:
  uint8_t* h(Hdr which) const { return p_ + info().off(which); }
  uint8_t* p_;
  uint32_t len_;
};

}  // namespace softrdma::wire
