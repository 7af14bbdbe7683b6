// One-sided access between the processes of one host (ARCHITECTURE.md "Performance plan"): a context that
// publishes its ports in shared memory (io/shm) also publishes, in a file of its own, what a peer needs to
// check an RDMA WRITE or READ the way its responder would: its RC and UC QPs (state, remote access flags,
// PD, peer QPN; for UC also the PSN after the last packet its responder took) and its MRs (key, PD, access,
// range, and where the range lies in its address space). A requester whose QP has nothing else outstanding
// then moves the data itself, with a pwrite or pread on the peer's /proc/<pid>/mem for a small op
// (peer_maps.h), else process_vm_writev or process_vm_readv: one copy, no packet, no work for the peer's CPU,
// as with a NIC. Where the MR's pages are shared (SOFTRDMA_SHARE_MR=1, mr_share.h), the entry also names
// their memfd, and the requester copies with memcpy through its own mapping of it (peer_maps.h), or runs an
// ATOMIC there with the CPU's atomics. Anything it cannot check, or any failure of the call, sends the
// request the ordinary way instead (the responder then decides, NAKs included), so this is an optimisation
// only: the semantics are the responder's.
//
// Races with the owner: each entry has a sequence number (odd while the owner rewrites it) that a reader
// reads before and after the fields. A reader announces an access in an MR entry's `inflight` before it
// re-checks the entry, and deregistration withdraws the entry before it waits for `inflight` to fall to
// zero (the in-process MrTable does the same), so no copy lands in memory after ibv_dereg_mr returned. A
// reader killed between the two steps leaves `inflight` up: deregistration gives up waiting after
// kDeregWaitNs (a dead process copies nothing; the wait is only for live ones).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <expected>
#include <memory>
#include <string>

#include "io/backend.h"
#include "io/shm/mr_share.h"

namespace softrdma::io::shm {

class CopyHelper;
class PeerMaps;

inline constexpr uint64_t kAccessMagic = 0x53524143434553ull;  // "SRACCES"
inline constexpr uint32_t kAccessVersion = 4;
inline constexpr uint32_t kMrSlots = 1u << 15;  // an MR with no room near its slot is not published
inline constexpr uint32_t kQpSlots = 1u << 14;  // by the low bits of the QPN (a collision: no direct path)
inline constexpr uint32_t kMaxProbe = 64;

// Access flags, as the verbs define them (ibv_access_flags).
inline constexpr uint32_t kAccRemoteWrite = 1u << 1;
inline constexpr uint32_t kAccRemoteRead = 1u << 2;
inline constexpr uint32_t kAccRemoteAtomic = 1u << 3;

struct SharedMr {
  std::atomic<uint32_t> seq;
  std::atomic<uint32_t> inflight;
  std::atomic<uint32_t> state;  // 0 never used, 1 live, 2 withdrawn (a probe goes on past it)
  std::atomic<uint32_t> key;
  std::atomic<uint32_t> access;
  std::atomic<uint32_t> pd;
  std::atomic<uint64_t> iova;
  std::atomic<uint64_t> length;
  std::atomic<uint64_t> addr;  // where iova lies in the owner's address space
  // Pages of the MR that the owner moved into a memfd (mr_share.h), which a peer may map itself: 0 = none.
  std::atomic<uint64_t> share_id;
  std::atomic<uint64_t> share_ino;
  std::atomic<uint64_t> share_off;  // of share_addr in the memfd
  std::atomic<uint64_t> share_addr;
  std::atomic<uint64_t> share_len;
  std::atomic<int32_t> share_fd;  // in the owner: /proc/<pid>/fd/<share_fd>
};

struct SharedQp {
  std::atomic<uint32_t> seq;
  std::atomic<uint32_t> qpn;   // 0: none
  std::atomic<uint32_t> open;  // 1: RTR, RTS or SQD (accepts requests)
  std::atomic<uint32_t> access;
  std::atomic<uint32_t> pd;
  std::atomic<uint32_t> dest_qpn;  // the only QP it takes requests from
  std::atomic<uint32_t> uc;        // 1: a UC QP, 0: RC
  // UC: the PSN after the last packet the responder took (executed or dropped), stored after its data
  // was placed; kNoPsn until it took one. Outside `seq`: the data path stores it.
  std::atomic<uint32_t> psn_seen;
};
inline constexpr uint32_t kNoPsn = ~0u;  // (PSNs have 24 bits)

struct AccessHeader {
  uint64_t magic;  // stored last (release), checked first (acquire)
  uint32_t version;
  uint32_t mr_slots;
  uint32_t qp_slots;
  int32_t pid;
  uint64_t start_time;
  uint64_t pidns;
  // 1 once an MR with pages a peer may map (SharedMr::share_id) was published, before its entry; never
  // back to 0. A peer that asks only for those (DirectOp::shared_only: a lone WRITE that takes the ring
  // otherwise) stops here while it is 0.
  std::atomic<uint32_t> any_shared;
};

// The file of one context, as its owner writes it.
class AccessTable {
 public:
  static constexpr uint64_t kDeregWaitNs = 1'000'000'000;
  // Creates and maps `path` (mode 0600, all of it allocated: a full /dev/shm fails here, not with SIGBUS
  // later), held by a shared flock for its life as the port files are (ShmIo::collect_garbage removes it
  // once its process is gone), and removed again by the destructor.
  static std::expected<std::unique_ptr<AccessTable>, int> create(const std::string& path, int pid,
                                                                 uint64_t start_time, uint64_t pidns);
  ~AccessTable();
  AccessTable(const AccessTable&) = delete;
  AccessTable& operator=(const AccessTable&) = delete;

  // Owner side; callers serialise them (the context's control path).
  // `pages`: the MR's pages that peers may map (null: none).
  void publish_mr(const MrInfo& mr, const SharedPages* pages);
  // Withdraws the MR and waits for the accesses of other processes in flight.
  void withdraw_mr(uint32_t key);
  // open = false withdraws it. Returns the entry's psn_seen for an open UC QP (kNoPsn again), else null.
  std::atomic<uint32_t>* publish_qp(const QpInfo& qp);

  // Reader side, on a peer's table mapped by `map`: 0 when the data moved (process_vm_*), 1 when it moved
  // by memcpy, or an ATOMIC ran, through pages the peer shares (`maps`, if given, maps them), 2 when it
  // moved through the peer's /proc/<pid>/mem (`maps`, a small op), 3 when it moved by two process_vm_*
  // calls at once, one on `helper`'s thread (a large op, copy_helper.h), -1 when the op
  // must go the ordinary way (nothing can be checked, a check fails, or the call fails), -2 when the kernel
  // refused the call (another user, a ptrace policy, the peer gone).
  static int direct(void* map, size_t len, int pid, const DirectOp& op, PeerMaps* maps,
                    CopyHelper* helper = nullptr);
  static size_t file_bytes();

  void* map() const { return map_; }

 private:
  AccessTable() = default;
  std::string path_;
  int fd_ = -1;
  void* map_ = nullptr;
  size_t len_ = 0;
};

}  // namespace softrdma::io::shm
