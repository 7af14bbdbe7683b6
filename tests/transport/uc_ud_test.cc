// UC (no ACKs; a lost packet drops its message) and UD (one packet per message, Q_Key, the 40-byte GRH at
// the start of the receive buffer), IBTA.md 1b, 1c, 5, 8, 10.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include "transport/harness.h"
#include "transport/transport.h"

namespace softrdma::test {
namespace {

using wire::PacketView;

QpOptions opts(QpType t) {
  QpOptions o;
  o.type = t;
  o.buf_size = 1 << 17;
  o.max_wr = 16;
  return o;  // path MTU 1024 for UC
}

bool zero(const Node& n, uint64_t off, uint32_t len) {
  return std::all_of(n.buf.begin() + off, n.buf.begin() + off + len, [](uint8_t v) { return v == 0; });
}

// ---- UC ----

TEST(Uc, SendAndWriteCompleteOnSend) {
  Harness h({}, opts(QpType::kUc));
  ASSERT_EQ(h.post_recv(h.b, 10, 0, 8192), 0);
  ASSERT_EQ(h.post_recv(h.b, 11, 8192, 8192), 0);
  fill(h.a.buf, 0, 5000, 1);
  fill(h.a.buf, 8192, 3000, 2);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kSend, 0, 5000, 1)), 0);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 8192, 3000, 2).remote(h.b, 32768)), 0);
  Wr wimm(h.a, WrOpcode::kRdmaWriteWithImm, 8192, 2000, 3);
  wimm.remote(h.b, 65536);
  wimm.wr.imm_data = htonl(0x1234);
  ASSERT_EQ(h.post_send(h.a, wimm), 0);
  // The requester completes once the packets are handed to the network: no ACK, no timer.
  auto s = h.a.poll(h.a.scq);
  ASSERT_EQ(s.size(), 3u);
  for (uint64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(s[i].status, WcStatus::kSuccess);
    EXPECT_EQ(s[i].wr_id, i + 1);
  }
  EXPECT_EQ(s[0].opcode, WcOpcode::kSend);
  EXPECT_EQ(s[1].opcode, WcOpcode::kRdmaWrite);
  EXPECT_EQ(h.a.qp->next_deadline.load(), 0u);
  EXPECT_EQ(h.net_.in_flight(), 5u + 3u + 2u);
  std::vector<Wc> r;
  ASSERT_TRUE(h.wait(h.b, h.b.rcq, 2, &r));
  EXPECT_EQ(r[0].wr_id, 10u);
  EXPECT_EQ(r[0].status, WcStatus::kSuccess);
  EXPECT_EQ(r[0].byte_len, 5000u);
  EXPECT_EQ(r[0].opcode, WcOpcode::kRecv);
  EXPECT_EQ(r[1].wr_id, 11u);
  EXPECT_EQ(r[1].opcode, WcOpcode::kRecvRdmaWithImm);
  EXPECT_EQ(r[1].imm_data, htonl(0x1234));
  EXPECT_EQ(std::memcmp(h.a.buf.data(), h.b.buf.data(), 5000), 0);
  EXPECT_EQ(std::memcmp(h.a.buf.data() + 8192, h.b.buf.data() + 32768, 3000), 0);
  EXPECT_EQ(std::memcmp(h.a.buf.data() + 8192, h.b.buf.data() + 65536, 2000), 0);
  EXPECT_EQ(h.b.counters.get(Counter::tx_acks), 0u);
  EXPECT_EQ(h.net_.sent, 10u);  // and nothing comes back
}

