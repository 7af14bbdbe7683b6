// RC error paths: each failure ends in the completion status of IBTA.md 10, with the counters of the NAKs
// that carried it, the QP states the IBTA prescribes (IBTA.md 9) and WR_FLUSH_ERR for everything behind.
#include <gtest/gtest.h>

#include <poll.h>

#include <string>

#include "transport/harness.h"

namespace softrdma::test {
namespace {

QpState state(const Node& n) { return n.qp->attr().qp_state; }

QpOptions small() {
  QpOptions o;
  o.buf_size = 1 << 16;
  o.max_wr = 16;
  return o;
}

bool untouched(const Node& n, uint64_t off, uint32_t len, uint8_t v = 0) {
  for (uint32_t i = 0; i < len; ++i)
    if (n.buf[off + i] != v) return false;
  return true;
}

// Steps the fake clock from timer to timer on node a alone (the network drops everything), so the time of
// the failure is exact.
std::vector<Wc> step_timers(Harness& h, int max_steps) {
  std::vector<Wc> s;
  for (int i = 0; i < max_steps && s.empty(); ++i) {
    const Nanos d = h.a.qp->next_deadline.load();
    if (d == 0) break;
    g_now = d;
    h.a.ctx->tick(h.a.tx, g_now);
    h.net_.deliver();
    s = h.a.poll(h.a.scq);
  }
  return s;
}

// The next async event of a node's context: its type and its QP (or "none").
std::string next_event(Node& n) {
  auto e = n.ctx->get_async_event();
  if (!e) return "none";
  return std::to_string(e->type) + (e->object == n.qp ? " on its QP" : " on something else");
}
std::string event_on_qp(AsyncEventType t) { return std::to_string(t) + " on its QP"; }

TEST(Errors, RetryExceededTakesRetryCntPlusOneTimeouts) {
  for (uint8_t retry_cnt : {0, 2, 5}) {
    SCOPED_TRACE(int{retry_cnt});
    QpOptions o = small();
    o.timeout = 12;  // 16.78 ms
    o.retry_cnt = retry_cnt;
    Harness h({.drop = 1.0}, o);
    const Nanos t0 = g_now;
    ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, 100, 7).remote(h.b, 0)), 0);
    EXPECT_EQ(h.net_.sent, 1u);
    std::vector<Wc> s = step_timers(h, 20);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].status, WcStatus::kRetryExcErr);
    EXPECT_EQ(s[0].wr_id, 7u);
    EXPECT_EQ(s[0].qp_num, h.a.qp->qpn());
    // (retry_cnt + 1) x 4.096 us x 2^timeout (IBTA.md 4a/4b).
    const Nanos expect = (retry_cnt + 1ull) * (4096ull << o.timeout);
    EXPECT_GE(g_now - t0, expect);
    EXPECT_LE(g_now - t0, expect + expect / 100);
    EXPECT_EQ(h.net_.sent, retry_cnt + 1u);  // the original and one resend per retry
    EXPECT_EQ(h.a.counters.get(Counter::retry_timeouts), retry_cnt + 1u);
    // The QP is in error, and says so with an async event too (a peer that died).
    EXPECT_EQ(next_event(h.a), event_on_qp(kEventQpFatal));
    EXPECT_EQ(next_event(h.a), "none");
    EXPECT_EQ(h.a.counters.get(Counter::retransmits), retry_cnt);
    EXPECT_EQ(state(h.a), QpState::kErr);
    EXPECT_EQ(state(h.b), QpState::kRts);  // the peer saw nothing
    EXPECT_EQ(h.a.qp->next_deadline.load(), 0u);
  }
}

