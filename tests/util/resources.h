// What a process holds, for tests that create and destroy objects in loops and check that nothing grows:
// open file descriptors and heap bytes in use (the sanitizer's allocator under ASan/TSan, else glibc's).
#pragma once

#include <dirent.h>
#include <gtest/gtest.h>
#include <malloc.h>

#include <chrono>
#include <cstddef>
#include <cstdio>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
// The sanitizer runtimes' allocator statistics (GCC ships no header for them).
extern "C" size_t __sanitizer_get_current_allocated_bytes();
#endif

namespace softrdma::testutil {

inline size_t open_fds() {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return 0;
  size_t n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n - 1;  // the directory's own fd
}

inline size_t heap_in_use() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return __sanitizer_get_current_allocated_bytes();
#else
  return mallinfo2().uordblks;
#endif
}

// Runs `round` `warmup` times, then `rounds` times (fewer if `budget` passes first, but at least
// `min_rounds`), and expects the open fds and the heap bytes in use to come back to where they were.
template <typename F>
void expect_no_growth(F round, int warmup, int rounds, int min_rounds, std::chrono::seconds budget) {
  for (int i = 0; i < warmup; ++i) {
    round();
    if (::testing::Test::HasFailure()) return;
  }
  const size_t fds0 = open_fds(), heap0 = heap_in_use();
  const auto end = std::chrono::steady_clock::now() + budget;
  int done = 0;
  for (; done < rounds && (done < min_rounds || std::chrono::steady_clock::now() < end); ++done) {
    round();
    if (::testing::Test::HasFailure()) return;
  }
  const size_t fds1 = open_fds(), heap1 = heap_in_use();
  EXPECT_EQ(fds1, fds0) << "open fds after " << done << " rounds";
  // One leaked object a round is at least 16 bytes a round; allow a few KiB of allocator caches.
  EXPECT_LE(heap1, heap0 + 4096) << "heap bytes in use grew by " << (heap1 - heap0) << " over " << done
                                  << " rounds";
  std::printf("%d rounds: open fds %zu -> %zu, heap bytes in use %zu -> %zu\n", done, fds0, fds1, heap0, heap1);
}

}  // namespace softrdma::testutil
