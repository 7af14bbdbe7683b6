#include "io/stats_shm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>
#include <optional>

#include "io/proc.h"

namespace softrdma::io {
namespace {

using Header = StatsRegion::Header;

constexpr bool names_fit() {
  for (const auto& c : kCounterInfo) {
    if (c.name.size() >= StatsRegion::kNameLen) return false;
  }
  return true;
}
static_assert(names_fit(), "a counter name is too long for the stats file");
static_assert(StatsRegion::kCountersOffset % 64 == 0);

std::atomic<uint32_t> g_next_seq{0};

bool valid_devname(std::string_view dev) {
  if (dev.empty() || dev.size() > StatsRegion::kMaxDeviceName || dev.front() == '.') return false;
  return dev.find('/') == std::string_view::npos && dev.find('\0') == std::string_view::npos;
}

std::string prefix_of(std::string_view dev) {
  std::string p(StatsRegion::kFilePrefix);
  p += dev;
  p += '.';
  return p;
}
std::string retired_name(std::string_view dev) {
  return prefix_of(dev) + std::string(StatsRegion::kRetiredSuffix);
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// "<pid>.<seq>": a per-context file name after the device prefix.
bool is_context_suffix(std::string_view rest) {
  const size_t dot = rest.find('.');
  return dot != std::string_view::npos && all_digits(rest.substr(0, dot)) && all_digits(rest.substr(dot + 1));
}

// The names of the device's per-context files in kShmDir.
std::vector<std::string> context_files(std::string_view dev) {
  std::vector<std::string> out;
  DIR* d = opendir(StatsRegion::kShmDir);
  if (d == nullptr) return out;
  const std::string prefix = prefix_of(dev);
  while (dirent* e = readdir(d)) {
    std::string_view name(e->d_name);
    if (name.starts_with(prefix) && is_context_suffix(name.substr(prefix.size()))) out.emplace_back(name);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// A mapped stats file.
class Mapping {
 public:
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (base_ != nullptr) munmap(base_, size_);
  }

  // Maps the whole file; false if it is not a valid stats file of `dev` (yet).
  bool map(int fd, bool writable, std::string_view dev) {
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(Header))) return false;
    size_ = static_cast<size_t>(st.st_size);
    void* p = mmap(nullptr, size_, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return false;
    base_ = static_cast<uint8_t*>(p);
    const Header* h = header();
    if (std::atomic_ref<uint64_t>(header()->magic).load(std::memory_order_acquire) != StatsRegion::kMagic ||
        h->version != StatsRegion::kVersion || h->counters_offset % 8 != 0 || h->name_len == 0 ||
        size_t{h->counters_offset} + size_t{h->num_counters} * 8 > size_ ||
        size_t{h->names_offset} + size_t{h->num_counters} * h->name_len > size_ ||
        std::string_view(h->device, strnlen(h->device, sizeof h->device)) != dev) {
      return false;
    }
    // Map the file's counters onto this build's by name; unknown names are skipped.
    index_.assign(h->num_counters, -1);
    for (uint32_t i = 0; i < h->num_counters; ++i) {
      const char* nm = reinterpret_cast<const char*>(base_ + h->names_offset + size_t{i} * h->name_len);
      const std::string_view name(nm, strnlen(nm, h->name_len));
      if (i < kNumCounters && kCounterInfo[i].name == name) {
        index_[i] = static_cast<int>(i);
        continue;
      }
      for (uint32_t j = 0; j < kNumCounters; ++j) {
        if (kCounterInfo[j].name == name) index_[i] = static_cast<int>(j);
      }
    }
    return true;
  }

  Header* header() { return reinterpret_cast<Header*>(base_); }
  uint64_t* values() { return reinterpret_cast<uint64_t*>(base_ + header()->counters_offset); }
  bool same_layout() const {
    if (index_.size() != kNumCounters) return false;
    for (uint32_t i = 0; i < kNumCounters; ++i) {
      if (index_[i] != static_cast<int>(i)) return false;
    }
    return true;
  }

  // totals[j] += this file's counter named as this build's counter j.
  void add_to(std::array<uint64_t, kNumCounters>& totals) {
    uint64_t* v = values();
    for (size_t i = 0; i < index_.size(); ++i) {
      if (index_[i] >= 0)
        totals[index_[i]] += std::atomic_ref<uint64_t>(v[i]).load(std::memory_order_relaxed);
    }
  }
  void zero() {
    uint64_t* v = values();
    for (size_t i = 0; i < index_.size(); ++i)
      std::atomic_ref<uint64_t>(v[i]).store(0, std::memory_order_relaxed);
  }

 private:
  uint8_t* base_ = nullptr;
  size_t size_ = 0;
  std::vector<int> index_;  // file counter i -> this build's counter, or -1
};

// Writes a fresh file of this build's layout into `fd` (already kFileSize long and zero) for `pid`, with
// initial `values`; the magic goes last.
bool init_file(int fd, std::string_view dev, int pid, const std::array<uint64_t, kNumCounters>& values) {
  void* p = mmap(nullptr, StatsRegion::kFileSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return false;
  auto* base = static_cast<uint8_t*>(p);
  std::memset(base, 0, StatsRegion::kFileSize);
  auto* h = reinterpret_cast<Header*>(base);
  h->version = StatsRegion::kVersion;
  h->num_counters = kNumCounters;
  h->counters_offset = StatsRegion::kCountersOffset;
  h->names_offset = StatsRegion::kNamesOffset;
  h->name_len = StatsRegion::kNameLen;
  h->pid = pid;
  h->start_time = pid > 0 ? proc_start_time(pid) : 0;
  std::memcpy(h->device, dev.data(), dev.size());
  for (uint32_t i = 0; i < kNumCounters; ++i) {
    std::memcpy(base + StatsRegion::kNamesOffset + size_t{i} * StatsRegion::kNameLen,
                kCounterInfo[i].name.data(), kCounterInfo[i].name.size());
  }
  std::memcpy(base + StatsRegion::kCountersOffset, values.data(), sizeof values);
  std::atomic_ref<uint64_t>(h->magic).store(StatsRegion::kMagic, std::memory_order_release);
  munmap(p, StatsRegion::kFileSize);
  return true;
}

// The retired file, locked. Opening with `create` also makes sure it has this build's layout (an older
// layout is rewritten, its values carried over by name).
class RetiredLock {
 public:
  RetiredLock(std::string_view dev, bool create, int lock_op) {
    const std::string path = std::string(StatsRegion::kShmDir) + "/" + retired_name(dev);
    fd_ = open(path.c_str(), create ? O_RDWR | O_CREAT | O_CLOEXEC : O_RDONLY | O_CLOEXEC, 0666);
    if (fd_ < 0 && !create) return;
    if (fd_ < 0) return;
    while (flock(fd_, lock_op) != 0 && errno == EINTR) {
    }
    if (!create) return;
    fchmod(fd_, 0666);  // any user's garbage collector may fold into it
    std::array<uint64_t, kNumCounters> carried{};
    {
      Mapping m;
      if (m.map(fd_, false, dev)) {
        if (m.same_layout()) {
          ok_ = true;
          return;
        }
        m.add_to(carried);
      }
    }
    ok_ = ftruncate(fd_, 0) == 0 && ftruncate(fd_, StatsRegion::kFileSize) == 0 &&
          init_file(fd_, dev, 0, carried);
  }
  ~RetiredLock() {
    if (fd_ >= 0) close(fd_);  // releases the lock
  }
  int fd() const { return fd_; }
  bool ok() const { return ok_; }

 private:
  int fd_ = -1;
  bool ok_ = false;
};

}  // namespace

std::expected<std::unique_ptr<StatsRegion>, int> StatsRegion::create(std::string_view devname) {
  if (!valid_devname(devname)) return std::unexpected(EINVAL);
  collect_garbage(devname);

  const int pid = getpid();
  std::string name;
  int fd = -1;
  for (int attempt = 0; attempt < 1000 && fd < 0; ++attempt) {
    name = "/" + prefix_of(devname) + std::to_string(pid) + "." +
           std::to_string(g_next_seq.fetch_add(1, std::memory_order_relaxed));
    fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST) return std::unexpected(errno);
  }
  if (fd < 0) return std::unexpected(EEXIST);
  if (ftruncate(fd, kFileSize) != 0 || !init_file(fd, devname, pid, {})) {
    const int err = errno != 0 ? errno : EIO;
    shm_unlink(name.c_str());
    close(fd);
    return std::unexpected(err);
  }
  void* map = mmap(nullptr, kFileSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (map == MAP_FAILED) {
    shm_unlink(name.c_str());
    return std::unexpected(err);
  }
  // The block was zeroed by init_file; the atomics live in the shared mapping from here on.
  auto* counters = reinterpret_cast<Counters*>(static_cast<uint8_t*>(map) + kCountersOffset);
  std::unique_ptr<StatsRegion> r(new (std::nothrow) StatsRegion(std::string(kShmDir) + name, map, counters));
  if (!r) {
    munmap(map, kFileSize);
    shm_unlink(name.c_str());
    return std::unexpected(ENOMEM);
  }
  return r;
}

StatsRegion::~StatsRegion() {
  if (map_ == nullptr) return;
  auto* h = static_cast<Header*>(map_);
  std::atomic_ref<uint32_t>(h->closed).store(1, std::memory_order_relaxed);
  munmap(map_, kFileSize);
}

int StatsRegion::collect_garbage(std::string_view devname) {
  if (!valid_devname(devname)) return 0;
  RetiredLock retired(devname, /*create=*/true, LOCK_EX);
  if (!retired.ok()) return 0;
  Mapping rm;
  if (!rm.map(retired.fd(), true, devname)) return 0;

  const int dirfd = open(kShmDir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirfd < 0) return 0;
  int folded = 0;
  for (const auto& name : context_files(devname)) {
    const int fd = openat(dirfd, name.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    Mapping m;
    const bool valid = m.map(fd, false, devname);
    close(fd);
    if (!valid || process_alive(m.header()->pid, m.header()->start_time)) continue;
    // Unlink first: a file we may not remove (another user's, sticky /dev/shm) must not be counted twice.
    if (unlinkat(dirfd, name.c_str(), 0) != 0) continue;
    std::array<uint64_t, kNumCounters> add{};
    m.add_to(add);
    uint64_t* rv = rm.values();
    for (uint32_t j = 0; j < kNumCounters; ++j) {
      std::atomic_ref<uint64_t>(rv[j]).fetch_add(add[j], std::memory_order_relaxed);
    }
    ++folded;
  }
  close(dirfd);
  return folded;
}

std::array<uint64_t, kNumCounters> StatsRegion::sum(std::string_view devname, int pid) {
  std::array<uint64_t, kNumCounters> totals{};
  if (!valid_devname(devname)) return totals;
  // Shared lock: the garbage collector cannot move counts into the retired file while we read.
  RetiredLock retired(devname, /*create=*/false, LOCK_SH);
  if (retired.fd() >= 0 && pid == 0) {
    Mapping m;
    if (m.map(retired.fd(), false, devname)) m.add_to(totals);
  }
  const int dirfd = open(kShmDir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirfd < 0) return totals;
  for (const auto& name : context_files(devname)) {
    const int fd = openat(dirfd, name.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    Mapping m;
    if (m.map(fd, false, devname) && (pid == 0 || m.header()->pid == pid)) m.add_to(totals);
    close(fd);
  }
  close(dirfd);
  return totals;
}

void StatsRegion::reset(std::string_view devname) {
  if (!valid_devname(devname)) return;
  RetiredLock retired(devname, /*create=*/true, LOCK_EX);
  if (retired.ok()) {
    Mapping m;
    if (m.map(retired.fd(), true, devname)) m.zero();
  }
  const int dirfd = open(kShmDir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirfd < 0) return;
  for (const auto& name : context_files(devname)) {
    const int fd = openat(dirfd, name.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) continue;
    Mapping m;
    if (m.map(fd, true, devname)) m.zero();
    close(fd);
  }
  close(dirfd);
}

std::vector<std::string> StatsRegion::devices_with_files() {
  std::vector<std::string> out;
  DIR* d = opendir(kShmDir);
  if (d == nullptr) return out;
  const std::string retired_tail = "." + std::string(kRetiredSuffix);
  while (dirent* e = readdir(d)) {
    std::string_view name(e->d_name);
    if (!name.starts_with(kFilePrefix)) continue;
    name.remove_prefix(kFilePrefix.size());
    std::optional<std::string_view> dev;
    if (name.ends_with(retired_tail)) {
      dev = name.substr(0, name.size() - retired_tail.size());
    } else {
      // "<dev>.<pid>.<seq>": strip the last two dot-separated fields.
      const size_t d2 = name.rfind('.');
      const size_t d1 =
          d2 == std::string_view::npos || d2 == 0 ? std::string_view::npos : name.rfind('.', d2 - 1);
      if (d1 != std::string_view::npos && is_context_suffix(name.substr(d1 + 1))) dev = name.substr(0, d1);
    }
    if (dev && valid_devname(*dev)) out.emplace_back(*dev);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void StatsRegion::remove_all(std::string_view devname) {
  if (!valid_devname(devname)) return;
  const int dirfd = open(kShmDir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirfd < 0) return;
  for (const auto& name : context_files(devname)) unlinkat(dirfd, name.c_str(), 0);
  unlinkat(dirfd, retired_name(devname).c_str(), 0);
  close(dirfd);
}

}  // namespace softrdma::io
