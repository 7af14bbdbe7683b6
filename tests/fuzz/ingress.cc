#include "fuzz/ingress.h"

#include <arpa/inet.h>

#include <array>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "core/context.h"
#include "io/sim/sim_net.h"
#include "util/pcap.h"
#include "wire/headers.h"
#include "wire/icrc.h"
#include "wire/opcode.h"

namespace softrdma::fuzz {
namespace {

using core::Nanos;

Nanos g_now;
Nanos fake_clock() { return g_now; }

constexpr uint32_t kQkey = 0x11111111;
constexpr uint32_t kPsn = 0xFFFFF0;  // near the wrap
constexpr uint64_t kIova = 0x10000000;
// Each node's buffer: what it sends, receive slots, the region its peer writes and reads, atomics'
// target, where READ responses land.
constexpr size_t kBufSize = 256 << 10;
constexpr uint64_t kSrcOff = 0, kRecvOff = 4 << 10, kRecvSlot = 4160, kRemoteOff = 160 << 10,
                   kRemoteLen = 32 << 10, kAtomicOff = 200 << 10, kReadDstOff = 208 << 10;
constexpr int kRecvs[kQps] = {12, 6, 4, 4 /* the SRQ */, 2, 2, 2};  // 32 slots: up to 137 KiB
constexpr uint32_t kMaxGsoSegments = 64;  // io/udp's UdpIo::kMaxGsoSegments: IP IDs the ICRC check accepts

struct Node {
  std::unique_ptr<io::SimBackend> be;
  wire::Endpoint ep;               // address and the UDP port of its QPs
  std::array<uint32_t, kQps> qpn{};
  uint32_t rkey = 0;
  Counters counters;
  std::unique_ptr<core::Context> ctx;
  core::Pd* pd = nullptr;
  core::Cq* cq = nullptr;
  core::Srq* srq = nullptr;
  core::Ah* ah = nullptr;
  core::Mr* mr = nullptr;     // the whole buffer, every access
  core::Mr* mr_ro = nullptr;  // the remote region again, remote read only
  std::array<core::Qp*, kQps> qp{};
  std::unique_ptr<uint8_t[]> buf;
  io::TxBatch tx;
  uint32_t next_slot = 0;
  size_t completions = 0;  // successful ones

  // Registered at a fixed I/O address (not the heap's), so that addresses in packets repeat from run to run.
  uint64_t iova(uint64_t off) const { return kIova + off; }
};

// Node b, the one under test, and its peer a; QP i of one is connected to QP i of the other. Each has
// requests in flight to the other, so that ACKs, NAKs and READ and atomic responses meet a requester
// waiting for them. To make the seeds, both are soft NICs that talk (`record` sees every frame to b).
// Under the fuzzer, a is only an address and QP numbers (b's setup, and so its state, are the same): the
// input is b's only traffic, and what b sends is dropped.
class World {
 public:
  using Recorder = void (*)(void* arg, std::span<const uint8_t> frame);
  explicit World(Recorder record = nullptr, void* arg = nullptr) {
    g_now = 1'000'000'000;
    record_ = record;
    record_arg_ = arg;
    // Every frame leaves the network here; the seed session carries them itself (run_session).
    net_.drop_if = [this](uint64_t, std::span<const uint8_t> f) {
      if (record_ && f.size() >= wire::kBthLen)
        wire_.push_back({(uint32_t{f[5]} << 8 | f[6]) == b.ep.port, {f.begin(), f.end()}});
      return true;
    };
    if (record) {
      init(a, "10.0.0.1", 0x5eed0001);
    } else {
      a.be = net_.attach("10.0.0.1");
      a.ep = {a.be->local_addr(), *a.be->open_port(0)};
      for (uint32_t i = 0; i < kQps; ++i) a.qpn[i] = uint32_t{a.ep.port} << 8 | i;  // as Context::alloc_qpn
    }
    init(b, "10.0.0.2", 0x5eed0002);
    for (Node* n : {&a, &b})
      if (n->ctx) connect(*n, n == &a ? b : a);
    for (Node* n : {&a, &b})
      if (n->ctx) post_sends(*n, n == &a ? b : a);
  }
  ~World() {
    for (Node* n : {&a, &b}) {
      if (!n->ctx) continue;
      for (core::Qp* q : n->qp)
        if (q) n->ctx->destroy_qp(q);
      if (n->srq) n->ctx->destroy_srq(n->srq);
      if (n->ah) n->ctx->destroy_ah(n->ah);
      if (n->mr_ro) n->ctx->dereg_mr(n->mr_ro);
      if (n->mr) n->ctx->dereg_mr(n->mr);
      if (n->cq) n->ctx->destroy_cq(n->cq);
      if (n->pd) n->ctx->dealloc_pd(n->pd);
      n->ctx.reset();
    }
  }
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  // Hands a burst of packets (UDP payloads, BTH .. ICRC) to a node as io/udp's recv_socket does: too short
  // or a bad ICRC is dropped, the rest goes to Context::rx_burst. Returns how many went there.
  size_t receive(Node& n, std::span<io::RxPacket> pkts) {
    size_t k = 0;
    for (io::RxPacket& p : pkts) {
      if (p.len < wire::kBthLen + wire::kIcrcLen) continue;
      const uint32_t body = p.len - wire::kIcrcLen;
      if (wire::icrc_check_any_id(p.src, p.dst, std::span<uint8_t>(p.data, body),
                                  wire::load_icrc(p.data + body), 0, kMaxGsoSegments - 1) < 0)
        continue;
      p.len = body;
      pkts[k++] = p;
    }
    if (k) n.ctx->rx_burst(pkts.first(k), n.tx, g_now);
    drain(n);
    return k;
  }

