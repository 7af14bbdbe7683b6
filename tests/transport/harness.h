// Two soft NICs joined by the in-memory network, driven by hand with a fake clock: the transport runs
// exactly as in production, with no threads and no sockets.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "core/context.h"
#include "io/sim/sim_net.h"
#include "wire/opcode.h"

namespace softrdma::test {

using core::Nanos;

inline Nanos g_now = 1'000'000'000;

// The RC opcode of `op` (frames in a drop_if filter start with it).
constexpr uint8_t rc(wire::Op op) { return wire::opcode(wire::Transport::kRc, op); }
inline Nanos fake_clock() { return g_now; }

struct Node {
  std::unique_ptr<io::SimBackend> be;
  Counters counters;
  std::unique_ptr<core::Context> ctx;
  core::Pd* pd = nullptr;
  core::Cq* scq = nullptr;
  core::Cq* rcq = nullptr;
  core::Qp* qp = nullptr;
  std::vector<uint8_t> buf;
  core::Mr* mr = nullptr;
  std::unique_ptr<core::CompChannel> channel;
  io::TxBatch tx;

  uint64_t addr(uint64_t off = 0) const { return reinterpret_cast<uint64_t>(buf.data()) + off; }
  std::vector<Wc> poll(core::Cq* cq) {
    std::vector<Wc> out;
    Wc wc[16];
    for (int n; (n = cq->poll(wc)) > 0;) out.insert(out.end(), wc, wc + n);
    return out;
  }
};

struct QpOptions {
  QpType type = QpType::kRc;
  Mtu mtu = Mtu::k1024;
  uint8_t timeout = 14;
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  uint8_t min_rnr_timer = 1;
  uint32_t access = kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic;
  uint32_t mr_access = kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic;
  size_t buf_size = 4 << 20;
  uint32_t max_wr = 256;
  uint32_t window_bytes = core::ContextConfig{}.window_bytes;
  uint32_t inflight_budget = core::ContextConfig{}.inflight_budget;
  uint32_t active_mtu = 4096;  // the contexts' interface MTU (path MTUs above it are clamped)
  bool standard_port = false;  // RoCEv2 standard mode: every QP behind UDP port 4791
  bool recv_channel = false;   // the receive CQs report to a completion channel (an event-driven user)
};

// INIT -> RTR -> RTS towards QP `dest_qpn` at `dgid`, as `o` says (RC or UC).
inline void connect_qp(core::Qp& qp, const wire::Gid& dgid, uint32_t dest_qpn, const QpOptions& o) {
  core::QpAttr at;
  at.qp_state = QpState::kInit;
  at.qp_access_flags = o.access;
  ASSERT_EQ(qp.modify(at, kQpState | kQpPkeyIndex | kQpPort | kQpAccessFlags), 0);
  at.qp_state = QpState::kRtr;
  at.path_mtu = o.mtu;
  at.dest_qp_num = dest_qpn;
  at.rq_psn = 0xFFFFF0;  // near the wrap, so PSN arithmetic is exercised
  at.max_dest_rd_atomic = 16;
  at.min_rnr_timer = o.min_rnr_timer;
  at.ah_attr.dgid = dgid;
  // MAX_DEST_RD_ATOMIC and MIN_RNR_TIMER exist for RC only (IBTA.md 9).
  ASSERT_EQ(qp.modify(at, kQpState | kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn |
                              (o.type == QpType::kRc ? kQpMaxDestRdAtomic | kQpMinRnrTimer : 0u)),
            0);
  at.qp_state = QpState::kRts;
  at.sq_psn = 0xFFFFF0;
  at.timeout = o.timeout;
  at.retry_cnt = o.retry_cnt;
  at.rnr_retry = o.rnr_retry;
  at.max_rd_atomic = 16;
  ASSERT_EQ(
      qp.modify(at,
                kQpState | kQpSqPsn |
                    (o.type == QpType::kRc ? kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpMaxQpRdAtomic : 0u)),
      0);
}

class Harness {
 public:
  explicit Harness(io::Faults f = {}, QpOptions o = {}) : net_(f), o_(o) {
    init(a, "10.0.0.1");
    init(b, "10.0.0.2");
    if (o.type == QpType::kUd) {
      to_rts_ud(a);
      to_rts_ud(b);
    } else {
      connect(a, b);
      connect(b, a);
    }
  }

  // The context owns its QPs and MRs, not the CQs and PDs handed out to its user: give them back.
  ~Harness() {
    for (Node* n : {&a, &b}) {
      if (!n->ctx) continue;
      if (n->qp) n->ctx->destroy_qp(n->qp);
      if (n->mr) n->ctx->dereg_mr(n->mr);
      if (n->scq) n->ctx->destroy_cq(n->scq);
      if (n->rcq) n->ctx->destroy_cq(n->rcq);
      if (n->pd) n->ctx->dealloc_pd(n->pd);  // EBUSY (a small leak) if a test left an MR or AH on it
    }
  }
  Harness(const Harness&) = delete;
  Harness& operator=(const Harness&) = delete;

