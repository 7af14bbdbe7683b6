// PacketView accessors: every field of every valid opcode round-trips, lands on the IBTA.md 2a/2b byte
// positions, and the length arithmetic (payload, pad) holds.
#include "wire/headers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace softrdma::wire {
namespace {

constexpr uint8_t kGuard = 0xA5;
constexpr size_t kGuardLen = 8;

// A zeroed packet of `payload` bytes for `op`, followed by guard bytes that no setter may touch.
struct Buffer {
  std::vector<uint8_t> bytes;
  uint32_t len;

  Buffer(uint8_t op, uint32_t payload) {
    const uint32_t pad = (-payload) & 3;
    len = info(op).hdr_len + payload + pad;
    bytes.assign(len + kGuardLen, 0);
    std::fill(bytes.begin() + len, bytes.end(), kGuard);
  }
  PacketView view() { return PacketView(bytes.data(), len); }
  bool guard_intact() const {
    return std::all_of(bytes.begin() + len, bytes.end(), [](uint8_t b) { return b == kGuard; });
  }
};

// Distinct values per opcode and per field, so a swapped or overlapping field shows.
struct Fields {
  explicit Fields(uint8_t op)
      : va(0x0102030405060708ull ^ op),
        rkey(0x11223344u ^ op),
        dma_len(0x55667788u ^ op),
        syndrome(static_cast<uint8_t>(0x60 | (op & 0x1F))),
        msn(0xA1B2C3 ^ op),
        swap_add(0x8877665544332211ull ^ op),
        compare(0xF0E0D0C0B0A09080ull ^ op),
        orig(0x1357924680ACEBDFull ^ op),
        imm_be(0xCAFEF00Du ^ op),
        inv_rkey(0x0BADBEEFu ^ op),
        qkey(0x80010000u ^ op),
        src_qpn(0x00C0FFEEu ^ op) {}
  uint64_t va;
  uint32_t rkey, dma_len;
  uint8_t syndrome;
  uint32_t msn;
  uint64_t swap_add, compare, orig;
  uint32_t imm_be, inv_rkey, qkey, src_qpn;
};

void set_all(PacketView& v, const Fields& f) {
  const OpcodeInfo& i = v.info();
  if (i.has(kHasReth)) v.set_reth(f.va, f.rkey, f.dma_len);
  if (i.has(kHasAeth)) v.set_aeth(f.syndrome, f.msn);
  if (i.has(kHasAtomicEth)) v.set_atomic_eth(f.va + 8, f.rkey + 1, f.swap_add, f.compare);
  if (i.has(kHasAtomicAckEth)) v.set_atomic_ack_orig(f.orig);
  if (i.has(kHasImmDt)) v.set_imm_be(f.imm_be);
  if (i.has(kHasIeth)) v.set_ieth_rkey(f.inv_rkey);
  if (i.has(kHasDeth)) v.set_deth(f.qkey, f.src_qpn);
}

void expect_all(const PacketView& v, const Fields& f) {
  const OpcodeInfo& i = v.info();
  if (i.has(kHasReth)) {
    EXPECT_EQ(v.reth_va(), f.va);
    EXPECT_EQ(v.reth_rkey(), f.rkey);
    EXPECT_EQ(v.reth_len(), f.dma_len);
  }
  if (i.has(kHasAeth)) {
    EXPECT_EQ(v.aeth_syndrome(), f.syndrome);
    EXPECT_EQ(v.aeth_msn(), f.msn);
  }
  if (i.has(kHasAtomicEth)) {
    EXPECT_EQ(v.atomic_va(), f.va + 8);
    EXPECT_EQ(v.atomic_rkey(), f.rkey + 1);
    EXPECT_EQ(v.atomic_swap_add(), f.swap_add);
    EXPECT_EQ(v.atomic_compare(), f.compare);
  }
  if (i.has(kHasAtomicAckEth)) {
    EXPECT_EQ(v.atomic_ack_orig(), f.orig);
  }
  if (i.has(kHasImmDt)) {
    EXPECT_EQ(v.imm_be(), f.imm_be);
  }
  if (i.has(kHasIeth)) {
    EXPECT_EQ(v.ieth_rkey(), f.inv_rkey);
  }
  if (i.has(kHasDeth)) {
    EXPECT_EQ(v.deth_qkey(), f.qkey);
    EXPECT_EQ(v.deth_src_qpn(), f.src_qpn);
  }
}

TEST(PacketView, EveryValidOpcodeRoundTrips) {
  int tested = 0;
  for (int o = 0; o < 256; ++o) {
    const auto op = static_cast<uint8_t>(o);
    if (!info(op).has(kValid)) continue;
    SCOPED_TRACE(opcode_name(op));
    for (uint32_t payload : {0u, 1u, 2u, 3u, 4u, 1021u}) {
      if (payload != 0 && !info(op).has(kPayload)) continue;
      Buffer b(op, payload);
      PacketView v = b.view();
      const auto pad = static_cast<uint8_t>((-payload) & 3);
      v.set_bth(op, true, pad, 0xBEEF, 0x1ABCDEF, true, 0x1123456);  // QPN and PSN: upper bits dropped
      const Fields f(op);
      set_all(v, f);
      for (uint32_t k = 0; k < payload; ++k) v.payload()[k] = static_cast<uint8_t>(k * 7 + 1);

      ASSERT_TRUE(v.valid_length());
      EXPECT_EQ(v.opcode(), op);
      EXPECT_TRUE(v.se());
      EXPECT_FALSE(v.mig());
      EXPECT_EQ(v.pad(), pad);
      EXPECT_EQ(v.tver(), 0);
      EXPECT_EQ(v.pkey(), 0xBEEF);
      EXPECT_EQ(v.bth_byte4(), 0);
      EXPECT_EQ(v.dest_qpn(), 0xABCDEFu);
      EXPECT_TRUE(v.ack_req());
      EXPECT_EQ(v.resv7(), 0);
      EXPECT_EQ(v.psn(), 0x123456u);
      expect_all(v, f);
      EXPECT_EQ(v.payload_len(), payload);
      EXPECT_EQ(v.payload(), b.bytes.data() + info(op).hdr_len);
      for (uint32_t k = 0; k < payload; ++k) ASSERT_EQ(v.payload()[k], static_cast<uint8_t>(k * 7 + 1));
      for (uint32_t k = 0; k < pad; ++k) EXPECT_EQ(v.payload()[payload + k], 0);
      EXPECT_TRUE(b.guard_intact());
      ++tested;
    }
  }
  EXPECT_GT(tested, 37);
}

// IBTA.md 2a: byte positions and bit positions of the BTH fields.
TEST(PacketView, BthBytePositions) {
  Buffer b(0x04, 3);
  PacketView v = b.view();
  v.set_bth(0x04, true, 1, 0xBEEF, 0xABCDEF, true, 0x123456);
  const std::vector<uint8_t> expected = {0x04, 0x90, 0xBE, 0xEF, 0x00, 0xAB,
                                         0xCD, 0xEF, 0x80, 0x12, 0x34, 0x56};
  EXPECT_EQ(std::vector<uint8_t>(b.bytes.begin(), b.bytes.begin() + 12), expected);

  v.set_raw_bth_flags(0x4F, 0xC0, 0x7F);
  EXPECT_FALSE(v.se());
  EXPECT_TRUE(v.mig());
  EXPECT_EQ(v.pad(), 0);
  EXPECT_EQ(v.tver(), 0xF);
  EXPECT_EQ(v.bth_byte4(), 0xC0);
  EXPECT_FALSE(v.ack_req());
  EXPECT_EQ(v.resv7(), 0x7F);
  v.set_ack_req(true);
  EXPECT_EQ(b.bytes[8], 0xFF);
  v.set_psn(0xFFFFFFFF);
  EXPECT_EQ(v.psn(), 0xFFFFFFu);
  EXPECT_EQ(b.bytes[8], 0xFF);  // PSN does not spill into byte 8
}

// IBTA.md 2b: RETH = VA 64, R_Key 32, DMA length 32.
TEST(PacketView, RethBytePositions) {
  Buffer b(0x0A, 0);
  PacketView v = b.view();
  v.set_bth(0x0A, false, 0, 0xFFFF, 1, true, 0);
  v.set_reth(0x0102030405060708ull, 0x090A0B0C, 0x0D0E0F10);
  for (uint8_t k = 0; k < 16; ++k) EXPECT_EQ(b.bytes[12 + k], k + 1) << k;
}

// IBTA.md 2b: AtomicETH = VA 64, R_Key 32, Swap/Add 64, Compare 64, packed.
TEST(PacketView, AtomicEthBytePositions) {
  Buffer b(0x13, 0);
  PacketView v = b.view();
  v.set_bth(0x13, false, 0, 0xFFFF, 1, true, 0);
  v.set_atomic_eth(0x0102030405060708ull, 0x090A0B0C, 0x0D0E0F1011121314ull, 0x15161718191A1B1Cull);
  for (uint8_t k = 0; k < 28; ++k) EXPECT_EQ(b.bytes[12 + k], k + 1) << k;
}

// IBTA.md 2b: AETH = syndrome 8, MSN 24; AtomicAckETH = original data 64.
TEST(PacketView, AtomicAckBytePositions) {
  Buffer b(0x12, 0);
  PacketView v = b.view();
  v.set_bth(0x12, false, 0, 0xFFFF, 1, false, 0);
  v.set_aeth(0x01, 0x1020304);  // MSN: 24 bits kept
  v.set_atomic_ack_orig(0x05060708090A0B0Cull);
  for (uint8_t k = 0; k < 12; ++k) EXPECT_EQ(b.bytes[12 + k], k + 1) << k;
}

// IBTA.md 2b: DETH = Q_Key 32, reserved 8, SrcQP 24; ImmDt after it, copied as is.
TEST(PacketView, DethImmBytePositions) {
  Buffer b(0x65, 0);
  PacketView v = b.view();
  v.set_bth(0x65, false, 0, 0xFFFF, 1, false, 0);
  b.bytes[16] = 0xEE;  // the reserved byte is cleared by set_deth
  v.set_deth(0x01020304, 0xFF060708);
  const uint8_t imm[4] = {0x09, 0x0A, 0x0B, 0x0C};
  uint32_t imm_be;
  std::memcpy(&imm_be, imm, 4);
  v.set_imm_be(imm_be);
  const std::vector<uint8_t> expected = {1, 2, 3, 4, 0, 6, 7, 8, 9, 10, 11, 12};
  EXPECT_EQ(std::vector<uint8_t>(b.bytes.begin() + 12, b.bytes.begin() + 24), expected);
}

TEST(PacketView, PayloadAndPadArithmetic) {
  for (uint32_t payload = 0; payload <= 9; ++payload) {
    const uint32_t pad = (4 - payload % 4) % 4;
    Buffer b(0x04, payload);
    EXPECT_EQ(b.len, 12 + payload + pad);
    EXPECT_EQ(b.len % 4, 0u);
    PacketView v = b.view();
    v.set_bth(0x04, false, static_cast<uint8_t>(pad), 0xFFFF, 1, true, 0);
    EXPECT_EQ(v.pad(), pad);
    EXPECT_EQ(v.payload_len(), payload);
  }
}

TEST(PacketView, ValidLengthRejectsShortBuffers) {
  uint8_t buf[64] = {};
  PacketView(buf, 64).set_bth(0x13, false, 0, 0xFFFF, 1, true, 0);  // CmpSwap: 40 header bytes
  EXPECT_TRUE(PacketView(buf, 40).valid_length());
  EXPECT_FALSE(PacketView(buf, 39).valid_length());
  EXPECT_FALSE(PacketView(buf, 11).valid_length());
  PacketView(buf, 64).set_bth(0x04, false, 3, 0xFFFF, 1, true, 0);  // SEND Only with pad 3
  EXPECT_TRUE(PacketView(buf, 15).valid_length());
  EXPECT_FALSE(PacketView(buf, 14).valid_length());
}

// IBTA.md 5: 24-bit serial-number arithmetic.
TEST(Psn, DiffAndAddWrap) {
  EXPECT_EQ(psn_diff(0, 0xFFFFFF), 1);
  EXPECT_EQ(psn_diff(0xFFFFFF, 0), -1);
  EXPECT_EQ(psn_diff(0x10, 0x10), 0);
  EXPECT_EQ(psn_diff(0x7FFFFF + 5, 5), 0x7FFFFF);
  EXPECT_EQ(psn_diff(0x800000 + 5, 5), -0x800000);
  EXPECT_EQ(psn_add(0xFFFFFE, 3), 1u);
  EXPECT_EQ(psn_add(5, 0x1000000), 5u);
}

// IBTA.md 3a/3d: syndrome = type in bits 6-5, value in bits 4-0.
TEST(Aeth, Syndrome) {
  EXPECT_EQ(make_syndrome(AckType::kAck, kAckUnlimitedCredit), 0x1F);
  EXPECT_EQ(make_syndrome(AckType::kRnrNak, 14), 0x2E);
  EXPECT_EQ(make_syndrome(AckType::kNak, kNakRemoteAccessErr), 0x62);
  EXPECT_EQ(syndrome_type(0x61), AckType::kNak);
  EXPECT_EQ(syndrome_type(0x3F), AckType::kRnrNak);
  EXPECT_EQ(syndrome_type(0x1F), AckType::kAck);
  EXPECT_EQ(syndrome_value(0x64), kNakInvalidRdRequest);
}

}  // namespace
}  // namespace softrdma::wire
