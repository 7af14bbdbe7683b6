// The reference capture of Linux Soft-RoCE (tests/data/rxe-linux-6.1.README.md): every RoCEv2 packet
// parses, its ICRC recomputes, and its headers re-encode byte for byte from the parsed fields.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <vector>

#include "util/pcap.h"
#include "wire/headers.h"
#include "wire/ibta_vectors.h"
#include "wire/icrc.h"

namespace softrdma::wire {
namespace {

using testutil::RocePacket;

constexpr size_t kRocePackets = 270;

// Opcode counts from the capture's README.
const std::map<int, int> kReadmeCounts = {
    {0, 7},  {1, 21}, {2, 7},   {4, 12},  {6, 13}, {7, 13}, {8, 13}, {10, 15}, {12, 13}, {13, 5}, {14, 15},
    {15, 5}, {16, 8}, {17, 57}, {18, 10}, {19, 5}, {20, 5}, {32, 6}, {33, 6},  {34, 6},  {42, 5}, {100, 23},
};

class ReferenceCapture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string error;
    auto file = testutil::read_pcap(SOFTRDMA_REFERENCE_PCAP, &error);
    ASSERT_TRUE(file.has_value()) << error;
    ASSERT_EQ(file->link_type, testutil::kLinkTypeEthernet);
    file_ = new testutil::PcapFile(std::move(*file));
    for (size_t i = 0; i < file_->frames.size(); ++i) {
      if (auto p = testutil::decode_roce(file_->frames[i].data)) packets_.push_back({i + 1, *p});
    }
  }
  static void TearDownTestSuite() {
    packets_.clear();
    delete file_;
    file_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(file_, nullptr); }

  struct Numbered {
    size_t frame;  // 1-based, as "CAP n" in IBTA.md
    RocePacket pkt;
  };
  static std::vector<uint8_t> bytes(std::span<const uint8_t> s) { return {s.begin(), s.end()}; }

  static inline testutil::PcapFile* file_ = nullptr;
  static inline std::vector<Numbered> packets_;
};

// Rebuilds BTH .. pad from the parsed fields only, through the setters.
std::vector<uint8_t> reencode(const PacketView& in) {
  std::vector<uint8_t> out(in.length(), 0);
  PacketView v(out.data(), in.length());
  v.set_bth(in.opcode(), in.se(), in.pad(), in.pkey(), in.dest_qpn(), in.ack_req(), in.psn());
  const OpcodeInfo& i = in.info();
  if (i.has(kHasReth)) v.set_reth(in.reth_va(), in.reth_rkey(), in.reth_len());
  if (i.has(kHasAeth)) v.set_aeth(in.aeth_syndrome(), in.aeth_msn());
  if (i.has(kHasAtomicEth)) {
    v.set_atomic_eth(in.atomic_va(), in.atomic_rkey(), in.atomic_swap_add(), in.atomic_compare());
  }
  if (i.has(kHasAtomicAckEth)) v.set_atomic_ack_orig(in.atomic_ack_orig());
  if (i.has(kHasImmDt)) v.set_imm_be(in.imm_be());
  if (i.has(kHasIeth)) v.set_ieth_rkey(in.ieth_rkey());
  if (i.has(kHasDeth)) v.set_deth(in.deth_qkey(), in.deth_src_qpn());
  std::memcpy(v.payload(), in.payload(), in.payload_len());
  return out;
}

TEST_F(ReferenceCapture, FindsEveryRocePacket) { EXPECT_EQ(packets_.size(), kRocePackets); }

TEST_F(ReferenceCapture, EveryPacketParses) {
  for (auto& [frame, p] : packets_) {
    auto b = bytes(p.bth_to_pad);
    const PacketView v(b.data(), static_cast<uint32_t>(b.size()));
    ASSERT_TRUE(v.valid_length()) << "CAP " << frame;
    EXPECT_TRUE(v.info().has(kValid)) << "CAP " << frame;
    EXPECT_EQ(v.tver(), 0) << "CAP " << frame;
    EXPECT_EQ(v.pkey(), kDefaultPkey) << "CAP " << frame;
    EXPECT_EQ(v.info().hdr_len + v.payload_len() + v.pad(), b.size()) << "CAP " << frame;
    EXPECT_FALSE(p.ipv6);
  }
}

