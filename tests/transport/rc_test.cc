// RC over the simulated network: every operation, sizes around the path MTU, and exactly-once delivery
// under drop, duplication, reordering and corruption.
#include <gtest/gtest.h>

#include <algorithm>

#include "transport/harness.h"
#include "transport/transport.h"
#include <arpa/inet.h>

namespace softrdma::test {
namespace {

bool same(const Node& x, uint64_t xo, const Node& y, uint64_t yo, uint32_t len) {
  return std::memcmp(x.buf.data() + xo, y.buf.data() + yo, len) == 0;
}

TEST(Rc, WriteSizesAroundMtu) {
  Harness h;
  // No UD QP: the sockets are not asked for each packet's TOS and TTL (io/backend.h, want_ip_fields).
  EXPECT_FALSE(h.a.be->ip_fields_wanted || h.b.be->ip_fields_wanted);
  uint64_t id = 0;
  for (uint32_t len : {0u, 1u, 3u, 1023u, 1024u, 1025u, 4096u, 65536u, 1048576u + 7}) {
    fill(h.a.buf, 0, len, len);
    SCOPED_TRACE(len);
    ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, len, ++id).remote(h.b, 100)), 0);
    std::vector<Wc> wcs;
    ASSERT_TRUE(h.run([&] {
      auto w = h.a.poll(h.a.scq);
      wcs.insert(wcs.end(), w.begin(), w.end());
      return !wcs.empty();
    }));
    ASSERT_EQ(wcs.size(), 1u);
    EXPECT_EQ(wcs[0].status, WcStatus::kSuccess);
    EXPECT_EQ(wcs[0].opcode, WcOpcode::kRdmaWrite);
    EXPECT_EQ(wcs[0].wr_id, id);
    EXPECT_TRUE(same(h.a, 0, h.b, 100, len)) << len;
  }
  EXPECT_EQ(h.b.counters.get(Counter::tx_acks) > 0, true);
}

TEST(Rc, SendRecvWithImmAndWriteWithImm) {
  Harness h;
  fill(h.a.buf, 0, 5000, 7);
  ASSERT_EQ(h.post_recv(h.b, 11, 0, 8192), 0);
  ASSERT_EQ(h.post_recv(h.b, 12, 8192, 8192), 0);
  Wr send(h.a, WrOpcode::kSendWithImm, 0, 5000, 1);
  send.wr.imm_data = htonl(0xABCD1234);
  ASSERT_EQ(h.post_send(h.a, send), 0);
  Wr wimm(h.a, WrOpcode::kRdmaWriteWithImm, 0, 3000, 2);
  wimm.remote(h.b, 100000);
  wimm.wr.imm_data = htonl(42);
  ASSERT_EQ(h.post_send(h.a, wimm), 0);
  std::vector<Wc> r, s;
  ASSERT_TRUE(h.run([&] {
    for (auto& w : h.b.poll(h.b.rcq)) r.push_back(w);
    for (auto& w : h.a.poll(h.a.scq)) s.push_back(w);
    return r.size() == 2 && s.size() == 2;
  }));
  EXPECT_EQ(r[0].wr_id, 11u);
  EXPECT_EQ(r[0].status, WcStatus::kSuccess);
  EXPECT_EQ(r[0].opcode, WcOpcode::kRecv);
  EXPECT_EQ(r[0].byte_len, 5000u);
  EXPECT_EQ(r[0].imm_data, htonl(0xABCD1234));
  EXPECT_TRUE(r[0].wc_flags & kWcWithImm);
  EXPECT_EQ(r[0].qp_num, h.b.qp->qpn());
  EXPECT_TRUE(same(h.a, 0, h.b, 0, 5000));
  EXPECT_EQ(r[1].wr_id, 12u);
  EXPECT_EQ(r[1].opcode, WcOpcode::kRecvRdmaWithImm);
  EXPECT_EQ(r[1].imm_data, htonl(42));
  EXPECT_EQ(r[1].byte_len, 3000u);
  EXPECT_TRUE(same(h.a, 0, h.b, 100000, 3000));
  EXPECT_EQ(s[0].opcode, WcOpcode::kSend);
  EXPECT_EQ(s[1].opcode, WcOpcode::kRdmaWrite);
}

TEST(Rc, ReadAndAtomics) {
  Harness h;
  fill(h.b.buf, 0, 300000, 3);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaRead, 0, 300000, 1).remote(h.b, 0)), 0);
  uint64_t target = 1000;
  std::memcpy(h.b.buf.data() + 400000, &target, 8);
  Wr fa(h.a, WrOpcode::kAtomicFetchAndAdd, 500000, 8, 2);
  fa.remote(h.b, 400000);
  fa.wr.compare_add = 5;
  ASSERT_EQ(h.post_send(h.a, fa), 0);
  Wr cas(h.a, WrOpcode::kAtomicCmpAndSwp, 500008, 8, 3);
  cas.remote(h.b, 400000);
  cas.wr.compare_add = 1005;
  cas.wr.swap = 77;
  ASSERT_EQ(h.post_send(h.a, cas), 0);
  Wr cas_miss(h.a, WrOpcode::kAtomicCmpAndSwp, 500016, 8, 4);
  cas_miss.remote(h.b, 400000);
  cas_miss.wr.compare_add = 1;
  cas_miss.wr.swap = 99;
  ASSERT_EQ(h.post_send(h.a, cas_miss), 0);
  std::vector<Wc> s;
  ASSERT_TRUE(h.run([&] {
    for (auto& w : h.a.poll(h.a.scq)) s.push_back(w);
    return s.size() == 4;
  }));
  for (auto& w : s) EXPECT_EQ(w.status, WcStatus::kSuccess) << w.wr_id;
  EXPECT_EQ(s[0].opcode, WcOpcode::kRdmaRead);
  EXPECT_EQ(s[0].byte_len, 300000u);
  EXPECT_TRUE(same(h.a, 0, h.b, 0, 300000));
  uint64_t r[3];
  std::memcpy(r, h.a.buf.data() + 500000, 24);
  EXPECT_EQ(r[0], 1000u);  // fetch-add returns the original
  EXPECT_EQ(r[1], 1005u);  // CAS matched
  EXPECT_EQ(r[2], 77u);    // CAS missed: returns current, swaps nothing
  std::memcpy(&target, h.b.buf.data() + 400000, 8);
  EXPECT_EQ(target, 77u);
  EXPECT_EQ(s[2].opcode, WcOpcode::kCompSwap);
  EXPECT_EQ(s[1].opcode, WcOpcode::kFetchAdd);
}

struct FaultCase {
  const char* name;
  io::Faults f;
};

class RcFaults : public ::testing::TestWithParam<FaultCase> {};

