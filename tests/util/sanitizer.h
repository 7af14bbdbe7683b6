// Which sanitizer a test binary is built with (scripts/sanitize.sh), for the few tests that must allow
// for its cost: wall-clock limits scale by kSanitizerSlowdown.
#pragma once

namespace softrdma::testutil {

#if defined(__SANITIZE_THREAD__)
inline constexpr bool kTsan = true;
inline constexpr int kSanitizerSlowdown = 10;  // TSan checks every access (memcpy's bytes included)
#elif defined(__SANITIZE_ADDRESS__)
inline constexpr bool kTsan = false;
inline constexpr int kSanitizerSlowdown = 4;
#else
inline constexpr bool kTsan = false;
inline constexpr int kSanitizerSlowdown = 1;
#endif

}  // namespace softrdma::testutil
