// The verbs objects other than the QP: PD, MR (and its key table), CQ, completion channel, SRQ, AH.
// The transport reads and writes them; the native API and the C ABI hand them out.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <expected>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "core/sync.h"
#include "softrdma/types.h"
#include "wire/addr.h"

namespace softrdma::core {

using Nanos = uint64_t;
class Context;

inline constexpr uint32_t kMaxSge = 16;
inline constexpr uint32_t kMaxInline = 256;
inline constexpr uint32_t kMaxQpWr = 16384;
inline constexpr uint32_t kMaxCqe = 1u << 20;
inline constexpr uint32_t kMaxMr = 1u << 15;
// Objects per context (what ibv_query_device reports; one more fails with ENOMEM). QPs: each 256 take a
// UDP socket with its receive buffers (2 MiB), so 16384 QPs hold 64 sockets and 128 MiB.
inline constexpr uint32_t kMaxQp = 1u << 14;
inline constexpr uint32_t kMaxCq = 1u << 16;
inline constexpr uint32_t kMaxPd = 1u << 16;
inline constexpr uint32_t kMaxAh = 1u << 16;
inline constexpr uint32_t kMaxSrq = 1u << 16;
inline constexpr uint32_t kMaxRdAtomic = 128;
inline constexpr uint64_t kMaxMsgSize = 1ull << 31;  // 2 GiB
inline constexpr uint32_t kGrhLen = 40;

struct Pd {
  Context* ctx = nullptr;
  uint32_t id = 0;  // unique in its context (peers compare an MR's PD with a QP's by it: io/shm)
  std::atomic<uint32_t> users{0};  // MRs, QPs, SRQs and AHs that use it: dealloc is EBUSY until 0
  void* user_context = nullptr;
};

// A registered region. MR structs are never returned to the allocator while their context lives (a
// deregistered one is reused for a later registration), so a stale pointer held by a packet in flight
// reads a valid struct whose `valid` flag or key no longer matches; deregistration waits for `inflight`.
struct Mr {
  Pd* pd = nullptr;
  uint8_t* addr = nullptr;  // host address of the first byte
  uint64_t length = 0;
  uint64_t iova = 0;  // the address remote peers use (== addr unless registered with reg_mr_iova)
  uint32_t access = 0;
  uint32_t key = 0;  // lkey == rkey
  std::atomic<bool> valid{false};
  std::atomic<uint32_t> inflight{0};
  void* user_context = nullptr;

  bool contains(uint64_t va, uint64_t len) const {
    return va >= iova && len <= length && va - iova <= length - len;
  }
  uint8_t* host(uint64_t va) const { return addr + (va - iova); }
};

// Holds an MR for the duration of one access (responder or requester), so deregistration waits for it.
class MrRef {
 public:
  MrRef() = default;
  explicit MrRef(Mr* mr) : mr_(mr) {}
  MrRef(MrRef&& o) noexcept : mr_(o.mr_) { o.mr_ = nullptr; }
  MrRef& operator=(MrRef&& o) noexcept {
    reset();
    mr_ = o.mr_;
    o.mr_ = nullptr;
    return *this;
  }
  ~MrRef() { reset(); }
  void reset() {
    if (mr_) mr_->inflight.fetch_sub(1, std::memory_order_release);
    mr_ = nullptr;
  }
  Mr* get() const { return mr_; }
  Mr* operator->() const { return mr_; }
  explicit operator bool() const { return mr_ != nullptr; }

 private:
  Mr* mr_ = nullptr;
};

// Key -> MR. Keys are random 32-bit values (not guessable); lookups are lock-free (open addressing of
// atomic pointers), registration and deregistration take a mutex.
class MrTable {
 public:
  MrTable();
  void seed_keys(uint64_t seed) { rng_ = seed | 1; }  // repeatable keys (ContextConfig::mr_key_seed)
  std::expected<Mr*, int> add(Pd* pd, void* addr, uint64_t length, uint64_t iova, uint32_t access);
  int remove(Mr* mr);  // waits for accesses in flight
  // The MR with this key, held, or empty. The caller checks PD, access and bounds.
  MrRef find(uint32_t key) const;
  uint32_t size() const { return count_; }