// Many operations of every kind under faults: each completes exactly once, in order, with the right data;
// every atomic executes exactly once.
TEST_P(RcFaults, ExactlyOnce) {
  for (uint64_t seed : {1, 2, 3}) {
    io::Faults f = GetParam().f;
    f.seed = seed;
    QpOptions o;
    o.timeout = 10;
    Harness h(f, o);
    const int kOps = 60;
    uint64_t expect_counter = 0;
    std::vector<uint32_t> lens;
    int recvs = 0;
    for (int i = 0; i < kOps; ++i) {
      const uint32_t len = 1 + (i * 7919u) % 20000u;
      const uint64_t src = uint64_t(i) * 32768;
      fill(h.a.buf, src, len, static_cast<uint32_t>(seed * 1000 + i));
      switch (i % 5) {
        case 0:
        case 1:
          ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, src, len, i).remote(h.b, src)), 0);
          break;
        case 2:
          ASSERT_EQ(h.post_recv(h.b, 1000 + i, src, 32768), 0);
          ++recvs;
          ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kSend, src, len, i)), 0);
          break;
        case 3: {
          fill(h.b.buf, src, len, static_cast<uint32_t>(seed * 7 + i));
          ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaRead, src, len, i).remote(h.b, src)), 0);
          break;
        }
        case 4: {
          Wr fa(h.a, WrOpcode::kAtomicFetchAndAdd, 3 << 20, 8, i);
          fa.remote(h.b, (3 << 20) + 8);
          fa.wr.compare_add = i;
          expect_counter += i;
          ASSERT_EQ(h.post_send(h.a, fa), 0);
          break;
        }
      }
      lens.push_back(len);
      // Let the queue drain a little so the SQ never fills.
      if (i % 20 == 19) {
        ASSERT_TRUE(h.run([&] { return h.a.qp->attr().qp_state == QpState::kRts; }, 1));
      }
    }
    std::vector<Wc> s, r;
    ASSERT_TRUE(h.run([&] {
      for (auto& w : h.a.poll(h.a.scq)) s.push_back(w);
      for (auto& w : h.b.poll(h.b.rcq)) r.push_back(w);
      return s.size() >= size_t(kOps) && r.size() >= size_t(recvs);
    })) << GetParam().name << " seed " << seed << " got " << s.size();
    h.run([] { return false; }, 200);  // let late duplicates arrive: nothing more may complete
    for (auto& w : h.a.poll(h.a.scq)) s.push_back(w);
    for (auto& w : h.b.poll(h.b.rcq)) r.push_back(w);
    ASSERT_EQ(s.size(), size_t(kOps));
    ASSERT_EQ(r.size(), size_t(recvs));
    for (int i = 0; i < kOps; ++i) {
      ASSERT_EQ(s[i].status, WcStatus::kSuccess) << GetParam().name << " op " << i;
      ASSERT_EQ(s[i].wr_id, uint64_t(i));
      const uint64_t off = uint64_t(i) * 32768;
      if (i % 5 != 4) {
        ASSERT_TRUE(same(h.a, off, h.b, off, lens[i])) << GetParam().name << " op " << i;
      }
    }
    for (auto& w : r) EXPECT_EQ(w.status, WcStatus::kSuccess);
    uint64_t counter;
    std::memcpy(&counter, h.b.buf.data() + (3 << 20) + 8, 8);
    EXPECT_EQ(counter, expect_counter) << GetParam().name << ": an atomic ran twice or not at all";
    if (GetParam().f.drop + GetParam().f.corrupt > 0) {
      EXPECT_GT(h.a.counters.get(Counter::retransmits), 0u);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Faults, RcFaults,
    ::testing::Values(FaultCase{"none", {}}, FaultCase{"drop5", {.drop = 0.05}},
                      FaultCase{"dup5", {.duplicate = 0.05}}, FaultCase{"reorder5", {.reorder = 0.05}},
                      FaultCase{"corrupt5", {.corrupt = 0.05}},
                      FaultCase{"all", {.drop = 0.02, .duplicate = 0.02, .reorder = 0.02, .corrupt = 0.02}}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace softrdma::test

namespace softrdma::test {
namespace {

// Records the wake-ups a context asks of its progress thread (Context::set_kick) until stop().
struct KickLog {
  core::Context* ctx;
  std::vector<Nanos> by;
  explicit KickLog(core::Context* c) : ctx(c) {
    ctx->set_kick([](void* v, Nanos t) { static_cast<KickLog*>(v)->by.push_back(t); }, this);
  }
  ~KickLog() { stop(); }
  KickLog(const KickLog&) = delete;
  KickLog& operator=(const KickLog&) = delete;
  void stop() { ctx->set_kick(nullptr, nullptr); }
  auto watches() const { return std::count(by.begin(), by.end(), core::Context::kKickWatch); }
};

// Standard mode: one socket at UDP 4791 per address carries every QP, and peers are addressed at 4791
// (as kernel Soft-RoCE and hardware expect); QPNs no longer name a port.
// The context's in-flight budget is shared by its RC QPs in RTS (and only by those).
TEST(Rc, SendWindowIsTheContextBudgetShared) {
  QpOptions o;
  o.inflight_budget = 256 * 1024;
  Harness h({}, o);
  EXPECT_EQ(h.a.ctx->window_for(1024), 256u);  // one sharer: the whole budget, within the window
  EXPECT_EQ(h.a.ctx->window_for(4096), 64u);
  core::Qp* first = h.a.qp;
  core::QpInitAttr init = first->init();
  h.a.qp = *h.a.ctx->create_qp(h.a.pd, init);
  EXPECT_EQ(h.a.ctx->window_for(1024), 256u);  // not sending yet
  h.connect(h.a, h.b);
  EXPECT_EQ(h.a.ctx->window_for(1024), 128u);
  EXPECT_EQ(h.a.ctx->window_for(4096), 32u);
  core::QpAttr at;
  at.qp_state = QpState::kErr;
  ASSERT_EQ(h.a.qp->modify(at, kQpState), 0);
  EXPECT_EQ(h.a.ctx->window_for(1024), 128u);  // an errored QP shares until it is reset or destroyed
  at.qp_state = QpState::kReset;
  ASSERT_EQ(h.a.qp->modify(at, kQpState), 0);
  EXPECT_EQ(h.a.ctx->window_for(1024), 256u);
  h.connect(h.a, h.b);
  EXPECT_EQ(h.a.ctx->window_for(1024), 128u);
  ASSERT_EQ(h.a.ctx->destroy_qp(h.a.qp), 0);
  h.a.qp = first;
  EXPECT_EQ(h.a.ctx->window_for(1024), 256u);
  o.inflight_budget = 1024;
  Harness tiny({}, o);
  EXPECT_EQ(tiny.a.ctx->window_for(1024), core::Context::kMinWindow);
}

// A window shrunk to the least still flows: the requester asks for ACKs often enough that no packet
// waits for the retransmit timer (with one AckReq per 64 packets, a 16-packet window stalled for it).
TEST(Rc, SmallestWindowNeedsNoTimeout) {
  QpOptions o;
  o.inflight_budget = 1024;
  Harness h({}, o);
  ASSERT_EQ(h.a.ctx->window_for(1024), 16u);
  const uint32_t len = 1 << 20;
  fill(h.a.buf, 0, len, 7);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, len).remote(h.b, 0)), 0);
  std::vector<Wc> wcs;
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &wcs));
  EXPECT_EQ(wcs[0].status, WcStatus::kSuccess);
  EXPECT_TRUE(same(h.a, 0, h.b, 0, len));
  EXPECT_EQ(h.a.counters.get(Counter::retry_timeouts), 0u);
  EXPECT_EQ(h.a.counters.get(Counter::retransmits), 0u);
}

// A path whose backend bounds what it can hold (a socket's receive buffer, Backend::inflight_cap) keeps the
// window within that bound, a WRITE's packets and a READ's responses alike, and still flows without a
// timeout. (Without root, the 4 MiB budget overran a socket capped by net.core.rmem_max: go-back-N.)
TEST(Rc, WindowKeepsWithinThePathsCap) {
  QpOptions o;
  Harness h({}, o);
  const uint64_t budget = core::ContextConfig{}.inflight_budget;
  // Unbounded, a window is 1 MiB of payload whatever the path MTU (256 packets of 4 KiB, 1,024 of 1 KiB).
  EXPECT_EQ(h.a.ctx->window_for(4096, 0), 256u);
  EXPECT_EQ(h.a.ctx->window_for(1024, 0), 1024u);
  EXPECT_EQ(h.a.ctx->window_for(1024, 0), std::min<uint64_t>(o.window_bytes / 1024, budget / 1024));
  EXPECT_EQ(h.a.ctx->window_for(1024, budget * 2),
            std::min<uint64_t>(o.window_bytes / 1024, budget / 1024));  // no bound
  EXPECT_EQ(h.a.ctx->window_for(1024, 40 * 1024), 40u);
  EXPECT_EQ(h.a.ctx->window_for(4096, 1024), core::Context::kMinCappedWindow);

  // The cap is the backend's answer when the QP is connected.
  h.a.be->cap = 16 * 1024;
  core::QpAttr at;
  at.qp_state = QpState::kReset;
  ASSERT_EQ(h.a.qp->modify(at, kQpState), 0);
  h.connect(h.a, h.b);
  const uint32_t len = 1 << 20;
  fill(h.a.buf, 0, len, 3);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, len).remote(h.b, 0)), 0);
  EXPECT_EQ(h.net_.in_flight(), 16u);  // 16 KiB of 1 KiB packets, the rest after their ACKs
  std::vector<Wc> wcs;
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &wcs));
  EXPECT_EQ(wcs[0].status, WcStatus::kSuccess);
  EXPECT_TRUE(same(h.a, 0, h.b, 0, len));

  fill(h.b.buf, len, len, 9);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaRead, 2 * len, len).remote(h.b, len)), 0);
  h.net_.deliver();
  io::RxPacket pkts[32];
  const uint32_t k = h.b.be->rx_burst(pkts, 32);
  ASSERT_GE(k, 1u);
  h.b.ctx->rx_burst(std::span(pkts, k), h.b.tx, g_now);
  EXPECT_LE(h.net_.in_flight(), 16u);  // the responses to what the window let the requester ask for
  EXPECT_GE(h.net_.in_flight(), 8u);
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &wcs));
  EXPECT_EQ(wcs[1].status, WcStatus::kSuccess);
  EXPECT_TRUE(same(h.a, 2 * len, h.b, len, len));

  // The least window, one packet (a cap smaller than a packet, or shared by many QPs), still flows.
  h.a.be->cap = 512;
  for (Node* n : {&h.a, &h.b}) ASSERT_EQ(n->qp->modify(at, kQpState), 0);  // both sides start anew
  h.connect(h.a, h.b);
  h.connect(h.b, h.a);
  ASSERT_EQ(h.a.ctx->window_for(1024, 512), core::Context::kMinCappedWindow);
  fill(h.a.buf, 0, len / 4, 5);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, len / 4).remote(h.b, 0)), 0);
  EXPECT_EQ(h.net_.in_flight(), core::Context::kMinCappedWindow);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaRead, 2 * len, len / 4).remote(h.b, len)), 0);
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 2, &wcs));
  ASSERT_EQ(wcs.size(), 4u);
  EXPECT_EQ(wcs[2].status, WcStatus::kSuccess);
  EXPECT_EQ(wcs[3].status, WcStatus::kSuccess);
  EXPECT_TRUE(same(h.a, 0, h.b, 0, len / 4));
  EXPECT_TRUE(same(h.a, 2 * len, h.b, len, len / 4));
  EXPECT_EQ(h.a.counters.get(Counter::retry_timeouts), 0u);
  EXPECT_EQ(h.a.counters.get(Counter::retransmits), 0u);
}

