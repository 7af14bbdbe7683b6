#include "engine/progress.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace softrdma::engine {

Progress::Progress(core::Context* ctx, const ProgressConfig& cfg) : ctx_(ctx), cfg_(cfg) {
  tx_.sink = ctx->backend();
}

Progress::~Progress() {
  stop();
  if (wake_fd_ >= 0) close(wake_fd_);
  if (epfd_ >= 0) close(epfd_);
}

int Progress::start() {
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epfd_ < 0 || wake_fd_ < 0) return errno;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u32 = 1;
  if (epoll_ctl(epfd_, EPOLL_CTL_ADD, wake_fd_, &ev) != 0) return errno;
  if (int fd = ctx_->backend()->poll_fd(); fd >= 0) {
    ev.data.u32 = 2;
    if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) return errno;
  }
  ctx_->set_kick([](void* self) { static_cast<Progress*>(self)->kick(); }, this);
  thread_ = std::thread([this] { run(); });
  return 0;
}

void Progress::stop() {
  if (!thread_.joinable()) return;
  stop_.store(true);
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);
  thread_.join();
  ctx_->set_kick(nullptr, nullptr);
}

void Progress::kick() {
  // Only a sleeping thread needs the syscall; a spinning one sees new deadlines on its own.
  if (sleeping_.load(std::memory_order_acquire)) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);
  }
}

bool Progress::poll_once(core::Nanos now) {
  io::RxPacket pkts[io::TxBatch::kMax];
  bool any = false;
  // Drain what is queued, a burst at a time, bounded so timers still run under a flood.
  for (int i = 0; i < 64; ++i) {
    const uint32_t n = ctx_->backend()->rx_burst(pkts, io::TxBatch::kMax);
    if (n == 0) break;
    any = true;
    ctx_->rx_burst(std::span(pkts, n), tx_, now);
  }
  return any;
}

void Progress::run() {
  core::Nanos last_activity = ctx_->now();
  core::Nanos tick_at = 0;
  constexpr core::Nanos kTickEvery = 100'000;  // while spinning, a timer armed meanwhile is seen this late
  while (!stop_.load(std::memory_order_relaxed)) {
    core::Nanos now = ctx_->now();
    if (poll_once(now)) last_activity = now;
    if (now >= tick_at) {
      const core::Nanos next = ctx_->tick(tx_, now);
      tick_at = next ? std::min(next, now + kTickEvery) : now + kTickEvery;
    }
    if (now - last_activity < core::Nanos{cfg_.spin_us} * 1000) continue;

    // Sleep until a packet, a kick or the next timer.
    sleeping_.store(true, std::memory_order_release);
    const core::Nanos next_deadline = ctx_->tick(tx_, ctx_->now());
    int timeout_ms = -1;
    if (next_deadline) {
      now = ctx_->now();
      timeout_ms = next_deadline <= now ? 0 : static_cast<int>((next_deadline - now + 999'999) / 1'000'000);
    }
    epoll_event evs[4];
    const int n = epoll_wait(epfd_, evs, 4, timeout_ms);
    sleeping_.store(false, std::memory_order_release);
    for (int i = 0; i < n; ++i) {
      if (evs[i].data.u32 == 1) {
        uint64_t v;
        [[maybe_unused]] ssize_t r = read(wake_fd_, &v, sizeof v);
      }
    }
    last_activity = ctx_->now();
    tick_at = 0;  // after waking, run timers at once: a kick may have armed an earlier one
  }
}

}  // namespace softrdma::engine
