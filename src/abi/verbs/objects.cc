// The verbs objects (PD, MR, completion channel, CQ, SRQ, AH, QP), the data path through ctx->ops
// (post_send, post_recv, post_srq_recv, poll_cq, req_notify_cq) and async events. Each call converts
// rdma-core's structs to the core's and its status to errno; the core does the rest.
#include <fcntl.h>
#include <poll.h>

#include <algorithm>
#include <cstring>

#include "abi/verbs/abi.h"
#include "core/scratch.h"

namespace softrdma::abi {
namespace {

constexpr uint32_t kOptionalAccessRange = 0x3ff00000;  // IBV_ACCESS_OPTIONAL_RANGE

void init_mutex_cond(pthread_mutex_t* m, pthread_cond_t* c) {
  pthread_mutex_init(m, nullptr);
  pthread_cond_init(c, nullptr);
}

void to_core_attr(const ibv_qp_attr& a, int mask, core::QpAttr* o) {
  o->qp_state = static_cast<QpState>(a.qp_state);
  o->cur_qp_state = static_cast<QpState>(a.cur_qp_state);
  o->path_mtu = static_cast<Mtu>(a.path_mtu);
  o->qkey = a.qkey;
  o->rq_psn = a.rq_psn;
  o->sq_psn = a.sq_psn;
  o->dest_qp_num = a.dest_qp_num;
  o->qp_access_flags = static_cast<uint32_t>(a.qp_access_flags);
  o->cap = {a.cap.max_send_wr, a.cap.max_recv_wr, a.cap.max_send_sge, a.cap.max_recv_sge,
            a.cap.max_inline_data};
  if (mask & IBV_QP_AV) to_core_ah(a.ah_attr, &o->ah_attr);
  o->pkey_index = a.pkey_index;
  o->en_sqd_async_notify = a.en_sqd_async_notify;
  o->max_rd_atomic = a.max_rd_atomic;
  o->max_dest_rd_atomic = a.max_dest_rd_atomic;
  o->min_rnr_timer = a.min_rnr_timer;
  o->port_num = a.port_num;
  o->timeout = a.timeout;
  o->retry_cnt = a.retry_cnt;
  o->rnr_retry = a.rnr_retry;
}

void from_core_attr(const core::QpAttr& a, ibv_qp_attr* o) {
  *o = {};
  o->qp_state = static_cast<ibv_qp_state>(a.qp_state);
  o->cur_qp_state = static_cast<ibv_qp_state>(a.cur_qp_state);
  o->path_mtu = static_cast<ibv_mtu>(a.path_mtu);
  o->path_mig_state = IBV_MIG_MIGRATED;
  o->qkey = a.qkey;
  o->rq_psn = a.rq_psn;
  o->sq_psn = a.sq_psn;
  o->dest_qp_num = a.dest_qp_num;
  o->qp_access_flags = static_cast<int>(a.qp_access_flags);
  o->cap = {a.cap.max_send_wr, a.cap.max_recv_wr, a.cap.max_send_sge, a.cap.max_recv_sge,
            a.cap.max_inline_data};
  from_core_ah(a.ah_attr, &o->ah_attr);
  o->pkey_index = a.pkey_index;
  o->en_sqd_async_notify = a.en_sqd_async_notify;
  o->sq_draining = a.sq_draining;
  o->max_rd_atomic = a.max_rd_atomic;
  o->max_dest_rd_atomic = a.max_dest_rd_atomic;
  o->min_rnr_timer = a.min_rnr_timer;
  o->port_num = a.port_num;
  o->timeout = a.timeout;
  o->retry_cnt = a.retry_cnt;
  o->rnr_retry = a.rnr_retry;
}

// ---- ctx->ops: the data path ----

int op_post_send(ibv_qp* ibqp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  Qp* qp = to_qp(ibqp);
  constexpr size_t kBatch = 16;
  core::Scratch<core::SendWr, kBatch> scratch;  // (constructed, the 16 cost 260 instructions a post)
  core::SendWr* const batch = scratch.at;
  ibv_send_wr* src[kBatch];
  while (wr) {
    size_t n = 0;
    ibv_send_wr* invalid = nullptr;  // a WR the core's spans cannot carry: after the batch, EINVAL
    for (; wr && n < kBatch; wr = wr->next, ++n) {
      if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > core::kMaxSge) {
        invalid = wr;
        break;
      }
      core::SendWr& w = batch[n];
      src[n] = wr;
      w = {};
      w.wr_id = wr->wr_id;
      w.opcode = static_cast<WrOpcode>(wr->opcode);
      w.send_flags = wr->send_flags;
      w.imm_data = wr->imm_data;
      w.invalidate_rkey = wr->invalidate_rkey;
      w.sg_list = std::span(to_sge(wr->sg_list), static_cast<size_t>(wr->num_sge));
      switch (wr->opcode) {
        case IBV_WR_ATOMIC_CMP_AND_SWP:
        case IBV_WR_ATOMIC_FETCH_AND_ADD:
          w.remote_addr = wr->wr.atomic.remote_addr;
          w.rkey = wr->wr.atomic.rkey;
          w.compare_add = wr->wr.atomic.compare_add;
          w.swap = wr->wr.atomic.swap;
          break;
        default:
          if (ibqp->qp_type == IBV_QPT_UD) {
            w.ah = wr->wr.ud.ah ? to_ah(wr->wr.ud.ah)->core : nullptr;
            w.remote_qpn = wr->wr.ud.remote_qpn;
            w.remote_qkey = wr->wr.ud.remote_qkey;
          } else {
            w.remote_addr = wr->wr.rdma.remote_addr;
            w.rkey = wr->wr.rdma.rkey;
          }
      }
    }
    if (n) {
      size_t bad = 0;
      if (int err = qp->core->post_send(std::span(batch, n), &bad)) {
        *bad_wr = src[std::min(bad, n - 1)];
        return err;
      }
    }
    if (invalid) {
      *bad_wr = invalid;
      return EINVAL;
    }
  }
  return 0;
}

int post_recv_list(Qp* qp, Srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  constexpr size_t kBatch = 16;
  core::Scratch<core::RecvWr, kBatch> scratch;
  core::RecvWr* const batch = scratch.at;
  ibv_recv_wr* src[kBatch];
  while (wr) {
    size_t n = 0;
    ibv_recv_wr* invalid = nullptr;
    for (; wr && n < kBatch; wr = wr->next, ++n) {
      if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > core::kMaxSge) {
        invalid = wr;
        break;
      }
      src[n] = wr;
      batch[n] = {wr->wr_id, std::span(to_sge(wr->sg_list), static_cast<size_t>(wr->num_sge))};
    }
    if (srq) {
      for (size_t i = 0; i < n; ++i) {
        core::RecvWqe w;
        w.wr_id = batch[i].wr_id;
        w.num_sge = static_cast<uint32_t>(batch[i].sg_list.size());
        uint64_t len = 0;
        for (size_t k = 0; k < w.num_sge; ++k) {
          w.sge[k] = batch[i].sg_list[k];
          len += w.sge[k].length;
        }
        w.length = static_cast<uint32_t>(std::min<uint64_t>(len, UINT32_MAX));
        if (int err = srq->core->post(w)) {
          *bad_wr = src[i];
          return err;
        }
      }
    } else if (n) {
      size_t bad = 0;
      if (int err = qp->core->post_recv(std::span(batch, n), &bad)) {
        *bad_wr = src[std::min(bad, n - 1)];
        return err;
      }
    }
    if (invalid) {
      *bad_wr = invalid;
      return EINVAL;
    }
  }
  return 0;
}

