// rdma_getaddrinfo: getaddrinfo's answer in rdma_addrinfo's shape, as rdma-core's (without ibacm, which
// only adds routes for InfiniBand): the first address, RC over RDMA_PS_TCP for a stream service, UD over
// RDMA_PS_UDP for a datagram one, unless the hints say otherwise. Errors are getaddrinfo's EAI_* codes.
#include <netdb.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "abi/rdmacm/cm.h"

namespace {

int copy_addr(sockaddr** dst, socklen_t* dst_len, const sockaddr* src, socklen_t len) {
  *dst = static_cast<sockaddr*>(malloc(len));
  if (!*dst) {
    errno = ENOMEM;
    return -1;
  }
  memcpy(*dst, src, len);
  *dst_len = len;
  return 0;
}

void to_hints(const rdma_addrinfo* rai, addrinfo* ai) {
  memset(ai, 0, sizeof *ai);
  if (rai->ai_flags & RAI_PASSIVE) ai->ai_flags = AI_PASSIVE;
  if (rai->ai_flags & RAI_NUMERICHOST) ai->ai_flags |= AI_NUMERICHOST;
  if (rai->ai_family != AF_IB) ai->ai_family = rai->ai_family;
  switch (rai->ai_qp_type) {
    case IBV_QPT_RC:
    case IBV_QPT_UC:
    case IBV_QPT_XRC_SEND:
    case IBV_QPT_XRC_RECV:
      ai->ai_socktype = SOCK_STREAM;
      break;
    case IBV_QPT_UD:
      ai->ai_socktype = SOCK_DGRAM;
      break;
    default:
      break;
  }
  switch (rai->ai_port_space) {
    case RDMA_PS_TCP:
      ai->ai_protocol = IPPROTO_TCP;
      break;
    case RDMA_PS_IPOIB:
    case RDMA_PS_UDP:
      ai->ai_protocol = IPPROTO_UDP;
      break;
    case RDMA_PS_IB:
      ai->ai_protocol = ai->ai_socktype == SOCK_DGRAM ? IPPROTO_UDP : IPPROTO_TCP;
      break;
    default:
      break;
  }
}

int from_addrinfo(const rdma_addrinfo* hints, const addrinfo* ai, rdma_addrinfo* rai) {
  if (hints->ai_qp_type)
    rai->ai_qp_type = hints->ai_qp_type;
  else
    rai->ai_qp_type = ai->ai_socktype == SOCK_DGRAM ? IBV_QPT_UD : IBV_QPT_RC;
  if (hints->ai_port_space)
    rai->ai_port_space = hints->ai_port_space;
  else
    rai->ai_port_space = ai->ai_protocol == IPPROTO_UDP ? RDMA_PS_UDP : RDMA_PS_TCP;
  rai->ai_family = ai->ai_family;
  if (ai->ai_flags & AI_PASSIVE) {
    rai->ai_flags = RAI_PASSIVE;
    if (ai->ai_canonname) rai->ai_src_canonname = strdup(ai->ai_canonname);
    return copy_addr(&rai->ai_src_addr, &rai->ai_src_len, ai->ai_addr, ai->ai_addrlen);
  }
  if (ai->ai_canonname) rai->ai_dst_canonname = strdup(ai->ai_canonname);
  return copy_addr(&rai->ai_dst_addr, &rai->ai_dst_len, ai->ai_addr, ai->ai_addrlen);
}

}  // namespace

SR_EXPORT void rdma_freeaddrinfo(rdma_addrinfo* res) {
  while (res) {
    rdma_addrinfo* next = res->ai_next;
    free(res->ai_connect);
    free(res->ai_route);
    free(res->ai_src_canonname);
    free(res->ai_dst_canonname);
    free(res->ai_src_addr);
    free(res->ai_dst_addr);
    free(res);
    res = next;
  }
}

SR_EXPORT int rdma_getaddrinfo(const char* node, const char* service, const rdma_addrinfo* hints,
                               rdma_addrinfo** res) {
  if ((!node && !service && !hints) || !res) {
    errno = EINVAL;
    return -1;
  }
  static const rdma_addrinfo kNoHints{};
  auto* rai = static_cast<rdma_addrinfo*>(calloc(1, sizeof(rdma_addrinfo)));
  if (!rai) {
    errno = ENOMEM;
    return -1;
  }
  int ret = 0;
  const rdma_addrinfo* h = hints ? hints : &kNoHints;
  if (node || service) {
    addrinfo ai_hints;
    addrinfo* ai = nullptr;
    if (hints) to_hints(hints, &ai_hints);
    ret = getaddrinfo(node, service, hints ? &ai_hints : nullptr, &ai);
    if (!ret) {
      ret = from_addrinfo(h, ai, rai);
      freeaddrinfo(ai);
    }
  } else {
    rai->ai_flags = h->ai_flags;
    rai->ai_family = h->ai_family;
    rai->ai_qp_type = h->ai_qp_type;
    rai->ai_port_space = h->ai_port_space;
    if (h->ai_dst_len) ret = copy_addr(&rai->ai_dst_addr, &rai->ai_dst_len, h->ai_dst_addr, h->ai_dst_len);
  }
  if (!ret && !rai->ai_src_len && h->ai_src_len)
    ret = copy_addr(&rai->ai_src_addr, &rai->ai_src_len, h->ai_src_addr, h->ai_src_len);
  if (ret) {
    rdma_freeaddrinfo(rai);
    return ret;
  }
  *res = rai;
  return 0;
}
