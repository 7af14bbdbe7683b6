// The same-host path (ARCHITECTURE.md "Performance plan"): a backend layered on the UDP one that carries the
// packets between two softrdma contexts of one host (and one network namespace) through shared memory
// instead of the kernel. The transport above is unchanged: the same RoCEv2 packets, PSNs, ACKs and
// retransmissions, only their way between the processes differs; everything else goes over UDP.
//
// Discovery: each port a context opens is published as a file in /dev/shm named by the network namespace,
// the address and the UDP port (softrdma-shm.<netns inode>.<address hex>.<port>), so a sender finds the
// receiver of a destination Endpoint with no daemon, and processes in different network namespaces (which
// cannot reach each other's sockets either, or only through a real network) never find each other. The
// receiver holds a shared flock on its file for its life: a file nobody locks is a dead process's, which
// `collect_garbage` removes; a new process that binds the same port replaces the file (rename), so a file
// left by a process killed with SIGKILL wedges nothing. Files are 0600: only the same user finds them.
//
// Rings (shm_ring.h): the port file holds a table of kMaxRings multi-producer single-consumer rings, one per
// sending context, claimed by the sender on its first packet and given back when it closes (or by another
// sender, when its owner died). A full ring makes the sender wait briefly (kFullWaitNs per burst), then drop
// the packet (counted, drop_shm_ring_full): the transport retransmits, as after a loss on the wire; nothing
// blocks for longer.
//
// Wake-ups: a busy receiver reads its rings in rx_burst with no syscall. A receiver that goes to sleep in
// epoll first sets `sleeping` in its port files (arm_wakeup); a sender that finds it set clears it and sends
// the receiver's UDP port an empty datagram (the doorbell, one per sleep), which wakes its epoll.
//
// SOFTRDMA_FAULTS applies to the packets of the rings as to those of the sockets (an injector of its own;
// a corrupted packet is dropped as the ICRC check would). SOFTRDMA_SHM=0 turns the path off.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <expected>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/counters.h"
#include "io/backend.h"
#include "io/shm/access_table.h"
#include "io/shm/copy_helper.h"
#include "io/shm/mr_share.h"
#include "io/shm/shm_ring.h"
#include "io/udp/fault_injector.h"
#include "io/udp/udp_io.h"

namespace softrdma::io {

class ShmIo : public Backend {
 public:
  static constexpr const char* kEnv = "SOFTRDMA_SHM";
  static constexpr const char* kDirectEnv = "SOFTRDMA_DIRECT";  // "0": no one-sided path
  static constexpr const char* kFilePrefix = "softrdma-shm.";
  // How often a sender looks again at a peer it knows (a replaced or closed port file, a ring taken back).
  static constexpr uint64_t kRecheckNs = 200'000'000;
  static constexpr uint32_t kMaxOwnPorts = 256;  // published ports per context (more go over UDP only)
  static constexpr uint32_t kPeerSlots = 1024;   // destinations a context remembers (more go over UDP)
  // How long one tx_burst waits in all for room in full rings before it drops (a receiver drains a ring of
  // 2048 packets of 4 KiB in about a millisecond; the UDP backend waits up to 20 ms for a full socket).
  // UC and UD have no flow control: perftest's UC/UD SEND tests need such bursts to arrive. A ring that
  // gets no room for a whole wait drops at once for kStalledNs.
  static constexpr int64_t kFullWaitNs = 10'000'000;
  static constexpr uint64_t kStalledNs = 100'000'000;

  struct Config {
    std::string dir = "/dev/shm";
    uint32_t ring_slots = shm::kDefaultSlots;  // a power of two
    uint64_t netns = 0;                         // 0: this process's network namespace (tests set others)
    bool prewarm = true;                        // ring 0 warmed up when a port opens (prewarm_first_ring)
    // Long packets (kStreamMinBytes or more) are copied into the rings with streaming stores
    // (stream_copy.h); SOFTRDMA_SHM_STREAM=1 turns it on as well.
    bool stream = false;
  };
  static constexpr const char* kStreamEnv = "SOFTRDMA_SHM_STREAM";
  static constexpr uint64_t kStreamMinBytes = 1024;  // BTH to pad
  // A port's ring 0 is warmed up when it opens (Config::prewarm) only if its filesystem has room for this
  // many rings.
  static constexpr uint64_t kPrewarmFreeRings = 16;

