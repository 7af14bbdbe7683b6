// io/kernel_touch.h: the kernel reads one byte of each resident page of a registration and leaves the rest
// of the address space as it was: pages not resident stay so, nothing past the bound is read, a hole or
// an unreadable page stops it with an errno, and no byte changes.
#include "io/kernel_touch.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace softrdma::io {
namespace {

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

struct Map {
  explicit Map(size_t pages) : len(pages * kPage) {
    void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    p = m == MAP_FAILED ? nullptr : static_cast<uint8_t*>(m);
  }
  ~Map() {
    if (p) munmap(p, len);
  }
  std::vector<bool> resident() const {
    std::vector<unsigned char> v(len / kPage);
    EXPECT_EQ(mincore(p, len, v.data()), 0);
    std::vector<bool> r;
    for (unsigned char c : v) r.push_back(c & 1);
    return r;
  }
  size_t len;
  uint8_t* p;
};

class KernelTouch : public ::testing::Test {
 protected:
  struct Sink {
    Sink() : fd(kernel_touch_sink()) {}
    ~Sink() {
      if (fd >= 0) close(fd);
    }
    int fd;
  } sink;
  void SetUp() override { ASSERT_GE(sink.fd, 0); }
};

TEST_F(KernelTouch, ReadsEachResidentPageAndMapsNoOther) {
  Map m(16);
  ASSERT_NE(m.p, nullptr);
  for (size_t i : {0, 3, 7, 15}) m.p[i * kPage + 5] = static_cast<uint8_t>(i + 1);
  const TouchResult r = kernel_touch(sink.fd, m.p, m.len, 1ull << 30);
  EXPECT_EQ(r.error, 0);
  EXPECT_EQ(r.pages, 4u);
  const std::vector<bool> res = m.resident();
  for (size_t i = 0; i < 16; ++i) EXPECT_EQ(res[i], i == 0 || i == 3 || i == 7 || i == 15) << "page " << i;
  for (size_t i : {0, 3, 7, 15}) EXPECT_EQ(m.p[i * kPage + 5], i + 1);
}

TEST_F(KernelTouch, CoversThePagesAnUnalignedRegionTouchesUpToTheBound) {
  Map m(8);
  ASSERT_NE(m.p, nullptr);
  std::memset(m.p, 0x5a, m.len);
  // 100 bytes into page 1, one page long: pages 1 and 2.
  EXPECT_EQ(kernel_touch(sink.fd, m.p + kPage + 100, kPage, 1ull << 30).pages, 2u);
  // The bound counts from the region's start: 2 pages and 1 byte reach into a third page.
  EXPECT_EQ(kernel_touch(sink.fd, m.p, m.len, 2 * kPage + 1).pages, 3u);
  EXPECT_EQ(kernel_touch(sink.fd, m.p, m.len, 0).pages, 0u);
  EXPECT_EQ(kernel_touch(sink.fd, m.p, 0, 1ull << 30).pages, 0u);
  for (size_t i = 0; i < m.len; ++i) ASSERT_EQ(m.p[i], 0x5a) << i;
}

TEST_F(KernelTouch, AHoleOrAnUnreadablePageStopsItWithAnErrno) {
  Map m(4);
  ASSERT_NE(m.p, nullptr);
  std::memset(m.p, 1, m.len);
  ASSERT_EQ(munmap(m.p + 2 * kPage, 2 * kPage), 0);
  const TouchResult hole = kernel_touch(sink.fd, m.p, 4 * kPage, 1ull << 30);
  EXPECT_EQ(hole.error, ENOMEM);
  m.len = 2 * kPage;

  ASSERT_EQ(mprotect(m.p, kPage, PROT_NONE), 0);  // resident, not readable: the kernel's read fails
  const TouchResult unreadable = kernel_touch(sink.fd, m.p, m.len, 1ull << 30);
  EXPECT_EQ(unreadable.error, EFAULT);
  ASSERT_EQ(mprotect(m.p, kPage, PROT_READ | PROT_WRITE), 0);
  EXPECT_EQ(m.p[0], 1);
}

}  // namespace
}  // namespace softrdma::io