  void tick(Nanos advance) {
    g_now += advance;
    for (Node* n : {&a, &b}) {
      if (!n->ctx) continue;
      n->ctx->tick(n->tx, g_now);
      drain(*n);
    }
  }

  // The seed session: hands every frame to its node through receive(), as the fuzzer's input goes, and
  // runs the timers when nothing moves, until nothing has moved for a while.
  void run_session() {
    for (int idle = 0, i = 0; idle < 50 && i < 100000; ++i) {
      if (wire_.empty()) {
        ++idle;
        tick(1'000'000);
        continue;
      }
      idle = 0;
      Frame f = std::move(wire_.front());
      wire_.pop_front();
      if (f.to_b) record_(record_arg_, f.bytes);
      Node& to = f.to_b ? b : a;
      io::RxPacket p{(f.to_b ? a : b).ep, to.ep, f.bytes.data(), static_cast<uint32_t>(f.bytes.size()), 0, 64};
      receive(to, std::span(&p, 1));
    }
  }

  io::SimNet net_;  // before the nodes, whose backends it outlives
  Node a, b;

 private:
  void init(Node& n, const char* ip, uint64_t key_seed) {
    n.be = net_.attach(ip);
    core::ContextConfig cfg;
    cfg.clock = fake_clock;
    cfg.mr_key_seed = key_seed;
    n.ctx = std::make_unique<core::Context>(n.be.get(), &n.counters, cfg);
    n.tx.sink = n.be.get();
    n.pd = *n.ctx->alloc_pd();
    n.cq = *n.ctx->create_cq(1024, nullptr, nullptr);
    n.srq = *n.ctx->create_srq(n.pd, 64, 4, 0);
    n.buf.reset(new uint8_t[kBufSize]);
    std::memset(n.buf.get(), 0x5A, kBufSize);  // (memset: a loop here would be most of an input's time)
    n.mr = *n.ctx->reg_mr(n.pd, n.buf.get(), kBufSize, n.iova(0),
                          kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic);
    n.mr_ro = *n.ctx->reg_mr(n.pd, n.buf.get() + kRemoteOff, kRemoteLen, n.iova(kRemoteOff), kRemoteRead);
    for (uint32_t i = 0; i < kQps; ++i) {
      core::QpInitAttr init;
      init.type = i == kUc ? QpType::kUc : i == kUd ? QpType::kUd : QpType::kRc;
      init.send_cq = init.recv_cq = n.cq;
      init.srq = i == kRcSrq ? n.srq : nullptr;
      init.cap = {64, 64, 4, 4, 64};
      n.qp[i] = *n.ctx->create_qp(n.pd, init);
      n.qpn[i] = n.qp[i]->qpn();
    }
    n.ep = {n.ctx->local_addr(), n.qp[0]->port()};
    n.rkey = n.mr->key;
  }