TEST(Errors, RnrRetryExceeded) {
  QpOptions o = small();
  o.rnr_retry = 1;
  o.min_rnr_timer = 1;  // 10 us
  Harness h({}, o);
  fill(h.a.buf, 0, 100, 1);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kSend, 0, 100, 9)), 0);
  std::vector<Wc> s;
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &s));
  EXPECT_EQ(s[0].status, WcStatus::kRnrRetryExcErr);
  EXPECT_EQ(s[0].wr_id, 9u);
  // One try, one retry (rnr_retry = 1), each refused.
  EXPECT_EQ(h.b.counters.get(Counter::tx_rnr_nak), 2u);
  EXPECT_EQ(h.a.counters.get(Counter::rx_rnr_nak), 2u);
  EXPECT_EQ(h.a.counters.get(Counter::rnr_retries), 1u);
  EXPECT_EQ(state(h.a), QpState::kErr);
  EXPECT_EQ(state(h.b), QpState::kRts);  // RNR is no error for the responder
  EXPECT_TRUE(h.b.poll(h.b.rcq).empty());
}

TEST(Errors, RnrRetryInfiniteSucceedsOnceARecvIsPosted) {
  QpOptions o = small();
  o.rnr_retry = 7;
  o.retry_cnt = 0;       // RNR retries must not spend the transport retry budget
  o.min_rnr_timer = 14;  // 1.28 ms
  Harness h({}, o);
  fill(h.a.buf, 0, 3000, 2);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kSend, 0, 3000, 5)), 0);
  const Nanos t0 = g_now;
  ASSERT_TRUE(h.run([&] { return h.b.counters.get(Counter::tx_rnr_nak) >= 10; }));
  // The requester waited the RNR timer (1.28 ms) between tries.
  EXPECT_GE(g_now - t0, 9 * 1'280'000ull);
  EXPECT_TRUE(h.a.poll(h.a.scq).empty());
  ASSERT_EQ(h.post_recv(h.b, 77, 1000, 4000), 0);
  std::vector<Wc> s, r;
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &s));
  ASSERT_TRUE(h.wait(h.b, h.b.rcq, 1, &r));
  EXPECT_EQ(s[0].status, WcStatus::kSuccess);
  EXPECT_EQ(r[0].status, WcStatus::kSuccess);
  EXPECT_EQ(r[0].wr_id, 77u);
  EXPECT_EQ(r[0].byte_len, 3000u);
  EXPECT_EQ(std::memcmp(h.a.buf.data(), h.b.buf.data() + 1000, 3000), 0);
  EXPECT_EQ(state(h.a), QpState::kRts);
  EXPECT_EQ(state(h.b), QpState::kRts);
}

// A remote access violation: NAK remote access error, REM_ACCESS_ERR, both QPs in ERR, the responder's
// posted receives flushed and its memory untouched.
enum class Access { kBadRkey, kOutsideMr, kWriteNoRemoteWrite, kReadNoRemoteRead, kAtomicNoRemoteAtomic };

class RemoteAccess : public ::testing::TestWithParam<Access> {};

std::string access_name(const ::testing::TestParamInfo<Access>& info) {
  static const char* const kNames[] = {"BadRkey", "OutsideMr", "WriteNoRemoteWrite", "ReadNoRemoteRead",
                                       "AtomicNoRemoteAtomic"};
  return kNames[static_cast<int>(info.param)];
}

// An event of a QP destroyed before the application read it is dropped, not handed out with a dangling QP.
TEST(Errors, DestroyingAQpDropsItsUnreadEvents) {
  QpOptions o = small();
  o.timeout = 12;
  o.retry_cnt = 0;
  Harness h({.drop = 1.0}, o);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, 100, 7).remote(h.b, 0)), 0);
  ASSERT_EQ(step_timers(h, 5).size(), 1u);
  ASSERT_EQ(h.a.ctx->destroy_qp(h.a.qp), 0);
  h.a.qp = nullptr;
  EXPECT_EQ(next_event(h.a), "none");
  pollfd p{h.a.ctx->async_fd(), POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 0), 0) << "the event fd still counts the dropped event";
}