int op_post_recv(ibv_qp* ibqp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  return post_recv_list(to_qp(ibqp), nullptr, wr, bad_wr);
}

int op_post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  return post_recv_list(nullptr, to_srq(srq), wr, bad_wr);
}

int op_poll_cq(ibv_cq* ibcq, int num_entries, ibv_wc* wc) {
  Cq* cq = to_cq(ibcq);
  if (num_entries <= 0) return 0;
  constexpr int kBatch = 32;
  core::Scratch<Wc, kBatch> batch;  // poll() fills what it returns (zeroing 1.5 KiB per call, empty or not)
  Wc* const buf = batch.at;
  int total = 0;
  while (total < num_entries) {
    const int want = std::min(kBatch, num_entries - total);
    const int n = cq->core->poll(std::span(buf, static_cast<size_t>(want)));
    if (n < 0) return total ? total : n;
    for (int i = 0; i < n; ++i) to_ibv_wc(buf[i], &wc[total + i]);
    total += n;
    if (n < want) break;
  }
  return total;
}

int op_req_notify_cq(ibv_cq* cq, int solicited_only) {
  return to_cq(cq)->core->req_notify(solicited_only != 0);
}

// What softrdma does not do, as rdma-core's dummy ops answer.
ibv_mw* op_alloc_mw(ibv_pd*, ibv_mw_type) { return fail<ibv_mw>(EOPNOTSUPP); }
int op_bind_mw(ibv_qp*, ibv_mw*, ibv_mw_bind*) { return EOPNOTSUPP; }
int op_dealloc_mw(ibv_mw*) { return EOPNOTSUPP; }