// A thread that finds another driving (drive() returns -1) hands over: the driver reads the sockets once
// more before it lets go. Here the packet arrives after the driver's last read (a real socket may not
// wake anyone for it): without the hand-over it stayed unread until a retransmission, 67 ms later with
// perftest's timeout (ib_write_lat, whose application spins on memory, did so a few times a run).
TEST(Rc, DriverReadsAgainForAThreadThatFoundItBusy) {
  Harness h;
  fill(h.a.buf, 0, 8, 4);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, 8, 1).remote(h.b, 0)), 0);
  bool handed = false;
  h.b.be->after_rx = [&] {
    io::TxBatch other;
    other.sink = h.b.be.get();
    EXPECT_EQ(h.b.ctx->drive(other, g_now, false), -1);  // busy: this thread is inside its receive
    handed = h.b.ctx->hand_over();
    h.net_.deliver();  // the WRITE arrives after that receive read the inbox
  };
  EXPECT_EQ(h.b.ctx->drive(h.b.tx, g_now, false), 1);
  EXPECT_TRUE(handed);
  EXPECT_TRUE(same(h.a, 0, h.b, 0, 8));
  EXPECT_EQ(h.b.counters.get(Counter::tx_acks), 1u);
}

// The ACK of a QP that also sends waits for that QP's next post, and goes after the request (Transport::
// end_burst): a ping-pong's answer then reaches the peer before the ACK that the peer's application polls
// for, so that application is still polling when the answer comes and needs no other thread to receive it.
// Without a post the ACK goes by its deadline (or when the QP goes away, below); a QP that never sent
// (ib_write_bw's server) acknowledges at once.
TEST(Rc, AckOfAQpThatSendsGoesAfterItsNextRequest) {
  Harness h;
  std::vector<uint8_t> ops;  // opcodes in send order
  h.net_.drop_if = [&](uint64_t, std::span<const uint8_t> f) {
    ops.push_back(f[0]);
    return false;
  };
  const uint8_t write = wire::opcode(wire::Transport::kRc, wire::kOpWriteOnly);
  const uint8_t ack = wire::opcode(wire::Transport::kRc, wire::kOpAcknowledge);
  using Ops = std::vector<uint8_t>;
  // b receives what is on the network now, as one burst (the way a polling application's drive does).
  auto b_receives = [&] {
    h.net_.deliver();
    io::RxPacket pkts[4];
    const uint32_t k = h.b.be->rx_burst(pkts, 4);
    ASSERT_EQ(k, 1u);
    h.b.ctx->rx_burst(std::span(pkts, k), h.b.tx, g_now);
  };
  fill(h.a.buf, 0, 64, 1);
  fill(h.b.buf, 64, 64, 2);

  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, 8, 1).remote(h.b, 0)), 0);
  b_receives();
  EXPECT_EQ(ops, (Ops{write, ack})) << "b never sent: its ACK goes at once";
  std::vector<Wc> wcs;
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &wcs));
  ASSERT_EQ(h.post_send(h.b, Wr(h.b, WrOpcode::kRdmaWrite, 64, 8, 2).remote(h.a, 64)), 0);
  ASSERT_TRUE(h.wait(h.b, h.b.scq, 1, &wcs));

  // The answer first, then the ACK.
  ops.clear();
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 8, 8, 3).remote(h.b, 8)), 0);
  b_receives();
  EXPECT_TRUE(same(h.a, 8, h.b, 8, 8));
  EXPECT_EQ(ops, (Ops{write}));
  ASSERT_EQ(h.post_send(h.b, Wr(h.b, WrOpcode::kRdmaWrite, 72, 8, 4).remote(h.a, 72)), 0);
  EXPECT_EQ(ops, (Ops{write, write, ack}));
  EXPECT_EQ(h.b.counters.get(Counter::acks_deferred), 1u);
  EXPECT_EQ(h.b.counters.get(Counter::acks_deferred_late), 0u);
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &wcs));
  ASSERT_TRUE(h.wait(h.b, h.b.scq, 1, &wcs));

  // No answer: the deadline. A sleeping progress thread is asked to wake if it would sleep well past it
  // (the application thread that received may not poll again).
  ops.clear();
  KickLog kicks(h.b.ctx.get());
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 16, 8, 5).remote(h.b, 16)), 0);
  b_receives();
  const Nanos due = g_now + core::Transport::kAckDeferNs;
  EXPECT_EQ(kicks.by, (std::vector<Nanos>{due + core::Context::kLateAckNs}));
  kicks.stop();
  EXPECT_EQ(h.b.ctx->tick(h.b.tx, due - 1), due);
  EXPECT_EQ(ops, (Ops{write}));
  h.b.ctx->tick(h.b.tx, due);
  EXPECT_EQ(ops, (Ops{write, ack}));
  EXPECT_EQ(h.b.counters.get(Counter::acks_deferred), 2u);
  EXPECT_EQ(h.b.counters.get(Counter::acks_deferred_late), 1u);

  // A second deadline in a row: the QP's answers wait for its ACKs, so the next ones go at once.
  ops.clear();
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 24, 8, 6).remote(h.b, 24)), 0);
  b_receives();
  h.b.ctx->tick(h.b.tx, g_now + core::Transport::kAckDeferNs);
  EXPECT_EQ(ops, (Ops{write, ack}));
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 2, &wcs));  // a takes both ACKs
  ops.clear();
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 32, 8, 7).remote(h.b, 32)), 0);
  b_receives();
  EXPECT_EQ(ops, (Ops{write, ack})) << "after two deadlines in a row, at once";

  EXPECT_EQ(h.a.counters.get(Counter::retransmits), 0u);
}

// After two deferred ACKs in a row went by their deadline, the next kAckBackoffMin go at once; each time
// that happens again, twice as many (up to kAckBackoffMax); an answer in time starts over. (A fixed 64 at
// the start of socket-path ib_write_lat, whose first iterations are slow, cost about 3 ms in 5 runs of 12.)
TEST(Rc, AckBackoffGrowsWhileAnswersComeLateAndStartsOverWithOneInTime) {
  Harness h;
  uint32_t sent = 0;  // packets b sent
  h.net_.drop_if = [&](uint64_t, std::span<const uint8_t> f) {
    if (f[0] == wire::opcode(wire::Transport::kRc, wire::kOpAcknowledge)) ++sent;
    return false;
  };
  std::vector<Wc> wcs;
  uint64_t off = 0;
  // a WRITEs to b, b receives it as one burst; whether b's ACK went at once.
  auto acked_at_once = [&] {
    const uint32_t before = sent;
    EXPECT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, off % 64, 8, off).remote(h.b, off % 64)), 0);
    ++off;
    h.net_.deliver();
    io::RxPacket pkts[4];
    const uint32_t k = h.b.be->rx_burst(pkts, 4);
    EXPECT_EQ(k, 1u);
    h.b.ctx->rx_burst(std::span(pkts, k), h.b.tx, g_now);
    return sent != before;
  };
  auto a_completes = [&] { ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &wcs)); };
  auto late = [&] {  // a deferred ACK goes by its deadline
    ASSERT_FALSE(acked_at_once());
    h.b.ctx->tick(h.b.tx, g_now + core::Transport::kAckDeferNs);
    a_completes();
  };
  auto at_once_for = [&](uint32_t n) {  // the next n ACKs go at once, the one after is deferred
    for (uint32_t i = 0; i < n; ++i) {
      ASSERT_TRUE(acked_at_once()) << "ACK " << i << " of " << n;
      a_completes();
    }
    ASSERT_FALSE(acked_at_once()) << "more than " << n << " at once";
  };
  // b sends too (a QP that never did acknowledges at once).
  ASSERT_TRUE(acked_at_once());
  a_completes();
  ASSERT_EQ(h.post_send(h.b, Wr(h.b, WrOpcode::kRdmaWrite, 64, 8, 100).remote(h.a, 64)), 0);
  ASSERT_TRUE(h.wait(h.b, h.b.scq, 1, &wcs));

  late();
  late();
  at_once_for(core::Transport::kAckBackoffMin);
  h.b.ctx->tick(h.b.tx, g_now + core::Transport::kAckDeferNs);  // the deferred one: late, once
  a_completes();
  late();
  at_once_for(2 * core::Transport::kAckBackoffMin);
  // An answer in time: b posts while its ACK waits, and the ACK goes behind it.
  ASSERT_EQ(h.post_send(h.b, Wr(h.b, WrOpcode::kRdmaWrite, 72, 8, 101).remote(h.a, 72)), 0);
  ASSERT_TRUE(h.wait(h.b, h.b.scq, 1, &wcs));
  a_completes();
  late();
  late();
  at_once_for(core::Transport::kAckBackoffMin);
  h.b.ctx->tick(h.b.tx, g_now + core::Transport::kAckDeferNs);
  a_completes();
  // Doubling stops at kAckBackoffMax.
  constexpr uint32_t kMax = core::Transport::kAckBackoffMax;
  for (uint32_t n = core::Transport::kAckBackoffMin * 2;; n = std::min(2 * n, kMax)) {
    late();
    at_once_for(n);
    h.b.ctx->tick(h.b.tx, g_now + core::Transport::kAckDeferNs);
    a_completes();
    if (n == kMax) break;
  }
  late();
  at_once_for(kMax);
  EXPECT_EQ(h.a.counters.get(Counter::retransmits), 0u);
}

