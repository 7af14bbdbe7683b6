#include "io/udp/udp_io.h"

#include <errno.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "io/clock.h"
#include "io/env.h"
#include "io/kernel_touch.h"
#include "io/netif.h"
#include "io/sys.h"
#include "wire/headers.h"
#include "wire/icrc.h"
#include "wire/opcode.h"

namespace softrdma::io {
namespace {

constexpr uint32_t kMinPacket = wire::kBthLen + wire::kIcrcLen;
// Largest UDP payload over IPv4 (65535 - 20 - 8); the IPv6 limit is larger but the same bound serves.
constexpr uint32_t kMaxUdpPayload = 65507;
constexpr uint8_t kZeros[4] = {};
// TOS/traffic class, TTL/hop limit and the GRO segment size, with room to spare.
constexpr size_t kRxCtrlLen = 3 * CMSG_SPACE(sizeof(int)) + 32;
// The socket's drop count is read (SO_MEMINFO) after a receive call that filled every message it asked
// for (two or more), after kDropCheckMulti other calls that returned several datagrams, and after
// kDropCheckEvery calls that returned data. Drops mean a full receive buffer. 32 MiB (SO_RCVBUFFORCE, as
// root) holds far more datagrams than a call asks for (kRxBatch), even GRO-coalesced ones of 64 KiB, so
// the call after an overflow fills its batch; a buffer capped by net.core.rmem_max (SO_RCVBUF, not root:
// 416 KiB by default) may hold only a few coalesced ones, whose drops the second rule counts. Read after
// every call that returned several datagrams, as it was, it was a getsockopt per burst of a stream: 7 per
// MiB of 1 MiB socket ib_write_bw beside 31 recvmmsg. Asked for with every datagram instead (SO_RXQ_OVFL,
// a control message), it cost each receive 0.15 us: 8-byte socket-path ib_write_lat, the receive call that
// returns the peer's packets 2.10-2.21 -> 1.94-2.05 us (timed with rdtsc around it, a temporary trace).
// Drops for other causes (a bad UDP checksum) show up within kDropCheckEvery calls. And at the end of a burst
// (a call that finds the socket empty after one that returned data) it is read if kDropCheckNs passed since
// the last such read: a buffer capped by rmem_max (416 KiB by default) holds only about six of a GSO
// sender's coalesced 64 KiB datagrams, so a burst that overruns it never fills a call's batch, and drops
// seen by no rule above went uncounted (socket ib_send_bw -c UD as a user: 1,000 packets sent, 179
// received, drop_socket_full 0). A coarse clock read per burst; the syscall at most every kDropCheckNs.
constexpr uint32_t kDropCheckMulti = 64;
constexpr uint32_t kDropCheckEvery = 1024;
constexpr uint64_t kDropCheckNs = 10'000'000;

union SockAddr {
  sockaddr sa;
  sockaddr_in v4;
  sockaddr_in6 v6;
};

// A receive message's room for the sender's address and the control messages, and no flags: as recvmmsg
// needs them, and as it leaves them only in the messages it did not fill.
void rearm_rx(msghdr& h) {
  h.msg_namelen = sizeof(SockAddr);
  h.msg_controllen = kRxCtrlLen;
  h.msg_flags = 0;
}

bool is_link_local6(const wire::Gid& g) { return g.raw[0] == 0xFE && (g.raw[1] & 0xC0) == 0x80; }

socklen_t to_sockaddr(const wire::Endpoint& ep, bool v4, uint32_t scope_id, SockAddr* out) {
  if (v4) {
    out->v4 = sockaddr_in{};
    out->v4.sin_family = AF_INET;
    out->v4.sin_port = htons(ep.port);
    out->v4.sin_addr.s_addr = ep.addr.v4_be();
    return sizeof(sockaddr_in);
  }
  out->v6 = sockaddr_in6{};
  out->v6.sin6_family = AF_INET6;
  out->v6.sin6_port = htons(ep.port);
  std::memcpy(&out->v6.sin6_addr, ep.addr.raw.data(), 16);
  if (is_link_local6(ep.addr)) out->v6.sin6_scope_id = scope_id;
  return sizeof(sockaddr_in6);
}

wire::Endpoint from_sockaddr(const SockAddr& a) {
  wire::Endpoint ep;
  if (a.sa.sa_family == AF_INET) {
    ep.addr = wire::Gid::from_v4(a.v4.sin_addr.s_addr);
    ep.port = ntohs(a.v4.sin_port);
  } else {
    std::memcpy(ep.addr.raw.data(), &a.v6.sin6_addr, 16);
    ep.port = ntohs(a.v6.sin6_port);
  }
  return ep;
}

void set_int_opt(int fd, int level, int name, int value) {
  // Best effort: every option here has a fallback or only adds information.
  (void)setsockopt(fd, level, name, &value, sizeof value);
}

void set_buffer(int fd, int force_opt, int opt, int bytes) {
  if (setsockopt(fd, SOL_SOCKET, force_opt, &bytes, sizeof bytes) == 0) return;
  (void)setsockopt(fd, SOL_SOCKET, opt, &bytes, sizeof bytes);
}

constexpr size_t kRxRingBytes = size_t{UdpIo::kRxBatch} * UdpIo::kRxBufSize;
static_assert((kRxRingBytes & (kRxRingBytes - 1)) == 0, "the ring is aligned to its own size");

// Maps a socket's receive ring and has it faulted in and read by the kernel now (io/kernel_touch.h), not
// by the first bursts it receives: on this VM the kernel's first write into each 4 KiB page of the ring
// cost a fault and its first access, some 4 ms over the 512 pages, paid by the first transfer (perftest's
// default 1,000 x 4 KiB ib_send_bw over sockets: 740-930 MiB/s on average against 4,300 at its peak). On
// a boundary of its size with MADV_HUGEPAGE it is one transparent huge page where those are enabled
// ("always" or "madvise"): about 0.5 ms here; in 4 KiB pages about 9 ms. Null with errno on failure.
uint8_t* map_rx_ring(int touch_fd) {
  void* m = mmap(nullptr, 2 * kRxRingBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  auto* const raw = static_cast<uint8_t*>(m);
  auto* const ring =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + kRxRingBytes - 1) & ~(kRxRingBytes - 1));
  if (ring != raw) munmap(raw, static_cast<size_t>(ring - raw));
  munmap(ring + kRxRingBytes, static_cast<size_t>(raw + kRxRingBytes - ring));
  (void)madvise(ring, kRxRingBytes, MADV_HUGEPAGE);  // EINVAL without transparent huge pages: 4 KiB ones
  std::memset(ring, 0, kRxRingBytes);
  if (touch_fd >= 0) (void)kernel_touch(touch_fd, ring, kRxRingBytes, kRxRingBytes);
  return ring;
}

}  // namespace

