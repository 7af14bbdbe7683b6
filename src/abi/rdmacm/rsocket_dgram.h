// Datagram rsockets (SOCK_DGRAM, udpong): a UD QP whose peers are found through a UDP socket, which is
// also the rsocket's descriptor (rsocket_dgram.cc). rsocket.cc keeps the descriptor table and the lock:
// every function here runs under the socket's lock, which a blocking call releases while it sleeps.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <mutex>

namespace softrdma::rdmacm::dgram {

struct Dgram;

// A datagram rsocket of this domain; its descriptor (the UDP socket) in *fd. nullptr with errno.
Dgram* create(int domain, int* fd);
void destroy(Dgram* d);

int bind(Dgram* d, const sockaddr* addr, socklen_t len);
// Sets the default destination (rsend) and starts finding it.
int connect(Dgram* d, const sockaddr* addr, socklen_t len);
int getsockname(Dgram* d, sockaddr* addr, socklen_t* len);
int getpeername(Dgram* d, sockaddr* addr, socklen_t* len);
int setsockopt(Dgram* d, int level, int name, const void* val, socklen_t len);

// One datagram from the iovecs to dst (nullptr: the connected destination).
ssize_t send(Dgram* d, std::unique_lock<std::mutex>& lk, const iovec* iov, int iovcnt, const sockaddr* dst,
             bool nonblock);
// One datagram into the iovecs (the rest of a longer one is dropped); its sender in src if asked.
ssize_t recv(Dgram* d, std::unique_lock<std::mutex>& lk, const iovec* iov, int iovcnt, sockaddr* src,
             socklen_t* srclen, bool nonblock, bool peek);

// rpoll: the state now, and the fds to sleep on (at most 2) with the CQ armed.
short revents(Dgram* d, short events);
int sleep_fds(Dgram* d, pollfd* out);
void woken(Dgram* d);

}  // namespace softrdma::rdmacm::dgram
