// The C API of the drop-in libibverbs.so.1, called as an rdma-core program calls it (rdma-core's own
// header, linked against build/lib/libibverbs.so.1): misuse gets rdma-core's errno, the extended shapes
// (verbs_context, ibv_qp_ex, ibv_cq_ex) are there, and a QP connected to itself moves data.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <poll.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

namespace {

class Verbs : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    ASSERT_NE(list, nullptr);
    for (int i = 0; i < n; ++i)
      if (std::strcmp(ibv_get_device_name(list[i]), "sr_lo") == 0) ctx_ = ibv_open_device(list[i]);
    ibv_free_device_list(list);
    ASSERT_NE(ctx_, nullptr) << "no sr_lo";
    pd_ = ibv_alloc_pd(ctx_);
    ASSERT_NE(pd_, nullptr);
    cq_ = ibv_create_cq(ctx_, 64, nullptr, nullptr, 0);
    ASSERT_NE(cq_, nullptr);
    buf_.resize(4096);
    mr_ = ibv_reg_mr(pd_, buf_.data(), buf_.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ASSERT_NE(mr_, nullptr);
  }
  void TearDown() override {
    if (qp_) {
      EXPECT_EQ(ibv_destroy_qp(qp_), 0);
    }
    if (mr_) {
      EXPECT_EQ(ibv_dereg_mr(mr_), 0);
    }
    if (cq_) {
      EXPECT_EQ(ibv_destroy_cq(cq_), 0);
    }
    if (pd_) {
      EXPECT_EQ(ibv_dealloc_pd(pd_), 0);
    }
    if (ctx_) {
      EXPECT_EQ(ibv_close_device(ctx_), 0);
    }
  }

  ibv_qp* create_rc(uint32_t max_inline = 64, uint32_t max_wr = 16) {
    ibv_qp_init_attr a{};
    a.send_cq = cq_;
    a.recv_cq = cq_;
    a.qp_type = IBV_QPT_RC;
    a.cap = {max_wr, max_wr, 1, 1, max_inline};
    return ibv_create_qp(pd_, &a);
  }

  int to_init(ibv_qp* qp, unsigned access = IBV_ACCESS_REMOTE_WRITE) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = access;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  }

  // INIT -> RTR -> RTS, connected to itself through its own GID.
  void to_rts_self(ibv_qp* qp, unsigned access = IBV_ACCESS_REMOTE_WRITE) {
    ASSERT_EQ(to_init(qp, access), 0);
    ibv_gid gid;
    ASSERT_EQ(ibv_query_gid(ctx_, 1, 1, &gid), 0);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = qp->qp_num;
    a.rq_psn = 7;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = gid;
    a.ah_attr.grh.sgid_index = 1;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.port_num = 1;
    ASSERT_EQ(ibv_modify_qp(qp, &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
              0);
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = 7;
    a.max_rd_atomic = 1;
    ASSERT_EQ(ibv_modify_qp(qp, &a,
                            IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC),
              0);
    EXPECT_EQ(qp->state, IBV_QPS_RTS);
  }

  int post_send(ibv_qp* qp, uint32_t len, unsigned flags, ibv_send_wr** bad) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data()), len, mr_->lkey};
    ibv_send_wr wr{};
    wr.wr_id = 42;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = flags;
    return ibv_post_send(qp, &wr, bad);
  }

  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_mr* mr_ = nullptr;
  ibv_qp* qp_ = nullptr;
  std::vector<char> buf_;
};

TEST_F(Verbs, PostSendOnResetOrInitQpIsEinval) {
  qp_ = create_rc();
  ASSERT_NE(qp_, nullptr);
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(post_send(qp_, 8, IBV_SEND_SIGNALED, &bad), EINVAL);
  EXPECT_NE(bad, nullptr);
  ASSERT_EQ(to_init(qp_), 0);
  bad = nullptr;
  EXPECT_EQ(post_send(qp_, 8, IBV_SEND_SIGNALED, &bad), EINVAL);
  EXPECT_NE(bad, nullptr);
}