  // Whether the environment asks for the path (SOFTRDMA_SHM unset or anything but "0").
  static bool enabled_by_env();
  // Whether the environment allows the one-sided path (SOFTRDMA_DIRECT unset or anything but "0").
  static bool direct_by_env();
  // Layers the path on `udp` (whose ports it publishes). `counters` may be null.
  static std::expected<std::unique_ptr<ShmIo>, int> create(std::unique_ptr<UdpIo> udp, Counters* counters,
                                                           const Config& cfg);
  static std::expected<std::unique_ptr<ShmIo>, int> create(std::unique_ptr<UdpIo> udp, Counters* counters) {
    return create(std::move(udp), counters, Config{});
  }
  ~ShmIo() override;
  ShmIo(const ShmIo&) = delete;
  ShmIo& operator=(const ShmIo&) = delete;

  // Opens the UDP port and publishes it (a port that cannot be published works over UDP alone).
  std::expected<uint16_t, int> open_port(uint16_t port) override;
  void close_port(uint16_t port) override;
  // Packets to a published port of this host go into its ring, the others to UDP (in order per destination).
  void tx_burst(std::span<TxPacket> pkts) override;
  // The same; UDP packets at its end go by UdpIo::tx_burst_some.
  size_t tx_burst_some(std::span<TxPacket> pkts) override;
  // UDP packets, then ring packets (a doorbell read here means its packet is in the ring: it is read in the
  // same call). They stay valid until the next call.
  uint32_t rx_burst(RxPacket* out, uint32_t max) override;
  bool rx_drained() const override { return drained_; }
  uint64_t rx_clock() const override { return rx_clock_; }
  int poll_fd() const override { return udp_->poll_fd(); }
  const wire::Gid& local_addr() const override { return udp_->local_addr(); }
  bool arm_wakeup() override;
  // The UDP sockets, where doorbells come, after arm_wakeup (none under fault injection).
  int app_wait_fds(pollfd* fds, int max) override;
  // While no ring carried a packet lately (rings_lately), this context's packets come over UDP from other
  // hosts, and its sockets are handled as io/udp's: out of epoll while the receiver is awake or naps, in
  // it from arm_wakeup. Left in through naps, every packet woke the napping progress thread, on 2 cores in
  // the application's place (8-byte ib_write_lat between two network namespaces, 5 interleaved runs:
  // typical 6.9-10.2 us, average 7.9-13.4, against 6.6-8.2 and 6.8-8.3 with SOFTRDMA_SHM=0).
  void woke() override;
  bool nap() override;
  void before_sleep() override { touch_rings(); }
  void sockets_readable() override { udp_readable_.store(true, std::memory_order_relaxed); }
  bool wakes_by_doorbell() const override { return rings_lately(); }
  // Also looks again at a peer it knows: a restarted process may have the port of a dead one.
  void prepare_peer(const wire::Endpoint& dst) override;
  // None for a peer reached through a ring (a full ring makes its sender wait); the socket's otherwise.
  uint64_t inflight_cap(const wire::Endpoint& dst) override {
    return reaches(dst) ? 0 : udp_->inflight_cap(dst);
  }
  // True while the last packet in this context's ring to `dst` is unread and the peer has read some since
  // the previous call (`mark`: the oldest unread position then, + 1). A retransmit timer that ran out found a
  // queue, not a loss: 64 RC QPs of 1 MiB messages to one busy peer (softrdma-soak) had packets wait
  // 8-27 ms in its ring, beyond the 16.8 ms timeout, and 400-650 timeouts in 5 s sent again packets
  // that then all came twice. A peer that reads nothing for a whole timeout gets the timeout as before.
  bool peer_behind(const wire::Endpoint& dst, uint64_t* mark) override;
  void want_ip_fields() override { udp_->want_ip_fields(); }
  // The one-sided path (access_table.h).
  void publish_mr(const MrInfo& mr) override;
  void withdraw_mr(uint32_t key) override;
  void forget_mr(uint32_t key) override;
  std::atomic<uint32_t>* publish_qp(const QpInfo& qp) override;
  int direct(const wire::Endpoint& dst, const DirectOp& op) override;

  UdpIo* udp() const { return udp_.get(); }
  // The file that publishes `ep` in this context's namespace.
  std::string port_path(const wire::Endpoint& ep) const;
  // Whether packets to `dst` would go through shared memory now (looks the peer up).
  bool reaches(const wire::Endpoint& dst);
  // Removes the port files in `dir` that no live process holds; returns how many.
  static int collect_garbage(const std::string& dir);

 private:
  // Populates and warms up the rings this process reads that have carried a packet (Ring::touch), once
  // each (not a ring 0 that prewarm_first_ring did); the progress thread calls it before it sleeps, so
  // that the receive path is not held for the ~10 ms it takes.
  void touch_rings();
  struct OwnPort;
  // Allocates and warms up ring 0 of a port being published (before its file is visible), when its
  // filesystem has room for kPrewarmFreeRings rings.
  void prewarm_first_ring(int fd, OwnPort& o, uint8_t* map, const shm::PortHeader& h);
  struct Peer;
  struct PeerSlot;

