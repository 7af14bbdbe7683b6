// The responder: checks and executes request packets (SEND, WRITE, READ, ATOMIC), and answers them with
// ACKs (coalesced per receive burst), NAKs, READ responses and ATOMIC ACKs (IBTA.md 3, 5, 10; rxe_resp.c).
#include <cstring>

#include "core/context.h"
#include "transport/transport.h"

namespace softrdma::core {
namespace {

using namespace wire;

Counter nak_counter(uint8_t code) {
  switch (code) {
    case kNakPsnSeqErr:
      return Counter::tx_nak_psn_seq;
    case kNakInvalidRequest:
      return Counter::tx_nak_inv_req;
    case kNakRemoteAccessErr:
      return Counter::tx_nak_rem_access;
    default:
      return Counter::tx_nak_rem_op;
  }
}

// The 40-byte GRH a UD receive buffer starts with (IBTA.md 8): for IPv4, 20 zero bytes and then the IPv4
// header as received (rebuilt here from what the socket reports); for IPv6, the IPv6 header.
void build_grh(const io::RxPacket& rx, uint32_t udp_payload_len, uint8_t out[kGrhLen]) {
  std::memset(out, 0, kGrhLen);
  if (rx.src.addr.is_v4()) {
    uint8_t* ip = out + 20;
    const uint16_t total = static_cast<uint16_t>(20 + 8 + udp_payload_len);
    ip[0] = 0x45;
    ip[1] = rx.tos;
    store_be16(ip + 2, total);
    store_be16(ip + 6, 0x4000);
    ip[8] = rx.ttl;
    ip[9] = 17;
    std::memcpy(ip + 12, &rx.src.addr.raw[12], 4);
    std::memcpy(ip + 16, &rx.dst.addr.raw[12], 4);
    uint32_t sum = 0;
    for (int i = 0; i < 20; i += 2) sum += load_be16(ip + i);
    while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
    store_be16(ip + 10, static_cast<uint16_t>(~sum));
  } else {
    out[0] = static_cast<uint8_t>(0x60 | (rx.tos >> 4));
    out[1] = static_cast<uint8_t>(rx.tos << 4);
    store_be16(out + 4, static_cast<uint16_t>(8 + udp_payload_len));
    out[6] = 17;
    out[7] = rx.ttl;
    std::memcpy(out + 8, rx.src.addr.raw.data(), 16);
    std::memcpy(out + 24, rx.dst.addr.raw.data(), 16);
  }
}

enum class Place { kOk, kTooLong, kBadSge };

// Copies payload into a receive WQE at `offset`, checking every SGE against its MR (local write access,
// bounds, the QP's PD).
Place place_recv(Context* ctx, Pd* pd, const RecvWqe& wqe, uint32_t offset, const uint8_t* src, uint32_t len) {
  if (uint64_t{offset} + len > wqe.length) return Place::kTooLong;
  uint32_t i = 0;
  while (i < wqe.num_sge && offset >= wqe.sge[i].length) offset -= wqe.sge[i++].length;
  while (len > 0 && i < wqe.num_sge) {
    const Sge& s = wqe.sge[i];
    const uint32_t n = std::min(len, s.length - offset);
    MrRef mr = ctx->mrs().find(s.lkey);
    if (!mr || mr->pd != pd || !(mr->access & kLocalWrite) || !mr->contains(s.addr + offset, n))
      return Place::kBadSge;
    std::memcpy(mr->host(s.addr + offset), src, n);
    src += n;
    len -= n;
    offset = 0;
    ++i;
  }
  return Place::kOk;
}

}  // namespace

// Responses go to the peer's endpoint; the coalesced ACK goes first so PSNs stay in order on the wire.
static io::TxPacket& response(Qp& qp, io::TxBatch& tx, uint8_t op, uint32_t psn, uint32_t payload_len) {
  return Transport::new_packet(qp, tx, qp.ctx()->peer_endpoint(qp.attr().ah_attr.dgid, qp.attr().dest_qp_num),
                               opcode(wire::Transport::kRc, static_cast<Op>(op)), false, qp.attr().dest_qp_num,
                               false, psn, payload_len);
}

void Transport::flush_ack(Qp& qp, io::TxBatch& tx) {
  RespState& r = qp.resp_;
  r.ack_deadline = 0;
  if (!r.ack_pending) return;
  r.ack_pending = false;
  io::TxPacket& p = response(qp, tx, kOpAcknowledge, r.ack_psn, 0);
  PacketView(p.hdr, p.hdr_len).set_aeth(r.ack_syndrome, r.ack_msn);
  qp.ctx()->counters().add(Counter::tx_acks);
}

// The ACK of a QP that sends too waits for that QP's next post, which sends it after its own packets
// (qp.cc, run_requester), or for kAckDeferNs. In a ping-pong the answer then reaches the peer before the
// ACK that the peer's application polls for, so that application is still polling when the answer comes
// and receives it itself; sent first, the ACK ended its poll, and the answer waited for the progress
// thread's wake-up (ib_write_lat spins on memory after it polls). Measured, 8-byte ib_write_lat over UDP:
// typical half round trip 17-20 -> 5-6 us; ib_send_lat 12 -> 6 us. IBTA lets a responder coalesce ACKs;
// the requester's timeout is milliseconds. Acknowledged at once:
// - by a QP that never posted a send (ib_write_bw's server): it has no answer to wait for;
// - by a QP with a completion channel: its application waits for events, not polls, so an answer that
//   overtakes the ACK finds no poll to end (rping, whose server waits for a WRITE's completion before it
//   sends, took 1.5 ms more per ping);
// - for a while after two in a row went by their deadline (kAckBackoffMin ACKs, twice as many each time
//   it happens again, up to kAckBackoffMax, until an answer comes in time): a protocol whose answer
//   waits for the ACK (a WRITE, then a SEND once it completed) pays the deadline twice in that many.
//   (After one late ACK, ib_write_lat lost the order for 64 iterations: 5-6 -> 11-14 us average. Its
//   first iterations are slow, and a fixed 64 after them, each iteration a wake-up of the progress
//   thread, took 3-4 ms in 5 of 12 socket-path runs of 5,000: 0.8-1.3 us on their average.)
Nanos Transport::end_burst(Qp& qp, io::TxBatch& tx, Nanos now) {
  RespState& r = qp.resp_;
  if (!r.ack_pending) return 0;
  // In the middle of a message: no answer can come before its end, and its sender may be waiting for this
  // ACK to send the rest (its window, 256 packets, is 1 MiB at 4 KiB).
  if (r.last_opcode != 0xFF) {
    flush_ack(qp, tx);
    return 0;
  }
  if (qp.sq_head_ == 0 || qp.init().recv_cq->events_awaited(now) || qp.init().send_cq->events_awaited(now) ||
      r.acks_undeferred) {
    if (r.acks_undeferred) --r.acks_undeferred;
    flush_ack(qp, tx);
    return 0;
  }
  if (r.ack_deadline) return 0;
  qp.ctx()->counters().add(Counter::acks_deferred);
  r.ack_deadline = now + kAckDeferNs;
  return r.ack_deadline;
}

namespace {

struct Responder {
  Qp& qp;
  RespState& r;
  PacketView pkt;
  const io::RxPacket& rx;
  io::TxBatch& tx;
  Counters& counters;
  Nanos at;  // the burst's clock (Transport::responder's `now`)