struct UdpIo::Socket {
  ~Socket() {
    if (bufs != nullptr) munmap(bufs, kRxRingBytes);
  }
  int fd = -1;
  uint16_t port = 0;
  // The last recvmmsg's messages not yet all handed out (a coalesced one holds many packets).
  uint32_t n_msgs = 0, next_msg = 0, next_off = 0;
  uint32_t filled = 0;  // messages the last recvmmsg filled (their lengths and flags need setting back)
  bool idle = false;    // the last recvmmsg found nothing
  bool in_epoll = false;  // registered in epfd_ (UdpIo::sync_epoll; under ctl_mu_)
  // The kernel's count of datagrams this socket dropped (full buffer, bad checksum), as last read.
  uint32_t overflows = 0;
  // Receive calls since the drop count was read: that returned data, and that returned several datagrams.
  uint32_t unchecked_reads = 0, unchecked_multi = 0;
  uint64_t burst_check_at = 0;      // CLOCK_MONOTONIC_COARSE of the last read at a burst's end
  uint8_t* bufs = nullptr;          // kRxBatch x kRxBufSize (map_rx_ring)
  mmsghdr msgs[kRxBatch];
  iovec iov[kRxBatch];
  SockAddr names[kRxBatch];
  alignas(cmsghdr) uint8_t ctrl[kRxBatch][kRxCtrlLen];
};

// What one sending thread builds for one sendmmsg: up to kTxChunk packets in up to kTxChunk messages (a
// message holds several packets under UDP GSO).
struct UdpIo::TxScratch {
  mmsghdr msgs[kTxChunk];
  iovec iov[kTxIov];  // per packet: header, payload pieces, pad + ICRC
  SockAddr names[kTxChunk];
  wire::Endpoint dst[kTxChunk];
  alignas(cmsghdr) uint8_t ctrl[kTxChunk][CMSG_SPACE(sizeof(uint16_t))];
  uint8_t trailer[kTxChunk][8];
  uint32_t len[kTxChunk];       // UDP payload bytes of each message
  uint32_t npkts[kTxChunk];     // packets in each message
  uint32_t seg_size[kTxChunk];  // the size of each packet but the last of a GSO message
  uint32_t first_pkt[kTxChunk];       // each message's first packet in pkt[]
  uint64_t dropped_before[kTxChunk];  // packets dropped before each message began
  struct {
    uint32_t index;  // in the burst
    uint16_t ip_id;  // its IPv4 ID: its place in its GSO message
  } pkt[kTxChunk];   // the packets of the chunk, in order, whose ICRCs go into trailer[]
  // The pieces of the packet whose ICRC is being computed. Here rather than on tx_burst's stack, where
  // constructing the 18 spans (std::span zeroes itself) cost 42 instructions a call.
  std::span<const uint8_t> segs[kMaxPayloadIov + 2];
};

// Where a sending thread lays out its chunk's messages whole (UdpIo::send): kTxStageBytes, allocated at the
// thread's first send (not in TxScratch, which every thread that makes verbs calls has: only the threads
// that send pay for it). Null if the allocation failed: messages then go in pieces. Freed when the thread
// ends, by a key's destructor rather than a thread_local one: those run before the process's exit
// handlers, and one of them sends (Context::flush_deferred_acks_at_exit), which found the stage freed.
namespace {
constinit thread_local uint8_t* tls_stage = nullptr;

void free_stage(void* p) {
  tls_stage = nullptr;
  ::operator delete[](p, std::align_val_t{64});
}

// Asks for a packet's payload to be brought into the cache: every line of each of its pieces.
// (Inlined always: a call of its own was removed, the compiler finding that a prefetch has no effect.)
[[gnu::always_inline]] inline void prefetch_payload(const TxPacket& p) {
  for (uint32_t q = 0; q < p.n_iov; ++q) {
    const auto base = reinterpret_cast<uintptr_t>(p.iov[q].iov_base);
    for (uintptr_t line = base & ~uintptr_t{63}; line < base + p.iov[q].iov_len; line += 64)
      __builtin_prefetch(reinterpret_cast<const void*>(line), 0, 3);
  }
}

uint8_t* tx_stage() {
  if (tls_stage != nullptr) [[likely]]
    return tls_stage;
  static const pthread_key_t key = [] {
    pthread_key_t k{};
    return pthread_key_create(&k, free_stage) == 0 ? k : pthread_key_t{~0u};
  }();
  if (key == pthread_key_t{~0u}) return nullptr;
  auto* bytes =
      static_cast<uint8_t*>(::operator new[](UdpIo::kTxStageBytes, std::align_val_t{64}, std::nothrow));
  if (bytes != nullptr && pthread_setspecific(key, bytes) != 0) {
    ::operator delete[](bytes, std::align_val_t{64});
    bytes = nullptr;
  }
  tls_stage = bytes;
  return bytes;
}
}  // namespace