// Posts in a row with no poll between (UC and UD have no ACK to wait for): from the third on they wait,
// and go in one batch at the poster's next poll of an empty CQ, or, if it never polls, when the QP's cork
// timer fires (Qp::kCorkDelayNs) in a driver's tick.
TEST(Uc, PostsInARowGoAtTheNextPollOrByTheTimer) {
  for (bool poll : {true, false}) {
    SCOPED_TRACE(poll ? "the poster polls" : "the timer sends them");
    Harness h({}, opts(QpType::kUc));
    fill(h.a.buf, 0, 64, 5);
    const Nanos t0 = g_now;
    for (uint64_t i = 0; i < 5; ++i)
      ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 8 * i, 8, i).remote(h.b, 8 * i)), 0);
    EXPECT_EQ(h.net_.sent, uint64_t{core::Qp::kCorkPostsInARow});
    EXPECT_EQ(h.a.qp->next_deadline.load(), t0 + core::Qp::kCorkDelayNs);
    std::vector<Wc> s;
    if (poll) {
      s = h.a.poll(h.a.scq);  // 2, then an empty CQ: the drive sends the other 3, which complete at once
      EXPECT_EQ(h.net_.sent, 5u);
      EXPECT_EQ(h.a.qp->next_deadline.load(), 0u);
      EXPECT_EQ(g_now, t0);
      ASSERT_TRUE(h.run([&] { return std::memcmp(h.a.buf.data(), h.b.buf.data(), 40) == 0; }));
    } else {
      ASSERT_TRUE(h.run([&] { return std::memcmp(h.a.buf.data(), h.b.buf.data(), 40) == 0; }));
      EXPECT_GE(g_now, t0 + core::Qp::kCorkDelayNs);  // nothing but the timer sent the last 3
      EXPECT_EQ(h.net_.sent, 5u);
      s = h.a.poll(h.a.scq);
    }
    ASSERT_EQ(s.size(), 5u);
    for (uint64_t i = 0; i < 5; ++i) {
      EXPECT_EQ(s[i].wr_id, i);
      EXPECT_EQ(s[i].status, WcStatus::kSuccess);
    }
  }
}

// The middle packet of a SEND is lost: the message is dropped (no completion, drop_uc_msg), its receive WQE
// is reused by the next message, which arrives intact.
// A ping-pong of lone UC WRITEs (ib_write_lat -c UC): once Transport::kUcAnswers posts in a row each found
// the peer's request come since the post before, a WRITE's completion is held from polls until the peer's
// next request comes, which a held poll receives, so that the answer is in memory when the completion is
// returned; for at most kUcAnswerHoldNs. A hold that runs out (the answer came later) ends it until
// kUcAnswers more. WRITEs with no answer between them never hold.
TEST(Uc, APingPongOfLoneWritesHoldsTheCompletionForTheAnswer) {
  Harness h({}, opts(QpType::kUc));
  auto holds = [&] { return h.a.counters.get(Counter::answer_holds); };
  for (uint64_t i = 0; i < 4; ++i) {  // no answers
    ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, 8, i).remote(h.b, 0)), 0);
    EXPECT_EQ(h.a.poll(h.a.scq).size(), 1u);
  }
  EXPECT_EQ(holds(), 0u);
  h.net_.deliver();
  h.b.poll(h.b.scq);  // b receives them
  // b answers each of a's WRITEs; a's poll receives the answer before a posts again.
  auto answer = [&](uint64_t id, uint8_t v) {
    std::fill(h.b.buf.begin() + 16, h.b.buf.begin() + 24, v);
    ASSERT_EQ(h.post_send(h.b, Wr(h.b, WrOpcode::kRdmaWrite, 16, 8, id).remote(h.a, 16)), 0);
    h.net_.deliver();
  };
  auto a_writes = [&](uint64_t id) {
    ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, 8, id).remote(h.b, 0)), 0);
    h.net_.deliver();
    h.b.poll(h.b.scq);
  };
  answer(100, 1);
  for (uint64_t i = 0; i < core::Transport::kUcAnswers; ++i) {
    a_writes(10 + i);
    EXPECT_EQ(h.a.poll(h.a.scq).size(), 1u) << "not yet a ping-pong, round " << i;  // receives the answer
    answer(101 + i, 2);
  }
  EXPECT_EQ(holds(), 0u);
  h.a.poll(h.a.scq);  // receives the last answer
  // A ping-pong now: the completion waits for b's answer, and comes with it in memory.
  a_writes(20);
  EXPECT_EQ(holds(), 1u);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(h.a.poll(h.a.scq).empty()) << "held, poll " << i;
  answer(200, 0x5A);
  std::vector<Wc> got = h.a.poll(h.a.scq);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id, 20u);
  EXPECT_TRUE(std::all_of(h.a.buf.begin() + 16, h.a.buf.begin() + 24, [](uint8_t v) { return v == 0x5A; }));
  // No answer in time: the completion comes when the hold ends (kUcAnswerHoldNs and 1 ns per byte of the
  // WRITE); the answer, late, ends the ping-pong.
  a_writes(21);
  EXPECT_EQ(holds(), 2u);
  EXPECT_TRUE(h.a.poll(h.a.scq).empty());
  g_now += core::Transport::kUcAnswerHoldNs + 7;
  EXPECT_TRUE(h.a.poll(h.a.scq).empty());
  g_now += 1;
  ASSERT_EQ(h.a.poll(h.a.scq).size(), 1u);
  EXPECT_EQ(h.a.counters.get(Counter::answer_holds_late), 1u);
  answer(201, 3);
  h.a.poll(h.a.scq);  // receives it
  a_writes(22);
  EXPECT_EQ(h.a.poll(h.a.scq).size(), 1u) << "held again after a late answer";
  EXPECT_EQ(holds(), 2u);
}

