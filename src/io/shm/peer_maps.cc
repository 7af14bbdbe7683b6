#include "io/shm/peer_maps.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <thread>

namespace softrdma::io::shm {

PeerMaps::~PeerMaps() {
  for (Entry& e : e_) unmap(e);
  close_mem();
}

void PeerMaps::clear() {
  std::lock_guard lock(mu_);
  for (Entry& e : e_) unmap(e);
  close_mem();
}

// As try_use and unmap for the entries: a user announces itself, then checks the file is still there; the
// closer takes it away first, then waits for the users.
int PeerMaps::acquire_mem() {
  int fd = mem_fd_.load(std::memory_order_acquire);
  if (fd == kMemUntried) {
    std::lock_guard lock(mu_);
    fd = mem_fd_.load(std::memory_order_relaxed);
    if (fd == kMemUntried) {
      char path[32];
      std::snprintf(path, sizeof path, "/proc/%d/mem", pid_);
      fd = open(path, O_RDWR | O_CLOEXEC);
      if (fd < 0) fd = kMemNone;
      mem_fd_.store(fd, std::memory_order_release);
    }
  }
  if (fd < 0) return -1;
  mem_users_.fetch_add(1, std::memory_order_seq_cst);
  if (mem_fd_.load(std::memory_order_seq_cst) == fd) return fd;
  release_mem();
  return -1;
}

void PeerMaps::close_mem() {
  const int fd = mem_fd_.exchange(kMemNone, std::memory_order_seq_cst);
  while (mem_users_.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
  if (fd >= 0) close(fd);
}

// Announces a use of entry i, then checks that it still holds `id` (its evictor clears the id before it
// waits for the users: one of the two sees the other).
bool PeerMaps::try_use(uint32_t i, uint64_t id) {
  Entry& e = e_[i];
  if (e.id.load(std::memory_order_acquire) != id) return false;
  e.users.fetch_add(1, std::memory_order_seq_cst);
  if (e.id.load(std::memory_order_seq_cst) == id) return true;
  e.users.fetch_sub(1, std::memory_order_release);
  return false;
}

void PeerMaps::unmap(Entry& e) {
  e.id.store(0, std::memory_order_seq_cst);
  while (e.users.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
  if (e.base != nullptr) munmap(e.base, e.len);
  e.base = nullptr;
  e.len = 0;
}

// The mapping of entry i, in use, if the published pages lie inside it (a peer that publishes another
// range under an id it used before gets nothing, not a copy past the end of the mapping).
uint8_t* PeerMaps::use(uint32_t i, const SharedPages& p, uint32_t* slot) {
  const Entry& e = e_[i];
  if (p.file_off > e.len || p.len > e.len - p.file_off) {
    release(i);
    return nullptr;
  }
  *slot = i;
  return e.base;
}

uint8_t* PeerMaps::acquire(const SharedPages& p, uint32_t* slot) {
  if (p.id == 0) return nullptr;
  for (uint32_t i = 0; i < kSlots; ++i)
    if (try_use(i, p.id)) return use(i, p, slot);
  std::lock_guard lock(mu_);
  uint32_t pick = kSlots;
  for (uint32_t i = 0; i < kSlots; ++i) {
    if (try_use(i, p.id)) return use(i, p, slot);  // mapped by another thread meanwhile
    if (pick == kSlots && e_[i].id.load(std::memory_order_relaxed) == 0) pick = i;
  }
  if (pick == kSlots) pick = next_victim_++ % kSlots;
  Entry& e = e_[pick];
  unmap(e);

  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/fd/%d", pid_, p.fd);
  const int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat sb;
  void* map = MAP_FAILED;
  const uint64_t need = p.file_off + p.len;
  if (fstat(fd, &sb) == 0 && static_cast<uint64_t>(sb.st_ino) == p.ino && S_ISREG(sb.st_mode) &&
      static_cast<uint64_t>(sb.st_size) >= need)
    map = mmap(nullptr, static_cast<size_t>(sb.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return nullptr;
  e.base = static_cast<uint8_t*>(map);
  e.len = static_cast<uint64_t>(sb.st_size);
  e.users.fetch_add(1, std::memory_order_relaxed);
  e.id.store(p.id, std::memory_order_release);
  return use(pick, p, slot);
}

}  // namespace softrdma::io::shm
