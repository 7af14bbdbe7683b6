// A requester's ways into one same-host peer's memory: mappings of its shared pages (mr_share.h), cached by
// the move's id so that only the first access to an MR opens and maps anything, and its /proc/<pid>/mem.
// Lookups take no lock: a mapping or the file in use is counted, and only unmapped or closed (to make room,
// or at the end) once nothing uses it.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

#include "io/shm/mr_share.h"

namespace softrdma::io::shm {

class PeerMaps {
 public:
  static constexpr uint32_t kSlots = 16;  // mappings kept per peer; more evict the oldest
  explicit PeerMaps(int pid) : pid_(pid) {}
  ~PeerMaps();
  PeerMaps(const PeerMaps&) = delete;
  PeerMaps& operator=(const PeerMaps&) = delete;

  // The start of `pages`' memfd mapped here (its byte 0), held until release(*slot); null if it cannot be
  // mapped, or if the pages do not lie inside the file as mapped. The caller makes sure that the peer keeps
  // the memfd open meanwhile (an access announced in the access table's entry of the MR).
  uint8_t* acquire(const SharedPages& pages, uint32_t* slot);
  void release(uint32_t slot) { e_[slot].users.fetch_sub(1, std::memory_order_release); }
  // The peer's /proc/<pid>/mem, opened at the first call, held until release_mem(); -1 if it cannot be
  // opened, and after clear(). A small one-sided op is one pwrite or pread on it: 8 bytes take 0.81 us
  // here against process_vm_writev's 1.13, which looks up the process and checks the permission on every
  // call (the file did that once, and stays bound to the process's memory, not to its pid). Its copy
  // goes through a kernel page at a time, so large ops stay on process_vm_* (64 KiB: 13.3 against 4.8 us).
  int acquire_mem();
  void release_mem() { mem_users_.fetch_sub(1, std::memory_order_release); }
  // Unmaps every mapping and closes the file (once nothing uses them): the peer is gone, and its memfds
  // need not outlive it here. The file is not opened again: its pid may be another process's by then.
  void clear();

 private:
  struct Entry {
    std::atomic<uint64_t> id{0};  // 0: unused
    std::atomic<uint32_t> users{0};
    uint8_t* base = nullptr;  // written before id (release), under mu_
    uint64_t len = 0;
  };
  bool try_use(uint32_t i, uint64_t id);
  uint8_t* use(uint32_t i, const SharedPages& p, uint32_t* slot);
  void unmap(Entry& e);
  void close_mem();

  static constexpr int kMemUntried = -2, kMemNone = -1;
  const int pid_;
  std::atomic<int> mem_fd_{kMemUntried};  // or kMemNone, or the file (opened under mu_)
  std::atomic<uint32_t> mem_users_{0};
  Entry e_[kSlots];
  std::mutex mu_;  // mapping and eviction
  uint32_t next_victim_ = 0;
};

}  // namespace softrdma::io::shm
