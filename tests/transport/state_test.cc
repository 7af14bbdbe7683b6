// The QP state machine (IBTA.md 9: the kernel's qp_state_table) and the post-time checks of rdma-core:
// EINVAL for every transition not in the table, for a missing required attribute and for an attribute
// outside required + optional; post_send / post_recv refused in the states that cannot take them; inline,
// SGE and SQ limits.
#include <gtest/gtest.h>

#include "transport/harness.h"

namespace softrdma::test {
namespace {

constexpr uint32_t kRtrRc = kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn | kQpMaxDestRdAtomic | kQpMinRnrTimer;
constexpr uint32_t kRtsRc = kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpSqPsn | kQpMaxQpRdAtomic;
constexpr uint32_t kInit = kQpPkeyIndex | kQpPort | kQpAccessFlags;

struct Fixture {
  Harness h{{}, [] {
              QpOptions o;
              o.buf_size = 1 << 16;
              o.max_wr = 16;
              return o;
            }()};
  core::Qp* qp = nullptr;

  explicit Fixture(QpType type = QpType::kRc, uint32_t max_send_wr = 8) {
    core::QpInitAttr init;
    init.type = type;
    init.send_cq = h.a.scq;
    init.recv_cq = h.a.rcq;
    init.cap = {max_send_wr, 8, 4, 4, 64};
    qp = *h.a.ctx->create_qp(h.a.pd, init);
  }
  ~Fixture() { h.a.ctx->destroy_qp(qp); }

