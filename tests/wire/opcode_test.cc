// The opcode table against independent sources: Wireshark's names and IBTA.md's table 1.
#include "wire/opcode.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>

#include "wire/headers.h"

namespace softrdma::wire {
namespace {

// `tshark -G values | grep infiniband.bth.opcode` (Wireshark 4.0.17), opcodes 0-23, 32-43, 100-101.
const std::map<int, std::string> kWiresharkNames = {
    {0, "Reliable Connection (RC) - SEND First"},
    {1, "Reliable Connection (RC) - SEND Middle"},
    {2, "Reliable Connection (RC) - SEND Last"},
    {3, "Reliable Connection (RC) - SEND Last with Immediate"},
    {4, "Reliable Connection (RC) - SEND Only"},
    {5, "Reliable Connection (RC) - SEND Only with Immediate"},
    {6, "Reliable Connection (RC) - RDMA WRITE First"},
    {7, "Reliable Connection (RC) - RDMA WRITE Middle"},
    {8, "Reliable Connection (RC) - RDMA WRITE Last"},
    {9, "Reliable Connection (RC) - RDMA WRITE Last with Immediate"},
    {10, "Reliable Connection (RC) - RDMA WRITE Only"},
    {11, "Reliable Connection (RC) - RDMA WRITE Only with Immediate"},
    {12, "Reliable Connection (RC) - RDMA READ Request"},
    {13, "Reliable Connection (RC) - RDMA READ response First"},
    {14, "Reliable Connection (RC) - RDMA READ response Middle"},
    {15, "Reliable Connection (RC) - RDMA READ response Last"},
    {16, "Reliable Connection (RC) - RDMA READ response Only"},
    {17, "Reliable Connection (RC) - Acknowledge"},
    {18, "Reliable Connection (RC) - ATOMIC Acknowledge"},
    {19, "Reliable Connection (RC) - CmpSwap"},
    {20, "Reliable Connection (RC) - FetchAdd"},
    {21, "Reliable Connection (RC) - Reserved"},
    {22, "Reliable Connection (RC) - SEND Last with Invalidate"},
    {23, "Reliable Connection (RC) - SEND Only with Invalidate"},
    {32, "Unreliable Connection (UC) - SEND First"},
    {33, "Unreliable Connection (UC) - SEND Middle"},
    {34, "Unreliable Connection (UC) - SEND Last"},
    {35, "Unreliable Connection (UC) - SEND Last with Immediate"},
    {36, "Unreliable Connection (UC) - SEND Only"},
    {37, "Unreliable Connection (UC) - SEND Only with Immediate"},
    {38, "Unreliable Connection (UC) - RDMA WRITE First"},
    {39, "Unreliable Connection (UC) - RDMA WRITE Middle"},
    {40, "Unreliable Connection (UC) - RDMA WRITE Last"},
    {41, "Unreliable Connection (UC) - RDMA WRITE Last with Immediate"},
    {42, "Unreliable Connection (UC) - RDMA WRITE Only"},
    {43, "Unreliable Connection (UC) - RDMA WRITE Only with Immediate"},
    {100, "Unreliable Datagram (UD) - SEND only"},
    {101, "Unreliable Datagram (UD) - SEND only with Immediate"},
};

// IBTA.md tables 1a-1c: header bytes, extension headers and position of every opcode softrdma knows.
struct Row {
  uint32_t hdr_len;
  uint32_t headers;  // kHas* bits
  uint32_t pos;      // kFirst / kMiddle / kLast / kOnly
};
const std::map<int, Row> kIbtaTable1 = {
    {0x00, {12, 0, kFirst}},
    {0x01, {12, 0, kMiddle}},
    {0x02, {12, 0, kLast}},
    {0x03, {16, kHasImmDt, kLast}},
    {0x04, {12, 0, kOnly}},
    {0x05, {16, kHasImmDt, kOnly}},
    {0x06, {28, kHasReth, kFirst}},
    {0x07, {12, 0, kMiddle}},
    {0x08, {12, 0, kLast}},
    {0x09, {16, kHasImmDt, kLast}},
    {0x0A, {28, kHasReth, kOnly}},
    {0x0B, {32, kHasReth | kHasImmDt, kOnly}},
    {0x0C, {28, kHasReth, kOnly}},
    {0x0D, {16, kHasAeth, kFirst}},
    {0x0E, {12, 0, kMiddle}},
    {0x0F, {16, kHasAeth, kLast}},
    {0x10, {16, kHasAeth, kOnly}},
    {0x11, {16, kHasAeth, kOnly}},
    {0x12, {24, kHasAeth | kHasAtomicAckEth, kOnly}},
    {0x13, {40, kHasAtomicEth, kOnly}},
    {0x14, {40, kHasAtomicEth, kOnly}},
    {0x16, {16, kHasIeth, kLast}},
    {0x17, {16, kHasIeth, kOnly}},
    {0x20, {12, 0, kFirst}},
    {0x21, {12, 0, kMiddle}},
    {0x22, {12, 0, kLast}},
    {0x23, {16, kHasImmDt, kLast}},
    {0x24, {12, 0, kOnly}},
    {0x25, {16, kHasImmDt, kOnly}},
    {0x26, {28, kHasReth, kFirst}},
    {0x27, {12, 0, kMiddle}},
    {0x28, {12, 0, kLast}},
    {0x29, {16, kHasImmDt, kLast}},
    {0x2A, {28, kHasReth, kOnly}},
    {0x2B, {32, kHasReth | kHasImmDt, kOnly}},
    {0x64, {20, kHasDeth, kOnly}},
    {0x65, {24, kHasDeth | kHasImmDt, kOnly}},
};
constexpr uint32_t kAllHeaders =
    kHasRdeth | kHasDeth | kHasReth | kHasAtomicEth | kHasAeth | kHasAtomicAckEth | kHasImmDt | kHasIeth;
constexpr uint32_t kAllPositions = kFirst | kMiddle | kLast | kOnly;

TEST(OpcodeTable, ValidOpcodesAreExactlyIbtaTable1) {
  for (int op = 0; op < 256; ++op) {
    EXPECT_EQ(info(static_cast<uint8_t>(op)).has(kValid), kIbtaTable1.contains(op)) << "opcode " << op;
  }
}

TEST(OpcodeTable, NamesMatchWireshark) {
  for (int op = 0; op < 256; ++op) {
    if (!info(static_cast<uint8_t>(op)).has(kValid)) continue;
    const auto it = kWiresharkNames.find(op);
    ASSERT_NE(it, kWiresharkNames.end()) << "opcode " << op << " has no Wireshark name";
    EXPECT_EQ(opcode_name(static_cast<uint8_t>(op)), it->second);
  }
}

TEST(OpcodeTable, HeadersLengthsAndPositionsMatchIbtaTable1) {
  for (const auto& [op, row] : kIbtaTable1) {
    const OpcodeInfo& i = info(static_cast<uint8_t>(op));
    EXPECT_EQ(i.hdr_len, row.hdr_len) << "opcode " << op;
    EXPECT_EQ(i.flags & kAllHeaders, row.headers) << "opcode " << op;
    EXPECT_EQ(i.flags & kAllPositions, row.pos) << "opcode " << op;
  }
}

// Extension headers follow the BTH in IBTA order (IBTA.md 1): DETH, RETH, AtomicETH, AETH, AtomicAckETH,
// ImmDt, IETH.
TEST(OpcodeTable, ExtensionHeaderOffsets) {
  EXPECT_EQ(info(0x0B).off(Hdr::kReth), 12);
  EXPECT_EQ(info(0x0B).off(Hdr::kImmDt), 28);
  EXPECT_EQ(info(0x12).off(Hdr::kAeth), 12);
  EXPECT_EQ(info(0x12).off(Hdr::kAtomicAckEth), 16);
  EXPECT_EQ(info(0x13).off(Hdr::kAtomicEth), 12);
  EXPECT_EQ(info(0x17).off(Hdr::kIeth), 12);
  EXPECT_EQ(info(0x65).off(Hdr::kDeth), 12);
  EXPECT_EQ(info(0x65).off(Hdr::kImmDt), 20);
  EXPECT_EQ(info(0x04).off(Hdr::kImmDt), 0);  // absent
}

TEST(OpcodeTable, TransportOfOpcode) {
  EXPECT_EQ(transport_of(0x11), Transport::kRc);
  EXPECT_EQ(transport_of(0x2A), Transport::kUc);
  EXPECT_EQ(transport_of(0x64), Transport::kUd);
  EXPECT_EQ(opcode(Transport::kUd, kOpSendOnlyImm), 0x65);
}

TEST(OpcodeTable, UnknownOpcodesAreInvalid) {
  for (int op : {0x15, 0x18, 0x1C, 0x1D, 0x2C, 0x40, 0x44, 0x60, 0x66, 0x80, 0x81, 0xA0, 0xE0, 0xFF}) {
    const auto o = static_cast<uint8_t>(op);
    EXPECT_FALSE(info(o).has(kValid)) << "opcode " << op;
    EXPECT_EQ(info(o).hdr_len, 0) << "opcode " << op;
    char expected[32];
    std::snprintf(expected, sizeof expected, "Unknown (0x%02x)", op);
    EXPECT_EQ(opcode_name(o), expected);
    uint8_t buf[64] = {o};
    EXPECT_FALSE(PacketView(buf, sizeof buf).valid_length()) << "opcode " << op;
  }
}

}  // namespace
}  // namespace softrdma::wire