TEST_F(Verbs, RegMrRemoteWriteWithoutLocalWriteIsEinval) {
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(pd_, buf_.data(), buf_.size(), IBV_ACCESS_REMOTE_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(pd_, buf_.data(), buf_.size(), IBV_ACCESS_REMOTE_ATOMIC), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(Verbs, RegMrStripsOptionalAccessFlags) {
  unsigned access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING;  // not constant: ibv_reg_mr_iova2
  ibv_mr* mr = ibv_reg_mr(pd_, buf_.data(), 64, access);
  ASSERT_NE(mr, nullptr);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
}

TEST_F(Verbs, ModifyQpMissingRequiredAttributeIsEinval) {
  qp_ = create_rc();
  ASSERT_NE(qp_, nullptr);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  EXPECT_EQ(ibv_modify_qp(qp_, &a, IBV_QP_STATE | IBV_QP_PORT), EINVAL);  // no pkey index, no access flags
  EXPECT_EQ(qp_->state, IBV_QPS_RESET);
  ASSERT_EQ(to_init(qp_), 0);
  a = {};
  a.qp_state = IBV_QPS_RTR;
  EXPECT_EQ(ibv_modify_qp(qp_, &a, IBV_QP_STATE), EINVAL);  // RTR needs the path, dest QPN, PSN, ...
  ibv_qp_attr q{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(ibv_query_qp(qp_, &q, IBV_QP_STATE, &init), 0);
  EXPECT_EQ(q.qp_state, IBV_QPS_INIT);
}

// The context listens on the address of GID 1: an address vector from another source GID is refused
// rather than left to hang; a source GID past the table is EINVAL too.
TEST_F(Verbs, SourceGidOtherThanTheContextsIsEinval) {
  qp_ = create_rc();
  ASSERT_NE(qp_, nullptr);
  ASSERT_EQ(to_init(qp_), 0);
  ibv_port_attr port;
  ASSERT_EQ(ibv_query_port(ctx_, 1, &port), 0);
  ibv_gid gid;
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 1, &gid), 0);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = qp_->qp_num;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = gid;
  a.ah_attr.port_num = 1;
  const int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  a.ah_attr.grh.sgid_index = static_cast<uint8_t>(port.gid_tbl_len);
  EXPECT_EQ(ibv_modify_qp(qp_, &a, mask), EINVAL);
  a.ah_attr.grh.sgid_index = 0;  // fe80::, not the address the context listens on
  EXPECT_EQ(ibv_modify_qp(qp_, &a, mask), EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_create_ah(pd_, &a.ah_attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
  a.ah_attr.grh.sgid_index = 1;
  ibv_ah* ah = ibv_create_ah(pd_, &a.ah_attr);
  ASSERT_NE(ah, nullptr);
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
  EXPECT_EQ(ibv_modify_qp(qp_, &a, mask), 0);
}

TEST_F(Verbs, TooLargeInlineIsEinval) {
  errno = 0;
  EXPECT_EQ(create_rc(100000), nullptr);  // beyond the device's maximum: libfabric binary-searches on this
  EXPECT_EQ(errno, EINVAL);
  qp_ = create_rc(64);
  ASSERT_NE(qp_, nullptr);
  ibv_qp_attr q{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(ibv_query_qp(qp_, &q, IBV_QP_CAP, &init), 0);
  EXPECT_GE(q.cap.max_inline_data, 64u);
  to_rts_self(qp_);
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(post_send(qp_, q.cap.max_inline_data + 1, IBV_SEND_INLINE | IBV_SEND_SIGNALED, &bad), EINVAL);
  EXPECT_NE(bad, nullptr);
}

TEST_F(Verbs, SelfConnectedRcSendAndRecv) {
  qp_ = create_rc();
  ASSERT_NE(qp_, nullptr);
  ibv_sge rsge{reinterpret_cast<uintptr_t>(buf_.data() + 2048), 1024, mr_->lkey};
  ibv_recv_wr rwr{};
  rwr.wr_id = 7;
  rwr.sg_list = &rsge;
  rwr.num_sge = 1;
  ibv_recv_wr* rbad = nullptr;
  ASSERT_EQ(to_init(qp_), 0);
  ASSERT_EQ(ibv_post_recv(qp_, &rwr, &rbad), 0);
  to_rts_self(qp_);
  std::memcpy(buf_.data(), "hello, verbs", 13);
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(post_send(qp_, 13, IBV_SEND_SIGNALED, &bad), 0);
  int got = 0, sends = 0, recvs = 0;
  for (int spins = 0; got < 2 && spins < 50000000; ++spins) {
    ibv_wc wc[2];
    const int n = ibv_poll_cq(cq_, 2, wc);
    ASSERT_GE(n, 0);
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(wc[i].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc[i].status);
      if (wc[i].opcode == IBV_WC_SEND) {
        ++sends;
        EXPECT_EQ(wc[i].wr_id, 42u);
      }
      if (wc[i].opcode == IBV_WC_RECV) {
        ++recvs;
        EXPECT_EQ(wc[i].byte_len, 13u);
      }
    }
    got += n;
  }
  EXPECT_EQ(sends, 1);
  EXPECT_EQ(recvs, 1);
  EXPECT_STREQ(buf_.data() + 2048, "hello, verbs");
}

// Lists longer than the library's batch of 16 WRs: each WR goes, in order, and a bad one in the second
// batch stops the list there (bad_wr), with the ones before it posted, as rdma-core's providers do.
TEST_F(Verbs, ListsLongerThanABatchGoInOrderAndStopAtABadWr) {
  qp_ = create_rc(0, 32);
  ASSERT_NE(qp_, nullptr);
  constexpr int kN = 24;
  ibv_sge rsge[kN], ssge[kN];
  ibv_recv_wr rwr[kN]{};
  ibv_send_wr swr[kN]{};
  for (int i = 0; i < kN; ++i) {
    buf_[i] = static_cast<char>(0x40 + i);
    rsge[i] = {reinterpret_cast<uintptr_t>(buf_.data() + 2048 + 64 * i), 64, mr_->lkey};
    rwr[i].wr_id = 100 + i;
    rwr[i].sg_list = &rsge[i];
    rwr[i].num_sge = 1;
    rwr[i].next = i + 1 < kN ? &rwr[i + 1] : nullptr;
    ssge[i] = {reinterpret_cast<uintptr_t>(buf_.data() + i), 1, mr_->lkey};
    swr[i].wr_id = i;
    swr[i].sg_list = &ssge[i];
    swr[i].num_sge = 1;
    swr[i].opcode = IBV_WR_SEND;
    swr[i].send_flags = IBV_SEND_SIGNALED;
    swr[i].next = i + 1 < kN ? &swr[i + 1] : nullptr;
  }
  ASSERT_EQ(to_init(qp_), 0);
  ibv_recv_wr* rbad = nullptr;
  ASSERT_EQ(ibv_post_recv(qp_, rwr, &rbad), 0);
  to_rts_self(qp_);
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(qp_, swr, &bad), 0);
  // Polls until `want` completions came (or a bounded number of polls): their wr_ids in order, by opcode.
  auto drain = [this](int want, std::vector<uint64_t>* sends, std::vector<uint64_t>* recvs) {
    for (int got = 0, spins = 0; got < want && spins < 50000000; ++spins) {
      ibv_wc wc[8];
      const int n = ibv_poll_cq(cq_, 8, wc);
      ASSERT_GE(n, 0);
      for (int i = 0; i < n; ++i) {
        EXPECT_EQ(wc[i].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc[i].status);
        (wc[i].opcode == IBV_WC_RECV ? recvs : sends)->push_back(wc[i].wr_id);
      }
      got += n;
    }
  };
  std::vector<uint64_t> sends, recvs;
  drain(2 * kN, &sends, &recvs);
  ASSERT_EQ(sends.size(), static_cast<size_t>(kN));
  ASSERT_EQ(recvs.size(), static_cast<size_t>(kN));
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(sends[i], static_cast<uint64_t>(i));
    EXPECT_EQ(recvs[i], static_cast<uint64_t>(100 + i));
    EXPECT_EQ(buf_[2048 + 64 * i], static_cast<char>(0x40 + i)) << "message " << i << " in receive " << i;
  }

  // WRITEs this time (no receive needed), past the receive buffers (2048..3583): the 19th of 20 names a
  // negative number of SGEs.
  constexpr int kBadAt = 18;
  for (int i = 0; i < 20; ++i) {
    swr[i].opcode = IBV_WR_RDMA_WRITE;
    swr[i].wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(buf_.data() + 3600 + i);
    swr[i].wr.rdma.rkey = mr_->rkey;
    swr[i].next = i + 1 < 20 ? &swr[i + 1] : nullptr;
  }
  swr[kBadAt].num_sge = -1;
  bad = nullptr;
  EXPECT_EQ(ibv_post_send(qp_, swr, &bad), EINVAL);
  EXPECT_EQ(bad, &swr[kBadAt]);
  sends.clear();
  drain(kBadAt, &sends, &recvs);
  ASSERT_EQ(sends.size(), static_cast<size_t>(kBadAt));
  for (int i = 0; i < kBadAt; ++i) {
    EXPECT_EQ(sends[i], static_cast<uint64_t>(i));
    EXPECT_EQ(buf_[3600 + i], static_cast<char>(0x40 + i));
  }
  EXPECT_EQ(buf_[3600 + kBadAt], 0) << "the bad WR and those after it were not posted";
  ibv_wc extra;
  EXPECT_EQ(ibv_poll_cq(cq_, 1, &extra), 0);
}

TEST_F(Verbs, ExtendedShapes) {
  // verbs_context: ibv_query_device_ex goes through the extended op.
  ibv_device_attr_ex ex{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &ex), 0);
  EXPECT_EQ(ex.orig_attr.phys_port_cnt, 1);
  EXPECT_EQ(ex.orig_attr.vendor_id, 0xFFFFFFu);
  // query_port honours the length it is given.
  verbs_context* v = verbs_get_ctx(ctx_);
  ASSERT_NE(v, nullptr);
  ASSERT_NE(v->query_port, nullptr);
  unsigned char raw[sizeof(ibv_port_attr) + 16];
  std::memset(raw, 0xAB, sizeof raw);
  ASSERT_EQ(v->query_port(ctx_, 1, reinterpret_cast<ibv_port_attr*>(raw), 20), 0);
  for (size_t i = 20; i < sizeof raw; ++i) ASSERT_EQ(raw[i], 0xAB) << i;
  ibv_port_attr port;
  ASSERT_EQ(ibv_query_port(ctx_, 1, &port), 0);
  EXPECT_EQ(port.state, IBV_PORT_ACTIVE);
  EXPECT_EQ(port.link_layer, IBV_LINK_LAYER_ETHERNET);
  EXPECT_EQ(port.pkey_tbl_len, 1);
  // GIDs: index 1 is the IPv4-mapped RoCE v2 GID; past the table is EINVAL.
  ibv_gid_entry e;
  ASSERT_EQ(ibv_query_gid_ex(ctx_, 1, 1, &e, 0), 0);
  EXPECT_EQ(e.gid_type, IBV_GID_TYPE_ROCE_V2);
  EXPECT_EQ(e.gid.raw[10], 0xFF);
  EXPECT_EQ(e.gid.raw[15], 1);
  EXPECT_EQ(ibv_query_gid_ex(ctx_, 1, static_cast<uint32_t>(port.gid_tbl_len), &e, 0), EINVAL);
  __be16 pkey;
  ASSERT_EQ(ibv_query_pkey(ctx_, 1, 0, &pkey), 0);
  EXPECT_EQ(pkey, 0xFFFF);
  // Every QP is an ibv_qp_ex.
  qp_ = create_rc();
  ASSERT_NE(qp_, nullptr);
  ibv_qp_ex* qpx = ibv_qp_to_qp_ex(qp_);
  ASSERT_NE(qpx, nullptr);
  EXPECT_NE(qpx->wr_send, nullptr);
  EXPECT_NE(qpx->wr_complete, nullptr);
  // create_cq_ex polls with start_poll/next_poll: ENOENT when empty.
  ibv_cq_init_attr_ex ca{};
  ca.cqe = 16;
  ca.wc_flags = IBV_WC_EX_WITH_BYTE_LEN;
  ibv_cq_ex* cqx = ibv_create_cq_ex(ctx_, &ca);
  ASSERT_NE(cqx, nullptr);
  ibv_poll_cq_attr pa{};
  EXPECT_EQ(ibv_start_poll(cqx, &pa), ENOENT);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)), 0);
}