  core::QpAttr attr(QpState s) const {
    core::QpAttr at;
    at.qp_state = s;
    at.qp_access_flags = kLocalWrite | kRemoteWrite;
    at.qkey = 0x1234;
    at.path_mtu = Mtu::k1024;
    at.dest_qp_num = h.b.qp->qpn();
    at.ah_attr.dgid = h.b.ctx->local_addr();
    at.max_dest_rd_atomic = 1;
    at.max_rd_atomic = 1;
    at.min_rnr_timer = 12;
    at.timeout = 14;
    at.retry_cnt = 7;
    at.rnr_retry = 7;
    return at;
  }
  int to(QpState s, uint32_t mask) { return qp->modify(attr(s), kQpState | mask); }
  QpState state() const { return qp->attr().qp_state; }
  // Walks a fresh RC QP to `s` through the valid path.
  void walk_rc(QpState s) {
    ASSERT_EQ(to(QpState::kInit, kInit), 0);
    if (s == QpState::kInit) return;
    ASSERT_EQ(to(QpState::kRtr, kRtrRc), 0);
    if (s == QpState::kRtr) return;
    ASSERT_EQ(to(QpState::kRts, kRtsRc), 0);
    if (s == QpState::kRts) return;
    ASSERT_EQ(to(QpState::kSqd, 0), 0);
  }
  int post(WrOpcode op, uint32_t len, uint32_t flags = kSendSignaled, uint64_t id = 1) {
    Wr w(h.a, op, 0, len, id);
    w.remote(h.b, 0);
    w.wr.send_flags = flags;
    core::SendWr wr = w;
    size_t bad;
    return qp->post_send(std::span(&wr, 1), &bad);
  }
  int recv(uint32_t n_sge = 1) {
    Sge s[8];
    for (uint32_t i = 0; i < n_sge; ++i) s[i] = {h.a.addr(i * 64), 64, h.a.mr->key};
    core::RecvWr wr{1, std::span(s, n_sge)};
    size_t bad;
    return qp->post_recv(std::span(&wr, 1), &bad);
  }
};

TEST(QpState, InvalidTransitionsAreEinval) {
  using S = QpState;
  struct Case {
    S from, to;
  };
  // Not in the table (IBTA.md 9).
  for (const Case& c :
       {Case{S::kReset, S::kRtr}, Case{S::kReset, S::kRts}, Case{S::kReset, S::kSqd},
        Case{S::kReset, S::kSqe}, Case{S::kInit, S::kRts}, Case{S::kInit, S::kSqd}, Case{S::kInit, S::kSqe},
        Case{S::kRtr, S::kRtr}, Case{S::kRtr, S::kInit}, Case{S::kRtr, S::kSqd}, Case{S::kRts, S::kRtr},
        Case{S::kRts, S::kInit}, Case{S::kRts, S::kSqe}, Case{S::kSqd, S::kInit}, Case{S::kSqd, S::kRtr}}) {
    SCOPED_TRACE(testing::Message() << int(c.from) << "->" << int(c.to));
    Fixture f;
    if (c.from != S::kReset) f.walk_rc(c.from);
    ASSERT_EQ(f.state(), c.from);
    // Every attribute either state could want: the transition itself is what is refused.
    EXPECT_EQ(f.to(c.to, 0), EINVAL);
    EXPECT_EQ(f.to(c.to, kInit | kRtrRc | kRtsRc), EINVAL);
    EXPECT_EQ(f.state(), c.from);
  }
  // ERR -> anything but RESET/ERR.
  for (S next : {S::kInit, S::kRtr, S::kRts, S::kSqd}) {
    Fixture f;
    f.walk_rc(S::kRts);
    ASSERT_EQ(f.to(S::kErr, 0), 0);
    EXPECT_EQ(f.to(next, 0), EINVAL);
    EXPECT_EQ(f.state(), S::kErr);
  }
  // SQE -> RTS is for UD/UC only; an RC QP cannot be in SQE, so it is simply refused from every state.
}

TEST(QpState, ValidTransitions) {
  using S = QpState;
  Fixture f;
  EXPECT_EQ(f.to(S::kReset, 0), 0);  // RESET -> RESET
  EXPECT_EQ(f.to(S::kInit, kInit), 0);
  EXPECT_EQ(f.to(S::kInit, kQpAccessFlags), 0);  // INIT -> INIT, optional
  EXPECT_EQ(f.to(S::kRtr, kRtrRc | kQpAccessFlags), 0);
  EXPECT_EQ(f.to(S::kRts, kRtsRc | kQpMinRnrTimer), 0);
  EXPECT_EQ(f.to(S::kRts, kQpMinRnrTimer | kQpAccessFlags), 0);  // RTS -> RTS
  EXPECT_EQ(f.qp->modify(f.attr(S::kRts), kQpAccessFlags), 0);   // no STATE bit: stays in RTS
  EXPECT_EQ(f.to(S::kSqd, 0), 0);
  EXPECT_EQ(f.to(S::kSqd, kQpTimeout | kQpRetryCnt), 0);  // SQD -> SQD may change the path
  EXPECT_EQ(f.to(S::kRts, 0), 0);
  EXPECT_EQ(f.state(), S::kRts);
  // CUR_STATE: only from RTR/RTS/SQD/SQE, and it must be right.
  core::QpAttr at = f.attr(S::kRts);
  at.cur_qp_state = S::kRtr;
  EXPECT_EQ(f.qp->modify(at, kQpState | kQpCurState), EINVAL);
  at.cur_qp_state = S::kRts;
  EXPECT_EQ(f.qp->modify(at, kQpState | kQpCurState), 0);
  EXPECT_EQ(f.to(S::kErr, 0), 0);
  EXPECT_EQ(f.to(S::kErr, 0), 0);  // ERR -> ERR
  EXPECT_EQ(f.to(S::kReset, 0), 0);
  EXPECT_EQ(f.to(S::kErr, 0), 0);  // RESET -> ERR (the newer table)
  EXPECT_EQ(f.to(S::kReset, 0), 0);
  f.walk_rc(S::kRts);  // and round again after a reset
  EXPECT_EQ(f.state(), S::kRts);
}

TEST(QpState, RequiredAndOptionalAttributes) {
  using S = QpState;
  {  // RESET -> INIT (RC): each required bit missing; one bit outside the set
    for (uint32_t missing : {kQpPkeyIndex, kQpPort, kQpAccessFlags}) {
      Fixture f;
      EXPECT_EQ(f.to(S::kInit, kInit & ~missing), EINVAL) << missing;
      EXPECT_EQ(f.state(), S::kReset);
    }
    for (uint32_t extra : {kQpQkey, kQpAv, kQpPathMtu, kQpSqPsn, kQpTimeout, kQpCurState}) {
      Fixture f;
      EXPECT_EQ(f.to(S::kInit, kInit | extra), EINVAL) << extra;
    }
  }
  for (uint32_t missing : {kQpAv, kQpPathMtu, kQpDestQpn, kQpRqPsn, kQpMaxDestRdAtomic, kQpMinRnrTimer}) {
    Fixture f;
    f.walk_rc(S::kInit);
    EXPECT_EQ(f.to(S::kRtr, kRtrRc & ~missing), EINVAL) << missing;
    EXPECT_EQ(f.state(), S::kInit);
  }
  for (uint32_t extra : {kQpSqPsn, kQpTimeout, kQpRetryCnt, kQpQkey, kQpPort, kQpMaxQpRdAtomic}) {
    Fixture f;
    f.walk_rc(S::kInit);
    EXPECT_EQ(f.to(S::kRtr, kRtrRc | extra), EINVAL) << extra;
  }
  for (uint32_t missing : {kQpTimeout, kQpRetryCnt, kQpRnrRetry, kQpSqPsn, kQpMaxQpRdAtomic}) {
    Fixture f;
    f.walk_rc(S::kRtr);
    EXPECT_EQ(f.to(S::kRts, kRtsRc & ~missing), EINVAL) << missing;
    EXPECT_EQ(f.state(), S::kRtr);
  }
  for (uint32_t extra : {kQpPathMtu, kQpDestQpn, kQpRqPsn, kQpAv, kQpMaxDestRdAtomic}) {
    Fixture f;
    f.walk_rc(S::kRtr);
    EXPECT_EQ(f.to(S::kRts, kRtsRc | extra), EINVAL) << extra;
  }
  {  // RTS -> RTS / RTS -> SQD / to RESET or ERR: nothing beyond the optional set
    Fixture f;
    f.walk_rc(S::kRts);
    EXPECT_EQ(f.to(S::kRts, kQpPathMtu), EINVAL);
    EXPECT_EQ(f.to(S::kRts, kQpTimeout), EINVAL);
    EXPECT_EQ(f.to(S::kSqd, kQpTimeout), EINVAL);
    EXPECT_EQ(f.to(S::kErr, kQpAccessFlags), EINVAL);
    EXPECT_EQ(f.to(S::kReset, kQpAccessFlags), EINVAL);
    EXPECT_EQ(f.state(), S::kRts);
  }
  {  // UD: RESET -> INIT needs QKEY and takes no ACCESS_FLAGS; INIT -> RTR needs nothing
    Fixture f(QpType::kUd);
    EXPECT_EQ(f.to(S::kInit, kQpPkeyIndex | kQpPort), EINVAL);
    EXPECT_EQ(f.to(S::kInit, kQpPkeyIndex | kQpPort | kQpQkey | kQpAccessFlags), EINVAL);
    EXPECT_EQ(f.to(S::kInit, kQpPkeyIndex | kQpPort | kQpQkey), 0);
    EXPECT_EQ(f.to(S::kRtr, kQpAv), EINVAL);
    EXPECT_EQ(f.to(S::kRtr, 0), 0);
    EXPECT_EQ(f.to(S::kRts, 0), EINVAL);  // SQ_PSN is required
    EXPECT_EQ(f.to(S::kRts, kQpSqPsn | kQpTimeout), EINVAL);
    EXPECT_EQ(f.to(S::kRts, kQpSqPsn), 0);
  }
  {  // UC: no MIN_RNR_TIMER / MAX_DEST_RD_ATOMIC at INIT -> RTR, no TIMEOUT at RTR -> RTS
    Fixture f(QpType::kUc);
    EXPECT_EQ(f.to(S::kInit, kInit), 0);
    const uint32_t rtr = kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn;
    EXPECT_EQ(f.to(S::kRtr, rtr | kQpMinRnrTimer), EINVAL);
    EXPECT_EQ(f.to(S::kRtr, rtr | kQpMaxDestRdAtomic), EINVAL);
    EXPECT_EQ(f.to(S::kRtr, rtr & ~kQpRqPsn), EINVAL);
    EXPECT_EQ(f.to(S::kRtr, rtr), 0);
    EXPECT_EQ(f.to(S::kRts, kQpSqPsn | kQpTimeout), EINVAL);
    EXPECT_EQ(f.to(S::kRts, kQpSqPsn), 0);
  }
}

TEST(QpState, ValueChecks) {
  using S = QpState;
  Fixture f;
  f.walk_rc(S::kRtr);
  core::QpAttr at = f.attr(S::kRts);
  at.timeout = 32;
  EXPECT_EQ(f.qp->modify(at, kQpState | kRtsRc), EINVAL);
  at = f.attr(S::kRts);
  at.retry_cnt = 8;
  EXPECT_EQ(f.qp->modify(at, kQpState | kRtsRc), EINVAL);
  at = f.attr(S::kRts);
  at.rnr_retry = 8;
  EXPECT_EQ(f.qp->modify(at, kQpState | kRtsRc), EINVAL);
  at = f.attr(S::kRts);
  at.max_rd_atomic = 129;
  EXPECT_EQ(f.qp->modify(at, kQpState | kRtsRc), EINVAL);
  EXPECT_EQ(f.state(), S::kRtr);
  EXPECT_EQ(f.to(S::kRts, kRtsRc), 0);
  Fixture g;
  at = g.attr(S::kInit);
  at.port_num = 2;
  EXPECT_EQ(g.qp->modify(at, kQpState | kInit), EINVAL);
  at = g.attr(S::kInit);
  at.qp_access_flags = 1u << 12;
  EXPECT_EQ(g.qp->modify(at, kQpState | kInit), EINVAL);
  EXPECT_EQ(g.state(), S::kReset);
  g.walk_rc(S::kInit);
  at = g.attr(S::kRtr);
  at.path_mtu = static_cast<Mtu>(6);
  EXPECT_EQ(g.qp->modify(at, kQpState | kRtrRc), EINVAL);
  at = g.attr(S::kRtr);
  at.ah_attr.dgid = {};
  EXPECT_EQ(g.qp->modify(at, kQpState | kRtrRc), EINVAL);  // RoCE needs a GID
  EXPECT_EQ(g.state(), S::kInit);
}

TEST(QpState, PostInWrongStateIsEinval) {
  using S = QpState;
  Fixture f;
  EXPECT_EQ(f.recv(), EINVAL);  // RESET
  for (S s : {S::kReset, S::kInit, S::kRtr}) {
    if (s != S::kReset) {
      ASSERT_EQ(f.to(s, s == S::kInit ? kInit : kRtrRc), 0);
    }
    EXPECT_EQ(f.post(WrOpcode::kRdmaWrite, 8), EINVAL) << int(s);
    if (s != S::kReset) {
      EXPECT_EQ(f.recv(), 0) << int(s);
    }
  }
  EXPECT_EQ(f.h.net_.sent, 0u);
  EXPECT_TRUE(f.h.a.poll(f.h.a.scq).empty());
  ASSERT_EQ(f.to(S::kRts, kRtsRc), 0);
  EXPECT_EQ(f.post(WrOpcode::kRdmaWrite, 8), 0);
  EXPECT_EQ(f.h.net_.sent, 1u);
}

TEST(QpState, PostLimits) {
  Fixture f(QpType::kRc, 4);
  f.walk_rc(QpState::kRts);
  // Inline: up to max_inline_data (64).
  EXPECT_EQ(f.post(WrOpcode::kRdmaWrite, 65, kSendInline | kSendSignaled), EINVAL);
  EXPECT_EQ(f.post(WrOpcode::kRdmaWrite, 64, kSendInline | kSendSignaled), 0);
  // SGEs: up to max_send_sge / max_recv_sge (4).
  Sge sg[5];
  for (int i = 0; i < 5; ++i) sg[i] = {f.h.a.addr(i * 16), 16, f.h.a.mr->key};
  core::SendWr wr;
  wr.opcode = WrOpcode::kSend;
  wr.sg_list = std::span(sg, 5);
  size_t bad = 9;
  EXPECT_EQ(f.qp->post_send(std::span(&wr, 1), &bad), EINVAL);
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(f.recv(5), EINVAL);
  EXPECT_EQ(f.recv(4), 0);
  // Opcodes the QP type lacks.
  Fixture u(QpType::kUc);
  ASSERT_EQ(u.to(QpState::kInit, kInit), 0);
  ASSERT_EQ(u.to(QpState::kRtr, kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn), 0);
  ASSERT_EQ(u.to(QpState::kRts, kQpSqPsn), 0);
  EXPECT_EQ(u.post(WrOpcode::kRdmaRead, 8), EINVAL);
  EXPECT_EQ(u.post(WrOpcode::kAtomicFetchAndAdd, 8), EINVAL);

  // SQ full: 4 slots; the inline WRITE above still waits for its ACK (the peer never answers).
  for (uint64_t i = 0; i < 3; ++i) EXPECT_EQ(f.post(WrOpcode::kRdmaWrite, 8, kSendSignaled, 10 + i), 0);
  EXPECT_EQ(f.post(WrOpcode::kRdmaWrite, 8), ENOMEM);
  // A list that overflows midway posts the part that fits and names the first WR not posted.
  core::SendWr two[2];
  Wr w(f.h.a, WrOpcode::kRdmaWrite, 0, 8, 1);
  w.remote(f.h.b, 0);
  two[0] = two[1] = w;
  EXPECT_EQ(f.qp->post_send(two, &bad), ENOMEM);
  EXPECT_EQ(bad, 0u);
}

// Full SQ on a connected pair: once completions free slots, posting works again.
TEST(QpState, SqFullThenFreedByCompletions) {
  QpOptions o;
  o.buf_size = 1 << 16;
  o.max_wr = 4;
  Harness h({}, o);
  for (uint64_t i = 0; i < 4; ++i)
    ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, 100, i).remote(h.b, 0)), 0);
  EXPECT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, 100, 9).remote(h.b, 0)), ENOMEM);
  std::vector<Wc> s;
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 4, &s));
  EXPECT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, 100, 9).remote(h.b, 0)), 0);
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &s));
  EXPECT_EQ(s.back().wr_id, 9u);
  EXPECT_EQ(s.back().status, WcStatus::kSuccess);
}

