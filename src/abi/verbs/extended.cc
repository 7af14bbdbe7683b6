// Extended verbs: the new post-send API of ibv_qp_ex (wr_start, wr_<opcode>, wr_set_*, wr_complete) and the
// polling API of ibv_cq_ex (start_poll, next_poll, end_poll, read_*). The wr_* calls build core SendWrs and
// wr_complete posts them at once; the CQ readers read the completion start_poll/next_poll reached.
#include <cstring>

#include "abi/verbs/abi.h"

namespace softrdma::abi {
namespace {

// ---- ibv_qp_ex ----

PendingWr* begin_wr(ibv_qp_ex* qpx, WrOpcode opcode) {
  Qp* qp = to_qp(qpx);
  if (qp->npending == qp->pending.size()) qp->pending.emplace_back();
  PendingWr* p = &qp->pending[qp->npending++];
  p->wr = {};
  p->num_sge = 0;
  p->wr.wr_id = qpx->wr_id;
  p->wr.send_flags = qpx->wr_flags;
  p->wr.opcode = opcode;
  return p;
}

PendingWr* current(ibv_qp_ex* qpx) {
  Qp* qp = to_qp(qpx);
  if (qp->npending == 0) {
    qp->wr_err = EINVAL;  // a setter before any wr_<opcode>
    return nullptr;
  }
  return &qp->pending[qp->npending - 1];
}

void wr_start(ibv_qp_ex* qpx) {
  Qp* qp = to_qp(qpx);
  qp->npending = 0;
  qp->wr_err = 0;
}

int wr_complete(ibv_qp_ex* qpx) {
  Qp* qp = to_qp(qpx);
  int err = qp->wr_err;
  const size_t n = qp->npending;
  qp->npending = 0;
  qp->wr_err = 0;
  if (err || n == 0) return err;
  std::vector<core::SendWr> wrs(n);  // small; the SendWrs point into `pending`
  for (size_t i = 0; i < n; ++i) {
    PendingWr& p = qp->pending[i];
    p.wr.sg_list = std::span<const Sge>(p.sge, p.num_sge);
    wrs[i] = p.wr;
  }
  size_t bad = 0;
  return qp->core->post_send(wrs, &bad);
}

void wr_abort(ibv_qp_ex* qpx) {
  Qp* qp = to_qp(qpx);
  qp->npending = 0;
  qp->wr_err = 0;
}

void wr_send(ibv_qp_ex* qpx) { begin_wr(qpx, WrOpcode::kSend); }

void wr_send_imm(ibv_qp_ex* qpx, __be32 imm) { begin_wr(qpx, WrOpcode::kSendWithImm)->wr.imm_data = imm; }

void wr_send_inv(ibv_qp_ex* qpx, uint32_t rkey) {
  begin_wr(qpx, WrOpcode::kSendWithInv)->wr.invalidate_rkey = rkey;
}

void wr_rdma_write(ibv_qp_ex* qpx, uint32_t rkey, uint64_t addr) {
  PendingWr* p = begin_wr(qpx, WrOpcode::kRdmaWrite);
  p->wr.rkey = rkey;
  p->wr.remote_addr = addr;
}

void wr_rdma_write_imm(ibv_qp_ex* qpx, uint32_t rkey, uint64_t addr, __be32 imm) {
  PendingWr* p = begin_wr(qpx, WrOpcode::kRdmaWriteWithImm);
  p->wr.rkey = rkey;
  p->wr.remote_addr = addr;
  p->wr.imm_data = imm;
}

void wr_rdma_read(ibv_qp_ex* qpx, uint32_t rkey, uint64_t addr) {
  PendingWr* p = begin_wr(qpx, WrOpcode::kRdmaRead);
  p->wr.rkey = rkey;
  p->wr.remote_addr = addr;
}

void wr_atomic_cmp_swp(ibv_qp_ex* qpx, uint32_t rkey, uint64_t addr, uint64_t compare, uint64_t swap) {
  PendingWr* p = begin_wr(qpx, WrOpcode::kAtomicCmpAndSwp);
  p->wr.rkey = rkey;
  p->wr.remote_addr = addr;
  p->wr.compare_add = compare;
  p->wr.swap = swap;
}

void wr_atomic_fetch_add(ibv_qp_ex* qpx, uint32_t rkey, uint64_t addr, uint64_t add) {
  PendingWr* p = begin_wr(qpx, WrOpcode::kAtomicFetchAndAdd);
  p->wr.rkey = rkey;
  p->wr.remote_addr = addr;
  p->wr.compare_add = add;
}

// Not supported by the core: the WR fails wr_complete.
void wr_bind_mw(ibv_qp_ex* qpx, ibv_mw*, uint32_t, const ibv_mw_bind_info*) {
  to_qp(qpx)->wr_err = EOPNOTSUPP;
}
void wr_local_inv(ibv_qp_ex* qpx, uint32_t) { to_qp(qpx)->wr_err = EOPNOTSUPP; }
void wr_send_tso(ibv_qp_ex* qpx, void*, uint16_t, uint16_t) { to_qp(qpx)->wr_err = EOPNOTSUPP; }
void wr_set_xrc_srqn(ibv_qp_ex* qpx, uint32_t) { to_qp(qpx)->wr_err = EOPNOTSUPP; }
void wr_atomic_write(ibv_qp_ex* qpx, uint32_t, uint64_t, const void*) { to_qp(qpx)->wr_err = EOPNOTSUPP; }

void wr_set_ud_addr(ibv_qp_ex* qpx, ibv_ah* ah, uint32_t remote_qpn, uint32_t remote_qkey) {
  PendingWr* p = current(qpx);
  if (!p) return;
  p->wr.ah = ah ? to_ah(ah)->core : nullptr;
  p->wr.remote_qpn = remote_qpn;
  p->wr.remote_qkey = remote_qkey;
}

void wr_set_sge(ibv_qp_ex* qpx, uint32_t lkey, uint64_t addr, uint32_t length) {
  PendingWr* p = current(qpx);
  if (!p) return;
  p->sge[0] = {addr, length, lkey};
  p->num_sge = 1;
}

void wr_set_sge_list(ibv_qp_ex* qpx, size_t num_sge, const ibv_sge* sg_list) {
  PendingWr* p = current(qpx);
  if (!p) return;
  if (num_sge > core::kMaxSge) {
    to_qp(qpx)->wr_err = EINVAL;
    return;
  }
  for (size_t i = 0; i < num_sge; ++i) p->sge[i] = {sg_list[i].addr, sg_list[i].length, sg_list[i].lkey};
  p->num_sge = static_cast<uint32_t>(num_sge);
}

// Inline data is copied now (the caller may reuse its buffer once the call returns) and posted as one SGE
// over the copy with IBV_SEND_INLINE, which the core copies again without a key check.
void wr_set_inline_data_list(ibv_qp_ex* qpx, size_t num_buf, const ibv_data_buf* bufs) {
  PendingWr* p = current(qpx);
  if (!p) return;
  size_t off = 0;
  for (size_t i = 0; i < num_buf; ++i) {
    if (bufs[i].length > core::kMaxInline - off) {
      to_qp(qpx)->wr_err = EINVAL;
      return;
    }
    std::memcpy(p->inl + off, bufs[i].addr, bufs[i].length);
    off += bufs[i].length;
  }
  p->sge[0] = {reinterpret_cast<uint64_t>(p->inl), static_cast<uint32_t>(off), 0};
  p->num_sge = 1;
  p->wr.send_flags |= kSendInline;
}

void wr_set_inline_data(ibv_qp_ex* qpx, void* addr, size_t length) {
  ibv_data_buf b{addr, length};
  wr_set_inline_data_list(qpx, 1, &b);
}

// ---- ibv_cq_ex ----

int next_poll(ibv_cq_ex* cqx) {
  Cq* cq = to_cq(cqx);
  if (cq->core->poll(std::span(&cq->cur, 1)) != 1) return ENOENT;
  cqx->status = static_cast<ibv_wc_status>(cq->cur.status);
  cqx->wr_id = cq->cur.wr_id;
  return 0;
}
int start_poll(ibv_cq_ex* cqx, ibv_poll_cq_attr* attr) {
  if (attr && attr->comp_mask) return EINVAL;
  return next_poll(cqx);
}
void end_poll(ibv_cq_ex*) {}
ibv_wc_opcode read_opcode(ibv_cq_ex* c) { return static_cast<ibv_wc_opcode>(to_cq(c)->cur.opcode); }
uint32_t read_vendor_err(ibv_cq_ex* c) { return to_cq(c)->cur.vendor_err; }
uint32_t read_byte_len(ibv_cq_ex* c) { return to_cq(c)->cur.byte_len; }
__be32 read_imm_data(ibv_cq_ex* c) { return to_cq(c)->cur.imm_data; }
uint32_t read_qp_num(ibv_cq_ex* c) { return to_cq(c)->cur.qp_num; }
uint32_t read_src_qp(ibv_cq_ex* c) { return to_cq(c)->cur.src_qp; }
unsigned int read_wc_flags(ibv_cq_ex* c) { return to_cq(c)->cur.wc_flags; }
uint32_t read_slid(ibv_cq_ex* c) { return to_cq(c)->cur.slid; }
uint8_t read_sl(ibv_cq_ex* c) { return to_cq(c)->cur.sl; }
uint8_t read_dlid_path_bits(ibv_cq_ex* c) { return to_cq(c)->cur.dlid_path_bits; }
uint64_t read_zero64(ibv_cq_ex*) { return 0; }
uint16_t read_cvlan(ibv_cq_ex*) { return 0; }
uint32_t read_flow_tag(ibv_cq_ex*) { return 0; }
void read_tm_info(ibv_cq_ex*, ibv_wc_tm_info* info) { *info = {}; }

}  // namespace

void init_qp_ex(Qp* qp) {
  ibv_qp_ex& x = qp->qpx;
  x.comp_mask = 0;
  x.wr_atomic_cmp_swp = wr_atomic_cmp_swp;
  x.wr_atomic_fetch_add = wr_atomic_fetch_add;
  x.wr_bind_mw = wr_bind_mw;
  x.wr_local_inv = wr_local_inv;
  x.wr_rdma_read = wr_rdma_read;
  x.wr_rdma_write = wr_rdma_write;
  x.wr_rdma_write_imm = wr_rdma_write_imm;
  x.wr_send = wr_send;
  x.wr_send_imm = wr_send_imm;
  x.wr_send_inv = wr_send_inv;
  x.wr_send_tso = wr_send_tso;
  x.wr_set_ud_addr = wr_set_ud_addr;
  x.wr_set_xrc_srqn = wr_set_xrc_srqn;
  x.wr_set_inline_data = wr_set_inline_data;
  x.wr_set_inline_data_list = wr_set_inline_data_list;
  x.wr_set_sge = wr_set_sge;
  x.wr_set_sge_list = wr_set_sge_list;
  x.wr_start = wr_start;
  x.wr_complete = wr_complete;
  x.wr_abort = wr_abort;
  x.wr_atomic_write = wr_atomic_write;
}

void init_cq_ex(Cq* cq) {
  ibv_cq_ex& x = cq->cqx;
  x.comp_mask = 0;
  x.start_poll = start_poll;
  x.next_poll = next_poll;
  x.end_poll = end_poll;
  x.read_opcode = read_opcode;
  x.read_vendor_err = read_vendor_err;
  x.read_byte_len = read_byte_len;
  x.read_imm_data = read_imm_data;
  x.read_qp_num = read_qp_num;
  x.read_src_qp = read_src_qp;
  x.read_wc_flags = read_wc_flags;
  x.read_slid = read_slid;
  x.read_sl = read_sl;
  x.read_dlid_path_bits = read_dlid_path_bits;
  x.read_completion_ts = read_zero64;
  x.read_cvlan = read_cvlan;
  x.read_flow_tag = read_flow_tag;
  x.read_tm_info = read_tm_info;
  x.read_completion_wallclock_ns = read_zero64;
}

}  // namespace softrdma::abi
