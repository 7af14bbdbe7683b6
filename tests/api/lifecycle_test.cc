// Create/destroy loops through the native API: every object (context, PD, MR, completion channel, CQ on
// it, QPs of each type moved through their states, a QP on an SRQ, SRQ, AH), many times; the open fds
// and the heap bytes in use must come back to where they were (a leak of one object per round shows).
#include <gtest/gtest.h>

#include <vector>

#include "softrdma/softrdma.h"
#include "util/resources.h"

namespace softrdma {
namespace {

using testutil::expect_no_growth;

// One round: every object, used a little, destroyed in reverse order (the unique_ptrs' order).
void objects_round(Context& ctx, std::vector<uint8_t>& buf) {
  auto pd = ctx.alloc_pd();
  ASSERT_TRUE(pd);
  auto mr = (*pd)->reg_mr(buf.data(), buf.size(), kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic);
  ASSERT_TRUE(mr);
  auto ch = ctx.create_comp_channel();
  ASSERT_TRUE(ch);
  auto cq = ctx.create_cq(64, ch->get());
  ASSERT_TRUE(cq);
  ASSERT_TRUE((*cq)->req_notify());
  auto srq = (*pd)->create_srq(16, 1, 4);
  ASSERT_TRUE(srq);
  Sge s = (*mr)->sge(0, 64);
  ASSERT_TRUE((*srq)->post_recv(RecvWr{1, std::span(&s, 1)}));
  std::vector<std::unique_ptr<QueuePair>> qps;
  for (QpType t : {QpType::kRc, QpType::kUc, QpType::kUd, QpType::kRc}) {
    QpInit init{.type = t, .send_cq = cq->get(), .recv_cq = cq->get()};
    if (qps.size() == 3) init.srq = srq->get();
    auto qp = (*pd)->create_qp(init);
    ASSERT_TRUE(qp);
    QpAttr at;
    at.qp_state = QpState::kInit;
    at.qkey = 0x1234;
    at.qp_access_flags = kRemoteWrite | kRemoteRead;
    ASSERT_TRUE((*qp)->modify(at, kQpState | kQpPkeyIndex | kQpPort |
                                      (t == QpType::kUd ? kQpQkey : kQpAccessFlags)));
    if (!init.srq) {
      ASSERT_TRUE((*qp)->post_recv(RecvWr{2, std::span(&s, 1)}));  // flushed at destroy
    }
    at.qp_state = QpState::kRtr;
    at.path_mtu = Mtu::k1024;
    at.dest_qp_num = (*qp)->qpn();  // connected to itself
    at.ah_attr.dgid = ctx.gid();
    at.max_dest_rd_atomic = 1;
    at.min_rnr_timer = 1;
    const uint32_t rtr = t == QpType::kUd ? kQpState
                         : t == QpType::kUc
                             ? kQpState | kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn
                             : kQpState | kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn | kQpMaxDestRdAtomic |
                                   kQpMinRnrTimer;
    ASSERT_TRUE((*qp)->modify(at, rtr));
    at.qp_state = QpState::kRts;
    at.timeout = 14;
    at.retry_cnt = 7;
    at.rnr_retry = 7;
    at.max_rd_atomic = 1;
    const uint32_t rts = t == QpType::kRc ? kQpState | kQpSqPsn | kQpTimeout | kQpRetryCnt | kQpRnrRetry |
                                                kQpMaxQpRdAtomic
                                          : kQpState | kQpSqPsn;
    ASSERT_TRUE((*qp)->modify(at, rts));
    qps.push_back(std::move(*qp));
  }
  AhAttr ah_attr;
  ah_attr.dgid = ctx.gid();
  auto ah = (*pd)->create_ah(ah_attr);
  ASSERT_TRUE(ah);
  qps.clear();  // QPs before the SRQ and CQ they use
}


TEST(Lifecycle, EveryObjectInOneContextLeaksNothing) {
  auto ctx = Context::open("sr_lo");
  ASSERT_TRUE(ctx);
  std::vector<uint8_t> buf(1 << 16);
  expect_no_growth([&] { objects_round(**ctx, buf); }, 20, 500, 50, std::chrono::seconds(20));
}

TEST(Lifecycle, ContextsOpenAndCloseLeakNothing) {
  std::vector<uint8_t> buf(1 << 16);
  expect_no_growth(
      [&] {
        auto ctx = Context::open("sr_lo");
        ASSERT_TRUE(ctx);
        objects_round(**ctx, buf);
      },
      5, 100, 20, std::chrono::seconds(20));
}

}  // namespace
}  // namespace softrdma
