// The requester: turns send WQEs into request packets while the send window allows (IBTA.md 1, 4c, 5).
#include <algorithm>
#include <utility>

#include "core/context.h"
#include "transport/transport.h"

namespace softrdma::core {
namespace {

using namespace wire;

bool is_read_or_atomic(WrOpcode op) { return op == WrOpcode::kRdmaRead || is_atomic(op); }

// Response packets per READ request: bounds what one request makes the responder send at once.
constexpr uint32_t kReadChunk = 64;

uint32_t packets_for(uint32_t len, uint32_t pmtu) { return len == 0 ? 1 : (len + pmtu - 1) / pmtu; }

// The operation of the packet at position (first, last) of a SEND or WRITE message.
uint8_t send_write_op(WrOpcode op, bool first, bool last) {
  const bool only = first && last;
  switch (op) {
    case WrOpcode::kSend:
      return only ? kOpSendOnly : first ? kOpSendFirst : last ? kOpSendLast : kOpSendMiddle;
    case WrOpcode::kSendWithImm:
      return only ? kOpSendOnlyImm : first ? kOpSendFirst : last ? kOpSendLastImm : kOpSendMiddle;
    case WrOpcode::kSendWithInv:
      return only ? kOpSendOnlyInv : first ? kOpSendFirst : last ? kOpSendLastInv : kOpSendMiddle;
    case WrOpcode::kRdmaWrite:
      return only ? kOpWriteOnly : first ? kOpWriteFirst : last ? kOpWriteLast : kOpWriteMiddle;
    case WrOpcode::kRdmaWriteWithImm:
      return only ? kOpWriteOnlyImm : first ? kOpWriteFirst : last ? kOpWriteLastImm : kOpWriteMiddle;
    default:
      return 0xFF;
  }
}

// Points the packet's payload at `len` bytes of the WQE's buffer, starting `offset` bytes in.
void attach_payload(io::TxPacket& p, const SendWqe& w, uint32_t offset, uint32_t len) {
  uint32_t i = 0;
  while (i < w.num_seg && offset >= w.seg[i].len) offset -= w.seg[i++].len;
  while (len > 0 && i < w.num_seg && p.n_iov < io::kMaxPayloadIov) {
    const uint32_t n = std::min(len, w.seg[i].len - offset);
    p.iov[p.n_iov++] = {w.seg[i].ptr + offset, n};
    len -= n;
    offset = 0;
    ++i;
  }
}

// The one-sided way of a WRITE, READ or ATOMIC (Backend::direct's result; -1: the ordinary way; -2: not an
// op that could take it). `shared_only`: in a stream, only a memcpy through pages the peer shares (qp.h,
// shared_direct_); an ATOMIC goes one-sided only through them, with the CPU's atomics. `uc_sent`, `psn`: a UC
// QP's ReqState::uc_sent and next PSN.
int try_direct(Qp& qp, const SendWqe& w, bool shared_only, bool uc_sent, uint32_t psn) {
  const bool atomic = is_atomic(w.opcode);
  if ((w.opcode != WrOpcode::kRdmaWrite && w.opcode != WrOpcode::kRdmaRead && !atomic) || w.length == 0 ||
      w.num_seg == 0)
    return -2;
  io::LocalSeg segs[kMaxSge];
  for (uint32_t i = 0; i < w.num_seg; ++i) segs[i] = {w.seg[i].ptr, w.seg[i].len};
  const io::DirectOp op{w.opcode == WrOpcode::kRdmaRead,
                        qp.qpn(),
                        qp.attr().dest_qp_num,
                        w.remote_addr,
                        w.rkey,
                        w.length,
                        segs,
                        w.num_seg,
                        shared_only || atomic,
                        atomic,
                        w.opcode == WrOpcode::kAtomicCmpAndSwp,
                        w.compare_add,
                        w.swap,
                        qp.type() == QpType::kUc,
                        uc_sent,
                        psn};
  return qp.ctx()->backend()->direct(qp.peer(), op);
}

}  // namespace

void Transport::uc_answer_hold(Qp& qp, const SendWqe& w, Nanos now) {
  if (w.opcode != WrOpcode::kRdmaWrite || !qp.may_direct_ || qp.comp_.uc_answers < kUcAnswers ||
      !signaled(qp, w))
    return;
  Cq* scq = qp.init_.send_cq;
  if (scq->events_awaited(now)) return;  // an application that waits for events does not poll
  // The WRITE's own packets leave first, and the peer answers only once they are all there: 1 ns more per
  // byte (a 1 MiB WRITE's took 200-250 us to leave here, and every 1 MiB hold of 200 us ran out).
  qp.comp_.uc_hold_until = now + kUcAnswerHoldNs + w.length;
  scq->hold(qp.comp_.uc_hold_until);
  qp.ctx()->counters().add(Counter::answer_holds);
}

// A small signaled WRITE posted alone (after a poll of the send CQ, one packet long) to a same-host peer
// goes one-sided by default: a write to the peer's /proc/<pid>/mem (0.8 us here), which the peer's
// application sees in its memory with nothing to receive. To a peer in a ping-pong with this QP it goes
// through the ring instead, as a packet marked io::kAwaitsAck: the peer's application, which polls for the
// completion of its own last WRITE (it waits for the ACK, which comes with this packet), reads it in that
// poll and answers, with no system call on either side. A ping-pong is a packet so marked from the peer
// since this QP's last lone post but one: an unmarked request (a SEND, an unsignaled WRITE, a WRITE in a
// stream) says nothing of whether the peer polls when this WRITE comes, and a peer that spins on its
// memory instead leaves it to its progress thread, which may sleep. The QP's first lone WRITE goes through
// the ring to find out (a peer that answers so starts a ping-pong). Same-host 8-byte ib_write_lat: README
// ("The same-host path").
bool Transport::lone_write_by_ring(Qp& qp, const SendWqe& w) {
  if (w.opcode != WrOpcode::kRdmaWrite || !signaled(qp, w)) return false;
  ReqState& r = qp.req_;
  const bool ring = r.lone_since_request < 2 || !r.ring_tried;
  r.ring_tried = true;
  if (r.lone_since_request != 255) ++r.lone_since_request;
  return ring;
}

io::TxPacket& Transport::new_packet(Qp& qp, io::TxBatch& tx, const Endpoint& dst, uint8_t op, bool se,
                                    uint32_t dqpn, bool ack_req, uint32_t psn, uint32_t payload_len) {
  io::TxPacket& p = tx.next();
  p.src = {qp.ctx()->local_addr(), qp.port()};
  p.dst = dst;
  p.payload_len = payload_len;
  p.pad = static_cast<uint8_t>((4 - (payload_len & 3)) & 3);
  p.flags = 0;
  p.hdr_len = info(op).hdr_len;
  PacketView v(p.hdr, p.hdr_len);
  v.set_bth(op, se, p.pad, kDefaultPkey, dqpn, ack_req, psn);
  return p;
}

// One sent below the high-water mark is a retransmission.
void Transport::advance_psn(Qp& qp, uint32_t next, Nanos now) {
  ReqState& req = qp.req_;
  CompState& comp = qp.comp_;
  if (psn_diff(req.psn, req.high_psn) < 0) {
    qp.ctx()->counters().add(Counter::retransmits);
  } else if (comp.rtt_sent_at == 0) {
    comp.rtt_psn = req.psn;
    comp.rtt_sent_at = std::max<Nanos>(now, 1);
  }
  if (psn_diff(next, req.high_psn) > 0) req.high_psn = next;
  req.psn = next;
}

bool Transport::release_tx(Qp& qp, io::TxBatch& tx, Nanos now) {
  qp.tx_held_ = false;
  const bool lone = std::exchange(qp.lone_held_, false);
  if (!qp.corked_) return false;
  // A lone post that the hold corked may still go one-sided, as it would have at once (an RDMA READ that
  // rping's server posts on the SEND's event: through the rings it waited for the peer's progress thread).
  qp.may_direct_ = lone;
  send_posted(qp, tx, now);
  qp.may_direct_ = false;
  return true;
}

void Transport::send_posted(Qp& qp, io::TxBatch& tx, Nanos now) {
  requester(qp, tx, now);
  if (qp.type() == QpType::kRc) send_answered_ack(qp, tx);
}

void Transport::requester(Qp& qp, io::TxBatch& tx, Nanos now) {
  qp.corked_ = false;  // what a post left queued goes now (or waits for the window, and then an ACK)
  qp.req_.cork_deadline = 0;
  // In SQD the WQEs already started still go out (and are retransmitted); new ones wait (IBTA.md 9).
  const bool sqd = qp.attr_.qp_state == QpState::kSqd;
  if (qp.attr_.qp_state != QpState::kRts && !sqd) return;
  if (qp.comp_.rnr_deadline) return;  // waiting out an RNR NAK
  const bool rc = qp.type() == QpType::kRc;
  const uint32_t pmtu = qp.pmtu_;
  uint32_t window = qp.ctx()->window_for(pmtu, qp.path_cap_);
  if (qp.comp_.loss_window != 0) window = std::min(window, qp.comp_.loss_window);

  while (qp.req_.wqe < qp.sq_head_) {
    SendWqe& w = qp.sq_[qp.req_.wqe & qp.sq_mask_];
    if (sqd && !w.started) break;
    if (w.post_status != WcStatus::kSuccess) {
      // A local error found at post time: nothing goes out, neither this WQE nor any behind it (rxe stops
      // its requester). The requester stays on it until the completer has reported it in order, which moves
      // the QP to ERROR and flushes the rest.
      if (!w.done) {
        w.started = true;
        w.first_psn = qp.req_.psn;
        w.last_psn = psn_add(qp.req_.psn, kPsnMask);  // = psn - 1: no PSN used
        w.done = true;
        w.status = w.post_status;
      }
      retire(qp);
      if (qp.attr_.qp_state == QpState::kErr) return;
      break;  // (still arms the retransmit timer for what went out before it)
    }
    const bool rd_atomic = is_read_or_atomic(w.opcode);
    bool awaits_ack = false;  // a lone WRITE through the ring (lone_write_by_ring)
    if (rc) {
      if (psn_diff(qp.req_.psn, qp.comp_.psn) >= static_cast<int32_t>(window)) break;
      // Each READ request (every chunk of a READ) and each ATOMIC counts against max_rd_atomic.
      if (rd_atomic && qp.req_.rd_atomic >= std::max<uint32_t>(1, qp.attr_.max_rd_atomic)) break;
      // A fenced WQE waits for every READ/ATOMIC before it to complete.
      if (qp.req_.offset == 0 && (w.send_flags & kSendFence) && qp.req_.rd_atomic > 0) break;
    }
    if (rc || (qp.type() == QpType::kUc && w.opcode == WrOpcode::kRdmaWrite)) {
      // The same-host one-sided path: with nothing else outstanding (so nothing is reordered), a WRITE, a
      // READ (or, through shared pages, an ATOMIC) is done here, in the peer's memory, after the checks its
      // responder would make (io/shm/access_table.h). It uses no PSN and completes in order at once.
      // Anything else goes on below. A UC WRITE too, once the peer's responder has taken every packet the
      // QP sent before (io::DirectOp::uc): with no ACK to wait for, its application spins on its memory
      // while the peer's progress thread, asleep, would have to wake for the packet (same-host 8-byte
      // ib_write_lat -c UC: README, "The same-host path").
      int how = -1;
      const uint32_t stream_min = qp.ctx()->config().direct_stream_min;
      const bool streamed = stream_min != 0 && w.length >= stream_min;
      const bool ring = rc && qp.may_direct_ && !streamed && w.length <= pmtu && lone_write_by_ring(qp, w);
      const bool any_way = (qp.may_direct_ && !ring) || streamed;
      if ((any_way || qp.shared_direct_ || ring) && !w.started && !sqd && qp.req_.offset == 0 &&
          qp.comp_.wqe == qp.req_.wqe && qp.req_.psn == qp.comp_.psn &&
          (how = try_direct(qp, w, !any_way, qp.req_.uc_sent, qp.req_.psn)) != -2)
        qp.shared_direct_ = how == 1;
      if (ring && how < 0) {
        awaits_ack = true;
        qp.ctx()->counters().add(Counter::ring_lone_writes);
      }
      if (how >= 0) {
        qp.may_direct_ = false;
        w.started = true;
        w.first_psn = qp.req_.psn;
        w.last_psn = psn_add(qp.req_.psn, kPsnMask);  // = psn - 1: no PSN used
        w.done = true;
        w.status = WcStatus::kSuccess;
        ++qp.req_.wqe;
        retire(qp);
        continue;
      }
    }
    const uint32_t npkts = is_atomic(w.opcode) ? 1 : packets_for(w.length, pmtu);
    if (!w.started) {
      w.started = true;
      w.first_psn = qp.req_.psn;
      w.last_psn = psn_add(qp.req_.psn, npkts - 1);
    }
    const Endpoint dst = qp.type() == QpType::kUd ? w.ud_dst : qp.peer_;
    const uint32_t dqpn = qp.type() == QpType::kUd ? w.ud_dqpn : qp.attr_.dest_qp_num;

    if (w.opcode == WrOpcode::kRdmaRead) {
      // One request per chunk of at most kReadChunk response packets, within the send window: a long READ
      // never floods the requester's socket, and a loss costs one chunk, not the rest of the READ. The
      // chunks use consecutive PSNs, so the responses land by PSN as for one request. (A retried READ
      // resumes where the responses stopped.)
      const uint32_t sent_pkts = qp.req_.offset / pmtu;
      const uint32_t room = window - static_cast<uint32_t>(psn_diff(qp.req_.psn, qp.comp_.psn));
      const uint32_t want = std::min(npkts - sent_pkts, kReadChunk);
      if (room < want && room < window) break;  // wait for room for a whole chunk, not a sliver of one
      const uint32_t chunk = std::min(want, room);
      const uint64_t off = uint64_t{sent_pkts} * pmtu;
      const uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(w.length - off, uint64_t{chunk} * pmtu));
      io::TxPacket& p = new_packet(qp, tx, dst, opcode(wire::Transport::kRc, kOpReadRequest), false, dqpn,
                                   true, qp.req_.psn, 0);
      PacketView(p.hdr, p.hdr_len).set_reth(w.remote_addr + off, w.rkey, len);
      advance_psn(qp, psn_add(qp.req_.psn, chunk), now);
      ++qp.req_.rd_atomic;
      qp.req_.noack_pkts = 0;
      if (sent_pkts + chunk >= npkts) {
        ++qp.req_.wqe;
        qp.req_.offset = 0;
      } else {
        qp.req_.offset = static_cast<uint32_t>(off) + chunk * pmtu;
      }
      continue;
    }
    if (rd_atomic) {
      const uint8_t op = w.opcode == WrOpcode::kAtomicCmpAndSwp ? kOpCompareSwap : kOpFetchAdd;
      io::TxPacket& p = new_packet(qp, tx, dst, opcode(wire::Transport::kRc, static_cast<Op>(op)), false,
                                   dqpn, true, qp.req_.psn, 0);
      const bool cas = op == kOpCompareSwap;
      PacketView(p.hdr, p.hdr_len)
          .set_atomic_eth(w.remote_addr, w.rkey, cas ? w.swap : w.compare_add, cas ? w.compare_add : 0);
      advance_psn(qp, psn_add(qp.req_.psn, 1), now);
      ++qp.req_.rd_atomic;
      ++qp.req_.wqe;
      qp.req_.offset = 0;
      qp.req_.noack_pkts = 0;
      continue;
    }

    // SEND or WRITE: one packet per path MTU.
    if (qp.type() == QpType::kUd && w.length > pmtu) {
      // Larger than the MTU: rxe sends nothing and completes the WR successfully (C10-93.1.1).
      w.done = true;
      ++qp.req_.wqe;
      retire(qp);
      continue;
    }
    const uint32_t idx = qp.req_.offset / pmtu;
    const bool first = idx == 0;
    const bool last = idx + 1 >= npkts;
    const uint32_t len = std::min(pmtu, w.length - qp.req_.offset);
    const uint8_t op_low = send_write_op(w.opcode, first, last);
    const bool se = last && (w.send_flags & kSendSolicited) && (w.opcode != WrOpcode::kRdmaWrite);
    bool ack_req = false;
    // An ACK is asked for at least 4 times per window: the responder ACKs only packets that ask (coalesced),
    // so a window shrunk below the interval (many QPs share the context's budget) would stall until the
    // retransmit timeout.
    if (rc) ack_req = last || ++qp.req_.noack_pkts > std::min<uint32_t>(64, window / 4);
    const wire::Transport transport_type = qp.type() == QpType::kRc   ? wire::Transport::kRc
                                           : qp.type() == QpType::kUc ? wire::Transport::kUc
                                                                      : wire::Transport::kUd;
    io::TxPacket& p = new_packet(qp, tx, dst, opcode(transport_type, static_cast<Op>(op_low)), se, dqpn,
                                 ack_req, qp.req_.psn, len);
    if (transport_type == wire::Transport::kUc) qp.req_.uc_sent = true;
    if (awaits_ack) p.flags = io::kAwaitsAck;
    PacketView v(p.hdr, p.hdr_len);
    const OpcodeInfo& oi = v.info();
    if (oi.has(kHasReth)) v.set_reth(w.remote_addr, w.rkey, w.length);
    if (oi.has(kHasImmDt)) v.set_imm_be(w.imm_be);
    if (oi.has(kHasIeth)) v.set_ieth_rkey(w.inv_rkey);
    if (oi.has(kHasDeth)) v.set_deth(w.ud_qkey, qp.qpn());
    attach_payload(p, w, qp.req_.offset, len);
    if (ack_req) qp.req_.noack_pkts = 0;
    advance_psn(qp, psn_add(qp.req_.psn, 1), now);
    qp.req_.offset += len;
    if (last) {
      qp.req_.offset = 0;
      ++qp.req_.wqe;
      if (!rc) {
        // UC and UD have no acknowledgements: the WQE is done once its packets are handed to io/.
        w.done = true;
        qp.comp_.psn = qp.req_.psn;
        if (transport_type == wire::Transport::kUc) uc_answer_hold(qp, w, now);
        retire(qp);
      }
    }
  }
  if (rc && psn_diff(qp.req_.psn, qp.comp_.psn) > 0) {
    CompState& comp = qp.comp_;
    if (comp.retrans_deadline == 0) {
      const Nanos t = ack_timeout_ns(qp.attr_.timeout);
      if (t) comp.retrans_deadline = now + t;
    }
    if (comp.early_deadline == 0) {
      const Nanos e = early_timeout(qp);
      if (e) comp.early_deadline = now + e;
    }
  }
}

