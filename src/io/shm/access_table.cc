#include "io/shm/access_table.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <new>
#include <thread>

#include "io/clock.h"
#include "io/shm/copy_helper.h"
#include "io/shm/peer_maps.h"
#include "io/sys.h"

namespace softrdma::io::shm {

namespace {

constexpr size_t kHeaderBytes = 4096;
static_assert(sizeof(AccessHeader) <= kHeaderBytes);
constexpr size_t kMrOffset = kHeaderBytes;
constexpr size_t kQpOffset = kMrOffset + size_t{kMrSlots} * sizeof(SharedMr);
constexpr size_t kFileBytes = (kQpOffset + size_t{kQpSlots} * sizeof(SharedQp) + 4095) & ~size_t{4095};
// One-sided ops up to this size go through the peer's /proc/<pid>/mem (PeerMaps::acquire_mem). Its copy
// goes through a kernel page: 4 KiB took 1.16 us there against 1.35 with process_vm_writev, but 4 KiB
// ib_write_bw (same host) lost 10-20%; 512 bytes 0.82 against 1.14 us.
constexpr uint64_t kMemFileMax = 1024;
// A split copy's last bytes, copied after both halves (below).
constexpr size_t kLastBytes = 64;

SharedMr* mrs(void* map) { return reinterpret_cast<SharedMr*>(static_cast<uint8_t*>(map) + kMrOffset); }
SharedQp* qps(void* map) { return reinterpret_cast<SharedQp*>(static_cast<uint8_t*>(map) + kQpOffset); }
uint32_t mr_slot(uint32_t key) { return (key * 0x9E3779B1u) & (kMrSlots - 1); }

// A writer's bracket around an entry's fields (readers retry nothing: a change seen means "not now").
template <class E>
void begin_write(E& e) {
  e.seq.fetch_add(1, std::memory_order_seq_cst);  // odd
}
template <class E>
void end_write(E& e) {
  e.seq.fetch_add(1, std::memory_order_release);  // even
}

template <class T>
T ld(const std::atomic<T>& a) {
  return a.load(std::memory_order_relaxed);
}

// Runs `read` (relaxed loads of an entry's fields) between two loads of the entry's sequence number:
// false if the owner was rewriting the entry meanwhile (then the reader takes the ordinary way).
template <class E, class F>
bool stable_read(const E& e, F read) {
  const uint32_t s1 = e.seq.load(std::memory_order_seq_cst);
  read();
  std::atomic_thread_fence(std::memory_order_acquire);
  return !(s1 & 1) && e.seq.load(std::memory_order_relaxed) == s1;
}

}  // namespace

size_t AccessTable::file_bytes() { return kFileBytes; }

std::expected<std::unique_ptr<AccessTable>, int> AccessTable::create(const std::string& path, int pid,
                                                                     uint64_t start_time, uint64_t pidns) {
  std::unique_ptr<AccessTable> t(new (std::nothrow) AccessTable());
  if (!t) return std::unexpected(ENOMEM);
  unlink(path.c_str());
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return std::unexpected(errno);
  t->path_ = path;
  t->fd_ = fd;  // the destructor closes and unlinks from here on
  if (flock(fd, LOCK_SH) != 0 || ftruncate(fd, static_cast<off_t>(kFileBytes)) != 0)
    return std::unexpected(errno);
  if (int err = posix_fallocate(fd, 0, static_cast<off_t>(kFileBytes))) return std::unexpected(err);
  void* map = mmap(nullptr, kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return std::unexpected(errno);
  t->map_ = map;
  t->len_ = kFileBytes;
  auto* h = static_cast<AccessHeader*>(map);
  h->version = kAccessVersion;
  h->mr_slots = kMrSlots;
  h->qp_slots = kQpSlots;
  h->pid = pid;
  h->start_time = start_time;
  h->pidns = pidns;
  std::atomic_thread_fence(std::memory_order_release);
  reinterpret_cast<std::atomic<uint64_t>*>(&h->magic)->store(kAccessMagic, std::memory_order_release);
  return t;
}

AccessTable::~AccessTable() {
  if (map_) munmap(map_, len_);
  if (fd_ >= 0) {
    unlink(path_.c_str());
    close(fd_);
  }
}

void AccessTable::publish_mr(const MrInfo& m, const SharedPages* pages) {
  const SharedPages none;
  const SharedPages& sp = pages ? *pages : none;
  if (sp.id != 0) static_cast<AccessHeader*>(map_)->any_shared.store(1, std::memory_order_release);
  SharedMr* t = mrs(map_);
  for (uint32_t s = mr_slot(m.key), n = 0; n < kMaxProbe; s = (s + 1) & (kMrSlots - 1), ++n) {
    SharedMr& e = t[s];
    if (e.state.load(std::memory_order_relaxed) == 1) continue;
    begin_write(e);
    e.key.store(m.key, std::memory_order_relaxed);
    e.access.store(m.access, std::memory_order_relaxed);
    e.pd.store(m.pd, std::memory_order_relaxed);
    e.iova.store(m.iova, std::memory_order_relaxed);
    e.length.store(m.length, std::memory_order_relaxed);
    e.addr.store(m.addr, std::memory_order_relaxed);
    e.share_id.store(sp.id, std::memory_order_relaxed);
    e.share_ino.store(sp.ino, std::memory_order_relaxed);
    e.share_off.store(sp.file_off, std::memory_order_relaxed);
    e.share_addr.store(sp.addr, std::memory_order_relaxed);
    e.share_len.store(sp.len, std::memory_order_relaxed);
    e.share_fd.store(sp.fd, std::memory_order_relaxed);
    e.state.store(1, std::memory_order_relaxed);
    end_write(e);
    return;
  }
  // No room near its slot: peers cannot find this MR, so they use the ordinary path for it.
}

void AccessTable::withdraw_mr(uint32_t key) {
  SharedMr* t = mrs(map_);
  for (uint32_t s = mr_slot(key), n = 0; n < kMaxProbe; s = (s + 1) & (kMrSlots - 1), ++n) {
    SharedMr& e = t[s];
    const uint32_t st = e.state.load(std::memory_order_relaxed);
    if (st == 0) return;
    if (st != 1 || e.key.load(std::memory_order_relaxed) != key) continue;
    begin_write(e);
    e.state.store(2, std::memory_order_seq_cst);
    end_write(e);
    // Readers announce themselves in `inflight` before they re-check the entry: once the count is zero, no
    // one can still copy into or out of the region.
    const uint64_t deadline = monotonic_ns() + kDeregWaitNs;
    while (e.inflight.load(std::memory_order_seq_cst) != 0 && monotonic_ns() < deadline)
      std::this_thread::yield();
    return;
  }
}

std::atomic<uint32_t>* AccessTable::publish_qp(const QpInfo& q) {
  SharedQp& e = qps(map_)[q.qpn & (kQpSlots - 1)];
  const uint32_t cur = e.qpn.load(std::memory_order_relaxed);
  if (cur != 0 && cur != q.qpn && e.open.load(std::memory_order_relaxed)) return nullptr;  // taken
  begin_write(e);
  e.qpn.store(q.open ? q.qpn : 0, std::memory_order_relaxed);
  e.open.store(q.open ? 1 : 0, std::memory_order_relaxed);
  e.access.store(q.access, std::memory_order_relaxed);
  e.pd.store(q.pd, std::memory_order_relaxed);
  e.dest_qpn.store(q.dest_qpn, std::memory_order_relaxed);
  e.uc.store(q.uc ? 1 : 0, std::memory_order_relaxed);
  e.psn_seen.store(kNoPsn, std::memory_order_relaxed);
  end_write(e);
  return q.open && q.uc ? &e.psn_seen : nullptr;
}

namespace {

// Copies between the local segments and `remote` (READ: into the segments).
void copy_segs(const DirectOp& op, uint8_t* remote) {
  for (uint32_t i = 0; i < op.nseg; ++i) {
    auto* local = static_cast<uint8_t*>(op.segs[i].addr);
    if (op.read)
      std::memcpy(local, remote, op.segs[i].len);
    else
      std::memcpy(remote, local, op.segs[i].len);
    remote += op.segs[i].len;
  }
}

// An ATOMIC on the shared target, as the responder runs it (responder.cc, atomic_request).
void run_atomic(const DirectOp& op, uint8_t* target) {
  auto* t = reinterpret_cast<uint64_t*>(target);
  uint64_t orig = op.compare_add;
  if (op.cas)
    __atomic_compare_exchange_n(t, &orig, op.swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  else
    orig = __atomic_fetch_add(t, op.compare_add, __ATOMIC_SEQ_CST);
  DirectOp into = op;
  into.read = true;
  copy_segs(into, reinterpret_cast<uint8_t*>(&orig));
}

}  // namespace

int AccessTable::direct(void* map, size_t len, int pid, const DirectOp& op, PeerMaps* maps,
                        CopyHelper* helper) {
  if (!map || len < kFileBytes || op.length == 0 || op.nseg == 0 || op.nseg > 32) return -1;
  const auto* h = static_cast<const AccessHeader*>(map);
  if (reinterpret_cast<const std::atomic<uint64_t>*>(&h->magic)->load(std::memory_order_acquire) !=
          kAccessMagic ||
      h->version != kAccessVersion || h->pid != pid)
    return -1;
  // No MR of the peer's has pages to map: a WRITE that takes its ring otherwise goes there at once (a
  // same-host ping-pong's, 70-100 TSC cycles of its turnaround in the lookups below).
  if (op.shared_only && h->any_shared.load(std::memory_order_acquire) == 0) return -1;
  const uint32_t need = op.atomic ? kAccRemoteAtomic : op.read ? kAccRemoteRead : kAccRemoteWrite;
  if (op.atomic && (op.length != 8 || (op.va & 7) != 0)) return -1;  // its responder NAKs it

  // The QP, as its responder would check it.
  const SharedQp& q = qps(map)[op.dest_qpn & (kQpSlots - 1)];
  QpInfo qi;
  if (!stable_read(q, [&] {
        qi = {ld(q.qpn), ld(q.access), ld(q.pd), ld(q.dest_qpn), ld(q.open) != 0, ld(q.uc) != 0};
      }))
    return -1;
  if (qi.qpn != op.dest_qpn || !qi.open || qi.dest_qpn != op.src_qpn || !(qi.access & need) || qi.uc != op.uc)
    return -1;
  // UC: only once the responder took every packet the QP sent before (DirectOp::uc); the acquire pairs with
  // its store after the data of the last of them was placed.
  if (op.uc &&
      (op.read || op.atomic || (op.uc_sent && q.psn_seen.load(std::memory_order_acquire) != op.uc_psn)))
    return -1;

  // The MR.
  SharedMr* t = mrs(map);
  for (uint32_t s = mr_slot(op.rkey), n = 0; n < kMaxProbe; s = (s + 1) & (kMrSlots - 1), ++n) {
    SharedMr& e = t[s];
    const uint32_t st = e.state.load(std::memory_order_acquire);
    if (st == 0) return -1;
    if (st != 1 || e.key.load(std::memory_order_relaxed) != op.rkey) continue;
    e.inflight.fetch_add(1, std::memory_order_seq_cst);
    int rc = -1;
    MrInfo m;
    SharedPages sp;
    uint32_t state = 0;
    const bool stable = stable_read(e, [&] {
      m = {ld(e.key), ld(e.access), ld(e.pd), ld(e.iova), ld(e.length), ld(e.addr)};
      sp = {ld(e.share_id),  ld(e.share_fd),   ld(e.share_ino),
            ld(e.share_off), ld(e.share_addr), ld(e.share_len)};
      state = ld(e.state);
    });
    const uint64_t iova = m.iova, length = m.length, addr = m.addr;
    if (stable && state == 1 && m.key == op.rkey && m.pd == qi.pd && (m.access & need) && op.va >= iova &&
        op.va - iova <= length && op.length <= length - (op.va - iova)) {
      iovec local[32];
      uint64_t total = 0;
      for (uint32_t i = 0; i < op.nseg; ++i) {
        local[i] = {op.segs[i].addr, op.segs[i].len};
        total += op.segs[i].len;
      }
      const uint64_t at = addr + (op.va - iova);
      iovec remote{reinterpret_cast<void*>(at), op.length};
      uint32_t slot = 0;
      uint8_t* base = nullptr;
      if (total != op.length || (op.atomic && (at & 7) != 0)) {
        // a malformed op: the ordinary way
      } else if (maps && sp.id != 0 && at >= sp.addr && at - sp.addr <= sp.len &&
                 op.length <= sp.len - (at - sp.addr) && (base = maps->acquire(sp, &slot)) != nullptr) {
        uint8_t* target = base + sp.file_off + (at - sp.addr);
        if (op.atomic)
          run_atomic(op, target);
        else
          copy_segs(op, target);
        maps->release(slot);
        rc = 1;
      } else if (!op.shared_only && !op.atomic) {  // (process_vm_* cannot run an atomic)
        if (maps && op.nseg == 1 && op.length <= kMemFileMax) {
          if (const int fd = maps->acquire_mem(); fd >= 0) {
            const auto off = static_cast<off_t>(at);
            const ssize_t r = op.read ? sys_pread(fd, local[0].iov_base, op.length, off)
                                      : sys_pwrite(fd, local[0].iov_base, op.length, off);
            maps->release_mem();
            if (r == static_cast<ssize_t>(op.length)) rc = 2;
          }
        }
        if (rc != 2) {
          auto refused = [](ssize_t r, int err) {
            return r < 0 && (err == EPERM || err == ENOSYS || err == ESRCH);
          };
          bool own_tables = false;
          const size_t half = split_point(at, op.length, &own_tables);  // the helper's part
          auto* const data = static_cast<uint8_t*>(local[0].iov_base);
          if (helper && op.nseg == 1 && op.length >= CopyHelper::kSplitMin &&
              helper->post(pid, op.read, {data, half}, {reinterpret_cast<void*>(at), half}, !own_tables)) {
            // Two halves at once (copy_helper.h): the first on the helper thread, the second here but for
            // its last bytes, which go once both halves are in. An application that polls the last byte
            // of a WRITE's target (ib_write_lat does; NICs and rxe place a message's bytes in order) then
            // finds the rest there when it sees that byte change.
            const size_t body = op.length - half - kLastBytes;
            const iovec lb{data + half, body}, rb{reinterpret_cast<void*>(at + half), body};
            const ssize_t r1 = vm_copy_part(pid, op.read, lb, rb, !own_tables);
            const int err1 = errno;
            int err2 = 0;
            const ssize_t r2 = helper->finish(&err2);
            ssize_t r3 = -1;
            int err3 = 0;
            if (r1 == static_cast<ssize_t>(body) && r2 == static_cast<ssize_t>(half)) {
              const iovec lt{data + op.length - kLastBytes, kLastBytes};
              const iovec rt{reinterpret_cast<void*>(at + op.length - kLastBytes), kLastBytes};
              r3 = vm_copy(pid, op.read, &lt, 1, rt);
              err3 = errno;
            }
            if (r3 == static_cast<ssize_t>(kLastBytes))
              rc = 3;
            else if (refused(r1, err1) || refused(r2, err2) || refused(r3, err3))
              rc = -2;
          } else {
            const ssize_t r = vm_copy(pid, op.read, local, op.nseg, remote);
            if (r == static_cast<ssize_t>(op.length))
              rc = 0;
            else if (refused(r, errno))
              rc = -2;
          }
        }
      }
    }
    e.inflight.fetch_sub(1, std::memory_order_seq_cst);
    return rc;
  }
  return -1;
}

}  // namespace softrdma::io::shm
