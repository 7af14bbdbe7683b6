// The helper thread of large same-host one-sided copies (io/shm/copy_helper.h), on its own and through the
// access table: the bytes of both halves, a busy helper, a job taken back (no helper after fork), errors.
#include "io/shm/copy_helper.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "io/shm/access_table.h"

namespace softrdma::io::shm {
namespace {

constexpr size_t kLen = 4u << 20;

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 31 + seed);
  return v;
}

// Posts the second half of src -> dst (or dst -> src for a READ) to the helper, waits `delay` so that the
// helper may take it up, copies the first half here as AccessTable::direct does, and finishes.
ssize_t split_copy(CopyHelper& h, bool read, std::vector<uint8_t>& local, std::vector<uint8_t>& remote,
                   std::chrono::milliseconds delay) {
  const size_t half = local.size() / 2;
  const iovec l2{local.data() + half, local.size() - half}, r2{remote.data() + half, remote.size() - half};
  if (!h.post(getpid(), read, l2, r2)) return -100;
  std::this_thread::sleep_for(delay);
  const iovec l1{local.data(), half}, r1{remote.data(), half};
  const ssize_t a = vm_copy(getpid(), read, &l1, 1, r1);
  int err = 0;
  const ssize_t b = h.finish(&err);
  return a < 0 || b < 0 ? -1 : a + b;
}

TEST(CopyHelper, BothHalvesLandWhetherTheHelperOrThePosterRunsThem) {
  CopyHelper h;
  std::vector<uint8_t> src = pattern(kLen, 1), dst(kLen, 0);
  // Given time, the helper takes the job up.
  ASSERT_EQ(split_copy(h, false, src, dst, std::chrono::milliseconds(50)), static_cast<ssize_t>(kLen));
  EXPECT_EQ(dst, src);
  EXPECT_EQ(h.jobs_run(), 1u);
  // A READ: into the local buffer.
  std::vector<uint8_t> into(kLen, 0), from = pattern(kLen, 7);
  ASSERT_EQ(split_copy(h, true, into, from, std::chrono::milliseconds(50)), static_cast<ssize_t>(kLen));
  EXPECT_EQ(into, from);
  EXPECT_EQ(h.jobs_run(), 2u);
  // Back to back, whoever gets there first: the bytes are right either way.
  for (uint8_t i = 0; i < 20; ++i) {
    std::vector<uint8_t> s = pattern(kLen, i), d(kLen, 0);
    ASSERT_EQ(split_copy(h, false, s, d, std::chrono::milliseconds(0)), static_cast<ssize_t>(kLen));
    ASSERT_EQ(d, s) << "round " << int(i);
  }
}

TEST(CopyHelper, ABusyHelperTakesNoSecondJob) {
  CopyHelper h;
  std::vector<uint8_t> a = pattern(kLen, 3), b(kLen, 0);
  const iovec l{a.data(), kLen}, r{b.data(), kLen};
  ASSERT_TRUE(h.post(getpid(), false, l, r));
  EXPECT_FALSE(h.post(getpid(), false, l, r)) << "one job at a time";
  int err = -1;
  EXPECT_EQ(h.finish(&err), static_cast<ssize_t>(kLen));
  EXPECT_EQ(err, 0);
  EXPECT_EQ(b, a);
  EXPECT_TRUE(h.post(getpid(), false, l, r)) << "free again";
  EXPECT_EQ(h.finish(&err), static_cast<ssize_t>(kLen));
}

TEST(CopyHelper, AFailedCopyReportsItsErrno) {
  CopyHelper h;
  std::vector<uint8_t> a = pattern(4096, 3);
  const iovec l{a.data(), a.size()};
  const iovec bad{reinterpret_cast<void*>(uintptr_t{8}), a.size()};  // not mapped
  for (const auto delay : {std::chrono::milliseconds(50), std::chrono::milliseconds(0)}) {
    ASSERT_TRUE(h.post(getpid(), false, l, bad));
    std::this_thread::sleep_for(delay);
    int err = 0;
    EXPECT_EQ(h.finish(&err), -1);
    EXPECT_EQ(err, EFAULT);
  }
}

