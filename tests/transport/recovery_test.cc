// Loss recovery beyond the IBTA minimum (transport.h, kEarlyMinNs, kProbeMinNs and kMinLossWindow): a
// go-back-N before the QP's ACK timeout once the peer has answered, after a loss led by a loss probe,
// which spend no retry and leave that timeout where it was; a send window halved by each loss and grown back
// by the ACKs; ACKs that acknowledge packets of the round before a go-back-N; and NAKs that do not skip a
// READ's responses.
#include <gtest/gtest.h>

#include "transport/harness.h"
#include "transport/transport.h"

namespace softrdma::test {
namespace {

using core::Transport;

// The BTH's PSN (the harness starts near the wrap at 2^24: compare them masked).
uint32_t psn_of(std::span<const uint8_t> f) { return wire::load_be24(f.data() + 9); }

// By default any ACK timeout fails the WQE: an early retransmission must not count as one.
QpOptions opts(uint8_t retry_cnt = 0) {
  QpOptions o;
  o.timeout = 14;  // 67.1 ms, perftest's
  o.retry_cnt = retry_cnt;
  return o;
}

// Posts a WRITE and runs until it completes; returns its completion.
Wc write_and_wait(Harness& h, uint64_t off, uint32_t len, uint64_t wr_id) {
  fill(h.a.buf, off, len, static_cast<uint32_t>(wr_id));
  EXPECT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, off, len, wr_id).remote(h.b, off)), 0);
  std::vector<Wc> s;
  EXPECT_TRUE(h.wait(h.a, h.a.scq, 1, &s));
  return s.empty() ? Wc{} : s[0];
}

// The peer answers a first WRITE; then, with `loss`, a request packet is lost and recovered (the peer NAKs
// the gap, which takes a retry, as in rxe): the window is halved, and until it has grown whole again the
// early retransmission begins with a loss probe.
void answer_then_lose(Harness& h, bool loss) {
  ASSERT_EQ(write_and_wait(h, 0, 100, 1).status, WcStatus::kSuccess);
  if (!loss) return;
  int seen = 0;
  h.net_.drop_if = [&](uint64_t, std::span<const uint8_t> f) {
    return f[0] == rc(wire::kOpWriteMiddle) && ++seen == 1;
  };
  EXPECT_EQ(write_and_wait(h, 0, 4096, 100).status, WcStatus::kSuccess);
  EXPECT_EQ(h.a.counters.get(Counter::rx_nak_psn_seq), 1u);
  h.net_.drop_if = nullptr;
}

// The last packet of a WRITE of one packet lost `times` times, after a first WRITE that the peer answered
// (and, with `after_loss`, a packet lost before): what recovered it, and how soon.
struct TailLoss {
  uint64_t probes, early, timeouts;
  Nanos took;
  bool intact;
};
TailLoss lose_the_last_packet(int times, bool after_loss) {
  Harness h({}, opts(1));  // the NAK takes one; an ACK timeout would show in the counter
  answer_then_lose(h, after_loss);
  int seen = 0;
  h.net_.drop_if = [&](uint64_t, std::span<const uint8_t> f) {
    return f[0] == rc(wire::kOpWriteOnly) && ++seen <= times;
  };
  const Nanos t0 = g_now;
  EXPECT_EQ(write_and_wait(h, 4096, 100, 2).status, WcStatus::kSuccess);
  EXPECT_EQ(seen, times + 1);
  return {h.a.counters.get(Counter::loss_probes), h.a.counters.get(Counter::early_retransmits),
          h.a.counters.get(Counter::retry_timeouts), g_now - t0,
          std::memcmp(h.a.buf.data() + 4096, h.b.buf.data() + 4096, 100) == 0};
}