ibv_qp* op_create_qp_ex(ibv_context* context, ibv_qp_init_attr_ex* attr) {
  constexpr uint32_t kSupported =
      IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS;
  if (attr->comp_mask & ~kSupported) return fail<ibv_qp>(EOPNOTSUPP);
  if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) return fail<ibv_qp>(EINVAL);
  if ((attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && attr->create_flags)
    return fail<ibv_qp>(EOPNOTSUPP);
  ibv_qp* qp = create_qp_common(to_ctx(context), to_pd(attr->pd), *attr);
  if (qp) {
    const core::QpCap& c = to_qp(qp)->core->init().cap;
    attr->cap = {c.max_send_wr, c.max_recv_wr, c.max_send_sge, c.max_recv_sge, c.max_inline_data};
  }
  return qp;
}

}  // namespace

// A context sends and receives on one address, the GID it was opened on (index 1, the IPv4 one, when
// there is one): an address vector whose source GID is another address would have the peer send where
// nothing listens, so it is refused up front instead of hanging.
bool sgid_usable(Context* ctx, const ibv_ah_attr& ah) {
  if (!ah.is_global) return true;
  const auto& gids = ctx->device->info->gids;
  return ah.grh.sgid_index < gids.size() && gids[ah.grh.sgid_index].gid == ctx->native->gid();
}

void to_core_ah(const ibv_ah_attr& in, core::AhAttr* out) {
  std::memcpy(out->dgid.raw.data(), in.grh.dgid.raw, 16);
  out->flow_label = in.grh.flow_label;
  out->sgid_index = in.grh.sgid_index;
  out->hop_limit = in.grh.hop_limit;
  out->traffic_class = in.grh.traffic_class;
  out->sl = in.sl;
  out->port_num = in.port_num;
  out->dlid = in.dlid;
  out->is_global = in.is_global != 0;
}

void from_core_ah(const core::AhAttr& in, ibv_ah_attr* out) {
  *out = {};
  std::memcpy(out->grh.dgid.raw, in.dgid.raw.data(), 16);
  out->grh.flow_label = in.flow_label;
  out->grh.sgid_index = in.sgid_index;
  out->grh.hop_limit = in.hop_limit;
  out->grh.traffic_class = in.traffic_class;
  out->sl = in.sl;
  out->port_num = in.port_num;
  out->dlid = in.dlid;
  out->is_global = in.is_global;
}

void to_ibv_wc(const Wc& in, ibv_wc* out) {
  out->wr_id = in.wr_id;
  out->status = static_cast<ibv_wc_status>(in.status);
  out->opcode = static_cast<ibv_wc_opcode>(in.opcode);
  out->vendor_err = in.vendor_err;
  out->byte_len = in.byte_len;
  out->imm_data = in.imm_data;
  out->qp_num = in.qp_num;
  out->src_qp = in.src_qp;
  out->wc_flags = in.wc_flags;
  out->pkey_index = in.pkey_index;
  out->slid = in.slid;
  out->sl = in.sl;
  out->dlid_path_bits = in.dlid_path_bits;
}

