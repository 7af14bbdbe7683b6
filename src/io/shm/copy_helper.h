// A second thread for the large copies of the same-host one-sided path (access_table.h): a WRITE or READ
// of kSplitMin bytes or more is one process_vm_writev or process_vm_readv per half, the two halves at once
// on two CPUs, as a NIC spreads one transfer over its engines (and its last 64 bytes a third, once both
// halves are in: AccessTable::direct). Measured here (a 2-CPU VM, a copy into an idle process): 8 MiB
// 414-478 -> 239-261 us, 4 MiB 206-223 -> 129-174, 2 MiB 109-129 -> 79-118. Same-host ib_write_bw of
// 1 MiB, 6 interleaved runs of 1 s each, MiB/s: 13,419-20,049 whole (median 15,045), 18,003-32,903 in
// halves (23,604) with the helper lingering after a job, 16,013-26,737 (20,171) without; 256 and 512 KiB
// lost in halves.
//
// The helper is started at its first job. After a job it spins for kLingerNs, then sleeps on a futex (a
// post wakes it only then: the wake is a syscall). One job at a time: a poster
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
#include <cstdint>
#include <mutex>

namespace softrdma::io::shm {

// process_vm_readv (read: from `remote` in process `pid` into `local`) or process_vm_writev.
inline ssize_t vm_copy(int pid, bool read, const iovec* local, unsigned long nlocal, const iovec* remote,
                       unsigned long nremote) {
  return read ? process_vm_readv(pid, local, nlocal, remote, nremote, 0)
              : process_vm_writev(pid, local, nlocal, remote, nremote, 0);
}
inline ssize_t vm_copy(int pid, bool read, const iovec* local, unsigned long nlocal, const iovec& remote) {
  return vm_copy(pid, read, local, nlocal, &remote, 1);
}

// One part of a split copy (below). `chunked`: the remote range goes as 64 KiB iovecs in the one call, so
// that the kernel pins and copies in turns (it pins a whole iovec's pages, up to 4 MiB, before copying
// any) and two threads pinning pages of one page table meet on its lock less often.
inline ssize_t vm_copy_part(int pid, bool read, const iovec& local, const iovec& remote, bool chunked) {
  if (!chunked) return vm_copy(pid, read, &local, 1, remote);
  constexpr size_t kChunk = 64u << 10, kMax = 64;  // the last piece takes what 63 leave
  auto* const base = static_cast<uint8_t*>(remote.iov_base);
  iovec r[kMax];
  unsigned long n = 0;
  size_t off = 0;
  for (; n + 1 < kMax && remote.iov_len - off > kChunk; off += kChunk) r[n++] = {base + off, kChunk};
  r[n++] = {base + off, remote.iov_len - off};
  return vm_copy(pid, read, &local, 1, r, n);
}

// Where a split copy of `len` bytes at the peer's address `at` divides, as an offset: at a 2 MiB boundary
// of the peer's address space if one lies in the middle half of the range (*own_tables: then each thread
// pins pages of its own page table), else in the middle. The kernel takes a page table's lock for each
// page it pins: two process_vm_writev calls of 512 KiB, one per thread, into one page table ran at 17-24
// GB/s together here, into two at 41-52, into one as 64 KiB iovecs (vm_copy_part) at 30-36.
inline size_t split_point(uint64_t at, size_t len, bool* own_tables) {
  constexpr uint64_t kTable = 2u << 20;  // what one page table maps (x86-64, 4 KiB pages)
  const uint64_t lo = at + len / 4, hi = at + len - len / 4;
  const uint64_t b = (lo + kTable - 1) & ~(kTable - 1);  // the first boundary at or after lo
  *own_tables = b <= hi;
  return *own_tables ? static_cast<size_t>(b - at) : len / 2;
}

class CopyHelper {
 public:
  static constexpr size_t kSplitMin = 1u << 20;
  static constexpr uint64_t kLingerNs = 20'000;  // the helper's spin after a job (50 us: no better)

  CopyHelper() = default;
  ~CopyHelper();
  CopyHelper(const CopyHelper&) = delete;
  CopyHelper& operator=(const CopyHelper&) = delete;

  // Hands the helper a copy between `local` here and `remote` in process `pid` (read: into `local`); false
  // when it is busy with another job or cannot be started (then nothing was taken).
  // `chunked`: vm_copy_part's.
  bool post(int pid, bool read, const iovec& local, const iovec& remote, bool chunked = false);
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
    bool chunked = false;
  };
  void run();

  std::atomic<uint32_t> state_{kIdle};
  std::atomic<uint32_t> gen_{0};  // the futex the helper sleeps on: moves with every post
  std::atomic<bool> stop_{false};
  std::atomic<bool> sleeping_{false};  // the helper waits on gen_: a post wakes it
  std::atomic<uint64_t> jobs_run_{0};
  Job job_;             // written by the poster before kPosted (release)
  ssize_t result_ = 0;  // written by the helper before kDone (release)
  int err_ = 0;
  std::once_flag started_;
  pthread_t thread_{};
  std::atomic<bool> running_{false};  // thread_ was started (set once, under started_)
};

}  // namespace softrdma::io::shm
