#include "io/shm/mr_share.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "io/env.h"
#include "io/sys.h"

namespace softrdma::io::shm {

namespace {

struct Move {
  uint64_t id;
  int fd;
  uint64_t dev, ino;
  uint64_t start, len;  // the pages, in this process
  uint32_t refs;
  void* snapshot = nullptr;  // a private copy made just before a fork (the child's pages)
};

std::mutex g_mu;
std::vector<Move> g_moves;  // under g_mu
uint64_t g_next_id = 1;     // under g_mu

// One line of /proc/self/maps.
struct MapLine {
  uint64_t start, end, offset, inode;
  char perms[5];
  const char* path;  // up to the end of the line (not terminated)
  size_t path_len;
};

std::string read_maps() {
  std::string out;
  const int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[16384];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

bool parse_line(const char* s, const char* end, MapLine* l) {
  int used = 0;
  unsigned dev_major = 0, dev_minor = 0;
  if (std::sscanf(s, "%" SCNx64 "-%" SCNx64 " %4s %" SCNx64 " %x:%x %" SCNu64 "%n", &l->start, &l->end,
                  l->perms, &l->offset, &dev_major, &dev_minor, &l->inode, &used) != 7)
    return false;
  const char* p = s + used;
  while (p < end && *p == ' ') ++p;
  l->path = p;
  l->path_len = static_cast<size_t>(end - p);
  return true;
}

// Whether every byte of [a, b) is mapped, by lines that all satisfy `ok`.
template <class F>
bool range_is(uint64_t a, uint64_t b, F ok) {
  const std::string maps = read_maps();
  uint64_t at = a;
  const char* s = maps.data();
  const char* const stop = s + maps.size();
  while (s < stop && at < b) {
    const char* nl = static_cast<const char*>(std::memchr(s, '\n', static_cast<size_t>(stop - s)));
    const char* end = nl ? nl : stop;
    MapLine l;
    if (parse_line(s, end, &l) && l.end > at) {
      if (l.start > at || !ok(l)) return false;  // a gap, or a mapping of another kind
      at = l.end;
    }
    s = end + 1;
  }
  return at >= b;
}

constexpr const char* kMemfdName = "softrdma-mr";

// Private anonymous memory, or pages an earlier move gave back: a private mapping of its emptied memfd,
// whose pages are all private copies (move_back), so that a buffer registered again moves again.
bool private_anonymous(const MapLine& l) {
  if (std::strcmp(l.perms, "rw-p") != 0) return false;
  const std::string_view path(l.path, l.path_len);
  if (l.inode != 0) return path == std::string("/memfd:") + kMemfdName + " (deleted)";
  return path.empty() || path == "[heap]" || path.starts_with("[anon:");
}

// Whether [start, start + len) is still the move's shared mapping (the application may have unmapped or
// replaced it meanwhile: then there is nothing of it to keep).
bool still_shared(const Move& m) {
  return range_is(m.start, m.start + m.len, [&](const MapLine& l) {
    return std::strcmp(l.perms, "rw-s") == 0 && l.inode == m.ino && l.offset == l.start - m.start;
  });
}

// Whether the move's fd is still its memfd: the application may have closed the number (a daemon closing
// every fd) and opened something else under it, which must not be mapped, punched or closed. Without its
// fd a move stays shared (correct; a fork still gives the child copies).
bool fd_is_ours(const Move& m) {
  struct stat sb;
  return fstat(m.fd, &sb) == 0 && static_cast<uint64_t>(sb.st_dev) == m.dev &&
         static_cast<uint64_t>(sb.st_ino) == m.ino;
}
void close_fd(const Move& m) {
  if (fd_is_ours(m)) close(m.fd);
}

// Makes the pages private again without losing a write of another thread: a private mapping of the same
// memfd replaces the shared one in one call (a write before it is in the memfd, which the private mapping
// reads; a write after it makes the page a private copy), every page is then made a private copy
// (MADV_POPULATE_WRITE, or an atomic add of 0 per page), and (`free_file`) the memfd's pages are freed,
// so that madvise(MADV_DONTNEED) reads zeros there again, as in anonymous memory. A forked child must not
// free them: they are its parent's too.
void move_back(const Move& m, bool free_file) {
  if (!still_shared(m) || !fd_is_ours(m)) return;
  auto* p = reinterpret_cast<uint8_t*>(m.start);
  if (mmap(p, m.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, m.fd, 0) == MAP_FAILED)
    return;  // the pages stay shared: correct, and a fork still gives the child copies
  if (madvise(p, m.len, MADV_POPULATE_WRITE) != 0) {
    for (uint64_t off = 0; off < m.len; off += page_bytes())
      __atomic_fetch_add(reinterpret_cast<uint64_t*>(p + off), 0, __ATOMIC_RELAXED);
  }
  if (free_file)
    (void)fallocate(m.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(m.len));
}

// A child shares nothing with its parent and sees its moved pages as they were when fork was called, as
// the kernel gives a child copies of pinned pages: the parent copies them just before the fork, and the
// child maps the copies in their place.
void before_fork() {
  g_mu.lock();
  for (Move& m : g_moves) {
    if (!still_shared(m)) continue;  // unmapped by the application: nothing to copy
    void* s = mmap(nullptr, m.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED) continue;  // the child makes its pages private itself, a little later
    std::memcpy(s, reinterpret_cast<void*>(m.start), m.len);
    m.snapshot = s;
  }
}
void parent_after_fork() {
  for (Move& m : g_moves) {
    if (m.snapshot != nullptr) munmap(m.snapshot, m.len);
    m.snapshot = nullptr;
  }
  g_mu.unlock();
}
void child_after_fork() {
  for (Move& m : g_moves) {
    const bool placed = m.snapshot != nullptr && still_shared(m) &&
                        mremap(m.snapshot, m.len, m.len, MREMAP_MAYMOVE | MREMAP_FIXED,
                               reinterpret_cast<void*>(m.start)) != MAP_FAILED;
    if (!placed && m.snapshot != nullptr) munmap(m.snapshot, m.len);
    if (!placed) move_back(m, false);
    close_fd(m);
  }
  g_moves.clear();
  g_mu.unlock();
}

}  // namespace

bool share_mr_by_env() { return env_opt_in("SOFTRDMA_SHARE_MR"); }

std::optional<SharedPages> share_pages(const void* addr, uint64_t len) {
  const uint64_t page = page_bytes();
  const uint64_t a = reinterpret_cast<uint64_t>(addr);
  if (len == 0 || a + len < a) return std::nullopt;
  const uint64_t start = (a + page - 1) & ~(page - 1);
  const uint64_t end = (a + len) & ~(page - 1);
  if (end <= start) return std::nullopt;
  const uint64_t n = end - start;

  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(before_fork, parent_after_fork, child_after_fork); });
  std::lock_guard lock(g_mu);
  for (Move& m : g_moves) {
    if (start >= m.start && end <= m.start + m.len) {
      ++m.refs;
      return SharedPages{m.id, m.fd, m.ino, start - m.start, start, n};
    }
    if (start < m.start + m.len && m.start < end) return std::nullopt;  // in part: leave it alone
  }
  if (!range_is(start, end, private_anonymous)) return std::nullopt;