// Large WRITEs in a UC ping-pong (socket ib_write_lat -c UC from 16 KiB: 2 ms typical, against 8 us at
// 8 KiB). The hold lasts until the answer's last packet, not its first (ended at the first, the poll
// returned the completion with the rest to come, and the rest waited for the napping progress thread);
// and it allows for the WRITE's own packets, which leave before the peer can answer (1 ns per byte: at
// 1 MiB, every hold of 200 us ran out).
TEST(Uc, AHeldPollWaitsForTheLastPacketOfTheAnswer) {
  Harness h({}, opts(QpType::kUc));
  const uint32_t len = 8 * 1024;
  uint64_t id = 1;
  auto a_writes = [&] {
    ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, len, id++).remote(h.b, 0)), 0);
    h.net_.deliver();
    h.b.poll(h.b.scq);  // b receives it
  };
  auto b_answers = [&](uint32_t n, uint8_t v) {
    fill(h.b.buf, 2 * len, n, v);
    ASSERT_EQ(h.post_send(h.b, Wr(h.b, WrOpcode::kRdmaWrite, 2 * len, n, 1000 + id).remote(h.a, 2 * len)), 0);
    h.net_.deliver();
  };
  b_answers(8, 1);
  for (uint32_t i = 0; i <= core::Transport::kUcAnswers; ++i) {  // a ping-pong from the last round on
    h.a.poll(h.a.scq);
    a_writes();
    b_answers(8, static_cast<uint8_t>(2 + i));
  }
  h.a.poll(h.a.scq);
  const uint64_t holds = h.a.counters.get(Counter::answer_holds);
  EXPECT_GE(holds, 1u) << "a ping-pong";
  a_writes();
  EXPECT_EQ(h.a.counters.get(Counter::answer_holds), holds + 1);
  g_now += core::Transport::kUcAnswerHoldNs + 1;
  Wc wc[4];
  EXPECT_EQ(h.a.scq->poll(wc), 0) << "held past 200 us: a's 8 KiB left first";
  // b answers with 3 packets (1 KiB path MTU); a receives the first alone, then polls once.
  b_answers(3 * 1024, 77);
  io::RxPacket first;
  ASSERT_EQ(h.a.be->rx_burst(&first, 1), 1u);
  h.a.ctx->rx_burst(std::span(&first, 1), h.a.tx, g_now);
  ASSERT_EQ(h.a.scq->poll(wc), 1);
  EXPECT_EQ(std::memcmp(h.a.buf.data() + 2 * len, h.b.buf.data() + 2 * len, 3 * 1024), 0)
      << "the whole answer is there";
  EXPECT_EQ(h.a.counters.get(Counter::answer_holds_late), 0u);
}