void fill_ops(Context* ctx) {
  ibv_context_ops& ops = ctx->vctx.context.ops;
  ops.alloc_mw = op_alloc_mw;
  ops.bind_mw = op_bind_mw;
  ops.dealloc_mw = op_dealloc_mw;
  ops.poll_cq = op_poll_cq;
  ops.req_notify_cq = op_req_notify_cq;
  ops.post_srq_recv = op_post_srq_recv;
  ops.post_send = op_post_send;
  ops.post_recv = op_post_recv;
  ctx->vctx.create_qp_ex = op_create_qp_ex;
  register_cq_ex(ctx);
}

ibv_qp* create_qp_common(Context* ctx, Pd* pd, const ibv_qp_init_attr_ex& attr) {
  // The type first: an XRC QP (rdma_xclient -c x creates one without a receive CQ) is not there, not
  // malformed.
  if (attr.qp_type != IBV_QPT_RC && attr.qp_type != IBV_QPT_UC && attr.qp_type != IBV_QPT_UD)
    return fail<ibv_qp>(EOPNOTSUPP);
  if (!attr.send_cq || !attr.recv_cq) return fail<ibv_qp>(EINVAL);
  auto* qp = new Qp{};
  core::QpInitAttr init;
  init.type = static_cast<QpType>(attr.qp_type);
  init.send_cq = to_cq(attr.send_cq)->core;
  init.recv_cq = to_cq(attr.recv_cq)->core;
  init.srq = attr.srq ? to_srq(attr.srq)->core : nullptr;
  init.cap = {attr.cap.max_send_wr, attr.cap.max_recv_wr, attr.cap.max_send_sge, attr.cap.max_recv_sge,
              attr.cap.max_inline_data};
  // As rxe: a send WQE holds max_send_sge SGEs, and that much room is always good for inline data
  // (rdma_xclient sends 16 bytes inline on a QP created with max_inline_data 0 and one SGE).
  init.cap.max_inline_data =
      std::max(init.cap.max_inline_data,
               std::min<uint32_t>(init.cap.max_send_sge * sizeof(ibv_sge), core::kMaxInline));
  if (init.srq) init.cap.max_recv_wr = init.cap.max_recv_sge = 0;
  init.sq_sig_all = attr.sq_sig_all != 0;
  init.user_context = qp;
  auto created = ctx->core->create_qp(pd->core, init);
  if (!created) {
    delete qp;
    return fail<ibv_qp>(created.error());
  }
  qp->core = *created;
  ibv_qp& q = qp->qpx.qp_base;
  q.context = &ctx->vctx.context;
  q.qp_context = attr.qp_context;
  q.pd = &pd->pd;
  q.send_cq = attr.send_cq;
  q.recv_cq = attr.recv_cq;
  q.srq = attr.srq;
  q.handle = qp->core->qpn();
  q.qp_num = qp->core->qpn();
  q.state = IBV_QPS_RESET;
  q.qp_type = attr.qp_type;
  init_mutex_cond(&q.mutex, &q.cond);
  init_qp_ex(qp);
  return &q;
}

}  // namespace softrdma::abi

namespace core = softrdma::core;
namespace wire = softrdma::wire;
using namespace softrdma::abi;
using softrdma::kEventCqErr, softrdma::kEventSrqErr, softrdma::kEventSrqLimitReached, softrdma::kEventQpFatal,
    softrdma::kEventQpReqErr, softrdma::kEventQpAccessErr, softrdma::kEventCommEst, softrdma::kEventSqDrained,
    softrdma::kEventPathMig, softrdma::kEventPathMigErr, softrdma::kEventQpLastWqeReached;
using softrdma::abi::Context;

// ---- PD ----