// After fork() the child has the helper's state but not its thread: a posted job is taken back by the poster.
TEST(CopyHelper, AChildOfForkTakesItsJobsBack) {
  CopyHelper h;
  std::vector<uint8_t> warm = pattern(kLen, 1), sink(kLen, 0);
  ASSERT_EQ(split_copy(h, false, warm, sink, std::chrono::milliseconds(50)), static_cast<ssize_t>(kLen));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::vector<uint8_t> s = pattern(kLen, 9), d(kLen, 0);
    const ssize_t n = split_copy(h, false, s, d, std::chrono::milliseconds(50));
    _exit(n == static_cast<ssize_t>(kLen) && d == s ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// An access table of this process's with one QP (0x12345, its peer's 0x777) and one MR (key 0xABCD01 at
// iova 0x100000) over `mem`; write() is a peer's WRITE into that MR at `off`, through AccessTable::direct
// with the helper `h`.
struct TableOverMem {
  TableOverMem(const std::string& name, size_t len) : mem(len, 0) {
    const std::string path = "/dev/shm/softrdma-acc-" + name + "." + std::to_string(getpid());
    t = std::move(*AccessTable::create(path, getpid(), 1, 2));
    t->publish_qp({.qpn = 0x12345, .access = kAccRemoteWrite | kAccRemoteRead, .pd = 3, .dest_qpn = 0x777,
                   .open = true});
    t->publish_mr({.key = 0xABCD01, .access = kAccRemoteWrite | kAccRemoteRead, .pd = 3, .iova = 0x100000,
                   .length = mem.size(), .addr = reinterpret_cast<uint64_t>(mem.data())},
                  nullptr);
  }
  int write(std::vector<uint8_t>& src, uint64_t off) {
    LocalSeg seg{src.data(), src.size()};
    DirectOp op{false, 0x777, 0x12345, 0x100000 + off, 0xABCD01, src.size(), &seg, 1};
    return AccessTable::direct(t->map(), AccessTable::file_bytes(), getpid(), op, nullptr, &h);
  }
  std::vector<uint8_t> mem;
  std::unique_ptr<AccessTable> t;  // after mem: gone first
  CopyHelper h;
};

// Through the access table: a WRITE of kSplitMin bytes or more goes in two halves (3), a smaller one whole
// (0); the bytes land either way.
TEST(CopyHelper, TheAccessTableSplitsLargeWrites) {
  TableOverMem tm("split-test", kLen);
  std::vector<uint8_t>& mem = tm.mem;
  std::vector<uint8_t> big = pattern(CopyHelper::kSplitMin, 5);
  EXPECT_EQ(tm.write(big, 4096), 3);
  EXPECT_TRUE(std::equal(big.begin(), big.end(), mem.begin() + 4096));
  std::vector<uint8_t> small = pattern(CopyHelper::kSplitMin - 1, 6);
  EXPECT_EQ(tm.write(small, 0), 0);
  EXPECT_TRUE(std::equal(small.begin(), small.end(), mem.begin()));
  std::vector<uint8_t> past = pattern(CopyHelper::kSplitMin, 7);
  EXPECT_EQ(tm.write(past, kLen - CopyHelper::kSplitMin + 1), -1) << "one byte past the MR: the ordinary way";
}

// An application that polls the last byte of a WRITE's target (ib_write_lat does, and so do many others:
// hardware and rxe place a message's bytes in order) must find every other byte there once the last one
// is: a split WRITE writes its last bytes after both halves. A thread here polls the last byte of each of
// 24 split WRITEs and checks the whole target as soon as it changes. With the half holding the last byte on
// the helper it caught that in 3 of 3 runs while the helper slept between jobs, in 4 of 10 since it
// lingers (the two halves seldom overlap the poller's check); the next test catches it every time.
TEST(CopyHelper, ASplitWritesLastByteLandsLast) {
  constexpr size_t kSize = 4u << 20;
  static_assert(kSize >= CopyHelper::kSplitMin);
  TableOverMem tm("order-test", kSize);
  std::vector<uint8_t>& mem = tm.mem;
  constexpr int kRounds = 24;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::atomic<bool> stop{false};  // set when a WRITE failed: the poller waits no more
  const auto late = [&] { return stop.load() || std::chrono::steady_clock::now() > deadline; };
  std::atomic<int> round{-1};    // the round written now
  std::atomic<int> checked{-1};  // the last round the poller checked
  std::atomic<int> early{0};     // rounds whose last byte came before another byte
  std::thread poller([&] {
    const volatile uint8_t* last = mem.data() + kSize - 1;
    for (int r = 0; r < kRounds && !late(); ++r) {
      const auto value = static_cast<uint8_t>(r + 1);  // every byte of round r's WRITE
      while (*last != value && !late()) {
      }
      std::atomic_thread_fence(std::memory_order_acquire);
      for (size_t i = 0; i < kSize; i += 64) {
        if (mem[i] != value) {
          early.fetch_add(1);
          break;
        }
      }
      checked.store(r, std::memory_order_release);
    }
  });
  int split = 0;
  for (int r = 0; r < kRounds && !late(); ++r) {
    std::vector<uint8_t> src(kSize, static_cast<uint8_t>(r + 1));
    round.store(r, std::memory_order_release);
    const int rc = tm.write(src, 0);
    if (rc < 0) {
      ADD_FAILURE() << "round " << r << ": direct() returned " << rc;
      stop.store(true);
      break;
    }
    if (rc == 3) ++split;
    // The poller checks this round's bytes before the next round overwrites them.
    while (checked.load(std::memory_order_acquire) < r && !late()) {
    }
  }
  poller.join();
  ASSERT_FALSE(late()) << "stopped or timed out at round " << round.load() << ", checked " << checked.load();
  EXPECT_GT(split, 0) << "no WRITE was split: the test saw nothing";
  EXPECT_EQ(early.load(), 0) << "of " << split << " split WRITEs";
}

// The same without a race to catch: a split WRITE writes its last bytes only once both halves are in, so
// one whose first half fails (a page of the target made inaccessible) leaves the last byte as it was and a
// poller of it never sees a WRITE that did not land. (With the half holding the last byte on the helper,
// that half landed whatever became of the other.)
TEST(CopyHelper, ASplitWriteWhoseFirstHalfFailsLeavesTheLastByte) {
  TableOverMem tm("hole-test", CopyHelper::kSplitMin);
  const uintptr_t first_page = (reinterpret_cast<uintptr_t>(tm.mem.data()) + 4095) & ~uintptr_t{4095};
  auto* const hole = reinterpret_cast<void*>(first_page + 4096);  // in the first half
  std::vector<uint8_t> src(CopyHelper::kSplitMin, 0x5A);
  ASSERT_EQ(mprotect(hole, 4096, PROT_NONE), 0);
  const int rc = tm.write(src, 0);
  ASSERT_EQ(mprotect(hole, 4096, PROT_READ | PROT_WRITE), 0);
  EXPECT_LT(rc, 0) << "a page of the target could not be written";
  EXPECT_EQ(tm.mem.back(), 0) << "the last byte landed although the WRITE did not";
  bool own_tables;
  const size_t split =
      split_point(reinterpret_cast<uint64_t>(tm.mem.data()), CopyHelper::kSplitMin, &own_tables);
  EXPECT_EQ(tm.mem[split + 4096], 0x5A) << "the second part's body goes meanwhile";
}

// A part given as 64 KiB pieces moves every byte, both ways: shorter than a piece, a whole number of
// pieces, and longer than the 64 pieces (the last takes the rest).
TEST(CopyHelper, AChunkedPartMovesEveryByte) {
  for (size_t len : {size_t{1000}, size_t{256} << 10, (size_t{5} << 20) + 123}) {
    SCOPED_TRACE(len);
    std::vector<uint8_t> src = pattern(len, 9), dst(len, 0);
    const iovec l{src.data(), len}, r{dst.data(), len};
    EXPECT_EQ(vm_copy_part(getpid(), false, l, r, true), static_cast<ssize_t>(len));
    EXPECT_EQ(dst, src);
    std::vector<uint8_t> back(len, 0);
    const iovec lb{back.data(), len};
    EXPECT_EQ(vm_copy_part(getpid(), true, lb, r, true), static_cast<ssize_t>(len));
    EXPECT_EQ(back, src);
  }
}

// A split copy divides at a 2 MiB boundary of the peer's address space that lies in the middle half of its
// range (each thread then pins pages of its own page table), else in the middle.
TEST(CopyHelper, ASplitDividesAtAPageTableBoundaryInItsMiddleHalf) {
  constexpr uint64_t M = 1u << 20, T = 2u << 20;
  bool own = false;
  EXPECT_EQ(split_point(5 * T - M / 2, M, &own), M / 2);  // the boundary in the middle
  EXPECT_TRUE(own);
  EXPECT_EQ(split_point(5 * T - M / 4, M, &own), M / 4);  // at a quarter: still in the middle half
  EXPECT_TRUE(own);
  EXPECT_EQ(split_point(5 * T - 3 * M / 4, M, &own), 3 * M / 4);
  EXPECT_TRUE(own);
  EXPECT_EQ(split_point(5 * T - M / 8, M, &own), M / 2);  // too near an end: the middle
  EXPECT_FALSE(own);
  EXPECT_EQ(split_point(5 * T + 4096, M, &own), M / 2);  // no boundary in the range
  EXPECT_FALSE(own);
  EXPECT_EQ(split_point(5 * T - M - 100, 3 * M, &own), M + 100);
  EXPECT_TRUE(own);
}

}  // namespace
}  // namespace softrdma::io::shm
