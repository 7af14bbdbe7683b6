// Scale: 10,000 RC QPs in one process (5,000 connected pairs over sr_lo), each moving data, then torn
// down; the UDP sockets they needed (one per 256 QPs) go with them.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "softrdma/connect.h"
#include "softrdma/softrdma.h"
#include "util/resources.h"
#include "util/wr.h"

namespace softrdma {
namespace {

using testutil::open_fds;

TEST(Scale, TenThousandQpsInOneProcess) {
  constexpr size_t kPairs = 5000;
  constexpr uint32_t kChunk = 256;  // bytes each pair moves
  const size_t fds_before = open_fds();
  {
    auto ctx = Context::open("sr_lo");
    ASSERT_TRUE(ctx);
    auto pd = *(*ctx)->alloc_pd();
    auto cq = *(*ctx)->create_cq(4096);
    std::vector<uint8_t> src(kPairs * kChunk), dst(kPairs * kChunk, 0);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + (i >> 8));
    auto src_mr = *pd->reg_mr(src.data(), src.size(), kLocalWrite);
    auto dst_mr = *pd->reg_mr(dst.data(), dst.size(), kLocalWrite | kRemoteWrite);

    std::vector<std::unique_ptr<QueuePair>> qps;
    qps.reserve(2 * kPairs);
    QpInit init;
    init.send_cq = init.recv_cq = cq.get();
    init.cap.max_send_wr = init.cap.max_recv_wr = 1;
    for (size_t i = 0; i < 2 * kPairs; ++i) {
      auto qp = pd->create_qp(init);
      ASSERT_TRUE(qp) << "QP " << i << ": " << std::strerror(qp.error());
      qps.push_back(std::move(*qp));
    }
    for (size_t p = 0; p < kPairs; ++p) {
      QueuePair& a = *qps[2 * p];
      QueuePair& b = *qps[2 * p + 1];
      const PeerInfo ia = local_info(**ctx, a, nullptr), ib = local_info(**ctx, b, nullptr);
      ASSERT_TRUE(connect_qp(**ctx, a, ia, ib));
      ASSERT_TRUE(connect_qp(**ctx, b, ib, ia));
    }

    // One WRITE per pair, in flight together (bounded by the CQ), each to its own slice of `dst`.
    const auto t0 = std::chrono::steady_clock::now();
    size_t posted = 0, done = 0;
    Wc wc[64];
    while (done < kPairs) {
      while (posted < kPairs && posted - done < 2048) {
        Sge s = src_mr->sge(posted * kChunk, kChunk);
        const uint64_t to = reinterpret_cast<uint64_t>(dst.data()) + posted * kChunk;
        ASSERT_TRUE(qps[2 * posted]->post_send(testutil::signaled_write(s, to, dst_mr->rkey(), posted)));
        ++posted;
      }
      const int n = cq->poll(wc);
      for (int i = 0; i < n; ++i) ASSERT_EQ(wc[i].status, WcStatus::kSuccess) << "pair " << wc[i].wr_id;
      done += static_cast<size_t>(n);
      ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60));
    }
    EXPECT_EQ(std::memcmp(src.data(), dst.data(), src.size()), 0);
    EXPECT_GT(open_fds(), fds_before + 2 * kPairs / 256) << "a socket per 256 QPs";
  }
  EXPECT_EQ(open_fds(), fds_before) << "every socket closed with the context";
}

}  // namespace
}  // namespace softrdma