ibv_pd* ibv_alloc_pd(ibv_context* context) {
  auto core = to_ctx(context)->core->alloc_pd();
  if (!core) return fail<ibv_pd>(core.error());
  auto* pd = new Pd{};
  pd->core = *core;
  pd->core->user_context = pd;
  pd->pd.context = context;
  return &pd->pd;
}

int ibv_dealloc_pd(ibv_pd* ibpd) {
  Pd* pd = to_pd(ibpd);
  if (int err = to_ctx(ibpd->context)->core->dealloc_pd(pd->core)) return err;
  delete pd;
  return 0;
}

// ---- MR ----

ibv_mr* ibv_reg_mr_iova2(ibv_pd* ibpd, void* addr, size_t length, uint64_t iova, unsigned int access) {
  access &= ~kOptionalAccessRange;  // optional flags are dropped where unsupported, as rdma-core does
  auto core = to_ctx(ibpd->context)->core->reg_mr(to_pd(ibpd)->core, addr, length, iova, access);
  if (!core) return fail<ibv_mr>(core.error());
  auto* mr = new Mr{};
  mr->core = *core;
  mr->mr.context = ibpd->context;
  mr->mr.pd = ibpd;
  mr->mr.addr = addr;
  mr->mr.length = length;
  mr->mr.handle = mr->core->key;
  mr->mr.lkey = mr->core->key;
  mr->mr.rkey = mr->core->key;
  return &mr->mr;
}

ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, reinterpret_cast<uintptr_t>(addr), static_cast<unsigned>(access));
}

ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr, size_t length, uint64_t iova, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, iova, static_cast<unsigned>(access));
}

int ibv_dereg_mr(ibv_mr* ibmr) {
  Mr* mr = to_mr(ibmr);
  if (int err = to_ctx(ibmr->context)->core->dereg_mr(mr->core)) return err;
  delete mr;
  return 0;
}

// ---- completion channel and CQ ----

ibv_comp_channel* ibv_create_comp_channel(ibv_context* context) {
  auto core = core::CompChannel::create();
  if (!core) return fail<ibv_comp_channel>(core.error());
  auto* ch = new Channel{};
  ch->core = core->release();
  ch->ch.context = context;
  ch->ch.fd = ch->core->fd();
  ch->ch.refcnt = 0;
  return &ch->ch;
}

int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  Channel* ch = to_channel(channel);
  if (ch->core->users.load() != 0) return EBUSY;
  delete ch->core;
  delete ch;
  return 0;
}

namespace softrdma::abi {
namespace {
ibv_cq_ex* create_cq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                     uint64_t wc_flags) {
  if (cqe < 1) return fail<ibv_cq_ex>(EINVAL);
  auto* cq = new Cq{};
  auto core = to_ctx(context)->core->create_cq(static_cast<uint32_t>(cqe),
                                               channel ? to_channel(channel)->core : nullptr, cq);
  if (!core) {
    delete cq;
    return fail<ibv_cq_ex>(core.error());
  }
  cq->core = *core;
  cq->wc_flags = wc_flags;
  ibv_cq_ex& c = cq->cqx;
  c.context = context;
  c.channel = channel;
  c.cq_context = cq_context;
  c.handle = 0;
  c.cqe = static_cast<int>(cq->core->capacity());
  init_mutex_cond(&c.mutex, &c.cond);
  init_cq_ex(cq);
  return &c;
}

constexpr uint64_t kCqExSupported = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM |
                                    IBV_WC_EX_WITH_SRC_QP | IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL |
                                    IBV_WC_EX_WITH_DLID_PATH_BITS;

ibv_cq_ex* op_create_cq_ex(ibv_context* context, ibv_cq_init_attr_ex* attr) {
  if (attr->comp_mask & ~static_cast<uint32_t>(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD))
    return fail<ibv_cq_ex>(EOPNOTSUPP);
  if (attr->wc_flags & ~kCqExSupported) return fail<ibv_cq_ex>(EOPNOTSUPP);
  if (attr->comp_vector != 0) return fail<ibv_cq_ex>(EINVAL);
  if (attr->cqe > static_cast<uint32_t>(INT32_MAX)) return fail<ibv_cq_ex>(EINVAL);
  return create_cq(context, static_cast<int>(attr->cqe), attr->cq_context, attr->channel, attr->wc_flags);
}
}  // namespace

