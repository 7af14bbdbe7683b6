// The RoCEv2 backend: the UDP sockets of one context, all bound to one local address (ARCHITECTURE.md
// "Addressing and many processes per host"). The kernel builds the IP and UDP headers; this file adds the
// pad and the ICRC on send and checks and strips them on receive. Bursts: one sendmmsg for consecutive
// packets of one socket, one recvmmsg per socket per rx_burst. Implements io::Backend.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <expected>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "core/counters.h"
#include "io/backend.h"
#include "io/packet.h"
#include "io/udp/fault_injector.h"
#include "wire/addr.h"

namespace softrdma::io {

class UdpIo : public Backend {
 public:
  // Receive ring of each socket: kRxBatch buffers of kRxBufSize bytes, mapped and faulted in at open_port
  // (2 MiB, one huge page where it can be; udp_io.cc, map_rx_ring).
  // A buffer holds the largest UDP datagram: with UDP_GRO the kernel hands over runs of datagrams
  // coalesced into one (RoCEv2 packets themselves are at most 4096 + 64 + 3 + 4 bytes).
  static constexpr uint32_t kRxBatch = 32;
  static constexpr uint32_t kRxBufSize = 65536;
  // Packets per sendmmsg, and iovecs (each packet takes its payload pieces + 2).
  static constexpr uint32_t kTxChunk = 64;
  static constexpr uint32_t kTxIov = 1024;  // UIO_MAXIOV: also the most one GSO message may have
  // Bytes of messages per chunk copied whole into one piece each (UdpIo::send): a sending thread's batch
  // (TxBatch: 128 KiB of payload at most) with its headers.
  static constexpr uint32_t kTxStageBytes = 136 * 1024;
  // Staging a packet with a payload of kStagePrefetchMin bytes or more asks for the next payloads' lines up
  // to kStagePrefetchAhead bytes past its own (send).
  static constexpr uint32_t kStagePrefetchMin = 256;
  static constexpr uint32_t kStagePrefetchAhead = 4096;
  // UDP GSO: at most this many packets, and bytes, in one message.
  static constexpr uint32_t kMaxGsoSegments = 64;
  static constexpr uint32_t kMaxGsoBytes = 65000;
  // Requested SO_SNDBUF/SO_RCVBUF (the kernel doubles it; without CAP_NET_ADMIN, capped at
  // net.core.{w,r}mem_max). The receive side is larger: UD and UC have no flow control, so a burst sent
  // while the receiving process is not scheduled waits here (perftest's ib_send_bw -c UD sends 1000 x
  // 4 KiB at once, which 8 MiB did not always hold in a busy CI; -c UC sends 1000 x 64 KiB, which 16 MiB
  // did not hold on this 2-CPU host: the receiver, on the sender's CPU, ran in turns of ~4 ms, and the
  // server waited for ever); memory is taken only while datagrams wait.
  static constexpr int kSndBufBytes = 4 << 20;
  static constexpr int kRcvBufBytes = 32 << 20;
  // When the kernel says EAGAIN/ENOBUFS: wait up to kTxStallPollMs for POLLOUT, at most kTxStallRetries
  // times without progress, then drop the rest of the chunk.
  static constexpr int kTxStallRetries = 20;
  static constexpr int kTxStallPollMs = 1;
  // With more sockets than this, rx_burst asks epoll which ones are readable instead of trying each.
  static constexpr size_t kDirectRecvMaxSockets = 2;

  // `counters` may be null (then the object keeps its own block). SOFTRDMA_FAULTS (fault_injector.h) is
  // read here: a malformed value fails with EINVAL after a message on stderr. `local_addr`: an IPv4-mapped GID binds
  // AF_INET sockets, anything else AF_INET6 (link-local addresses get the interface's scope id).
  static std::expected<std::unique_ptr<UdpIo>, int /*errno*/> create(const wire::Gid& local_addr,
                                                                     Counters* counters);
  ~UdpIo() override;
  UdpIo(const UdpIo&) = delete;
  UdpIo& operator=(const UdpIo&) = delete;

  // Binds a new non-blocking socket at `port` (0: ephemeral; wire::kRoceV2Port: standard mode) and returns
  // the bound port. Control path: serialize with rx_burst (tx_burst may run concurrently).
  std::expected<uint16_t, int /*errno*/> open_port(uint16_t port) override;
  void close_port(uint16_t port) override;