UdpIo::UdpIo(const wire::Gid& local_addr, uint32_t scope_id, Counters* counters)
    : local_addr_(local_addr),
      v4_(local_addr.is_v4()),
      scope_id_(scope_id),
      counters_(counters != nullptr ? counters : &own_counters_) {}

UdpIo::~UdpIo() {
  for (auto& s : owned_) close(s->fd);
  if (epfd_ >= 0) close(epfd_);
  if (touch_fd_ >= 0) close(touch_fd_);
}

std::expected<std::unique_ptr<UdpIo>, int> UdpIo::create(const wire::Gid& local_addr, Counters* counters) {
  if (local_addr.is_zero()) return std::unexpected(EINVAL);
  uint32_t scope_id = 0;
  if (!local_addr.is_v4() && is_link_local6(local_addr)) {
    for (const auto& nif : list_interfaces()) {
      for (const auto& a : nif.ipv6) {
        if (a.addr == local_addr)
          scope_id = a.scope_id != 0 ? a.scope_id : static_cast<uint32_t>(nif.ifindex);
      }
    }
    if (scope_id == 0) return std::unexpected(EADDRNOTAVAIL);
  }
  std::unique_ptr<UdpIo> io(new (std::nothrow) UdpIo(local_addr, scope_id, counters));
  if (!io) return std::unexpected(ENOMEM);
  io->slots_.reset(new (std::nothrow) std::atomic<Socket*>[kMaxSockets]);
  if (!io->slots_) return std::unexpected(ENOMEM);
  for (size_t i = 0; i < kMaxSockets; ++i) io->slots_[i].store(nullptr, std::memory_order_relaxed);
  io->epfd_ = epoll_create1(EPOLL_CLOEXEC);
  if (io->epfd_ < 0) return std::unexpected(errno);
  io->gso_ = env_switch_on("SOFTRDMA_GSO");
  if (env_switch_on(kTouchEnv)) io->touch_fd_ = kernel_touch_sink();  // -1: no touch
  auto faults = RxFaults::from_env(io->counters_);
  if (!faults) return std::unexpected(faults.error());
  io->faults_ = std::move(*faults);
  if (io->faults_) {
    if (int err = io->add_poll_fd(io->faults_->timer_fd())) return std::unexpected(err);
  }
  return io;
}

int UdpIo::add_poll_fd(int fd) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;  // not a socket: rx_burst skips it (its owner acts in its own rx_burst)
  return epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0 ? errno : 0;
}

void UdpIo::remove_poll_fd(int fd) { epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr); }

void UdpIo::send_doorbell(uint16_t src_port, const wire::Endpoint& dst) {
  Socket* s = find_socket(src_port);
  if (s == nullptr) {
    const uint32_t n = nslots_.load(std::memory_order_acquire);
    for (uint32_t i = 0; i < n && s == nullptr; ++i) s = slots_[i].load(std::memory_order_acquire);
    if (s == nullptr) return;
  }
  SockAddr to;
  const socklen_t len = to_sockaddr(dst, v4_, scope_id_, &to);
  ssize_t r;
  do {
    r = sendto(s->fd, kZeros, 0, MSG_DONTWAIT, &to.sa, len);
  } while (r < 0 && errno == EINTR);
}

std::expected<uint16_t, int> UdpIo::open_port(uint16_t port) {
  std::unique_ptr<Socket> s(new (std::nothrow) Socket);
  if (!s) return std::unexpected(ENOMEM);
  s->bufs = map_rx_ring(touch_fd_);
  if (s->bufs == nullptr) return std::unexpected(errno);

  const int fd = socket(v4_ ? AF_INET : AF_INET6, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_UDP);
  if (fd < 0) return std::unexpected(errno);
  auto fail = [fd](int err) {
    close(fd);
    return std::unexpected(err);
  };

  // DF and, from an unconnected socket, IP ID 0: the ICRC is computed before sendmsg assuming both.
  if (v4_) {
    int pmtu = IP_PMTUDISC_DO;
    if (setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu) != 0) return fail(errno);
  } else {
    int pmtu = IPV6_PMTUDISC_DO;
    if (setsockopt(fd, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &pmtu, sizeof pmtu) != 0) return fail(errno);
    set_int_opt(fd, IPPROTO_IPV6, IPV6_DONTFRAG, 1);  // no fragment header: the ICRC assumes none
    set_int_opt(fd, IPPROTO_IPV6, IPV6_V6ONLY, 1);
  }
  // No IP_PKTINFO: the socket is bound to local_addr_, so that is every packet's destination.
  // Always accept coalesced datagrams (a peer may send with GSO); rx_burst splits them.
  set_int_opt(fd, SOL_UDP, UDP_GRO, 1);
  set_buffer(fd, SO_SNDBUFFORCE, SO_SNDBUF, kSndBufBytes);
  set_buffer(fd, SO_RCVBUFFORCE, SO_RCVBUF, kRcvBufBytes);
  int rcvbuf = 0;
  socklen_t rcvbuf_len = sizeof rcvbuf;
  if (getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, &rcvbuf_len) == 0 && rcvbuf > 0) {
    uint64_t least = rcvbuf_least_.load(std::memory_order_relaxed);
    while ((least == 0 || static_cast<uint64_t>(rcvbuf) < least) &&
           !rcvbuf_least_.compare_exchange_weak(least, static_cast<uint64_t>(rcvbuf))) {
    }
  }

  SockAddr addr;
  const socklen_t alen = to_sockaddr(wire::Endpoint{local_addr_, port}, v4_, scope_id_, &addr);
  if (bind(fd, &addr.sa, alen) != 0) return fail(errno);
  SockAddr bound;
  socklen_t blen = sizeof bound;
  if (getsockname(fd, &bound.sa, &blen) != 0) return fail(errno);
  const uint16_t bound_port = from_sockaddr(bound).port;

  s->fd = fd;
  s->port = bound_port;
  for (uint32_t i = 0; i < kRxBatch; ++i) {
    s->iov[i] = iovec{s->bufs + size_t{i} * kRxBufSize, kRxBufSize};
    msghdr& h = s->msgs[i].msg_hdr;
    h = msghdr{};
    h.msg_name = &s->names[i];
    h.msg_iov = &s->iov[i];
    h.msg_iovlen = 1;
    h.msg_control = s->ctrl[i];
    rearm_rx(h);
  }

  // Senders and the receiver read the slots without a lock; a slot, once filled, is never reused.
  std::lock_guard lock(ctl_mu_);
  const uint32_t n = nslots_.load(std::memory_order_relaxed);
  if (n == kMaxSockets) return fail(ENOSPC);
  if (ip_fields_) report_ip_fields(fd);
  Socket* const added = s.get();
  slots_[n].store(added, std::memory_order_release);
  nslots_.store(n + 1, std::memory_order_release);
  owned_.push_back(std::move(s));
  if (int err = sync_epoll(watched_.load(std::memory_order_relaxed))) {
    retire_slot(n);  // as a closed port: the fd goes with the UdpIo
    return std::unexpected(err);
  }
  return bound_port;
}

