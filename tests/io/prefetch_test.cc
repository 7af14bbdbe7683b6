// io/prefetch.h: a prefetch is a hint only. Over memory that is not mapped, not accessible, or mapped but
// not yet resident it neither faults nor brings a page in, and it changes no byte.
#include "io/prefetch.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

namespace softrdma::io {
namespace {

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

TEST(Prefetch, NeverFaultsNorBringsAPageIn) {
  // Three pages: the first readable and written, the second inaccessible, the third unmapped.
  void* m = mmap(nullptr, 3 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* p = static_cast<uint8_t*>(m);
  std::memset(p, 0x5A, kPage);
  ASSERT_EQ(mprotect(p + kPage, kPage, PROT_NONE), 0);
  ASSERT_EQ(munmap(p + 2 * kPage, kPage), 0);
  for (size_t off = 0; off < 3 * kPage; off += kPage / 2) {
    prefetch_read(p + off, kPrefetchMax);
  }
  for (size_t i = 0; i < kPage; ++i) ASSERT_EQ(p[i], 0x5A) << i;
  munmap(p, 2 * kPage);

  // Mapped, never touched: the pages stay out of memory.
  void* q = mmap(nullptr, 4 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(q, MAP_FAILED);
  for (size_t off = 0; off < 4 * kPage; off += kPrefetchMax) {
    prefetch_read(static_cast<uint8_t*>(q) + off, kPrefetchMax);
  }
  unsigned char v[4];
  ASSERT_EQ(mincore(q, 4 * kPage, v), 0);
  for (unsigned char r : v) EXPECT_EQ(r & 1, 0);
  munmap(q, 4 * kPage);
}

}  // namespace
}  // namespace softrdma::io
