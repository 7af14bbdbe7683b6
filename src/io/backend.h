// The interface every packet backend offers the core: UDP sockets (io/udp) or the in-memory network of the
// tests (io/sim). A backend owns "ports": UDP ports of the context's address; the upper 16 bits of a QPN
// are the port of its socket (ARCHITECTURE.md, Addressing), so a peer finds a QP's socket from its QPN.
#pragma once

#include <poll.h>

#include <atomic>
#include <cstdint>
#include <expected>

#include "io/packet.h"
#include "wire/addr.h"

namespace softrdma::io {

// The same-host one-sided path (io/shm/access_table.h): what a context publishes for its peers, and one
// operation a requester asks a backend to carry out itself.
struct MrInfo {
  uint32_t key, access, pd;
  uint64_t iova, length, addr;
};
struct QpInfo {
  uint32_t qpn, access, pd, dest_qpn;
  bool open;
  bool uc = false;  // a UC QP (else RC): a requester's op must be of the same type
};

// One contiguous piece of local memory (a gather or scatter list entry).
struct LocalSeg {
  void* addr;
  uint64_t len;
};

// A one-sided operation for the direct path.
struct DirectOp {
  bool read;         // READ (peer -> local) or WRITE (local -> peer)
  uint32_t src_qpn;  // the requesting QP (the peer QP must be connected to it)
  uint32_t dest_qpn;
  uint64_t va;
  uint32_t rkey;
  uint64_t length;
  const LocalSeg* segs;
  uint32_t nseg;
  bool shared_only = false;  // only by memcpy through pages the peer shares (no process_vm_* call)
  // An ATOMIC (8 bytes at va; the original value goes to the local segments): only through pages the peer
  // shares, with the CPU's atomics, as its responder runs them.
  bool atomic = false;
  bool cas = false;  // compare and swap (else fetch and add)
  uint64_t compare_add = 0, swap = 0;
  // A UC WRITE. No ACK tells its requester that the peer's responder has executed the packets the QP sent
  // before; that responder publishes the PSN after the last packet it took (publish_qp), and the op goes
  // one-sided only where that is `uc_psn` (the requester's next PSN), or where the QP has sent no packet.
  bool uc = false;
  bool uc_sent = false;
  uint32_t uc_psn = 0;
};

class Backend : public TxSink {
 public:
  // Opens a port (0 = any free one); returns its number or an errno.
  virtual std::expected<uint16_t, int> open_port(uint16_t port) = 0;
  virtual void close_port(uint16_t port) = 0;
  // Receives up to `max` packets without blocking. The packets stay valid until the next call.
  virtual uint32_t rx_burst(RxPacket* out, uint32_t max) = 0;
  // Whether the last rx_burst emptied every source it reads, so that another call right away would most
  // likely find nothing (a caller that loops over bursts stops then, instead of paying for a receive call
  // that finds nothing). False when unsure.
  virtual bool rx_drained() const { return false; }
  // The CLOCK_MONOTONIC time (ns) the last rx_burst read as it began, 0 if it read none: the caller's time
  // for the packets it returned, which saves it a clock read of its own (60 TSC cycles on the project's VM,
  // in each same-host ping-pong turnaround).
  virtual uint64_t rx_clock() const { return 0; }
  // A UD QP exists: from now on rx_burst reports each packet's TOS (traffic class) and TTL (hop limit),
  // which go into a UD receive's GRH. Off before: asking a socket for them cost an 8-byte ping-pong over
  // loopback 0.15-0.2 us per half round trip. Without them a packet says TOS 0 and TTL 64.
  virtual void want_ip_fields() {}
  // A file descriptor that is readable when rx_burst has something (-1 for backends polled by hand).
  virtual int poll_fd() const = 0;
  virtual const wire::Gid& local_addr() const = 0;
  // Called by a receiver that is about to sleep on poll_fd(): a backend whose senders skip the wake-up of a
  // busy receiver (io/shm) asks them for one from now on. Returns true if something may have arrived
  // before that (then do not sleep: call rx_burst). Thread-safe beside rx_burst.
  virtual bool arm_wakeup() { return false; }
  // Called by that receiver when it wakes up.
  virtual void woke() {}
  // For an application thread that sleeps until a packet comes (Context::wait_for_event), beside the
  // progress thread's own sleeps: fills `fds` with up to `max` descriptors that poll() reports readable
  // (level-triggered) while rx_burst has something, and asks for what wakes them (io/shm: its senders'
  // doorbells, as arm_wakeup). Returns their number; -1 when something may have come already (call rx_burst
  // instead of sleeping); 0 when this backend has none to offer (then the thread does not receive).
  // Unlike poll_fd(), no nap of the progress thread makes them deaf. Thread-safe beside rx_burst.
  virtual int app_wait_fds(pollfd* /*fds*/, int /*max*/) { return 0; }
  // Called by a receiver that poll_fd() woke with data: the next rx_burst reads every source (io/shm reads
  // its sockets only now and then while its rings are busy). Thread-safe beside rx_burst.
  virtual void sockets_readable() {}
  // Called by a receiver that is about to nap: sleep without watching poll_fd(), while an application
  // receives in its polls. Until the next arm_wakeup, poll_fd() need not become readable (io/udp takes its
  // sockets out of epoll meanwhile). Returns true when the nap must watch poll_fd() all the same (io/shm
  // while its rings carry packets: its packets from other hosts may then wait for a receive that reads
  // the sockets seldom). Thread-safe beside rx_burst and tx_burst.
  virtual bool nap() { return false; }
  // Called by the progress thread before each of its sleeps, outside the receive path's exclusion: slow
  // preparation that need not hold up receiving (io/shm warms up the pages of a ring it began to read).
  virtual void before_sleep() {}
  // An RC QP's ACK timeout ran out with packets to `dst` unacknowledged: whether the peer is still reading
  // what this context sent it, and has read some since the last call for that QP (`mark`: the QP's own
  // state, 0 at first, updated here). Then nothing need be lost: the packets wait in a queue that moves
  // (io/shm: the peer's ring). A backend whose packets leave at once says false.
  virtual bool peer_behind(const wire::Endpoint& /*dst*/, uint64_t* /*mark*/) { return false; }
  // Whether packets wake a sleeping receiver only after arm_wakeup (io/shm's doorbells, while its rings
  // carry packets). Thread-safe.
  virtual bool wakes_by_doorbell() const { return false; }
  // A connected QP names its peer (control path): a backend may get ready to reach it now rather than at
  // the first packet (io/shm maps and claims its ring, which takes milliseconds).
  virtual void prepare_peer(const wire::Endpoint& /*dst*/) {}
  // Payload bytes that packets on their way to `dst` can take up before the path drops some, as far as this
  // backend can tell: a socket's receive buffer, taken to be as large at the peer as here (and exactly so
  // for READ responses, which come to this context's own). 0: no such bound (a path that waits for room).
  // An RC QP keeps its window within it (Context::window_for). Control path.
  virtual uint64_t inflight_cap(const wire::Endpoint& /*dst*/) { return 0; }

  // The same-host one-sided path. A backend that has it publishes the context's MRs and QPs (control path,
  // serialised by the caller; withdraw_mr waits for peers' accesses in flight) and carries out a one-sided
  // operation on a peer's memory itself: 0 when the data moved, 1 when it moved through pages the peer
  // shares (a memcpy, or a CPU atomic), -1 when it must go the ordinary way. The defaults have no such path.
  virtual void publish_mr(const MrInfo& /*mr*/) {}
  virtual void withdraw_mr(uint32_t /*key*/) {}
  // After a withdrawn MR is gone from this process's responders too: gives back what publish_mr took.
  virtual void forget_mr(uint32_t /*key*/) {}
  // For an open UC QP, also where its responder stores the PSN after each packet it took (release), which
  // peers read before a one-sided WRITE (DirectOp::uc); null when there is none (RC, closed, no room).
  virtual std::atomic<uint32_t>* publish_qp(const QpInfo& /*qp*/) { return nullptr; }
  virtual int direct(const wire::Endpoint& /*dst*/, const DirectOp& /*op*/) { return -1; }
};

}  // namespace softrdma::io