TEST_P(RemoteAccess, NakRemAccessErrAndBothQpsInError) {
  Harness h({}, small());
  const uint64_t kMrOff = 8192;
  uint32_t mr_access = kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic;
  if (GetParam() == Access::kWriteNoRemoteWrite) mr_access = kLocalWrite | kRemoteRead | kRemoteAtomic;
  if (GetParam() == Access::kReadNoRemoteRead) mr_access = kLocalWrite | kRemoteWrite | kRemoteAtomic;
  if (GetParam() == Access::kAtomicNoRemoteAtomic) mr_access = kLocalWrite | kRemoteWrite | kRemoteRead;
  core::Mr* mr = *h.b.ctx->reg_mr(h.b.pd, h.b.buf.data() + kMrOff, 4096, h.b.addr(kMrOff), mr_access);
  ASSERT_EQ(h.post_recv(h.b, 50, 0, 100), 0);
  ASSERT_EQ(h.post_recv(h.b, 51, 100, 100), 0);
  fill(h.a.buf, 0, 200, 3);
  std::memset(h.a.buf.data() + 1000, 0xEE, 200);

  WrOpcode op = WrOpcode::kRdmaWrite;
  if (GetParam() == Access::kReadNoRemoteRead) op = WrOpcode::kRdmaRead;
  if (GetParam() == Access::kAtomicNoRemoteAtomic) op = WrOpcode::kAtomicFetchAndAdd;
  Wr w(h.a, op, op == WrOpcode::kRdmaWrite ? 0 : 1000, op == WrOpcode::kAtomicFetchAndAdd ? 8 : 200, 33);
  w.wr.remote_addr = h.b.addr(kMrOff);
  w.wr.rkey = mr->key;
  w.wr.compare_add = 1;
  if (GetParam() == Access::kBadRkey) w.wr.rkey = mr->key ^ 0x01000000;
  if (GetParam() == Access::kOutsideMr)
    w.wr.remote_addr = h.b.addr(kMrOff + 4096 - 100);  // 100 B past the end
  ASSERT_EQ(h.post_send(h.a, w), 0);

  std::vector<Wc> s, r;
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &s));
  EXPECT_EQ(s[0].status, WcStatus::kRemAccessErr);
  EXPECT_EQ(s[0].wr_id, 33u);
  EXPECT_EQ(h.b.counters.get(Counter::tx_nak_rem_access), 1u);
  EXPECT_EQ(h.a.counters.get(Counter::rx_nak_rem_access), 1u);
  // Async events: the responder's local access violation, the requester's QP in error.
  EXPECT_EQ(next_event(h.b), event_on_qp(kEventQpAccessErr));
  EXPECT_EQ(next_event(h.a), event_on_qp(kEventQpFatal));
  EXPECT_EQ(state(h.a), QpState::kErr);
  EXPECT_EQ(state(h.b), QpState::kErr);
  // The responder's receives are flushed (no receive WQE was in use by the failed request).
  ASSERT_TRUE(h.wait(h.b, h.b.rcq, 2, &r));
  EXPECT_EQ(r[0].wr_id, 50u);
  EXPECT_EQ(r[1].wr_id, 51u);
  for (const Wc& wc : r) EXPECT_EQ(wc.status, WcStatus::kWrFlushErr);
  EXPECT_TRUE(untouched(h.b, 0, static_cast<uint32_t>(h.b.buf.size())));  // nothing written anywhere
  EXPECT_TRUE(untouched(h.a, 1000, 200, 0xEE));                           // and nothing read back
  EXPECT_EQ(h.b.ctx->dereg_mr(mr), 0);
}

INSTANTIATE_TEST_SUITE_P(Errors, RemoteAccess,
                         ::testing::Values(Access::kBadRkey, Access::kOutsideMr, Access::kWriteNoRemoteWrite,
                                           Access::kReadNoRemoteRead, Access::kAtomicNoRemoteAtomic),
                         access_name);

