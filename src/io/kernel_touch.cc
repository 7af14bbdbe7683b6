#include "io/kernel_touch.h"

#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>

#include "io/sys.h"

namespace softrdma::io {

namespace {

constexpr uint32_t kIovs = 1024;  // UIO_MAXIOV: pages per pwritev
constexpr uint64_t kSpan = 2048;  // pages asked of mincore at a time (its vector on the stack)

}  // namespace

int kernel_touch_sink() { return memfd_create("softrdma-touch", MFD_CLOEXEC); }

TouchResult kernel_touch(int sink, const void* addr, uint64_t len, uint64_t max_bytes) {
  TouchResult r;
  if (len == 0 || max_bytes == 0) return r;
  const uint64_t page = page_bytes();  // mincore's unit
  const uint64_t first_byte = reinterpret_cast<uint64_t>(addr);
  const uint64_t start = first_byte & ~(page - 1);
  const uint64_t end_addr = first_byte + std::min(len, max_bytes);
  const uint64_t npages = (end_addr - start + page - 1) / page;
  std::array<unsigned char, kSpan> resident;
  std::array<iovec, kIovs> iov;
  uint32_t n = 0;
  auto flush = [&]() -> int {
    if (n == 0) return 0;
    const ssize_t w = pwritev(sink, iov.data(), static_cast<int>(n), 0);
    n = 0;
    return w < 0 ? errno : 0;
  };
  for (uint64_t first = 0; first < npages; first += kSpan) {
    const uint64_t span = std::min(kSpan, npages - first);
    const uint64_t base = start + first * page;
    // ENOMEM: part of the range is not mapped; the registration stands, the touch stops (as it would
    // when the kernel itself reads there later: EFAULT, a dropped packet).
    if (mincore(reinterpret_cast<void*>(base), span * page, resident.data()) != 0) {
      r.error = errno;
      break;
    }
    for (uint64_t i = 0; i < span; ++i) {
      if (!(resident[i] & 1)) continue;
      // A page's first byte of the region (the first page's may lie before it: memory not the caller's).
      iov[n++] = {reinterpret_cast<void*>(std::max(base + i * page, first_byte)), 1};
      ++r.pages;
      if (n == kIovs)
        if (int e = flush()) return {r.pages, e};
    }
  }
  if (int e = flush(); e && !r.error) r.error = e;
  return r;
}

}  // namespace softrdma::io