  void send_ack(uint8_t syndrome, uint32_t psn, bool now) {
    // Coalesce: a later ACK covers an earlier one (ACKs are cumulative).
    r.ack_pending = true;
    r.ack_psn = psn;
    r.ack_syndrome = syndrome;
    r.ack_msn = r.msn;
    if (now) Transport::flush_ack(qp, tx);
  }
  void send_nak(uint8_t syndrome, uint32_t psn) {
    Transport::flush_ack(qp, tx);
    io::TxPacket& p = response(qp, tx, kOpAcknowledge, psn, 0);
    PacketView(p.hdr, p.hdr_len).set_aeth(syndrome, r.msn);
    if (syndrome_type(syndrome) == AckType::kRnrNak)
      counters.add(Counter::tx_rnr_nak);
    else
      counters.add(nak_counter(syndrome_value(syndrome)));
  }

  // A fatal request error: NAK (RC), complete the receive WQE in use with `recv_status`, QP to ERROR.
  void fatal(uint8_t nak_code, WcStatus recv_status) {
    if (qp.type() == QpType::kRc) send_nak(make_syndrome(AckType::kNak, nak_code), pkt.psn());
    if (r.have_wqe) {
      Wc wc;
      wc.wr_id = r.wqe.wr_id;
      wc.status = recv_status;
      wc.qp_num = qp.qpn();
      wc.opcode = WcOpcode::kRecv;
      r.have_wqe = false;
      Transport::complete_recv(qp, wc, false);
    }
    if (qp.type() == QpType::kRc) {
      Transport::to_error(qp);
      // The responder's errors as the IBTA names them (11.6.3.1): an invalid request, a local access
      // violation, or another (catastrophic) one.
      qp.ctx()->raise(nak_code == kNakInvalidRequest     ? kEventQpReqErr
                      : nak_code == kNakRemoteAccessErr ? kEventQpAccessErr
                                                        : kEventQpFatal,
                      &qp);
    } else {
      // UC: drop the message and wait for the next one (IBTA.md 10, UC row).
      r.uc_drop = true;
      r.write_mr.reset();
      counters.add(Counter::drop_uc_msg);
    }
  }

