// Message sizes: 64 MiB WRITE and READ at the largest and the smallest path MTU, and a path MTU above the
// interface's MTU clamped to it (no packet ever exceeds it).
#include <gtest/gtest.h>

#include <chrono>

#include "transport/harness.h"
#include "util/sanitizer.h"

namespace softrdma::test {
namespace {

using wire::PacketView;

// Watches every frame: the largest payload and the number of frames.
struct Sizes {
  uint32_t max_payload = 0;
  uint64_t frames = 0;
  void attach(Harness& h) {
    h.net_.drop_if = [this](uint64_t, std::span<const uint8_t> f) {
      PacketView v(const_cast<uint8_t*>(f.data()), static_cast<uint32_t>(f.size() - wire::kIcrcLen));
      if (v.valid_length()) max_payload = std::max(max_payload, v.payload_len());
      ++frames;
      return false;
    };
  }
};

class BigMessage : public ::testing::TestWithParam<Mtu> {};

TEST_P(BigMessage, WriteAndRead64MiB) {
  const auto start = std::chrono::steady_clock::now();
  constexpr uint32_t kLen = 64u << 20;
  QpOptions o;
  o.mtu = GetParam();
  o.buf_size = kLen;
  o.max_wr = 4;
  Harness h({}, o);
  Sizes sz;
  sz.attach(h);
  const uint32_t mtu = mtu_bytes(GetParam());

  fill(h.a.buf, 0, kLen, 1);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, kLen, 1).remote(h.b, 0)), 0);
  std::vector<Wc> s;
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &s));
  EXPECT_EQ(s[0].status, WcStatus::kSuccess);
  EXPECT_TRUE(h.a.buf == h.b.buf);
  EXPECT_EQ(sz.max_payload, mtu);
  const uint64_t write_frames = sz.frames;
  EXPECT_GE(write_frames, kLen / mtu);
  EXPECT_EQ(h.a.counters.get(Counter::retransmits), 0u);

  fill(h.b.buf, 0, kLen, 2);
  std::fill(h.a.buf.begin(), h.a.buf.end(), 0);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaRead, 0, kLen, 2).remote(h.b, 0)), 0);
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &s));
  EXPECT_EQ(s[1].status, WcStatus::kSuccess);
  EXPECT_EQ(s[1].byte_len, kLen);
  EXPECT_TRUE(h.a.buf == h.b.buf);
  EXPECT_EQ(sz.max_payload, mtu);
  // One request per chunk of 64 responses (requester.cc kReadChunk), one response per MTU.
  EXPECT_EQ(sz.frames - write_frames, (kLen / mtu + 63) / 64 + kLen / mtu);
  EXPECT_EQ(h.a.counters.get(Counter::retransmits), 0u);
  EXPECT_EQ(h.a.qp->attr().qp_state, QpState::kRts);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10) * testutil::kSanitizerSlowdown);
}

INSTANTIATE_TEST_SUITE_P(Sizes, BigMessage, ::testing::Values(Mtu::k4096, Mtu::k256),
                         [](const auto& info) { return std::to_string(mtu_bytes(info.param)); });

// Path MTU 4096 on an interface of 1024: every packet (requests, READ responses, UD datagrams) stays
// within 1024 bytes of payload.
TEST(Sizes, PathMtuClampedToTheInterface) {
  QpOptions o;
  o.mtu = Mtu::k4096;
  o.active_mtu = 1024;
  o.buf_size = 1 << 20;
  Harness h({}, o);
  Sizes sz;
  sz.attach(h);
  fill(h.a.buf, 0, 100000, 3);
  fill(h.b.buf, 200000, 100000, 4);
  ASSERT_EQ(h.post_recv(h.b, 1, 500000, 8192), 0);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, 100000, 1).remote(h.b, 0)), 0);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaRead, 200000, 100000, 2).remote(h.b, 200000)), 0);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kSend, 0, 5000, 3)), 0);
  std::vector<Wc> s, r;
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 3, &s));
  ASSERT_TRUE(h.wait(h.b, h.b.rcq, 1, &r));
  for (const Wc& w : s) EXPECT_EQ(w.status, WcStatus::kSuccess);
  EXPECT_EQ(r[0].byte_len, 5000u);
  EXPECT_EQ(std::memcmp(h.a.buf.data(), h.b.buf.data(), 100000), 0);
  EXPECT_EQ(std::memcmp(h.a.buf.data() + 200000, h.b.buf.data() + 200000, 100000), 0);
  EXPECT_EQ(std::memcmp(h.a.buf.data(), h.b.buf.data() + 500000, 5000), 0);
  EXPECT_EQ(sz.max_payload, 1024u);
  EXPECT_GE(sz.frames, 98u + 98u + 5u);
  EXPECT_EQ(h.a.qp->attr().path_mtu, Mtu::k4096);  // what was asked is what query reports
}

TEST(Sizes, UdUsesTheInterfaceMtu) {
  QpOptions o;
  o.type = QpType::kUd;
  o.active_mtu = 1024;
  o.buf_size = 1 << 16;
  Harness h({}, o);
  Sizes sz;
  sz.attach(h);
  core::Ah* ah = *h.a.ctx->create_ah(h.a.pd, core::AhAttr{.dgid = h.b.ctx->local_addr()});
  ASSERT_EQ(h.post_recv(h.b, 1, 0, 4096), 0);
  fill(h.a.buf, 0, 1025, 5);
  for (uint32_t len : {1024u, 1025u}) {
    Wr w(h.a, WrOpcode::kSend, 0, len, len);
    w.wr.ah = ah;
    w.wr.remote_qpn = h.b.qp->qpn();
    w.wr.remote_qkey = 0x11111111;
    ASSERT_EQ(h.post_send(h.a, w), 0);
  }
  std::vector<Wc> s, r;
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 2, &s));
  ASSERT_TRUE(h.wait(h.b, h.b.rcq, 1, &r));
  for (const Wc& w : s) EXPECT_EQ(w.status, WcStatus::kSuccess);
  EXPECT_EQ(r[0].byte_len, 1024u + 40);
  EXPECT_EQ(std::memcmp(h.a.buf.data(), h.b.buf.data() + 40, 1024), 0);
  EXPECT_EQ(sz.frames, 1u);  // the 1025-byte datagram was not sent
  EXPECT_EQ(sz.max_payload, 1024u);
  h.a.ctx->destroy_ah(ah);
}

}  // namespace
}  // namespace softrdma::test
