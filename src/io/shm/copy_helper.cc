#include "io/shm/copy_helper.h"

#include <pthread.h>
#include <sched.h>

#include <cerrno>

#include "io/clock.h"

namespace softrdma::io::shm {

CopyHelper::~CopyHelper() {
  if (!running_.load(std::memory_order_acquire)) return;
  stop_.store(true, std::memory_order_release);
  gen_.fetch_add(1, std::memory_order_release);
  gen_.notify_one();
  pthread_join(thread_, nullptr);
}

bool CopyHelper::post(int pid, bool read, const iovec& local, const iovec& remote, bool chunked) {
  uint32_t idle = kIdle;
  if (!state_.compare_exchange_strong(idle, kPosting, std::memory_order_acquire)) return false;
  std::call_once(started_, [this] {
    // Without a thread (pthread_create failed), every job is taken back by its poster (finish).
    auto body = [](void* self) -> void* {
      static_cast<CopyHelper*>(self)->run();
      return nullptr;
    };
    if (pthread_create(&thread_, nullptr, body, this) == 0) {
      pthread_setname_np(thread_, "softrdma-copy");
      running_.store(true, std::memory_order_release);
    }
  });
  job_ = {pid, read, local, remote, chunked};
  state_.store(kPosted, std::memory_order_release);
  gen_.fetch_add(1, std::memory_order_seq_cst);
  if (sleeping_.load(std::memory_order_seq_cst)) gen_.notify_one();
  return true;
}

ssize_t CopyHelper::finish(int* err) {
  uint32_t s = kPosted;
  ssize_t r;
  if (state_.compare_exchange_strong(s, kPosting, std::memory_order_acq_rel)) {
    r = vm_copy_part(job_.pid, job_.read, job_.local, job_.remote, job_.chunked);  // not taken up: done here
    *err = r < 0 ? errno : 0;
  } else {
    // The helper runs it now, on another CPU as a rule; on a busy machine it may have lost that CPU.
    for (uint32_t spins = 0; state_.load(std::memory_order_acquire) != kDone; ++spins) {
      if (spins < 4096)
        __builtin_ia32_pause();
      else
        sched_yield();
    }
    r = result_;
    *err = err_;
  }
  state_.store(kIdle, std::memory_order_release);
  return r;
}

void CopyHelper::run() {
  uint32_t seen = 0;
  for (;;) {
    // Linger first: the next large op of a stream (ib_write_bw) comes a few microseconds after this one
    // ended, and from a sleep each job cost the poster a futex wake and waited for the helper's wake-up
    // (1 MiB in halves: median 20,171 against 23,604 MiB/s lingering; copy_helper.h).
    const uint64_t linger_end = monotonic_ns() + kLingerNs;
    for (uint32_t spins = 1; gen_.load(std::memory_order_acquire) == seen; ++spins) {
      __builtin_ia32_pause();
      if ((spins & 63) == 0 && monotonic_ns() > linger_end) break;
    }
    sleeping_.store(true, std::memory_order_seq_cst);
    gen_.wait(seen, std::memory_order_seq_cst);
    sleeping_.store(false, std::memory_order_relaxed);
    seen = gen_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    uint32_t s = kPosted;
    if (!state_.compare_exchange_strong(s, kRunning, std::memory_order_acq_rel)) continue;  // taken back
    const ssize_t r = vm_copy_part(job_.pid, job_.read, job_.local, job_.remote, job_.chunked);
    err_ = r < 0 ? errno : 0;
    result_ = r;
    jobs_run_.fetch_add(1, std::memory_order_relaxed);
    state_.store(kDone, std::memory_order_release);
  }
}

}  // namespace softrdma::io::shm
