// Streaming (non-temporal) copies into a same-host ring's bulk buffers, which a sender takes when
// SOFTRDMA_SHM_STREAM=1 (ShmIo::Config::stream): the lines go to memory without being taken into the
// sender's cache first.
//
// Measured on the project's VM (2 vCPUs of an AMD EPYC, 2026-12-04), whose two CPUs are, by spells of
// seconds, close (a cache line passes between them through a shared cache; fi_pingpong shm 0.3 us) or far
// (0.9-1.0 us). Far, each line of a ring's bulk buffer went between the two caches twice per lap (the
// receiver's read took it from the sender's cache, the sender's next write of that slot took it back):
// an ordinary copy of a 4 KiB packet took the sender 3,000-3,500 TSC cycles, a streaming one 780-810, and
// same-host 1 MiB ib_send_bw ran at 1.9-3.6 GiB/s against 9.2-11.7 streamed. Close, streamed lines come
// to the receiver from memory instead of the other CPU's cache: 10-12 GiB/s against 14-22. Neither side's
// own measure told the two apart reliably (README, "The same-host path"), so the choice is the user's.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace softrdma::io::shm {

inline constexpr bool kCanStream =
#if defined(__x86_64__)
    true;
#else
    false;
#endif

// Copies n bytes from s to d, the whole 64-byte lines of d with streaming stores (the rest with memcpy).
// The stores are not ordered with later ones: stream_fence() before the copy is published.
inline void copy_streaming(uint8_t* d, const uint8_t* s, size_t n) {
#if defined(__x86_64__)
  const size_t head = std::min<size_t>(n, (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  for (; n >= 64; n -= 64, d += 64, s += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
#endif
  std::memcpy(d, s, n);
}

inline void stream_fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

}  // namespace softrdma::io::shm