// While a driver's batch may hold packets that an ACK released (Context::rx_burst sends them at the end of
// its burst), a post on the same QP must not send its own first: it waits, and the driver sends it when it
// releases the QP, in order. Not later: the QP may have no packet out (no ACK to come), and the poster's
// list of corked QPs may have had no room for it (64-QP softrdma-soak runs stalled so).
TEST(Rc, APostBehindHeldPacketsWaitsForTheRelease) {
  Harness h;
  std::vector<uint8_t> ops;
  h.net_.drop_if = [&](uint64_t, std::span<const uint8_t> f) {
    ops.push_back(f[0]);
    return false;
  };
  fill(h.a.buf, 0, 64, 7);
  {
    std::lock_guard g(h.a.qp->lock());
    core::Transport::hold_tx(*h.a.qp);
  }
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, 8, 1).remote(h.b, 0)), 0);
  EXPECT_TRUE(ops.empty()) << "sent while held";
  {
    std::lock_guard g(h.a.qp->lock());
    EXPECT_TRUE(core::Transport::release_tx(*h.a.qp, h.a.tx, g_now));
    h.a.tx.flush();
  }
  EXPECT_EQ(ops.size(), 1u) << "the release sent nothing";
  {
    std::lock_guard g(h.a.qp->lock());
    EXPECT_FALSE(core::Transport::release_tx(*h.a.qp, h.a.tx, g_now)) << "nothing was posted meanwhile";
  }
  std::vector<Wc> wcs;
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &wcs));
  EXPECT_EQ(wcs[0].status, WcStatus::kSuccess);
  EXPECT_TRUE(same(h.a, 0, h.b, 0, 8));
  EXPECT_EQ(ops.size(), 2u);  // the WRITE and its ACK
  // Not held: a post sends at once.
  ops.clear();
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 8, 8, 2).remote(h.b, 8)), 0);
  EXPECT_EQ(ops.size(), 1u);
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &wcs));
}

// A ping-pong whose ACKs come behind the peer's answers (end_burst defers them): an ACK that comes alone
// means the answer comes after it, maybe when the application has stopped polling, so the receiving
// context asks its progress thread to watch the sockets (Context::kKickWatch). A stream's ACKs, which
// never come behind requests, do not.
// Receives at n what the network holds for it, as the progress thread would (not from a poll).
void receives(Harness& h, Node& n, int line) {
  h.net_.deliver();
  io::RxPacket pkts[8];
  const uint32_t k = n.be->rx_burst(pkts, 8);
  ASSERT_GE(k, 1u) << "line " << line;
  n.ctx->rx_burst(std::span(pkts, k), n.tx, g_now);
}

// a and b in a ping-pong of WRITEs, each carrying the ACK of the other's last one behind it, for enough
// rounds that each side takes the other's ACKs as those of a ping-pong (Transport::ack_came_alone); a's
// completions polled. a last sent, b last answered.
void ping_pong(Harness& h) {
  ASSERT_EQ(h.post_send(h.b, Wr(h.b, WrOpcode::kRdmaWrite, 0, 8, 100).remote(h.a, 0)), 0);
  receives(h, h.a, __LINE__);  // a has sent: it defers its ACK to its answer
  for (uint32_t i = 0; i < core::Transport::kPingPongAcks + 2; ++i) {
    ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 8, 8, 200 + i).remote(h.b, 8)), 0);
    receives(h, h.b, __LINE__);  // a's WRITE and the ACK of b's
    ASSERT_EQ(h.post_send(h.b, Wr(h.b, WrOpcode::kRdmaWrite, 16, 8, 300 + i).remote(h.a, 16)), 0);
    receives(h, h.a, __LINE__);  // b's WRITE, then the ACK of a's
  }
  EXPECT_EQ(h.a.poll(h.a.scq).size(), core::Transport::kPingPongAcks + 2);
}

TEST(Rc, AnAckThatComesWithoutTheAnswerAsksForAWatch) {
  Harness h;
  std::vector<Wc> wcs;
  // A stream: a's WRITEs, each ACKed at once by b (which never sent).
  for (uint32_t i = 0; i < 12; ++i)
    ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 8 * i, 8, i).remote(h.b, 8 * i)), 0);
  KickLog kicks(h.a.ctx.get());
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 12, &wcs));
  EXPECT_EQ(kicks.watches(), 0);
  EXPECT_EQ(h.a.counters.get(Counter::answer_holds), 0u);

  ping_pong(h);
  EXPECT_EQ(kicks.watches(), 0);
  EXPECT_FALSE(h.a.ctx->take_watch_request());

  // b's answer is late: its ACK goes alone at the deadline, and a, which receives it here as the progress
  // thread would, asks for a watch at once (its application may be spinning on memory by now).
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 8, 8, 400).remote(h.b, 8)), 0);
  receives(h, h.b, __LINE__);
  h.b.ctx->tick(h.b.tx, g_now + core::Transport::kAckDeferNs);
  receives(h, h.a, __LINE__);
  EXPECT_EQ(kicks.watches(), 1);
  EXPECT_TRUE(h.a.ctx->take_watch_request());
  EXPECT_FALSE(h.a.ctx->take_watch_request()) << "once";
  // The completion is held from polls for the answer, and released when the time is up.
  EXPECT_EQ(h.a.poll(h.a.scq).size(), 0u);
  g_now += core::Context::kAnswerHoldNs;
  EXPECT_EQ(h.a.poll(h.a.scq).size(), 1u);
  EXPECT_EQ(h.a.counters.get(Counter::answer_holds), 1u);
  EXPECT_EQ(h.a.counters.get(Counter::answer_holds_late), 1u);
  // b answers, and its next ACK comes alone again: within the same millisecond no second ask (the watch
  // that the first started lasts about that long); a millisecond later, one.
  auto answer_then_late_ack = [&](uint64_t id) {
    ASSERT_EQ(h.post_send(h.b, Wr(h.b, WrOpcode::kRdmaWrite, 16, 8, id).remote(h.a, 16)), 0);
    receives(h, h.a, __LINE__);  // b's answer (a defers its ACK)
    ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 8, 8, id + 1).remote(h.b, 8)), 0);
    receives(h, h.b, __LINE__);
    h.b.ctx->tick(h.b.tx, g_now + core::Transport::kAckDeferNs);
    receives(h, h.a, __LINE__);  // b's ACK, alone
  };
  answer_then_late_ack(500);
  EXPECT_EQ(kicks.watches(), 1);
  g_now += core::Context::kWatchAskGapNs;
  answer_then_late_ack(600);
  EXPECT_EQ(kicks.watches(), 2);
  EXPECT_TRUE(h.a.ctx->take_watch_request());
  EXPECT_EQ(h.a.counters.get(Counter::retransmits), 0u);
}