// The counterpart: a zero-length WRITE (or READ) names no memory, so its R_Key and VA are not checked
// (C9-88; rxe skips the check too). A zero-byte WRITE WITH IMMEDIATE with rkey 0 is a common doorbell.
TEST(Errors, ZeroLengthRdmaNeedsNoRkey) {
  Harness h({}, small());
  ASSERT_EQ(h.post_recv(h.b, 80, 0, 64), 0);
  for (WrOpcode op : {WrOpcode::kRdmaWrite, WrOpcode::kRdmaWriteWithImm, WrOpcode::kRdmaRead}) {
    core::SendWr wr;
    wr.wr_id = static_cast<uint64_t>(op);
    wr.opcode = op;
    wr.send_flags = kSendSignaled;
    wr.imm_data = 0x01020304;
    wr.remote_addr = 0;
    wr.rkey = 0;
    size_t bad;
    ASSERT_EQ(h.a.qp->post_send(std::span(&wr, 1), &bad), 0);
  }
  std::vector<Wc> s, r;
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 3, &s));
  ASSERT_TRUE(h.wait(h.b, h.b.rcq, 1, &r));
  for (const Wc& w : s) EXPECT_EQ(w.status, WcStatus::kSuccess) << w.wr_id;
  EXPECT_EQ(r[0].status, WcStatus::kSuccess);
  EXPECT_EQ(r[0].wr_id, 80u);
  EXPECT_EQ(r[0].byte_len, 0u);
  EXPECT_EQ(r[0].imm_data, 0x01020304u);
  EXPECT_EQ(h.b.counters.get(Counter::tx_nak_rem_access), 0u);
  EXPECT_EQ(state(h.b), QpState::kRts);
}

// The responder QP's access flags forbid the operation: NAK invalid request, REM_INV_REQ_ERR (IBTA.md 10).
TEST(Errors, QpAccessFlagsForbidOperation) {
  struct Case {
    uint32_t qp_access;
    WrOpcode op;
  };
  for (const Case& c : {Case{kLocalWrite | kRemoteRead | kRemoteAtomic, WrOpcode::kRdmaWrite},
                        Case{kLocalWrite | kRemoteRead | kRemoteAtomic, WrOpcode::kRdmaWriteWithImm},
                        Case{kLocalWrite | kRemoteWrite | kRemoteAtomic, WrOpcode::kRdmaRead},
                        Case{kLocalWrite | kRemoteWrite | kRemoteRead, WrOpcode::kAtomicCmpAndSwp}}) {
    SCOPED_TRACE(static_cast<int>(c.op));
    QpOptions o = small();
    o.access = c.qp_access;
    Harness h({}, o);
    ASSERT_EQ(h.post_recv(h.b, 60, 0, 100), 0);
    fill(h.a.buf, 0, 64, 4);
    ASSERT_EQ(
        h.post_send(h.a, Wr(h.a, c.op, 0, c.op == WrOpcode::kAtomicCmpAndSwp ? 8 : 64, 1).remote(h.b, 1024)),
        0);
    std::vector<Wc> s, r;
    ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &s));
    EXPECT_EQ(s[0].status, WcStatus::kRemInvReqErr);
    EXPECT_EQ(h.b.counters.get(Counter::tx_nak_inv_req), 1u);
    EXPECT_EQ(h.a.counters.get(Counter::rx_nak_inv_req), 1u);
    EXPECT_EQ(state(h.a), QpState::kErr);
    EXPECT_EQ(state(h.b), QpState::kErr);
    EXPECT_EQ(next_event(h.b), event_on_qp(kEventQpReqErr));
    EXPECT_EQ(next_event(h.a), event_on_qp(kEventQpFatal));
    EXPECT_TRUE(untouched(h.b, 1024, 64));
    ASSERT_TRUE(h.wait(h.b, h.b.rcq, 1, &r));
    // WRITE_WITH_IMM takes the receive WQE only when it passed the checks; either way it ends in error.
    EXPECT_NE(r[0].status, WcStatus::kSuccess);
    EXPECT_EQ(r[0].wr_id, 60u);
  }
}

