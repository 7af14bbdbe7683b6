#include "core/objects.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <thread>
#include <utility>

#include "core/context.h"

namespace softrdma::core {

// ---- MrTable ----

MrTable::MrTable() : slots_(new std::atomic<Mr*>[kSlots]) {
  for (uint32_t i = 0; i < kSlots; ++i) slots_[i].store(nullptr, std::memory_order_relaxed);
  if (getrandom(&rng_, sizeof rng_, 0) != sizeof rng_) rng_ = reinterpret_cast<uintptr_t>(this) ^ 0x9E3779B97F4A7C15ull;
  rng_ |= 1;
}

uint32_t MrTable::random_key() {
  // xorshift64*, seeded from getrandom: keys are not predictable from earlier ones without the seed.
  rng_ ^= rng_ >> 12;
  rng_ ^= rng_ << 25;
  rng_ ^= rng_ >> 27;
  return static_cast<uint32_t>((rng_ * 0x2545F4914F6CDD1Dull) >> 32);
}

std::expected<Mr*, int> MrTable::add(Pd* pd, void* addr, uint64_t length, uint64_t iova, uint32_t access) {
  std::lock_guard g(mu_);
  if (count_ >= kMaxMr) return std::unexpected(ENOMEM);
  uint32_t key;
  for (;;) {
    key = random_key();
    if (key == 0 || find(key)) continue;
    break;
  }
  Mr* mr;
  if (!free_.empty()) {
    mr = free_.back();
    free_.pop_back();
  } else {
    mr = &pool_.emplace_back();
  }
  mr->pd = pd;
  mr->addr = static_cast<uint8_t*>(addr);
  mr->length = length;
  mr->iova = iova;
  mr->access = access;
  mr->key = key;
  mr->user_context = nullptr;
  mr->valid.store(true, std::memory_order_release);
  for (uint32_t s = slot_of(key);; s = (s + 1) & (kSlots - 1)) {
    Mr* cur = slots_[s].load(std::memory_order_relaxed);
    if (cur == nullptr || cur == tombstone()) {
      slots_[s].store(mr, std::memory_order_release);
      break;
    }
  }
  ++count_;
  return mr;
}

MrRef MrTable::find(uint32_t key) const {
  for (uint32_t s = slot_of(key), n = 0; n < kSlots; s = (s + 1) & (kSlots - 1), ++n) {
    Mr* mr = slots_[s].load(std::memory_order_acquire);
    if (mr == nullptr) return {};
    if (mr == tombstone() || mr->key != key) continue;
    mr->inflight.fetch_add(1, std::memory_order_seq_cst);
    // Re-check after announcing the access: deregistration clears `valid` before it waits.
    if (mr->valid.load(std::memory_order_seq_cst) && mr->key == key) return MrRef(mr);
    mr->inflight.fetch_sub(1, std::memory_order_release);
    return {};
  }
  return {};
}

int MrTable::remove(Mr* mr) {
  std::lock_guard g(mu_);
  if (!mr->valid.load()) return EINVAL;
  for (uint32_t s = slot_of(mr->key);; s = (s + 1) & (kSlots - 1)) {
    Mr* cur = slots_[s].load(std::memory_order_relaxed);
    if (cur == nullptr) return EINVAL;
    if (cur == mr) {
      slots_[s].store(tombstone(), std::memory_order_release);
      break;
    }
  }
  mr->valid.store(false, std::memory_order_seq_cst);
  // Wait for the accesses in flight (a responder copying into or out of this region).
  while (mr->inflight.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
  free_.push_back(mr);
  --count_;
  return 0;
}

// ---- CompChannel ----

std::expected<std::unique_ptr<CompChannel>, int> CompChannel::create() {
  auto ch = std::make_unique<CompChannel>();
  ch->fd_ = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
  if (ch->fd_ < 0) return std::unexpected(errno);
  return ch;
}

CompChannel::~CompChannel() {
  if (fd_ >= 0) close(fd_);
}

namespace {
constinit thread_local CompChannel* tls_waiting_on = nullptr;  // get_event's wait, on this thread
}  // namespace

void CompChannel::notify(Cq* cq) {
  {
    std::lock_guard g(mu_);
    fired_.push_back(cq);
    if (tls_waiting_on == this) {
      ++unwritten_;
      return;
    }
  }
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(fd_, &one, sizeof one);
}

std::expected<Cq*, int> CompChannel::get_event(Context* ctx) {
  if (ctx != nullptr && !has_event()) {
    const int flags = fcntl(fd_, F_GETFL);
    if (flags >= 0 && (flags & O_NONBLOCK) == 0) {
      tls_waiting_on = this;
      const int err = ctx->wait_for_event(*this);
      tls_waiting_on = nullptr;
      Cq* mine = nullptr;
      uint64_t rest;
      {
        std::lock_guard g(mu_);
        if (err == 0 && unwritten_ != 0) {
          --unwritten_;
          mine = fired_.front();
          fired_.pop_front();
        }
        rest = std::exchange(unwritten_, 0);
      }
      if (rest != 0) {
        [[maybe_unused]] ssize_t n = write(fd_, &rest, sizeof rest);
      }
      if (err != 0) return std::unexpected(err);
      if (mine != nullptr) return mine;
    }
  }
  uint64_t v;
  if (read(fd_, &v, sizeof v) != sizeof v) return std::unexpected(errno);
  std::lock_guard g(mu_);
  if (fired_.empty()) return std::unexpected(EAGAIN);
  Cq* cq = fired_.front();
  fired_.pop_front();
  return cq;
}

// ---- Cq ----

Cq::Cq(Context* ctx, uint32_t cqe, CompChannel* channel, void* uc)
    : user_context(uc), ctx_(ctx), channel_(channel) {
  cap_ = std::max<uint32_t>(cqe, 1);
  const uint32_t ring = std::bit_ceil(cap_);
  ring_.resize(ring);
  mask_ = ring - 1;
}

Cq::~Cq() = default;

bool Cq::push(const Wc& wc, bool solicited) {
  {
    std::lock_guard g(lock_);
    const uint64_t tail = tail_.load(std::memory_order_relaxed);
    if (tail - head_.load(std::memory_order_relaxed) >= cap_) {
      overflow_.store(true, std::memory_order_relaxed);
      return false;
    }
    ring_[tail & mask_] = wc;
    tail_.store(tail + 1, std::memory_order_release);
  }
  const uint8_t armed = armed_.load(std::memory_order_acquire);
  // Solicited-only arming fires on solicited completions and on any error completion.
  if (armed == 1 || (armed == 2 && (solicited || wc.status != WcStatus::kSuccess))) {
    if (armed_.exchange(0, std::memory_order_acq_rel) != 0 && channel_) channel_->notify(this);
  }
  return true;
}

int Cq::poll(std::span<Wc> out) {
  polls_.store(polls_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  if (hold_until_.load(std::memory_order_relaxed) != 0 && !out.empty() && held()) return 0;
  uint32_t n = take(out);
  // An empty CQ: the caller is likely busy-polling, so let it run the receive path itself.
  if (n != 0) {
    ctx_->note_app_call();  // an empty poll counts in app_poll_seq (drive_from_app)
    ctx_->app_polled_something();
  } else if (!out.empty() && ctx_->drive_from_app()) {
    if (hold_until_.load(std::memory_order_relaxed) != 0 && held()) return 0;  // this drive set it
    n = take(out);
  }
  return static_cast<int>(n);
}

// A poll while the completions are held: it receives (the answer may come now). Still held: true. The
// hold ends when the answer came, or when the time is up, and then the progress thread is asked to watch
// for the answer, which this thread, once it has the completion, may no longer poll for.
bool Cq::held() {
  ctx_->drive_from_app();
  Nanos until = hold_until_.load(std::memory_order_acquire);
  if (until == 0) return false;
  const Nanos now = ctx_->now();
  if (now < until) return true;
  if (hold_until_.compare_exchange_strong(until, 0, std::memory_order_relaxed))
    ctx_->counters().add(Counter::answer_holds_late);
  ctx_->ask_watch(now);
  return false;
}

uint32_t Cq::take(std::span<Wc> out) {
  // An empty CQ, most polls of a polling loop, is seen without the lock (a completion pushed meanwhile
  // is the next poll's, as if this one had come a moment earlier).
  if (tail_.load(std::memory_order_acquire) == head_.load(std::memory_order_relaxed)) return 0;
  std::lock_guard g(lock_);
  uint64_t head = head_.load(std::memory_order_relaxed);
  const uint64_t tail = tail_.load(std::memory_order_relaxed);
  uint32_t n = 0;
  while (n < out.size() && head != tail) out[n++] = ring_[head++ & mask_];
  head_.store(head, std::memory_order_relaxed);
  return n;
}

int Cq::req_notify(bool solicited_only) {
  armed_at_.store(std::max<Nanos>(ctx_->now(), 1), std::memory_order_relaxed);
  armed_.store(solicited_only ? 2 : 1, std::memory_order_release);
  // The application is about to wait for an event rather than poll: the progress thread must receive.
  ctx_->clear_app_driving();
  ctx_->kick();
  return 0;
}

// ---- RecvQueue / Srq ----

void RecvQueue::init(uint32_t max_wr, uint32_t max_sge) {
  const uint32_t n = std::bit_ceil(std::max<uint32_t>(max_wr, 1));
  ring_.resize(n);
  mask_ = n - 1;
  max_wr_ = n;
  max_sge_ = max_sge;
  head_ = tail_ = 0;
}

int RecvQueue::post(const RecvWqe& wqe) {
  if (tail_ - head_ >= max_wr_) return ENOMEM;
  ring_[tail_++ & mask_] = wqe;
  return 0;
}

bool RecvQueue::pop(RecvWqe* out) {
  if (head_ == tail_) return false;
  *out = ring_[head_++ & mask_];
  return true;
}

Srq::Srq(Context* ctx, Pd* pd, uint32_t max_wr, uint32_t max_sge, uint32_t limit, void* uc)
    : user_context(uc), ctx_(ctx), pd_(pd), limit_(limit) {
  q_.init(max_wr, max_sge);
}

int Srq::post(const RecvWqe& wqe) {
  if (wqe.num_sge > q_.max_sge()) return EINVAL;
  std::lock_guard g(lock_);
  return q_.post(wqe);
}

bool Srq::pop(RecvWqe* out) {
  bool fire = false;
  bool ok;
  {
    std::lock_guard g(lock_);
    ok = q_.pop(out);
    if (limit_ && q_.count() < limit_) {
      limit_ = 0;  // the limit disarms when it fires (ibv_modify_srq re-arms it)
      fire = true;
    }
  }
  if (fire) ctx_->raise(kEventSrqLimitReached, this);
  return ok;
}

int Srq::modify(uint32_t max_wr, uint32_t limit, uint32_t mask) {
  std::lock_guard g(lock_);
  if (mask & 1) return EOPNOTSUPP;  // resizing an SRQ (IBV_SRQ_MAX_WR) is not supported, as in rxe's ABI
  if (mask & 2) {
    if (limit > q_.max_wr()) return EINVAL;
    limit_ = limit;
  }
  (void)max_wr;
  return 0;
}

}  // namespace softrdma::core