  ShmIo(std::unique_ptr<UdpIo> udp, Counters* counters, const Config& cfg);
  int publish(OwnPort& o);
  uint32_t rx_rings(RxPacket* out, uint32_t room, uint64_t now);
  void scan_entries(OwnPort& o, uint64_t gen);
  // The peer that reaches `dst` through a ring, or null (UDP); opened (open_peer) if not seen before.
  Peer* lookup(const wire::Endpoint& dst, uint64_t now, bool cold_bulk = false);
  Peer* recheck(PeerSlot& s, uint64_t now);
  // `cold_bulk`: a UD packet's destination, claimed in its post: its bulk pages are not warmed up.
  Peer* open_peer(const wire::Endpoint& dst, bool cold_bulk = false);
  bool still_valid(const Peer& p) const;
  void give_back(Peer& p);
  void wake(Peer& p, uint16_t src_port);
  int open_access(Peer& p);
  std::string access_path(int pid, uint32_t serial) const;
  // tx_burst (partial false) and tx_burst_some: the packets sent, dropped or counted as dropped.
  size_t send(std::span<TxPacket> pkts, bool partial);
  shm::Slot* claim_waiting(Peer& p, uint64_t* pos, uint16_t src_port, int64_t* budget);

  std::unique_ptr<UdpIo> udp_;
  Counters own_counters_;
  Counters* const counters_;
  const Config cfg_;
  uint64_t netns_ = 0;
  uint64_t pidns_ = 0;
  int pid_ = 0;
  uint64_t start_time_ = 0;
  std::unique_ptr<RxFaults> faults_;
  // The one-sided path: this context's MRs and QPs for its peers, in a file made at the first publish.
  shm::AccessTable* access_table();  // (under acc_mu_) null if off or the file could not be made
  std::mutex acc_mu_;
  std::unique_ptr<shm::AccessTable> access_;
  bool access_failed_ = false;
  uint32_t access_serial_ = 0;  // names the file; 0: the path is off
  bool share_mr_ = false;       // SOFTRDMA_SHARE_MR=1 (mr_share.h)
  std::vector<std::pair<uint32_t, shm::SharedPages>> shared_;  // by MR key (under acc_mu_)
  shm::CopyHelper copy_helper_;  // the second thread of large one-sided copies

  // Receiving: published ports, filled in order (slots never reused), read without a lock.
  std::unique_ptr<OwnPort[]> own_;
  std::atomic<uint32_t> n_own_{0};
  std::atomic<bool> armed_{false};  // the receiver sleeps (between arm_wakeup and woke)
  // A ring carried its first packets and is not warmed up yet (touch_rings).
  std::atomic<bool> touch_pending_{false};
  bool drained_ = false;  // rx_drained (rx_burst's caller only)
  // rx_burst reads the UDP socket at most every udp_gap_ns_ until kRingsBusyNs after the rings last gave
  // a packet: kUdpPollGapNs after a read that found packets, twice the last gap (up to kUdpPollGapMaxNs)
  // after one that found none (rx_burst's caller only; CLOCK_MONOTONIC ns).
  static constexpr uint64_t kUdpPollGapNs = 2'000;
  static constexpr uint64_t kUdpPollGapMaxNs = 64'000;
  static constexpr uint64_t kRingsBusyNs = 100'000;
  uint64_t udp_read_at_ = 0;
  uint64_t rx_clock_ = 0;  // rx_clock()
  uint64_t udp_gap_ns_ = kUdpPollGapNs;
  // The progress thread's epoll saw a socket's data (sockets_readable): the next rx_burst reads it.
  std::atomic<bool> udp_readable_{false};
  // When rx_burst last read packets from a ring (CLOCK_MONOTONIC ns; 0: never; written by rx_burst's
  // caller only). The rings are busy for kRingsBusyNs after it, and a same-host peer counts as still
  // sending through them for kRingsLatelyNs (rings_lately: doorbells may wake this context, and naps keep
  // watching its sockets).
  std::atomic<uint64_t> ring_packet_at_{0};
  static constexpr uint64_t kRingsLatelyNs = 1'000'000'000;
  bool rings_lately() const;
  void set_sleeping();

  // Sending: destinations by hash (open addressing; entries never removed), and every Peer ever made
  // (a replaced one stays mapped until the end: another thread may still be writing into it).
  std::unique_ptr<PeerSlot[]> peers_;
  std::vector<std::unique_ptr<Peer>> all_peers_;
  std::mutex ctl_mu_;  // open/close_port, peer lookups that miss
};

}  // namespace softrdma::io