  void init(Node& n, const char* ip) {
    n.be = net_.attach(ip);
    core::ContextConfig cfg;
    cfg.clock = fake_clock;
    cfg.window_bytes = o_.window_bytes;
    cfg.inflight_budget = o_.inflight_budget;
    cfg.standard_port = o_.standard_port;
    cfg.active_mtu = o_.active_mtu;
    n.ctx = std::make_unique<core::Context>(n.be.get(), &n.counters, cfg);
    n.tx.sink = n.be.get();
    n.pd = *n.ctx->alloc_pd();
    n.scq = *n.ctx->create_cq(4096, nullptr, nullptr);
    if (o_.recv_channel) n.channel = std::move(*core::CompChannel::create());
    n.rcq = *n.ctx->create_cq(4096, n.channel.get(), nullptr);
    core::QpInitAttr init;
    init.type = o_.type;
    init.send_cq = n.scq;
    init.recv_cq = n.rcq;
    init.cap = {o_.max_wr, o_.max_wr, 4, 4, 64};
    n.qp = *n.ctx->create_qp(n.pd, init);
    n.buf.assign(o_.buf_size, 0);
    n.mr = *n.ctx->reg_mr(n.pd, n.buf.data(), n.buf.size(), n.addr(), o_.mr_access);
  }

  void connect(Node& n, Node& peer) { connect_qp(*n.qp, peer.ctx->local_addr(), peer.qp->qpn(), o_); }

  void to_rts_ud(Node& n) {
    core::QpAttr at;
    at.qp_state = QpState::kInit;
    at.qkey = 0x11111111;
    ASSERT_EQ(n.qp->modify(at, kQpState | kQpPkeyIndex | kQpPort | kQpQkey), 0);
    at.qp_state = QpState::kRtr;
    ASSERT_EQ(n.qp->modify(at, kQpState), 0);
    at.qp_state = QpState::kRts;
    ASSERT_EQ(n.qp->modify(at, kQpState | kQpSqPsn), 0);
  }

  // Runs the network until `done` holds or `max_ms` of fake time pass. Time jumps to the next timer
  // when the network is idle.
  bool run(const std::function<bool()>& done, uint64_t max_ms = 600'000) {
    const Nanos end = g_now + max_ms * 1'000'000;
    while (g_now < end) {
      if (done()) return true;
      net_.deliver();
      bool busy = false;
      for (Node* n : {&a, &b}) {
        io::RxPacket pkts[32];
        uint32_t k;
        while ((k = n->be->rx_burst(pkts, 32)) > 0) {
          busy = true;
          n->ctx->rx_burst(std::span(pkts, k), n->tx, g_now);
          net_.deliver();
        }
      }
      Nanos next = 0;
      for (Node* n : {&a, &b}) {
        Nanos d = n->ctx->tick(n->tx, g_now);
        if (d && (!next || d < next)) next = d;
      }
      if (net_.in_flight()) continue;
      if (!busy)
        g_now = next && next > g_now ? next : g_now + 1'000'000;
      else
        g_now += 1000;
    }
    return done();
  }

  int post_send(Node& n, core::SendWr wr) {
    size_t bad;
    return n.qp->post_send(std::span(&wr, 1), &bad);
  }
  int post_recv(Node& n, uint64_t wr_id, uint64_t off, uint32_t len) {
    Sge s{n.addr(off), len, n.mr->key};
    core::RecvWr wr{wr_id, std::span(&s, 1)};
    size_t bad;
    return n.qp->post_recv(std::span(&wr, 1), &bad);
  }

  // Runs until `count` completions arrived on `cq` (appended to *out); false on timeout.
  bool wait(Node& n, core::Cq* cq, size_t count, std::vector<Wc>* out, uint64_t max_ms = 600'000) {
    const size_t want = out->size() + count;
    return run(
        [&] {
          for (const Wc& w : n.poll(cq)) out->push_back(w);
          return out->size() >= want;
        },
        max_ms);
  }

  // The UDP endpoint of node n's QP (where its peer's packets come from and go to).
  static wire::Endpoint endpoint(const Node& n) { return {n.ctx->local_addr(), n.qp->port()}; }

  // Hands one crafted packet (BTH .. pad, no ICRC) to node `to` as if it came from `src`; what `to`
  // answers goes onto the network.
  void inject(Node& to, std::vector<uint8_t>& bytes, const wire::Endpoint& src) {
    io::RxPacket rx{src, endpoint(to), bytes.data(), static_cast<uint32_t>(bytes.size()), 0, 64};
    to.ctx->rx_burst(std::span(&rx, 1), to.tx, g_now);
  }
  void inject(Node& to, std::vector<uint8_t>& bytes) { inject(to, bytes, endpoint(&to == &a ? b : a)); }

  io::SimNet net_;
  QpOptions o_;
  Node a, b;
};

// A WR over one SGE of node n's buffer.
struct Wr {
  core::SendWr wr;
  Sge sge;
  Wr(Node& n, WrOpcode op, uint64_t off, uint32_t len, uint64_t wr_id = 1) {
    sge = {n.addr(off), len, n.mr->key};
    wr.wr_id = wr_id;
    wr.opcode = op;
    wr.send_flags = kSendSignaled;
    wr.sg_list = std::span(&sge, 1);
  }
  Wr& remote(const Node& peer, uint64_t off) {
    wr.remote_addr = peer.addr(off);
    wr.rkey = peer.mr->key;
    return *this;
  }
  operator core::SendWr() const {
    core::SendWr w = wr;
    w.sg_list = std::span(&sge, 1);
    return w;
  }
};

inline void fill(std::vector<uint8_t>& v, uint64_t off, uint32_t len, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (uint32_t i = 0; i < len; ++i) {
    x = x * 1664525u + 1013904223u;
    v[off + i] = static_cast<uint8_t>(x >> 24);
  }
}

}  // namespace softrdma::test