void register_cq_ex(Context* ctx) { ctx->vctx.create_cq_ex = op_create_cq_ex; }
}  // namespace softrdma::abi

ibv_cq* ibv_create_cq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                      int comp_vector) {
  if (comp_vector != 0) return fail<ibv_cq>(EINVAL);
  return ibv_cq_ex_to_cq(create_cq(context, cqe, cq_context, channel, 0));
}

int ibv_destroy_cq(ibv_cq* ibcq) {
  Cq* cq = to_cq(ibcq);
  if (int err = to_ctx(ibcq->context)->core->destroy_cq(cq->core)) return err;
  pthread_mutex_destroy(&ibcq->mutex);
  pthread_cond_destroy(&ibcq->cond);
  delete cq;
  return 0;
}

int ibv_resize_cq(ibv_cq*, int) { return EOPNOTSUPP; }

int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  auto core = to_channel(channel)->core->get_event(to_ctx(channel->context)->core);
  if (!core) {
    errno = core.error();
    return -1;
  }
  Cq* c = static_cast<Cq*>((*core)->user_context);
  *cq = ibv_cq_ex_to_cq(&c->cqx);
  *cq_context = c->cqx.cq_context;
  return 0;
}

void ibv_ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  pthread_mutex_lock(&cq->mutex);
  cq->comp_events_completed += nevents;
  pthread_cond_signal(&cq->cond);
  pthread_mutex_unlock(&cq->mutex);
}

// ---- SRQ ----

ibv_srq* ibv_create_srq(ibv_pd* ibpd, ibv_srq_init_attr* attr) {
  auto core =
      to_ctx(ibpd->context)
          ->core->create_srq(to_pd(ibpd)->core, attr->attr.max_wr, attr->attr.max_sge, attr->attr.srq_limit);
  if (!core) return fail<ibv_srq>(core.error());
  auto* srq = new Srq{};
  srq->core = *core;
  srq->core->user_context = srq;
  srq->srq.context = ibpd->context;
  srq->srq.srq_context = attr->srq_context;
  srq->srq.pd = ibpd;
  init_mutex_cond(&srq->srq.mutex, &srq->srq.cond);
  return &srq->srq;
}

int ibv_modify_srq(ibv_srq* srq, ibv_srq_attr* attr, int mask) {
  return to_srq(srq)->core->modify(attr->max_wr, attr->srq_limit, static_cast<uint32_t>(mask));
}

int ibv_query_srq(ibv_srq* ibsrq, ibv_srq_attr* attr) {
  Srq* srq = to_srq(ibsrq);
  attr->max_wr = srq->core->max_wr();
  attr->max_sge = srq->core->max_sge();
  attr->srq_limit = srq->core->limit();
  return 0;
}

int ibv_destroy_srq(ibv_srq* ibsrq) {
  Srq* srq = to_srq(ibsrq);
  if (int err = to_ctx(ibsrq->context)->core->destroy_srq(srq->core)) return err;
  pthread_mutex_destroy(&ibsrq->mutex);
  pthread_cond_destroy(&ibsrq->cond);
  delete srq;
  return 0;
}

// ---- AH ----

ibv_ah* ibv_create_ah(ibv_pd* ibpd, ibv_ah_attr* attr) {
  if (!sgid_usable(to_ctx(ibpd->context), *attr)) return fail<ibv_ah>(EINVAL);
  core::AhAttr a;
  to_core_ah(*attr, &a);
  auto core = to_ctx(ibpd->context)->core->create_ah(to_pd(ibpd)->core, a);
  if (!core) return fail<ibv_ah>(core.error());
  auto* ah = new Ah{};
  ah->core = *core;
  ah->ah.context = ibpd->context;
  ah->ah.pd = ibpd;
  return &ah->ah;
}