  void post_recv(Node& n, core::Qp* qp, int count) {
    for (int i = 0; i < count; ++i) {
      Sge s{n.iova(kRecvOff + kRecvSlot * n.next_slot++), static_cast<uint32_t>(kRecvSlot), n.mr->key};
      if (qp) {
        core::RecvWr wr{100u + n.next_slot, std::span(&s, 1)};
        size_t bad;
        check(qp->post_recv(std::span(&wr, 1), &bad), "post_recv", i);
      } else {
        core::RecvWqe w;
        w.wr_id = 100u + n.next_slot;
        w.num_sge = 1;
        w.length = s.length;
        w.sge[0] = s;
        check(n.srq->post(w), "post_srq_recv", i);
      }
    }
  }

  void connect(Node& n, Node& peer) {
    for (uint32_t i = 0; i < kQps; ++i) {
      core::Qp* qp = n.qp[i];
      const bool rc = qp->type() == QpType::kRc;
      core::QpAttr at;
      at.qp_state = QpState::kInit;
      at.qp_access_flags = kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic;
      at.qkey = kQkey;
      check(qp->modify(at, kQpState | kQpPkeyIndex | kQpPort | (i == kUd ? kQpQkey : kQpAccessFlags)), "INIT", i);
      if (i != kRcSrq) post_recv(n, qp, kRecvs[i]);
      if (i == kRcInit) continue;
      at.qp_state = QpState::kRtr;
      at.path_mtu = Mtu::k1024;
      at.dest_qp_num = peer.qpn[i];
      at.rq_psn = kPsn;
      at.max_dest_rd_atomic = 16;
      at.min_rnr_timer = 1;
      at.ah_attr.dgid = peer.ep.addr;
      check(qp->modify(at, i == kUd ? kQpState
                                    : kQpState | kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn |
                                          (rc ? kQpMaxDestRdAtomic | kQpMinRnrTimer : 0u)),
            "RTR", i);
      if (i == kRcRtr) continue;
      at.qp_state = QpState::kRts;
      at.sq_psn = kPsn;
      at.timeout = 14;
      at.retry_cnt = 7;
      at.rnr_retry = 7;
      at.max_rd_atomic = 16;
      check(qp->modify(at, kQpState | kQpSqPsn | (rc ? kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpMaxQpRdAtomic : 0u)),
            "RTS", i);
      if (i == kRcErr) {
        at.qp_state = QpState::kErr;
        check(qp->modify(at, kQpState), "ERR", i);
      }
    }
    post_recv(n, nullptr, kRecvs[kRcSrq]);
    core::AhAttr ah;
    ah.dgid = peer.ep.addr;
    n.ah = *n.ctx->create_ah(n.pd, ah);
  }

  void post(Node& n, Node& peer, QpIndex q, WrOpcode op, uint32_t len, uint32_t flags = 0) {
    static uint64_t wr_id = 0;
    const bool to_local = op == WrOpcode::kRdmaRead || op == WrOpcode::kAtomicFetchAndAdd ||
                          op == WrOpcode::kAtomicCmpAndSwp;
    // Inline data is read from a host pointer (no key), the rest through the MR.
    Sge s{(flags & kSendInline) ? reinterpret_cast<uint64_t>(n.buf.get()) : n.iova(to_local ? kReadDstOff : kSrcOff),
          len, n.mr->key};
    core::SendWr wr;
    wr.wr_id = ++wr_id;
    wr.opcode = op;
    wr.send_flags = kSendSignaled | flags;
    wr.imm_data = 0x01020304;
    wr.sg_list = std::span(&s, 1);
    const bool atomic = op == WrOpcode::kAtomicFetchAndAdd || op == WrOpcode::kAtomicCmpAndSwp;
    wr.remote_addr = peer.iova(atomic ? kAtomicOff : kRemoteOff);
    wr.rkey = peer.rkey;
    wr.compare_add = 5;
    wr.swap = 9;
    wr.invalidate_rkey = 0x1234;  // no such MR: the responder must refuse the invalidation
    wr.ah = n.ah;
    wr.remote_qpn = peer.qpn[kUd];
    wr.remote_qkey = kQkey;
    size_t bad;
    check(n.qp[q]->post_send(std::span(&wr, 1), &bad), "post_send", q);
  }