// No later packet makes the peer NAK, so only a timer finds it: once the peer has answered, a go-back-N
// after kEarlyMinNs (the round trips here are microseconds), not after the 67 ms ACK timeout. After a loss,
// the last packet goes again first after kProbeMinNs (the loss probe), and, the probe lost too, the
// go-back-N follows kEarlyMinNs after it. Where nothing was lost before, no probe.
TEST(Recovery, ALostLastPacketGoesAgainBeforeTheAckTimeout) {
  struct Case {
    int times;
    bool after_loss;
    uint64_t probes, early;
    Nanos after;
  };
  constexpr Nanos kProbe = Transport::kProbeMinNs, kEarly = Transport::kEarlyMinNs;
  for (const Case& c :
       {Case{1, false, 0, 1, kEarly}, Case{1, true, 1, 0, kProbe}, Case{2, true, 1, 1, kProbe + kEarly}}) {
    SCOPED_TRACE(testing::Message() << c.times << " lost, after a loss " << c.after_loss);
    const TailLoss r = lose_the_last_packet(c.times, c.after_loss);
    EXPECT_EQ(r.probes, c.probes);
    EXPECT_EQ(r.early, c.early);
    EXPECT_EQ(r.timeouts, 0u);
    EXPECT_GE(r.took, c.after);
    EXPECT_LT(r.took, c.after + kProbe / 2);
    EXPECT_TRUE(r.intact);
  }
}

// A window that arrived whole in one burst has one ACK (the responder coalesces them): that ACK lost, after
// a loss, the probe's duplicate gets an ACK of everything, and nothing else goes again.
TEST(Recovery, ALostAckIsAnsweredByTheProbe) {
  Harness h({}, opts(7));
  answer_then_lose(h, true);
  int acks = 0;
  h.net_.drop_if = [&](uint64_t, std::span<const uint8_t> f) {
    return f[0] == rc(wire::kOpAcknowledge) && ++acks == 1;
  };
  const uint64_t resent = h.a.counters.get(Counter::retransmits);
  const uint64_t dups = h.b.counters.get(Counter::dup_requests);
  const Nanos t0 = g_now;
  const Wc w = write_and_wait(h, 0, 8 * 1024, 2);  // 8 packets
  EXPECT_EQ(w.status, WcStatus::kSuccess);
  EXPECT_EQ(acks, 2);  // the one dropped and the probe's
  EXPECT_GE(g_now - t0, Transport::kProbeMinNs);
  EXPECT_LT(g_now - t0, Transport::kProbeMinNs + Transport::kProbeMinNs / 2);
  EXPECT_EQ(h.a.counters.get(Counter::loss_probes), 1u);
  EXPECT_EQ(h.a.counters.get(Counter::retransmits), resent + 1);  // the probe alone
  EXPECT_EQ(h.a.counters.get(Counter::early_retransmits), 0u);
  EXPECT_EQ(h.b.counters.get(Counter::dup_requests), dups + 1);
}

// After a loss, a packet of a WRITE lost again where the responder stays silent: its resend lost (the peer
// NAKed that gap already), or the packet and its NAK lost. The probe, the oldest unacknowledged packet,
// fills the gap; its ACK says the packets after it went nowhere, and the requester goes back at once, a
// millisecond after the last progress rather than the early retransmission's 5 ms after the probe (as
// when the probe was the last packet, which the responder dropped silently behind the gap).
TEST(Recovery, AProbesAnswerThatLeavesPacketsOutstandingGoesBackAtOnce) {
  for (const bool lose_nak : {false, true}) {
    SCOPED_TRACE(lose_nak ? "the packet and its NAK lost" : "the packet and its resend lost");
    Harness h({}, opts(7));
    answer_then_lose(h, true);
    uint32_t first = 0;
    int lost = 0, naks_lost = 0;
    h.net_.drop_if = [&](uint64_t, std::span<const uint8_t> f) {
      if (f[0] == rc(wire::kOpWriteFirst) && first == 0) first = psn_of(f);
      if (f[0] == rc(wire::kOpAcknowledge) && (f[12] & 0xE0) == 0x60)  // a NAK (AETH syndrome 011x xxxx)
        return lose_nak && naks_lost++ == 0;
      return first != 0 && psn_of(f) == ((first + 2) & 0xFFFFFF) && lost++ < (lose_nak ? 1 : 2);
    };
    const uint64_t naks = h.a.counters.get(Counter::rx_nak_psn_seq);
    const Nanos t0 = g_now;
    EXPECT_EQ(write_and_wait(h, 8192, 8 * 1024, 2).status, WcStatus::kSuccess);  // 8 packets
    EXPECT_EQ(h.a.counters.get(Counter::rx_nak_psn_seq), naks + (lose_nak ? 0 : 1));
    EXPECT_EQ(h.a.counters.get(Counter::loss_probes), 1u);
    EXPECT_EQ(h.a.counters.get(Counter::probe_go_backs), 1u);
    EXPECT_EQ(h.a.counters.get(Counter::early_retransmits), 0u);
    EXPECT_GE(g_now - t0, Transport::kProbeMinNs);
    EXPECT_LT(g_now - t0, Transport::kProbeMinNs + Transport::kProbeMinNs / 2);
    EXPECT_EQ(std::memcmp(h.a.buf.data() + 8192, h.b.buf.data() + 8192, 8 * 1024), 0);
  }
}