int ibv_destroy_ah(ibv_ah* ibah) {
  Ah* ah = to_ah(ibah);
  if (int err = to_ctx(ibah->context)->core->destroy_ah(ah->core)) return err;
  delete ah;
  return 0;
}

// The AH that answers a received UD message, from the 40 bytes before its payload as the kernel lays
// them out for RoCE v2 (rdma-core's ibv_init_ah_from_wc): an IPv6 header, or for IPv4 20 undefined
// bytes and then the IPv4 header (told apart by the version nibble and the IPv4 header checksum). The
// peer's address becomes dgid; the local one selects sgid_index.
int ibv_init_ah_from_wc(ibv_context* context, uint8_t port_num, ibv_wc* wc, ibv_grh* grh,
                        ibv_ah_attr* ah_attr) {
  if (port_num != 1 || !(wc->wc_flags & IBV_WC_GRH) || !grh) {
    errno = EINVAL;
    return -1;
  }
  const auto* ip4 = reinterpret_cast<const uint8_t*>(grh) + 20;
  const uint32_t flow = be32toh(grh->version_tclass_flow);
  bool v4;
  if ((flow >> 28) != 6) {
    if ((ip4[0] >> 4) != 4) {
      errno = EPROTONOSUPPORT;
      return -1;
    }
    v4 = true;
  } else {
    uint32_t sum = 0;  // a valid IPv4 header sums to 0xFFFF, its checksum included
    for (int i = 0; i < 20; i += 2) sum += static_cast<uint32_t>(ip4[i] << 8 | ip4[i + 1]);
    while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
    v4 = ip4[0] == 0x45 && sum == 0xFFFF;
  }
  wire::Gid peer, local;
  *ah_attr = {};
  if (v4) {
    uint32_t saddr, daddr;
    std::memcpy(&saddr, ip4 + 12, 4);
    std::memcpy(&daddr, ip4 + 16, 4);
    peer = wire::Gid::from_v4(saddr);
    local = wire::Gid::from_v4(daddr);
    ah_attr->grh.traffic_class = ip4[1];
  } else {
    std::memcpy(peer.raw.data(), grh->sgid.raw, 16);
    std::memcpy(local.raw.data(), grh->dgid.raw, 16);
    ah_attr->grh.flow_label = flow & 0xFFFFF;
    ah_attr->grh.traffic_class = static_cast<uint8_t>((flow >> 20) & 0xFF);
  }
  const auto& gids = to_ctx(context)->device->info->gids;
  size_t index = 0;
  while (index < gids.size() && gids[index].gid != local) ++index;
  if (index == gids.size()) {
    errno = ENOENT;  // addressed to none of this device's GIDs
    return -1;
  }
  ah_attr->dlid = wc->slid;
  ah_attr->sl = wc->sl;
  ah_attr->port_num = port_num;
  ah_attr->is_global = 1;
  std::memcpy(ah_attr->grh.dgid.raw, peer.raw.data(), 16);
  ah_attr->grh.hop_limit = 0xFF;
  ah_attr->grh.sgid_index = static_cast<uint8_t>(index);
  return 0;
}

ibv_ah* ibv_create_ah_from_wc(ibv_pd* pd, ibv_wc* wc, ibv_grh* grh, uint8_t port_num) {
  ibv_ah_attr attr;
  if (ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr)) return nullptr;
  return ibv_create_ah(pd, &attr);
}

// ---- QP ----

ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  ibv_qp_init_attr_ex ex{};
  ex.qp_context = attr->qp_context;
  ex.send_cq = attr->send_cq;
  ex.recv_cq = attr->recv_cq;
  ex.srq = attr->srq;
  ex.cap = attr->cap;
  ex.qp_type = attr->qp_type;
  ex.sq_sig_all = attr->sq_sig_all;
  ex.comp_mask = IBV_QP_INIT_ATTR_PD;
  ex.pd = pd;
  ibv_qp* qp = create_qp_common(to_ctx(pd->context), to_pd(pd), ex);
  if (qp) {
    const core::QpCap& c = to_qp(qp)->core->init().cap;
    attr->cap = {c.max_send_wr, c.max_recv_wr, c.max_send_sge, c.max_recv_sge, c.max_inline_data};
  }
  return qp;
}

