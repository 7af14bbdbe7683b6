// The drop-in libibverbs.so.1: the objects rdma-core's public structs are embedded in, and the conversions
// between them and the core's. Thin by design (ARCHITECTURE.md): no protocol here, only structs and errno.
//
// Every object begins with the struct the application holds (ibv_pd, ibv_cq_ex, ibv_qp_ex, ...), so a
// pointer the application passes back converts with a cast. The context is a verbs_context (the extended
// shape: abi_compat == __VERBS_ABI_IS_EXTENDED), the device has the verbs_device shape (an ops pointer at
// +664) that libmlx5/libefa read, every QP is an ibv_qp_ex and every CQ an ibv_cq_ex.
#pragma once

// The exported functions are declared by rdma-core's header; the rest of this library is hidden
// (-fvisibility=hidden, and the version script exports only the ABI).
#pragma GCC visibility push(default)
#include <infiniband/verbs.h>
#pragma GCC visibility pop

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "core/context.h"
#include "io/netif.h"
#include "softrdma/softrdma.h"

// rdma-core's headers turn some exported names into macros for inline wrappers; the definitions here need
// the real names.
#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

#define SR_EXPORT extern "C" __attribute__((visibility("default")))

namespace softrdma::abi {

struct Device {
  ibv_device dev;              // what ibv_get_device_list hands out (stable for the process's lifetime)
  const void* ops;             // verbs_device::ops at +664: never a real provider's, so mlx5dv/efadv decline
  const io::DeviceInfo* info;  // immutable (a changed interface gets a new Device)
  int index;                   // ibv_get_device_index: the interface index
};
static_assert(offsetof(Device, ops) == 664, "verbs_device shape");

struct Context {
  verbs_context vctx;  // vctx.context is the application's ibv_context
  Device* device;
  softrdma::Context* native;  // owns the UDP socket, the core context and the progress thread
  core::Context* core;
  int gid_index;  // the GID (address) the context's socket is bound to
};

struct Pd {
  ibv_pd pd;
  core::Pd* core;
};

struct Mr {
  ibv_mr mr;
  core::Mr* core;
};

struct Channel {
  ibv_comp_channel ch;
  core::CompChannel* core;
};

struct Cq {
  ibv_cq_ex cqx;  // begins with the fields of ibv_cq
  core::Cq* core;
  uint64_t wc_flags;  // what create_cq_ex asked for
  Wc cur;             // the completion start_poll/next_poll reached
};

struct Srq {
  ibv_srq srq;
  core::Srq* core;
};

struct Ah {
  ibv_ah ah;
  core::Ah* core;
};

// A work request built by the wr_* ops of ibv_qp_ex, with storage for its SGEs and inline data.
struct PendingWr {
  core::SendWr wr;
  uint32_t num_sge = 0;
  Sge sge[core::kMaxSge];
  alignas(8) uint8_t inl[core::kMaxInline];
};

struct Qp {
  ibv_qp_ex qpx;  // begins with ibv_qp
  core::Qp* core;
  // wr_start .. wr_complete
  std::deque<PendingWr> pending;  // a deque: an inline SGE points into its element, which must not move
  size_t npending = 0;
  int wr_err = 0;
};

inline Context* to_ctx(ibv_context* c) {
  return reinterpret_cast<Context*>(reinterpret_cast<char*>(c) - offsetof(verbs_context, context));
}
inline Device* to_dev(ibv_device* d) { return reinterpret_cast<Device*>(d); }
inline Pd* to_pd(ibv_pd* p) { return reinterpret_cast<Pd*>(p); }
inline Mr* to_mr(ibv_mr* m) { return reinterpret_cast<Mr*>(m); }
inline Cq* to_cq(ibv_cq* c) { return reinterpret_cast<Cq*>(c); }
inline Cq* to_cq(ibv_cq_ex* c) { return reinterpret_cast<Cq*>(c); }
inline Channel* to_channel(ibv_comp_channel* c) { return reinterpret_cast<Channel*>(c); }
inline Srq* to_srq(ibv_srq* s) { return reinterpret_cast<Srq*>(s); }
inline Ah* to_ah(ibv_ah* a) { return reinterpret_cast<Ah*>(a); }
inline Qp* to_qp(ibv_qp* q) { return reinterpret_cast<Qp*>(q); }
inline Qp* to_qp(ibv_qp_ex* q) { return reinterpret_cast<Qp*>(q); }

// ibv_sge and the core's Sge are the same three fields.
static_assert(sizeof(ibv_sge) == sizeof(Sge) && offsetof(ibv_sge, length) == offsetof(Sge, length) &&
              offsetof(ibv_sge, lkey) == offsetof(Sge, lkey));
inline const Sge* to_sge(const ibv_sge* s) { return reinterpret_cast<const Sge*>(s); }

// Pointer-returning verbs fail with NULL and errno.
template <typename T>
T* fail(int err) {
  errno = err;
  return nullptr;
}

// Shared by the object and extended-verbs files.
void fill_ops(Context* ctx);
void register_cq_ex(Context* ctx);
void init_qp_ex(Qp* qp);
void init_cq_ex(Cq* cq);
bool sgid_usable(Context* ctx, const ibv_ah_attr& ah);
void to_core_ah(const ibv_ah_attr& in, core::AhAttr* out);
void from_core_ah(const core::AhAttr& in, ibv_ah_attr* out);
void to_ibv_wc(const Wc& in, ibv_wc* out);
ibv_qp* create_qp_common(Context* ctx, Pd* pd, const ibv_qp_init_attr_ex& attr);

}  // namespace softrdma::abi