TEST(Uc, LostMiddlePacketDropsTheMessage) {
  Harness h({}, opts(QpType::kUc));
  int middles = 0;
  h.net_.drop_if = [&](uint64_t, std::span<const uint8_t> f) {
    return f[0] == wire::opcode(wire::Transport::kUc, wire::kOpSendMiddle) && middles++ == 0;
  };
  ASSERT_EQ(h.post_recv(h.b, 20, 0, 8192), 0);
  ASSERT_EQ(h.post_recv(h.b, 21, 8192, 8192), 0);
  fill(h.a.buf, 0, 3000, 1);     // 3 packets: FIRST, MIDDLE (lost), LAST
  fill(h.a.buf, 4096, 2500, 2);  // the next message
  fill(h.a.buf, 8192, 100, 3);   // and one more
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kSend, 0, 3000, 1)), 0);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kSend, 4096, 2500, 2)), 0);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kSend, 8192, 100, 3)), 0);
  auto s = h.a.poll(h.a.scq);
  ASSERT_EQ(s.size(), 3u);
  for (const Wc& w : s) EXPECT_EQ(w.status, WcStatus::kSuccess);
  std::vector<Wc> r;
  ASSERT_TRUE(h.wait(h.b, h.b.rcq, 2, &r));
  h.run([] { return false; }, 10);
  for (const Wc& w : h.b.poll(h.b.rcq)) r.push_back(w);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].wr_id, 20u);  // the dropped message's WQE, reused
  EXPECT_EQ(r[0].status, WcStatus::kSuccess);
  EXPECT_EQ(r[0].byte_len, 2500u);
  EXPECT_EQ(std::memcmp(h.a.buf.data() + 4096, h.b.buf.data(), 2500), 0);
  EXPECT_EQ(r[1].wr_id, 21u);
  EXPECT_EQ(r[1].byte_len, 100u);
  EXPECT_EQ(std::memcmp(h.a.buf.data() + 8192, h.b.buf.data() + 8192, 100), 0);
  EXPECT_EQ(h.b.counters.get(Counter::drop_uc_msg), 1u);
  EXPECT_EQ(h.b.qp->attr().qp_state, QpState::kRts);
  EXPECT_EQ(h.a.counters.get(Counter::retransmits), 0u);
}

// The same for WRITE WITH IMMEDIATE: the lost message produces no completion; the next one does.
TEST(Uc, LostMiddlePacketOfWriteWithImm) {
  Harness h({}, opts(QpType::kUc));
  int middles = 0;
  h.net_.drop_if = [&](uint64_t, std::span<const uint8_t> f) {
    return f[0] == wire::opcode(wire::Transport::kUc, wire::kOpWriteMiddle) && middles++ == 0;
  };
  ASSERT_EQ(h.post_recv(h.b, 30, 0, 16), 0);
  fill(h.a.buf, 0, 3000, 4);
  Wr w1(h.a, WrOpcode::kRdmaWriteWithImm, 0, 3000, 1);
  w1.remote(h.b, 16384);
  ASSERT_EQ(h.post_send(h.a, w1), 0);
  Wr w2(h.a, WrOpcode::kRdmaWriteWithImm, 0, 3000, 2);
  w2.remote(h.b, 32768);
  w2.wr.imm_data = htonl(2);
  ASSERT_EQ(h.post_send(h.a, w2), 0);
  std::vector<Wc> r;
  ASSERT_TRUE(h.wait(h.b, h.b.rcq, 1, &r));
  h.run([] { return false; }, 10);
  for (const Wc& w : h.b.poll(h.b.rcq)) r.push_back(w);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].wr_id, 30u);
  EXPECT_EQ(r[0].imm_data, htonl(2));
  EXPECT_EQ(r[0].byte_len, 3000u);
  EXPECT_EQ(std::memcmp(h.a.buf.data(), h.b.buf.data() + 32768, 3000), 0);
  EXPECT_EQ(h.b.counters.get(Counter::drop_uc_msg), 1u);
}

// ---- UD ----