  void post_sends(Node& n, Node& peer) {
    using enum WrOpcode;
    post(n, peer, kRc, kSend, 100);
    post(n, peer, kRc, kSend, 3000);  // first, middle, last
    post(n, peer, kRc, kSendWithImm, 64);
    post(n, peer, kRc, kSend, 16, kSendInline);
    post(n, peer, kRc, kRdmaWrite, 2500);
    post(n, peer, kRc, kRdmaWrite, 100);
    post(n, peer, kRc, kRdmaWriteWithImm, 1500);
    post(n, peer, kRc, kRdmaWriteWithImm, 0);
    post(n, peer, kRc, kRdmaRead, 3000);
    post(n, peer, kRc, kAtomicFetchAndAdd, 8);
    post(n, peer, kRc, kAtomicCmpAndSwp, 8);
    post(n, peer, kRc, kSendWithInv, 40);  // last: what the responder makes of them may end the QP
    post(n, peer, kRc, kSendWithInv, 2100);
    post(n, peer, kUc, kSend, 2000);
    post(n, peer, kUc, kSend, 30);
    post(n, peer, kUc, kRdmaWriteWithImm, 20);
    post(n, peer, kUc, kSendWithImm, 10);
    post(n, peer, kUc, kRdmaWrite, 1500);
    post(n, peer, kUc, kRdmaWrite, 64);
    post(n, peer, kUc, kRdmaWriteWithImm, 2100);
    post(n, peer, kUd, kSend, 200);
    post(n, peer, kUd, kSendWithImm, 50);
    post(n, peer, kRcSrq, kSend, 500);
    post(n, peer, kRcSrq, kSendWithImm, 1200);
  }

  struct Frame {
    bool to_b;
    std::vector<uint8_t> bytes;  // BTH .. ICRC
  };
  Recorder record_ = nullptr;
  void* record_arg_ = nullptr;
  std::deque<Frame> wire_;

  // The setup must work, or the fuzzer would explore less than it seems: say so loudly.
  static void check(int rc, const char* what, uint32_t qp) {
    if (rc != 0) {
      std::fprintf(stderr, "ingress fuzz setup: %s on QP %u failed: %d\n", what, qp, rc);
      std::abort();
    }
  }

  static void drain(Node& n) {
    Wc wc[16];
    for (int k; (k = n.cq->poll(wc)) > 0;)
      for (int i = 0; i < k; ++i) n.completions += wc[i].status == WcStatus::kSuccess;
  }
};

void append_record(std::vector<uint8_t>& out, uint8_t flags, uint8_t arg, std::span<const uint8_t> pkt) {
  out.push_back(flags);
  out.push_back(arg);
  out.push_back(static_cast<uint8_t>(pkt.size() >> 8));
  out.push_back(static_cast<uint8_t>(pkt.size()));
  out.insert(out.end(), pkt.begin(), pkt.end());
}

bool write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  return std::fclose(f) == 0 && ok;
}

std::string file_name(const std::string& dir, const char* kind, int i, uint8_t opcode) {
  std::string op = wire::opcode_name(opcode);
  for (char& c : op)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  char num[16];
  std::snprintf(num, sizeof num, "%04d", i);
  return dir + "/" + kind + "-" + num + "-" + op;
}

// Packets Context::rx_burst dropped before any QP saw them.
uint64_t dispatch_drops(const Node& n) {
  uint64_t d = 0;
  for (Counter c : {Counter::drop_truncated, Counter::drop_bad_opcode, Counter::drop_bad_header, Counter::drop_no_qp,
                    Counter::drop_qp_state, Counter::drop_wrong_peer})
    d += n.counters.get(c);
  return d;
}

}  // namespace