// A same-host peer that still reads the ring holding the packets (io::Backend::peer_behind) is late, not
// lossy: neither the probe nor the early retransmission goes; the ACK timeout's own waits (retry_waits)
// and retransmission recover a packet that is lost after all.
TEST(Recovery, NothingGoesEarlyWhileThePeerIsBehind) {
  Harness h({}, opts(7));
  answer_then_lose(h, true);
  const uint64_t timeouts = h.a.counters.get(Counter::retry_timeouts);
  h.a.be->behind = [](const wire::Endpoint&, uint64_t*) { return true; };
  int seen = 0;
  h.net_.drop_if = [&](uint64_t, std::span<const uint8_t> f) {
    return f[0] == rc(wire::kOpWriteOnly) && ++seen == 1;
  };
  EXPECT_EQ(write_and_wait(h, 4096, 100, 2).status, WcStatus::kSuccess);
  EXPECT_EQ(h.a.counters.get(Counter::loss_probes), 0u);
  EXPECT_EQ(h.a.counters.get(Counter::early_retransmits), 0u);
  EXPECT_EQ(h.a.counters.get(Counter::retry_waits), uint64_t{Transport::kMaxRetryWaits});
  EXPECT_EQ(h.a.counters.get(Counter::retry_timeouts), timeouts + 1);
}

// A peer that answered and then went away: the early retransmissions double their wait (5, 10, 20 ms)
// while it stays under half the ACK timeout; each is a loss, so a loss probe leads the next wait, 1 ms
// in, and puts the next off by as much. The ACK timeout still runs out 67.1 ms after the post, as without
// them, failing the WQE with retry_cnt 0.
TEST(Recovery, EarlyRetransmissionsLeaveTheAckTimeoutWhereItWas) {
  const QpOptions o = opts();
  Harness h({}, o);
  ASSERT_EQ(write_and_wait(h, 0, 100, 1).status, WcStatus::kSuccess);
  const Nanos t0 = g_now;
  std::vector<Nanos> at;
  h.net_.drop_if = [&](uint64_t, std::span<const uint8_t>) {
    at.push_back(g_now - t0);
    return true;
  };
  const uint64_t sent = h.net_.sent;
  const Wc w = write_and_wait(h, 4096, 100, 2);
  EXPECT_EQ(w.status, WcStatus::kRetryExcErr);
  const Nanos t = Transport::ack_timeout_ns(o.timeout);
  EXPECT_GE(g_now - t0, t);
  EXPECT_LE(g_now - t0, t + t / 100 + 1'000'000);  // (the harness notices a completion up to 1 ms late)
  static_assert(Transport::kEarlyMinNs * 4 <= (4096ull << 14) / 2 &&
                Transport::kEarlyMinNs * 8 > (4096ull << 14) / 2);
  EXPECT_EQ(h.a.counters.get(Counter::early_retransmits), 3u);
  EXPECT_EQ(h.a.counters.get(Counter::loss_probes), 2u);
  EXPECT_EQ(h.a.counters.get(Counter::retry_timeouts), 1u);
  // The WRITE, three early resends, and after the first two (losses) a probe each, 1 ms later, which puts
  // off the next by as much; the third's would wait past half the ACK timeout. Then the timeout failed it.
  EXPECT_EQ(h.net_.sent - sent, 6u);
  constexpr Nanos ms = 1'000'000;
  EXPECT_EQ(at, (std::vector<Nanos>{0, 5 * ms, 6 * ms, 16 * ms, 17 * ms, 37 * ms}));
}

