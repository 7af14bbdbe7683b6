// The native C++ API of softrdma: RAII handles over the soft NIC, errors as std::expected<T, errno>.
// Value types (Wc, Sge, enums) are in softrdma/types.h with libibverbs' numbering; the attribute and work
// request structs are the core's own (core::QpAttr, core::SendWr, ...), re-exported here.
//
//   auto ctx = softrdma::Context::open("sr_lo");          // one per device and process
//   auto pd = ctx->alloc_pd();
//   auto mr = pd->reg_mr(buf, len, kLocalWrite | kRemoteWrite);
//   auto cq = ctx->create_cq(256);
//   auto qp = pd->create_qp({.type = QpType::kRc, ...});   // then modify to INIT, RTR, RTS
#pragma once

#include <cstdint>
#include <expected>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/context.h"
#include "softrdma/types.h"

namespace softrdma {

template <typename T>
using Result = std::expected<T, int>;  // the error is an errno value, as rdma-core's

using core::AhAttr;
using core::QpAttr;
using core::QpCap;
using core::RecvWr;
using core::SendWr;

struct GidEntry {
  wire::Gid gid;
  bool roce_v2 = true;
};

struct DeviceInfo {
  std::string name;    // "sr_lo"
  std::string ifname;  // "lo"
  uint32_t if_mtu = 0;
  Mtu active_mtu = Mtu::k1024;
  uint64_t node_guid = 0;
  bool active = false;
  std::vector<GidEntry> gids;
};

// Every device softrdma offers (one per interface with an address; SOFTRDMA_DEVICES restricts them).
std::vector<DeviceInfo> list_devices();

struct OpenOptions {
  bool standard_port = false;  // RoCEv2 standard mode: bind UDP 4791 (one process per address)
  int gid_index = 1;           // the address the context binds (1: the IPv4 one, as users of rxe expect)
};

class CompletionChannel;
class CompletionQueue;
class ProtectionDomain;
class MemoryRegion;
class QueuePair;
class AddressHandle;
class SharedReceiveQueue;

class Context {
 public:
  static Result<std::unique_ptr<Context>> open(std::string_view device = {}, const OpenOptions& opt = {});
  ~Context();
  const DeviceInfo& device() const;
  const wire::Gid& gid() const;  // the address this context's QPs use
  Result<std::unique_ptr<ProtectionDomain>> alloc_pd();
  Result<std::unique_ptr<CompletionChannel>> create_comp_channel();
  Result<std::unique_ptr<CompletionQueue>> create_cq(uint32_t cqe, CompletionChannel* channel = nullptr);
  Counters& counters();
  core::Context* core() { return ctx_; }

 private:
  struct Impl;
  explicit Context(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  core::Context* ctx_;
};

class CompletionChannel {
 public:
  ~CompletionChannel() = default;
  int fd() const { return ch_->fd(); }
  // Blocks until a CQ armed with req_notify gets a completion; returns it. Meanwhile this thread receives
  // the context's packets itself (core::Context::wait_for_event), unless the fd was made non-blocking.
  Result<CompletionQueue*> get_event();

 private:
  friend class Context;
  std::unique_ptr<core::CompChannel> ch_;
  core::Context* ctx_ = nullptr;
};

class CompletionQueue {
 public:
  ~CompletionQueue();
  int poll(std::span<Wc> out) { return cq_->poll(out); }
  Result<void> req_notify(bool solicited_only = false);
  core::Cq* core() const { return cq_; }

 private:
  friend class Context;
  core::Context* ctx_ = nullptr;
  core::Cq* cq_ = nullptr;
};

class MemoryRegion {
 public:
  ~MemoryRegion();
  uint32_t lkey() const { return mr_->key; }
  uint32_t rkey() const { return mr_->key; }
  void* addr() const { return mr_->addr; }
  uint64_t length() const { return mr_->length; }
  Sge sge(uint64_t offset, uint32_t len) const {
    return {reinterpret_cast<uint64_t>(mr_->addr) + offset, len, mr_->key};
  }

 private:
  friend class ProtectionDomain;
  core::Context* ctx_ = nullptr;
  core::Mr* mr_ = nullptr;
};

struct QpInit {
  QpType type = QpType::kRc;
  CompletionQueue* send_cq = nullptr;
  CompletionQueue* recv_cq = nullptr;
  SharedReceiveQueue* srq = nullptr;
  QpCap cap{128, 128, 1, 1, 64};
  bool sq_sig_all = false;
};

class QueuePair {
 public:
  ~QueuePair();
  uint32_t qpn() const { return qp_->qpn(); }
  Result<void> modify(const QpAttr& attr, uint32_t mask);
  Result<QpAttr> query() const;
  Result<void> post_send(std::span<const SendWr> wrs);
  Result<void> post_send(const SendWr& wr) { return post_send(std::span(&wr, 1)); }
  Result<void> post_recv(std::span<const RecvWr> wrs);
  Result<void> post_recv(const RecvWr& wr) { return post_recv(std::span(&wr, 1)); }
  core::Qp* core() const { return qp_; }

 private:
  friend class ProtectionDomain;
  core::Context* ctx_ = nullptr;
  core::Qp* qp_ = nullptr;
};

class AddressHandle {
 public:
  ~AddressHandle();
  core::Ah* core() const { return ah_; }

 private:
  friend class ProtectionDomain;
  core::Context* ctx_ = nullptr;
  core::Ah* ah_ = nullptr;
};

class SharedReceiveQueue {
 public:
  ~SharedReceiveQueue();
  Result<void> post_recv(const RecvWr& wr);
  core::Srq* core() const { return srq_; }

 private:
  friend class ProtectionDomain;
  core::Context* ctx_ = nullptr;
  core::Srq* srq_ = nullptr;
};

class ProtectionDomain {
 public:
  ~ProtectionDomain();
  Result<std::unique_ptr<MemoryRegion>> reg_mr(void* addr, uint64_t length, uint32_t access);
  Result<std::unique_ptr<QueuePair>> create_qp(const QpInit& init);
  Result<std::unique_ptr<AddressHandle>> create_ah(const AhAttr& attr);
  Result<std::unique_ptr<SharedReceiveQueue>> create_srq(uint32_t max_wr, uint32_t max_sge, uint32_t limit = 0);
  core::Pd* core() const { return pd_; }

 private:
  friend class Context;
  core::Context* ctx_ = nullptr;
  core::Pd* pd_ = nullptr;
};

}  // namespace softrdma