IngressStats run_ingress(const uint8_t* data, size_t size) {
  World w;
  Node& node = w.b;
  IngressStats st;
  const uint64_t drops0 = dispatch_drops(node);
  // The packets of the burst being gathered, each in a buffer of its exact size (so that a read past
  // the end of a packet is a read past the end of an allocation, which ASan reports).
  std::vector<std::unique_ptr<uint8_t[]>> held;
  io::RxPacket burst[io::kRxBurst];
  uint32_t n = 0;
  Nanos advance = 0;
  auto flush = [&] {
    if (n) st.checked += w.receive(node, std::span(burst, n));
    n = 0;
    held.clear();
    if (advance) w.tick(advance);
    advance = 0;
  };
  size_t at = 0;
  while (size - at >= 4) {
    const uint8_t flags = data[at], arg = data[at + 1];
    const size_t len = std::min<size_t>(uint32_t{data[at + 2]} << 8 | data[at + 3], size - at - 4);
    const uint8_t* src = data + at + 4;
    at += 4 + len;
    ++st.records;
    auto& buf = held.emplace_back(new uint8_t[len ? len : 1]);
    std::memcpy(buf.get(), src, len);
    uint8_t* p = buf.get();
    if ((flags & kRetarget) && len >= wire::kBthLen) {
      const uint32_t qpn = node.qpn[(arg & 15) % kQps];
      p[5] = static_cast<uint8_t>(qpn >> 16);
      p[6] = static_cast<uint8_t>(qpn >> 8);
      p[7] = static_cast<uint8_t>(qpn);
    }
    wire::Endpoint from = w.a.ep;
    if (flags & kStranger) from.addr = wire::Gid::from_v4(htonl(0x0A000009));  // 10.0.0.9
    if ((flags & kFixIcrc) && len >= wire::kIcrcLen) {
      const size_t body = len - wire::kIcrcLen;
      wire::store_icrc(p + body, wire::icrc_for_udp(from, node.ep, std::span<const uint8_t>(p, body)));
    }
    burst[n++] = io::RxPacket{from, node.ep, p, static_cast<uint32_t>(len), 0, 64};
    if (flags & kTick) advance += Nanos{1000} << (2 * (arg >> 4));
    if (!(flags & kSameBurst) || n == io::kRxBurst) flush();
  }
  flush();
  st.reached = st.checked - (dispatch_drops(node) - drops0);
  w.tick(10'000'000'000);  // every timer fires (retransmissions, RNR waits, ACK timeouts)
  st.completions = node.completions;
  return st;
}

int write_seeds(const std::string& dir, const std::string& pcap_path, std::string* error) {
  std::vector<std::vector<uint8_t>> session;  // every frame to b, in order
  size_t completions;
  {
    World w([](void* arg, std::span<const uint8_t> f) {
      static_cast<std::vector<std::vector<uint8_t>>*>(arg)->emplace_back(f.begin(), f.end());
    }, &session);
    w.run_session();
    completions = w.b.completions;
  }
  int files = 0;
  auto write = [&](const std::string& path, const std::vector<uint8_t>& bytes) {
    if (!write_file(path, bytes)) {
      *error = "cannot write " + path;
      return false;
    }
    ++files;
    return true;
  };
  std::vector<uint8_t> all, all_bursts;
  for (size_t i = 0; i < session.size(); ++i) {
    const std::vector<uint8_t>& f = session[i];
    std::vector<uint8_t> one;
    // Mostly with the ICRC recomputed, so that mutations reach the transport; every fourth as sent.
    append_record(one, i % 4 == 3 ? 0 : kFixIcrc, 0, f);
    if (!write(file_name(dir, "session", static_cast<int>(i), f[0]), one)) return -1;
    append_record(all, 0, 0, f);
    append_record(all_bursts, kFixIcrc | kSameBurst, 0, f);
  }
  if (!write(dir + "/session-all", all) || !write(dir + "/session-all-bursts", all_bursts)) return -1;
  // The fuzzer's node, given the session, must end as the node of the session did: the setups match.
  const IngressStats replay = run_ingress(all.data(), all.size());
  if (replay.completions != completions) {
    *error = "the session gave " + std::to_string(completions) + " successful completions, its replay " +
             std::to_string(replay.completions);
    return -1;
  }
  auto cap = testutil::read_pcap(pcap_path, error);
  if (!cap) return -1;
  int k = 0;
  for (const testutil::PcapFrame& fr : cap->frames) {
    auto p = testutil::decode_roce(fr.data);
    if (!p || p->bth_to_pad.size() < wire::kBthLen) continue;
    std::vector<uint8_t> pkt(p->bth_to_pad.begin(), p->bth_to_pad.end());
    pkt.insert(pkt.end(), p->icrc.begin(), p->icrc.end());
    const wire::Transport t = wire::transport_of(pkt[0]);
    const uint8_t qp = t == wire::Transport::kUc ? kUc : t == wire::Transport::kUd ? kUd : kRc;
    std::vector<uint8_t> one;
    append_record(one, kFixIcrc | kRetarget, qp, pkt);
    if (!write(file_name(dir, "rxe", k++, pkt[0]), one)) return -1;
  }
  if (session.empty() || k == 0) {
    *error = "no packets: the session had " + std::to_string(session.size()) + ", the capture " +
             std::to_string(k);
    return -1;
  }
  return files;
}

}  // namespace softrdma::fuzz