 private:
  static constexpr uint32_t kSlots = kMaxMr * 2;
  static Mr* tombstone() { return reinterpret_cast<Mr*>(uintptr_t{1}); }
  uint32_t slot_of(uint32_t key) const { return (key * 0x9E3779B1u) & (kSlots - 1); }
  uint32_t random_key();

  std::unique_ptr<std::atomic<Mr*>[]> slots_;
  std::mutex mu_;
  std::deque<Mr> pool_;
  std::vector<Mr*> free_;
  uint32_t count_ = 0;
  uint64_t rng_;
};

class Cq;

// ibv_comp_channel: an eventfd (pollable; one event per read) and the CQs that fired, in order.
class CompChannel {
 public:
  static std::expected<std::unique_ptr<CompChannel>, int> create();
  ~CompChannel();
  int fd() const { return fd_; }
  void notify(Cq* cq);
  // Blocks (unless the fd was made non-blocking) until a CQ fires; returns it. With `ctx` (the context of
  // the channel's CQs), a blocking wait receives on this thread meanwhile (Context::wait_for_event).
  std::expected<Cq*, int> get_event(Context* ctx = nullptr);
  bool has_event() {
    std::lock_guard g(mu_);
    return !fired_.empty();
  }
  std::atomic<uint32_t> users{0};

 private:
  int fd_ = -1;
  std::mutex mu_;
  std::deque<Cq*> fired_;
  // Events that fired on the thread that waits for them in get_event, not yet counted on the fd: that
  // thread takes one without the write and the read of the fd, and counts the rest there before it returns.
  uint64_t unwritten_ = 0;
};

class Cq {
 public:
  Cq(Context* ctx, uint32_t cqe, CompChannel* channel, void* user_context);
  ~Cq();
  // Adds a completion; false when the ring is full (the completion is lost and the CQ is in error: the
  // context raises IBV_EVENT_CQ_ERR, as the IBTA requires, instead of losing it silently).
  bool push(const Wc& wc, bool solicited);
  int poll(std::span<Wc> out);
  int req_notify(bool solicited_only);
  uint32_t capacity() const { return cap_; }
  // Completions waiting to be polled. Without the lock: head is read first, and tail, which only grows
  // and is never behind head, after it, so the difference is never negative (a moment's count).
  uint32_t pending() const {
    const uint64_t head = head_.load(std::memory_order_acquire);
    return static_cast<uint32_t>(tail_.load(std::memory_order_acquire) - head);
  }
  bool overflowed() const { return overflow_.load(std::memory_order_relaxed); }
  Context* ctx() const { return ctx_; }
  CompChannel* channel() const { return channel_; }
  // An application waits for this CQ's events: it has a channel and armed the CQ within the last
  // kEventsRecentNs, or it is armed now. UCX's workers create their CQs with a channel but busy-poll, and
  // arm them only before they sleep: for the rest they are polled like any other (ACKs deferred to the
  // next post, answers held), as a channel alone had them not (UCT put_lat over sockets: a send call for
  // the ACK and another for the next WRITE in each half round trip).
  bool events_awaited(Nanos now) const {
    if (channel_ == nullptr) return false;
    const Nanos at = armed_at_.load(std::memory_order_relaxed);
    // (`now` may be a caller's reading from before another thread's req_notify: later, not long ago.)
    return armed_.load(std::memory_order_relaxed) != 0 ||
           (at != 0 && (now < at || now - at < kEventsRecentNs));
  }
  static constexpr Nanos kEventsRecentNs = 10'000'000;
  void* user_context = nullptr;
  std::atomic<uint32_t> users{0};  // QPs using it
  uint32_t events_completed = 0;   // ibv_ack_cq_events bookkeeping
  // Calls of poll() so far (a hint: concurrent pollers may lose each other's counts).
  uint32_t polls() const { return polls_.load(std::memory_order_relaxed); }
  // Holds every completion back from polls until `until`, or until release_hold (Context::kAnswerHoldNs:
  // the ACK of a ping-pong came without the peer's answer). A held poll receives, so the answer it waits
  // for lands meanwhile. Completions still go to the CQ as they come; only polls wait.
  void hold(Nanos until) { hold_until_.store(until, std::memory_order_relaxed); }
  // Moves a hold's end to `until` if it is later (no hold: none made).
  void extend_hold(Nanos until) {
    Nanos cur = hold_until_.load(std::memory_order_relaxed);
    if (cur != 0 && cur < until) hold_until_.compare_exchange_strong(cur, until, std::memory_order_relaxed);
  }
  void release_hold() {
    if (hold_until_.load(std::memory_order_relaxed) != 0) hold_until_.store(0, std::memory_order_release);
  }

