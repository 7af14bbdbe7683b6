// The IBTA transport as three engines over a QP's state, in the manner of rxe: the requester turns send
// WQEs into request packets, the responder executes request packets and answers them, and the completer
// matches responses (ACK/NAK, READ responses, ATOMIC ACKs) to WQEs, runs the retry timers and writes
// completions. All of it is pure: packets in, packets out (a TxBatch), a clock passed in; no threads and no
// sockets, so tests drive it over a simulated network. Callers hold the QP lock.
#pragma once

#include <algorithm>

#include "core/qp.h"
#include "io/packet.h"
#include "wire/headers.h"

namespace softrdma::core {

inline bool is_atomic(WrOpcode op) {
  return op == WrOpcode::kAtomicCmpAndSwp || op == WrOpcode::kAtomicFetchAndAdd;
}

// A UD receive completion's SL over RoCE v2: the received packet's L3 type, 2 for IPv4 and 1 for IPv6, as
// ConnectX NICs report it (RoCE carries no SL; rxe reports 0). UCX's ud_verbs reads it to find the
// destination address in the GRH area, whose first 20 bytes are undefined for IPv4, and with 0 took the
// IPv4 header for an IPv6 one and dropped every packet (UCX 1.13: its endpoints failed on their timeout).
inline uint8_t ud_wc_sl(bool ipv4) { return ipv4 ? 2 : 1; }

class Transport {
 public:
  // requester.cc
  static void requester(Qp& qp, io::TxBatch& tx, Nanos now);
  // responder.cc (a request packet for this QP; the QP is in RTR or later)
  static void responder(Qp& qp, wire::PacketView pkt, const io::RxPacket& rx, io::TxBatch& tx, Nanos now);
  // Sends the coalesced ACK of the last burst, if any.
  static void flush_ack(Qp& qp, io::TxBatch& tx);
  // A post sends the ACK it was deferred to (after its own packets): an answer came in time.
  static void send_answered_ack(Qp& qp, io::TxBatch& tx) {
    if (qp.resp_.ack_pending) {
      qp.resp_.acks_expired = 0;
      qp.resp_.ack_backoffs = 0;
    }
    flush_ack(qp, tx);
  }
  // What was posted goes into `tx` (the requester), then, on RC, the ACK deferred to a post (end_burst).
  static void send_posted(Qp& qp, io::TxBatch& tx, Nanos now);
  // At the end of a receive burst: sends the coalesced ACK, or defers it to the QP's next post, for
  // kAckDeferNs at most (responder.cc).
  // Returns the deadline it armed (0: none new).
  static Nanos end_burst(Qp& qp, io::TxBatch& tx, Nanos now);
  static constexpr Nanos kAckDeferNs = 20'000;
  // ACKs sent at once after two deferred ones in a row went by their deadline: kAckBackoffMin the first
  // time, twice as many each time after, up to kAckBackoffMax, until an answer comes in time again.
  static constexpr uint32_t kAckBackoffMin = 4;
  static constexpr uint32_t kAckBackoffMax = 64;
  // completer.cc (a response packet for this QP)
  static void completer(Qp& qp, wire::PacketView pkt, io::TxBatch& tx, Nanos now);
  // For Context::rx_burst, on an RC QP: a request of the peer's came (`awaits_ack`: marked io::kAwaitsAck,
  // a lone WRITE whose sender polls for its ACK, lone_write_by_ring); an ACK came (completed_before:
  // completed() before it). True when that ACK completed WQEs and no request came between the QP's last
  // post and it, on a QP of a ping-pong: kPingPongAcks such ACKs came behind one (a peer that defers its
  // ACKs to its answers, end_burst), and fewer than kAloneAcks alone since. The peer's answer comes
  // after this ACK (Context::kKickWatch): its ACK went by the deadline, or it acknowledges at once for a
  // while after two did (kAckBackoffMin).
  static void request_came(Qp& qp, bool awaits_ack) {
    qp.comp_.request_since_post = true;
    if (awaits_ack) qp.req_.lone_since_request = 0;
  }
  static uint64_t completed(const Qp& qp) { return qp.comp_.wqe; }
  // Whether the WQE's completion goes to the CQ when it succeeds.
  static bool signaled(const Qp& qp, const SendWqe& w) {
    return qp.init_.sq_sig_all || (w.send_flags & kSendSignaled);
  }
  // UC: a signaled WRITE posted alone, sent as a packet, completes at once, and its application (a
  // ping-pong's, ib_write_lat -c UC) then spins on its memory for the peer's answer, which only the
  // progress thread, woken, would receive: 12-14 us typical per half round trip over sockets, 25-29 on
  // average, against RC's 6 (whose answer comes with the ACK it polls for). In a ping-pong of lone WRITEs
  // (kUcAnswers posted in a row, each after a request of the peer's came) its completion is held from
  // polls until the peer's next request comes, as RC's after an ACK that came alone (Context::rx_burst):
  // the application polls on and receives the answer itself. The hold lasts up to kUcAnswerHoldNs; one
  // that runs out ends the ping-pong until kUcAnswers more. At 20 us (RC's), 13% ran out (the machine's
  // pauses; the application then spun while the progress thread napped, 4 ms) and the average rose to
  // 141-406 us; at 200 us, 1-2 in 10,000.
  static void uc_answer_hold(Qp& qp, const SendWqe& w, Nanos now);
  // A request packet came on a UC QP (Context::rx_burst): notes a late answer, and ends the QP's hold at
  // the answer's last packet (`last`), kUcAnswerHoldNs after the latest at most. (Ended at the first, a
  // poll returned the completion with the rest of a 16 KiB answer to come, which then waited for the
  // napping progress thread: socket ib_write_lat -c UC 2 ms typical from 16 KiB, against 8 us at 8 KiB.)
  static void uc_request_came(Qp& qp, Nanos now, bool last) {
    CompState& c = qp.comp_;
    c.request_since_post = true;
    if (c.uc_hold_until != 0 && now >= c.uc_hold_until) c.uc_answers = 0;
    c.uc_hold_until = 0;
    if (last)
      qp.init_.send_cq->release_hold();
    else
      qp.init_.send_cq->extend_hold(now + kUcAnswerHoldNs);
  }
  static constexpr uint8_t kUcAnswers = 2;
  static constexpr Nanos kUcAnswerHoldNs = 200'000;
  static bool ack_came_alone(Qp& qp, uint64_t completed_before);
  // Whether the QP has nothing left to complete while its responder is in the middle of a message of the
  // peer's: the answer to what just completed has begun and more of it is to come.
  static bool answer_underway(const Qp& qp) { return sq_empty(qp) && qp.resp_.last_opcode != 0xFF; }
  // Whether every WQE posted on the QP has completed: an application that polls now waits for nothing else
  // of this QP's (a ping-pong's, whose completion may be held for the answer).
  static bool sq_empty(const Qp& qp) { return qp.comp_.wqe == qp.sq_head_; }
  // Whether a signaled WRITE posted alone goes to a same-host peer through the ring (requester.cc).
  static bool lone_write_by_ring(Qp& qp, const SendWqe& w);
  static constexpr uint8_t kPingPongAcks = 8;
  // An ACK timeout waits for a same-host peer that is behind (io::Backend::peer_behind) at most this many
  // times in a row between ACKs that make progress: the ring says that the peer reads, not that this QP's
  // packet is in it (one dropped at a full ring is not), so a loss is still resent within 3 timeouts.
  static constexpr uint8_t kMaxRetryWaits = 2;
  static constexpr uint16_t kAloneAcks = 256;
  // Context::rx_burst leaves what ACKs released in its batch until the end of the burst (one send call
  // for the packets of many QPs); until then a post on another thread must not send this QP's later
  // packets ahead of them (the peer would NAK the gap), so it waits as behind packets in flight
  // (Qp::post_send). Under the QP's lock.
  static void hold_tx(Qp& qp) { qp.tx_held_ = true; }
  static bool tx_held(const Qp& qp) { return qp.tx_held_; }
  // Ends the hold, once the batch is sent: what was posted meanwhile goes into `tx` now; the caller sends
  // it before the QP's lock goes. Returns whether the requester ran. Nothing else is sure to send such a
  // post: its QP may have no packet out (no ACK to come, no timer armed), and its poster's list of
  // corked QPs (Context::corked) may have had no room for it.
  static bool release_tx(Qp& qp, io::TxBatch& tx, Nanos now);
  // Expired timers; returns the QP's next deadline (0 = none).
  static Nanos timers(Qp& qp, io::TxBatch& tx, Nanos now);
  // qp_state.cc
  static int modify(Qp& qp, const QpAttr& attr, uint32_t mask);
  // Moves the QP to ERROR and flushes every outstanding WQE (IBTA.md 9).
  static void to_error(Qp& qp);
  static void reset(Qp& qp);