TEST_F(Verbs, UnsupportedVerbsFailCleanly) {
  errno = 0;
  EXPECT_EQ(ibv_alloc_mw(pd_, IBV_MW_TYPE_1), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  ibv_xrcd_init_attr xa{};
  errno = 0;
  EXPECT_EQ(ibv_open_xrcd(ctx_, &xa), nullptr);
  EXPECT_NE(errno, 0);
  EXPECT_EQ(ibv_resize_cq(cq_, 128), EOPNOTSUPP);
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_RETRY_EXC_ERR), "transport retry counter exceeded");
  EXPECT_EQ(ibv_rate_to_mbps(IBV_RATE_100_GBPS), 103125);
}

}  // namespace

namespace {

TEST(VerbsDevices, ListIsStableAndNamesAreSoftrdmas) {
  int n1 = 0, n2 = 0;
  ibv_device** a = ibv_get_device_list(&n1);
  ibv_device** b = ibv_get_device_list(&n2);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(n1, n2);
  ASSERT_GE(n1, 1);  // sr_lo at least
  for (int i = 0; i < n1; ++i) {
    EXPECT_EQ(a[i], b[i]) << "device pointers must stay the same across calls";
    EXPECT_EQ(std::strncmp(ibv_get_device_name(a[i]), "sr_", 3), 0);
    EXPECT_EQ(a[i]->node_type, IBV_NODE_CA);
    EXPECT_EQ(a[i]->transport_type, IBV_TRANSPORT_IB);
    EXPECT_NE(ibv_get_device_guid(a[i]), 0u);
  }
  EXPECT_EQ(a[n1], nullptr);
  ibv_free_device_list(a);
  ibv_free_device_list(b);
}

// perftest's GID auto-selection: ibv_query_gid succeeds for every index below gid_tbl_len.
TEST(VerbsDevices, EveryGidBelowTableLengthQueries) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_NE(list, nullptr);
  for (int i = 0; i < n; ++i) {
    ibv_context* ctx = ibv_open_device(list[i]);
    ASSERT_NE(ctx, nullptr) << ibv_get_device_name(list[i]);
    ibv_port_attr port;
    ASSERT_EQ(ibv_query_port(ctx, 1, &port), 0);
    EXPECT_GE(port.gid_tbl_len, 1);
    for (int g = 0; g < port.gid_tbl_len; ++g) {
      ibv_gid gid;
      EXPECT_EQ(ibv_query_gid(ctx, 1, g, &gid), 0) << g;
    }
    ibv_gid gid;
    EXPECT_EQ(ibv_query_gid(ctx, 1, port.gid_tbl_len, &gid), -1);
    ibv_port_attr bad;
    EXPECT_EQ(ibv_query_port(ctx, 2, &bad), EINVAL);
    EXPECT_EQ(ibv_close_device(ctx), 0);
  }
  ibv_free_device_list(list);
}

}  // namespace