// rdma-core (and rxe) refuse an atomic whose remote address is not 8-byte aligned, or whose local buffer
// is not 8 bytes, at post time: EINVAL, nothing queued, the QP stays usable.
TEST(Errors, MisalignedAtomicIsEinvalAtPost) {
  Harness h({}, small());
  Wr bad(h.a, WrOpcode::kAtomicFetchAndAdd, 0, 8, 1);
  bad.remote(h.b, 1028);
  size_t idx = 99;
  core::SendWr wrs[1] = {bad};
  EXPECT_EQ(h.a.qp->post_send(wrs, &idx), EINVAL);
  EXPECT_EQ(idx, 0u);
  EXPECT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kAtomicCmpAndSwp, 0, 4, 2).remote(h.b, 1024)), EINVAL);
  EXPECT_EQ(h.net_.sent, 0u);
  Wr good(h.a, WrOpcode::kAtomicFetchAndAdd, 0, 8, 3);
  good.remote(h.b, 1024);
  good.wr.compare_add = 5;
  ASSERT_EQ(h.post_send(h.a, good), 0);
  std::vector<Wc> s;
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &s));
  EXPECT_EQ(s[0].status, WcStatus::kSuccess);
  EXPECT_EQ(s[0].wr_id, 3u);
  EXPECT_EQ(h.b.buf[1024], 5);
}

// The SEND is longer than the receive buffer: the responder's receive completes with LOC_LEN_ERR, the
// requester gets NAK invalid request -> REM_INV_REQ_ERR, both QPs go to ERR and nothing is written past the
// receive buffer.
TEST(Errors, RecvBufferTooSmall) {
  for (uint32_t len : {200u, 3000u}) {  // one packet; three packets, the second one overflows
    SCOPED_TRACE(len);
    Harness h({}, small());
    const uint32_t kRecv = len == 200 ? 100 : 1500;
    ASSERT_EQ(h.post_recv(h.b, 70, 0, kRecv), 0);
    ASSERT_EQ(h.post_recv(h.b, 71, 8192, 8192), 0);
    fill(h.a.buf, 0, len, 5);
    ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kSend, 0, len, 8)), 0);
    std::vector<Wc> s, r;
    ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &s));
    ASSERT_TRUE(h.wait(h.b, h.b.rcq, 2, &r));
    EXPECT_EQ(s[0].status, WcStatus::kRemInvReqErr);
    EXPECT_EQ(r[0].wr_id, 70u);
    EXPECT_EQ(r[0].status, WcStatus::kLocLenErr);
    EXPECT_EQ(r[1].wr_id, 71u);
    EXPECT_EQ(r[1].status, WcStatus::kWrFlushErr);
    EXPECT_EQ(h.b.counters.get(Counter::tx_nak_inv_req), 1u);
    EXPECT_EQ(state(h.a), QpState::kErr);
    EXPECT_EQ(state(h.b), QpState::kErr);
    EXPECT_TRUE(untouched(h.b, kRecv, 8192 - kRecv));
  }
}

// A bad lkey (or an SGE outside its MR) is found at post time and reported as LOC_PROT_ERR; nothing goes
// on the wire.
TEST(Errors, BadLkeyIsLocProtErr) {
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant);
    Harness h({}, small());
    Wr w(h.a, variant == 2 ? WrOpcode::kRdmaRead : WrOpcode::kRdmaWrite, 0, 100, 12);
    w.remote(h.b, 0);
    if (variant == 0) w.sge.lkey ^= 0x10000000;
    if (variant == 1) w.sge.addr = h.a.addr(h.a.buf.size() - 50);
    core::Mr* ro = nullptr;
    if (variant == 2) {  // a READ into an MR without local write
      ro = *h.a.ctx->reg_mr(h.a.pd, h.a.buf.data(), 4096, h.a.addr(), kRemoteRead);
      w.sge.lkey = ro->key;
    }
    ASSERT_EQ(h.post_send(h.a, w), 0);
    std::vector<Wc> s;
    ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &s));
    EXPECT_EQ(s[0].status, WcStatus::kLocProtErr);
    EXPECT_EQ(s[0].wr_id, 12u);
    EXPECT_EQ(h.net_.sent, 0u);
    EXPECT_EQ(state(h.a), QpState::kErr);
    EXPECT_EQ(state(h.b), QpState::kRts);
    if (ro) {
      EXPECT_EQ(h.a.ctx->dereg_mr(ro), 0);
    }
  }
}