bool UdpIo::arm_wakeup() {
  set_watched(true);
  return false;  // a socket added to epfd_ with data queued makes it readable at once
}

void UdpIo::set_rcvbuf_for_test(int bytes) {
  const size_t n = nslots_.load(std::memory_order_acquire);
  for (size_t i = 0; i < n; ++i)
    if (Socket* s = slots_[i].load(std::memory_order_acquire))
      (void)setsockopt(s->fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
}

uint64_t UdpIo::inflight_cap(const wire::Endpoint& /*dst*/) {
  return rcvbuf_least_.load(std::memory_order_relaxed) / 2;
}

bool UdpIo::nap() {
  set_watched(false);
  return false;
}

int UdpIo::app_wait_fds(pollfd* fds, int max) {
  if (faults_) return 0;
  const uint32_t n = nslots_.load(std::memory_order_acquire);
  int k = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const Socket* s = slots_[i].load(std::memory_order_acquire);
    if (s == nullptr) continue;
    if (k == max) return 0;
    fds[k++] = pollfd{s->fd, POLLIN, 0};
  }
  return k;
}

void UdpIo::set_watched(bool on) {
  if (watched_.load(std::memory_order_relaxed) == on) return;
  std::lock_guard lock(ctl_mu_);
  if (sync_epoll(on) == 0) watched_.store(on, std::memory_order_relaxed);  // else the next call tries again
}

int UdpIo::sync_epoll(bool watched) {
  const uint32_t n = nslots_.load(std::memory_order_relaxed);
  const bool want = watched || n > kDirectRecvMaxSockets;
  int err = 0;
  for (uint32_t i = 0; i < n; ++i) {
    Socket* s = slots_[i].load(std::memory_order_relaxed);
    if (s == nullptr || s->in_epoll == want) continue;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = s;
    if (epoll_ctl(epfd_, want ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, s->fd, &ev) == 0)
      s->in_epoll = want;
    else
      err = errno;
  }
  return err;
}

void UdpIo::report_ip_fields(int fd) const {
  if (v4_) {
    set_int_opt(fd, IPPROTO_IP, IP_RECVTOS, 1);
    set_int_opt(fd, IPPROTO_IP, IP_RECVTTL, 1);
  } else {
    set_int_opt(fd, IPPROTO_IPV6, IPV6_RECVTCLASS, 1);
    set_int_opt(fd, IPPROTO_IPV6, IPV6_RECVHOPLIMIT, 1);
  }
}

void UdpIo::want_ip_fields() {
  std::lock_guard lock(ctl_mu_);
  if (ip_fields_) return;
  ip_fields_ = true;
  for (const auto& s : owned_) report_ip_fields(s->fd);  // a closed port's fd stays open (close_port)
}

void UdpIo::publish_mr(const MrInfo& mr) {
  if (touch_fd_ < 0 || mr.length < kTouchMinBytes) return;
  const TouchResult r =
      kernel_touch(touch_fd_, reinterpret_cast<const void*>(mr.addr), mr.length, kTouchMaxBytes);
  counters_->add(Counter::mr_pages_touched, r.pages);
}

// The socket stops sending and receiving at once; its fd and buffers live until the UdpIo goes, since
// another thread may be in sendmmsg on it right now (closing it could hand its number to a new file).
void UdpIo::close_port(uint16_t port) {
  std::lock_guard lock(ctl_mu_);
  const uint32_t n = nslots_.load(std::memory_order_relaxed);
  for (uint32_t i = 0; i < n; ++i) {
    Socket* s = slots_[i].load(std::memory_order_relaxed);
    if (s == nullptr || s->port != port) continue;
    retire_slot(i);
    return;
  }
}

