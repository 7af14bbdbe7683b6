// Registered memory moved into shared memory for same-host peers (io/shm/mr_share.h) and a peer's
// mappings of it (io/shm/peer_maps.h): the application keeps its addresses and bytes, only whole private
// anonymous pages move, the last reference moves them back, a forked child gets private copies, and a peer
// maps the pages by the published descriptor.
#include "io/shm/mr_share.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "io/shm/peer_maps.h"
#include "util/maps.h"

namespace softrdma::io::shm {
namespace {

using testutil::maps_perms;

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

struct Pages {
  size_t len;
  uint8_t* p;
  explicit Pages(size_t n) : len(n * kPage) {
    p = static_cast<uint8_t*>(mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    for (size_t i = 0; i < len; ++i) p[i] = static_cast<uint8_t>(i * 13 + 5);
  }
  ~Pages() { munmap(p, len); }
  bool intact() const {
    for (size_t i = 0; i < len; ++i)
      if (p[i] != static_cast<uint8_t>(i * 13 + 5)) return false;
    return true;
  }
};

TEST(MrShare, MovesTheWholePagesAndKeepsAddressesAndBytes) {
  Pages m(4);
  const uint32_t moves = shared_page_moves();
  auto s = share_pages(m.p + 100, m.len - 200);  // pages 1 and 2 whole, 0 and 3 in part
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->addr, reinterpret_cast<uint64_t>(m.p + kPage));
  EXPECT_EQ(s->len, 2 * kPage);
  EXPECT_EQ(s->file_off, 0u);
  EXPECT_NE(s->id, 0u);
  EXPECT_GE(s->fd, 0);
  EXPECT_EQ(shared_page_moves(), moves + 1);
  EXPECT_EQ(maps_perms(m.p), "rw-p") << "a partial page moved";
  EXPECT_EQ(maps_perms(m.p + kPage), "rw-s");
  EXPECT_EQ(maps_perms(m.p + 3 * kPage - 1), "rw-s");
  EXPECT_EQ(maps_perms(m.p + 3 * kPage), "rw-p") << "a partial page moved";
  EXPECT_TRUE(m.intact());
  m.p[kPage + 7] = 0xEE;  // written while shared: kept when the pages move back
  unshare_pages(*s);
  EXPECT_EQ(shared_page_moves(), moves);
  EXPECT_EQ(maps_perms(m.p + kPage), "rw-p");
  EXPECT_EQ(m.p[kPage + 7], 0xEE);
  m.p[kPage + 7] = static_cast<uint8_t>((kPage + 7) * 13 + 5);
  EXPECT_TRUE(m.intact());
}

TEST(MrShare, LeavesAloneWhatIsNotPrivateAnonymousMemory) {
  const uint32_t moves = shared_page_moves();
  Pages m(2);
  EXPECT_FALSE(share_pages(m.p + 1, kPage)) << "no whole page";
  EXPECT_FALSE(share_pages(m.p, 0));
  alignas(4096) volatile uint8_t stack[3 * 4096];
  stack[0] = 1;
  EXPECT_FALSE(share_pages(const_cast<uint8_t*>(stack), sizeof stack)) << "the stack";
  mprotect(m.p, m.len, PROT_READ);
  EXPECT_FALSE(share_pages(m.p, m.len)) << "read-only";
  mprotect(m.p, m.len, PROT_READ | PROT_WRITE);
  void* shared = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  EXPECT_FALSE(share_pages(shared, kPage)) << "a shared mapping";
  munmap(shared, kPage);
  void* gap = mmap(nullptr, 3 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  munmap(static_cast<uint8_t*>(gap) + kPage, kPage);
  EXPECT_FALSE(share_pages(gap, 3 * kPage)) << "a hole in the range";
  munmap(gap, 3 * kPage);
  EXPECT_EQ(shared_page_moves(), moves);
  EXPECT_TRUE(m.intact());
}

TEST(MrShare, ARangeInsideAMoveTakesAReferenceAndAnOverlapIsRefused) {
  Pages m(5);
  auto outer = share_pages(m.p, 4 * kPage);
  ASSERT_TRUE(outer);
  auto inner = share_pages(m.p + kPage, kPage);
  ASSERT_TRUE(inner);
  EXPECT_EQ(inner->id, outer->id);
  EXPECT_EQ(inner->file_off, kPage);
  EXPECT_FALSE(share_pages(m.p + 3 * kPage, 2 * kPage)) << "half in, half out";
  EXPECT_EQ(maps_perms(m.p + 4 * kPage), "rw-p");
  unshare_pages(*outer);
  EXPECT_EQ(maps_perms(m.p + kPage), "rw-s") << "moved back while another MR still used the pages";
  unshare_pages(*inner);
  EXPECT_EQ(maps_perms(m.p + kPage), "rw-p");
  EXPECT_TRUE(m.intact());
}

TEST(MrShare, AForkedChildGetsPrivateCopies) {
  Pages m(2);
  auto s = share_pages(m.p, m.len);
  ASSERT_TRUE(s);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child: its own private copy, with the bytes of the fork.
    const bool ok = maps_perms(m.p) == "rw-p" && m.intact() && shared_page_moves() == 0;
    m.p[3] = 0x99;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child did not get a private copy";
  EXPECT_TRUE(m.intact()) << "the child's write reached the parent";
  EXPECT_EQ(maps_perms(m.p), "rw-s");
  unshare_pages(*s);
}

// Another thread writes a log of words across the pages while they move back: every word must be there
// afterwards (a copy followed by a remap would lose those written in between).
TEST(MrShare, MovingBackLosesNoWriteOfAnotherThread) {
  constexpr size_t kPages = 256;
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE(round);
    Pages m(kPages);
    std::memset(m.p, 0, m.len);
    auto s = share_pages(m.p, m.len);
    ASSERT_TRUE(s);
    auto* words = reinterpret_cast<uint64_t*>(m.p);
    const size_t n = m.len / sizeof(uint64_t);
    std::atomic<size_t> done{0};
    std::thread writer([&] {
      for (size_t k = 0; k < n; ++k) {  // about 10 ms in all, so that the move falls inside it
        __atomic_store_n(&words[k], k + 1, __ATOMIC_RELAXED);
        if ((k & 1023) == 0) done.store(k, std::memory_order_relaxed);
        for (int i = 0; i < 16; ++i) __builtin_ia32_pause();
      }
      done.store(n, std::memory_order_release);
    });
    while (done.load(std::memory_order_relaxed) < n / 8) {
    }
    unshare_pages(*s);
    writer.join();
    EXPECT_EQ(maps_perms(m.p), "rw-p");
    size_t lost = 0;
    for (size_t k = 0; k < n; ++k) lost += __atomic_load_n(&words[k], __ATOMIC_RELAXED) != k + 1;
    EXPECT_EQ(lost, 0u) << "writes of another thread lost while the pages moved back";
  }
}

// Once moved back, MADV_DONTNEED gives zero pages again, as anonymous memory does (allocators count on it).
TEST(MrShare, MovedBackPagesReadZerosAfterDontneed) {
  Pages m(2);
  auto s = share_pages(m.p, m.len);
  ASSERT_TRUE(s);
  unshare_pages(*s);
  EXPECT_TRUE(m.intact());
  ASSERT_EQ(madvise(m.p, m.len, MADV_DONTNEED), 0);
  size_t nonzero = 0;
  for (size_t i = 0; i < m.len; ++i) nonzero += m.p[i] != 0;
  EXPECT_EQ(nonzero, 0u);
}

// A buffer registered, deregistered and registered again (as applications do) moves again: once moved
// back, its pages are a private mapping of the emptied memfd, private memory all the same.
TEST(MrShare, PagesMovedBackMoveAgain) {
  Pages m(2);
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    auto s = share_pages(m.p, m.len);
    ASSERT_TRUE(s) << "not moved";
    EXPECT_EQ(maps_perms(m.p), "rw-s");
    m.p[5] = 0x77;
    unshare_pages(*s);
    EXPECT_EQ(m.p[5], 0x77);
    m.p[5] = static_cast<uint8_t>(5 * 13 + 5);
    EXPECT_TRUE(m.intact());
  }
}

TEST(MrShare, PagesTheApplicationUnmappedAreNotMappedBack) {
  void* p = mmap(nullptr, 2 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  auto s = share_pages(p, 2 * kPage);
  ASSERT_TRUE(s);
  munmap(p, 2 * kPage);
  const pid_t pid = fork();  // nothing there to copy for the child
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(maps_perms(p).empty() ? 0 : 1);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  unshare_pages(*s);
  EXPECT_EQ(maps_perms(p), "");
}

// The application closed the memfd's number and opened another file under it: that file is neither
// mapped over the pages nor closed; the pages stay shared.
TEST(MrShare, AnFdTheApplicationReusedIsLeftAlone) {
  Pages m(2);
  auto s = share_pages(m.p, m.len);
  ASSERT_TRUE(s);
  const int other = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(other, 0);
  ASSERT_EQ(dup2(other, s->fd), s->fd);  // closes the memfd, puts /dev/null in its place
  close(other);
  unshare_pages(*s);
  EXPECT_NE(fcntl(s->fd, F_GETFD), -1) << "the application's fd was closed";
  EXPECT_EQ(maps_perms(m.p), "rw-s");
  EXPECT_TRUE(m.intact());
  close(s->fd);
}

TEST(PeerMaps, MapsAPeersPagesByTheirDescriptor) {
  Pages m(3);
  auto s = share_pages(m.p, m.len);
  ASSERT_TRUE(s);
  PeerMaps maps(getpid());  // this process as its own peer
  uint32_t slot = ~0u;
  uint8_t* base = maps.acquire(*s, &slot);
  ASSERT_NE(base, nullptr);
  EXPECT_LT(slot, PeerMaps::kSlots);
  EXPECT_NE(base, m.p) << "not a mapping of its own";
  EXPECT_EQ(std::memcmp(base, m.p, m.len), 0);
  base[kPage + 1] = 0x42;
  EXPECT_EQ(m.p[kPage + 1], 0x42) << "a write through the peer's mapping missed the owner's pages";
  maps.release(slot);
  uint32_t again = ~0u;
  EXPECT_EQ(maps.acquire(*s, &again), base) << "mapped twice";
  maps.release(again);
  SharedPages past = *s;  // the same id published again with a range past the end of the file
  past.file_off = m.len - kPage;
  past.len = 2 * kPage;
  EXPECT_EQ(maps.acquire(past, &again), nullptr) << "a range past the end of the mapping was handed out";
  SharedPages wrong = *s;
  wrong.id += 1000;
  wrong.ino += 1;
  EXPECT_EQ(maps.acquire(wrong, &again), nullptr) << "an fd whose file is not the published one was mapped";
  unshare_pages(*s);
}

TEST(PeerMaps, MoreMovesThanSlotsEvictTheOldest) {
  std::vector<std::unique_ptr<Pages>> mems;
  std::vector<SharedPages> shares;
  for (uint32_t i = 0; i < PeerMaps::kSlots + 3; ++i) {
    mems.push_back(std::make_unique<Pages>(1));
    auto s = share_pages(mems.back()->p, kPage);
    ASSERT_TRUE(s);
    shares.push_back(*s);
  }
  PeerMaps maps(getpid());
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < shares.size(); ++i) {
      uint32_t slot = 0;
      uint8_t* base = maps.acquire(shares[i], &slot);
      ASSERT_NE(base, nullptr) << i;
      base[10] = static_cast<uint8_t>(i + round);
      maps.release(slot);
      EXPECT_EQ(mems[i]->p[10], static_cast<uint8_t>(i + round));
    }
  }
  for (const SharedPages& s : shares) unshare_pages(s);
}