// RTS -> SQD -> RTS on a connected pair: a WR posted in SQD waits, and goes out after the return to RTS;
// the drain event fires when asked for.
TEST(QpState, SqdAndBack) {
  QpOptions o;
  o.buf_size = 1 << 16;
  o.max_wr = 8;
  Harness h({}, o);
  fill(h.a.buf, 0, 100, 1);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, 100, 1).remote(h.b, 0)), 0);
  std::vector<Wc> s;
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &s));
  while (h.a.ctx->get_async_event()) {
  }
  core::QpAttr at;
  at.qp_state = QpState::kSqd;
  at.en_sqd_async_notify = true;
  ASSERT_EQ(h.a.qp->modify(at, kQpState | kQpEnSqdAsyncNotify), 0);
  EXPECT_EQ(h.a.qp->attr().qp_state, QpState::kSqd);
  auto ev = h.a.ctx->get_async_event();
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->type, kEventSqDrained);
  EXPECT_EQ(ev->object, h.a.qp);

  const uint64_t sent = h.net_.sent;
  fill(h.a.buf, 1000, 100, 2);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 1000, 100, 2).remote(h.b, 1000)), 0);
  h.run([] { return false; }, 5);
  EXPECT_EQ(h.net_.sent, sent);  // held while in SQD
  EXPECT_TRUE(h.a.poll(h.a.scq).empty());
  // The responder side keeps working in SQD.
  ASSERT_EQ(h.post_send(h.b, Wr(h.b, WrOpcode::kRdmaWrite, 0, 50, 3).remote(h.a, 4096)), 0);
  std::vector<Wc> sb;
  ASSERT_TRUE(h.wait(h.b, h.b.scq, 1, &sb));
  EXPECT_EQ(sb[0].status, WcStatus::kSuccess);

  at.qp_state = QpState::kRts;
  ASSERT_EQ(h.a.qp->modify(at, kQpState), 0);
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &s, 1000));
  EXPECT_EQ(s.back().wr_id, 2u);
  EXPECT_EQ(s.back().status, WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(h.a.buf.data() + 1000, h.b.buf.data() + 1000, 100), 0);
}