  bool take_wqe() {
    if (r.have_wqe) return true;
    Srq* srq = qp.init().srq;
    const bool ok = srq ? srq->pop(&r.wqe) : Transport::pop_rq(qp, &r.wqe);
    if (ok) r.have_wqe = true;
    return ok;
  }

  // Looks up and checks the MR a remote access targets (IBTA.md 10 first row).
  MrRef remote_mr(uint32_t rkey, uint64_t va, uint64_t len, uint32_t access) {
    MrRef mr = qp.ctx()->mrs().find(rkey);
    if (!mr || mr->pd != qp.pd() || !(mr->access & access) || !mr->contains(va, len)) return {};
    return mr;
  }

  void complete_message() {
    const OpcodeInfo& oi = pkt.info();
    Wc wc;
    wc.wr_id = r.wqe.wr_id;
    wc.qp_num = qp.qpn();
    wc.src_qp = qp.attr().dest_qp_num;
    wc.wc_flags = kWcGrh;  // rxe reports a GRH on every user receive completion (IBTA.md 12 #10)
    if (oi.has(kWrite)) {
      wc.opcode = WcOpcode::kRecvRdmaWithImm;
      wc.byte_len = r.offset;
    } else {
      wc.opcode = WcOpcode::kRecv;
      wc.byte_len = r.offset;
    }
    if (oi.has(kHasImmDt)) {
      wc.wc_flags |= kWcWithImm;
      wc.imm_data = pkt.imm_be();
    }
    if (oi.has(kHasIeth)) {
      wc.wc_flags |= kWcWithInv;
      wc.imm_data = pkt.ieth_rkey();
    }
    r.have_wqe = false;
    Transport::complete_recv(qp, wc, pkt.se());
  }

  void duplicate() {
    const OpcodeInfo& oi = pkt.info();
    const uint32_t psn = pkt.psn();
    counters.add(Counter::dup_requests);
    if (oi.any(kSend | kWrite)) {
      // Every duplicate SEND/WRITE packet gets an ACK of the last executed PSN (IBTA.md 5).
      send_ack(make_syndrome(AckType::kAck, kAckUnlimitedCredit), psn_add(r.psn, kPsnMask), false);
      return;
    }
    if (oi.has(kReadReq)) return duplicate_read(psn);
    for (RespResource& res : r.res) {
      if (res.valid && res.atomic && oi.has(kAtomic) && res.first_psn == psn) {
        // Never execute an atomic twice: resend the saved result.
        Transport::flush_ack(qp, tx);
        send_atomic_ack(psn, res.atomic_orig, res.msn);
        return;
      }
    }
  }

  // A READ is idempotent: a duplicate is executed again from memory, with every check of a new one (its
  // range need not match an earlier request: a requester that resumes a READ after a loss asks from the
  // first missing PSN, across the chunks it sent before). The part of it beyond the expected PSN, if any,
  // is new work.
  void duplicate_read(uint32_t psn) {
    const uint64_t va = pkt.reth_va();
    const uint32_t len = pkt.reth_len();
    MrRef mr = remote_mr(pkt.reth_rkey(), va, len, kRemoteRead);
    if (!mr && len > 0) return fatal(kNakRemoteAccessErr, WcStatus::kRemAccessErr);
    const uint32_t n = len == 0 ? 1 : (len + qp.pmtu() - 1) / qp.pmtu();
    const uint32_t last = psn_add(psn, n - 1);
    uint32_t msn = r.msn;
    for (const RespResource& res : r.res)
      if (res.valid && !res.atomic && psn_diff(psn, res.first_psn) >= 0 && psn_diff(psn, res.last_psn) <= 0)
        msn = res.msn;
    if (psn_diff(last, r.psn) >= 0) {
      r.msn = (r.msn + 1) & 0xFFFFFF;
      msn = r.msn;
      r.psn = psn_add(last, 1);
    }
    Transport::flush_ack(qp, tx);
    send_read_responses(mr, va, len, psn, msn);
  }