// The peer's /proc/<pid>/mem: one file for every small op, writes and reads reach the peer's memory, and
// after clear() (the peer gone) it is not opened again.
TEST(PeerMaps, OpensThePeersMemoryFileOnce) {
  PeerMaps maps(getpid());  // this process as its own peer
  uint64_t target = 0;
  const int fd = maps.acquire_mem();
  ASSERT_GE(fd, 0);
  const uint64_t v = 0x1122334455667788;
  EXPECT_EQ(pwrite(fd, &v, sizeof v, static_cast<off_t>(reinterpret_cast<uintptr_t>(&target))), 8);
  maps.release_mem();
  EXPECT_EQ(__atomic_load_n(&target, __ATOMIC_SEQ_CST), v);
  EXPECT_EQ(maps.acquire_mem(), fd) << "opened twice";
  uint64_t back = 0;
  EXPECT_EQ(pread(fd, &back, sizeof back, static_cast<off_t>(reinterpret_cast<uintptr_t>(&target))), 8);
  EXPECT_EQ(back, v);
  maps.release_mem();
  maps.clear();
  EXPECT_EQ(maps.acquire_mem(), -1);
  EXPECT_EQ(fcntl(fd, F_GETFD), -1) << "the file is still open";
  PeerMaps nobody(0x7fffffff);  // no such process
  EXPECT_EQ(nobody.acquire_mem(), -1);
}

}  // namespace
}  // namespace softrdma::io::shm