  const int fd = memfd_create(kMemfdName, MFD_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat sb;
  void* tmp = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(n)) == 0 && fstat(fd, &sb) == 0)
    tmp = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (tmp == MAP_FAILED) {
    close(fd);
    return std::nullopt;
  }
  // The copy also allocates the memfd's pages and fills the page tables that mremap carries over.
  std::memcpy(tmp, reinterpret_cast<void*>(start), n);
  if (mremap(tmp, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, reinterpret_cast<void*>(start)) == MAP_FAILED) {
    munmap(tmp, n);
    close(fd);
    return std::nullopt;
  }
  const Move m{g_next_id++, fd, static_cast<uint64_t>(sb.st_dev), static_cast<uint64_t>(sb.st_ino), start,
               n,           1};
  g_moves.push_back(m);
  return SharedPages{m.id, fd, m.ino, 0, start, n};
}

void unshare_pages(const SharedPages& p) {
  std::lock_guard lock(g_mu);
  for (size_t i = 0; i < g_moves.size(); ++i) {
    Move& m = g_moves[i];
    if (m.id != p.id) continue;
    if (--m.refs == 0) {
      move_back(m, true);
      close_fd(m);
      g_moves.erase(g_moves.begin() + static_cast<std::ptrdiff_t>(i));
    }
    return;
  }
}

uint32_t shared_page_moves() {
  std::lock_guard lock(g_mu);
  return static_cast<uint32_t>(g_moves.size());
}

}  // namespace softrdma::io::shm