Nanos Transport::early_timeout(const Qp& qp) {
  const CompState& comp = qp.comp_;
  const Nanos t = ack_timeout_ns(qp.attr_.timeout);
  if (!comp.answered || t == 0) return 0;
  // Until a round trip is timed (go-back-N drops the one being timed, so at high loss none may be), the
  // least wait.
  const Nanos rto = std::max(comp.srtt + 4 * comp.rttvar, kEarlyMinNs) << comp.early_backoff;
  if (rto > t / 2) return 0;
  return comp.loss_window == 0 ? rto : probe_wait(qp, rto);
}

// The probe's code is cold (transport.h), out of the data path's text: placed among it, the same code cost
// same-host ib_write_lat 0.01-0.02 us per half round trip where no probe ever ran (the hot code's layout,
// it seems; 2026-12-05: 8 of 8 interleaved rounds even once cold).
Nanos Transport::probe_wait(const Qp& qp, Nanos rto) {
  return probe_stage(qp) ? std::min<Nanos>(rto, std::max<Nanos>(2 * qp.comp_.srtt, kProbeMinNs)) : rto;
}

bool Transport::probe_stage(const Qp& qp) {
  return qp.comp_.loss_window != 0 && !qp.comp_.probed && kProbeMinNs <= ack_timeout_ns(qp.attr_.timeout) / 8;
}

