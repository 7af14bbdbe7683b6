// The native API: handles that own core objects, over a context whose soft NIC runs on UDP sockets and a
// progress thread.
#include "softrdma/softrdma.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "engine/progress.h"
#include "io/netif.h"
#include "io/stats_shm.h"
#include "io/shm/shm_io.h"
#include "io/udp/udp_io.h"

namespace softrdma {

namespace {
DeviceInfo to_public(const io::DeviceInfo& d) {
  DeviceInfo out;
  out.name = d.name;
  out.ifname = d.ifname;
  out.if_mtu = d.if_mtu;
  out.active_mtu = static_cast<Mtu>(d.active_mtu_enum);
  out.node_guid = d.node_guid;
  out.active = d.active;
  for (const auto& g : d.gids) out.gids.push_back({g.gid, g.roce_v2});
  return out;
}

// SOFTRDMA_DIRECT_STREAM: bytes, a decimal number up to 2^31 (0: only WRs posted alone go one-sided).
// Unset: the default. False, said on stderr, when malformed.
bool direct_stream_min_by_env(uint32_t& out) {
  const char* v = getenv("SOFTRDMA_DIRECT_STREAM");
  if (v == nullptr) return true;
  char* end = nullptr;
  errno = 0;
  const unsigned long n = std::strtoul(v, &end, 10);
  if (*v < '0' || *v > '9' || end == v || *end != '\0' || errno != 0 || n > (1ul << 31)) {
    std::fprintf(stderr, "softrdma: SOFTRDMA_DIRECT_STREAM=%s: want a number of bytes (0: off)\n", v);
    return false;
  }
  out = static_cast<uint32_t>(n);
  return true;
}

// SOFTRDMA_STANDARD_PORT: 1 binds every QP of the context at UDP 4791 (RoCEv2's standard port, where
// kernel Soft-RoCE and RoCE NICs send), 0 or unset leaves it to OpenOptions. False, said on stderr, when
// malformed.
bool standard_port_by_env(bool& out) {
  const char* v = getenv("SOFTRDMA_STANDARD_PORT");
  if (v == nullptr) return true;
  if ((v[0] != '0' && v[0] != '1') || v[1] != '\0') {
    std::fprintf(stderr, "softrdma: SOFTRDMA_STANDARD_PORT=%s: want 1 (UDP 4791) or 0\n", v);
    return false;
  }
  out = out || v[0] == '1';
  return true;
}
}  // namespace

std::vector<DeviceInfo> list_devices() {
  std::vector<DeviceInfo> out;
  for (const io::DeviceInfo& d : io::list_devices()) out.push_back(to_public(d));
  return out;
}

struct Context::Impl {
  DeviceInfo device;
  wire::Gid gid;
  std::unique_ptr<io::StatsRegion> stats;
  Counters own_counters;
  std::unique_ptr<io::Backend> backend;  // UdpIo, or ShmIo over it (the same-host path)
  std::unique_ptr<core::Context> ctx;
  std::unique_ptr<engine::Progress> progress;
};

Context::Context(std::unique_ptr<Impl> impl) : impl_(std::move(impl)), ctx_(impl_->ctx.get()) {}

Context::~Context() {
  impl_->progress.reset();  // stop receiving before the objects go
}

Result<std::unique_ptr<Context>> Context::open(std::string_view name, const OpenOptions& opt) {
  std::optional<io::DeviceInfo> dev;
  if (name.empty()) {
    auto all = io::list_devices();
    if (all.empty()) return std::unexpected(ENODEV);
    dev = all.front();
  } else {
    dev = io::find_device(name);
  }
  if (!dev) return std::unexpected(ENODEV);
  uint32_t stream_min = core::ContextConfig{}.direct_stream_min;
  if (!direct_stream_min_by_env(stream_min)) return std::unexpected(EINVAL);
  bool standard_port = opt.standard_port;
  if (!standard_port_by_env(standard_port)) return std::unexpected(EINVAL);
  if (opt.gid_index < 0 || static_cast<size_t>(opt.gid_index) >= dev->gids.size()) return std::unexpected(EINVAL);
  auto impl = std::make_unique<Impl>();
  impl->device = to_public(*dev);
  impl->gid = dev->gids[opt.gid_index].gid;
  Counters* counters = &impl->own_counters;
  if (auto st = io::StatsRegion::create(dev->name); st) {
    impl->stats = std::move(*st);
    counters = impl->stats->counters();
  }
  auto udp = io::UdpIo::create(impl->gid, counters);
  if (!udp) return std::unexpected(udp.error());
  if (io::ShmIo::enabled_by_env()) {
    // Without it (no /dev/shm, say) the context works over UDP alone.
    auto shm = io::ShmIo::create(std::move(*udp), counters);
    if (shm) {
      impl->backend = std::move(*shm);
    } else if (shm.error() == EINVAL) {
      return std::unexpected(EINVAL);  // a malformed SOFTRDMA_FAULTS, said on stderr
    } else {
      udp = io::UdpIo::create(impl->gid, counters);
      if (!udp) return std::unexpected(udp.error());
    }
  }
  if (!impl->backend) impl->backend = std::move(*udp);
  core::ContextConfig cfg;
  cfg.direct_stream_min = stream_min;
  cfg.device_name = dev->name;
  cfg.active_mtu = dev->active_mtu_bytes;
  cfg.standard_port = standard_port;
  impl->ctx = std::make_unique<core::Context>(impl->backend.get(), counters, cfg);
  impl->progress = std::make_unique<engine::Progress>(impl->ctx.get());
  if (int err = impl->progress->start()) return std::unexpected(err);
  return std::unique_ptr<Context>(new Context(std::move(impl)));
}

const DeviceInfo& Context::device() const { return impl_->device; }
const wire::Gid& Context::gid() const { return impl_->gid; }
Counters& Context::counters() { return ctx_->counters(); }

Result<std::unique_ptr<ProtectionDomain>> Context::alloc_pd() {
  auto pd = ctx_->alloc_pd();
  if (!pd) return std::unexpected(pd.error());
  auto h = std::unique_ptr<ProtectionDomain>(new ProtectionDomain);
  h->ctx_ = ctx_;
  h->pd_ = *pd;
  return h;
}

Result<std::unique_ptr<CompletionChannel>> Context::create_comp_channel() {
  auto ch = core::CompChannel::create();
  if (!ch) return std::unexpected(ch.error());
  auto h = std::unique_ptr<CompletionChannel>(new CompletionChannel);
  h->ch_ = std::move(*ch);
  h->ctx_ = ctx_;
  return h;
}

Result<std::unique_ptr<CompletionQueue>> Context::create_cq(uint32_t cqe, CompletionChannel* channel) {
  auto h = std::unique_ptr<CompletionQueue>(new CompletionQueue);
  auto cq = ctx_->create_cq(cqe, channel ? channel->ch_.get() : nullptr, h.get());
  if (!cq) return std::unexpected(cq.error());
  h->ctx_ = ctx_;
  h->cq_ = *cq;
  return h;
}

Result<CompletionQueue*> CompletionChannel::get_event() {
  auto cq = ch_->get_event(ctx_);
  if (!cq) return std::unexpected(cq.error());
  return static_cast<CompletionQueue*>((*cq)->user_context);
}

CompletionQueue::~CompletionQueue() {
  if (cq_) ctx_->destroy_cq(cq_);
}

Result<void> CompletionQueue::req_notify(bool solicited_only) {
  if (int err = cq_->req_notify(solicited_only)) return std::unexpected(err);
  return {};
}

// A handle whose creation failed holds nothing.
MemoryRegion::~MemoryRegion() {
  if (mr_) ctx_->dereg_mr(mr_);
}
QueuePair::~QueuePair() {
  if (qp_) ctx_->destroy_qp(qp_);
}
AddressHandle::~AddressHandle() {
  if (ah_) ctx_->destroy_ah(ah_);
}
SharedReceiveQueue::~SharedReceiveQueue() {
  if (srq_) ctx_->destroy_srq(srq_);
}
ProtectionDomain::~ProtectionDomain() {
  if (pd_) ctx_->dealloc_pd(pd_);
}

Result<void> QueuePair::modify(const QpAttr& attr, uint32_t mask) {
  if (int err = qp_->modify(attr, mask)) return std::unexpected(err);
  return {};
}

Result<QpAttr> QueuePair::query() const {
  QpAttr a;
  if (int err = qp_->query(&a, nullptr)) return std::unexpected(err);
  return a;
}

Result<void> QueuePair::post_send(std::span<const SendWr> wrs) {
  size_t bad;
  if (int err = qp_->post_send(wrs, &bad)) return std::unexpected(err);
  return {};
}

Result<void> QueuePair::post_recv(std::span<const RecvWr> wrs) {
  size_t bad;
  if (int err = qp_->post_recv(wrs, &bad)) return std::unexpected(err);
  return {};
}

Result<void> SharedReceiveQueue::post_recv(const RecvWr& wr) {
  core::RecvWqe w;
  w.wr_id = wr.wr_id;
  if (wr.sg_list.size() > core::kMaxSge) return std::unexpected(EINVAL);
  w.num_sge = static_cast<uint32_t>(wr.sg_list.size());
  for (size_t i = 0; i < wr.sg_list.size(); ++i) {
    w.sge[i] = wr.sg_list[i];
    w.length += wr.sg_list[i].length;
  }
  if (int err = srq_->post(w)) return std::unexpected(err);
  return {};
}

Result<std::unique_ptr<MemoryRegion>> ProtectionDomain::reg_mr(void* addr, uint64_t length, uint32_t access) {
  auto mr = ctx_->reg_mr(pd_, addr, length, reinterpret_cast<uint64_t>(addr), access);
  if (!mr) return std::unexpected(mr.error());
  auto h = std::unique_ptr<MemoryRegion>(new MemoryRegion);
  h->ctx_ = ctx_;
  h->mr_ = *mr;
  return h;
}

Result<std::unique_ptr<QueuePair>> ProtectionDomain::create_qp(const QpInit& init) {
  core::QpInitAttr a;
  a.type = init.type;
  a.send_cq = init.send_cq ? init.send_cq->core() : nullptr;
  a.recv_cq = init.recv_cq ? init.recv_cq->core() : nullptr;
  a.srq = init.srq ? init.srq->core() : nullptr;
  a.cap = init.cap;
  a.sq_sig_all = init.sq_sig_all;
  auto qp = ctx_->create_qp(pd_, a);
  if (!qp) return std::unexpected(qp.error());
  auto h = std::unique_ptr<QueuePair>(new QueuePair);
  h->ctx_ = ctx_;
  h->qp_ = *qp;
  return h;
}

Result<std::unique_ptr<AddressHandle>> ProtectionDomain::create_ah(const AhAttr& attr) {
  auto ah = ctx_->create_ah(pd_, attr);
  if (!ah) return std::unexpected(ah.error());
  auto h = std::unique_ptr<AddressHandle>(new AddressHandle);
  h->ctx_ = ctx_;
  h->ah_ = *ah;
  return h;
}

Result<std::unique_ptr<SharedReceiveQueue>> ProtectionDomain::create_srq(uint32_t max_wr, uint32_t max_sge,
                                                                        uint32_t limit) {
  auto srq = ctx_->create_srq(pd_, max_wr, max_sge, limit);
  if (!srq) return std::unexpected(srq.error());
  auto h = std::unique_ptr<SharedReceiveQueue>(new SharedReceiveQueue);
  h->ctx_ = ctx_;
  h->srq_ = *srq;
  return h;
}

const char* wc_status_str(WcStatus s) {
  static const char* const kNames[] = {
      "success", "local length error", "local QP operation error", "local EE context operation error",
      "local protection error", "Work Request Flushed Error", "memory management operation error",
      "bad response error", "local access error", "remote invalid request error", "remote access error",
      "remote operation error", "transport retry counter exceeded", "RNR retry counter exceeded",
      "local RDD violation error", "remote invalid RD request", "aborted error", "invalid EE context number",
      "invalid EE context state", "fatal error", "response timeout error", "general error"};
  const auto i = static_cast<size_t>(s);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

}  // namespace softrdma
