// What this librdmacm does not do yet, failing as it must rather than pretending:
// - rsockets (issue 4, next step): rsocket() fails with ENOSYS, so no descriptor is ever an rsocket and
//   every other r* call on one fails with ENOSYS too. rpoll and rselect are the exception: on descriptors
//   that are not rsockets rdma-core's pass them to poll/select, which, with no rsockets, is all of them
//   (rping, udaddy, ucmatose, cmtime import rpoll through shared helper code).
// - multicast: softrdma's verbs have none (ibv_attach_mcast fails with EOPNOTSUPP).
// - ECE (enhanced connection establishment): the handshake carries no ECE; the remote's is all zero.
#pragma GCC visibility push(default)
#include <rdma/rsocket.h>
#pragma GCC visibility pop

#include <poll.h>
#include <sys/select.h>

#include <cerrno>
#include <cstring>

#include "abi/rdmacm/cm.h"

namespace {
int nosys() {
  errno = ENOSYS;
  return -1;
}
int notsupp() {
  errno = EOPNOTSUPP;
  return -1;
}
}  // namespace

SR_EXPORT int rsocket(int, int, int) { return nosys(); }
SR_EXPORT int rbind(int, const sockaddr*, socklen_t) { return nosys(); }
SR_EXPORT int rlisten(int, int) { return nosys(); }
SR_EXPORT int raccept(int, sockaddr*, socklen_t*) { return nosys(); }
SR_EXPORT int rconnect(int, const sockaddr*, socklen_t) { return nosys(); }
SR_EXPORT int rshutdown(int, int) { return nosys(); }
SR_EXPORT int rclose(int) { return nosys(); }
SR_EXPORT ssize_t rrecv(int, void*, size_t, int) { return nosys(); }
SR_EXPORT ssize_t rrecvfrom(int, void*, size_t, int, sockaddr*, socklen_t*) { return nosys(); }
SR_EXPORT ssize_t rrecvmsg(int, msghdr*, int) { return nosys(); }
SR_EXPORT ssize_t rsend(int, const void*, size_t, int) { return nosys(); }
SR_EXPORT ssize_t rsendto(int, const void*, size_t, int, const sockaddr*, socklen_t) { return nosys(); }
SR_EXPORT ssize_t rsendmsg(int, const msghdr*, int) { return nosys(); }
SR_EXPORT ssize_t rread(int, void*, size_t) { return nosys(); }
SR_EXPORT ssize_t rreadv(int, const iovec*, int) { return nosys(); }
SR_EXPORT ssize_t rwrite(int, const void*, size_t) { return nosys(); }
SR_EXPORT ssize_t rwritev(int, const iovec*, int) { return nosys(); }
SR_EXPORT int rgetpeername(int, sockaddr*, socklen_t*) { return nosys(); }
SR_EXPORT int rgetsockname(int, sockaddr*, socklen_t*) { return nosys(); }
SR_EXPORT int rsetsockopt(int, int, int, const void*, socklen_t) { return nosys(); }
SR_EXPORT int rgetsockopt(int, int, int, void*, socklen_t*) { return nosys(); }
SR_EXPORT int rfcntl(int, int, ...) { return nosys(); }
SR_EXPORT off_t riomap(int, void*, size_t, int, int, off_t) { return nosys(); }
SR_EXPORT int riounmap(int, void*, size_t) { return nosys(); }
SR_EXPORT size_t riowrite(int, const void*, size_t, off_t, int) { return static_cast<size_t>(nosys()); }

SR_EXPORT int rpoll(pollfd* fds, nfds_t nfds, int timeout) { return poll(fds, nfds, timeout); }
SR_EXPORT int rselect(int nfds, fd_set* readfds, fd_set* writefds, fd_set* exceptfds, timeval* timeout) {
  return select(nfds, readfds, writefds, exceptfds, timeout);
}

SR_EXPORT int rdma_join_multicast(rdma_cm_id*, sockaddr*, void*) { return notsupp(); }
SR_EXPORT int rdma_join_multicast_ex(rdma_cm_id*, rdma_cm_join_mc_attr_ex*, void*) { return notsupp(); }
SR_EXPORT int rdma_leave_multicast(rdma_cm_id*, sockaddr*) { return notsupp(); }

SR_EXPORT int rdma_set_local_ece(rdma_cm_id* id, ibv_ece* ece) {
  if (!id || !ece) {
    errno = EINVAL;
    return -1;
  }
  return notsupp();
}

SR_EXPORT int rdma_get_remote_ece(rdma_cm_id* id, ibv_ece* ece) {
  if (!id || !ece) {
    errno = EINVAL;
    return -1;
  }
  memset(ece, 0, sizeof *ece);  // vendor_id 0: the peer offered none
  return 0;
}