  // Readable (level-triggered) whenever a socket has data, except between nap() or woke() and the next
  // arm_wakeup(); nest it in another epoll.
  int poll_fd() const override { return epfd_; }
  // A socket in an epoll costs each datagram that reaches it the kernel's wake-up callbacks, even with no
  // thread asleep there: in an 8-byte UDP ping-pong here, 0.4 us per half round trip (floor-bench's, with
  // an epoll added on its sockets for the measurement), and in the sender's sendmmsg of softrdma's
  // ib_write_lat (epoll in epoll) 4.4 instead of 3.6 us (timed with rdtsc around it). So the sockets are in
  // epfd_ only while a receiver may sleep on it: from arm_wakeup() (before each sleep that watches the
  // sockets) to nap() or woke() (the receiver is awake and reads them itself). With more sockets than
  // kDirectRecvMaxSockets they stay: rx_burst asks epfd_ which are readable.
  bool arm_wakeup() override;
  // A receiver that woke spins and reads the sockets, a busy one (ib_write_bw's server) for as long as data
  // comes: left in epfd_, every datagram's enqueue ran epoll's callbacks, two levels deep, in the sender's
  // sendmmsg (socket path, 1 MiB ib_write_bw: 2.5-3.6% of the sending thread's samples, with no thread
  // asleep anywhere). Two epoll_ctl calls per sleep instead.
  void woke() override { set_watched(false); }
  // The open sockets, at most `max` of them (else 0); none under fault injection, whose held packets a
  // timer in epfd_ releases.
  int app_wait_fds(pollfd* fds, int max) override;
  bool nap() override;  // false: the nap need not watch
  // Half the receive buffer of this context's sockets (the smallest: the kernel accounts each datagram's
  // memory, about twice the payload of a lone 4 KiB one, against SO_RCVBUF, which it reports doubled).
  // Without CAP_NET_ADMIN the buffer is capped by net.core.rmem_max, 208 KiB on a stock Debian: the 4 MiB
  // that RC QPs keep in flight by default overran it (socket ib_read_bw 64 KiB as a user: 13,549 of 415,000
  // datagrams dropped, go-back-N, 196 MiB/s against 2,137 as root). As root, 32 MiB: above that budget.
  uint64_t inflight_cap(const wire::Endpoint& dst) override;
  // For tests: the open sockets' receive buffer (SO_RCVBUF: the kernel doubles it, within rmem_max);
  // inflight_cap() goes on saying what open_port read.
  void set_rcvbuf_for_test(int bytes);

  // Frames and sends every packet, in order, on the socket whose port is pkt.src.port (the source address
  // is always local_addr()). Thread-safe; never blocks for more than about kTxStallRetries *
  // kTxStallPollMs per stall. Packets that cannot be sent are dropped and counted (tx_dropped()).
  void tx_burst(std::span<TxPacket> pkts) override;
  // The same, but for a GSO message at the end that could take more packets of its size, when another
  // message goes before it: that one is kept back (TxSink::tx_burst_some). At path MTU 4096 a message holds
  // 15 packets, and TxBatch's 32 went as 15 + 15 + 2, so that every 30 packets of a stream cost three
  // messages (an skb, a trip down the stack and up, a receive on the other side) instead of two.
  size_t tx_burst_some(std::span<TxPacket> pkts) override;

  // Receives up to `max` verified packets without blocking (under fault injection, held packets that are
  // due come first). out[i].data points into this object's buffers and stays valid until the next
  // rx_burst call. One caller at a time.
  uint32_t rx_burst(RxPacket* out, uint32_t max) override;
  // True when each socket's last receive call came back with fewer datagrams than it asked for and none are
  // left over (not under fault injection, nor with more sockets than kDirectRecvMaxSockets).
  bool rx_drained() const override { return drained_; }
  void want_ip_fields() override;
  // Has the kernel read each resident page of the MR once (io/kernel_touch.h), at most kTouchMaxBytes of
  // it, unless SOFTRDMA_MR_TOUCH=0: the payloads sendmmsg gathers from it then skip the kernel's first
  // access. 64 MiB: about 85 ms here (5 us a page), paid by ibv_reg_mr instead of the first transfer.
  // Not for MRs under kTouchMinBytes: the touch's two syscalls doubled a 4 KiB MR's registration (reg and
  // dereg 5.5-6 -> 10.5-11.5 us here), paid again at each registration of the same buffer, against at most
  // 16 first accesses (about 120 us here, once).
  static constexpr uint64_t kTouchMinBytes = 64u << 10;
  static constexpr uint64_t kTouchMaxBytes = 256ull << 20;
  void publish_mr(const MrInfo& mr) override;