// A peer that never answered may be gone rather than lossy: only the ACK timeout resends.
TEST(Recovery, NoEarlyRetransmissionBeforeThePeerAnswered) {
  QpOptions o = opts();
  o.retry_cnt = 1;
  Harness h({.drop = 1.0}, o);
  const Wc w = write_and_wait(h, 0, 100, 1);
  EXPECT_EQ(w.status, WcStatus::kRetryExcErr);
  EXPECT_EQ(h.a.counters.get(Counter::early_retransmits), 0u);
  EXPECT_EQ(h.a.counters.get(Counter::retry_timeouts), 2u);
  EXPECT_EQ(h.net_.sent, 2u);
}

// The request packets of a 1 MiB WRITE (path MTU 1024) sent before the peer's first ACK for them: the
// requester's first burst.
struct Bursts {
  std::vector<uint32_t> first_burst;  // per WRITE: packets sent before an ACK came back
  uint32_t count = 0;
  bool counting = false;
  int drops_left = 0;
  uint32_t drop_at = 0;  // drop the request packet this many packets into the next WRITE (once)
  uint32_t sent_in_write = 0;

  void attach(Harness& h) {
    h.net_.drop_if = [this](uint64_t, std::span<const uint8_t> f) {
      if (f[0] == rc(wire::kOpAcknowledge)) {
        if (counting) first_burst.push_back(count);
        counting = false;
        return false;
      }
      if (counting) ++count;
      if (drops_left > 0 && sent_in_write++ == drop_at) {
        --drops_left;
        return true;
      }
      return false;
    };
  }
  void next_write(int drops, uint32_t at) {
    count = 0;
    counting = true;
    drops_left = drops;
    drop_at = at;
    sent_in_write = 0;
  }
};

// A loss halves the window, and the ACKs of loss-free WRITEs grow it back to the full 1,024 packets. The
// go-back-N from the lost packet sends only half the window before the peer's ACK; without the loss rule
// it sent all of it again, behind a lost packet each time at high loss.
TEST(Recovery, ALossHalvesTheWindowAndAcksGrowItBack) {
  Harness h({}, opts(7));
  constexpr uint32_t kLen = 1 << 20;
  const uint32_t full = h.a.ctx->window_for(1024, 0);
  ASSERT_EQ(full, 1024u);
  Bursts b;
  b.attach(h);
  b.next_write(0, 0);
  ASSERT_EQ(write_and_wait(h, 0, kLen, 1).status, WcStatus::kSuccess);
  ASSERT_FALSE(b.first_burst.empty());
  EXPECT_EQ(b.first_burst.front(), full);  // nothing lost yet: the whole window at once

  // Packet 100 lost: the peer NAKs at packet 101; the requester goes back to 100 with half the window.
  b.first_burst.clear();
  b.next_write(1, 100);
  const uint64_t naks = h.a.counters.get(Counter::rx_nak_psn_seq);
  ASSERT_EQ(write_and_wait(h, 0, kLen, 2).status, WcStatus::kSuccess);
  EXPECT_EQ(h.a.counters.get(Counter::rx_nak_psn_seq), naks + 1);
  EXPECT_EQ(std::memcmp(h.a.buf.data(), h.b.buf.data(), kLen), 0);
  const uint64_t resent = h.a.counters.get(Counter::retransmits);
  EXPECT_GT(resent, 0u);
  // Resent: what was in flight behind packet 100, at most the full window less the 100 before it.
  EXPECT_LE(resent, full - 100);

  // Loss-free WRITEs: each ACK grows the window by an eighth of what it acknowledged, until it is full.
  b.first_burst.clear();
  uint32_t last_burst = 0;
  for (uint64_t i = 0; i < 12; ++i) {
    b.next_write(0, 0);
    ASSERT_EQ(write_and_wait(h, 0, kLen, 3 + i).status, WcStatus::kSuccess);
    ASSERT_FALSE(b.first_burst.empty());
    EXPECT_GE(b.first_burst.back(), last_burst) << "write " << i;
    last_burst = b.first_burst.back();
    b.first_burst.clear();
    if (i == 0) {  // the first WRITE after the loss: half the window, and what the recovery's ACKs added
      EXPECT_GT(last_burst, full / 2);
      EXPECT_LT(last_burst, full);
    }
  }
  EXPECT_EQ(last_burst, full);
  EXPECT_EQ(h.a.counters.get(Counter::retransmits), resent);
}