  void send_read_responses(const MrRef& mr, uint64_t va, uint32_t len, uint32_t psn, uint32_t msn) {
    const uint32_t pmtu = qp.pmtu();
    const uint32_t n = len == 0 ? 1 : (len + pmtu - 1) / pmtu;
    for (uint32_t i = 0; i < n; ++i) {
      const uint32_t chunk = std::min(pmtu, len - i * pmtu);
      const uint8_t op = n == 1 ? kOpReadRespOnly : i == 0 ? kOpReadRespFirst : i + 1 == n ? kOpReadRespLast
                                                                                             : kOpReadRespMiddle;
      io::TxPacket& p = response(qp, tx, op, psn_add(psn, i), chunk);
      PacketView v(p.hdr, p.hdr_len);
      if (v.info().has(kHasAeth)) v.set_aeth(make_syndrome(AckType::kAck, kAckUnlimitedCredit), msn);
      if (chunk) p.iov[p.n_iov++] = {mr->host(va + uint64_t{i} * pmtu), chunk};
    }
  }

  void send_atomic_ack(uint32_t psn, uint64_t orig, uint32_t msn) {
    io::TxPacket& p = response(qp, tx, kOpAtomicAcknowledge, psn, 0);
    PacketView v(p.hdr, p.hdr_len);
    v.set_aeth(make_syndrome(AckType::kAck, kAckUnlimitedCredit), msn);
    v.set_atomic_ack_orig(orig);
  }

  RespResource& new_resource() {
    RespResource& res = r.res[r.res_next];
    r.res_next = (r.res_next + 1) % r.res.size();
    res = RespResource{};
    res.valid = true;
    return res;
  }

  // Is this packet allowed after the previous one of the current message? (IBTA.md 10, "missing FIRST/LAST")
  bool in_sequence(const OpcodeInfo& oi) const {
    const bool mid_send = r.last_opcode != 0xFF && info(r.last_opcode).has(kSend);
    const bool mid_write = r.last_opcode != 0xFF && info(r.last_opcode).has(kWrite);
    if (mid_send) return oi.has(kSend) && oi.any(kMiddle | kLast);
    if (mid_write) return oi.has(kWrite) && oi.any(kMiddle | kLast);
    return !oi.any(kMiddle | kLast);
  }

