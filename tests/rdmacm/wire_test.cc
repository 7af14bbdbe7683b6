// The handshake's messages (src/abi/rdmacm/wire.h): every field round-trips, byte order is big-endian,
// a stream split anywhere yields the same messages, and malformed input is refused.
#include "abi/rdmacm/wire.h"

#include <gtest/gtest.h>

#include <cstring>

namespace softrdma::rdmacm::wire {
namespace {

Conn sample() {
  Conn c{};
  c.qpn = 0x123456;
  c.psn = 0xabcdef;
  for (int i = 0; i < 16; ++i) c.gid[i] = static_cast<uint8_t>(0xf0 + i);
  c.mtu = IBV_MTU_4096;
  c.responder_resources = 16;
  c.initiator_depth = 8;
  c.flow_control = 1;
  c.retry_count = 7;
  c.rnr_retry_count = 6;
  c.srq = 1;
  c.status = 2;
  c.qkey = 0x01234567;
  c.private_data_len = kRepPrivateData;
  for (int i = 0; i < kRepPrivateData; ++i) c.private_data[i] = static_cast<uint8_t>(i);
  return c;
}

TEST(CmWire, ConnRoundTripsEveryField) {
  const Conn c = sample();
  std::string buf = encode(Type::kRep, c);
  bool bad = true;
  auto m = decode(&buf, &bad);
  ASSERT_TRUE(m);
  EXPECT_FALSE(bad);
  EXPECT_TRUE(buf.empty());
  EXPECT_EQ(m->type, Type::kRep);
  const Conn& d = m->conn;
  EXPECT_EQ(d.qpn, c.qpn);
  EXPECT_EQ(d.psn, c.psn);
  EXPECT_EQ(memcmp(d.gid, c.gid, 16), 0);
  EXPECT_EQ(d.mtu, c.mtu);
  EXPECT_EQ(d.responder_resources, c.responder_resources);
  EXPECT_EQ(d.initiator_depth, c.initiator_depth);
  EXPECT_EQ(d.flow_control, c.flow_control);
  EXPECT_EQ(d.retry_count, c.retry_count);
  EXPECT_EQ(d.rnr_retry_count, c.rnr_retry_count);
  EXPECT_EQ(d.srq, c.srq);
  EXPECT_EQ(d.status, c.status);
  EXPECT_EQ(d.qkey, c.qkey);
  ASSERT_EQ(d.private_data_len, c.private_data_len);
  EXPECT_EQ(memcmp(d.private_data, c.private_data, c.private_data_len), 0);
}

TEST(CmWire, HeaderAndFieldsAreBigEndian) {
  std::string buf = encode(Type::kReq, sample());
  ASSERT_GE(buf.size(), kHeaderSize + 8);
  const auto* b = reinterpret_cast<const uint8_t*>(buf.data());
  EXPECT_EQ(memcmp(b, "SRCM", 4), 0);
  EXPECT_EQ(b[4], kVersion);
  EXPECT_EQ(b[5], static_cast<uint8_t>(Type::kReq));
  EXPECT_EQ((b[6] << 8 | b[7]) + kHeaderSize, buf.size());
  EXPECT_EQ(b[8], 0x00);  // qpn 0x00123456
  EXPECT_EQ(b[9], 0x12);
  EXPECT_EQ(b[11], 0x56);
}

TEST(CmWire, RejAndBodilessMessagesRoundTrip) {
  Rej r{};
  r.reason = kRejConsumerDefined;
  r.private_data_len = kRejPrivateData;
  memset(r.private_data, 0x5a, kRejPrivateData);
  std::string buf = encode(r) + encode(Type::kRtu) + encode(Type::kDreq);
  bool bad = false;
  auto m1 = decode(&buf, &bad);
  auto m2 = decode(&buf, &bad);
  auto m3 = decode(&buf, &bad);
  ASSERT_TRUE(m1 && m2 && m3);
  EXPECT_EQ(m1->type, Type::kRej);
  EXPECT_EQ(m1->rej.reason, kRejConsumerDefined);
  ASSERT_EQ(m1->rej.private_data_len, kRejPrivateData);
  EXPECT_EQ(m1->rej.private_data[kRejPrivateData - 1], 0x5a);
  EXPECT_EQ(m2->type, Type::kRtu);
  EXPECT_EQ(m3->type, Type::kDreq);
  EXPECT_FALSE(decode(&buf, &bad));
  EXPECT_FALSE(bad);
}

TEST(CmWire, AStreamSplitAnywhereGivesTheSameMessages) {
  const std::string whole = encode(Type::kReq, sample()) + encode(Type::kRtu);
  for (size_t cut = 0; cut <= whole.size(); ++cut) {
    std::string buf = whole.substr(0, cut);
    bool bad = false;
    int got = 0;
    while (decode(&buf, &bad)) ++got;
    ASSERT_FALSE(bad) << cut;
    buf += whole.substr(cut);
    while (decode(&buf, &bad)) ++got;
    ASSERT_FALSE(bad) << cut;
    EXPECT_EQ(got, 2) << cut;
    EXPECT_TRUE(buf.empty()) << cut;
  }
}

TEST(CmWire, MalformedInputIsRefused) {
  bool bad = false;
  std::string wrong_magic = encode(Type::kRtu);
  wrong_magic[0] = 'X';
  EXPECT_FALSE(decode(&wrong_magic, &bad));
  EXPECT_TRUE(bad);

  std::string wrong_type = encode(Type::kRtu);
  wrong_type[5] = 42;
  EXPECT_FALSE(decode(&wrong_type, &bad));
  EXPECT_TRUE(bad);

  // A private-data length beyond the body.
  std::string lying = encode(Type::kReq, sample());
  lying[kHeaderSize + 4 + 4 + 16 + 8 + 4] = static_cast<char>(250);  // qpn, psn, gid, 8 bytes, qkey
  EXPECT_FALSE(decode(&lying, &bad));
  EXPECT_TRUE(bad);

  // Bytes left over in a body.
  std::string rtu = encode(Type::kRtu);
  rtu[7] = 1;
  rtu.push_back('z');
  EXPECT_FALSE(decode(&rtu, &bad));
  EXPECT_TRUE(bad);
}

}  // namespace
}  // namespace softrdma::rdmacm::wire