// A WQE behind one that failed locally never goes on the wire, even when it is posted later and the failed
// one still waits for an earlier WQE's ACK.
TEST(Errors, NothingSentBehindALocalError) {
  Harness h({}, small());
  fill(h.a.buf, 0, 4096, 6);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, 3000, 1).remote(h.b, 0)), 0);
  Wr bad(h.a, WrOpcode::kRdmaWrite, 0, 100, 2);
  bad.remote(h.b, 4096);
  bad.sge.lkey ^= 0x10000000;
  ASSERT_EQ(h.post_send(h.a, bad), 0);
  // Posted after the failed WQE, while the first WRITE is unacknowledged.
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, 1000, 3).remote(h.b, 8192)), 0);
  std::vector<Wc> s;
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 3, &s));
  EXPECT_EQ(s[0].status, WcStatus::kSuccess);
  EXPECT_EQ(s[1].status, WcStatus::kLocProtErr);
  EXPECT_EQ(s[2].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(s[2].wr_id, 3u);
  EXPECT_EQ(std::memcmp(h.a.buf.data(), h.b.buf.data(), 3000), 0);
  EXPECT_TRUE(untouched(h.b, 4096, 8192)) << "a WQE behind the failed one was executed";
  EXPECT_EQ(state(h.a), QpState::kErr);
}

// A WQE that failed locally right behind one still in flight: the one in flight keeps its retransmit
// timer (its only packet is lost here), completes, and then the failed one reports.
TEST(Errors, LocalErrorBehindALostWqe) {
  QpOptions o = small();
  o.timeout = 10;
  Harness h({}, o);
  int n = 0;
  h.net_.drop_if = [&](uint64_t, std::span<const uint8_t>) { return n++ == 0; };
  fill(h.a.buf, 0, 100, 7);
  Wr good(h.a, WrOpcode::kRdmaWrite, 0, 100, 1);
  good.remote(h.b, 0);
  Wr bad(h.a, WrOpcode::kRdmaWrite, 0, 100, 2);
  bad.remote(h.b, 4096);
  bad.sge.lkey ^= 0x10000000;
  core::SendWr wrs[2] = {good, bad};
  size_t idx;
  ASSERT_EQ(h.a.qp->post_send(wrs, &idx), 0);
  EXPECT_NE(h.a.qp->next_deadline.load(), 0u) << "no retransmit timer for the WRITE in flight";
  std::vector<Wc> s;
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 2, &s, 1000));
  EXPECT_EQ(s[0].status, WcStatus::kSuccess);
  EXPECT_EQ(s[1].status, WcStatus::kLocProtErr);
  EXPECT_EQ(std::memcmp(h.a.buf.data(), h.b.buf.data(), 100), 0);
  EXPECT_EQ(h.a.counters.get(Counter::retry_timeouts), 1u);
  EXPECT_EQ(state(h.a), QpState::kErr);
}