  void run() {
    const OpcodeInfo& oi = pkt.info();
    const uint32_t psn = pkt.psn();
    const bool rc = qp.type() == QpType::kRc;
    const uint32_t pmtu = qp.pmtu();

    if (rc) {
      const int32_t d = psn_diff(psn, r.psn);
      if (d > 0) {
        // Ahead of the expected PSN: one NAK per gap, then silence (IBTA.md 5, 12 #7).
        counters.add(Counter::drop_out_of_seq);
        if (!r.sent_psn_nak) {
          r.sent_psn_nak = true;
          send_nak(make_syndrome(AckType::kNak, kNakPsnSeqErr), r.psn);
        }
        return;
      }
      if (d < 0) return duplicate();
      r.sent_psn_nak = false;
    } else {
      // UC: a lost packet drops the rest of its message; a FIRST/ONLY starts afresh (IBTA.md 5).
      if (oi.any(kStart)) {
        r.uc_drop = false;
        r.last_opcode = 0xFF;
        r.offset = 0;
        r.write_mr.reset();
      } else if (r.uc_drop || psn != r.psn) {
        if (!r.uc_drop) counters.add(Counter::drop_uc_msg);
        r.uc_drop = true;
        r.psn = psn_add(psn, 1);
        return;
      }
    }

    if (!in_sequence(oi)) return fatal(kNakInvalidRequest, WcStatus::kRemInvReqErr);
    if (oi.any(kStart)) r.offset = 0;
    const uint32_t qp_access = qp.attr().qp_access_flags;
    if ((oi.has(kWrite) && !(qp_access & kRemoteWrite)) || (oi.has(kReadReq) && !(qp_access & kRemoteRead)) ||
        (oi.has(kAtomic) && !(qp_access & kRemoteAtomic)))
      return fatal(kNakInvalidRequest, WcStatus::kRemInvReqErr);
    if (oi.any(kReadReq | kAtomic) && qp.attr().max_dest_rd_atomic == 0)
      return fatal(kNakInvalidRequest, WcStatus::kRemInvReqErr);

    const uint32_t len = pkt.payload_len();
    if (oi.has(kPayload)) {
      const bool full = oi.any(kFirst | kMiddle);
      if ((full && len != pmtu) || len > pmtu || (oi.has(kLast) && len == 0))
        return fatal(kNakInvalidRequest, WcStatus::kRemInvReqErr);
    }

    // Receive WQE first: without one, RNR NAK and nothing executes (the requester retries this PSN).
    if (oi.has(kRwqe) && !take_wqe()) {
      if (rc) {
        send_nak(make_syndrome(AckType::kRnrNak, qp.attr().min_rnr_timer), psn);
      } else {
        r.uc_drop = true;
        r.psn = psn_add(psn, 1);
        counters.add(Counter::drop_uc_msg);
      }
      return;
    }

    if (oi.has(kReadReq)) return read_request(psn);
    if (oi.has(kAtomic)) return atomic_request(psn);

    if (oi.has(kWrite)) {
      if (oi.has(kHasReth)) {
        // A zero-length WRITE names no memory: its R_Key and VA are not checked (C9-88, as rxe does).
        r.write_mr.reset();
        if (pkt.reth_len() > 0) {
          r.write_mr = remote_mr(pkt.reth_rkey(), pkt.reth_va(), pkt.reth_len(), kRemoteWrite);
          if (!r.write_mr) return fatal(kNakRemoteAccessErr, WcStatus::kRemAccessErr);
        }
        r.write_va = pkt.reth_va();
        r.write_resid = pkt.reth_len();
      }
      if (len > r.write_resid || (len > 0 && !r.write_mr))
        return fatal(kNakInvalidRequest, WcStatus::kRemInvReqErr);
      if (len) std::memcpy(r.write_mr->host(r.write_va), pkt.payload(), len);
      r.write_va += len;
      r.write_resid -= len;
      r.offset += len;
      if (oi.any(kEnd)) {
        if (r.write_resid != 0) return fatal(kNakInvalidRequest, WcStatus::kRemInvReqErr);
        r.write_mr.reset();
      }
    } else {  // SEND
      const Place pl = place_recv(qp.ctx(), qp.pd(), r.wqe, r.offset, pkt.payload(), len);
      if (pl == Place::kTooLong) return fatal(kNakInvalidRequest, WcStatus::kLocLenErr);
      if (pl == Place::kBadSge) return fatal(kNakRemoteOpErr, WcStatus::kLocQpOpErr);
      r.offset += len;
    }

    r.last_opcode = oi.any(kEnd) ? 0xFF : pkt.opcode();
    r.psn = psn_add(psn, 1);
    if (oi.any(kEnd)) r.msn = (r.msn + 1) & 0xFFFFFF;
    const bool recv_comp = oi.any(kEnd) && oi.has(kRecvComp);
    if (rc && pkt.ack_req()) {
      // The ACK goes with the burst's others (ACK coalescing): an ACK and a send call per message held
      // 8-byte ib_send_bw at 0.2 M messages/s. A message that an application waiting on a completion
      // channel will see must not be answered ahead of its ACK, as on a NIC (ib_send_lat -e waits for the
      // send completion and the answer in that order, on one channel, and stalled when they crossed): a
      // post on this QP waits until the burst's ACKs are sent (hold_tx; Context::rx_burst). Until
      // 2026-12-04 such an ACK was sent at once, a send call each: socket ib_send_bw -e ran at 0.14 M
      // 8-byte messages/s (now 1.2-1.5), and at 4 KiB fell behind into RNR NAKs (450-580 MiB/s, now
      // 1,900-2,900).
      send_ack(make_syndrome(AckType::kAck, kAckUnlimitedCredit), psn, false);
      if (recv_comp && qp.init().recv_cq->events_awaited(at)) Transport::hold_tx(qp);
    }
    if (recv_comp) complete_message();
  }

  void read_request(uint32_t psn) {
    const uint64_t va = pkt.reth_va();
    const uint32_t len = pkt.reth_len();
    MrRef mr = remote_mr(pkt.reth_rkey(), va, len, kRemoteRead);
    if (!mr && len > 0) return fatal(kNakRemoteAccessErr, WcStatus::kRemAccessErr);
    const uint32_t pmtu = qp.pmtu();
    const uint32_t n = len == 0 ? 1 : (len + pmtu - 1) / pmtu;
    r.msn = (r.msn + 1) & 0xFFFFFF;  // counted when the request is accepted (C9-148)
    RespResource& res = new_resource();
    res.first_psn = psn;
    res.last_psn = psn_add(psn, n - 1);
    res.va = va;
    res.rkey = pkt.reth_rkey();
    res.length = len;
    res.msn = r.msn;
    r.psn = psn_add(psn, n);
    Transport::flush_ack(qp, tx);
    send_read_responses(mr, va, len, psn, r.msn);
  }