  const wire::Gid& local_addr() const override { return local_addr_; }
  size_t num_ports() const;  // open ones

  // For a backend layered on this one (io/shm): another fd that makes poll_fd() readable (rx_burst ignores
  // it; the layer acts on it in its own rx_burst). 0 or errno.
  int add_poll_fd(int fd);
  void remove_poll_fd(int fd);
  // Sends an empty datagram from the socket of `src_port` (any open one if that is closed) to `dst`: the
  // wake-up of a same-host peer that sleeps in epoll (io/shm). rx_burst drops empty datagrams uncounted.
  void send_doorbell(uint16_t src_port, const wire::Endpoint& dst);
  // How many doorbells rx_burst dropped since the last call (rx_burst's caller only).
  uint32_t take_doorbells() {
    const uint32_t n = doorbells_;
    doorbells_ = 0;
    return n;
  }
  // Drops with no counter in core/counters.h yet.
  uint64_t tx_dropped() const { return tx_dropped_.load(std::memory_order_relaxed); }
  uint64_t rx_oversize() const { return rx_oversize_.load(std::memory_order_relaxed); }

 private:
  struct Socket;
  struct TxScratch;

  UdpIo(const wire::Gid& local_addr, uint32_t scope_id, Counters* counters);
  Socket* find_socket(uint16_t port) const;
  static TxScratch& scratch();
  // `emptied`: whether this call left the socket with nothing queued that it knows of (see rx_drained).
  uint32_t recv_socket(Socket& s, RxPacket* out, uint32_t room, uint64_t now, bool* emptied);
  uint32_t take_drops(Socket& s);  // the socket's drops since the last call (SO_MEMINFO)
  void send_chunk(Socket& s, TxScratch& t, uint32_t n);
  // tx_burst (keep_open_tail false) and tx_burst_some: the packets sent, dropped or counted as dropped.
  size_t send(std::span<TxPacket> pkts, bool keep_open_tail);
  void report_ip_fields(int fd) const;  // asks the kernel for each packet's TOS and TTL
  void set_watched(bool on);
  // Puts the open sockets in epfd_ or takes them out, as `watched` says (under ctl_mu_): 0 or an errno.
  int sync_epoll(bool watched);
  // Takes slot i's socket out of epfd_ and the slot out of use (under ctl_mu_; its fd stays open).
  void retire_slot(uint32_t i);

  // Fault injection (io/udp/fault_injector.h): on receive, configured by SOFTRDMA_FAULTS; null when off.
  std::unique_ptr<RxFaults> faults_;
  // Send runs of equal-size packets to one peer as one UDP GSO message (SOFTRDMA_GSO=0 turns it off).
  bool gso_ = true;
  int touch_fd_ = -1;  // the sink of kernel_touch; -1 when SOFTRDMA_MR_TOUCH=0

  const wire::Gid local_addr_;
  const bool v4_;
  const uint32_t scope_id_;  // for a link-local IPv6 local_addr
  Counters own_counters_;
  Counters* const counters_;
  int epfd_ = -1;
  static constexpr uint32_t kMaxSockets = 4096;  // x 256 QPNs each
  std::unique_ptr<std::atomic<Socket*>[]> slots_;  // filled in order, never reused; null once closed
  std::atomic<uint32_t> nslots_{0};
  std::mutex ctl_mu_;  // open_port / close_port / want_ip_fields
  bool ip_fields_ = false;  // want_ip_fields was called (under ctl_mu_)
  // Whether a receiver may sleep on epfd_ (arm_wakeup to nap) and the sockets are there; written under
  // ctl_mu_.
  std::atomic<bool> watched_{true};
  std::vector<std::unique_ptr<Socket>> owned_;
  size_t rx_rr_ = 0;  // round-robin start for rx_burst
  bool drained_ = false;  // rx_drained
  uint32_t doorbells_ = 0;  // empty datagrams rx_burst dropped (take_doorbells)

  std::atomic<uint64_t> tx_dropped_{0};
  // The smallest SO_RCVBUF (as the kernel reports it) of the sockets opened at open_port; 0: none yet.
  std::atomic<uint64_t> rcvbuf_least_{0};
  std::atomic<uint64_t> rx_oversize_{0};
};

}  // namespace softrdma::io
