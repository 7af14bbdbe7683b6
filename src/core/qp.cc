#include "core/qp.h"

#include <bit>
#include <cerrno>
#include <cstring>

#include "core/context.h"
#include "core/scratch.h"
#include "transport/transport.h"

namespace softrdma::core {

namespace {
constinit thread_local io::TxBatch tls_tx;  // (constinit: no TLS init call per use)

bool needs_local_write(WrOpcode op) {
  return op == WrOpcode::kRdmaRead || op == WrOpcode::kAtomicCmpAndSwp || op == WrOpcode::kAtomicFetchAndAdd;
}

// Runs the requester on what is queued, sends it, and publishes the QP's next timer deadline.
void run_requester(Qp& qp) {
  io::TxBatch& tx = tls_once(tls_tx);
  tx.sink = qp.ctx()->backend();
  Transport::send_posted(qp, tx, qp.ctx()->now());
  tx.flush();
  qp.publish_deadline();
}

bool allowed(QpType t, WrOpcode op) {
  switch (t) {
    case QpType::kUd:
      return op == WrOpcode::kSend || op == WrOpcode::kSendWithImm;
    case QpType::kUc:
      return op == WrOpcode::kSend || op == WrOpcode::kSendWithImm || op == WrOpcode::kRdmaWrite ||
             op == WrOpcode::kRdmaWriteWithImm;
    case QpType::kRc:
      return op <= WrOpcode::kAtomicFetchAndAdd || op == WrOpcode::kSendWithInv;
  }
  return false;
}
}  // namespace

Qp::Qp(Context* ctx, Pd* pd, uint32_t qpn, uint16_t port, const QpInitAttr& init)
    : ctx_(ctx), pd_(pd), qpn_(qpn), port_(port), init_(init) {
  // UD has no path MTU attribute: its datagrams are bounded by the interface's MTU (rxe: port mtu_cap).
  if (init.type == QpType::kUd) pmtu_ = ctx->config().active_mtu;
  const uint32_t sq = std::bit_ceil(std::max<uint32_t>(init.cap.max_send_wr, 1));
  sq_.resize(sq);
  sq_mask_ = sq - 1;
  init_.cap.max_send_wr = sq;
  if (!init.srq) rq_.init(std::max<uint32_t>(init.cap.max_recv_wr, 1), init.cap.max_recv_sge);
  init_.cap.max_recv_wr = init.srq ? 0 : rq_.max_wr();
  attr_.cap = init_.cap;
}

Qp::~Qp() { share_window(false); }

void Qp::share_window(bool on) {
  if (on == sharing_window_) return;
  sharing_window_ = on;
  ctx_->rc_sending(on ? 1 : -1);
}

int Qp::modify(const QpAttr& attr, uint32_t mask) {
  std::lock_guard g(lock_);
  const QpState before = attr_.qp_state;
  // A deferred ACK (Transport::end_burst) is owed for messages already executed: it goes before the QP
  // stops answering (rdma_disconnect moves it to ERROR right after the last completion).
  if ((mask & kQpState) && (attr.qp_state == QpState::kErr || attr.qp_state == QpState::kReset))
    send_deferred_ack();
  const int err = Transport::modify(*this, attr, mask);
  // Back from SQD: the WQEs posted meanwhile go out now, not at the next post.
  if (err == 0 && before == QpState::kSqd && attr_.qp_state == QpState::kRts) run_requester(*this);
  share_window(type() == QpType::kRc && attr_.qp_state != QpState::kReset &&
               (sharing_window_ || attr_.qp_state == QpState::kRts));
  if (err == 0 && (type() == QpType::kRc || type() == QpType::kUc)) {
    // What a same-host peer checks before it reads or writes this process's memory itself (io/shm). With
    // no responder resources for READ and atomics (max_dest_rd_atomic 0), its responder refuses them, as
    // rxe's does: so must the peer. UC takes WRITEs only.
    const QpState s = attr_.qp_state;
    const bool uc = type() == QpType::kUc;
    const uint32_t access = uc ? attr_.qp_access_flags & kRemoteWrite
                            : attr_.max_dest_rd_atomic == 0
                                ? attr_.qp_access_flags & ~(kRemoteRead | kRemoteAtomic)
                                : attr_.qp_access_flags;
    psn_seen_ =
        ctx_->backend()->publish_qp({qpn_, access, pd_->id, attr_.dest_qp_num,
                                     s == QpState::kRtr || s == QpState::kRts || s == QpState::kSqd, uc});
  }
  return err;
}

void Qp::forget_published() {
  std::lock_guard g(lock_);
  psn_seen_ = nullptr;
}

int Qp::query(QpAttr* attr, QpInitAttr* init) const {
  std::lock_guard g(lock_);
  if (attr) {
    *attr = attr_;
    attr->cur_qp_state = attr_.qp_state;
    attr->cap = init_.cap;
  }
  if (init) *init = init_;
  return 0;
}

int Qp::post_send(std::span<const SendWr> wrs, size_t* bad) {
  ctx_->note_app_call();
  std::lock_guard g(lock_);
  const QpState st = attr_.qp_state;
  if (st == QpState::kReset || st == QpState::kInit || st == QpState::kRtr) {
    *bad = 0;
    return EINVAL;
  }
  const bool answered = comp_.request_since_post;
  comp_.request_since_post = false;  // Transport::ack_came_alone
  for (size_t i = 0; i < wrs.size(); ++i) {
    const SendWr& wr = wrs[i];
    *bad = i;
    if (sq_head_ - comp_.wqe >= sq_.size()) return ENOMEM;
    if (wr.sg_list.size() > init_.cap.max_send_sge || !allowed(type(), wr.opcode)) return EINVAL;
    uint64_t len = 0;
    for (const Sge& s : wr.sg_list) len += s.length;
    if (len > kMaxMsgSize) return EINVAL;
    const bool atomic = wr.opcode == WrOpcode::kAtomicCmpAndSwp || wr.opcode == WrOpcode::kAtomicFetchAndAdd;
    if (atomic && (len != 8 || (wr.remote_addr & 7))) return EINVAL;
    const bool inl = (wr.send_flags & kSendInline) && !needs_local_write(wr.opcode);
    if (inl && len > init_.cap.max_inline_data) return EINVAL;
    if (type() == QpType::kUd && (!wr.ah || wr.ah->pd->ctx != ctx_)) return EINVAL;

    SendWqe& w = sq_[sq_head_ & sq_mask_];
    w.wr_id = wr.wr_id;
    w.opcode = wr.opcode;
    w.send_flags = wr.send_flags;
    w.imm_be = wr.imm_data;
    w.inv_rkey = wr.invalidate_rkey;
    w.remote_addr = wr.remote_addr;
    w.rkey = wr.rkey;
    w.compare_add = wr.compare_add;
    w.swap = wr.swap;
    w.length = static_cast<uint32_t>(len);
    w.started = w.done = false;
    w.status = w.post_status = WcStatus::kSuccess;
    w.num_seg = 0;
    if (type() == QpType::kUd) {
      w.ud_dst = ctx_->peer_endpoint(wr.ah->attr.dgid, wr.remote_qpn);
      w.ud_dqpn = wr.remote_qpn & wire::kQpnMask;
      w.ud_qkey = wr.remote_qkey;
    }
    if (inl) {
      // The data is copied now; the caller may reuse its buffers as soon as this returns.
      uint32_t off = 0;
      for (const Sge& s : wr.sg_list) {
        std::memcpy(w.inline_data + off, reinterpret_cast<const void*>(s.addr), s.length);
        off += s.length;
      }
      if (len) w.seg[w.num_seg++] = {w.inline_data, w.length};
    } else {
      // Each SGE must lie in an MR of this QP's PD (READ and ATOMIC results need local write access);
      // a bad one completes the WQE with LOC_PROT_ERR, as rxe reports it.
      for (const Sge& s : wr.sg_list) {
        if (s.length == 0) continue;
        MrRef mr = ctx_->mrs().find(s.lkey);
        if (!mr || mr->pd != pd_ || !mr->contains(s.addr, s.length) ||
            (needs_local_write(wr.opcode) && !(mr->access & kLocalWrite))) {
          w.post_status = WcStatus::kLocProtErr;
          break;
        }
        w.seg[w.num_seg++] = {mr->host(s.addr), s.length};
      }
    }
    ++sq_head_;
  }
  *bad = wrs.size();
  if (attr_.qp_state == QpState::kErr) {
    Transport::to_error(*this);
    return 0;
  }
  // With packets already on the wire (RC), what is posted waits: the posting thread sends it at its next
  // poll of an empty CQ (Context::corked), or the next ACK that makes progress does (the completer runs
  // the requester then), whichever comes first, for every WQE queued meanwhile in one batch. An ACK is
  // sure to come, or the retransmit timer (armed while packets are out) to fire. A QP held by a driver's
  // burst (tx_held_) may have nothing out: the driver sends what was posted meanwhile when it releases
  // the QP (Transport::release_tx). perftest's ib_write_bw
  // posts 100 WRs between polls (one completion per 100): with 16 packets allowed out before corking,
  // those 16 went one send call each. Measured, 8-byte ib_write_bw over UDP, 2 runs each: 16 in flight
  // 0.80-0.88 M/s, 2 in flight 1.48-1.52, 1 in flight 1.53-1.58 (8 QPs: 1.10 -> 2.2-2.3 M/s). A
  // latency test has at most one packet out, so it still sends at once.
  // UC and UD have no ACK to count on: the third post in a row with no poll of the send CQ between waits
  // for the poster's next poll, or for the progress thread's timer (kCorkDelayNs) if that never comes.
  const uint32_t polls = init_.send_cq->polls();
  const bool polled = polls != send_cq_polls_;
  send_cq_polls_ = polls;
  posts_since_poll_ = polled ? 1 : posts_since_poll_ + 1;
  const bool lone = wrs.size() == 1 && polled;  // one WR, after a poll of the send CQ
  if (type() == QpType::kUc) {                  // Transport::uc_answer_hold
    comp_.uc_answers =
        lone && wrs[0].opcode == WrOpcode::kRdmaWrite && answered
            ? static_cast<uint8_t>(std::min<uint32_t>(comp_.uc_answers + 1u, Transport::kPingPongAcks))
            : 0;
  }
  const bool rc = type() == QpType::kRc;
  if (rc ? tx_held_ || wire::psn_diff(req_.psn, comp_.psn) >= kCorkInFlight
         : posts_since_poll_ > kCorkPostsInARow) {
    if (rc && tx_held_) lone_held_ = lone;
    if (!corked_) {
      corked_ = true;
      ctx_->corked(qpn_);
      if (!rc) {
        req_.cork_deadline = ctx_->now() + kCorkDelayNs;
        publish_deadline();
      }
    }
    return 0;
  }
  may_direct_ = lone;
  run_requester(*this);
  may_direct_ = false;
  return 0;
}

void Qp::publish_deadline() {
  const Nanos d = Transport::deadline(*this);
  if (d != next_deadline.load(std::memory_order_relaxed)) {
    next_deadline.store(d, std::memory_order_relaxed);
    ctx_->deadline_armed(d);
    if (d) ctx_->kick(d);
  }
}

void Qp::send_corked() {
  std::lock_guard g(lock_);
  if (corked_) run_requester(*this);
}

void Qp::flush_deferred_ack() {
  std::lock_guard g(lock_);
  send_deferred_ack();
}

void Qp::send_deferred_ack() {
  if (!resp_.ack_pending) return;
  io::TxBatch& tx = tls_once(tls_tx);
  tx.sink = ctx_->backend();
  Transport::flush_ack(*this, tx);
  tx.flush();
}

int Qp::post_recv(std::span<const RecvWr> wrs, size_t* bad) {
  std::lock_guard g(lock_);
  *bad = 0;
  if (init_.srq || attr_.qp_state == QpState::kReset) return EINVAL;
  for (size_t i = 0; i < wrs.size(); ++i) {
    *bad = i;
    const RecvWr& wr = wrs[i];
    if (wr.sg_list.size() > rq_.max_sge()) return EINVAL;
    RecvWqe w;
    w.wr_id = wr.wr_id;
    w.num_sge = static_cast<uint32_t>(wr.sg_list.size());
    uint64_t len = 0;
    for (size_t k = 0; k < wr.sg_list.size(); ++k) {
      w.sge[k] = wr.sg_list[k];
      len += wr.sg_list[k].length;
    }
    w.length = static_cast<uint32_t>(std::min<uint64_t>(len, UINT32_MAX));
    if (int err = rq_.post(w)) return err;
  }
  *bad = wrs.size();
  if (attr_.qp_state == QpState::kErr) Transport::to_error(*this);
  return 0;
}

}  // namespace softrdma::core