struct UdFixture {
  Harness h{{}, opts(QpType::kUd)};
  core::Ah* ah = *h.a.ctx->create_ah(h.a.pd, core::AhAttr{.dgid = h.b.ctx->local_addr()});
  ~UdFixture() { h.a.ctx->destroy_ah(ah); }
  core::SendWr send(uint64_t off, uint32_t len, uint64_t id, uint32_t qkey = 0x11111111) {
    wr = Wr(h.a, WrOpcode::kSend, off, len, id);
    wr->wr.ah = ah;
    wr->wr.remote_qpn = h.b.qp->qpn();
    wr->wr.remote_qkey = qkey;
    return *wr;
  }
  std::optional<Wr> wr;
};

TEST(Ud, SendPlacesTheGrhFirst) {
  UdFixture f;
  Harness& h = f.h;
  // A UD QP asks its backend for the TOS and TTL of what it receives (an RC QP does not: Rc tests).
  EXPECT_TRUE(h.b.be->ip_fields_wanted);
  for (uint32_t len : {0u, 1u, 100u, 1000u, 4096u}) {  // up to the MTU (the interface's: 4096)
    SCOPED_TRACE(len);
    std::memset(h.b.buf.data(), 0xEE, 8192);
    ASSERT_EQ(h.post_recv(h.b, 5, 0, 8192), 0);
    fill(h.a.buf, 0, len, len);
    ASSERT_EQ(h.post_send(h.a, f.send(0, len, 6)), 0);
    auto s = h.a.poll(h.a.scq);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].status, WcStatus::kSuccess);
    std::vector<Wc> r;
    ASSERT_TRUE(h.wait(h.b, h.b.rcq, 1, &r));
    EXPECT_EQ(r[0].status, WcStatus::kSuccess);
    EXPECT_EQ(r[0].wr_id, 5u);
    EXPECT_EQ(r[0].byte_len, len + 40);
    EXPECT_EQ(r[0].src_qp, h.a.qp->qpn());
    EXPECT_EQ(r[0].qp_num, h.b.qp->qpn());
    EXPECT_TRUE(r[0].wc_flags & kWcGrh);
    EXPECT_EQ(r[0].sl, 2);  // an IPv4 packet, as ConnectX reports it (ud_wc_sl; UCX's ud_verbs reads it)
    EXPECT_EQ(r[0].opcode, WcOpcode::kRecv);
    const uint8_t* g = h.b.buf.data();
    EXPECT_TRUE(zero(h.b, 0, 20));  // rxe zeroes the 20 bytes before an IPv4 header
    const uint8_t* ip = g + 20;
    EXPECT_EQ(ip[0], 0x45);
    EXPECT_EQ(ip[9], 17);  // UDP
    const uint32_t pad = (4 - (len & 3)) & 3;
    EXPECT_EQ(wire::load_be16(ip + 2),
              20 + 8 + 12 + 8 + len + pad + 4);  // IP + UDP + BTH + DETH + data + ICRC
    EXPECT_EQ(std::memcmp(ip + 12, &h.a.ctx->local_addr().raw[12], 4), 0);  // source 10.0.0.1
    EXPECT_EQ(std::memcmp(ip + 16, &h.b.ctx->local_addr().raw[12], 4), 0);  // destination 10.0.0.2
    EXPECT_EQ(ip[12], 10);
    EXPECT_EQ(ip[15], 1);
    EXPECT_EQ(ip[19], 2);
    uint32_t sum = 0;  // a valid header checksum (libibverbs checks it to tell IPv4 from IPv6)
    for (int i = 0; i < 20; i += 2) sum += wire::load_be16(ip + i);
    while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
    EXPECT_EQ(sum, 0xFFFFu);
    EXPECT_EQ(std::memcmp(g + 40, h.a.buf.data(), len), 0);
    EXPECT_EQ(h.b.buf[40 + len], 0xEE);
  }
}

// The SL of a UD receive completion names the packet's L3 type, IPv4 2 and IPv6 1, as ConnectX's do.
TEST(Ud, CompletionSlIsTheL3TypeAsConnectXReportsIt) {
  EXPECT_EQ(core::ud_wc_sl(true), 2);
  EXPECT_EQ(core::ud_wc_sl(false), 1);
}

