// The QP state machine: the transitions the IBTA allows, with their required and optional attributes
// (IBTA.md 9, the kernel's qp_state_table), and what entering each state does.
#include <bit>

#include "core/context.h"
#include "transport/transport.h"

namespace softrdma::core {
namespace {

struct Rule {
  bool valid = false;
  uint32_t req = 0;
  uint32_t opt = 0;
};

// Index: 0 UD, 1 UC, 2 RC.
Rule rule(QpState cur, QpState next, QpType type) {
  const int t = type == QpType::kUd ? 0 : type == QpType::kUc ? 1 : 2;
  auto pick = [t](Rule ud, Rule uc, Rule rc) { return t == 0 ? ud : t == 1 ? uc : rc; };
  using S = QpState;
  if (next == S::kReset || next == S::kErr) return {true, 0, 0};
  switch (cur) {
    case S::kReset:
      if (next == S::kInit)
        return pick({true, kQpPkeyIndex | kQpPort | kQpQkey, 0},
                    {true, kQpPkeyIndex | kQpPort | kQpAccessFlags, 0},
                    {true, kQpPkeyIndex | kQpPort | kQpAccessFlags, 0});
      break;
    case S::kInit:
      if (next == S::kInit)
        return pick({true, 0, kQpPkeyIndex | kQpPort | kQpQkey}, {true, 0, kQpPkeyIndex | kQpPort | kQpAccessFlags},
                    {true, 0, kQpPkeyIndex | kQpPort | kQpAccessFlags});
      if (next == S::kRtr)
        return pick({true, 0, kQpPkeyIndex | kQpQkey},
                    {true, kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn, kQpAltPath | kQpAccessFlags | kQpPkeyIndex},
                    {true,
                     kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn | kQpMaxDestRdAtomic | kQpMinRnrTimer,
                     kQpAltPath | kQpAccessFlags | kQpPkeyIndex});
      break;
    case S::kRtr:
      if (next == S::kRts)
        return pick({true, kQpSqPsn, kQpCurState | kQpQkey},
                    {true, kQpSqPsn, kQpCurState | kQpAltPath | kQpAccessFlags | kQpPathMigState},
                    {true, kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpSqPsn | kQpMaxQpRdAtomic,
                     kQpCurState | kQpAltPath | kQpAccessFlags | kQpMinRnrTimer | kQpPathMigState});
      break;
    case S::kRts:
      if (next == S::kRts)
        return pick({true, 0, kQpCurState | kQpQkey},
                    {true, 0, kQpCurState | kQpAccessFlags | kQpAltPath | kQpPathMigState},
                    {true, 0, kQpCurState | kQpAccessFlags | kQpAltPath | kQpPathMigState | kQpMinRnrTimer});
      if (next == S::kSqd) return {true, 0, kQpEnSqdAsyncNotify};
      break;
    case S::kSqd:
      if (next == S::kRts)
        return pick({true, 0, kQpCurState | kQpQkey},
                    {true, 0, kQpCurState | kQpAltPath | kQpAccessFlags | kQpPathMigState},
                    {true, 0, kQpCurState | kQpAltPath | kQpAccessFlags | kQpMinRnrTimer | kQpPathMigState});
      if (next == S::kSqd)
        return pick({true, 0, kQpPkeyIndex | kQpQkey},
                    {true, 0, kQpAv | kQpAltPath | kQpAccessFlags | kQpPkeyIndex | kQpPathMigState},
                    {true, 0,
                     kQpPort | kQpAv | kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpMaxQpRdAtomic |
                         kQpMaxDestRdAtomic | kQpAltPath | kQpAccessFlags | kQpPkeyIndex | kQpMinRnrTimer |
                         kQpPathMigState});
      break;
    case S::kSqe:
      if (next == S::kRts && type != QpType::kRc)
        return pick({true, 0, kQpCurState | kQpQkey}, {true, 0, kQpCurState | kQpAccessFlags}, {});
      break;
    default:
      break;
  }
  return {};
}

uint8_t round_up_pow2(uint8_t v) { return v <= 1 ? v : static_cast<uint8_t>(std::bit_ceil(uint32_t{v})); }

}  // namespace

int Transport::modify(Qp& qp, const QpAttr& a, uint32_t mask) {
  QpAttr& cur = qp.attr_;
  const QpState from = (mask & kQpCurState) ? a.cur_qp_state : cur.qp_state;
  const QpState to = (mask & kQpState) ? a.qp_state : from;
  if ((mask & kQpCurState) && a.cur_qp_state != cur.qp_state) return EINVAL;
  if ((mask & kQpCurState) && !(from == QpState::kRtr || from == QpState::kRts || from == QpState::kSqd ||
                                from == QpState::kSqe))
    return EINVAL;
  const Rule r = rule(from, to, qp.type());
  if (!r.valid) return EINVAL;
  const uint32_t attrs = mask & ~(kQpState | kQpCurState);
  if ((attrs & r.req) != r.req || (attrs & ~(r.req | r.opt | kQpCurState)) != 0) return EINVAL;
  // Value checks, as rxe makes them (IBTA.md 9, "rxe extra checks").
  if ((mask & kQpPort) && a.port_num != 1) return EINVAL;
  if ((mask & kQpPkeyIndex) && a.pkey_index != 0) return EINVAL;
  if ((mask & kQpTimeout) && a.timeout > 31) return EINVAL;
  if ((mask & kQpRetryCnt) && a.retry_cnt > 7) return EINVAL;
  if ((mask & kQpRnrRetry) && a.rnr_retry > 7) return EINVAL;
  if ((mask & kQpMinRnrTimer) && a.min_rnr_timer > 31) return EINVAL;
  if ((mask & kQpMaxQpRdAtomic) && a.max_rd_atomic > kMaxRdAtomic) return EINVAL;
  if ((mask & kQpMaxDestRdAtomic) && a.max_dest_rd_atomic > kMaxRdAtomic) return EINVAL;
  if ((mask & kQpPathMtu) && (a.path_mtu < Mtu::k256 || a.path_mtu > Mtu::k4096)) return EINVAL;
  if ((mask & kQpAccessFlags) && (a.qp_access_flags & ~uint32_t{kLocalWrite | kRemoteWrite | kRemoteRead |
                                                                  kRemoteAtomic | kMwBind | kRelaxedOrdering}))
    return EINVAL;
  if ((mask & kQpAv) && a.ah_attr.dgid.is_zero()) return EINVAL;  // RoCE needs a GRH

  if (mask & kQpAccessFlags) cur.qp_access_flags = a.qp_access_flags;
  if (mask & kQpPkeyIndex) cur.pkey_index = a.pkey_index;
  if (mask & kQpPort) cur.port_num = a.port_num;
  if (mask & kQpQkey) cur.qkey = a.qkey;
  if (mask & kQpAv) cur.ah_attr = a.ah_attr;
  if (mask & kQpPathMtu) {
    cur.path_mtu = a.path_mtu;
    // The interface's MTU bounds what goes on the wire, whatever the path MTU says.
    qp.pmtu_ = std::min(mtu_bytes(a.path_mtu), qp.ctx()->config().active_mtu);
  }
  if (mask & kQpTimeout) cur.timeout = a.timeout;
  if (mask & kQpRetryCnt) cur.retry_cnt = a.retry_cnt;
  if (mask & kQpRnrRetry) cur.rnr_retry = a.rnr_retry;
  if (mask & kQpRqPsn) cur.rq_psn = a.rq_psn & wire::kPsnMask;
  if (mask & kQpMaxQpRdAtomic) cur.max_rd_atomic = round_up_pow2(a.max_rd_atomic);
  if (mask & kQpMinRnrTimer) cur.min_rnr_timer = a.min_rnr_timer;
  if (mask & kQpSqPsn) cur.sq_psn = a.sq_psn & wire::kPsnMask;
  if (mask & kQpMaxDestRdAtomic) cur.max_dest_rd_atomic = round_up_pow2(a.max_dest_rd_atomic);
  if (mask & kQpDestQpn) cur.dest_qp_num = a.dest_qp_num & wire::kQpnMask;
  if (mask & kQpEnSqdAsyncNotify) cur.en_sqd_async_notify = a.en_sqd_async_notify;
  if (mask & (kQpAv | kQpDestQpn)) {
    qp.peer_ = qp.ctx()->peer_endpoint(cur.ah_attr.dgid, cur.dest_qp_num);
    qp.path_cap_ = 0;
    if (qp.type() != QpType::kUd && !cur.ah_attr.dgid.is_zero()) {
      qp.ctx()->backend()->prepare_peer(qp.peer_);
      qp.path_cap_ = qp.ctx()->backend()->inflight_cap(qp.peer_);
    }
  }

  if (!(mask & kQpState)) return 0;
  switch (to) {
    case QpState::kReset:
      reset(qp);
      break;
    case QpState::kErr:
      to_error(qp);
      return 0;
    case QpState::kRtr:
      qp.resp_.psn = cur.rq_psn;
      qp.resp_.res.assign(std::max<uint32_t>(1, cur.max_dest_rd_atomic), RespResource{});
      qp.resp_.res_next = 0;
      break;
    case QpState::kRts:
      if (from == QpState::kRtr) {
        qp.req_.psn = qp.req_.high_psn = qp.comp_.psn = cur.sq_psn;
        qp.comp_.retry_left = cur.retry_cnt;
        qp.comp_.rnr_left = cur.rnr_retry;
      }
      break;
    case QpState::kSqd:
      // Draining lasts until every WQE already started has completed (retire() ends it).
      cur.sq_draining = qp.comp_.wqe != qp.req_.wqe || qp.req_.offset != 0;
      if (!cur.sq_draining && cur.en_sqd_async_notify) qp.ctx()->raise(kEventSqDrained, &qp);
      break;
    default:
      break;
  }
  cur.qp_state = to;
  return 0;
}

void Transport::to_error(Qp& qp) {
  qp.attr_.qp_state = QpState::kErr;
  qp.comp_.retrans_deadline = qp.comp_.early_deadline = qp.comp_.rnr_deadline = 0;
  // Every outstanding send WQE completes with WR_FLUSH_ERR, signaled or not (IBTA.md 9).
  for (; qp.comp_.wqe < qp.sq_head_; ++qp.comp_.wqe) {
    SendWqe& w = qp.sq_[qp.comp_.wqe & qp.sq_mask_];
    complete_send(qp, w, WcStatus::kWrFlushErr);
  }
  qp.req_.wqe = qp.sq_head_;
  qp.req_.offset = 0;
  RespState& r = qp.resp_;
  r.write_mr.reset();
  r.ack_pending = false;
  r.ack_deadline = 0;
  auto flush_recv = [&qp](const RecvWqe& w) {
    Wc wc;
    wc.wr_id = w.wr_id;
    wc.status = WcStatus::kWrFlushErr;
    wc.opcode = WcOpcode::kRecv;
    wc.qp_num = qp.qpn();
    complete_recv(qp, wc, false);
  };
  if (r.have_wqe) {
    r.have_wqe = false;
    // A WQE taken from an SRQ is flushed too: it belongs to this QP now.
    flush_recv(r.wqe);
  }
  if (!qp.init_.srq) qp.rq_.drain(flush_recv);
}

void Transport::reset(Qp& qp) {
  qp.sq_head_ = 0;
  qp.req_ = ReqState{};
  qp.comp_ = CompState{};
  qp.resp_.write_mr.reset();
  qp.resp_ = RespState{};
  RecvWqe w;
  while (qp.rq_.pop(&w)) {
  }
  qp.attr_.qp_state = QpState::kReset;
}

void Transport::complete_recv(Qp& qp, const Wc& wc, bool solicited) {
  if (!qp.init_.recv_cq->push(wc, solicited)) qp.ctx()->raise(kEventCqErr, qp.init_.recv_cq);
}

}  // namespace softrdma::core