// In SQD the WQEs already started are finished (retransmitted if need be); new ones wait.
TEST(QpState, SqdFinishesWhatItStarted) {
  QpOptions o;
  o.buf_size = 1 << 16;
  o.max_wr = 8;
  o.timeout = 10;
  Harness h({}, o);
  int writes = 0;
  h.net_.drop_if = [&](uint64_t, std::span<const uint8_t> f) {
    return f[0] == wire::opcode(wire::Transport::kRc, wire::kOpWriteFirst) && writes++ == 0;
  };
  fill(h.a.buf, 0, 3000, 1);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, 3000, 1).remote(h.b, 0)), 0);
  core::QpAttr at;
  at.qp_state = QpState::kSqd;
  ASSERT_EQ(h.a.qp->modify(at, kQpState), 0);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, 100, 2).remote(h.b, 8192)), 0);
  std::vector<Wc> s;
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &s, 1000));
  EXPECT_EQ(s[0].wr_id, 1u);
  EXPECT_EQ(s[0].status, WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(h.a.buf.data(), h.b.buf.data(), 3000), 0);
  EXPECT_GE(h.a.counters.get(Counter::retry_timeouts) + h.a.counters.get(Counter::rx_nak_psn_seq), 1u);
  h.run([] { return false; }, 100);
  EXPECT_TRUE(h.a.poll(h.a.scq).empty());  // the one posted in SQD has not started
  EXPECT_EQ(h.b.buf[8192], 0);
  EXPECT_EQ(h.a.qp->attr().qp_state, QpState::kSqd);
  at.qp_state = QpState::kRts;
  ASSERT_EQ(h.a.qp->modify(at, kQpState), 0);
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &s, 1000));
  EXPECT_EQ(s[1].wr_id, 2u);
  EXPECT_EQ(s[1].status, WcStatus::kSuccess);
}

}  // namespace
}  // namespace softrdma::test

