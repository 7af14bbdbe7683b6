// Software prefetch of the payload a data path is about to read. The CPU's own prefetchers follow a stream
// only within a 4 KiB page, and at the 4 KiB MTU each packet's payload is a page of its own: a sender whose
// sources are not in the cache (64 QPs x 1 MiB) waited for memory anew at each packet's first line.
#pragma once

#include <cstddef>
#include <cstdint>

namespace softrdma::io {

inline constexpr size_t kPrefetchLine = 64;
// At most this much is asked for per call: the largest path MTU, what one packet reads.
inline constexpr size_t kPrefetchMax = 4096;

// Asks for [p, p + n) to be read into the cache (n capped at kPrefetchMax). A hint only: it never faults
// and brings no page in.
inline void prefetch_read(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  if (n > kPrefetchMax) n = kPrefetchMax;
  for (size_t o = 0; o < n; o += kPrefetchLine) __builtin_prefetch(b + o, 0, 3);
}

}  // namespace softrdma::io
