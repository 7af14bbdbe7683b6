// The completer: matches ACKs, NAKs, READ responses and ATOMIC ACKs to send WQEs, runs the retransmit and
// RNR timers, and writes send completions in order (IBTA.md 3, 4, 5 "Requester handling of responses").
#include <algorithm>
#include <cstring>

#include "core/context.h"
#include "transport/transport.h"

namespace softrdma::core {
namespace {

using namespace wire;

bool is_read(const SendWqe& w) { return w.opcode == WrOpcode::kRdmaRead; }
bool is_atomic(const SendWqe& w) { return core::is_atomic(w.opcode); }

WcOpcode wc_opcode(WrOpcode op) {
  switch (op) {
    case WrOpcode::kRdmaWrite:
    case WrOpcode::kRdmaWriteWithImm:
      return WcOpcode::kRdmaWrite;
    case WrOpcode::kRdmaRead:
      return WcOpcode::kRdmaRead;
    case WrOpcode::kAtomicCmpAndSwp:
      return WcOpcode::kCompSwap;
    case WrOpcode::kAtomicFetchAndAdd:
      return WcOpcode::kFetchAdd;
    default:
      return WcOpcode::kSend;
  }
}

// Copies `len` bytes to the WQE's buffer at `offset`.
void scatter(const SendWqe& w, uint32_t offset, const uint8_t* src, uint32_t len) {
  uint32_t i = 0;
  while (i < w.num_seg && offset >= w.seg[i].len) offset -= w.seg[i++].len;
  while (len > 0 && i < w.num_seg) {
    const uint32_t n = std::min(len, w.seg[i].len - offset);
    std::memcpy(w.seg[i].ptr + offset, src, n);
    src += n;
    len -= n;
    offset = 0;
    ++i;
  }
}

}  // namespace

Nanos Transport::rnr_delay_ns(uint8_t code) {
  // IBTA.md 3c; code 0 is the longest delay.
  static constexpr uint32_t kUs[32] = {655360, 10,    20,    30,    40,    60,     80,     120,
                                       160,    240,   320,   480,   640,   960,    1280,   1920,
                                       2560,   3840,  5120,  7680,  10240, 15360,  20480,  30720,
                                       40960,  61440, 81920, 122880, 163840, 245760, 327680, 491520};
  return Nanos{kUs[code & 31]} * 1000;
}

void Transport::complete_send(Qp& qp, SendWqe& w, WcStatus status) {
  if (status == WcStatus::kSuccess && !signaled(qp, w)) return;
  Wc wc;
  wc.wr_id = w.wr_id;
  wc.status = status;
  wc.opcode = wc_opcode(w.opcode);
  wc.qp_num = qp.qpn();
  if (status == WcStatus::kSuccess && (is_read(w) || is_atomic(w))) wc.byte_len = is_read(w) ? w.length : 8;
  if (!qp.init_.send_cq->push(wc, false)) qp.ctx()->raise(kEventCqErr, qp.init_.send_cq);
}

void Transport::retire(Qp& qp) {
  while (qp.comp_.wqe < qp.sq_head_) {
    SendWqe& w = qp.sq_[qp.comp_.wqe & qp.sq_mask_];
    if (!w.done) break;
    ++qp.comp_.wqe;
    if (is_atomic(w) && qp.req_.rd_atomic) --qp.req_.rd_atomic;  // (READs count down per request)
    complete_send(qp, w, w.status);
    if (w.status != WcStatus::kSuccess) {
      // The QP went to the error state on its own (retries exhausted, an error NAK): its completion says
      // why, and an affiliated async event tells an application that watches events rather than CQs.
      to_error(qp);
      qp.ctx()->raise(kEventQpFatal, &qp);
      return;
    }
  }
  QpAttr& a = qp.attr_;
  if (a.qp_state == QpState::kSqd && a.sq_draining && qp.comp_.wqe == qp.req_.wqe && qp.req_.offset == 0) {
    a.sq_draining = false;  // the SQ is drained: nothing started is outstanding
    if (a.en_sqd_async_notify) qp.ctx()->raise(kEventSqDrained, &qp);
  }
}

// Go-back-N: the requester resends from the oldest unacknowledged PSN (IBTA.md 4c "Retransmission"). A
// WQE partly acknowledged (or partly read) resumes where the acknowledged part ends.
void Transport::go_back_n(Qp& qp) {
  ReqState& req = qp.req_;
  rewind_requester(qp);
  req.rd_atomic = 0;
  req.noack_pkts = 0;
  qp.comp_.retrans_deadline = 0;
  qp.comp_.early_deadline = 0;
  qp.comp_.probed = false;
  qp.comp_.rtt_sent_at = 0;  // an ACK may now answer either sending (Karn)
}

// RFC 6298 2.2-2.3: the first sample sets SRTT and RTTVAR = R/2; later ones move them by 1/8 and 1/4.
static void time_round_trip(CompState& c, Nanos r) {
  r = std::max<Nanos>(r, 1);
  if (c.srtt == 0) {
    c.srtt = r;
    c.rttvar = r / 2;
    return;
  }
  const Nanos err = r > c.srtt ? r - c.srtt : c.srtt - r;
  c.rttvar = (3 * c.rttvar + err) / 4;
  c.srtt = (7 * c.srtt + r) / 8;
}

void Transport::resend_after_loss(Qp& qp, io::TxBatch& tx, Nanos now) {
  CompState& c = qp.comp_;
  const uint32_t w = c.loss_window != 0 ? c.loss_window : qp.ctx()->window_for(qp.pmtu_, qp.path_cap_);
  c.loss_window = std::max(w / 2, kMinLossWindow);
  go_back_n(qp);
  requester(qp, tx, now);
}

// Spends one retry of `budget` (7 = infinite, as rxe does); false when none is left.
static bool charge(uint8_t& budget) {
  if (budget == 0) return false;
  if (budget != 7) --budget;
  return true;
}

void Transport::fail_head(Qp& qp, WcStatus status) {
  SendWqe& w = qp.sq_[qp.comp_.wqe & qp.sq_mask_];
  w.done = true;
  w.status = status;
  retire(qp);
}

void Transport::completer(Qp& qp, PacketView pkt, io::TxBatch& tx, Nanos now) {
  CompState& comp = qp.comp_;
  Counters& counters = qp.ctx()->counters();
  const uint32_t psn = pkt.psn();
  const uint32_t psn_before = comp.psn;
  const OpcodeInfo& oi = pkt.info();
  const uint8_t syndrome =
      oi.has(kHasAeth) ? pkt.aeth_syndrome() : make_syndrome(AckType::kAck, kAckUnlimitedCredit);
  const AckType type = syndrome_type(syndrome);
  // An ACK or a response counts up to the highest PSN sent, not just to the next to send: after a go-back-N
  // the peer may acknowledge packets of the round before that this one has yet to resend, and with a
  // window shrunk by the loss this round might never get that far without it (the requester goes on from
  // the PSN acknowledged, below). A NAK at or beyond the next PSN to send is the round before's: this one
  // has gone back already.
  const uint32_t bound = type == AckType::kAck ? qp.req_.high_psn : qp.req_.psn;
  if (psn_diff(psn, comp.psn) < 0 || psn_diff(psn, bound) >= 0) {
    // Nothing outstanding, an old duplicate, a PSN never sent, or an old NAK.
    counters.add(Counter::drop_stale_response);
    return;
  }
  const uint32_t pmtu = qp.pmtu_;
  bool progress = false;

  // Implicit acknowledgement: a response beyond a SEND/WRITE WQE completes it; beyond a READ/ATOMIC it
  // means that WQE's own response was lost, so retry (IBTA.md 5).
  // (The WQE being sent counts: its first packets may be acknowledged before its last one leaves.)
  while (comp.wqe < qp.sq_head_ && qp.sq_[comp.wqe & qp.sq_mask_].started) {
    SendWqe& w = qp.sq_[comp.wqe & qp.sq_mask_];
    const bool beyond = psn_diff(psn, w.last_psn) > 0;
    if (!beyond) break;
    if (is_read(w) || is_atomic(w)) {
      // A READ or ATOMIC completes only by its own response, which is missing: resend from it.
      if (!charge(comp.retry_left)) return fail_head(qp, WcStatus::kRetryExcErr);
      resend_after_loss(qp, tx, now);
      return;
    }
    w.done = true;
    comp.psn = psn_add(w.last_psn, 1);
    progress = true;
    retire(qp);
    if (qp.state() == QpState::kErr) return;
  }

  if (comp.wqe < qp.sq_head_ && qp.sq_[comp.wqe & qp.sq_mask_].started) {
    SendWqe& w = qp.sq_[comp.wqe & qp.sq_mask_];
    switch (type) {
      case AckType::kAck:
        if (oi.has(kReadResp)) {
          if (!is_read(w) || psn != comp.psn) {
            // A READ response out of order (an earlier one was lost) or for a non-READ WQE: drop it.
            counters.add(Counter::drop_out_of_seq);
            if (is_read(w) && psn_diff(psn, comp.psn) > 0 && comp.read_gap_psn != comp.psn + 1) {
              // The first packet past a gap: ask again for the rest of the READ now, once per gap (as
              // the responder NAKs a gap once), instead of waiting for the retransmit timer.
              comp.read_gap_psn = comp.psn + 1;
              if (!charge(comp.retry_left)) return fail_head(qp, WcStatus::kRetryExcErr);
              resend_after_loss(qp, tx, now);
              return;
            }
            break;
          }
          // Each response carries a full path MTU but the last of the WQE's data; a READ sent in chunks
          // has a LAST (or ONLY) response at the end of every chunk.
          const uint64_t offset = uint64_t(psn_diff(psn, w.first_psn)) * pmtu;
          const uint32_t len = pkt.payload_len();
          const bool data_end = offset + len == w.length;
          if (offset > w.length || len != std::min<uint64_t>(pmtu, w.length - offset) ||
              (data_end && !oi.any(kEnd))) {
            counters.add(Counter::drop_bad_header);
            break;
          }
          scatter(w, static_cast<uint32_t>(offset), pkt.payload(), len);
          comp.psn = psn_add(psn, 1);
          progress = true;
          if (oi.any(kEnd) && qp.req_.rd_atomic) --qp.req_.rd_atomic;  // one READ request answered
          if (data_end) {
            w.done = true;
            retire(qp);
          }
        } else if (oi.has(kAtomicAck)) {
          if (!is_atomic(w) || psn != w.first_psn) {
            counters.add(Counter::drop_out_of_seq);
            break;
          }
          const uint64_t orig = pkt.atomic_ack_orig();
          scatter(w, 0, reinterpret_cast<const uint8_t*>(&orig), 8);
          comp.psn = psn_add(psn, 1);
          progress = true;
          w.done = true;
          retire(qp);
        } else if (!is_read(w) && !is_atomic(w)) {
          comp.psn = psn_add(psn, 1);
          progress = true;
          if (psn == w.last_psn) {
            w.done = true;
            retire(qp);
          }
        }
        break;
      case AckType::kRnrNak:
        counters.add(Counter::rx_rnr_nak);
        comp.psn = psn;
        if (!charge(comp.rnr_left)) return fail_head(qp, WcStatus::kRnrRetryExcErr);
        counters.add(Counter::rnr_retries);
        go_back_n(qp);
        comp.rnr_deadline = now + rnr_delay_ns(syndrome_value(syndrome));
        qp.ctx()->kick(comp.rnr_deadline);
        return;
      case AckType::kNak: {
        const uint8_t code = syndrome_value(syndrome);
        if (code == kNakPsnSeqErr) {
          counters.add(Counter::rx_nak_psn_seq);
          // A NAK acknowledges the requests before its PSN, but not the READ responses or the ATOMIC ACK
          // of the WQE at the head, which may be missing: that one goes again from its first one missing
          // (rxe's completer drops such a NAK, check_psn).
          if (!is_read(w) && !is_atomic(w)) comp.psn = psn;
          if (!charge(comp.retry_left)) return fail_head(qp, WcStatus::kRetryExcErr);
          resend_after_loss(qp, tx, now);
          return;
        }
        WcStatus st = WcStatus::kRemOpErr;
        if (code == kNakInvalidRequest) {
          st = WcStatus::kRemInvReqErr;
          counters.add(Counter::rx_nak_inv_req);
        } else if (code == kNakRemoteAccessErr) {
          st = WcStatus::kRemAccessErr;
          counters.add(Counter::rx_nak_rem_access);
        } else {
          counters.add(Counter::rx_nak_rem_op);
        }
        return fail_head(qp, st);
      }
      case AckType::kReserved:
        counters.add(Counter::drop_bad_header);
        return;
    }
  }

  if (progress) {
    comp.retry_waits = 0;
    comp.retry_left = qp.attr_.retry_cnt;
    comp.rnr_left = qp.attr_.rnr_retry;
    comp.retrans_deadline = 0;
    if (comp.rtt_sent_at != 0 && psn_diff(comp.psn, comp.rtt_psn) > 0) {
      time_round_trip(comp, now > comp.rtt_sent_at ? now - comp.rtt_sent_at : 0);
      comp.rtt_sent_at = 0;
    }
    comp.early_deadline = 0;
    comp.early_backoff = 0;
    comp.answered = true;
    if (comp.loss_window != 0) {
      const auto acked = static_cast<uint32_t>(std::max(psn_diff(comp.psn, psn_before), 0));
      comp.loss_window += std::max<uint32_t>(acked / 8, 1);
      if (comp.loss_window >= qp.ctx()->window_for(pmtu, qp.path_cap_)) comp.loss_window = 0;
    }
    // Acknowledged beyond what this round of a go-back-N has resent: it goes on from there.
    if (psn_diff(comp.psn, qp.req_.psn) > 0) go_back_n(qp);
    if (comp.probed) [[unlikely]]
      return probe_answered(qp, tx, now);
    if (qp.state() != QpState::kErr) requester(qp, tx, now);  // the window may have opened; re-arms the timer
  }
}

bool Transport::ack_came_alone(Qp& qp, uint64_t completed_before) {
  CompState& c = qp.comp_;
  if (c.wqe == completed_before) return false;
  if (c.request_since_post) {
    c.request_since_post = false;
    if (c.acks_behind_requests < kPingPongAcks) ++c.acks_behind_requests;
    c.acks_alone = 0;
    return false;
  }
  if (c.acks_behind_requests < kPingPongAcks) return false;
  if (++c.acks_alone >= kAloneAcks) {  // no longer a ping-pong
    c.acks_behind_requests = 0;
    c.acks_alone = 0;
    return false;
  }
  return true;
}

Nanos Transport::timers(Qp& qp, io::TxBatch& tx, Nanos now) {
  CompState& comp = qp.comp_;
  if (qp.resp_.ack_deadline && now >= qp.resp_.ack_deadline) {
    // No answer came in time: twice in a row, and the next ACKs go at once, more of them each time
    // (kAckBackoffMin, ...Max).
    RespState& r = qp.resp_;
    if (r.ack_pending) {
      qp.ctx()->counters().add(Counter::acks_deferred_late);
      if (++r.acks_expired >= 2) {
        r.acks_expired = 0;
        r.acks_undeferred = std::min(kAckBackoffMin << r.ack_backoffs, kAckBackoffMax);
        if (r.acks_undeferred < kAckBackoffMax) ++r.ack_backoffs;
      }
    }
    flush_ack(qp, tx);  // clears the deadline
  }
  if (qp.req_.cork_deadline && now >= qp.req_.cork_deadline) requester(qp, tx, now);  // clears it
  if (qp.type() != QpType::kRc || qp.state() == QpState::kErr || qp.state() == QpState::kReset)
    return qp.req_.cork_deadline;
  if (comp.rnr_deadline) {
    if (now < comp.rnr_deadline) return comp.rnr_deadline;
    comp.rnr_deadline = 0;
    requester(qp, tx, now);
  }
  if (comp.retrans_deadline && now >= comp.retrans_deadline) {
    comp.retrans_deadline = 0;
    if (psn_diff(qp.req_.psn, comp.psn) <= 0) return deadline(qp);  // nothing outstanding
    if (comp.retry_waits < kMaxRetryWaits && qp.ctx()->backend()->peer_behind(qp.peer(), &comp.peer_mark)) {
      // Still in a queue that the peer reads: not lost (ShmIo::peer_behind). One more round.
      ++comp.retry_waits;
      qp.ctx()->counters().add(Counter::retry_waits);
      comp.retrans_deadline = now + ack_timeout_ns(qp.attr_.timeout);
    } else {
      comp.peer_mark = 0;
      qp.ctx()->counters().add(Counter::retry_timeouts);
      if (!charge(comp.retry_left)) {
        fail_head(qp, WcStatus::kRetryExcErr);
        return 0;
      }
      resend_after_loss(qp, tx, now);
    }
  }
  if (comp.early_deadline && now >= comp.early_deadline) {
    comp.early_deadline = 0;
    if (psn_diff(qp.req_.psn, comp.psn) > 0) {
      if (qp.ctx()->backend()->peer_behind(qp.peer(), &comp.peer_mark)) {
        const Nanos e = early_timeout(qp);  // still in a queue that the peer reads: wait once more
        if (e != 0) comp.early_deadline = now + e;
      } else if (probe_stage(qp) && probe(qp, tx, now)) {
        // The probe went; the requester armed the rest of the wait (early_timeout, now without the probe).
      } else {
        qp.ctx()->counters().add(Counter::early_retransmits);
        if (comp.early_backoff < kEarlyMaxBackoff) ++comp.early_backoff;
        const Nanos keep = comp.retrans_deadline;  // the ACK timeout still counts from the last progress
        resend_after_loss(qp, tx, now);
        if (keep != 0) comp.retrans_deadline = keep;
      }
    }
  }
  return deadline(qp);
}

}  // namespace softrdma::core