  void atomic_request(uint32_t psn) {
    const uint64_t va = pkt.atomic_va();
    if (va & 7) return fatal(kNakInvalidRequest, WcStatus::kRemInvReqErr);
    MrRef mr = remote_mr(pkt.atomic_rkey(), va, 8, kRemoteAtomic);
    if (!mr) return fatal(kNakRemoteAccessErr, WcStatus::kRemAccessErr);
    // The CPU's atomics on the target, so atomics from many QPs (and processes) are correct together.
    auto* target = reinterpret_cast<uint64_t*>(mr->host(va));
    uint64_t orig;
    if (pkt.opcode() == opcode(wire::Transport::kRc, kOpCompareSwap)) {
      orig = pkt.atomic_compare();
      __atomic_compare_exchange_n(target, &orig, pkt.atomic_swap_add(), false, __ATOMIC_SEQ_CST,
                                  __ATOMIC_SEQ_CST);
    } else {
      orig = __atomic_fetch_add(target, pkt.atomic_swap_add(), __ATOMIC_SEQ_CST);
    }
    r.msn = (r.msn + 1) & 0xFFFFFF;
    RespResource& res = new_resource();
    res.atomic = true;
    res.first_psn = res.last_psn = psn;
    res.va = va;
    res.rkey = pkt.atomic_rkey();
    res.length = 8;
    res.atomic_orig = orig;
    res.msn = r.msn;
    r.psn = psn_add(psn, 1);
    Transport::flush_ack(qp, tx);
    send_atomic_ack(psn, orig, r.msn);
  }
};

// UD: one packet, one message; Q_Key checked, GRH first in the buffer, no answers (IBTA.md 8).
void ud_receive(Qp& qp, PacketView pkt, const io::RxPacket& rx, Counters& counters, RecvWqe& wqe) {
  const uint32_t len = pkt.payload_len();
  uint8_t grh[kGrhLen];
  build_grh(rx, pkt.length() + kIcrcLen, grh);
  Wc wc;
  wc.wr_id = wqe.wr_id;
  wc.qp_num = qp.qpn();
  wc.src_qp = pkt.deth_src_qpn();
  wc.sl = ud_wc_sl(rx.src.addr.is_v4());
  wc.opcode = WcOpcode::kRecv;
  wc.wc_flags = kWcGrh;
  if (pkt.info().has(kHasImmDt)) {
    wc.wc_flags |= kWcWithImm;
    wc.imm_data = pkt.imm_be();
  }
  Place pl = place_recv(qp.ctx(), qp.pd(), wqe, 0, grh, kGrhLen);
  if (pl == Place::kOk) pl = place_recv(qp.ctx(), qp.pd(), wqe, kGrhLen, pkt.payload(), len);
  if (pl == Place::kTooLong) {
    counters.add(Counter::drop_ud_too_long);
    wc.status = WcStatus::kLocLenErr;
  } else if (pl == Place::kBadSge) {
    wc.status = WcStatus::kLocProtErr;
  }
  wc.byte_len = wc.status == WcStatus::kSuccess ? len + kGrhLen : 0;
  Transport::complete_recv(qp, wc, pkt.se());
}

}  // namespace

void Transport::responder(Qp& qp, PacketView pkt, const io::RxPacket& rx, io::TxBatch& tx, Nanos now) {
  Counters& counters = qp.ctx()->counters();
  if (qp.type() == QpType::kUd) {
    if (pkt.deth_qkey() != qp.attr_.qkey) {
      counters.add(Counter::drop_bad_qkey);
      return;
    }
    RecvWqe wqe;
    Srq* srq = qp.init_.srq;
    if (!(srq ? srq->pop(&wqe) : pop_rq(qp, &wqe))) {
      counters.add(Counter::drop_ud_no_wqe);
      return;
    }
    return ud_receive(qp, pkt, rx, counters, wqe);
  }
  Responder{qp, qp.resp_, pkt, rx, tx, counters, now}.run();
  // UC: tells a same-host requester that this packet, and every one before it, is done with (its data
  // placed), so that its next WRITE may go one-sided without overtaking them (io::DirectOp::uc).
  if (qp.psn_seen_) qp.psn_seen_->store(psn_add(pkt.psn(), 1), std::memory_order_release);
}

}  // namespace softrdma::core