TEST_F(ReferenceCapture, IcrcRecomputesForEveryPacket) {
  for (const auto& [frame, p] : packets_) {
    EXPECT_EQ(icrc_of_ip_packet(p.ip_to_pad), load_icrc(p.icrc.data())) << "CAP " << frame;
  }
}

TEST_F(ReferenceCapture, EveryPacketReencodesByteForByte) {
  for (const auto& [frame, p] : packets_) {
    auto original = bytes(p.bth_to_pad);
    const PacketView in(original.data(), static_cast<uint32_t>(original.size()));
    ASSERT_TRUE(in.valid_length()) << "CAP " << frame;
    EXPECT_EQ(reencode(in), original) << "CAP " << frame << ": " << opcode_name(in.opcode());
  }
}

// The capture's IP IDs are non-zero, so icrc_for_udp (ID 0) must differ from the wire ICRC; with the ID set
// to 0 in the captured header, it must match (TTL, TOS and the now stale checksum are masked).
TEST_F(ReferenceCapture, IcrcForUdpMatchesCapturedHeaderWithIdZero) {
  for (const auto& [frame, p] : packets_) {
    const uint32_t for_udp = icrc_for_udp(p.src, p.dst, p.bth_to_pad);
    auto ip = bytes(p.ip_to_pad);
    ASSERT_NE(load_be16(&ip[4]), 0) << "CAP " << frame;
    EXPECT_NE(for_udp, load_icrc(p.icrc.data())) << "CAP " << frame;
    store_be16(&ip[4], 0);
    EXPECT_EQ(for_udp, icrc_of_ip_packet(ip)) << "CAP " << frame;
  }
}

// What softrdma receives of rxe's packets at the standard port: the UDP payload, not the IP header. The
// ICRC check finds each packet's IP ID (rxe numbers them per destination, none of them 0..63) from the
// ICRC alone, and refuses them where only softrdma's own IDs (0..63) are allowed.
TEST_F(ReferenceCapture, TheIcrcCheckFindsRxesIpIds) {
  for (const auto& [frame, p] : packets_) {
    const uint16_t id = load_be16(&p.ip_to_pad[4]);
    const uint32_t icrc = load_icrc(p.icrc.data());
    EXPECT_EQ(icrc_check_any_id(p.src, p.dst, p.bth_to_pad, icrc, 0xFFFF), id) << "CAP " << frame;
    auto b = bytes(p.bth_to_pad);
    EXPECT_EQ(icrc_check_any_id(p.src, p.dst, std::span<uint8_t>(b), icrc, 0, 0xFFFF), id) << "CAP " << frame;
    EXPECT_EQ(b, bytes(p.bth_to_pad)) << "CAP " << frame;
    EXPECT_EQ(icrc_check_any_id(p.src, p.dst, p.bth_to_pad, icrc, 63), id <= 63 ? int{id} : -1)
        << "CAP " << frame;
  }
}

TEST_F(ReferenceCapture, IbtaVectorCap28) {
  const auto& frame = file_->frames.at(27).data;
  const auto p = testutil::decode_roce(frame);
  ASSERT_TRUE(p.has_value());
  std::vector<uint8_t> wire = bytes(p->ip_to_pad);
  wire.insert(wire.end(), p->icrc.begin(), p->icrc.end());
  EXPECT_EQ(wire, testvec::from_hex(testvec::kCap28Wire));
}

TEST_F(ReferenceCapture, IbtaVectorCap537) {
  const auto p = testutil::decode_roce(file_->frames.at(testvec::kCap537Frame - 1).data);
  ASSERT_TRUE(p.has_value());
  auto b = bytes(p->bth_to_pad);
  const PacketView v(b.data(), static_cast<uint32_t>(b.size()));
  EXPECT_EQ(v.opcode(), opcode(Transport::kRc, kOpSendOnly));
  EXPECT_EQ(v.payload_len(), 16u);
  EXPECT_EQ(icrc_of_ip_packet(p->ip_to_pad), testvec::kCap537Icrc);
  const std::vector<uint8_t> wire_icrc = {0xB0, 0xA2, 0xCF, 0x00};
  EXPECT_EQ(bytes(p->icrc), wire_icrc);
}

TEST_F(ReferenceCapture, OpcodeCountsMatchReadme) {
  std::map<int, int> counts;
  for (const auto& [frame, p] : packets_) ++counts[p.bth_to_pad[0]];
  EXPECT_EQ(counts, kReadmeCounts);
}

}  // namespace
}  // namespace softrdma::wire
