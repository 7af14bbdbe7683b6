// Malformed and hostile packets handed straight to Context::rx_burst: each is dropped or NAKed as
// IBTA.md 3d/5/10 say, counted in its Counter, never touches memory outside the MR it names, and never
// crashes the stack.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "transport/harness.h"

namespace softrdma::test {
namespace {

using wire::PacketView;

constexpr uint32_t kFirstPsn = 0xFFFFF0;  // the harness's rq_psn / sq_psn

QpOptions opts() {
  QpOptions o;
  o.buf_size = 1 << 16;
  o.max_wr = 16;
  return o;
}

// A request packet for node `to`'s QP: BTH (+ extension headers) and `payload` bytes of 0x5A.
std::vector<uint8_t> craft(uint8_t op, uint32_t dqpn, uint32_t psn, uint32_t payload, bool ack_req = true) {
  const wire::OpcodeInfo& oi = wire::info(op);
  const uint8_t pad = static_cast<uint8_t>((4 - (payload & 3)) & 3);
  std::vector<uint8_t> b(std::max<uint32_t>(oi.hdr_len, wire::kBthLen) + payload + pad, 0);
  PacketView v(b.data(), static_cast<uint32_t>(b.size()));
  v.set_bth(op, false, pad, wire::kDefaultPkey, dqpn, ack_req, psn);
  std::memset(b.data() + std::max<uint32_t>(oi.hdr_len, wire::kBthLen), 0x5A, payload);
  return b;
}

// Records what the responder sends back (and keeps it off the requester, which is not under test here).
struct Capture {
  std::vector<std::vector<uint8_t>> frames;
  void attach(Harness& h) {
    h.net_.drop_if = [this](uint64_t, std::span<const uint8_t> f) {
      frames.emplace_back(f.begin(), f.end());
      return true;
    };
  }
  size_t size() const { return frames.size(); }
  PacketView at(size_t i) {
    return PacketView(frames[i].data(), static_cast<uint32_t>(frames[i].size() - 4));
  }
};

uint64_t total_drops(const Counters& c) {
  uint64_t n = 0;
  for (Counter k : {Counter::drop_truncated, Counter::drop_bad_opcode, Counter::drop_bad_header,
                    Counter::drop_no_qp, Counter::drop_qp_state, Counter::drop_wrong_peer,
                    Counter::drop_out_of_seq, Counter::drop_stale_response, Counter::drop_bad_qkey})
    n += c.get(k);
  return n;
}

// One malformed packet: exactly one drop, in `counter`; no answer; the QP stays in RTS.
void expect_dropped(Harness& h, std::vector<uint8_t> pkt, Counter counter,
                    const wire::Endpoint* src = nullptr) {
  Capture cap;
  cap.attach(h);
  const uint64_t before = h.b.counters.get(counter), all = total_drops(h.b.counters);
  if (src)
    h.inject(h.b, pkt, *src);
  else
    h.inject(h.b, pkt);
  EXPECT_EQ(h.b.counters.get(counter), before + 1);
  EXPECT_EQ(total_drops(h.b.counters), all + 1);
  EXPECT_EQ(cap.size(), 0u);
  EXPECT_EQ(h.b.qp->attr().qp_state, QpState::kRts);
}

TEST(Hostile, MalformedHeadersAreDroppedAndCounted) {
  Harness h({}, opts());
  const uint32_t qpn = h.b.qp->qpn();
  std::vector<uint8_t> good = craft(rc(wire::kOpWriteOnly), qpn, kFirstPsn, 16);
  PacketView(good.data(), static_cast<uint32_t>(good.size())).set_reth(h.b.addr(0), h.b.mr->key, 16);

  {  // shorter than a BTH
    SCOPED_TRACE("runt");
    expect_dropped(h, std::vector<uint8_t>(good.begin(), good.begin() + 5), Counter::drop_truncated);
    expect_dropped(h, {}, Counter::drop_truncated);
  }
  {  // a BTH but not the RETH its opcode announces
    SCOPED_TRACE("no reth");
    expect_dropped(h, std::vector<uint8_t>(good.begin(), good.begin() + 20), Counter::drop_truncated);
  }
  {  // the pad announced is longer than what follows the headers
    SCOPED_TRACE("pad");
    std::vector<uint8_t> p = craft(rc(wire::kOpWriteOnly), qpn, kFirstPsn, 0);
    p[1] |= 0x30;
    expect_dropped(h, p, Counter::drop_truncated);
  }
  for (uint8_t op :
       {uint8_t{0x15}, uint8_t{0x1F}, uint8_t{0x41}, uint8_t{0x2C}, uint8_t{0xC0}, uint8_t{0xFF}}) {
    SCOPED_TRACE(op);
    std::vector<uint8_t> p = good;
    p[0] = op;
    expect_dropped(h, p, Counter::drop_bad_opcode);
  }
  {
    SCOPED_TRACE("tver");
    std::vector<uint8_t> p = good;
    p[1] |= 0x01;
    expect_dropped(h, p, Counter::drop_bad_header);
  }
  {
    SCOPED_TRACE("pkey");
    std::vector<uint8_t> p = good;
    wire::store_be16(p.data() + 2, 0x8001);
    expect_dropped(h, p, Counter::drop_bad_header);
  }
  {
    SCOPED_TRACE("no qp");
    std::vector<uint8_t> p = good;
    wire::store_be24(p.data() + 5, qpn ^ 0x0F0000);
    expect_dropped(h, p, Counter::drop_no_qp);
  }
  {
    SCOPED_TRACE("UC opcode to an RC QP");
    std::vector<uint8_t> p = good;
    p[0] = wire::opcode(wire::Transport::kUc, wire::kOpWriteOnly);
    expect_dropped(h, p, Counter::drop_bad_opcode);
    p[0] = wire::opcode(wire::Transport::kUd, wire::kOpSendOnly);
    expect_dropped(h, p, Counter::drop_bad_opcode);
  }
  {
    SCOPED_TRACE("not the peer");
    wire::Endpoint other = Harness::endpoint(h.a);
    other.port ^= 1;
    expect_dropped(h, good, Counter::drop_wrong_peer, &other);
    other = Harness::endpoint(h.a);
    other.addr.raw[15] ^= 0x40;
    expect_dropped(h, good, Counter::drop_wrong_peer, &other);
  }
  {
    SCOPED_TRACE("response with nothing outstanding");
    std::vector<uint8_t> p = craft(rc(wire::kOpAcknowledge), qpn, kFirstPsn, 0);
    PacketView(p.data(), static_cast<uint32_t>(p.size())).set_aeth(0x1F, 0);
    expect_dropped(h, p, Counter::drop_stale_response);
  }
  // None of it wrote anything, and the good packet still works afterwards.
  EXPECT_TRUE(std::all_of(h.b.buf.begin(), h.b.buf.end(), [](uint8_t v) { return v == 0; }));
  Capture cap;
  cap.attach(h);
  h.inject(h.b, good);
  ASSERT_EQ(cap.size(), 1u);
  EXPECT_EQ(cap.at(0).opcode(), rc(wire::kOpAcknowledge));
  EXPECT_EQ(cap.at(0).aeth_syndrome(), 0x1F);
  EXPECT_EQ(cap.at(0).psn(), kFirstPsn);
  EXPECT_EQ(h.b.buf[0], 0x5A);
  EXPECT_EQ(h.b.buf[16], 0);
}

TEST(Hostile, PacketsForAQpNotReadyAreDropped) {
  Harness h({}, opts());
  core::QpInitAttr init;
  init.send_cq = h.b.scq;
  init.recv_cq = h.b.rcq;
  init.cap = {4, 4, 1, 1, 0};
  // A connected QP before RTR: dropped for its state (checked before the peer, which it has not yet).
  core::Qp* rc_qp = *h.b.ctx->create_qp(h.b.pd, init);  // RESET
  std::vector<uint8_t> p = craft(rc(wire::kOpSendOnly), rc_qp->qpn(), 0, 8);
  h.inject(h.b, p, Harness::endpoint(h.a));
  EXPECT_EQ(h.b.counters.get(Counter::drop_qp_state), 1u);
  EXPECT_EQ(h.b.counters.get(Counter::drop_wrong_peer), 0u);
  // A UD QP in RESET, then INIT, with a receive posted: dropped for its state.
  init.type = QpType::kUd;
  core::Qp* ud_qp = *h.b.ctx->create_qp(h.b.pd, init);
  p = craft(wire::opcode(wire::Transport::kUd, wire::kOpSendOnly), ud_qp->qpn(), 0, 8);
  PacketView(p.data(), static_cast<uint32_t>(p.size())).set_deth(0x11111111, 77);
  h.inject(h.b, p, Harness::endpoint(h.a));
  EXPECT_EQ(h.b.counters.get(Counter::drop_qp_state), 2u);
  core::QpAttr at;
  at.qp_state = QpState::kInit;
  at.qkey = 0x11111111;
  ASSERT_EQ(ud_qp->modify(at, kQpState | kQpPkeyIndex | kQpPort | kQpQkey), 0);
  Sge sge{h.b.addr(0), 256, h.b.mr->key};
  core::RecvWr rwr{1, std::span(&sge, 1)};
  size_t bad;
  ASSERT_EQ(ud_qp->post_recv(std::span(&rwr, 1), &bad), 0);
  h.inject(h.b, p, Harness::endpoint(h.a));
  EXPECT_EQ(h.b.counters.get(Counter::drop_qp_state), 3u);
  EXPECT_TRUE(h.b.poll(h.b.rcq).empty());
  EXPECT_EQ(h.b.buf[40], 0);
  EXPECT_EQ(h.b.ctx->destroy_qp(rc_qp), 0);
  EXPECT_EQ(h.b.ctx->destroy_qp(ud_qp), 0);
}

// A PSN ahead of the expected one: one NAK PSN sequence error carrying the expected PSN, then silence
// until an in-order packet clears the state (IBTA.md 5, 12 #7).
TEST(Hostile, PsnAheadNaksOnceThenSilence) {
  Harness h({}, opts());
  Capture cap;
  cap.attach(h);
  const uint32_t qpn = h.b.qp->qpn();
  for (uint32_t ahead : {1000u, 5u, 0x7FFFFFu}) {
    std::vector<uint8_t> p = craft(rc(wire::kOpWriteOnly), qpn, wire::psn_add(kFirstPsn, ahead), 8);
    PacketView(p.data(), static_cast<uint32_t>(p.size())).set_reth(h.b.addr(0), h.b.mr->key, 8);
    h.inject(h.b, p);
  }
  ASSERT_EQ(cap.size(), 1u);
  EXPECT_EQ(cap.at(0).opcode(), rc(wire::kOpAcknowledge));
  EXPECT_EQ(cap.at(0).aeth_syndrome(), 0x60);
  EXPECT_EQ(cap.at(0).psn(), kFirstPsn);
  EXPECT_EQ(h.b.counters.get(Counter::tx_nak_psn_seq), 1u);
  EXPECT_EQ(h.b.counters.get(Counter::drop_out_of_seq), 3u);
  EXPECT_EQ(h.b.buf[0], 0);
  // In order: executed and ACKed; the next gap gets its own NAK.
  std::vector<uint8_t> p = craft(rc(wire::kOpWriteOnly), qpn, kFirstPsn, 8);
  PacketView(p.data(), static_cast<uint32_t>(p.size())).set_reth(h.b.addr(0), h.b.mr->key, 8);
  h.inject(h.b, p);
  EXPECT_EQ(h.b.buf[0], 0x5A);
  p = craft(rc(wire::kOpWriteOnly), qpn, wire::psn_add(kFirstPsn, 9), 8);
  PacketView(p.data(), static_cast<uint32_t>(p.size())).set_reth(h.b.addr(0), h.b.mr->key, 8);
  h.inject(h.b, p);
  ASSERT_EQ(cap.size(), 3u);
  EXPECT_EQ(cap.at(1).aeth_syndrome(), 0x1F);
  EXPECT_EQ(cap.at(2).aeth_syndrome(), 0x60);
  EXPECT_EQ(cap.at(2).psn(), wire::psn_add(kFirstPsn, 1));
  EXPECT_EQ(h.b.counters.get(Counter::tx_nak_psn_seq), 2u);
  EXPECT_EQ(h.b.qp->attr().qp_state, QpState::kRts);
}

// An MR in the middle of b's buffer with canary bytes on both sides.
struct Fenced {
  static constexpr uint64_t kOff = 4096, kLen = 4096;
  Node& node;
  core::Mr* mr;
  Fenced(Node& n, uint32_t access) : node(n) {
    std::memset(n.buf.data(), 0xC3, n.buf.size());
    std::memset(n.buf.data() + kOff, 0, kLen);
    mr = *n.ctx->reg_mr(n.pd, n.buf.data() + kOff, kLen, n.addr(kOff), access);
  }
  ~Fenced() { node.ctx->dereg_mr(mr); }
  static bool canaries_intact(const Node& n) {
    for (uint64_t i = 0; i < n.buf.size(); ++i)
      if ((i < kOff || i >= kOff + kLen) && n.buf[i] != 0xC3) return false;
    return true;
  }
};

struct NakCase {
  const char* name;
  uint32_t mr_access;
  uint8_t op;
  int64_t va_off;  // from the MR's start
  uint32_t reth_len;
  uint32_t payload;
  uint8_t syndrome;
  Counter counter;
};

class HostileNak : public ::testing::TestWithParam<NakCase> {};

// A request that violates the MR (or is inconsistent with itself): NAK with the right code, counted, the
// QP in ERR, and not one byte outside the MR touched.
TEST_P(HostileNak, NakedAndNothingOutsideTheMrTouched) {
  const NakCase& c = GetParam();
  Harness h({}, opts());
  Fenced f(h.b, c.mr_access);
  Capture cap;
  cap.attach(h);
  std::vector<uint8_t> p = craft(c.op, h.b.qp->qpn(), kFirstPsn, c.payload);
  PacketView v(p.data(), static_cast<uint32_t>(p.size()));
  const uint64_t va = h.b.addr(Fenced::kOff) + c.va_off;
  if (v.info().has(wire::kHasReth)) v.set_reth(va, f.mr->key, c.reth_len);
  if (v.info().has(wire::kHasAtomicEth)) v.set_atomic_eth(va, f.mr->key, 1, 0);
  h.inject(h.b, p);
  ASSERT_EQ(cap.size(), 1u);
  EXPECT_EQ(cap.at(0).opcode(), rc(wire::kOpAcknowledge));
  EXPECT_EQ(cap.at(0).aeth_syndrome(), c.syndrome);
  EXPECT_EQ(cap.at(0).psn(), kFirstPsn);
  EXPECT_EQ(h.b.counters.get(c.counter), 1u);
  EXPECT_EQ(h.b.qp->attr().qp_state, QpState::kErr);
  EXPECT_TRUE(Fenced::canaries_intact(h.b));
  // In ERR, further packets are dropped.
  h.inject(h.b, p);
  EXPECT_EQ(cap.size(), 1u);
  EXPECT_EQ(h.b.counters.get(Counter::drop_qp_state), 1u);
}

constexpr uint32_t kAll = kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic;

INSTANTIATE_TEST_SUITE_P(Hostile, HostileNak,
                         ::testing::Values(NakCase{"WriteRunsPastEnd", kAll, rc(wire::kOpWriteOnly),
                                                   4096 - 10, 100, 100, 0x62, Counter::tx_nak_rem_access},
                                           NakCase{"WriteStartsBefore", kAll, rc(wire::kOpWriteOnly), -8, 100,
                                                   100, 0x62, Counter::tx_nak_rem_access},
                                           NakCase{"WriteHugeLength", kAll, rc(wire::kOpWriteFirst), 0,
                                                   0xFFFFFFFF, 1024, 0x62, Counter::tx_nak_rem_access},
                                           NakCase{"WriteToReadOnlyMr", kRemoteRead, rc(wire::kOpWriteOnly),
                                                   0, 64, 64, 0x62, Counter::tx_nak_rem_access},
                                           NakCase{"WritePayloadLongerThanReth", kAll, rc(wire::kOpWriteOnly),
                                                   4096 - 16, 16, 200, 0x61, Counter::tx_nak_inv_req},
                                           NakCase{"ReadPastEnd", kAll, rc(wire::kOpReadRequest), 4000, 200,
                                                   0, 0x62, Counter::tx_nak_rem_access},
                                           NakCase{"AtomicPastEnd", kAll, rc(wire::kOpFetchAdd), 4096, 0, 0,
                                                   0x62, Counter::tx_nak_rem_access},
                                           NakCase{"AtomicOnReadOnlyMr", kRemoteRead, rc(wire::kOpFetchAdd),
                                                   0, 0, 0, 0x62, Counter::tx_nak_rem_access},
                                           NakCase{"AtomicMisaligned", kAll, rc(wire::kOpCompareSwap), 4, 0,
                                                   0, 0x61, Counter::tx_nak_inv_req},
                                           NakCase{"MiddleWithoutFirst", kAll, rc(wire::kOpWriteMiddle), 0, 0,
                                                   1024, 0x61, Counter::tx_nak_inv_req},
                                           NakCase{"SendLastWithoutFirst", kAll, rc(wire::kOpSendLast), 0, 0,
                                                   8, 0x61, Counter::tx_nak_inv_req},
                                           NakCase{"FirstShorterThanMtu", kAll, rc(wire::kOpWriteFirst), 0,
                                                   2000, 100, 0x61, Counter::tx_nak_inv_req},
                                           NakCase{"OnlyLongerThanMtu", kAll, rc(wire::kOpWriteOnly), 0, 2000,
                                                   2000, 0x61, Counter::tx_nak_inv_req}),
                         [](const auto& info) { return std::string(info.param.name); });

// A WRITE whose RETH promises more than its packets deliver: the LAST ends early -> NAK invalid request,
// and the bytes written stay inside the MR.
TEST(Hostile, WriteEndingEarly) {
  Harness h({}, opts());
  Fenced f(h.b, kAll);
  Capture cap;
  cap.attach(h);
  const uint32_t qpn = h.b.qp->qpn();
  std::vector<uint8_t> first = craft(rc(wire::kOpWriteFirst), qpn, kFirstPsn, 1024, false);
  PacketView(first.data(), static_cast<uint32_t>(first.size()))
      .set_reth(h.b.addr(Fenced::kOff + 1024), f.mr->key, 3000);
  h.inject(h.b, first);
  std::vector<uint8_t> last = craft(rc(wire::kOpWriteLast), qpn, wire::psn_add(kFirstPsn, 1), 100);
  h.inject(h.b, last);
  ASSERT_EQ(cap.size(), 1u);
  EXPECT_EQ(cap.at(0).aeth_syndrome(), 0x61);
  EXPECT_EQ(h.b.qp->attr().qp_state, QpState::kErr);
  EXPECT_TRUE(Fenced::canaries_intact(h.b));
}

// An MR is reachable only through QPs of its own PD: its valid rkey from a QP of another PD is a remote
// access error, and nothing is written.
TEST(Hostile, MrOfAnotherPdIsNotReachable) {
  Harness h({}, opts());
  core::Pd* other = *h.b.ctx->alloc_pd();
  std::memset(h.b.buf.data(), 0xC3, h.b.buf.size());
  core::Mr* mr = *h.b.ctx->reg_mr(other, h.b.buf.data(), 4096, h.b.addr(), kAll);
  Capture cap;
  cap.attach(h);
  std::vector<uint8_t> p = craft(rc(wire::kOpWriteOnly), h.b.qp->qpn(), kFirstPsn, 64);
  PacketView(p.data(), static_cast<uint32_t>(p.size())).set_reth(h.b.addr(), mr->key, 64);
  h.inject(h.b, p);
  ASSERT_EQ(cap.size(), 1u);
  EXPECT_EQ(cap.at(0).aeth_syndrome(), 0x62);
  for (uint64_t i = 0; i < h.b.buf.size(); ++i) ASSERT_EQ(h.b.buf[i], 0xC3) << i;
  EXPECT_EQ(h.b.ctx->dereg_mr(mr), 0);
  EXPECT_EQ(h.b.ctx->dealloc_pd(other), 0);
}

// MR keys look random: distinct, no fixed step between one and the next, every bit set in about half of
// them, and another context (another process) draws a different sequence (rxe's are small indexes).
TEST(Hostile, MrKeysAreNotPredictable) {
  Harness h({}, opts());
  std::vector<core::Mr*> mrs;
  std::vector<uint32_t> keys;
  for (int i = 0; i < 1000; ++i) {
    mrs.push_back(*h.b.ctx->reg_mr(h.b.pd, h.b.buf.data(), 64, h.b.addr(), kAll));
    keys.push_back(mrs.back()->key);
  }
  std::vector<uint32_t> sorted = keys;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "a key repeats";
  int same_step = 0;
  for (size_t i = 2; i < keys.size(); ++i) same_step += keys[i] - keys[i - 1] == keys[i - 1] - keys[i - 2];
  EXPECT_LT(same_step, 3);
  for (int bit = 0; bit < 32; ++bit) {
    const auto ones = std::count_if(keys.begin(), keys.end(), [bit](uint32_t k) { return (k >> bit) & 1; });
    EXPECT_GT(ones, 350) << "bit " << bit;
    EXPECT_LT(ones, 650) << "bit " << bit;
  }
  EXPECT_NE(keys[0], h.a.mr->key);
  Harness other({}, opts());
  EXPECT_NE(other.b.mr->key, h.b.mr->key) << "two contexts drew the same first key";
  for (core::Mr* mr : mrs) EXPECT_EQ(h.b.ctx->dereg_mr(mr), 0);
}

// rkeys are not guessable: an attacker on the connected peer's address trying 20000 random rkeys (WRITE
// and READ) gets a remote access NAK for every one (the QP is set up again after each, as it goes to the
// error state) and never touches the MR. (A hit would need the one 32-bit key among 20000 draws: p < 1e-5.)
TEST(Hostile, RandomRkeysGetOnlyNaks) {
  Harness h({}, opts());
  Fenced f(h.b, kAll);
  std::mt19937 rng(4242);
  uint64_t naks = 0;
  for (int i = 0; i < 20000; ++i) {
    Capture cap;
    cap.attach(h);
    const bool read = i & 1;
    std::vector<uint8_t> p =
        craft(rc(read ? wire::kOpReadRequest : wire::kOpWriteOnly), h.b.qp->qpn(), kFirstPsn, read ? 0 : 64);
    const uint32_t rkey = rng();
    ASSERT_NE(rkey, f.mr->key) << "drew the real key: run again";
    PacketView(p.data(), static_cast<uint32_t>(p.size())).set_reth(h.b.addr(Fenced::kOff), rkey, 64);
    h.inject(h.b, p);
    ASSERT_EQ(cap.size(), 1u) << "attempt " << i;
    ASSERT_EQ(cap.at(0).opcode(), rc(wire::kOpAcknowledge));
    ASSERT_EQ(cap.at(0).aeth_syndrome(), 0x62) << "attempt " << i;
    ++naks;
    core::QpAttr reset;
    reset.qp_state = QpState::kReset;
    ASSERT_EQ(h.b.qp->modify(reset, kQpState), 0);
    h.connect(h.b, h.a);
  }
  EXPECT_EQ(naks, 20000u);
  EXPECT_EQ(h.b.counters.get(Counter::tx_nak_rem_access), 20000u);
  EXPECT_TRUE(Fenced::canaries_intact(h.b));
  for (uint64_t i = Fenced::kOff; i < Fenced::kOff + Fenced::kLen; ++i) ASSERT_EQ(h.b.buf[i], 0) << i;
}

// Random packets (valid opcodes, random headers and lengths, from the peer) against an MR fenced with
// canaries: nothing crashes, nothing outside the MR changes.
TEST(Hostile, RandomPacketsNeverEscapeTheMr) {
  std::mt19937_64 rng(12345);
  const uint8_t ops[] = {0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B,
                         0x0C, 0x0D, 0x0E, 0x0F, 0x10, 0x11, 0x12, 0x13, 0x14, 0x16, 0x17};
  for (int round = 0; round < 40; ++round) {
    Harness h({}, opts());
    Fenced f(h.b, kAll);
    ASSERT_EQ(h.post_recv(h.b, 1, Fenced::kOff, 512), 0);
    for (int i = 0; i < 200; ++i) {
      const uint8_t op = ops[rng() % std::size(ops)];
      const uint32_t payload = rng() % 3 == 0 ? 1024 : static_cast<uint32_t>(rng() % 1100);
      std::vector<uint8_t> p = craft(
          op, h.b.qp->qpn(), wire::psn_add(kFirstPsn, static_cast<uint32_t>(rng() % 4)), payload, rng() & 1);
      const uint32_t hdr = wire::info(op).hdr_len;
      for (uint32_t k = wire::kBthLen; k < hdr; ++k) p[k] = static_cast<uint8_t>(rng());
      PacketView v(p.data(), static_cast<uint32_t>(p.size()));
      if (rng() % 2) {  // a plausible RETH / AtomicETH on the fenced MR
        const uint64_t va = h.b.addr(Fenced::kOff) + rng() % 5000 - 500;
        if (v.info().has(wire::kHasReth)) v.set_reth(va, f.mr->key, static_cast<uint32_t>(rng() % 5000));
        if (v.info().has(wire::kHasAtomicEth)) v.set_atomic_eth(va, f.mr->key, rng(), rng());
      }
      if (rng() % 8 == 0) p.resize(rng() % p.size());
      h.inject(h.b, p);
      if (rng() % 16 == 0) h.run([] { return false; }, 1);
      if (h.b.qp->attr().qp_state == QpState::kErr) break;
    }
    ASSERT_TRUE(Fenced::canaries_intact(h.b)) << "round " << round;
  }
}

}  // namespace
}  // namespace softrdma::test