namespace {

// The async fd blocks unless made non-blocking; SRQ_LIMIT_REACHED arrives with the SRQ in element.srq.
TEST_F(Verbs, AsyncEventSrqLimitReached) {
  const int flags = fcntl(ctx_->async_fd, F_GETFL);
  EXPECT_FALSE(flags & O_NONBLOCK);
  ASSERT_EQ(fcntl(ctx_->async_fd, F_SETFL, flags | O_NONBLOCK), 0);
  ibv_async_event ev;
  errno = 0;
  EXPECT_EQ(ibv_get_async_event(ctx_, &ev), -1);
  EXPECT_EQ(errno, EAGAIN);

  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 16;
  sa.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd_, &sa);
  ASSERT_NE(srq, nullptr);
  for (int i = 0; i < 4; ++i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data() + 2048), 1024, mr_->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = static_cast<uint64_t>(i);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_srq_recv(srq, &wr, &bad), 0);
  }
  ibv_srq_attr limit{};
  limit.srq_limit = 4;
  ASSERT_EQ(ibv_modify_srq(srq, &limit, IBV_SRQ_LIMIT), 0);
  ibv_srq_attr q{};
  ASSERT_EQ(ibv_query_srq(srq, &q), 0);
  EXPECT_EQ(q.srq_limit, 4u);

  ibv_qp_init_attr a{};
  a.send_cq = cq_;
  a.recv_cq = cq_;
  a.srq = srq;
  a.qp_type = IBV_QPT_RC;
  a.cap = {16, 0, 1, 0, 0};
  qp_ = ibv_create_qp(pd_, &a);
  ASSERT_NE(qp_, nullptr);
  to_rts_self(qp_);
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(post_send(qp_, 8, IBV_SEND_SIGNALED, &bad), 0);
  int got = 0;
  for (int spins = 0; got < 2 && spins < 50000000; ++spins) {
    ibv_wc wc[2];
    const int n = ibv_poll_cq(cq_, 2, wc);
    ASSERT_GE(n, 0);
    for (int i = 0; i < n; ++i) EXPECT_EQ(wc[i].status, IBV_WC_SUCCESS);
    got += n;
  }
  ASSERT_EQ(got, 2);
  pollfd p{ctx_->async_fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 5000), 1);
  ASSERT_EQ(ibv_get_async_event(ctx_, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_SRQ_LIMIT_REACHED);
  EXPECT_EQ(ev.element.srq, srq);
  ibv_ack_async_event(&ev);
  EXPECT_EQ(ibv_destroy_qp(qp_), 0);
  qp_ = nullptr;
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
}

}  // namespace