int ibv_modify_qp(ibv_qp* ibqp, ibv_qp_attr* attr, int attr_mask) {
  if ((attr_mask & IBV_QP_AV) && !sgid_usable(to_ctx(ibqp->context), attr->ah_attr)) return EINVAL;
  core::QpAttr a;
  to_core_attr(*attr, attr_mask, &a);
  if (int err = to_qp(ibqp)->core->modify(a, static_cast<uint32_t>(attr_mask))) return err;
  // Atomic: librdmacm moves a QP (to RTS in the thread that reads the CM event, to ERR in the one that
  // disconnects) while the application's threads may modify it too; the core serialises the transition,
  // and this copy of its result must not be a data race (TSan, rdmacm.cmtime_c1000).
  if (attr_mask & IBV_QP_STATE) __atomic_store_n(&ibqp->state, attr->qp_state, __ATOMIC_RELAXED);
  return 0;
}

int ibv_query_qp(ibv_qp* ibqp, ibv_qp_attr* attr, int, ibv_qp_init_attr* init_attr) {
  core::QpAttr a;
  core::QpInitAttr init;
  if (int err = to_qp(ibqp)->core->query(&a, &init)) return err;
  from_core_attr(a, attr);
  if (init_attr) {
    *init_attr = {};
    init_attr->qp_context = ibqp->qp_context;
    init_attr->send_cq = ibqp->send_cq;
    init_attr->recv_cq = ibqp->recv_cq;
    init_attr->srq = ibqp->srq;
    init_attr->cap = attr->cap;
    init_attr->qp_type = ibqp->qp_type;
    init_attr->sq_sig_all = init.sq_sig_all;
  }
  return 0;
}

int ibv_destroy_qp(ibv_qp* ibqp) {
  Qp* qp = to_qp(ibqp);
  if (int err = to_ctx(ibqp->context)->core->destroy_qp(qp->core)) return err;
  pthread_mutex_destroy(&ibqp->mutex);
  pthread_cond_destroy(&ibqp->cond);
  delete qp;
  return 0;
}

ibv_qp_ex* ibv_qp_to_qp_ex(ibv_qp* qp) { return &to_qp(qp)->qpx; }

// ---- async events ----

int ibv_get_async_event(ibv_context* context, ibv_async_event* event) {
  core::Context* core = to_ctx(context)->core;
  for (;;) {
    auto e = core->get_async_event();
    if (e) {
      *event = {};
      event->event_type = static_cast<ibv_event_type>(e->type);
      switch (e->type) {
        case kEventCqErr:
          event->element.cq =
              ibv_cq_ex_to_cq(&static_cast<Cq*>(static_cast<core::Cq*>(e->object)->user_context)->cqx);
          break;
        case kEventSrqErr:
        case kEventSrqLimitReached:
          event->element.srq = &static_cast<Srq*>(static_cast<core::Srq*>(e->object)->user_context)->srq;
          break;
        case kEventQpFatal:
        case kEventQpReqErr:
        case kEventQpAccessErr:
        case kEventCommEst:
        case kEventSqDrained:
        case kEventPathMig:
        case kEventPathMigErr:
        case kEventQpLastWqeReached:
          event->element.qp =
              &static_cast<Qp*>(static_cast<core::Qp*>(e->object)->init().user_context)->qpx.qp_base;
          break;
        default:
          event->element.port_num = 1;
      }
      return 0;
    }
    if (e.error() != EAGAIN) {
      errno = e.error();
      return -1;
    }
    if (fcntl(core->async_fd(), F_GETFL) & O_NONBLOCK) {
      errno = EAGAIN;
      return -1;
    }
    pollfd p{core->async_fd(), POLLIN, 0};
    if (poll(&p, 1, -1) < 0 && errno != EINTR) return -1;
  }
}

void ibv_ack_async_event(ibv_async_event* event) {
  // Events hold no references here: destroying an object does not wait for its events to be acknowledged.
  (void)event;
}
