// A small spinlock: the per-object locks of the data path are held for a few hundred nanoseconds, and a
// futex-based mutex costs a syscall when contended.
#pragma once

#include <atomic>
#include <thread>

namespace softrdma::core {

class SpinLock {
 public:
  void lock() {
    for (int spins = 0; flag_.exchange(true, std::memory_order_acquire); ++spins) {
      while (flag_.load(std::memory_order_relaxed)) {
        if (++spins > 64) std::this_thread::yield();
        else __builtin_ia32_pause();
      }
    }
  }
  bool try_lock() { return !flag_.exchange(true, std::memory_order_acquire); }
  void unlock() { flag_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> flag_{false};
};

}  // namespace softrdma::core