// The peer's ACK may acknowledge packets of the round before a go-back-N that this round has not resent
// yet (its ACKs were lost, not its requests): the requester takes it and goes on from there rather than
// resending them, and never waits for an ACK of a PSN it would never reach with a shrunken window.
TEST(Recovery, AnAckBeyondTheResentPacketsMovesTheRequesterOn) {
  Harness h({}, opts(7));
  constexpr uint32_t kLen = 1 << 20;  // 1,024 packets, the whole window
  ASSERT_EQ(write_and_wait(h, 0, 100, 1).status, WcStatus::kSuccess);
  // Every ACK lost until the resend: the requester's early retransmission goes back to the WRITE's first
  // packet with half the window, and the peer's first ACK after that (of a duplicate) covers all 1,024.
  int acks_to_drop = 1000;
  uint32_t write_first = 0, resent_max = 0;
  bool resending = false;
  h.net_.drop_if = [&](uint64_t, std::span<const uint8_t> f) {
    if (f[0] == rc(wire::kOpAcknowledge)) return acks_to_drop-- > 0 && !resending;
    if (f[0] == rc(wire::kOpWriteFirst)) {
      if (write_first == 0) {
        write_first = psn_of(f);
      } else {
        resending = true;
      }
    }
    if (resending) resent_max = std::max(resent_max, ((psn_of(f) - write_first) & 0xFFFFFF) + 1);
    return false;
  };
  fill(h.a.buf, 0, kLen, 9);
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaWrite, 0, kLen, 2).remote(h.b, 0)), 0);
  std::vector<Wc> s;
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &s));
  EXPECT_EQ(s[0].status, WcStatus::kSuccess);
  EXPECT_EQ(h.a.counters.get(Counter::early_retransmits), 1u);
  EXPECT_EQ(h.a.counters.get(Counter::retry_timeouts), 0u);
  // The early retransmission halved the window: the resend stopped at 512 packets, and the peer's ACK of
  // all 1,024 (it had them) completed the WRITE.
  EXPECT_EQ(resent_max, 512u);
  EXPECT_EQ(std::memcmp(h.a.buf.data(), h.b.buf.data(), kLen), 0);
}

// A NAK whose PSN lies inside a READ at the head of the queue (a later chunk's request was lost) does not
// acknowledge that READ's responses before it, some of which may be missing too: the READ goes again from
// the first one missing, and completes with every byte.
TEST(Recovery, ANakInsideAReadDoesNotSkipItsMissingResponses) {
  Harness h({}, opts(7));
  constexpr uint32_t kChunk = 64;  // requester.cc kReadChunk
  constexpr uint32_t kLen = 3 * kChunk * 1024;
  fill(h.b.buf, 0, kLen, 5);
  uint32_t first = 0;
  int requests = 0;
  bool dropped_resp = false, dropped_req = false;
  h.net_.drop_if = [&](uint64_t, std::span<const uint8_t> f) {
    if (f[0] == rc(wire::kOpReadRequest) && ++requests == 1) first = psn_of(f);
    // The last response of the first chunk, and the second chunk's request.
    if (!dropped_resp && f[0] == rc(wire::kOpReadRespLast) && psn_of(f) == ((first + kChunk - 1) & 0xFFFFFF))
      return dropped_resp = true;
    if (!dropped_req && f[0] == rc(wire::kOpReadRequest) && psn_of(f) == ((first + kChunk) & 0xFFFFFF))
      return dropped_req = true;
    return false;
  };
  ASSERT_EQ(h.post_send(h.a, Wr(h.a, WrOpcode::kRdmaRead, 0, kLen, 1).remote(h.b, 0)), 0);
  std::vector<Wc> s;
  ASSERT_TRUE(h.wait(h.a, h.a.scq, 1, &s));
  EXPECT_TRUE(dropped_resp && dropped_req);
  EXPECT_EQ(s[0].status, WcStatus::kSuccess);
  EXPECT_GE(h.a.counters.get(Counter::rx_nak_psn_seq), 1u);
  EXPECT_EQ(std::memcmp(h.a.buf.data(), h.b.buf.data(), kLen), 0) << "a READ response skipped";
}

}  // namespace
}  // namespace softrdma::test