 private:
  uint32_t take(std::span<Wc> out);
  bool held();
  std::atomic<uint32_t> polls_{0};
  std::atomic<Nanos> hold_until_{0};

  Context* ctx_;
  CompChannel* channel_;
  uint32_t cap_;
  uint32_t mask_;
  std::vector<Wc> ring_;
  mutable SpinLock lock_;
  // Changed under lock_; atomic so that a poll may find the CQ empty without it (take).
  std::atomic<uint64_t> head_{0};  // next to poll
  std::atomic<uint64_t> tail_{0};  // next to fill
  std::atomic<uint8_t> armed_{0};  // 0 off, 1 any completion, 2 solicited only
  std::atomic<Nanos> armed_at_{0};  // the last req_notify (events_awaited; 0: none yet)
  std::atomic<bool> overflow_{false};
};

struct RecvWqe {
  uint64_t wr_id = 0;
  uint32_t num_sge = 0;
  uint32_t length = 0;  // sum of SGE lengths
  Sge sge[kMaxSge];
};

// A bounded FIFO of receive WQEs (the RQ of a QP, or an SRQ).
class RecvQueue {
 public:
  void init(uint32_t max_wr, uint32_t max_sge);
  int post(const RecvWqe& wqe);  // ENOMEM when full
  bool pop(RecvWqe* out);
  bool empty() const { return head_ == tail_; }
  uint32_t count() const { return static_cast<uint32_t>(tail_ - head_); }
  uint32_t max_wr() const { return max_wr_; }
  uint32_t max_sge() const { return max_sge_; }
  template <typename F>
  void drain(F&& f) {
    RecvWqe w;
    while (pop(&w)) f(w);
  }

 private:
  std::vector<RecvWqe> ring_;
  uint32_t max_wr_ = 0, max_sge_ = 0, mask_ = 0;
  uint64_t head_ = 0, tail_ = 0;
};

class Srq {
 public:
  Srq(Context* ctx, Pd* pd, uint32_t max_wr, uint32_t max_sge, uint32_t limit, void* user_context);
  int post(const RecvWqe& wqe);
  bool pop(RecvWqe* out);  // raises SRQ_LIMIT_REACHED when the count falls below an armed limit
  int modify(uint32_t max_wr, uint32_t limit, uint32_t mask);  // mask: 1 = max_wr, 2 = limit (IBV_SRQ_*)
  uint32_t max_wr() const { return q_.max_wr(); }
  uint32_t max_sge() const { return q_.max_sge(); }
  uint32_t limit() const { return limit_; }
  Pd* pd() const { return pd_; }
  void* user_context = nullptr;
  std::atomic<uint32_t> users{0};

 private:
  Context* ctx_;
  Pd* pd_;
  SpinLock lock_;
  RecvQueue q_;
  uint32_t limit_ = 0;  // 0 = not armed
};

// Address vector (ibv_ah_attr with its GRH), resolved to the peer's UDP endpoint base address.
struct AhAttr {
  wire::Gid dgid;
  uint32_t flow_label = 0;
  uint8_t sgid_index = 0;
  uint8_t hop_limit = 64;
  uint8_t traffic_class = 0;
  uint8_t sl = 0;
  uint8_t port_num = 1;
  uint16_t dlid = 0;
  bool is_global = true;
};

struct Ah {
  Pd* pd = nullptr;
  AhAttr attr;
};

}  // namespace softrdma::core