  // Shared helpers
  static io::TxPacket& new_packet(Qp& qp, io::TxBatch& tx, const wire::Endpoint& dst, uint8_t opcode, bool se,
                                  uint32_t dqpn, bool ack_req, uint32_t psn, uint32_t payload_len);
  static void complete_send(Qp& qp, SendWqe& w, WcStatus status);
  // Completes, in order, the WQEs at the head of the SQ that are done; an error moves the QP to ERROR.
  static void retire(Qp& qp);
  static void complete_recv(Qp& qp, const Wc& wc, bool solicited);
  static bool pop_rq(Qp& qp, RecvWqe* out) { return qp.rq_.pop(out); }
  static void go_back_n(Qp& qp);
  // Points the requester at the oldest unacknowledged PSN: its WQE and, in a WQE partly acknowledged (or
  // partly read), where the acknowledged part ends. (go_back_n resends from there; probe sends one packet.)
  static void rewind_requester(Qp& qp) {
    ReqState& req = qp.req_;
    const CompState& comp = qp.comp_;
    req.offset = 0;
    if (comp.wqe < qp.sq_head_) {
      const SendWqe& w = qp.sq_[comp.wqe & qp.sq_mask_];
      if (w.started && wire::psn_diff(comp.psn, w.first_psn) > 0)
        req.offset = static_cast<uint32_t>(wire::psn_diff(comp.psn, w.first_psn)) * qp.pmtu_;
    }
    req.wqe = comp.wqe;
    req.psn = comp.psn;
  }
  // Moves past the packet just sent at `now`; times the round trip of a first sending when none is timed.
  static void advance_psn(Qp& qp, uint32_t next, Nanos now);
  static void fail_head(Qp& qp, WcStatus status);
  // The QP's nearest armed timer (0 = none).
  static Nanos deadline(const Qp& qp) {
    Nanos d = 0;
    for (Nanos t : {qp.comp_.retrans_deadline, qp.comp_.early_deadline, qp.comp_.rnr_deadline,
                    qp.req_.cork_deadline, qp.resp_.ack_deadline})
      if (t && (!d || t < d)) d = t;
    return d;
  }
  static Nanos ack_timeout_ns(uint8_t timeout) { return timeout ? 4096ull << timeout : 0; }
  // Early retransmission: when packets are out and no ACK has made progress for some round trips (RFC
  // 6298's timeout from the QP's timed round trips, at least kEarlyMinNs, doubled per early retransmission
  // in a row), the requester goes back to the oldest unacknowledged PSN before the QP's ACK timeout, as
  // RDMA NICs' adaptive retransmission does. The responder NAKs a gap once (IBTA.md 7), so a lost
  // retransmission, a lost NAK or a lost last packet is otherwise found only by that timeout, 67 ms at
  // perftest's timeout 14: at 1% loss most of a 1 MiB ib_write_bw's time. It spends no retry (retry_cnt
  // counts ACK timeouts, whose deadline it leaves where it was), and it is off until an ACK of the peer's
  // made progress, with timeout 0 (no timer, as rxe), and where its wait would reach half the ACK timeout. At
  // least 5 ms: a peer that the scheduler held back for a tick (4 ms at HZ 250) has lost nothing.
  static constexpr Nanos kEarlyMinNs = 5'000'000;
  // A loss probe (after TCP's tail loss probe, RFC 8985), the early retransmission's first stage after a
  // loss, until the window has grown whole again: after twice the round trip, at least kProbeMinNs, the
  // requester sends its oldest unacknowledged packet again, once, asking for an ACK. The responder answers
  // it either way (a duplicate is re-ACKed with all it has; a missing packet is taken in order and ACKed),
  // and an answer that leaves packets outstanding means they were lost, or their NAK was (the responder
  // NAKs a gap once and drops the rest silently): the requester goes back at once (probe_answered). With
  // no answer, the go-back-N comes after the early retransmission's wait, again. What it is for: the
  // responder coalesces a burst's ACKs into one, so a small window (after a loss) that arrived whole had
  // one ACK, and when it was lost the requester had nothing more to send and waited 5 ms for a go-back-N,
  // as after a lost retransmission or a lost NAK: about 75 times per 100 MiB at 1% loss and path MTU 1024.
  // Not while the peer still reads a queue that holds the packets (as the early retransmission), nor with
  // a READ or ATOMIC at the head, nor where kProbeMinNs is over an eighth of the ACK timeout. Only after a
  // loss: where nothing was lost, the early retransmission waits as before.
  static constexpr Nanos kProbeMinNs = 1'000'000;
  [[gnu::cold]] static bool probe_stage(const Qp& qp);
  [[gnu::cold]] static Nanos probe_wait(const Qp& qp,
                                        Nanos rto);  // the early wait, shortened if a probe is due
  // Sends the probe; false where there is no packet to probe with (then go back instead).
  [[gnu::cold]] static bool probe(Qp& qp, io::TxBatch& tx, Nanos now);
  // An ACK made progress after a probe: goes back at once if packets are still outstanding, else on.
  [[gnu::cold]] static void probe_answered(Qp& qp, io::TxBatch& tx, Nanos now);
  // A loss (a NAK of a PSN gap, a READ response missing, an ACK timeout, an early retransmission) halves
  // the QP's send window, down to kMinLossWindow packets, and each ACK that makes progress grows it by an
  // eighth of the packets it acknowledged, until it is full again. Go-back-N resends what was in flight
  // behind the lost packet, so at 1% loss a full window (1,024 packets at path MTU 1024) was resent about
  // ten times over; where nothing is lost the window stays full.
  static constexpr uint32_t kMinLossWindow = 16;
  // A loss: halves the window so, goes back to the oldest unacknowledged PSN and resends from there.
  static void resend_after_loss(Qp& qp, io::TxBatch& tx, Nanos now);
  static constexpr uint8_t kEarlyMaxBackoff = 16;
  static Nanos early_timeout(const Qp& qp);
  static Nanos rnr_delay_ns(uint8_t code);
};

}  // namespace softrdma::core