void UdpIo::retire_slot(uint32_t i) {
  Socket* s = slots_[i].load(std::memory_order_relaxed);
  if (s->in_epoll) epoll_ctl(epfd_, EPOLL_CTL_DEL, s->fd, nullptr);
  s->in_epoll = false;
  slots_[i].store(nullptr, std::memory_order_release);
}

size_t UdpIo::num_ports() const {
  size_t open = 0;
  for (uint32_t i = 0, n = nslots_.load(std::memory_order_acquire); i < n; ++i)
    open += slots_[i].load(std::memory_order_acquire) != nullptr;
  return open;
}

UdpIo::Socket* UdpIo::find_socket(uint16_t port) const {
  const uint32_t n = nslots_.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < n; ++i) {
    Socket* s = slots_[i].load(std::memory_order_acquire);
    if (s != nullptr && s->port == port) return s;
  }
  return nullptr;
}

// ---- Transmit ----

// Each sending thread has its own message arrays: no lock is shared by QPs that send from different threads.
UdpIo::TxScratch& UdpIo::scratch() {
  thread_local TxScratch t;
  return t;
}

void UdpIo::tx_burst(std::span<TxPacket> pkts) { (void)send(pkts, false); }

size_t UdpIo::tx_burst_some(std::span<TxPacket> pkts) { return send(pkts, true); }