namespace softrdma::test {
namespace {

// RTS -> SQD with a WRITE still unacknowledged: sq_draining holds until it completes, and SQ_DRAINED fires
// then, not before.
TEST(QpState, SqDrainedFiresWhenOutstandingWorkCompletes) {
  QpOptions o;
  o.buf_size = 1 << 20;
  o.max_wr = 8;
  Harness h({}, o);
  fill(h.a.buf, 0, 500000, 3);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, 500000, 1).remote(h.b, 0)), 0);  // not yet ACKed
  core::QpAttr at;
  at.qp_state = QpState::kSqd;
  at.en_sqd_async_notify = true;
  ASSERT_EQ(h.a.qp->modify(at, kQpState | kQpEnSqdAsyncNotify), 0);
  EXPECT_TRUE(h.a.qp->attr().sq_draining);
  EXPECT_FALSE(h.a.ctx->get_async_event()) << "drained before the WRITE completed";
  std::vector<Wc> s;
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &s));
  EXPECT_EQ(s[0].status, WcStatus::kSuccess);
  EXPECT_FALSE(h.a.qp->attr().sq_draining);
  auto ev = h.a.ctx->get_async_event();
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->type, kEventSqDrained);
  EXPECT_EQ(std::memcmp(h.a.buf.data(), h.b.buf.data(), 500000), 0);
}

}  // namespace
}  // namespace softrdma::test
