#include "io/shm/shm_io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "io/clock.h"
#include "io/env.h"
#include "io/proc.h"
#include "io/shm/access_table.h"
#include "io/shm/peer_maps.h"
#include "io/sys.h"
#include "wire/headers.h"
#include "wire/opcode.h"

namespace softrdma::io {

using shm::PortHeader;
using shm::Ring;
using shm::RingEntry;
using shm::Slot;

namespace {

uint64_t coarse_now_ns() { return monotonic_ns(CLOCK_MONOTONIC_COARSE); }

// Two words and the port, each multiplied by an odd constant, mixed once more and folded: its low bits
// (the slot) then depend on every byte. (Byte by byte, FNV-1a was 100 instructions of each same-host
// WRITE.)
uint32_t hash_endpoint(const wire::Endpoint& ep) {
  uint64_t lo, hi;
  std::memcpy(&lo, ep.addr.raw.data(), 8);
  std::memcpy(&hi, ep.addr.raw.data() + 8, 8);
  uint64_t h = (lo * 0x9E3779B97F4A7C15ull) ^ (hi * 0xC2B2AE3D27D4EB4Full) ^ ep.port;
  h *= 0xFF51AFD7ED558CCDull;
  return static_cast<uint32_t>(h ^ (h >> 32));
}

// Maps a ring's pages in one call (Linux 5.14+; older kernels fault them in one by one as they are used): a
// ring of 2048 slots otherwise costs 2048 page faults on each side when first used, about 5 ms that
// showed in short transfers (ib_write_bw -n 32 at 1 MiB: 2.3 GB/s with them, 3.5 over UDP).
void populate(uint8_t* addr, size_t len) { (void)madvise(addr, len, MADV_POPULATE_WRITE); }

// The receiver's warm-up of a ring of `bytes` (its stride in the port file): page tables filled, then
// every slot's page written once and every bulk page read (Ring::touch).
void warm_up(Ring ring, size_t bytes) {
  populate(ring.mem(), bytes);
  ring.touch(page_bytes());
}

bool valid_slots(uint32_t n) { return n >= 2 && n <= (1u << 20) && (n & (n - 1)) == 0; }

// A header of a port file, checked before anything else in it is believed.
bool header_ok(const PortHeader* h, size_t file_size) {
  if (h->magic != shm::kPortMagic) return false;
  std::atomic_thread_fence(std::memory_order_acquire);
  return h->version == shm::kVersion && h->max_rings == shm::kMaxRings &&
         h->slot_bytes == shm::kSlotAndBulkBytes && valid_slots(h->nslots) &&
         h->rings_offset == shm::kPortHeaderBytes && h->ring_stride == shm::ring_stride(h->nslots) &&
         file_size == shm::port_file_bytes(h->nslots);
}

}  // namespace

struct ShmIo::OwnPort {
  struct RxRing {
    Ring ring;
    uint32_t epoch = 0;
    std::atomic<bool> active{false};
    std::atomic<bool> untouched{false};  // touch_rings has not warmed its pages up yet
    bool prewarmed = false;              // warmed up when the port opened (prewarm_first_ring)
    std::atomic<uint64_t> head{0};       // next position to read (read by arm_wakeup from another thread)
    uint64_t released = 0;               // positions below this are given back to the producers
    uint32_t part = 0;                   // packets of the slot at `head` already handed out
    wire::Gid src;                       // its sender's address (RingEntry::owner_addr, read at each claim)
  };
  uint16_t port = 0;
  std::atomic<bool> open{false};
  int fd = -1;
  ino_t ino = 0;
  uint8_t* map = nullptr;
  size_t map_len = 0;
  PortHeader* hdr = nullptr;
  std::string path;
  std::atomic<uint64_t> seen_gen{~0ull};
  std::atomic<bool> closing_pending{false};
  uint32_t rr = 0;  // the ring read first, round robin
  RxRing rx[shm::kMaxRings];
  // Bit i: rx[i].active, as the receive path (one caller at a time) keeps it. Its loops visit these rings
  // only: looking at all 32 for the one a ping-pong reads, an empty poll of the rings took 194 TSC cycles
  // (rdtsc around rx_rings, same-host 8-byte ib_write_lat), against 26-50 so.
  uint32_t active_mask = 0;
  static_assert(shm::kMaxRings == 32, "a mask of 32 bits");
};

struct ShmIo::Peer {
  wire::Endpoint ep;
  std::string path;
  ino_t ino = 0;
  uint8_t* map = nullptr;
  size_t map_len = 0;
  PortHeader* hdr = nullptr;
  uint32_t index = 0;  // of the claimed ring
  uint32_t epoch = 0;
  Ring ring;
  std::atomic<uint64_t> stalled_until{0};  // CLOCK_MONOTONIC ns: until then a full ring drops at once
  // Its context's access table (the one-sided path): 0 not looked at yet, 1 mapped, -1 none or unusable.
  std::atomic<int> acc_state{0};
  void* acc_map = nullptr;
  size_t acc_len = 0;
  std::unique_ptr<shm::PeerMaps> maps;  // its shared pages mapped here (with acc_map)
};

struct ShmIo::PeerSlot {
  std::atomic<bool> used{false};
  wire::Endpoint key;
  std::atomic<Peer*> peer{nullptr};  // null: over UDP
  std::atomic<uint64_t> check_at{0};
};

bool ShmIo::direct_by_env() { return env_switch_on(kDirectEnv); }

std::string ShmIo::access_path(int pid, uint32_t serial) const {
  return cfg_.dir + "/" + kFilePrefix + std::to_string(netns_) + ".acc." + std::to_string(pid) + "." +
         std::to_string(serial);
}

shm::AccessTable* ShmIo::access_table() {
  if (!access_ && access_serial_ != 0 && !access_failed_) {
    if (auto t = shm::AccessTable::create(access_path(pid_, access_serial_), pid_, start_time_, pidns_))
      access_ = std::move(*t);
    else
      access_failed_ = true;  // peers find no file and use the rings
  }
  return access_.get();
}

void ShmIo::publish_mr(const MrInfo& mr) {
  {
    std::lock_guard lock(acc_mu_);
    shm::AccessTable* t = access_table();
    if (t != nullptr) {
      std::optional<shm::SharedPages> pages;
      if (share_mr_ && (mr.access & (shm::kAccRemoteWrite | shm::kAccRemoteRead | shm::kAccRemoteAtomic)))
        pages = shm::share_pages(reinterpret_cast<const void*>(mr.addr), mr.length);
      if (pages) shared_.emplace_back(mr.key, *pages);
      t->publish_mr(mr, pages ? &*pages : nullptr);
    }
  }
  // After share_pages, which may have put other pages under the MR; outside the lock (it takes a while).
  udp_->publish_mr(mr);
}
void ShmIo::withdraw_mr(uint32_t key) {
  std::lock_guard lock(acc_mu_);
  if (access_) access_->withdraw_mr(key);
}
void ShmIo::forget_mr(uint32_t key) {
  std::lock_guard lock(acc_mu_);
  for (size_t i = 0; i < shared_.size(); ++i) {
    if (shared_[i].first != key) continue;
    shm::unshare_pages(shared_[i].second);
    shared_.erase(shared_.begin() + static_cast<std::ptrdiff_t>(i));
    return;
  }
}
std::atomic<uint32_t>* ShmIo::publish_qp(const QpInfo& qp) {
  std::lock_guard lock(acc_mu_);
  shm::AccessTable* t = qp.open ? access_table() : access_.get();
  return t ? t->publish_qp(qp) : nullptr;
}

int ShmIo::direct(const wire::Endpoint& dst, const DirectOp& op) {
  if (access_serial_ == 0) return -1;  // off in this process (SOFTRDMA_DIRECT=0, fault injection)
  Peer* p = lookup(dst, coarse_now_ns());
  if (p == nullptr) return -1;
  int st = p->acc_state.load(std::memory_order_acquire);
  if (st == 0) st = open_access(*p);
  if (st < 0) return -1;
  const int rc =
      shm::AccessTable::direct(p->acc_map, p->acc_len, p->hdr->pid, op, p->maps.get(), &copy_helper_);
  if (rc == -2) p->acc_state.store(-1, std::memory_order_release);  // not permitted, or the peer is gone
  if (rc >= 0) {
    counters_->add(Counter::direct_ops);
    counters_->add(Counter::direct_bytes, op.length);
    if (rc == 1) counters_->add(Counter::direct_shared_ops);
    if (rc == 2) counters_->add(Counter::direct_mem_file_ops);
    if (rc == 3) counters_->add(Counter::direct_split_ops);
  }
  return rc == 1 ? 1 : rc >= 0 ? 0 : -1;
}

// Maps the access table a peer's port file names, once (control path).
int ShmIo::open_access(Peer& p) {
  std::lock_guard lock(ctl_mu_);
  int st = p.acc_state.load(std::memory_order_relaxed);
  if (st != 0) return st;
  st = -1;
  const uint32_t serial = p.hdr->access_serial;
  // A pid is only meaningful in our own pid namespace.
  if (serial != 0 && p.hdr->pidns == pidns_) {
    const int fd = open(access_path(p.hdr->pid, serial).c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    struct stat sb;
    if (fd >= 0 && fstat(fd, &sb) == 0 && static_cast<size_t>(sb.st_size) == shm::AccessTable::file_bytes()) {
      void* map = mmap(nullptr, sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (map != MAP_FAILED) {
        const auto* h = static_cast<const shm::AccessHeader*>(map);
        std::atomic_thread_fence(std::memory_order_acquire);
        if (h->magic == shm::kAccessMagic && h->pid == p.hdr->pid && h->start_time == p.hdr->start_time) {
          p.acc_map = map;
          p.acc_len = sb.st_size;
          p.maps.reset(new (std::nothrow) shm::PeerMaps(p.hdr->pid));  // none: process_vm_* only
          st = 1;
        } else {
          munmap(map, sb.st_size);
        }
      }
    }
    if (fd >= 0) close(fd);
  }
  p.acc_state.store(st, std::memory_order_release);
  return st;
}

bool ShmIo::enabled_by_env() { return env_switch_on(kEnv); }

ShmIo::ShmIo(std::unique_ptr<UdpIo> udp, Counters* counters, const Config& cfg)
    : udp_(std::move(udp)), counters_(counters != nullptr ? counters : &own_counters_), cfg_(cfg) {}

std::expected<std::unique_ptr<ShmIo>, int> ShmIo::create(std::unique_ptr<UdpIo> udp, Counters* counters,
                                                         const Config& cfg) {
  if (!udp || !valid_slots(cfg.ring_slots)) return std::unexpected(EINVAL);
  Config c = cfg;
  c.stream = (c.stream || env_opt_in(kStreamEnv)) && shm::kCanStream;
  struct stat st;
  if (stat(cfg.dir.c_str(), &st) != 0) return std::unexpected(errno);
  std::unique_ptr<ShmIo> io(new (std::nothrow) ShmIo(std::move(udp), counters, c));
  if (!io) return std::unexpected(ENOMEM);
  io->netns_ = cfg.netns != 0 ? cfg.netns : namespace_inode("net");
  if (io->netns_ == 0) return std::unexpected(ENOTSUP);  // no way to keep namespaces apart
  io->pidns_ = namespace_inode("pid");
  io->pid_ = getpid();
  io->start_time_ = proc_start_time(io->pid_);
  io->own_.reset(new (std::nothrow) OwnPort[kMaxOwnPorts]);
  io->peers_.reset(new (std::nothrow) PeerSlot[kPeerSlots]);
  if (!io->own_ || !io->peers_) return std::unexpected(ENOMEM);
  auto faults = RxFaults::from_env(io->counters_);
  if (!faults) return std::unexpected(faults.error());
  io->faults_ = std::move(*faults);
  if (io->faults_) {
    if (int err = io->udp_->add_poll_fd(io->faults_->timer_fd())) return std::unexpected(err);
  }
  collect_garbage(cfg.dir);
  // The one-sided path: not under fault injection (its operations send no packet to lose), and not where
  // the table cannot be made (then everything goes through the rings, as before it existed).
  // The file is made when the first MR or QP is published (a context with neither needs none).
  if (direct_by_env() && !io->faults_) {
    static std::atomic<uint32_t> serial{0};
    io->access_serial_ = serial.fetch_add(1, std::memory_order_relaxed) + 1;
    io->share_mr_ = shm::share_mr_by_env();
  }
  return io;
}

ShmIo::~ShmIo() {
  for (auto& [key, pages] : shared_) shm::unshare_pages(pages);  // MRs never deregistered
  if (faults_) udp_->remove_poll_fd(faults_->timer_fd());
  for (auto& p : all_peers_) {
    give_back(*p);
    munmap(p->map, p->map_len);
    if (p->acc_map != nullptr) munmap(p->acc_map, p->acc_len);
  }
  for (uint32_t i = 0, n = n_own_.load(); i < n; ++i) {
    OwnPort& o = own_[i];
    if (o.open.load()) close_port(o.port);
    if (o.map != nullptr) munmap(o.map, o.map_len);
    if (o.fd >= 0) close(o.fd);
  }
}

std::string ShmIo::port_path(const wire::Endpoint& ep) const {
  char name[128];
  int n = std::snprintf(name, sizeof name, "%s%llu.", kFilePrefix, static_cast<unsigned long long>(netns_));
  for (uint8_t b : ep.addr.raw) n += std::snprintf(name + n, sizeof name - n, "%02x", b);
  std::snprintf(name + n, sizeof name - n, ".%u", unsigned{ep.port});
  return cfg_.dir + "/" + name;
}

int ShmIo::collect_garbage(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return 0;
  int removed = 0;
  const std::string_view prefix(kFilePrefix);
  while (dirent* e = readdir(d)) {
    const std::string_view name(e->d_name);
    if (!name.starts_with(prefix)) continue;
    const std::string path = dir + "/" + std::string(name);
    if (const size_t t = name.find(".tmp."); t != std::string_view::npos) {
      // A file being created: its creator's pid follows.
      if (!process_alive(std::atoi(std::string(name.substr(t + 5)).c_str()), 0) && unlink(path.c_str()) == 0)
        ++removed;
      continue;
    }
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    struct stat a, b;
    // Nobody holds its lock: the process that published it is gone. Unlink it unless it was replaced.
    if (flock(fd, LOCK_EX | LOCK_NB) == 0 && fstat(fd, &a) == 0 && stat(path.c_str(), &b) == 0 &&
        a.st_ino == b.st_ino && unlink(path.c_str()) == 0)
      ++removed;
    close(fd);
  }
  closedir(d);
  return removed;
}

// ---- Publishing ports ----

std::expected<uint16_t, int> ShmIo::open_port(uint16_t port) {
  auto p = udp_->open_port(port);
  if (!p) return p;
  std::lock_guard lock(ctl_mu_);
  const uint32_t n = n_own_.load(std::memory_order_relaxed);
  if (n == kMaxOwnPorts) return p;  // over UDP only
  OwnPort& o = own_[n];
  o.port = *p;
  if (publish(o) != 0) return p;  // nothing published (publish undid its steps): the slot stays free
  o.open.store(true, std::memory_order_release);
  n_own_.store(n + 1, std::memory_order_release);
  return p;
}

// Creates the port file under a temporary name, locks, sizes and initializes it, then renames it over the
// final name (replacing a dead process's file). 0 or errno; on failure nothing is left behind.
int ShmIo::publish(OwnPort& o) {
  o.path = port_path(wire::Endpoint{local_addr(), o.port});
  const std::string tmp = o.path + ".tmp." + std::to_string(pid_);
  unlink(tmp.c_str());
  const int fd = open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return errno;
  const size_t len = shm::port_file_bytes(cfg_.ring_slots);
  void* map = MAP_FAILED;
  struct stat st;
  auto fail = [&](int err) {
    if (map != MAP_FAILED) munmap(map, len);
    close(fd);
    unlink(tmp.c_str());
    return err;
  };
  if (flock(fd, LOCK_SH) != 0 || ftruncate(fd, static_cast<off_t>(len)) != 0 || fstat(fd, &st) != 0)
    return fail(errno);
  // The header is written at once (ring memory is allocated by the sender that claims a ring): with a
  // full /dev/shm a write to an unallocated page would be SIGBUS.
  if (int err = posix_fallocate(fd, 0, shm::kPortHeaderBytes)) return fail(err);
  map = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return fail(errno);
  auto* h = new (map) PortHeader{};
  h->version = shm::kVersion;
  h->max_rings = shm::kMaxRings;
  h->nslots = cfg_.ring_slots;
  h->slot_bytes = shm::kSlotAndBulkBytes;
  h->rings_offset = shm::kPortHeaderBytes;
  h->ring_stride = shm::ring_stride(cfg_.ring_slots);
  h->pid = pid_;
  h->start_time = start_time_;
  h->pidns = pidns_;
  h->access_serial = access_serial_;
  // Until its receiver says otherwise it may be asleep: it opened this port after it armed (or never will).
  h->sleeping.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = shm::kPortMagic;
  prewarm_first_ring(fd, o, static_cast<uint8_t*>(map), *h);
  if (rename(tmp.c_str(), o.path.c_str()) != 0) return fail(errno);
  o.fd = fd;
  o.ino = st.st_ino;
  o.map = static_cast<uint8_t*>(map);
  o.map_len = len;
  o.hdr = h;
  // Ring i is always at the same place: the views are made once (arm_wakeup reads them from another thread).
  for (uint32_t i = 0; i < shm::kMaxRings; ++i)
    o.rx[i].ring = Ring(o.map + h->rings_offset + size_t{i} * h->ring_stride, h->nslots);
  o.seen_gen.store(~0ull, std::memory_order_relaxed);
  return 0;
}

// Before the port file is visible (no sender can claim a ring yet): ring 0, the one the first sender
// claims, allocated and warmed up as touch_rings would warm it after its first packet. That pass is paid
// here, in the thread that opens the port (ibv_create_qp), not while packets flow: a process whose
// application does not poll (ib_atomic_lat's server) has only its progress thread to receive, and the
// pass (17-23 ms here) held the request that came meanwhile as long. Measured, same-host 8-byte
// ib_send_lat, 6 interleaved pairs of 5,000 iterations: average 2.90-4.86 -> 2.32-3.17 us, worst iteration
// 1.7-2.0 ms -> 49-383 us; ib_atomic_lat's worst 1.2-4.1 ms (12-31 ms in other runs) -> 0.15-0.34 ms.
// Only with room to spare: the ring is 8.5 MiB of /dev/shm whether or not a same-host peer comes, and a
// small /dev/shm (64 MiB in a container) is kept for the rings that peers do claim.
void ShmIo::prewarm_first_ring(int fd, OwnPort& o, uint8_t* map, const PortHeader& h) {
  struct statvfs vs;
  if (!cfg_.prewarm || fstatvfs(fd, &vs) != 0 ||
      uint64_t{vs.f_bavail} * vs.f_frsize < kPrewarmFreeRings * h.ring_stride)
    return;
  if (posix_fallocate(fd, static_cast<off_t>(h.rings_offset), static_cast<off_t>(h.ring_stride)) != 0) return;
  Ring ring(map + h.rings_offset, h.nslots);
  warm_up(ring, h.ring_stride);
  ring.touch_pages(h.ring_stride, page_bytes());  // and the pages touch() misses: no sender sees it yet
  o.rx[0].prewarmed = true;
  counters_->add(Counter::shm_rings_prewarmed);
}

// Senders see `closed` and go back to UDP; the mapping stays until the end (arm_wakeup may be reading it).
void ShmIo::close_port(uint16_t port) {
  {
    std::lock_guard lock(ctl_mu_);
    for (uint32_t i = 0, n = n_own_.load(std::memory_order_relaxed); i < n; ++i) {
      OwnPort& o = own_[i];
      if (o.port != port || !o.open.load(std::memory_order_relaxed)) continue;
      o.open.store(false, std::memory_order_release);
      o.hdr->closed.store(1, std::memory_order_release);
      struct stat st;
      if (stat(o.path.c_str(), &st) == 0 && st.st_ino == o.ino) unlink(o.path.c_str());
      break;
    }
  }
  udp_->close_port(port);
}

// ---- Receive ----

// The ring table changed: start reading newly claimed rings, stop reading given-back ones once drained.
void ShmIo::scan_entries(OwnPort& o, uint64_t gen) {
  o.seen_gen.store(gen, std::memory_order_relaxed);
  bool pending = false;
  for (uint32_t i = 0; i < shm::kMaxRings; ++i) {
    RingEntry& e = o.hdr->rings[i];
    OwnPort::RxRing& r = o.rx[i];
    const uint32_t st = e.state.load(std::memory_order_acquire);
    const bool active = r.active.load(std::memory_order_relaxed);
    if (st == RingEntry::kReady) {
      const uint32_t epoch = e.epoch.load(std::memory_order_acquire);
      if (!active || r.epoch != epoch) {
        // Warmed up once packets come (touch_rings), unless it was when the port opened. (Not populated
        // here, in the receive path: the populate of a ring took 1-3 ms, of one already filled about 1 ms,
        // and the first iteration of same-host ib_send_lat took 0.4-1.1 ms with it.)
        if (!active && !r.prewarmed) r.untouched.store(true, std::memory_order_relaxed);
        r.epoch = epoch;
        std::memcpy(r.src.raw.data(), e.owner_addr, sizeof e.owner_addr);  // written before the epoch
        r.head.store(0, std::memory_order_relaxed);
        r.part = 0;
        r.released = 0;
        r.active.store(true, std::memory_order_release);
        o.active_mask |= 1u << i;
      }
    } else if (st == RingEntry::kClosing) {
      if (active && r.ring.peek(r.head.load(std::memory_order_relaxed)) != nullptr) {
        pending = true;  // read what its sender sent before it left, then free it
        continue;
      }
      r.active.store(false, std::memory_order_release);
      o.active_mask &= ~(1u << i);
      uint32_t expected = RingEntry::kClosing;
      if (e.state.compare_exchange_strong(expected, RingEntry::kFree, std::memory_order_acq_rel))
        o.hdr->gen.fetch_add(1, std::memory_order_acq_rel);
    } else if (active) {
      r.active.store(false, std::memory_order_release);
      o.active_mask &= ~(1u << i);
    }
  }
  o.closing_pending.store(pending, std::memory_order_relaxed);
}

uint32_t ShmIo::rx_rings(RxPacket* out, uint32_t room, uint64_t now) {
  uint32_t got = 0;
  uint64_t bytes = 0, truncated = 0, corrupted = 0;
  const uint32_t n = n_own_.load(std::memory_order_acquire);
  for (uint32_t k = 0; k < n && got < room; ++k) {
    OwnPort& o = own_[k];
    if (!o.open.load(std::memory_order_acquire)) continue;
    // What the previous call handed out is given back first.
    for (uint32_t m = o.active_mask; m != 0; m &= m - 1) {
      OwnPort::RxRing& r = o.rx[std::countr_zero(m)];
      const uint64_t head = r.head.load(std::memory_order_relaxed);
      while (r.released != head) r.ring.release(r.released++);
    }
    const uint64_t gen = o.hdr->gen.load(std::memory_order_acquire);
    if (gen != o.seen_gen.load(std::memory_order_relaxed) ||
        o.closing_pending.load(std::memory_order_relaxed))
      scan_entries(o, gen);
    // The active rings from o.rr on (bit j of the rotated mask: ring o.rr + j).
    for (uint32_t m = std::rotr(o.active_mask, static_cast<int>(o.rr)); m != 0 && got < room; m &= m - 1) {
      OwnPort::RxRing& r = o.rx[(o.rr + static_cast<uint32_t>(std::countr_zero(m))) % shm::kMaxRings];
      uint64_t head = r.head.load(std::memory_order_relaxed);
      while (got < room) {
        Slot* s = r.ring.peek(head);
        if (s == nullptr) break;
        // Written by another process: read once, and checked.
        const uint32_t word = s->len;
        const uint32_t lens[2] = {word & shm::kLenMask, word >> 16 & shm::kLenMask};
        const uint32_t n = lens[1] != 0 ? 2 : 1;
        if (lens[0] < wire::kBthLen || lens[0] > shm::kSlotData ||
            (n == 2 && (lens[1] < wire::kBthLen || lens[0] + lens[1] > shm::kInlineData))) {
          ++truncated;
          ++head;
          r.part = 0;
          continue;
        }
        uint8_t* const first = r.ring.data(s, lens[0]);
        uint32_t k = r.part;  // packets of this slot handed out by an earlier call
        for (; k < n && got < room; ++k) {
          const uint32_t len = lens[k];
          RxPacket& p = out[got];
          p.src.addr = r.src;
          p.src.port = s->src_port;
          p.dst = wire::Endpoint{local_addr(), o.port};
          p.data = k == 0 ? first : first + lens[0];
          p.len = len;
          p.tos = s->tos;
          p.ttl = s->ttl;
          p.flags = (word >> 16 * k & shm::kLenAwaitsAck) != 0 ? kAwaitsAck : 0;
          bytes += len + wire::kIcrcLen;
          if (faults_) {
            // A flipped bit is what the ICRC check would catch on a socket: dropped as such. A slot holds no
            // ICRC, so the bit is one of the packet's `len` bytes: with the ICRC's 4 counted in, a flip could
            // land in the next slot, on its sequence word when the packet filled its slot, and that ring then
            // stopped for good (e2e.soak_corrupt hung about once in 20 runs under load, a producer spinning).
            if (faults_->maybe_corrupt(p.data, len)) {
              ++corrupted;
              continue;
            }
            if (faults_->on_packet(p, now) != RxFaults::Verdict::kDeliver) continue;
            ++got;
            got += faults_->after_deliver(p, out + got, room - got, now);
            continue;
          }
          ++got;
        }
        if (k < n) {  // the rest of the slot in the next call; the slot is given back once all of it went
          r.part = k;
          break;
        }
        r.part = 0;
        ++head;
      }
      if (head != r.head.load(std::memory_order_relaxed) && r.untouched.load(std::memory_order_relaxed))
        touch_pending_.store(true, std::memory_order_release);
      r.head.store(head, std::memory_order_relaxed);
    }
    o.rr = (o.rr + 1) % shm::kMaxRings;
  }
  if (got != 0) {
    counters_->add(Counter::rx_packets, got);
    counters_->add(Counter::rx_shm_packets, got);
    counters_->add(Counter::rx_bytes, bytes);
  }
  if (truncated != 0) counters_->add(Counter::drop_truncated, truncated);
  if (corrupted != 0) counters_->add(Counter::drop_bad_icrc, corrupted);
  return got;
}

uint32_t ShmIo::rx_burst(RxPacket* out, uint32_t max) {
  if (max == 0) return 0;
  uint32_t got = 0;
  uint64_t now = 0;
  if (faults_) got = faults_->begin_burst_now(out, max, &now);  // held packets that are due go first
  // While the rings carry packets, a caller that polls again and again reads the socket at most every
  // udp_gap_ns_: a receive call that finds nothing costs more than a look at every ring, and it stood
  // between each look (same-host 8-byte ib_send_lat: a recvmmsg per poll). The gap starts at 2 us and
  // doubles with each read that finds nothing, up to 64 us; a read that finds packets (another host's, or
  // a same-host peer's that went by UDP) sets it back to 2 us. A syscall costs about 1 us on the
  // project's VM: read every 2 us, the socket took a third of a same-host ping-pong's polling, and the
  // ring packet that came during a read waited for its end (8-byte ib_send_lat, 6 interleaved pairs of
  // 5,000 iterations: typical half round trip 1.27-1.36 us at 2 us, 0.87-0.91 at 50). Another host's
  // packet that comes after a quiet spell, while the rings are busy, wakes the progress thread, whose
  // epoll watches the sockets (its naps watch them too while the rings carry packets: nap): its
  // sockets_readable makes the next call read them, whoever makes it.
  const uint64_t t = monotonic_ns();
  rx_clock_ = t;
  const bool read_udp = faults_ != nullptr ||
                        t >= ring_packet_at_.load(std::memory_order_relaxed) + kRingsBusyNs ||
                        t - udp_read_at_ >= udp_gap_ns_ ||
                        (udp_readable_.load(std::memory_order_relaxed) &&
                         udp_readable_.exchange(false, std::memory_order_relaxed));
  bool udp_drained = true;
  if (read_udp) {
    udp_read_at_ = t;
    const uint32_t udp_got = udp_->rx_burst(out + got, max - got);
    got += udp_got;
    udp_gap_ns_ = udp_got != 0 ? kUdpPollGapNs : std::min(udp_gap_ns_ * 2, kUdpPollGapMaxNs);
    // A doorbell read by a thread other than the sleeper (an application thread polling its CQ) leaves the
    // sleeper asleep: its edge-triggered epoll drops the wake-up of a socket already read. Ask the senders
    // for the next one again (an extra doorbell at worst), then read the rings: whatever was published
    // before the flag is seen here, whatever after rings.
    if (udp_->take_doorbells() != 0 && armed_.load(std::memory_order_relaxed)) set_sleeping();
    udp_drained = udp_->rx_drained();
  }
  const uint32_t room = max - got;
  const uint32_t ring_got = rx_rings(out + got, room, now);
  got += ring_got;
  if (ring_got != 0) ring_packet_at_.store(t, std::memory_order_relaxed);
  drained_ = udp_drained && ring_got < room && faults_ == nullptr;  // every ring read to its end
  if (faults_) faults_->end_burst(now);
  return got;
}

void ShmIo::set_sleeping() {
  const uint32_t n = n_own_.load(std::memory_order_acquire);
  for (uint32_t k = 0; k < n; ++k)
    if (own_[k].open.load(std::memory_order_acquire))
      own_[k].hdr->sleeping.store(1, std::memory_order_seq_cst);
}

void ShmIo::touch_rings() {
  if (!touch_pending_.exchange(false, std::memory_order_acquire)) return;
  const uint32_t n = n_own_.load(std::memory_order_acquire);
  uint64_t warmed = 0;
  for (uint32_t k = 0; k < n; ++k) {
    OwnPort& o = own_[k];
    if (!o.open.load(std::memory_order_acquire)) continue;
    for (OwnPort::RxRing& r : o.rx) {
      // Only a ring that has carried a packet: one whose peer reaches this process one-sided only (a
      // same-host 1 MiB ib_write_bw) may never carry any, and the warm-up takes ~10 ms of a CPU per ring.
      if (!r.untouched.load(std::memory_order_relaxed) || r.head.load(std::memory_order_relaxed) == 0)
        continue;
      r.untouched.store(false, std::memory_order_relaxed);
      warm_up(r.ring, o.hdr->ring_stride);
      ++warmed;
    }
  }
  if (warmed != 0) counters_->add(Counter::shm_rings_warmed, warmed);
}

bool ShmIo::peer_behind(const wire::Endpoint& dst, uint64_t* mark) {
  Peer* p = lookup(dst, coarse_now_ns());
  if (p == nullptr || !p->ring.valid()) return false;
  const Ring& r = p->ring;
  const uint64_t tail = r.tail();
  if (tail == 0 || !r.readable(tail - 1)) return false;  // all read (or the last one not yet written)
  // The oldest unread position (the peer reads in order: the slots before it are read, the rest not).
  uint64_t lo = tail > r.size() ? tail - r.size() : 0, hi = tail - 1;
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (r.readable(mid))
      hi = mid;
    else
      lo = mid + 1;
  }
  if (*mark == lo + 1) return false;  // it read nothing since the last call
  *mark = lo + 1;                     // (0 stays "no call yet")
  return true;
}

bool ShmIo::rings_lately() const {
  const uint64_t at = ring_packet_at_.load(std::memory_order_relaxed);
  const uint64_t now = monotonic_ns();
  return at != 0 && (now <= at || now - at < kRingsLatelyNs);
}

void ShmIo::woke() {
  armed_.store(false, std::memory_order_relaxed);
  if (!rings_lately()) udp_->woke();
}

bool ShmIo::nap() {
  if (!rings_lately()) return udp_->nap();
  udp_->arm_wakeup();  // back in epoll, if an earlier nap or wake-up took them out
  return true;
}

bool ShmIo::arm_wakeup() {
  udp_->arm_wakeup();  // the sockets into epoll (false: UdpIo's epoll reports what is queued)
  armed_.store(true, std::memory_order_relaxed);
  set_sleeping();
  const uint32_t n = n_own_.load(std::memory_order_acquire);
  // A sender that published before it could see the flag rang no doorbell: look for its packet.
  for (uint32_t k = 0; k < n; ++k) {
    OwnPort& o = own_[k];
    if (!o.open.load(std::memory_order_acquire)) continue;
    if (o.hdr->gen.load(std::memory_order_seq_cst) != o.seen_gen.load(std::memory_order_relaxed) ||
        o.closing_pending.load(std::memory_order_relaxed))
      return true;
    for (OwnPort::RxRing& r : o.rx)
      if (r.active.load(std::memory_order_acquire) && r.ring.readable(r.head.load(std::memory_order_relaxed)))
        return true;
  }
  return false;
}

int ShmIo::app_wait_fds(pollfd* fds, int max) {
  if (faults_) return 0;
  const int n = udp_->app_wait_fds(fds, max);
  if (n <= 0) return n;
  return arm_wakeup() ? -1 : n;
}

// ---- Transmit ----

namespace {
// The bytes packet p takes in a ring (shm::slot_len), or 0 when a ring cannot carry it.
uint64_t ring_len(const TxPacket& p) {
  if (p.hdr_len < wire::kBthLen || p.hdr_len > kMaxHdr || p.n_iov > kMaxPayloadIov) return 0;
  const uint64_t len = shm::slot_len(p);
  return len <= shm::kSlotData ? len : 0;
}
}  // namespace

void ShmIo::tx_burst(std::span<TxPacket> pkts) { (void)send(pkts, false); }

size_t ShmIo::tx_burst_some(std::span<TxPacket> pkts) { return send(pkts, true); }

size_t ShmIo::send(std::span<TxPacket> pkts, bool partial) {
  const uint64_t now = coarse_now_ns();
  size_t run = 0;  // start of the packets not yet handed to UDP
  constexpr uint32_t kMaxWake = 8;
  Peer* to_wake[kMaxWake];
  uint16_t wake_port[kMaxWake];
  uint32_t n_wake = 0;
  uint64_t sent = 0, bytes = 0, full = 0, streamed = 0;
  int64_t wait_budget = kFullWaitNs;
  Peer* peer = nullptr;
  wire::Endpoint peer_ep;
  bool have_peer = false;
  for (size_t i = 0; i < pkts.size(); ++i) {
    TxPacket& p = pkts[i];
    if (!have_peer || !(p.dst == peer_ep)) {
      // A UD packet's destination that no QP prepared is claimed here, in its post (cold_bulk).
      peer = lookup(p.dst, now, p.hdr_len != 0 && wire::transport_of(p.hdr[0]) == wire::Transport::kUd);
      peer_ep = p.dst;
      have_peer = true;
    }
    const uint64_t len = peer != nullptr ? ring_len(p) : 0;
    if (len == 0) continue;  // UDP carries it (or drops and counts it)
    if (i > run) udp_->tx_burst(pkts.subspan(run, i - run));
    run = i + 1;
    uint64_t pos;
    Slot* s = peer->ring.claim(&pos);
    if (s == nullptr) s = claim_waiting(*peer, &pos, p.src.port, &wait_budget);
    if (s == nullptr) {
      ++full;
      continue;
    }
    if (shm::fill_slot(peer->ring, s, p, static_cast<uint32_t>(len), cfg_.stream && len >= kStreamMinBytes))
      ++streamed;
    ++sent;
    bytes += len + wire::kIcrcLen;
    if (i + 1 < pkts.size() && len <= shm::kInlineData) {
      const TxPacket& q = pkts[i + 1];
      const uint64_t qlen = q.dst == peer_ep && q.src.port == p.src.port ? ring_len(q) : 0;
      if (qlen != 0 && len + qlen <= shm::kInlineData) {
        shm::add_to_slot(s, q, static_cast<uint32_t>(len), static_cast<uint32_t>(qlen));
        ++sent;
        bytes += qlen + wire::kIcrcLen;
        run = ++i + 1;
      }
    }
    Ring::publish(s, pos);
    bool listed = false;
    for (uint32_t k = 0; k < n_wake && !listed; ++k) listed = to_wake[k] == peer;
    if (!listed) {
      if (n_wake == kMaxWake) {
        --n_wake;
        wake(*to_wake[n_wake], wake_port[n_wake]);
      }
      to_wake[n_wake] = peer;
      wake_port[n_wake++] = p.src.port;
    }
  }
  size_t done = pkts.size();
  if (run < pkts.size()) {
    if (partial)
      done = run + udp_->tx_burst_some(pkts.subspan(run));  // the UDP packets at the end: as UdpIo keeps them
    else
      udp_->tx_burst(pkts.subspan(run));
  }
  for (uint32_t k = 0; k < n_wake; ++k) wake(*to_wake[k], wake_port[k]);
  if (sent != 0) {
    counters_->add(Counter::tx_packets, sent);
    counters_->add(Counter::tx_shm_packets, sent);
    counters_->add(Counter::tx_bytes, bytes);
  }
  if (full != 0) counters_->add(Counter::drop_shm_ring_full, full);
  if (streamed != 0) counters_->add(Counter::tx_shm_streamed, streamed);
  return done;
}

// The ring is full: wake its receiver if it sleeps, and give it up to *budget (shared by one tx_burst) to
// make room, as the UDP backend waits for a full socket buffer; then the packet is dropped.
Slot* ShmIo::claim_waiting(Peer& peer, uint64_t* pos, uint16_t src_port, int64_t* budget) {
  if (*budget <= 0) return nullptr;
  const uint64_t now = monotonic_ns();
  if (now < peer.stalled_until.load(std::memory_order_relaxed)) return nullptr;  // a receiver that stopped
  wake(peer, src_port);
  for (uint32_t spins = 1;; ++spins) {
    if (spins < 64)
      __builtin_ia32_pause();
    else
      sched_yield();
    Slot* s = peer.ring.claim(pos);
    const auto spent = static_cast<int64_t>(monotonic_ns() - now);
    if (s != nullptr || spent >= *budget) {
      *budget -= spent;
      // A whole budget without room: the receiver is not reading (dead, or stopped). Drop at once for a
      // while, so that a sender to it does not wait at every burst.
      if (s == nullptr) peer.stalled_until.store(now + kStalledNs, std::memory_order_relaxed);
      return s;
    }
  }
}

// After publishing: a receiver that said it sleeps gets one doorbell (the first sender to clear the flag).
void ShmIo::wake(Peer& p, uint16_t src_port) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  std::atomic<uint32_t>& sleeping = p.hdr->sleeping;
  if (sleeping.load(std::memory_order_relaxed) == 0 || sleeping.exchange(0, std::memory_order_acq_rel) == 0)
    return;
  udp_->send_doorbell(src_port, p.ep);
  counters_->add(Counter::shm_doorbells);
}

bool ShmIo::reaches(const wire::Endpoint& dst) { return lookup(dst, coarse_now_ns()) != nullptr; }

void ShmIo::prepare_peer(const wire::Endpoint& dst) {
  const uint32_t h = hash_endpoint(dst);
  for (uint32_t probe = 0; probe < kPeerSlots; ++probe) {
    PeerSlot& s = peers_[(h + probe) % kPeerSlots];
    if (!s.used.load(std::memory_order_acquire)) break;
    if (s.key == dst) {
      s.check_at.store(0, std::memory_order_relaxed);  // the lookup below checks the file again
      break;
    }
  }
  lookup(dst, coarse_now_ns());
}

ShmIo::Peer* ShmIo::lookup(const wire::Endpoint& dst, uint64_t now, bool cold_bulk) {
  const uint32_t h = hash_endpoint(dst);
  for (uint32_t probe = 0; probe < kPeerSlots; ++probe) {
    PeerSlot& s = peers_[(h + probe) % kPeerSlots];
    if (!s.used.load(std::memory_order_acquire)) break;
    if (!(s.key == dst)) continue;
    Peer* p = s.peer.load(std::memory_order_acquire);
    if (now >= s.check_at.load(std::memory_order_relaxed) ||
        (p != nullptr && p->hdr->closed.load(std::memory_order_relaxed) != 0))
      return recheck(s, now);
    return p;
  }
  // A destination not seen before: look it up and remember the answer.
  std::lock_guard lock(ctl_mu_);
  for (uint32_t probe = 0; probe < kPeerSlots; ++probe) {
    PeerSlot& s = peers_[(h + probe) % kPeerSlots];
    if (s.used.load(std::memory_order_relaxed)) {
      if (s.key == dst) return s.peer.load(std::memory_order_relaxed);  // another thread was first
      continue;
    }
    Peer* p = open_peer(dst, cold_bulk);
    s.key = dst;
    s.peer.store(p, std::memory_order_relaxed);
    s.check_at.store(now + kRecheckNs, std::memory_order_relaxed);
    s.used.store(true, std::memory_order_release);
    return p;
  }
  return nullptr;  // the table is full: UDP
}

ShmIo::Peer* ShmIo::recheck(PeerSlot& s, uint64_t now) {
  std::lock_guard lock(ctl_mu_);
  Peer* p = s.peer.load(std::memory_order_relaxed);
  const bool closed = p != nullptr && p->hdr->closed.load(std::memory_order_relaxed) != 0;
  if (now < s.check_at.load(std::memory_order_relaxed) && !closed) return p;  // another thread just did
  s.check_at.store(now + kRecheckNs, std::memory_order_relaxed);
  if (p != nullptr && !closed && still_valid(*p)) return p;
  struct stat st;
  if (p == nullptr && stat(port_path(s.key).c_str(), &st) != 0) return nullptr;  // still nobody here
  if (p != nullptr) {
    give_back(*p);
    if (p->maps) p->maps->clear();  // its shared pages: the memfds need not outlive it here
  }
  Peer* np = open_peer(s.key);
  s.peer.store(np, std::memory_order_release);
  return np;
}

bool ShmIo::still_valid(const Peer& p) const {
  struct stat st;
  if (stat(p.path.c_str(), &st) != 0 || st.st_ino != p.ino) return false;  // gone or replaced
  const RingEntry& e = p.hdr->rings[p.index];
  return e.state.load(std::memory_order_acquire) == RingEntry::kReady &&
         e.epoch.load(std::memory_order_acquire) == p.epoch;
}

void ShmIo::give_back(Peer& p) {
  RingEntry& e = p.hdr->rings[p.index];
  if (e.epoch.load(std::memory_order_acquire) != p.epoch) return;  // no longer ours
  uint32_t expected = RingEntry::kReady;
  if (e.state.compare_exchange_strong(expected, RingEntry::kClosing, std::memory_order_acq_rel))
    p.hdr->gen.fetch_add(1, std::memory_order_acq_rel);
}

// Maps the port file of `dst` and claims a ring in it. Null (UDP) when there is none, it is not a live
// softrdma port, or it has no ring to spare. Under ctl_mu_.
ShmIo::Peer* ShmIo::open_peer(const wire::Endpoint& dst, bool cold_bulk) {
  const std::string path = port_path(dst);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return nullptr;
  struct stat st;
  void* map = MAP_FAILED;
  size_t len = 0;
  auto fail = [&]() -> Peer* {
    if (map != MAP_FAILED) munmap(map, len);
    close(fd);
    return nullptr;
  };
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < static_cast<off_t>(shm::kPortHeaderBytes))
    return fail();
  len = static_cast<size_t>(st.st_size);
  map = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return fail();
  auto* h = static_cast<PortHeader*>(map);
  if (!header_ok(h, len) || h->closed.load(std::memory_order_acquire) != 0) return fail();
  if (pidns_ != 0 && h->pidns == pidns_ && !process_alive(h->pid, h->start_time))
    return fail();  // a file a killed process left: its port gets nothing either way
  uint32_t index = shm::kMaxRings;
  for (uint32_t i = 0; i < shm::kMaxRings && index == shm::kMaxRings; ++i) {
    uint32_t expected = RingEntry::kFree;
    if (h->rings[i].state.compare_exchange_strong(expected, RingEntry::kClaimed, std::memory_order_acq_rel))
      index = i;
  }
  if (index == shm::kMaxRings) {
    // None free: take back the rings of senders that died (their receiver frees them), for a later try.
    for (RingEntry& e : h->rings) {
      if (e.state.load(std::memory_order_acquire) != RingEntry::kReady || e.owner_pidns != pidns_ ||
          process_alive(e.owner_pid, e.owner_start_time))
        continue;
      uint32_t expected = RingEntry::kReady;
      if (e.state.compare_exchange_strong(expected, RingEntry::kClosing, std::memory_order_acq_rel))
        h->gen.fetch_add(1, std::memory_order_acq_rel);
    }
    return fail();
  }
  RingEntry& e = h->rings[index];
  const off_t off = static_cast<off_t>(h->rings_offset + size_t{index} * h->ring_stride);
  // The ring's memory, allocated now so that no write to it can meet a full /dev/shm (SIGBUS).
  if (posix_fallocate(fd, off, static_cast<off_t>(h->ring_stride)) != 0) {
    e.state.store(RingEntry::kFree, std::memory_order_release);
    return fail();
  }
  auto* peer = new (std::nothrow) Peer;
  if (peer == nullptr) {
    e.state.store(RingEntry::kFree, std::memory_order_release);
    return fail();
  }
  peer->ep = dst;
  peer->path = path;
  peer->ino = st.st_ino;
  peer->map = static_cast<uint8_t*>(map);
  peer->map_len = len;
  peer->hdr = h;
  peer->index = index;
  peer->ring = Ring(peer->map + off, h->nslots);
  populate(peer->map + off, h->ring_stride);
  // The receiver reads it only once it is kReady. For a UD packet's destination (opened in its post, no
  // QP prepared it) only the slots' pages: the bulk pages' first writes are left to the packets that
  // fill them (about 14 us each on this VM, where the pass over all 2,176 took the first post 30 ms).
  peer->ring.touch_pages(cold_bulk ? peer->ring.slots_end() : h->ring_stride, page_bytes());
  if (cold_bulk) counters_->add(Counter::shm_rings_cold_bulk);
  peer->ring.init();
  e.owner_pid = pid_;
  e.owner_start_time = start_time_;
  e.owner_pidns = pidns_;
  std::memcpy(e.owner_addr, local_addr().raw.data(), sizeof e.owner_addr);
  peer->epoch = e.epoch.load(std::memory_order_relaxed) + 1;
  e.epoch.store(peer->epoch, std::memory_order_release);
  e.state.store(RingEntry::kReady, std::memory_order_release);
  h->gen.fetch_add(1, std::memory_order_acq_rel);
  close(fd);  // the mapping keeps the file
  all_peers_.emplace_back(peer);
  wake(*peer, 0);  // a sleeping receiver maps the new ring now, before the first packet comes
  return peer;
}

}  // namespace softrdma::io