size_t UdpIo::send(std::span<TxPacket> pkts, bool keep_open_tail) {
  TxScratch& t = scratch();
  Socket* last = nullptr;
  uint64_t dropped = 0;
  size_t i = 0;
  while (i < pkts.size()) {
    Socket* s = last != nullptr && last->port == pkts[i].src.port ? last : find_socket(pkts[i].src.port);
    last = s;
    if (s == nullptr) {
      ++dropped;
      ++i;
      continue;
    }
    const wire::Endpoint src{local_addr_, s->port};
    uint32_t m = 0;       // messages (sendmmsg entries) in this chunk
    uint32_t n_pkt = 0;   // packets in this chunk (trailers used)
    uint32_t n_iov = 0;   // iovecs used from the pool
    bool open = false;    // whether the last message may take more segments
    for (; i < pkts.size() && n_pkt < kTxChunk && pkts[i].src.port == s->port; ++i) {
      TxPacket& p = pkts[i];
      const uint32_t pad = p.pad & 3u;
      if (p.hdr_len < wire::kBthLen || p.hdr_len > kMaxHdr || p.n_iov > kMaxPayloadIov ||
          p.dst.addr.is_v4() != v4_) {
        ++dropped;
        continue;
      }
      uint64_t len = p.hdr_len + pad + wire::kIcrcLen;
      for (uint32_t k = 0; k < p.n_iov; ++k) len += p.iov[k].iov_len;
      if (len > kMaxUdpPayload) {
        ++dropped;
        continue;
      }
      if (n_iov + p.n_iov + 2 > kTxIov) break;  // the pool is full: send what is built, then go on
      // UDP GSO: packets of one size to one destination go in one message, split by the kernel into
      // that many datagrams (the last may be shorter), so many packets cost one trip down the stack.
      const bool join = open && t.seg_size[m - 1] == len && t.npkts[m - 1] < kMaxGsoSegments &&
                        t.len[m - 1] + len <= kMaxGsoBytes && t.dst[m - 1] == p.dst;
      const bool join_last = open && !join && len < t.seg_size[m - 1] && t.npkts[m - 1] < kMaxGsoSegments &&
                             t.len[m - 1] + len <= kMaxGsoBytes && t.dst[m - 1] == p.dst;
      if (!join && !join_last) {
        msghdr& h = t.msgs[m].msg_hdr;
        h = msghdr{};
        h.msg_name = &t.names[m];
        h.msg_namelen = to_sockaddr(p.dst, v4_, scope_id_, &t.names[m]);
        h.msg_iov = &t.iov[n_iov];
        t.len[m] = 0;
        t.npkts[m] = 0;
        t.seg_size[m] = static_cast<uint32_t>(len);
        t.dst[m] = p.dst;
        t.first_pkt[m] = n_pkt;
        t.dropped_before[m] = dropped;
        ++m;
        open = gso_;
      }
      if (join_last) open = false;  // a shorter segment ends the message
      msghdr& h = t.msgs[m - 1].msg_hdr;
      // The header, the payload pieces, and the trailer (pad and ICRC, computed below). Segment k of a GSO
      // message leaves with IPv4 ID k (the kernel numbers them from the message's 0).
      iovec* iov = &t.iov[n_iov];
      iov[0] = iovec{p.hdr, p.hdr_len};
      for (uint32_t k = 0; k < p.n_iov; ++k) iov[1 + k] = p.iov[k];
      iov[1 + p.n_iov] = iovec{t.trailer[n_pkt], pad + wire::kIcrcLen};
      t.pkt[n_pkt++] = {static_cast<uint32_t>(i), static_cast<uint16_t>(t.npkts[m - 1])};
      n_iov += p.n_iov + 2;
      h.msg_iovlen += p.n_iov + 2;
      t.len[m - 1] += static_cast<uint32_t>(len);
      ++t.npkts[m - 1];
    }
    // The end of a burst that more packets will follow (keep_open_tail), in a message that could take
    // more of its size, after another message: kept back, for the next call to fill.
    const bool keep = keep_open_tail && i == pkts.size() && m > 1 && open &&
                      t.npkts[m - 1] < kMaxGsoSegments && t.len[m - 1] + t.seg_size[m - 1] <= kMaxGsoBytes;
    if (keep) {
      --m;
      n_pkt = t.first_pkt[m];
      i = t.pkt[n_pkt].index;
      dropped = t.dropped_before[m];
    }
    // Each message is copied whole into the stage, its packets one after another (header, payload pieces,
    // pad, ICRC), and handed to the kernel as one piece: the kernel's copy of many small pieces cost more
    // than this copy (README, "One piece per message"). The ICRC is computed over the staged packet, just
    // copied, in one pass (icrc_in_place). A message that does not fit keeps its pieces and its ICRCs go into
    // trailer[].
    std::span<const uint8_t>* const segs = t.segs;
    uint8_t* const stage = m != 0 ? tx_stage() : nullptr;
    uint32_t staged = 0;
    // While a packet is staged, the payloads of the packets after it, up to kStagePrefetchAhead bytes past
    // its own, are asked for: a payload out of cache (many QPs' large buffers) then arrives while this one
    // is copied and its ICRC computed, rather than line by line as the copy reaches it, the hardware's
    // prefetcher stopping at each page's end (README, "The next payloads asked for ahead").
    uint32_t pf_next = 0;                         // the first packet whose payload is not yet asked for
    uint64_t pf_through = 0, copied_through = 0;  // payload bytes of the chunk asked for / staged
    for (uint32_t j = 0; j < m; ++j) {
      const uint32_t first = t.first_pkt[j], end = first + t.npkts[j];
      const bool flat = stage != nullptr && staged + t.len[j] <= kTxStageBytes;
      uint8_t* const msg = flat ? stage + staged : nullptr;
      uint8_t* at = msg;
      for (uint32_t k = first; k < end; ++k) {
        const TxPacket& p = pkts[t.pkt[k].index];
        const uint32_t pad = p.pad & 3u;
        if (flat) {
          copied_through += p.payload_len;
          if (p.payload_len >= kStagePrefetchMin) {
            if (pf_next <= k) {
              pf_next = k + 1;
              pf_through = copied_through;
            }
            while (pf_next < n_pkt && pf_through < copied_through + kStagePrefetchAhead) {
              const TxPacket& next = pkts[t.pkt[pf_next++].index];
              prefetch_payload(next);
              pf_through += next.payload_len;
            }
          }
          uint8_t* const start = at;
          std::memcpy(at, p.hdr, p.hdr_len);
          at += p.hdr_len;
          for (uint32_t q = 0; q < p.n_iov; ++q) {
            if (p.iov[q].iov_len != 0) std::memcpy(at, p.iov[q].iov_base, p.iov[q].iov_len);
            at += p.iov[q].iov_len;
          }
          std::memset(at, 0, pad);
          at += pad;
          wire::store_icrc(at,
                           wire::icrc_in_place(src, p.dst, std::span<uint8_t>(start, at), t.pkt[k].ip_id));
          at += wire::kIcrcLen;
        } else {
          uint32_t nseg = 0;
          segs[nseg++] = std::span<const uint8_t>(p.hdr, p.hdr_len);
          for (uint32_t q = 0; q < p.n_iov; ++q)
            segs[nseg++] =
                std::span<const uint8_t>(static_cast<const uint8_t*>(p.iov[q].iov_base), p.iov[q].iov_len);
          if (pad != 0) segs[nseg++] = std::span<const uint8_t>(kZeros, pad);
          uint8_t* trailer = t.trailer[k];
          std::memset(trailer, 0, pad);
          wire::store_icrc(
              trailer + pad,
              wire::icrc_for_udp(src, p.dst, std::span<const std::span<const uint8_t>>(segs, nseg),
                                 t.pkt[k].ip_id));
        }
      }
      if (flat) {
        assert(at == msg + t.len[j]);
        msghdr& h = t.msgs[j].msg_hdr;
        h.msg_iov[0] = iovec{msg, t.len[j]};
        h.msg_iovlen = 1;
        staged += t.len[j];
      }
    }
    // Messages of several segments carry UDP_SEGMENT.
    for (uint32_t k = 0; k < m; ++k) {
      msghdr& h = t.msgs[k].msg_hdr;
      if (t.npkts[k] < 2) continue;
      h.msg_control = t.ctrl[k];
      h.msg_controllen = sizeof t.ctrl[k];
      cmsghdr* c = CMSG_FIRSTHDR(&h);
      c->cmsg_level = SOL_UDP;
      c->cmsg_type = UDP_SEGMENT;
      c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
      const auto seg = static_cast<uint16_t>(t.seg_size[k]);
      std::memcpy(CMSG_DATA(c), &seg, sizeof seg);
    }
    if (m != 0) send_chunk(*s, t, m);
    if (keep) break;
  }
  if (dropped != 0) tx_dropped_.fetch_add(dropped, std::memory_order_relaxed);
  return i;
}

