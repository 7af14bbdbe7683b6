// The interface every packet backend offers the core: UDP sockets (io/udp) or the in-memory network of the
// tests (io/sim). A backend owns "ports": UDP ports of the context's address; the upper 16 bits of a QPN
// are the port of its socket (ARCHITECTURE.md, Addressing), so a peer finds a QP's socket from its QPN.
#pragma once

#include <cstdint>
#include <expected>

#include "io/packet.h"
#include "wire/addr.h"

namespace softrdma::io {

class Backend : public TxSink {
 public:
  // Opens a port (0 = any free one); returns its number or an errno.
  virtual std::expected<uint16_t, int> open_port(uint16_t port) = 0;
  virtual void close_port(uint16_t port) = 0;
  // Receives up to `max` packets without blocking. The packets stay valid until the next call.
  virtual uint32_t rx_burst(RxPacket* out, uint32_t max) = 0;
  // A file descriptor that is readable when rx_burst has something (-1 for backends polled by hand).
  virtual int poll_fd() const = 0;
  virtual const wire::Gid& local_addr() const = 0;
  // Called by a receiver that is about to sleep on poll_fd(): a backend whose senders skip the wake-up of a
  // busy receiver (io/shm) asks them for one from now on. Returns true if something may have arrived
  // before that (then do not sleep: call rx_burst). Thread-safe beside rx_burst.
  virtual bool arm_wakeup() { return false; }
  // Called by that receiver when it wakes up.
  virtual void woke() {}
  // A connected QP names its peer (control path): a backend may get ready to reach it now rather than at
  // the first packet (io/shm maps and claims its ring, which takes milliseconds).
  virtual void prepare_peer(const wire::Endpoint& /*dst*/) {}
};

}  // namespace softrdma::io