// A thread that polls an empty CQ gives up its CPU (sched_yield) after 20 us of polls that found nothing,
// not after a count of them: on the same-host path a poll is no system call, and 16 of them (the rule
// before) took about 1 us, so a ping-pong's waiting side yielded about once per round trip.
TEST(Rc, AnIdlePollingThreadYieldsAfter20UsNotAfterACountOfPolls) {
  Harness h;
  // The polling thread's clock is read every 16th poll: 32 polls first, so that it is not one an earlier
  // test of this process left (the fake clock has moved on since), which would date the run back.
  for (int i = 0; i < 32; ++i) EXPECT_TRUE(h.a.poll(h.a.scq).empty());
  ASSERT_EQ(h.post_send(h.b, Wr(h.b, WrOpcode::kRdmaWrite, 0, 8, 1).remote(h.a, 0)), 0);
  h.net_.deliver();
  EXPECT_TRUE(h.a.poll(h.a.scq).empty());  // receives b's WRITE: the run of idle polls begins after it
  const uint64_t y0 = h.a.counters.get(Counter::poll_yields);
  for (int i = 0; i < 1000; ++i) {
    if (i % 100 == 99) g_now += 1'000;  // 10 us in all
    EXPECT_TRUE(h.a.poll(h.a.scq).empty());
  }
  EXPECT_EQ(h.a.counters.get(Counter::poll_yields), y0) << "1,000 idle polls within 10 us";
  g_now += core::Context::kYieldAfterIdleNs;
  for (int i = 0; i < 32; ++i) EXPECT_TRUE(h.a.poll(h.a.scq).empty());
  EXPECT_EQ(h.a.counters.get(Counter::poll_yields), y0 + 1);
  for (int i = 0; i < 1000; ++i) EXPECT_TRUE(h.a.poll(h.a.scq).empty());
  EXPECT_EQ(h.a.counters.get(Counter::poll_yields), y0 + 1) << "the next run begins at the yield";
  g_now += core::Context::kYieldAfterIdleNs;
  for (int i = 0; i < 32; ++i) EXPECT_TRUE(h.a.poll(h.a.scq).empty());
  EXPECT_EQ(h.a.counters.get(Counter::poll_yields), y0 + 2);
}

// The same late ACK received by the application's own poll: the poll is held (it returns nothing and
// receives on) until b's answer comes, and then returns the completion with the answer in a's memory. No
// watch is asked for. Without an answer in time, the completion is returned then and the watch asked.
TEST(Rc, ALoneAckOfAPingPongHoldsThePollForTheAnswer) {
  Harness h;
  KickLog kicks(h.a.ctx.get());
  ping_pong(h);
  EXPECT_EQ(kicks.watches(), 0);

  auto late_ack = [&](uint64_t id) {
    ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 8, 8, id).remote(h.b, 8)), 0);
    receives(h, h.b, __LINE__);
    h.b.ctx->tick(h.b.tx, g_now + core::Transport::kAckDeferNs);  // b's ACK goes alone
    h.net_.deliver();
  };
  late_ack(400);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(h.a.poll(h.a.scq).empty()) << "held, poll " << i;
  EXPECT_EQ(h.a.counters.get(Counter::answer_holds), 1u);
  EXPECT_EQ(h.a.scq->pending(), 1u) << "the ACK was received, its completion is in the CQ";
  EXPECT_EQ(kicks.watches(), 0);
  g_now += core::Context::kAnswerHoldNs - 1;
  EXPECT_TRUE(h.a.poll(h.a.scq).empty()) << "still held just before the end";

  // b answers: a's next poll receives it and returns the completion, the answer already in memory.
  std::fill(h.b.buf.begin() + 16, h.b.buf.begin() + 24, uint8_t{0x5A});
  ASSERT_EQ(h.post_send(h.b, Wr(h.b, WrOpcode::kRdmaWrite, 16, 8, 450).remote(h.a, 16)), 0);
  h.net_.deliver();
  const std::vector<Wc> got = h.a.poll(h.a.scq);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id, 400u);
  EXPECT_EQ(got[0].status, WcStatus::kSuccess);
  EXPECT_TRUE(std::all_of(h.a.buf.begin() + 16, h.a.buf.begin() + 24, [](uint8_t v) { return v == 0x5A; }));
  EXPECT_EQ(h.a.counters.get(Counter::answer_holds_late), 0u);
  EXPECT_EQ(kicks.watches(), 0);

  // No answer in time: the completion comes when the hold ends, and the progress thread is asked to watch.
  late_ack(500);
  EXPECT_TRUE(h.a.poll(h.a.scq).empty());
  g_now += core::Context::kAnswerHoldNs;
  ASSERT_EQ(h.a.poll(h.a.scq).size(), 1u);
  EXPECT_EQ(h.a.counters.get(Counter::answer_holds), 2u);
  EXPECT_EQ(h.a.counters.get(Counter::answer_holds_late), 1u);
  EXPECT_EQ(kicks.watches(), 1);
  EXPECT_TRUE(h.a.ctx->take_watch_request());
  EXPECT_EQ(h.a.counters.get(Counter::retransmits), 0u);
}

// The ACK of a ping-pong's QP that comes alone holds the poll only where nothing else is outstanding on the
// QP: with more WRITEs posted (a stream both ways, ib_send_bw -b, whose ACKs so came once per 3 messages)
// the application waits for no answer, and its completions, of both directions where one CQ has them, are
// returned at once.
TEST(Rc, ALoneAckHoldsNoPollWhileMoreIsOutstanding) {
  Harness h;
  ping_pong(h);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 8, 8, 400).remote(h.b, 8)), 0);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 24, 8, 401).remote(h.b, 24)), 0);
  h.net_.deliver();
  io::RxPacket first;
  ASSERT_EQ(h.b.be->rx_burst(&first, 1), 1u);  // b takes a's first WRITE only
  h.b.ctx->rx_burst(std::span(&first, 1), h.b.tx, g_now);
  h.b.ctx->tick(h.b.tx, g_now + core::Transport::kAckDeferNs);  // its ACK goes alone, by the deadline
  h.net_.deliver();
  Wc wc[4];
  ASSERT_EQ(h.a.scq->poll(wc), 1) << "not held: 401 is still outstanding";
  EXPECT_EQ(wc[0].wr_id, 400u);
  EXPECT_EQ(h.a.counters.get(Counter::answer_holds), 0u);
}

// An answer of several packets (socket ib_write_lat at 512 KiB and 1 MiB: 2-4 ms typical a half round trip,
// now 0.07-0.12): its first packet does not end the hold, its last does. Ended by the first, the poll
// returned the completion while the rest of the answer was still to come, the application spun on its
// memory, and the progress thread, asleep beside two spinning applications, received the rest ms later.
TEST(Rc, AHeldPollWaitsForTheAnswersLastPacket) {
  Harness h;
  ping_pong(h);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 8, 8, 400).remote(h.b, 8)), 0);
  receives(h, h.b, __LINE__);
  h.b.ctx->tick(h.b.tx, g_now + core::Transport::kAckDeferNs);  // b's ACK goes alone
  h.net_.deliver();
  EXPECT_TRUE(h.a.poll(h.a.scq).empty()) << "held";
  EXPECT_EQ(h.a.counters.get(Counter::answer_holds), 1u);

  // b answers with 3 packets (1 KiB path MTU); a receives the first alone, then polls.
  const uint32_t len = 3 * 1024;
  fill(h.b.buf, 4096, len, 77);
  ASSERT_EQ(h.post_send(h.b, Wr(h.b, WrOpcode::kRdmaWrite, 4096, len, 450).remote(h.a, 4096)), 0);
  h.net_.deliver();
  io::RxPacket first;
  ASSERT_EQ(h.a.be->rx_burst(&first, 1), 1u);
  h.a.ctx->rx_burst(std::span(&first, 1), h.a.tx, g_now);
  Wc wc[4];
  ASSERT_EQ(h.a.scq->poll(wc), 1);  // one poll, as the application's
  EXPECT_EQ(wc[0].wr_id, 400u);
  EXPECT_EQ(std::memcmp(h.a.buf.data() + 4096, h.b.buf.data() + 4096, len), 0) << "the whole answer is there";
  EXPECT_EQ(h.a.counters.get(Counter::answer_holds_late), 0u);
}

