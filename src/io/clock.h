// The clock of the io layer and of core (Context::now_ns).
#pragma once

#include <time.h>

#include <cstdint>

namespace softrdma::io {

// Nanoseconds of `clock` (CLOCK_MONOTONIC by default; CLOCK_MONOTONIC_COARSE where a tick's resolution
// will do).
inline uint64_t monotonic_ns(clockid_t clock = CLOCK_MONOTONIC) {
  timespec ts;
  clock_gettime(clock, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace softrdma::io
