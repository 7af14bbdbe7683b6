// The streaming copy a sender can take for long packets into a same-host ring (io/shm/stream_copy.h).
#include "io/shm/stream_copy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace softrdma::io::shm {
namespace {

// Every byte arrives and none beside it is written, whatever the alignment of either end and the length
// (the head before d's first whole line, whole lines, the tail after the last).
TEST(StreamCopy, CopiesEveryByteAtEveryAlignmentAndNothingElse) {
  constexpr size_t kGuard = 64;
  const size_t lengths[] = {0, 1, 15, 63, 64, 65, 127, 128, 129, 1000, 4096, 4100};
  std::vector<uint8_t> src(4100 + 64 + kGuard);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  std::vector<uint8_t> dst_mem(4100 + 128 + 2 * kGuard);
  uint8_t* const base = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(dst_mem.data()) + kGuard + 63) & ~uintptr_t{63});
  for (size_t n : lengths) {
    for (size_t doff = 0; doff < 64; ++doff) {
      for (size_t soff : {size_t{0}, size_t{1}, size_t{8}, size_t{33}}) {
        std::fill(dst_mem.begin(), dst_mem.end(), uint8_t{0xEE});
        uint8_t* d = base + doff;
        copy_streaming(d, src.data() + soff, n);
        stream_fence();
        ASSERT_TRUE(std::equal(d, d + n, src.data() + soff))
            << "n " << n << " doff " << doff << " soff " << soff;
        for (uint8_t* g = dst_mem.data(); g < d; ++g)
          ASSERT_EQ(*g, 0xEE) << "before, n " << n << " doff " << doff;
        for (uint8_t* g = d + n; g < dst_mem.data() + dst_mem.size(); ++g)
          ASSERT_EQ(*g, 0xEE) << "after, n " << n << " doff " << doff;
      }
    }
  }
}

}  // namespace
}  // namespace softrdma::io::shm