// An answer larger than the peer's window (socket ib_write_lat from 2 MiB: 256 packets of 4 KiB): b sends
// its first window, then the ACK it deferred to its post, and the rest only after a's ACK of that window.
// a's ACK goes at the end of the burst, not deferred to a post (none can come before the answer is whole),
// and the completion that b's ACK brought is held from a's polls until the answer's last packet, for as
// long as the pause for the window takes. Before, a's poll returned the completion with half the answer
// to come, a's ACK waited for its deadline, and the application spun on memory while the rest waited for
// the napping progress thread: 6-12 ms a half round trip at 2 MiB, in steps of the scheduler's tick.
TEST(Rc, AnAnswerLargerThanTheWindowKeepsThePollHeldAndItsAckUndeferred) {
  Harness h;
  core::QpAttr at;
  at.qp_state = QpState::kReset;
  h.b.be->cap = 2 * 1024;  // b's window: 2 packets of 1 KiB
  for (Node* n : {&h.a, &h.b}) ASSERT_EQ(n->qp->modify(at, kQpState), 0);
  h.connect(h.a, h.b);
  h.connect(h.b, h.a);
  ping_pong(h);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 8, 8, 400).remote(h.b, 8)), 0);
  receives(h, h.b, __LINE__);  // b defers its ACK to its answer
  const uint32_t len = 4 * 1024;
  fill(h.b.buf, 4096, len, 41);
  ASSERT_EQ(h.post_send(h.b, Wr(h.b, WrOpcode::kRdmaWrite, 4096, len, 450).remote(h.a, 4096)), 0);
  EXPECT_EQ(h.net_.in_flight(), 3u) << "b's first window, then its ACK";
  h.net_.deliver();
  const uint64_t acks = h.a.counters.get(Counter::tx_acks);
  const uint64_t deferred = h.a.counters.get(Counter::acks_deferred);
  Wc wc[4];
  EXPECT_EQ(h.a.scq->poll(wc), 0) << "held: half the answer is still to come";
  EXPECT_EQ(h.a.counters.get(Counter::tx_acks), acks + 1) << "a's ACK of b's first window left at once";
  EXPECT_EQ(h.a.counters.get(Counter::acks_deferred), deferred);
  EXPECT_EQ(h.net_.in_flight(), 1u);
  // The pause for the window outlasts the hold of an ACK that came alone (kAnswerHoldNs).
  g_now += core::Context::kAnswerHoldNs + 1;
  EXPECT_EQ(h.a.scq->poll(wc), 0);
  receives(h, h.b, __LINE__);  // a's ACK: b sends the rest
  h.net_.deliver();
  ASSERT_EQ(h.a.scq->poll(wc), 1);  // one poll receives it and returns the completion
  EXPECT_EQ(wc[0].wr_id, 400u);
  EXPECT_EQ(std::memcmp(h.a.buf.data() + 4096, h.b.buf.data() + 4096, len), 0) << "the whole answer is there";
  EXPECT_EQ(h.a.counters.get(Counter::answer_holds_late), 0u);
  EXPECT_EQ(h.a.counters.get(Counter::retransmits) + h.b.counters.get(Counter::retransmits), 0u);
}

// a's backend as a same-host one: a WRITE that may go one-sided lands in b's buffer at once; one that may
// go only through pages the peer shares (the ring's way, Transport::lone_write_by_ring) goes as a packet.
struct OneSidedWrites {
  uint64_t count = 0;
  explicit OneSidedWrites(Harness& h) {
    h.a.be->direct_hook = [this](const wire::Endpoint&, const io::DirectOp& op) {
      if (op.shared_only || op.read || op.atomic) return -1;
      auto* d = reinterpret_cast<uint8_t*>(op.va);
      for (uint32_t i = 0; i < op.nseg; ++i)
        d = static_cast<uint8_t*>(mempcpy(d, op.segs[i].addr, op.segs[i].len));
      ++count;
      return 0;
    };
  }
};

// Signaled WRITEs posted alone: through the ring (as packets) while the peer answers so too, its packets
// marked as awaiting their ACK (its application polls); one-sided after two that other requests answered
// (a SEND, an unsignaled WRITE: the peer may be spinning on its memory); unsignaled ones always one-sided.
TEST(Rc, LoneWritesGoThroughTheRingWhileThePeerAwaitsItsAcksAndOneSidedOtherwise) {
  Harness h;
  OneSidedWrites one_sided(h);
  uint64_t id = 1;
  auto ring_writes = [&] { return h.a.counters.get(Counter::ring_lone_writes); };
  auto lone_write = [&](bool signaled = true) {  // posted alone after a poll of the send CQ
    h.a.poll(h.a.scq);
    fill(h.a.buf, 64, 8, static_cast<uint32_t>(id));
    Wr wr = Wr(h.a, WrOpcode::kRdmaWrite, 64, 8, id++).remote(h.b, 64);
    if (!signaled) wr.wr.send_flags = 0;
    ASSERT_EQ(h.post_send(h.a, wr), 0);
  };
  // b reads a's WRITE (if it went as a packet) and answers: a signaled WRITE posted alone after a poll,
  // a SEND, or an unsignaled WRITE.
  enum class Answer { kLoneWrite, kSend, kUnsignaledWrite };
  h.post_recv(h.a, 7, 256, 64);
  auto b_answers = [&](Answer how) {
    h.net_.deliver();
    io::RxPacket pkts[8];
    if (const uint32_t k = h.b.be->rx_burst(pkts, 8); k != 0)
      h.b.ctx->rx_burst(std::span(pkts, k), h.b.tx, g_now);
    EXPECT_EQ(std::memcmp(h.b.buf.data() + 64, h.a.buf.data() + 64, 8), 0);
    h.b.poll(h.b.scq);
    Wr wr = Wr(h.b, how == Answer::kSend ? WrOpcode::kSend : WrOpcode::kRdmaWrite, 0, 8, 1000 + id);
    if (how != Answer::kSend) wr.remote(h.a, 0);
    if (how == Answer::kUnsignaledWrite) wr.wr.send_flags = 0;
    if (how == Answer::kSend) h.post_recv(h.a, 7, 256, 64);
    ASSERT_EQ(h.post_send(h.b, wr), 0);
    receives(h, h.a, __LINE__);
  };
  // The first goes through the ring to see; b answers likewise, and so on: a ping-pong.
  for (uint32_t i = 0; i < 6; ++i) {
    lone_write();
    EXPECT_EQ(ring_writes(), i + 1u);
    b_answers(Answer::kLoneWrite);
  }
  EXPECT_EQ(h.b.counters.get(Counter::ring_lone_writes), 6u) << "b's answers went so too";
  EXPECT_EQ(one_sided.count, 0u);
  // Answers not marked: the two lone WRITEs after the last marked one still go through the ring, then
  // they go one-sided, whatever comes, until b answers so again.
  lone_write();
  b_answers(Answer::kSend);
  lone_write();
  b_answers(Answer::kUnsignaledWrite);
  EXPECT_EQ(ring_writes(), 8u);
  for (uint32_t i = 0; i < 3; ++i) {
    lone_write();
    EXPECT_EQ(one_sided.count, i + 1u);
    EXPECT_EQ(std::memcmp(h.b.buf.data() + 64, h.a.buf.data() + 64, 8), 0) << "one-sided: there at once";
    b_answers(i == 1 ? Answer::kSend : Answer::kUnsignaledWrite);
  }
  EXPECT_EQ(ring_writes(), 8u);
  // b's next signaled lone WRITE is marked (a's last packet was): the ping-pong starts again.
  lone_write();
  b_answers(Answer::kLoneWrite);
  EXPECT_EQ(one_sided.count, 4u);
  lone_write();
  EXPECT_EQ(ring_writes(), 9u);
  b_answers(Answer::kLoneWrite);
  // Unsignaled: the poster does not wait for the ACK, one-sided.
  lone_write(false);
  EXPECT_EQ(one_sided.count, 5u);
  EXPECT_EQ(ring_writes(), 9u);
  EXPECT_EQ(h.a.counters.get(Counter::retransmits), 0u);
  EXPECT_EQ(h.b.counters.get(Counter::retransmits), 0u);
}

// b, a QP that has sent (so its ACKs may be deferred), receives a WRITE from a, alone in its burst; the
// number of ACKs b sent before that burst.
uint64_t b_sent_then_receives_a_write(Harness& h) {
  std::vector<Wc> wcs;
  EXPECT_EQ(h.post_send(h.b, Wr(h.b, WrOpcode::kRdmaWrite, 0, 8, 1).remote(h.a, 0)), 0);
  EXPECT_TRUE(h.wait(h.b, h.b.scq, 1, &wcs));
  EXPECT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 8, 8, 2).remote(h.b, 8)), 0);
  h.net_.deliver();
  io::RxPacket pkts[4];
  EXPECT_EQ(h.b.be->rx_burst(pkts, 4), 1u);
  const uint64_t acks = h.b.counters.get(Counter::tx_acks);
  h.b.ctx->rx_burst(std::span(pkts, 1), h.b.tx, g_now);
  return acks;
}

