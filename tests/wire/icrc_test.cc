// ICRC (IBTA.md 6): CRC-32 check value, the IBTA.md vectors, masking, and icrc_for_udp against the ICRC of
// complete IPv4/IPv6 packets built independently (tests/util build_frame), as Linux sends them.
#include "wire/icrc.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string_view>
#include <vector>

#include "util/pcap.h"
#include "wire/headers.h"
#include "wire/ibta_vectors.h"

namespace softrdma::wire {
namespace {

using testutil::build_frame;
using testutil::decode_roce;
using testutil::FrameOptions;
using testvec::from_hex;

Endpoint endpoint(const char* addr, uint16_t port) {
  Endpoint e;
  EXPECT_TRUE(Gid::parse(addr, &e.addr)) << addr;
  e.port = port;
  return e;
}

// BTH .. pad of a packet with `payload` bytes of data.
std::vector<uint8_t> make_bth_to_pad(uint8_t op, uint32_t payload) {
  const uint32_t pad = (-payload) & 3;
  std::vector<uint8_t> b(info(op).hdr_len + payload + pad);
  PacketView v(b.data(), static_cast<uint32_t>(b.size()));
  v.set_bth(op, false, static_cast<uint8_t>(pad), 0xFFFF, 0x11, true, 0x96550F);
  for (uint32_t k = 0; k < payload; ++k) v.payload()[k] = static_cast<uint8_t>(k ^ 0x5A);
  return b;
}

// UDP payload = BTH .. pad + ICRC placeholder.
std::vector<uint8_t> with_icrc_space(std::vector<uint8_t> b) {
  b.resize(b.size() + kIcrcLen, 0);
  return b;
}

// ICRC of a whole frame as a receiver of real traffic computes it.
uint32_t icrc_of_frame(const std::vector<uint8_t>& frame) {
  const auto p = decode_roce(frame, 4791);
  EXPECT_TRUE(p.has_value());
  return p ? icrc_of_ip_packet(p->ip_to_pad) : 0;
}

uint32_t crc_of(std::string_view s) { return crc32(0, s.data(), s.size()); }

TEST(Crc32, CheckValue) { EXPECT_EQ(crc_of("123456789"), 0xCBF43926u); }

TEST(Crc32, ContinuesLikeZlib) {
  EXPECT_EQ(crc32(crc_of("1234"), "56789", 5), 0xCBF43926u);
  EXPECT_EQ(crc32(0, "", 0), 0u);
}

// IBTA.md 6: rxe seeds its register with the value after 8 bytes of 0xFF.
TEST(Crc32, RxeSeedIsEightOnes) {
  const uint8_t ff[8] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
  EXPECT_EQ(crc32(0, ff, 8), ~testvec::kRxeSeed);
}

TEST(Icrc, IbtaVectorCap28) {
  const auto wire = from_hex(testvec::kCap28Wire);
  ASSERT_EQ(wire.size(), 48u);
  const auto input = from_hex(testvec::kCap28CrcInput);
  EXPECT_EQ(crc32(0, input.data(), input.size()), testvec::kCap28Icrc);
  EXPECT_EQ(icrc_of_ip_packet(std::span(wire).first(44)), testvec::kCap28Icrc);
  EXPECT_EQ(load_icrc(&wire[44]), testvec::kCap28Icrc);
  uint8_t stored[4];
  store_icrc(stored, testvec::kCap28Icrc);
  EXPECT_EQ(0, std::memcmp(stored, &wire[44], 4));  // least-significant byte first
}

// The same ACK, sent over a UDP socket: with ID 0 (as Linux sends it) the header changes, and only the
// reconstructed one matches.
TEST(Icrc, ForUdpIpv4MatchesBuiltFrames) {
  const Endpoint src = endpoint("198.18.0.1", 49458), dst = endpoint("198.18.0.2", 4791);
  for (uint8_t op : {0x04, 0x11, 0x0A, 0x64}) {
    for (uint32_t payload : {0u, 1u, 16u, 1023u, 1024u}) {
      if (payload && !info(op).has(kPayload)) continue;
      const auto pkt = make_bth_to_pad(op, payload);
      const uint32_t icrc = icrc_for_udp(src, dst, pkt);
      const auto udp = with_icrc_space(pkt);
      EXPECT_EQ(icrc, icrc_of_frame(build_frame(src, dst, udp))) << int{op} << " " << payload;
      // TOS, TTL and the header checksum are masked; the ID is not.
      EXPECT_EQ(icrc, icrc_of_frame(build_frame(src, dst, udp, {.tos = 0xB8, .ttl = 3})));
      EXPECT_NE(icrc, icrc_of_frame(build_frame(src, dst, udp, {.ip_id = 1})));
    }
  }
}

TEST(Icrc, ForUdpIpv6MatchesBuiltFrames) {
  const Endpoint src = endpoint("fe80::5054:ff:fe12:3401", 53368), dst = endpoint("2001:db8::2", 4791);
  for (uint32_t payload : {0u, 3u, 1024u}) {
    const auto pkt = make_bth_to_pad(0x04, payload);
    const uint32_t icrc = icrc_for_udp(src, dst, pkt);
    const auto udp = with_icrc_space(pkt);
    EXPECT_EQ(icrc, icrc_of_frame(build_frame(src, dst, udp)));
    // Traffic class, flow label and hop limit are masked (IBTA.md 6).
    EXPECT_EQ(icrc,
              icrc_of_frame(build_frame(src, dst, udp, {.tos = 0xFF, .ttl = 1, .flow_label = 0xABCDE})));
  }
}

// IPv6 has no external vector (IBTA.md: UNCONFIRMED by capture), so spell the pseudo header out by hand.
TEST(Icrc, ForUdpIpv6PseudoHeaderByHand) {
  const Endpoint src = endpoint("2001:db8::1", 0xC123), dst = endpoint("2001:db8::2", 4791);
  const auto pkt = make_bth_to_pad(0x04, 5);  // 12 + 5 + 3 pad = 20 bytes; UDP length 32
  std::vector<uint8_t> in(8, 0xFF);
  const auto v6 = from_hex(
      "6fffffff"
      "0020"
      "11"
      "ff");
  in.insert(in.end(), v6.begin(), v6.end());
  in.insert(in.end(), src.addr.raw.begin(), src.addr.raw.end());
  in.insert(in.end(), dst.addr.raw.begin(), dst.addr.raw.end());
  const auto udp = from_hex("c12312b70020ffff");
  in.insert(in.end(), udp.begin(), udp.end());
  in.insert(in.end(), pkt.begin(), pkt.end());
  in[8 + 40 + 8 + 4] = 0xFF;  // BTH byte 4
  EXPECT_EQ(icrc_for_udp(src, dst, pkt), crc32(0, in.data(), in.size()));
}

TEST(Icrc, BthByte4IsMaskedOtherBthBytesAreNot) {
  const Endpoint src = endpoint("198.18.0.1", 49458), dst = endpoint("198.18.0.2", 4791);
  auto pkt = make_bth_to_pad(0x04, 8);
  const uint32_t icrc = icrc_for_udp(src, dst, pkt);
  pkt[4] = 0xC0;  // FECN, BECN
  EXPECT_EQ(icrc_for_udp(src, dst, pkt), icrc);
  for (size_t i : {0, 1, 2, 3, 5, 7, 8, 11, 12, 19}) {
    auto changed = pkt;
    changed[i] ^= 0x01;
    EXPECT_NE(icrc_for_udp(src, dst, changed), icrc) << "byte " << i;
  }
}

TEST(Icrc, UdpPortsAndAddressesAreCovered) {
  const Endpoint src = endpoint("198.18.0.1", 49458), dst = endpoint("198.18.0.2", 4791);
  const auto pkt = make_bth_to_pad(0x11, 0);
  const uint32_t icrc = icrc_for_udp(src, dst, pkt);
  EXPECT_NE(icrc_for_udp(endpoint("198.18.0.1", 49459), dst, pkt), icrc);
  EXPECT_NE(icrc_for_udp(src, endpoint("198.18.0.2", 4792), pkt), icrc);
  EXPECT_NE(icrc_for_udp(endpoint("198.18.0.3", 49458), dst, pkt), icrc);
  EXPECT_NE(icrc_for_udp(dst, src, pkt), icrc);
}

// Any split into segments, including splits inside the BTH and empty segments, gives the same ICRC.
TEST(Icrc, SegmentsEqualContiguous) {
  const Endpoint src = endpoint("198.18.0.1", 49458), dst = endpoint("198.18.0.2", 4791);
  const auto pkt = make_bth_to_pad(0x0A, 37);  // RETH + 37 bytes + pad 3
  const std::span<const uint8_t> all(pkt);
  const uint32_t icrc = icrc_for_udp(src, dst, all);
  for (size_t a = 0; a <= pkt.size(); ++a) {
    for (size_t b = a; b <= pkt.size(); b += 5) {
      const std::span<const uint8_t> segs[] = {{}, all.first(a), all.subspan(a, b - a), all.subspan(b), {}};
      ASSERT_EQ(icrc_for_udp(src, dst, segs), icrc) << a << " " << b;
    }
  }
}

// icrc_in_place equals icrc_for_udp for IPv4 and IPv6, any IPv4 ID, many lengths and endpoints (more than
// its per-thread cache holds, so entries are replaced and found again), and leaves the buffer as it was.
TEST(Icrc, InPlaceEqualsForUdp) {
  const Endpoint v4[] = {endpoint("198.18.0.1", 49458), endpoint("198.18.0.2", 4791),
                         endpoint("127.0.0.1", 4791), endpoint("10.1.2.3", 50000),
                         endpoint("198.18.0.1", 49459)};
  const Endpoint v6[] = {endpoint("fe80::1", 49458), endpoint("2001:db8::2", 4791), endpoint("::1", 4791)};
  const uint32_t payloads[] = {0, 1, 8, 37, 1024, 4096};
  const uint16_t ids[] = {0, 1, 2, 61, 63, 0x8001, 0xFFFF};
  for (int round = 0; round < 2; ++round) {
    for (uint32_t payload : payloads) {
      for (const uint8_t op : {uint8_t{0x0A}, uint8_t{0x11}}) {
        auto pkt = make_bth_to_pad(op, payload);
        pkt[4] = 0x3C;  // FECN/BECN/reserved bits set: masked for the ICRC, and put back after
        const std::vector<uint8_t> before = pkt;
        for (const Endpoint& a : v4) {
          for (const Endpoint& b : v4) {
            for (uint16_t id : ids) {
              SCOPED_TRACE(testing::Message() << payload << " op " << int{op} << " id " << id);
              EXPECT_EQ(icrc_in_place(a, b, std::span<uint8_t>(pkt), id),
                        icrc_for_udp(a, b, std::span<const uint8_t>(before), id));
              ASSERT_EQ(pkt, before);
            }
          }
        }
        for (const Endpoint& a : v6)
          for (const Endpoint& b : v6)
            EXPECT_EQ(icrc_in_place(a, b, std::span<uint8_t>(pkt)),
                      icrc_for_udp(a, b, std::span<const uint8_t>(before)));
      }
    }
  }
}

// The in-place check finds the ID a packet was sent with, the hint's or another, and refuses a corrupt one.
TEST(Icrc, InPlaceCheckFindsTheId) {
  const Endpoint src = endpoint("198.18.0.1", 49458), dst = endpoint("198.18.0.2", 4791);
  auto pkt = make_bth_to_pad(0x0A, 1024);
  for (uint16_t id : {0, 5, 63}) {
    const uint32_t icrc = icrc_for_udp(src, dst, std::span<const uint8_t>(pkt), id);
    EXPECT_EQ(icrc_check_any_id(src, dst, std::span<uint8_t>(pkt), icrc, 5, 63), id);
    EXPECT_EQ(icrc_check_any_id(src, dst, std::span<uint8_t>(pkt), icrc, 0, 63), id);
    EXPECT_EQ(icrc_check_any_id(src, dst, std::span<uint8_t>(pkt), icrc, 7, 63), id);
    pkt[100] ^= 1;
    EXPECT_EQ(icrc_check_any_id(src, dst, std::span<uint8_t>(pkt), icrc, 5, 63), -1);
    pkt[100] ^= 1;
  }
  // An ID past max_id is refused even when it is the hint.
  const uint32_t icrc = icrc_for_udp(src, dst, std::span<const uint8_t>(pkt), 64);
  EXPECT_EQ(icrc_check_any_id(src, dst, std::span<uint8_t>(pkt), icrc, 64, 63), -1);
}

// Any of the 65,536 IDs is found when max_id allows it (as rxe numbers its packets), at lengths of every
// residue the per-length table is kept by, and a packet with a bit flipped never passes as its own ID.
TEST(Icrc, AnyIdIsSolvedFor) {
  const Endpoint src = endpoint("198.18.0.1", 49458), dst = endpoint("198.18.0.2", 4791);
  int refused = 0, flipped = 0;
  for (uint32_t payload : {0u, 4u, 100u, 117u, 1024u, 1029u, 4096u}) {
    auto pkt = make_bth_to_pad(0x0A, payload);
    for (uint32_t id : {1u, 63u, 64u, 0x06DAu, 0x8000u, 0xA967u, 0xFFFFu}) {
      SCOPED_TRACE(testing::Message() << "payload " << payload << " id " << id);
      const auto id16 = static_cast<uint16_t>(id);
      const uint32_t icrc = icrc_for_udp(src, dst, std::span<const uint8_t>(pkt), id16);
      EXPECT_EQ(icrc_check_any_id(src, dst, std::span<const uint8_t>(pkt), icrc, 0xFFFF),
                static_cast<int>(id));
      EXPECT_EQ(icrc_check_any_id(src, dst, std::span<uint8_t>(pkt), icrc, 0, 0xFFFF), static_cast<int>(id));
      EXPECT_EQ(icrc_check_any_id(src, dst, std::span<const uint8_t>(pkt), icrc, 63),
                id <= 63 ? static_cast<int>(id) : -1);
      EXPECT_EQ(icrc_check_any_id(src, dst, std::span<const uint8_t>(pkt), icrc, id16 - 1), -1);
      for (size_t at : {size_t{2}, size_t{9}, pkt.size() - 1}) {
        pkt[at] ^= 0x10;
        const int got = icrc_check_any_id(src, dst, std::span<const uint8_t>(pkt), icrc, 0xFFFF);
        EXPECT_NE(got, static_cast<int>(id));
        refused += got < 0;
        ++flipped;
        pkt[at] ^= 0x10;
      }
    }
  }
  // A corrupt packet passes as some other ID with odds of 2^-16: none of these.
  EXPECT_EQ(refused, flipped);
}

}  // namespace
}  // namespace softrdma::wire