// Sends t.msgs[0, n) on `s`; partial sends continue, EAGAIN/ENOBUFS waits briefly, other errors drop the
// message at fault and go on.
void UdpIo::send_chunk(Socket& s, TxScratch& t, uint32_t n) {
  uint32_t sent = 0;
  uint64_t packets = 0, bytes = 0, dropped = 0;
  int stalls = 0;
  while (sent < n) {
    int r;
    if (n - sent == 1) {  // one message (a ping-pong's, a GSO message of a stream): sendmsg (recv_socket)
      r = sys_sendmsg(s.fd, &t.msgs[sent].msg_hdr, MSG_DONTWAIT) >= 0 ? 1 : -1;
    } else {
      r = sys_sendmmsg(s.fd, t.msgs + sent, n - sent, MSG_DONTWAIT);
    }
    if (r > 0) {
      for (uint32_t k = sent; k < sent + static_cast<uint32_t>(r); ++k) {
        bytes += t.len[k];
        packets += t.npkts[k];
      }
      sent += static_cast<uint32_t>(r);
      stalls = 0;
      continue;
    }
    const int err = r < 0 ? errno : EAGAIN;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK || err == ENOBUFS) {
      if (++stalls > kTxStallRetries) {
        for (uint32_t k = sent; k < n; ++k) dropped += t.npkts[k];
        break;
      }
      if (err == ENOBUFS) {  // a full device queue: the socket still polls writable, so just wait
        timespec ts{0, kTxStallPollMs * 1000000L};
        nanosleep(&ts, nullptr);
      } else {
        pollfd pfd{s.fd, POLLOUT, 0};
        (void)poll(&pfd, 1, kTxStallPollMs);
      }
      continue;
    }
    // EMSGSIZE (beyond the path MTU with DF), EHOSTUNREACH, ENETUNREACH, EINVAL ...: this message only.
    dropped += t.npkts[sent];
    ++sent;
  }
  if (packets != 0) {
    counters_->add(Counter::tx_packets, packets);
    counters_->add(Counter::tx_bytes, bytes);
  }
  if (dropped != 0) tx_dropped_.fetch_add(dropped, std::memory_order_relaxed);
}

// ---- Receive ----

uint32_t UdpIo::rx_burst(RxPacket* out, uint32_t max) {
  if (max == 0) return 0;
  uint32_t got = 0;
  uint64_t now = 0;
  if (faults_) got = faults_->begin_burst_now(out, max, &now);  // held packets that are due go first
  const size_t n = nslots_.load(std::memory_order_acquire);
  drained_ = false;
  if (n != 0 && n <= kDirectRecvMaxSockets) {
    bool drained = faults_ == nullptr;
    size_t k = 0;
    for (; k < n && got < max; ++k) {
      Socket* s = slots_[(rx_rr_ + k) % n].load(std::memory_order_acquire);
      if (s == nullptr) continue;
      bool emptied = false;
      got += recv_socket(*s, out + got, max - got, now, &emptied);
      drained = drained && emptied;
    }
    drained_ = drained && k == n;
    rx_rr_ = (rx_rr_ + 1) % n;
  } else if (n != 0) {
    // Many sockets: ask epoll which are readable (its ready list rotates, which spreads the work).
    epoll_event ev[64];
    const int k = epoll_wait(epfd_, ev, 64, 0);
    for (int j = 0; j < k && got < max; ++j) {
      if (ev[j].data.ptr == nullptr) continue;  // the fault injector's timer
      bool emptied;
      got += recv_socket(*static_cast<Socket*>(ev[j].data.ptr), out + got, max - got, now, &emptied);
    }
  }
  if (faults_) faults_->end_burst(now);
  return got;
}

uint32_t UdpIo::take_drops(Socket& s) {
  s.unchecked_reads = s.unchecked_multi = 0;
  uint32_t mem[SK_MEMINFO_VARS];
  socklen_t len = sizeof mem;
  if (getsockopt(s.fd, SOL_SOCKET, SO_MEMINFO, mem, &len) != 0 || len <= SK_MEMINFO_DROPS * sizeof(uint32_t))
    return 0;
  const uint32_t d = mem[SK_MEMINFO_DROPS] - s.overflows;  // wraps correctly
  s.overflows = mem[SK_MEMINFO_DROPS];
  return d;
}