// An application that waits for events (a CQ with a completion channel) is not polling when an answer
// comes, so nothing is gained by the answer overtaking the ACK: its QPs acknowledge at once (rping's
// server waits for its WRITE's completion before it sends).
TEST(Rc, QpOfAnEventDrivenApplicationAcknowledgesAtOnce) {
  QpOptions o;
  o.recv_channel = true;
  Harness h({}, o);
  ASSERT_EQ(h.b.rcq->req_notify(false), 0);  // it waits for events
  const uint64_t acks = b_sent_then_receives_a_write(h);
  EXPECT_EQ(h.b.counters.get(Counter::tx_acks), acks + 1);
}

// A channel alone is no sign of an application that waits for events: UCX's workers create their CQs
// with one, busy-poll them, and arm them only before they sleep. Never armed, or armed longer ago than
// Cq::kEventsRecentNs, its QPs defer their ACKs as a polling application's do.
TEST(Rc, QpOfAPollerWithAChannelDefersItsAck) {
  for (bool armed_long_ago : {false, true}) {
    SCOPED_TRACE(armed_long_ago ? "armed long ago" : "never armed");
    QpOptions o;
    o.recv_channel = true;
    Harness h({}, o);
    if (armed_long_ago) {
      ASSERT_EQ(h.b.rcq->req_notify(false), 0);
      // An event ends the arming; then time passes with the CQ polled only.
      ASSERT_EQ(h.post_recv(h.b, 1, 0, 64), 0);
      ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kSend, 0, 8, 1)), 0);
      std::vector<Wc> r;
      ASSERT_TRUE(h.wait(h.b, h.b.rcq, 1, &r));
      g_now += core::Cq::kEventsRecentNs;
    }
    const uint64_t acks = b_sent_then_receives_a_write(h);
    EXPECT_EQ(h.b.counters.get(Counter::tx_acks), acks) << "deferred";
  }
}

// A deferred ACK is owed for messages already executed: it goes before the QP stops answering, whether
// the application destroys it or moves it to ERROR (rdma_disconnect does, right after the last completion),
// or the process exits without either (the exit handler).
TEST(Rc, DeferredAckGoesWhenTheQpGoesAway) {
  for (const char* how : {"destroyed", "moved to ERROR", "process exits"}) {
    SCOPED_TRACE(how);
    Harness h;
    std::vector<Wc> wcs;
    const uint64_t acks = b_sent_then_receives_a_write(h);
    EXPECT_EQ(h.b.counters.get(Counter::tx_acks), acks) << "deferred";
    if (how[0] == 'd') {
      ASSERT_EQ(h.b.ctx->destroy_qp(h.b.qp), 0);
      h.b.qp = nullptr;
    } else if (how[0] == 'm') {
      core::QpAttr at;
      at.qp_state = QpState::kErr;
      ASSERT_EQ(h.b.qp->modify(at, kQpState), 0);
    } else {
      core::Context::flush_deferred_acks_at_exit();
    }
    EXPECT_EQ(h.b.counters.get(Counter::tx_acks), acks + 1);
    ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &wcs, 1));  // well before a's retransmit timer
    EXPECT_EQ(wcs.back().status, WcStatus::kSuccess);
  }
}

// Posts behind packets in flight wait (Qp::post_send): the posting thread's next drive sends them all at
// once, before any ACK came; without that drive the ACK does.
TEST(Rc, PostsBehindPacketsInFlightGoAtTheNextPollOrAck) {
  for (bool poll : {true, false}) {
    SCOPED_TRACE(poll ? "the poster drives" : "the ACK sends them");
    Harness h;
    fill(h.a.buf, 0, 64, 3);
    for (uint64_t i = 0; i < 6; ++i)
      ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 8 * i, 8, i).remote(h.b, 8 * i)), 0);
    const uint64_t out = static_cast<uint64_t>(core::Qp::kCorkInFlight);
    EXPECT_EQ(h.net_.sent, out);
    if (poll) {
      h.a.ctx->drive(h.a.tx, g_now, false);  // what Cq::poll of an empty CQ does
      EXPECT_EQ(h.net_.sent, 6u);            // nothing was delivered: no ACK came
    }
    // Polling a's CQ would drive (and send) too: first let the network run alone.
    ASSERT_TRUE(h.run([&] { return same(h.a, 0, h.b, 0, 48); }));
    std::vector<Wc> wcs;
    ASSERT_TRUE(h.run([&] {
      for (const Wc& w : h.a.poll(h.a.scq)) wcs.push_back(w);
      return wcs.size() == 6;
    }));
    for (uint64_t i = 0; i < 6; ++i) {
      EXPECT_EQ(wcs[i].wr_id, i);
      EXPECT_EQ(wcs[i].status, WcStatus::kSuccess);
    }
    EXPECT_TRUE(same(h.a, 0, h.b, 0, 48));
    EXPECT_EQ(h.a.counters.get(Counter::retransmits), 0u);
    EXPECT_EQ(h.a.counters.get(Counter::retry_timeouts), 0u);
  }
}

TEST(Rc, StandardPortMode) {
  QpOptions o;
  o.standard_port = true;
  Harness h({}, o);
  EXPECT_EQ(h.a.qp->port(), wire::kRoceV2Port);
  EXPECT_EQ(h.a.qp->peer().port, wire::kRoceV2Port);
  EXPECT_EQ(h.b.qp->peer().port, wire::kRoceV2Port);
  fill(h.a.buf, 0, 10000, 9);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, 10000, 1).remote(h.b, 20000)), 0);
  std::vector<Wc> s;
  ASSERT_TRUE(h.run([&] {
    for (auto& w : h.a.poll(h.a.scq)) s.push_back(w);
    return !s.empty();
  }));
  EXPECT_EQ(s[0].status, WcStatus::kSuccess);
  EXPECT_TRUE(same(h.a, 0, h.b, 20000, 10000));
  // A second context on the same address cannot take 4791 too: one process per address in this mode.
  io::SimNet& net = h.net_;
  auto be = net.attach("10.0.0.1");
  Counters c;
  core::ContextConfig cfg;
  cfg.standard_port = true;
  core::Context other(be.get(), &c, cfg);
  auto pd = *other.alloc_pd();
  auto cq = *other.create_cq(4, nullptr, nullptr);
  core::QpInitAttr init;
  init.send_cq = init.recv_cq = cq;
  auto qp = other.create_qp(pd, init);
  ASSERT_FALSE(qp);
  EXPECT_EQ(qp.error(), EADDRINUSE);
  other.destroy_cq(cq);
  other.dealloc_pd(pd);
}

}  // namespace
}  // namespace softrdma::test