TEST(Ud, WrongQkeyDroppedAndCounted) {
  UdFixture f;
  Harness& h = f.h;
  ASSERT_EQ(h.post_recv(h.b, 7, 0, 1024), 0);
  fill(h.a.buf, 0, 64, 1);
  ASSERT_EQ(h.post_send(h.a, f.send(0, 64, 1, 0x22222222)), 0);
  h.run([] { return false; }, 10);
  EXPECT_TRUE(h.b.poll(h.b.rcq).empty());
  EXPECT_EQ(h.b.counters.get(Counter::drop_bad_qkey), 1u);
  EXPECT_TRUE(zero(h.b, 0, 1024));
  // The receive is still there for the next datagram with the right Q_Key.
  ASSERT_EQ(h.post_send(h.a, f.send(0, 64, 2)), 0);
  std::vector<Wc> r;
  ASSERT_TRUE(h.wait(h.b, h.b.rcq, 1, &r));
  EXPECT_EQ(r[0].wr_id, 7u);
  EXPECT_EQ(r[0].status, WcStatus::kSuccess);
  EXPECT_EQ(h.b.qp->attr().qp_state, QpState::kRts);
}

// Larger than the MTU: rxe completes the WR successfully and sends nothing (C10-93.1.1).
TEST(Ud, LargerThanMtuCompletesWithNothingSent) {
  UdFixture f;
  Harness& h = f.h;
  ASSERT_EQ(h.post_recv(h.b, 8, 0, 16384), 0);
  ASSERT_EQ(h.post_send(h.a, f.send(0, 4097, 3)), 0);
  auto s = h.a.poll(h.a.scq);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].status, WcStatus::kSuccess);
  EXPECT_EQ(s[0].wr_id, 3u);
  EXPECT_EQ(h.net_.sent, 0u);
  h.run([] { return false; }, 10);
  EXPECT_TRUE(h.b.poll(h.b.rcq).empty());
  EXPECT_EQ(h.a.qp->attr().qp_state, QpState::kRts);
}

// The receive buffer cannot hold GRH + payload: LOC_LEN_ERR, counted, the QP stays up.
TEST(Ud, RecvBufferTooSmallIsLocLenErr) {
  UdFixture f;
  Harness& h = f.h;
  std::memset(h.b.buf.data(), 0xEE, 4096);
  ASSERT_EQ(h.post_recv(h.b, 9, 0, 40 + 50), 0);
  ASSERT_EQ(h.post_recv(h.b, 10, 1024, 40 + 100), 0);
  fill(h.a.buf, 0, 100, 9);
  ASSERT_EQ(h.post_send(h.a, f.send(0, 100, 1)), 0);
  ASSERT_EQ(h.post_send(h.a, f.send(0, 100, 2)), 0);
  std::vector<Wc> r;
  ASSERT_TRUE(h.wait(h.b, h.b.rcq, 2, &r));
  EXPECT_EQ(r[0].wr_id, 9u);
  EXPECT_EQ(r[0].status, WcStatus::kLocLenErr);
  EXPECT_EQ(r[1].wr_id, 10u);
  EXPECT_EQ(r[1].status, WcStatus::kSuccess);
  EXPECT_EQ(r[1].byte_len, 140u);
  EXPECT_EQ(h.b.counters.get(Counter::drop_ud_too_long), 1u);
  EXPECT_EQ(h.b.buf[90], 0xEE);  // nothing past the short buffer
  EXPECT_EQ(h.b.qp->attr().qp_state, QpState::kRts);
}

TEST(Ud, NoReceivePostedIsDropped) {
  UdFixture f;
  Harness& h = f.h;
  ASSERT_EQ(h.post_send(h.a, f.send(0, 10, 1)), 0);
  h.run([] { return false; }, 10);
  EXPECT_EQ(h.b.counters.get(Counter::drop_ud_no_wqe), 1u);
  EXPECT_TRUE(h.b.poll(h.b.rcq).empty());
  EXPECT_EQ(h.net_.sent, 1u);  // no RNR NAK, no answer at all
}

}  // namespace
}  // namespace softrdma::test
