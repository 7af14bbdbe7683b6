// What this librdmacm does not do yet, failing as it must rather than pretending:
// - rsockets (rsocket.cc, rsocket_dgram.cc) over IPv6 or AF_IB addresses: EAFNOSUPPORT, as the rest of
//   this librdmacm is IPv4 only.
// - multicast: softrdma's verbs have none (ibv_attach_mcast fails with EOPNOTSUPP).
// - ECE (enhanced connection establishment): the handshake carries no ECE; the remote's is all zero.
#include <cerrno>
#include <cstring>

#include "abi/rdmacm/cm.h"

namespace {
int notsupp() {
  errno = EOPNOTSUPP;
  return -1;
}
}  // namespace

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
