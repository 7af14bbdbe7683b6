// Duplicate requests (IBTA.md 5, "Responder, RC"): an ATOMIC whose ACK is lost is answered from the
// responder's cache and never executed twice; a duplicate READ is executed again from memory; duplicate
// SEND/WRITE packets are only re-ACKed.
#include <gtest/gtest.h>

#include "transport/harness.h"
#include "transport/transport.h"

namespace softrdma::test {
namespace {

using wire::PacketView;

QpOptions opts() {
  QpOptions o;
  o.buf_size = 1 << 16;
  o.max_wr = 16;
  o.timeout = 10;  // 4.2 ms
  return o;
}

// Drops the first frame with opcode `op` (and records every frame's opcode).
struct DropFirst {
  uint8_t op;
  int dropped = 0;
  std::vector<std::vector<uint8_t>> seen;
  std::function<void()> on_drop;
  void attach(Harness& h) {
    h.net_.drop_if = [this](uint64_t, std::span<const uint8_t> f) {
      seen.emplace_back(f.begin(), f.end());
      if (f[0] != op || dropped) return false;
      ++dropped;
      if (on_drop) on_drop();
      return true;
    };
  }
  int count(uint8_t o) const {
    int n = 0;
    for (const auto& f : seen) n += f[0] == o;
    return n;
  }
};

uint64_t load64(const Node& n, uint64_t off) {
  uint64_t v;
  std::memcpy(&v, n.buf.data() + off, 8);
  return v;
}

TEST(Duplicates, AtomicReplayedFromCacheNeverExecutedTwice) {
  Harness h({}, opts());
  const uint64_t init = 100;
  std::memcpy(h.b.buf.data() + 1024, &init, 8);
  DropFirst d{rc(wire::kOpAtomicAcknowledge)};
  d.attach(h);
  Wr fa(h.a, WrOpcode::kAtomicFetchAndAdd, 0, 8, 1);
  fa.remote(h.b, 1024);
  fa.wr.compare_add = 5;
  Wr cas(h.a, WrOpcode::kAtomicCmpAndSwp, 8, 8, 2);
  cas.remote(h.b, 1024);
  cas.wr.compare_add = 105;
  cas.wr.swap = 999;
  ASSERT_EQ(h.post_send(h.a, fa), 0);
  ASSERT_EQ(h.post_send(h.a, cas), 0);
  std::vector<Wc> s;
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 2, &s));
  EXPECT_EQ(d.dropped, 1);
  for (const Wc& w : s) EXPECT_EQ(w.status, WcStatus::kSuccess);
  EXPECT_EQ(s[0].wr_id, 1u);
  EXPECT_EQ(s[1].wr_id, 2u);
  EXPECT_EQ(load64(h.a, 0), 100u);  // FETCH_ADD's original value, replayed
  EXPECT_EQ(load64(h.a, 8), 105u);  // CAS's original value, replayed
  // Executed once each: 100 + 5 = 105, then swapped to 999. A second FETCH_ADD would give 1004.
  EXPECT_EQ(load64(h.b, 1024), 999u);
  // Both atomics were resent (go-back-N from the FETCH_ADD) and both answered from the cache.
  EXPECT_EQ(d.count(rc(wire::kOpFetchAdd)), 2);
  EXPECT_EQ(d.count(rc(wire::kOpCompareSwap)), 2);
  EXPECT_EQ(d.count(rc(wire::kOpAtomicAcknowledge)), 4);
  EXPECT_EQ(h.b.counters.get(Counter::dup_requests), 2u);
  EXPECT_EQ(h.a.counters.get(Counter::retry_timeouts) + h.a.counters.get(Counter::retransmits) > 0, true);
}

TEST(Duplicates, ReadIsExecutedAgainFromMemory) {
  Harness h({}, opts());
  fill(h.b.buf, 4096, 200, 1);
  DropFirst d{rc(wire::kOpReadRespOnly)};
  // When the first response is lost, the responder's memory changes: the replay must read it anew.
  d.on_drop = [&] { fill(h.b.buf, 4096, 200, 2); };
  d.attach(h);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaRead, 0, 200, 1).remote(h.b, 4096)), 0);
  std::vector<Wc> s;
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &s));
  EXPECT_EQ(s[0].status, WcStatus::kSuccess);
  EXPECT_EQ(s[0].byte_len, 200u);
  EXPECT_EQ(d.dropped, 1);
  EXPECT_EQ(std::memcmp(h.a.buf.data(), h.b.buf.data() + 4096, 200), 0);
  EXPECT_EQ(h.b.counters.get(Counter::dup_requests), 1u);
  EXPECT_EQ(h.a.counters.get(Counter::retry_timeouts), 1u);
}

// A retransmit timer that runs out while the backend says the peer still reads what came before (io/shm's
// ring) waits another round instead, at most Transport::kMaxRetryWaits times in a row: the ring may keep
// moving with other packets while this one was lost (dropped at a full ring), so it goes again after that.
TEST(Duplicates, RetransmitWaitsWhileThePeerIsBehindUpToALimit) {
  Harness h({}, opts());
  DropFirst d{rc(wire::kOpWriteOnly)};
  d.attach(h);
  int asked = 0;
  std::vector<uint64_t> marks;
  h.a.be->behind = [&](const wire::Endpoint& dst, uint64_t* mark) {
    EXPECT_EQ(dst, h.a.qp->peer());
    marks.push_back(*mark);
    *mark = 100 + asked++;
    return true;  // always behind
  };
  fill(h.a.buf, 0, 64, 4);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, 64, 1).remote(h.b, 512)), 0);
  std::vector<Wc> s;
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &s));
  EXPECT_EQ(s[0].status, WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(h.a.buf.data(), h.b.buf.data() + 512, 64), 0);
  static_assert(core::Transport::kMaxRetryWaits == 2);
  EXPECT_EQ(asked, 2);
  EXPECT_EQ(marks, (std::vector<uint64_t>{0, 100}));  // the QP keeps the backend's state
  EXPECT_EQ(h.a.counters.get(Counter::retry_waits), 2u);
  EXPECT_EQ(h.a.counters.get(Counter::retry_timeouts), 1u);
  EXPECT_EQ(d.count(rc(wire::kOpWriteOnly)), 2);  // sent again once, after the waits
  EXPECT_EQ(h.b.counters.get(Counter::dup_requests), 0u);
}