// Every WQE behind a failed one completes with WR_FLUSH_ERR, in order, signaled or not; the failed one
// itself completes even though it was unsignaled; later posts are flushed at once.
TEST(Errors, FlushBehindFailedWqeSignaledOrNot) {
  Harness h({}, small());
  ASSERT_EQ(h.post_recv(h.b, 90, 0, 256), 0);
  Wr w0(h.a, WrOpcode::kRdmaWrite, 0, 100, 100);
  w0.remote(h.b, 0);
  w0.wr.rkey ^= 0x00100000;
  w0.wr.send_flags = 0;  // unsignaled
  ASSERT_EQ(h.post_send(h.a, w0), 0);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, 100, 101).remote(h.b, 0)), 0);
  Wr w2(h.a, WrOpcode::kSend, 0, 100, 102);
  w2.wr.send_flags = 0;
  ASSERT_EQ(h.post_send(h.a, w2), 0);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaRead, 200, 100, 103).remote(h.b, 0)), 0);
  std::vector<Wc> s;
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 4, &s));
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0].wr_id, 100u);
  EXPECT_EQ(s[0].status, WcStatus::kRemAccessErr);
  for (int i = 1; i < 4; ++i) {
    EXPECT_EQ(s[i].wr_id, 100u + i);
    EXPECT_EQ(s[i].status, WcStatus::kWrFlushErr);
    EXPECT_EQ(s[i].qp_num, h.a.qp->qpn());
  }
  EXPECT_EQ(state(h.a), QpState::kErr);
  EXPECT_EQ(state(h.b), QpState::kErr);
  std::vector<Wc> r;
  ASSERT_TRUE(h.wait(h.b, h.b.rcq, 1, &r));
  EXPECT_EQ(r[0].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(r[0].wr_id, 90u);

  // In ERR, a post succeeds and completes at once with WR_FLUSH_ERR (unsignaled too).
  Wr late(h.a, WrOpcode::kRdmaWrite, 0, 10, 104);
  late.remote(h.b, 0);
  late.wr.send_flags = 0;
  const uint64_t sent = h.net_.sent;
  ASSERT_EQ(h.post_send(h.a, late), 0);
  auto l = h.a.poll(h.a.scq);
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0].wr_id, 104u);
  EXPECT_EQ(l[0].status, WcStatus::kWrFlushErr);
  ASSERT_EQ(h.post_recv(h.b, 91, 0, 10), 0);
  auto lr = h.b.poll(h.b.rcq);
  ASSERT_EQ(lr.size(), 1u);
  EXPECT_EQ(lr[0].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(h.net_.sent, sent);
  EXPECT_TRUE(h.a.poll(h.a.scq).empty());
}

// modify(ERR) flushes every posted receive and every outstanding send, in order.
TEST(Errors, ModifyToErrFlushesQueues) {
  Harness h({.drop = 1.0}, small());
  for (uint64_t i = 0; i < 3; ++i) ASSERT_EQ(h.post_recv(h.b, 200 + i, i * 100, 100), 0);
  ASSERT_EQ(h.post_send(h.b, Wr(h.b, WrOpcode::kRdmaWrite, 0, 100, 300).remote(h.a, 0)), 0);
  Wr uns(h.b, WrOpcode::kSend, 0, 10, 301);
  uns.wr.send_flags = 0;
  ASSERT_EQ(h.post_send(h.b, uns), 0);
  core::QpAttr at;
  at.qp_state = QpState::kErr;
  ASSERT_EQ(h.b.qp->modify(at, kQpState), 0);
  EXPECT_EQ(state(h.b), QpState::kErr);
  auto r = h.b.poll(h.b.rcq);
  ASSERT_EQ(r.size(), 3u);
  for (uint64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r[i].wr_id, 200 + i);
    EXPECT_EQ(r[i].status, WcStatus::kWrFlushErr);
    EXPECT_EQ(r[i].qp_num, h.b.qp->qpn());
  }
  auto s = h.b.poll(h.b.scq);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].wr_id, 300u);
  EXPECT_EQ(s[1].wr_id, 301u);
  for (const Wc& wc : s) EXPECT_EQ(wc.status, WcStatus::kWrFlushErr);
  // Nothing fires later: the timers are gone with the WQEs.
  h.run([] { return false; }, 2000);
  EXPECT_TRUE(h.b.poll(h.b.scq).empty());
  EXPECT_EQ(h.b.counters.get(Counter::retry_timeouts), 0u);
}

}  // namespace
}  // namespace softrdma::test
