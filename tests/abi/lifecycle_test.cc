// Create/destroy loops through the drop-in libibverbs.so.1, as an rdma-core program calls it: device list,
// context, PD, MR, completion channel, CQ on it, RC/UC/UD QPs moved to RTS, a QP on an SRQ, SRQ, AH, many
// times; the open fds and the heap bytes in use must come back to where they were.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <cstring>
#include <vector>

#include "util/resources.h"

namespace {

using softrdma::testutil::expect_no_growth;

ibv_context* open_lo() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ibv_context* ctx = nullptr;
  for (int i = 0; list && i < n; ++i)
    if (std::strcmp(ibv_get_device_name(list[i]), "sr_lo") == 0) ctx = ibv_open_device(list[i]);
  if (list) ibv_free_device_list(list);
  return ctx;
}

void to_rts(ibv_context* ctx, ibv_qp* qp, ibv_qp_type type) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = 0x1234;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                      (type == IBV_QPT_UD ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS)),
            0);
  ibv_gid gid;
  ASSERT_EQ(ibv_query_gid(ctx, 1, 1, &gid), 0);
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = qp->qp_num;  // connected to itself
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = gid;
  a.ah_attr.grh.sgid_index = 1;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = 1;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 1;
  int mask = IBV_QP_STATE;
  if (type != IBV_QPT_UD) mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  if (type == IBV_QPT_RC) mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  ASSERT_EQ(ibv_modify_qp(qp, &a, mask), 0);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 1;
  mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (type == IBV_QPT_RC) mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  ASSERT_EQ(ibv_modify_qp(qp, &a, mask), 0);
}

// Every object of one context, created, used a little and destroyed.
void objects_round(ibv_context* ctx, std::vector<uint8_t>& buf) {
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ASSERT_NE(pd, nullptr);
  ibv_mr* mr = ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(mr, nullptr);
  ibv_comp_channel* ch = ibv_create_comp_channel(ctx);
  ASSERT_NE(ch, nullptr);
  ibv_cq* cq = ibv_create_cq(ctx, 64, nullptr, ch, 0);
  ASSERT_NE(cq, nullptr);
  ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
  ibv_srq_init_attr sa{};
  sa.attr = {16, 1, 4};
  ibv_srq* srq = ibv_create_srq(pd, &sa);
  ASSERT_NE(srq, nullptr);
  ibv_sge sge{reinterpret_cast<uint64_t>(buf.data()), 64, mr->lkey};
  ibv_recv_wr rwr{};
  rwr.sg_list = &sge;
  rwr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_srq_recv(srq, &rwr, &bad), 0);
  ibv_qp* qps[4] = {};
  const ibv_qp_type types[4] = {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD, IBV_QPT_RC};
  for (int i = 0; i < 4; ++i) {
    ibv_qp_init_attr qa{};
    qa.send_cq = qa.recv_cq = cq;
    qa.qp_type = types[i];
    qa.srq = i == 3 ? srq : nullptr;
    qa.cap = {16, 16, 1, 1, 64};
    qps[i] = ibv_create_qp(pd, &qa);
    ASSERT_NE(qps[i], nullptr);
    to_rts(ctx, qps[i], types[i]);
    if (i != 3) {
      ASSERT_EQ(ibv_post_recv(qps[i], &rwr, &bad), 0);  // flushed at destroy
    }
  }
  ibv_ah_attr aa{};
  aa.is_global = 1;
  ASSERT_EQ(ibv_query_gid(ctx, 1, 1, &aa.grh.dgid), 0);
  aa.grh.sgid_index = 1;
  aa.grh.hop_limit = 64;
  aa.port_num = 1;
  ibv_ah* ah = ibv_create_ah(pd, &aa);
  ASSERT_NE(ah, nullptr);
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
  for (ibv_qp* qp : qps) EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_destroy_comp_channel(ch), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}


TEST(VerbsLifecycle, EveryObjectInOneContextLeaksNothing) {
  ibv_context* ctx = open_lo();
  ASSERT_NE(ctx, nullptr) << "no sr_lo";
  std::vector<uint8_t> buf(1 << 16);
  expect_no_growth([&] { objects_round(ctx, buf); }, 20, 500, 50, std::chrono::seconds(20));
  EXPECT_EQ(ibv_close_device(ctx), 0);
}

TEST(VerbsLifecycle, DevicesOpenAndCloseLeakNothing) {
  std::vector<uint8_t> buf(1 << 16);
  expect_no_growth(
      [&] {
        ibv_context* ctx = open_lo();
        ASSERT_NE(ctx, nullptr) << "no sr_lo";
        objects_round(ctx, buf);
        EXPECT_EQ(ibv_close_device(ctx), 0);
      },
      5, 100, 20, std::chrono::seconds(20));
}

}  // namespace