namespace softrdma::test {
namespace {

// Inline data is copied at post time: the buffer may change right after, and no lkey is needed.
TEST(Rc, InlineSendAndWrite) {
  Harness h;
  ASSERT_EQ(h.post_recv(h.b, 5, 0, 256), 0);
  std::memcpy(h.a.buf.data(), "inline payload!", 16);
  Wr send(h.a, WrOpcode::kSend, 0, 16, 1);
  send.wr.send_flags |= kSendInline;
  send.sge.lkey = 0xDEAD;  // ignored for inline data
  ASSERT_EQ(h.post_send(h.a, send), 0);
  Wr write(h.a, WrOpcode::kRdmaWrite, 0, 16, 2);
  write.remote(h.b, 1000);
  write.wr.send_flags |= kSendInline;
  ASSERT_EQ(h.post_send(h.a, write), 0);
  std::memset(h.a.buf.data(), 'x', 16);  // after the post: must not reach the peer
  std::vector<Wc> s, r;
  ASSERT_TRUE(h.run([&] {
    for (auto& w : h.a.poll(h.a.scq)) s.push_back(w);
    for (auto& w : h.b.poll(h.b.rcq)) r.push_back(w);
    return s.size() == 2 && r.size() == 1;
  }));
  for (auto& w : s) EXPECT_EQ(w.status, WcStatus::kSuccess);
  EXPECT_EQ(r[0].byte_len, 16u);
  EXPECT_EQ(std::memcmp(h.b.buf.data(), "inline payload!", 16), 0);
  EXPECT_EQ(std::memcmp(h.b.buf.data() + 1000, "inline payload!", 16), 0);
}

// Gather from several SGEs on send, scatter into several on receive and on READ.
TEST(Rc, SgeLists) {
  Harness h;
  fill(h.a.buf, 0, 8000, 11);
  // Send 3 pieces (1000 + 2500 + 1700 bytes) from scattered places.
  Sge ss[3] = {{h.a.addr(0), 1000, h.a.mr->key}, {h.a.addr(3000), 2500, h.a.mr->key},
               {h.a.addr(7000), 1700, h.a.mr->key}};
  std::vector<uint8_t> expect;
  for (const Sge& s : ss) {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(s.addr);
    expect.insert(expect.end(), p, p + s.length);
  }
  // Receive into 2 pieces: 3000 at 100000 and 4000 at 200000.
  Sge rs[2] = {{h.b.addr(100000), 3000, h.b.mr->key}, {h.b.addr(200000), 4000, h.b.mr->key}};
  core::RecvWr rwr{9, std::span(rs, 2)};
  size_t bad;
  ASSERT_EQ(h.b.qp->post_recv(std::span(&rwr, 1), &bad), 0);
  core::SendWr wr;
  wr.wr_id = 1;
  wr.opcode = WrOpcode::kSend;
  wr.send_flags = kSendSignaled;
  wr.sg_list = std::span(ss, 3);
  ASSERT_EQ(h.a.qp->post_send(std::span(&wr, 1), &bad), 0);
  // READ 5200 bytes of b back into 2 pieces of a.
  fill(h.b.buf, 300000, 5200, 12);
  Sge ds[2] = {{h.a.addr(500000), 2000, h.a.mr->key}, {h.a.addr(600000), 3200, h.a.mr->key}};
  core::SendWr rd;
  rd.wr_id = 2;
  rd.opcode = WrOpcode::kRdmaRead;
  rd.send_flags = kSendSignaled;
  rd.sg_list = std::span(ds, 2);
  rd.remote_addr = h.b.addr(300000);
  rd.rkey = h.b.mr->key;
  ASSERT_EQ(h.a.qp->post_send(std::span(&rd, 1), &bad), 0);
  std::vector<Wc> s, r;
  ASSERT_TRUE(h.run([&] {
    for (auto& w : h.a.poll(h.a.scq)) s.push_back(w);
    for (auto& w : h.b.poll(h.b.rcq)) r.push_back(w);
    return s.size() == 2 && r.size() == 1;
  }));
  EXPECT_EQ(r[0].byte_len, 5200u);
  EXPECT_EQ(std::memcmp(h.b.buf.data() + 100000, expect.data(), 3000), 0);
  EXPECT_EQ(std::memcmp(h.b.buf.data() + 200000, expect.data() + 3000, 2200), 0);
  EXPECT_EQ(s[1].status, WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(h.a.buf.data() + 500000, h.b.buf.data() + 300000, 2000), 0);
  EXPECT_EQ(std::memcmp(h.a.buf.data() + 600000, h.b.buf.data() + 302000, 3200), 0);
}

}  // namespace
}  // namespace softrdma::test

namespace softrdma::test {
namespace {

// An application woken by a receive completion on a completion channel may answer at once (ib_send_lat -e,
// rping): its answer must not overtake the ACK of the message it answers, as it never does on a NIC (the
// peer waits for its send completion and the answer in that order, on one channel). The ACK leaves with
// the burst's others, one for the burst, and a post on that QP before it went waits behind it
// (Transport::hold_tx). Without a channel (a polling application) nothing waits: the answer may go first.
TEST(Rc, AnAnswerOnAChannelNeverOvertakesTheAck) {
  const uint8_t ack = wire::opcode(wire::Transport::kRc, wire::kOpAcknowledge);
  const uint8_t send = wire::opcode(wire::Transport::kRc, wire::kOpSendOnly);
  for (bool channel : {true, false}) {
    SCOPED_TRACE(channel ? "channel" : "polled");
    QpOptions o;
    o.recv_channel = channel;
    Harness h({}, o);
    if (channel) {
      ASSERT_EQ(h.b.rcq->req_notify(false), 0);  // B's application waits for events
    }
    for (uint64_t i = 0; i < 3; ++i) ASSERT_EQ(h.post_recv(h.b, i, 64 * i, 64), 0);
    ASSERT_EQ(h.post_recv(h.a, 7, 1024, 64), 0);
    const uint32_t to_a = h.a.qp->qpn();
    std::vector<uint8_t> from_b;  // the opcodes of B's packets, in the order they reach the wire
    bool answered = false;
    uint32_t completions_seen = 0;
    h.net_.drop_if = [&](uint64_t, std::span<const uint8_t> f) {
      if ((uint32_t{f[5]} << 16 | uint32_t{f[6]} << 8 | f[7]) != to_a) return false;
      if (f[0] == ack && !answered) {
        // B's application saw its completions and answers while the ACK is not yet on the wire.
        answered = true;
        completions_seen = h.b.rcq->pending();
        EXPECT_EQ(h.post_send(h.b, Wr(h.b, WrOpcode::kSend, 512, 8, 9)), 0);
      }
      from_b.push_back(f[0]);
      return false;
    };
    // The third post waits behind two packets in flight; the poster's drive sends it before any delivery.
    for (uint64_t i = 0; i < 3; ++i) ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kSend, 0, 8, i)), 0);
    h.a.ctx->drive(h.a.tx, g_now, false);
    ASSERT_EQ(h.net_.sent, 3u);
    std::vector<Wc> s, r;
    ASSERT_TRUE(h.run([&] {
      for (auto& w : h.a.poll(h.a.scq)) s.push_back(w);
      for (auto& w : h.a.poll(h.a.rcq)) r.push_back(w);
      return s.size() == 3 && r.size() == 1;
    }));
    ASSERT_TRUE(answered);
    EXPECT_EQ(completions_seen, 3u);
    const std::vector<uint8_t> want =
        channel ? std::vector<uint8_t>{ack, send} : std::vector<uint8_t>{send, ack};
    EXPECT_EQ(from_b, want);
    EXPECT_EQ(h.b.counters.get(Counter::tx_acks), 1u);  // the burst's three messages, one ACK
  }
}

// rping's server posts an RDMA READ on the event of the SEND it received: posted while that SEND's ACK is
// held, the READ waits, and when the hold ends still goes one-sided (same host), as it would have at once.
TEST(Rc, ALonePostThatTheAckHoldCorkedStillGoesOneSided) {
  const uint8_t ack = wire::opcode(wire::Transport::kRc, wire::kOpAcknowledge);
  QpOptions o;
  o.recv_channel = true;
  Harness h({}, o);
  ASSERT_EQ(h.b.rcq->req_notify(false), 0);  // rping's server waits for events
  uint64_t reads = 0;
  h.b.be->direct_hook = [&](const wire::Endpoint&, const io::DirectOp& op) {
    if (!op.read || op.shared_only) return -1;
    const auto* from = reinterpret_cast<const uint8_t*>(op.va);
    for (uint32_t i = 0; i < op.nseg; ++i) {
      std::memcpy(op.segs[i].addr, from, op.segs[i].len);
      from += op.segs[i].len;
    }
    ++reads;
    return 0;
  };
  fill(h.a.buf, 256, 8, 77);
  ASSERT_EQ(h.post_recv(h.b, 1, 0, 64), 0);
  bool posted = false;
  h.net_.drop_if = [&](uint64_t, std::span<const uint8_t> f) {
    if (f[0] == ack && !posted) {  // b's application answers before the ACK is on the wire
      posted = true;
      EXPECT_EQ(h.post_send(h.b, Wr(h.b, WrOpcode::kRdmaRead, 512, 8, 5).remote(h.a, 256)), 0);
      EXPECT_EQ(reads, 0u) << "held";
    }
    return false;
  };
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kSend, 0, 8, 1)), 0);
  std::vector<Wc> done;
  ASSERT_TRUE(h.wait(h.b, h.b.scq, 1, &done));
  ASSERT_TRUE(posted);
  EXPECT_EQ(done[0].status, WcStatus::kSuccess);
  EXPECT_EQ(reads, 1u);
  EXPECT_EQ(std::memcmp(h.b.buf.data() + 512, h.a.buf.data() + 256, 8), 0);
  EXPECT_EQ(h.net_.sent, 2u);  // a's SEND and b's ACK: no READ request
}

// A post that waits behind packets in flight is on its thread's list for that thread's next drive or poll
// (Context::corked). A context destroyed with its QP still on the list takes the list with it: the next
// context's posts on that thread are listed and sent by its drive, not left to the ACKs.
TEST(Rc, ThePostersListOfWaitingQpsOutlivesNoContext) {
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round);
    Harness h;
    for (uint64_t i = 0; i < 3; ++i)
      ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, 8, i).remote(h.b, 0)), 0);
    EXPECT_EQ(h.net_.sent, 2u);  // the third waits
    h.a.ctx->drive(h.a.tx, g_now, false);
    EXPECT_EQ(h.net_.sent, 3u);
    // Another post waits, and the harness goes away with it listed (nothing polled after it).
    ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, 8, 4).remote(h.b, 0)), 0);
    EXPECT_EQ(h.net_.sent, 3u);
  }
}

}  // namespace
}  // namespace softrdma::test
