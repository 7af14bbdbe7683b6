// A second thread for the large copies of the same-host one-sided path (access_table.h): a WRITE or READ
// of kSplitMin bytes or more is one process_vm_writev or process_vm_readv per half, the two halves at once
// on two CPUs, as a NIC spreads one transfer over its engines. Measured here (a 2-CPU VM, a copy into an
// idle process): 8 MiB 414-478 -> 239-261 us, 4 MiB 206-223 -> 129-174, 2 MiB 109-129 -> 79-118, and
// 1 MiB no faster (48-53 against 50-52 us), so 1 MiB copies stay whole.
//
// The helper is started at its first job and sleeps on a futex between jobs. One job at a time: a poster
// that finds it busy (another thread's op) copies everything itself. A posted job that the helper has
// not taken up by the time the poster finished its own half is taken back and done by the poster (the
// helper may not get a CPU soon, and after fork() there is no helper in the child), so a poster never
// waits for a thread that is not running its job.
#pragma once

#include <pthread.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <mutex>

namespace softrdma::io::shm {

// process_vm_readv (read: from `remote` in process `pid` into `local`) or process_vm_writev.
inline ssize_t vm_copy(int pid, bool read, const iovec* local, unsigned long nlocal, const iovec& remote) {
  return read ? process_vm_readv(pid, local, nlocal, &remote, 1, 0)
              : process_vm_writev(pid, local, nlocal, &remote, 1, 0);
}

class CopyHelper {
 public:
  static constexpr size_t kSplitMin = 2u << 20;

  CopyHelper() = default;
  ~CopyHelper();
  CopyHelper(const CopyHelper&) = delete;
  CopyHelper& operator=(const CopyHelper&) = delete;

  // Hands the helper a copy between `local` here and `remote` in process `pid` (read: into `local`); false
  // when it is busy with another job or cannot be started (then nothing was taken).
  bool post(int pid, bool read, const iovec& local, const iovec& remote);
  // After post() returned true: the job's result, as process_vm_* returns it (and its errno in *err).
  ssize_t finish(int* err);
  // Jobs the helper thread ran (not the ones taken back), a hint for tests.
  uint64_t jobs_run() const { return jobs_run_.load(std::memory_order_relaxed); }

 private:
  enum : uint32_t { kIdle, kPosting, kPosted, kRunning, kDone };
  struct Job {
    int pid = 0;
    bool read = false;
    iovec local{};
    iovec remote{};
  };
  void run();

  std::atomic<uint32_t> state_{kIdle};
  std::atomic<uint32_t> gen_{0};  // the futex the helper sleeps on: moves with every post
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> jobs_run_{0};
  Job job_;          // written by the poster before kPosted (release)
  ssize_t result_ = 0;  // written by the helper before kDone (release)
  int err_ = 0;
  std::once_flag started_;
  pthread_t thread_{};
  std::atomic<bool> running_{false};  // thread_ was started (set once, under started_)
};

}  // namespace softrdma::io::shm