namespace {

// UD: a receive starts with the 40-byte GRH (source and destination GIDs), IBV_WC_GRH is set, and
// ibv_create_ah_from_wc answers the sender (UCX's ud_verbs and rdma_cm's UD servers rely on both).
TEST_F(Verbs, UdReceiveCarriesGrhAndAnswersFromWc) {
  ibv_qp_init_attr ia{};
  ia.send_cq = cq_;
  ia.recv_cq = cq_;
  ia.qp_type = IBV_QPT_UD;
  ia.cap = {16, 16, 1, 1, 0};
  qp_ = ibv_create_qp(pd_, &ia);
  ASSERT_NE(qp_, nullptr);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = 0x11111111;
  ASSERT_EQ(ibv_modify_qp(qp_, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), 0);
  ibv_sge rsge{reinterpret_cast<uintptr_t>(buf_.data() + 1024), 40 + 64, mr_->lkey};
  ibv_recv_wr rwr{};
  rwr.sg_list = &rsge;
  rwr.num_sge = 1;
  ibv_recv_wr* rbad = nullptr;
  ASSERT_EQ(ibv_post_recv(qp_, &rwr, &rbad), 0);
  a = {};
  a.qp_state = IBV_QPS_RTR;
  ASSERT_EQ(ibv_modify_qp(qp_, &a, IBV_QP_STATE), 0);
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 1;
  ASSERT_EQ(ibv_modify_qp(qp_, &a, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);

  ibv_gid gid;
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 1, &gid), 0);
  ibv_ah_attr ah_attr{};
  ah_attr.is_global = 1;
  ah_attr.grh.dgid = gid;
  ah_attr.grh.sgid_index = 1;
  ah_attr.grh.hop_limit = 1;
  ah_attr.port_num = 1;
  ibv_ah* ah = ibv_create_ah(pd_, &ah_attr);
  ASSERT_NE(ah, nullptr);
  std::memcpy(buf_.data(), "datagram", 9);
  ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data()), 9, mr_->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.ud.ah = ah;
  wr.wr.ud.remote_qpn = qp_->qp_num;
  wr.wr.ud.remote_qkey = 0x11111111;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(qp_, &wr, &bad), 0);
  ibv_wc recv{};
  int got = 0;
  for (int spins = 0; got < 2 && spins < 50000000; ++spins) {
    ibv_wc wc;
    if (ibv_poll_cq(cq_, 1, &wc) != 1) continue;
    ++got;
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    if (wc.opcode == IBV_WC_RECV) recv = wc;
  }
  ASSERT_EQ(got, 2);
  EXPECT_EQ(recv.byte_len, 40u + 9);
  EXPECT_TRUE(recv.wc_flags & IBV_WC_GRH);
  EXPECT_EQ(recv.sl, 2);  // the packet's L3 type, IPv4, where ConnectX reports it (UCX's ud_verbs reads it)
  EXPECT_EQ(recv.src_qp, qp_->qp_num);
  // RoCE v2 over IPv4, as the kernel lays it out: 20 undefined bytes, then the IPv4 header.
  const auto* grh = reinterpret_cast<const ibv_grh*>(buf_.data() + 1024);
  const auto* ip4 = reinterpret_cast<const uint8_t*>(grh) + 20;
  EXPECT_EQ(ip4[0], 0x45);
  EXPECT_EQ(ip4[9], 17);  // UDP
  EXPECT_EQ(std::memcmp(ip4 + 12, gid.raw + 12, 4), 0);
  EXPECT_EQ(std::memcmp(ip4 + 16, gid.raw + 12, 4), 0);
  EXPECT_STREQ(buf_.data() + 1024 + 40, "datagram");
  ibv_ah_attr back;
  ASSERT_EQ(ibv_init_ah_from_wc(ctx_, 1, &recv, const_cast<ibv_grh*>(grh), &back), 0);
  EXPECT_EQ(std::memcmp(&back.grh.dgid, &gid, 16), 0);
  EXPECT_EQ(back.grh.sgid_index, 1);
  ibv_ah* reply = ibv_create_ah_from_wc(pd_, &recv, const_cast<ibv_grh*>(grh), 1);
  ASSERT_NE(reply, nullptr);
  EXPECT_EQ(ibv_destroy_ah(reply), 0);
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
}

}  // namespace

