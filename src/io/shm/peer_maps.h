// A requester's mappings of one same-host peer's shared pages (mr_share.h), cached by the move's id so that
// only the first access to an MR opens and maps anything. Lookups take no lock: a mapping in use is counted
// in its entry, and an entry is only unmapped (to make room, or at the end) once nothing uses it.
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
  // Unmaps every mapping (once nothing uses it): the peer is gone, and its memfds need not outlive it here.
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

  const int pid_;
  Entry e_[kSlots];
  std::mutex mu_;  // mapping and eviction
  uint32_t next_victim_ = 0;
};

}  // namespace softrdma::io::shm