// The waits are counted from the last ACK that made progress: the next loss may wait as long again. And a
// peer that is not behind gets the packet again at the first timeout.
TEST(Duplicates, RetransmitWaitsAgainAfterProgressAndNotWhenThePeerIsNotBehind) {
  Harness h({}, opts());
  DropFirst d{rc(wire::kOpWriteOnly)};
  d.attach(h);
  bool behind = true;
  h.a.be->behind = [&](const wire::Endpoint&, uint64_t*) { return behind; };
  std::vector<Wc> s;
  for (int round = 1; round <= 3; ++round) {
    if (round == 3) behind = false;
    d.dropped = 0;  // lose this round's WRITE once
    ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, 64, round).remote(h.b, 512)), 0);
    ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &s));
    EXPECT_EQ(s.back().status, WcStatus::kSuccess);
    EXPECT_EQ(h.a.counters.get(Counter::retry_timeouts), static_cast<uint64_t>(round));
    EXPECT_EQ(h.a.counters.get(Counter::retry_waits), round == 1 ? 2u : 4u) << "round " << round;
  }
}

// A multi-packet READ that lost a middle response is re-requested for the missing part only (IBTA.md 4c):
// new PSN, VA advanced; the responder replays it from its saved resource.
TEST(Duplicates, ReadRetriedForTheMissingPart) {
  Harness h({}, opts());  // path MTU 1024
  fill(h.b.buf, 4096, 5000, 3);
  DropFirst d{rc(wire::kOpReadRespMiddle)};
  d.attach(h);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaRead, 0, 5000, 1).remote(h.b, 4096)), 0);
  std::vector<Wc> s;
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &s));
  EXPECT_EQ(s[0].status, WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(h.a.buf.data(), h.b.buf.data() + 4096, 5000), 0);
  std::vector<PacketView> reqs;
  for (auto& f : d.seen)
    if (f[0] == rc(wire::kOpReadRequest)) reqs.emplace_back(f.data(), static_cast<uint32_t>(f.size() - 4));
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[1].psn(), wire::psn_add(reqs[0].psn(), 1));  // the first response (1024 B) arrived
  EXPECT_EQ(reqs[1].reth_va(), reqs[0].reth_va() + 1024);
  EXPECT_EQ(reqs[1].reth_len(), 5000u - 1024);
  EXPECT_EQ(h.b.counters.get(Counter::dup_requests), 1u);
  // Asked again as soon as the response after the gap arrived, not after the retransmit timer.
  EXPECT_EQ(h.a.counters.get(Counter::retry_timeouts), 0u);
}

// A lost ACK: the requester resends the SEND/WRITE; the responder re-ACKs every duplicate packet without
// executing it again (one receive completion).
TEST(Duplicates, SendAndWriteReAcked) {
  for (WrOpcode op : {WrOpcode::kSend, WrOpcode::kRdmaWrite, WrOpcode::kRdmaWriteWithImm}) {
    SCOPED_TRACE(static_cast<int>(op));
    Harness h({}, opts());
    DropFirst d{rc(wire::kOpAcknowledge)};
    d.attach(h);
    ASSERT_EQ(h.post_recv(h.b, 40, 8192, 8192), 0);
    ASSERT_EQ(h.post_recv(h.b, 41, 16384, 8192), 0);
    fill(h.a.buf, 0, 3000, 4);
    ASSERT_EQ(h.post_send(h.a, Wr(h.a, op, 0, 3000, 1).remote(h.b, 8192)), 0);  // 3 packets
    std::vector<Wc> s, r;
    ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &s));
    EXPECT_EQ(s[0].status, WcStatus::kSuccess);
    EXPECT_EQ(d.dropped, 1);
    h.run([] { return false; }, 100);  // late duplicates, if any, must not complete anything
    for (const Wc& w : h.b.poll(h.b.rcq)) r.push_back(w);
    const size_t want = op == WrOpcode::kRdmaWrite ? 0 : 1;
    ASSERT_EQ(r.size(), want);
    if (want) {
      EXPECT_EQ(r[0].wr_id, 40u);
      EXPECT_EQ(r[0].status, WcStatus::kSuccess);
      EXPECT_EQ(r[0].byte_len, 3000u);
    }
    EXPECT_EQ(std::memcmp(h.a.buf.data(), h.b.buf.data() + 8192, 3000), 0);
    EXPECT_TRUE(std::all_of(h.b.buf.begin() + 16384, h.b.buf.begin() + 16384 + 3000,
                            [](uint8_t v) { return v == 0; }));
    EXPECT_EQ(h.b.counters.get(Counter::dup_requests), 3u);  // all three packets came again
    EXPECT_GE(h.b.counters.get(Counter::tx_acks), 2u);
    EXPECT_EQ(h.a.counters.get(Counter::retry_timeouts), 1u);
    EXPECT_EQ(h.a.counters.get(Counter::retransmits), 3u);  // packets, not timeouts
  }
}

}  // namespace
}  // namespace softrdma::test