namespace {

// The new post-send API on a QP connected to itself: an inline RDMA WRITE and a FETCH_AND_ADD posted by
// one wr_complete; wr_abort posts nothing; a setter before any wr_<opcode> fails wr_complete.
TEST_F(Verbs, QpExWorkRequests) {
  ASSERT_EQ(ibv_dereg_mr(mr_), 0);
  mr_ = ibv_reg_mr(pd_, buf_.data(), buf_.size(),
                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  ASSERT_NE(mr_, nullptr);
  ibv_qp_init_attr_ex ia{};
  ia.send_cq = cq_;
  ia.recv_cq = cq_;
  ia.qp_type = IBV_QPT_RC;
  ia.cap = {16, 16, 1, 1, 64};
  ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  ia.pd = pd_;
  ia.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
  qp_ = ibv_create_qp_ex(ctx_, &ia);
  ASSERT_NE(qp_, nullptr);
  to_rts_self(qp_, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  if (HasFatalFailure()) return;

  const uint64_t base = reinterpret_cast<uintptr_t>(buf_.data());
  uint64_t counter = 10;
  std::memcpy(buf_.data() + 3072, &counter, 8);
  ibv_qp_ex* qpx = ibv_qp_to_qp_ex(qp_);
  ASSERT_NE(qpx, nullptr);

  ibv_wr_start(qpx);
  ibv_wr_set_sge(qpx, mr_->lkey, base, 8);  // before any wr_<opcode>
  EXPECT_EQ(ibv_wr_complete(qpx), EINVAL);
  ibv_wr_start(qpx);
  qpx->wr_id = 99;
  qpx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(qpx, mr_->rkey, base + 2500);
  ibv_wr_set_sge(qpx, mr_->lkey, base, 8);
  ibv_wr_abort(qpx);

  char text[] = "written inline";
  ibv_wr_start(qpx);
  qpx->wr_id = 1;
  qpx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(qpx, mr_->rkey, base + 2048);
  ibv_wr_set_inline_data(qpx, text, sizeof text);
  text[0] = 'X';  // the data was taken at the call
  qpx->wr_id = 2;
  ibv_wr_atomic_fetch_add(qpx, mr_->rkey, base + 3072, 5);
  ibv_wr_set_sge(qpx, mr_->lkey, base + 3080, 8);
  ASSERT_EQ(ibv_wr_complete(qpx), 0);

  std::vector<uint64_t> ids;
  for (int spins = 0; ids.size() < 2 && spins < 50000000; ++spins) {
    ibv_wc wc;
    if (ibv_poll_cq(cq_, 1, &wc) != 1) continue;
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    ids.push_back(wc.wr_id);
  }
  ASSERT_EQ(ids, (std::vector<uint64_t>{1, 2}));
  EXPECT_STREQ(buf_.data() + 2048, "written inline");
  uint64_t now, orig;
  std::memcpy(&now, buf_.data() + 3072, 8);
  std::memcpy(&orig, buf_.data() + 3080, 8);
  EXPECT_EQ(now, 15u);
  EXPECT_EQ(orig, 10u);
  ibv_wc wc;
  EXPECT_EQ(ibv_poll_cq(cq_, 1, &wc), 0);  // the aborted WRITE never ran
}

}  // namespace

namespace {

// Creates objects with `make` until it fails (at most `max` + 2 tries); returns how many it made and, in
// `err`, the errno of the failure. Destroys them all with `destroy`.
template <typename T, typename Make, typename Destroy>
size_t fill_to_limit(uint32_t max, Make make, Destroy destroy, int* err) {
  std::vector<T*> made;
  *err = 0;
  for (uint64_t i = 0; i < uint64_t{max} + 2; ++i) {
    errno = 0;
    T* o = make();
    if (!o) {
      *err = errno;
      break;
    }
    made.push_back(o);
  }
  for (T* o : made) EXPECT_EQ(destroy(o), 0);
  return made.size();
}

// Every object-count limit that ibv_query_device reports holds: the one past it fails with ENOMEM (as
// mlx5 and rxe's earlier pools say), and every attribute limit with EINVAL.
TEST_F(Verbs, EveryLimitQueryDeviceReportsIsEnforced) {
  ibv_device_attr d;
  ASSERT_EQ(ibv_query_device(ctx_, &d), 0);
  int err;
  // The fixture holds one PD, one CQ and one MR already.
  EXPECT_EQ(fill_to_limit<ibv_pd>(d.max_pd, [&] { return ibv_alloc_pd(ctx_); }, ibv_dealloc_pd, &err) + 1,
            size_t(d.max_pd));
  EXPECT_EQ(err, ENOMEM);
  EXPECT_EQ(fill_to_limit<ibv_cq>(d.max_cq, [&] { return ibv_create_cq(ctx_, 1, nullptr, nullptr, 0); },
                                  ibv_destroy_cq, &err) + 1,
            size_t(d.max_cq));
  EXPECT_EQ(err, ENOMEM);
  EXPECT_EQ(fill_to_limit<ibv_mr>(d.max_mr, [&] { return ibv_reg_mr(pd_, buf_.data(), 64, 0); }, ibv_dereg_mr,
                                  &err) + 1,
            size_t(d.max_mr));
  EXPECT_EQ(err, ENOMEM);
  ibv_ah_attr ah{};
  ah.is_global = 1;
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 1, &ah.grh.dgid), 0);
  ah.grh.sgid_index = 1;
  ah.port_num = 1;
  EXPECT_EQ(fill_to_limit<ibv_ah>(d.max_ah, [&] { return ibv_create_ah(pd_, &ah); }, ibv_destroy_ah, &err),
            size_t(d.max_ah));
  EXPECT_EQ(err, ENOMEM);
  ibv_srq_init_attr sa{};
  sa.attr = {1, 1, 0};
  EXPECT_EQ(fill_to_limit<ibv_srq>(d.max_srq, [&] { return ibv_create_srq(pd_, &sa); }, ibv_destroy_srq, &err),
            size_t(d.max_srq));
  EXPECT_EQ(err, ENOMEM);
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = cq_;
  qa.qp_type = IBV_QPT_RC;
  qa.cap = {1, 1, 1, 1, 0};
  EXPECT_EQ(fill_to_limit<ibv_qp>(d.max_qp, [&] { return ibv_create_qp(pd_, &qa); }, ibv_destroy_qp, &err),
            size_t(d.max_qp));
  EXPECT_EQ(err, ENOMEM);

  // Attributes one past their limit.
  errno = 0;
  EXPECT_EQ(ibv_create_cq(ctx_, d.max_cqe + 1, nullptr, nullptr, 0), nullptr);
  EXPECT_EQ(errno, EINVAL);
  for (int field = 0; field < 4; ++field) {
    SCOPED_TRACE(field);
    ibv_qp_init_attr a = qa;
    if (field == 0) a.cap.max_send_wr = d.max_qp_wr + 1;
    if (field == 1) a.cap.max_recv_wr = d.max_qp_wr + 1;
    if (field == 2) a.cap.max_send_sge = d.max_sge + 1;
    if (field == 3) a.cap.max_recv_sge = d.max_sge + 1;
    errno = 0;
    EXPECT_EQ(ibv_create_qp(pd_, &a), nullptr);
    EXPECT_EQ(errno, EINVAL);
  }
  for (int field = 0; field < 2; ++field) {
    ibv_srq_init_attr a = sa;
    if (field == 0) a.attr.max_wr = d.max_srq_wr + 1;
    if (field == 1) a.attr.max_sge = d.max_srq_sge + 1;
    errno = 0;
    EXPECT_EQ(ibv_create_srq(pd_, &a), nullptr);
    EXPECT_EQ(errno, EINVAL);
  }
}

}  // namespace