bool Transport::probe(Qp& qp, io::TxBatch& tx, Nanos now) {
  ReqState& req = qp.req_;
  CompState& comp = qp.comp_;
  comp.probed = true;
  // The oldest packet not acknowledged: the responder has it (a duplicate, re-ACKed with all it has) or
  // lacks it (in order, so it takes it and ACKs it). Either way an ACK comes; the last packet, behind one
  // that was lost, would be dropped silently (the responder NAKs a gap once).
  if (comp.wqe >= qp.sq_head_ || psn_diff(req.psn, comp.psn) <= 0) return false;
  const SendWqe& w = qp.sq_[comp.wqe & qp.sq_mask_];
  if (!w.started || is_read_or_atomic(w.opcode) || psn_diff(comp.psn, w.first_psn) < 0 ||
      psn_diff(comp.psn, w.last_psn) > 0)
    return false;
  // That one packet, asking for an ACK (a window of 1); then the requester goes on from where it was. (It
  // may send none: a fenced WRITE at the head while READs behind it are outstanding.)
  const ReqState saved = req;
  const uint32_t window = comp.loss_window;
  rewind_requester(qp);
  comp.loss_window = 1;
  requester(qp, tx, now);
  const bool sent = req.psn != comp.psn;
  comp.loss_window = window;
  req = saved;
  if (sent) qp.ctx()->counters().add(Counter::loss_probes);
  return sent;
}

void Transport::probe_answered(Qp& qp, io::TxBatch& tx, Nanos now) {
  qp.comp_.probed = false;
  if (qp.state() == QpState::kErr) return;
  // An ACK after a millisecond or more without one: the probe's answer. The responder has every packet up
  // to the one acknowledged and, as it drops what comes out of order, none beyond: anything still
  // outstanding was lost (or its NAK was), so go back now rather than after the early retransmission's wait.
  if (psn_diff(qp.req_.psn, qp.comp_.psn) > 0) {
    qp.ctx()->counters().add(Counter::probe_go_backs);
    resend_after_loss(qp, tx, now);
  } else {
    requester(qp, tx, now);
  }
}

}  // namespace softrdma::core
