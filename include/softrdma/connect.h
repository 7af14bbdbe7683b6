// Connecting an RC or UC queue pair without rdma_cm: the two sides exchange what each needs (QPN, PSN,
// GID, and optionally a buffer's address and rkey) over a TCP connection, then move their QPs to RTS, as
// the ibv_*_pingpong programs and perftest do.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "softrdma/softrdma.h"

namespace softrdma {

struct PeerInfo {
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint8_t gid[16] = {};
  uint64_t addr = 0;  // a buffer the peer may access, 0 when none
  uint32_t rkey = 0;
  uint32_t mtu = 0;   // bytes
  uint64_t user = 0;  // one value of the program's own (the demo: its largest message size)
};

// The local half of PeerInfo for `qp` (a random PSN) and, optionally, `mr`.
PeerInfo local_info(const Context& ctx, const QueuePair& qp, const MemoryRegion* mr);

// TCP side channel. listen_tcp binds `addr` ("0.0.0.0", "127.0.0.1") at `port` (0: any) and reports the
// bound port; the others return a connected fd. Errors are errno values.
Result<int> listen_tcp(const char* addr, uint16_t* port);
Result<int> accept_tcp(int listen_fd);
Result<int> connect_tcp(const char* host, uint16_t port);
Result<PeerInfo> exchange(int fd, const PeerInfo& mine);
Result<void> send_all(int fd, const void* p, size_t n);
Result<void> recv_all(int fd, void* p, size_t n);

struct ConnectOptions {
  uint32_t access = kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic;
  uint8_t timeout = 14;  // 4.096 us x 2^14 = 67 ms, perftest's default
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  uint8_t min_rnr_timer = 1;
  uint8_t rd_atomic = 16;
};

// INIT -> RTR -> RTS towards `peer`; the path MTU is the smaller of both sides' and the device's.
Result<void> connect_qp(const Context& ctx, QueuePair& qp, const PeerInfo& mine, const PeerInfo& peer,
                        const ConnectOptions& opt = {});

// For example programs and tools: the value, or "<prog>: <what>: <error>" on stderr and exit(1).
[[noreturn]] void exit_with(const char* what, int err);
template <typename T>
T or_exit(Result<T> r, const char* what) {
  if (!r) exit_with(what, r.error());
  return std::move(*r);
}
inline void or_exit(Result<void> r, const char* what) {
  if (!r) exit_with(what, r.error());
}

// A non-negative number with an optional k/m suffix (x 1024, x 1048576); false if `text` is not one.
bool parse_size(const char* text, uint64_t* out);

// The main() of a two-sided example program (the demo, the soak):
//   {"server"}              listens on every address, prints "listening on 0.0.0.0:PORT", runs `server`;
//   {"client", HOST, PORT}  runs `client`;
//   {}                      both on 127.0.0.1, the server in a child process.
// server(listen_fd, ready_fd) writes a byte to ready_fd (-1 when alone) once it can accept. Returns the
// exit status (2 with `usage` on stderr for other arguments).
int run_sides(const std::vector<std::string>& args, const char* usage,
              const std::function<int(int listen_fd, int ready_fd)>& server,
              const std::function<int(const char* host, uint16_t port)>& client);

}  // namespace softrdma