uint32_t UdpIo::recv_socket(Socket& s, RxPacket* out, uint32_t room, uint64_t now, bool* emptied) {
  *emptied = false;
  uint32_t overflowed = 0;
  if (s.next_msg >= s.n_msgs) {
    // Under fault injection, half the room: duplicates and reordered packets go right behind the packet
    // that released them.
    uint32_t vlen = std::min(faults_ ? std::max(1u, room / 2) : room, kRxBatch);
    // A socket that was idle asks for one message. recvmmsg returns only after a receive finds the queue
    // empty or vlen are filled, so asking for more costs a second, empty receive inside the call whenever
    // one message came, on the path from a ping-pong's packet to its completion (8-byte ping-pong over
    // loopback: 0.15-0.23 us per half round trip). That message is taken as having emptied the socket, a
    // guess that is right for a ping-pong; after a message the socket is not idle and the next call asks
    // for a full batch, so a stream that follows costs one more call.
    const bool guess = s.idle && faults_ == nullptr;
    if (guess) vlen = 1;
    // The kernel rewrites the lengths and flags of the messages it fills, and only those: the last call's
    // are set back (a poll that finds nothing, most of them, then sets back none).
    for (uint32_t i = 0; i < s.filled; ++i) rearm_rx(s.msgs[i].msg_hdr);
    s.filled = 0;
    int r;
    // One message by recvmsg: recvmmsg's own work around the same receive cost a ping-pong 0.1-0.15 us
    // per half round trip (8-byte socket-path ib_write_lat, pinned: typical 4.61-4.63 -> 4.48-4.56 us).
    do {
      if (vlen == 1) {
        const ssize_t len = sys_recvmsg(s.fd, &s.msgs[0].msg_hdr, MSG_DONTWAIT | MSG_TRUNC);
        if (len >= 0) s.msgs[0].msg_len = static_cast<unsigned>(len);
        r = len >= 0 ? 1 : -1;
      } else {
        r = sys_recvmmsg(s.fd, s.msgs, vlen, MSG_DONTWAIT | MSG_TRUNC);
      }
    } while (r < 0 && errno == EINTR);
    if (r > 0) s.filled = static_cast<uint32_t>(r);
    if (r <= 0) {
      *emptied = r == 0 || errno == EAGAIN;
      if (*emptied && !s.idle && s.unchecked_reads != 0) {  // a burst's end
        const uint64_t t = monotonic_ns(CLOCK_MONOTONIC_COARSE);
        if (t - s.burst_check_at >= kDropCheckNs) {
          s.burst_check_at = t;
          if (const uint32_t d = take_drops(s)) counters_->add(Counter::drop_socket_full, d);
        }
      }
      s.idle = *emptied;
      return 0;
    }
    s.idle = false;
    if ((r > 1 && (static_cast<uint32_t>(r) == vlen || ++s.unchecked_multi >= kDropCheckMulti)) ||
        ++s.unchecked_reads >= kDropCheckEvery)
      overflowed = take_drops(s);
    s.n_msgs = static_cast<uint32_t>(r);
    s.next_msg = s.next_off = 0;
    // Fewer than asked for: the queue was empty behind them (once they are all handed out).
    *emptied = guess || static_cast<uint32_t>(r) < vlen;
  }

  uint32_t got = 0;
  uint64_t bytes = 0, truncated = 0, bad_icrc = 0, oversize = 0;
  while (s.next_msg < s.n_msgs && got < room) {
    const uint32_t i = s.next_msg;
    const msghdr& h = s.msgs[i].msg_hdr;
    const uint32_t len = s.msgs[i].msg_len;  // the datagram's real size (MSG_TRUNC)
    if ((h.msg_flags & MSG_TRUNC) != 0 || len > kRxBufSize) {
      ++oversize;
      ++s.next_msg;
      continue;
    }
    if (len == 0) {  // an empty datagram is a same-host peer's doorbell (io/shm), not a packet
      ++doorbells_;
      ++s.next_msg;
      continue;
    }
    RxPacket& p = out[got];
    p.src = from_sockaddr(s.names[i]);
    p.dst = wire::Endpoint{local_addr_, s.port};
    p.tos = 0;
    p.ttl = 64;
    p.flags = 0;
    uint32_t gso_size = 0;  // set when the kernel coalesced several datagrams (UDP_GRO)
    for (cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr; c = CMSG_NXTHDR(const_cast<msghdr*>(&h), c)) {
      const uint8_t* d = CMSG_DATA(c);
      int v = 0;
      if (c->cmsg_level == IPPROTO_IP) {
        if (c->cmsg_type == IP_TOS) {
          p.tos = *d;
        } else if (c->cmsg_type == IP_TTL) {
          std::memcpy(&v, d, sizeof v);
          p.ttl = static_cast<uint8_t>(v);
        }
      } else if (c->cmsg_level == IPPROTO_IPV6) {
        if (c->cmsg_type == IPV6_TCLASS) {
          std::memcpy(&v, d, sizeof v);
          p.tos = static_cast<uint8_t>(v);
        } else if (c->cmsg_type == IPV6_HOPLIMIT) {
          std::memcpy(&v, d, sizeof v);
          p.ttl = static_cast<uint8_t>(v);
        }
      } else if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
        std::memcpy(&v, d, sizeof v);
        gso_size = v > 0 ? static_cast<uint32_t>(v) : 0;
      }
    }
    // One datagram, or the next of the coalesced ones.
    const uint32_t off = s.next_off;
    const uint32_t seg = gso_size != 0 ? gso_size : len;
    const uint32_t seg_len = std::min(seg, len - off);
    const auto index = static_cast<uint16_t>(off / seg);
    s.next_off += seg_len;
    if (s.next_off >= len) {
      ++s.next_msg;
      s.next_off = 0;
    }
    if (seg_len < kMinPacket) {
      ++truncated;
      continue;
    }
    uint8_t* data = static_cast<uint8_t*>(s.iov[i].iov_base) + off;
    const uint32_t body = seg_len - wire::kIcrcLen;
    if (faults_) faults_->maybe_corrupt(data, seg_len);
    // A socket does not show the IPv4 ID the ICRC covers: 0 for a plain send, k for the k-th segment of a
    // GSO send (likely `index` in a coalesced run; anything up to the most segments a sender puts in one
    // send when the segments arrive one by one). At the standard port any ID: a RoCE peer there may be
    // Linux's rxe, which numbers its packets (the reference capture's IDs run 0x06da.., 0xa967..).
    const uint16_t max_id = s.port == wire::kRoceV2Port ? uint16_t{0xFFFF} : uint16_t{kMaxGsoSegments - 1};
    if (wire::icrc_check_any_id(p.src, p.dst, std::span<uint8_t>(data, body), wire::load_icrc(data + body),
                                index, max_id) < 0) {
      ++bad_icrc;
      continue;
    }
    p.data = data;
    p.len = body;
    if (faults_) {
      if (faults_->on_packet(p, now) != RxFaults::Verdict::kDeliver) continue;
      bytes += seg_len;
      ++got;
      // Packets released behind this one (reorder, duplicate) may use the room left.
      const uint32_t extra = faults_->after_deliver(p, out + got, room - got, now);
      for (uint32_t k = 0; k < extra; ++k) bytes += out[got + k].len + wire::kIcrcLen;
      got += extra;
      continue;
    }
    bytes += seg_len;
    ++got;
  }
  *emptied = *emptied && s.next_msg >= s.n_msgs;
  if (got != 0) {
    counters_->add(Counter::rx_packets, got);
    counters_->add(Counter::rx_bytes, bytes);
  }
  if (truncated != 0) counters_->add(Counter::drop_truncated, truncated);
  if (bad_icrc != 0) counters_->add(Counter::drop_bad_icrc, bad_icrc);
  if (overflowed != 0) counters_->add(Counter::drop_socket_full, overflowed);
  if (oversize != 0) rx_oversize_.fetch_add(oversize, std::memory_order_relaxed);
  return got;
}

}  // namespace softrdma::io
