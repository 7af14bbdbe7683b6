// The capture helpers in tests/util: pcap writer/reader round trip and the RoCEv2 frame decoder.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "util/pcap.h"

namespace softrdma::testutil {
namespace {

wire::Endpoint endpoint(const char* addr, uint16_t port) {
  wire::Endpoint e;
  EXPECT_TRUE(wire::Gid::parse(addr, &e.addr));
  e.port = port;
  return e;
}

std::string temp_path(const char* name) {
  return ::testing::TempDir() + name + std::to_string(::getpid()) + ".pcap";
}

TEST(Pcap, WriteThenReadRoundTrips) {
  const std::string path = temp_path("pcap_roundtrip");
  const std::vector<std::vector<uint8_t>> frames = {{1, 2, 3}, std::vector<uint8_t>(1500, 0x42), {}};
  PcapWriter w;
  ASSERT_TRUE(w.open(path));
  for (size_t i = 0; i < frames.size(); ++i)
    ASSERT_TRUE(w.write(frames[i], 1'700'000'000'123'456'000 + i * 1000));
  ASSERT_TRUE(w.close());

  std::string error;
  const auto file = read_pcap(path, &error);
  std::remove(path.c_str());
  ASSERT_TRUE(file.has_value()) << error;
  EXPECT_EQ(file->link_type, kLinkTypeEthernet);
  ASSERT_EQ(file->frames.size(), frames.size());
  for (size_t i = 0; i < frames.size(); ++i) {
    EXPECT_EQ(file->frames[i].data, frames[i]);
    EXPECT_EQ(file->frames[i].orig_len, frames[i].size());
    EXPECT_EQ(file->frames[i].ts_ns, 1'700'000'000'123'456'000 + i * 1000);
  }
}

TEST(Pcap, WriterTruncatesToSnaplen) {
  const std::string path = temp_path("pcap_snaplen");
  PcapWriter w;
  ASSERT_TRUE(w.open(path, kLinkTypeEthernet, 64));
  ASSERT_TRUE(w.write(std::vector<uint8_t>(100, 7), 0));
  ASSERT_TRUE(w.close());
  const auto file = read_pcap(path);
  std::remove(path.c_str());
  ASSERT_TRUE(file.has_value());
  ASSERT_EQ(file->frames.size(), 1u);
  EXPECT_EQ(file->frames[0].data.size(), 64u);
  EXPECT_EQ(file->frames[0].orig_len, 100u);
}

TEST(Pcap, ReadErrors) {
  std::string error;
  EXPECT_FALSE(read_pcap("/nonexistent/x.pcap", &error).has_value());
  EXPECT_NE(error.find("cannot open"), std::string::npos);
  const std::string path = temp_path("pcap_bad");
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fputs("this is not a pcap file at all", f);
  std::fclose(f);
  EXPECT_FALSE(read_pcap(path, &error).has_value());
  std::remove(path.c_str());
  EXPECT_NE(error.find("not a classic pcap"), std::string::npos);
}

TEST(DecodeRoce, Ipv4WithVlanAndEthernetPadding) {
  const auto src = endpoint("10.0.0.1", 50000), dst = endpoint("10.0.0.2", 4791);
  const std::vector<uint8_t> udp_payload = {0x11, 0,    0xFF, 0xFF, 0, 0, 0, 1, 0, 0, 0, 2,  // BTH
                                            0x1F, 0,    0,    1,                             // AETH
                                            0xDE, 0xAD, 0xBE, 0xEF};                         // ICRC
  auto frame = build_frame(src, dst, udp_payload, {.vlan = 0x0123});
  frame.resize(frame.size() + 6, 0);  // link padding after the IP packet
  const auto p = decode_roce(frame);
  ASSERT_TRUE(p.has_value());
  EXPECT_FALSE(p->ipv6);
  EXPECT_EQ(p->ip_header.size(), 20u);
  EXPECT_EQ(p->ip_header.data(), frame.data() + 18);
  EXPECT_EQ(p->ip_to_pad.size(), 20u + 8 + 16);
  EXPECT_EQ(p->src, src);
  EXPECT_EQ(p->dst, dst);
  EXPECT_EQ(std::vector<uint8_t>(p->bth_to_pad.begin(), p->bth_to_pad.end()),
            std::vector<uint8_t>(udp_payload.begin(), udp_payload.end() - 4));
  EXPECT_EQ(std::vector<uint8_t>(p->icrc.begin(), p->icrc.end()),
            std::vector<uint8_t>({0xDE, 0xAD, 0xBE, 0xEF}));
}

TEST(DecodeRoce, Ipv6AndOtherPorts) {
  const auto src = endpoint("2001:db8::1", 50000), dst = endpoint("2001:db8::2", 18515);
  const std::vector<uint8_t> udp_payload(12 + 4 + 4, 0);
  const auto frame = build_frame(src, dst, udp_payload);
  EXPECT_FALSE(decode_roce(frame).has_value());  // not port 4791
  const auto p = decode_roce(frame, 18515);
  ASSERT_TRUE(p.has_value());
  EXPECT_TRUE(p->ipv6);
  EXPECT_EQ(p->ip_header.size(), 40u);
  EXPECT_EQ(p->src, src);
  EXPECT_EQ(p->dst, dst);
  EXPECT_EQ(p->bth_to_pad.size(), 16u);
}

TEST(DecodeRoce, RejectsMalformedFrames) {
  const auto src = endpoint("10.0.0.1", 50000), dst = endpoint("10.0.0.2", 4791);
  const auto good = build_frame(src, dst, std::vector<uint8_t>(20, 0));
  ASSERT_TRUE(decode_roce(good).has_value());
  auto truncated = good;
  truncated.resize(good.size() - 1);
  EXPECT_FALSE(decode_roce(truncated).has_value());
  auto fragment = good;
  fragment[14 + 6] |= 0x20;  // MF
  EXPECT_FALSE(decode_roce(fragment).has_value());
  auto tcp = good;
  tcp[14 + 9] = 6;
  EXPECT_FALSE(decode_roce(tcp).has_value());
  auto arp = good;
  arp[12] = 0x08;
  arp[13] = 0x06;
  EXPECT_FALSE(decode_roce(arp).has_value());
  const auto too_short = build_frame(src, dst, std::vector<uint8_t>(15, 0));  // < BTH + ICRC
  EXPECT_FALSE(decode_roce(too_short).has_value());
  EXPECT_FALSE(decode_roce(std::span(good).first(10)).has_value());
}

}  // namespace
}  // namespace softrdma::testutil
