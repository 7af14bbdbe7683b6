// The verbs devices as the CM sees them, through libibverbs' public API only: an address belongs to the
// device whose GID table holds it (RoCE v2: index 1 is ::ffff:a.b.c.d for IPv4).
#include <netinet/in.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "abi/rdmacm/cm.h"

namespace softrdma::rdmacm {
namespace {

struct Registry {
  std::vector<Device*> devices;  // every device of ibv_get_device_list, opened; kept for the process
  bool opened = false;
};

// Opens every device once (under mu()); a device that fails to open is left out. Never destroyed (not
// even at exit, where the vector's end would leave the devices unreachable: LeakSanitizer reports).
Registry& registry() {
  static Registry& r = *new Registry;
  if (r.opened) return r;
  r.opened = true;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) return r;
  for (int i = 0; i < n; ++i) {
    ibv_context* ctx = ibv_open_device(list[i]);
    if (!ctx) continue;
    auto* d = new Device;
    d->verbs = ctx;
    ibv_device_attr attr{};
    if (ibv_query_device(ctx, &attr) == 0) {
      d->max_responder_resources =
          static_cast<uint8_t>(attr.max_qp_rd_atom > 255 ? 255 : attr.max_qp_rd_atom);
      d->max_initiator_depth =
          static_cast<uint8_t>(attr.max_qp_init_rd_atom > 255 ? 255 : attr.max_qp_init_rd_atom);
    }
    ibv_port_attr port{};
    if (ibv_query_port(ctx, 1, &port) == 0) d->active_mtu = port.active_mtu;
    r.devices.push_back(d);
  }
  // The list may be freed: the opened contexts keep their devices (rdma-core's refcounting, ours are
  // immutable for the process).
  ibv_free_device_list(list);
  return r;
}

}  // namespace

ibv_gid gid_of(const sockaddr* addr) {
  ibv_gid g{};
  if (addr->sa_family == AF_INET) {
    const auto* sin = reinterpret_cast<const sockaddr_in*>(addr);
    g.raw[10] = g.raw[11] = 0xff;
    memcpy(&g.raw[12], &sin->sin_addr, 4);
  } else if (addr->sa_family == AF_INET6) {
    memcpy(g.raw, &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr, 16);
  }
  return g;
}

Device* find_device(const ibv_gid& gid, uint8_t* gid_index) {
  for (Device* d : registry().devices) {
    ibv_port_attr port{};
    if (ibv_query_port(d->verbs, 1, &port)) continue;
    for (int i = 0; i < port.gid_tbl_len && i < 256; ++i) {
      ibv_gid g{};
      if (ibv_query_gid(d->verbs, 1, i, &g) == 0 && memcmp(&g, &gid, sizeof g) == 0) {
        *gid_index = static_cast<uint8_t>(i);
        if (!d->pd) d->pd = ibv_alloc_pd(d->verbs);
        if (!d->pd) return nullptr;
        return d;
      }
    }
  }
  errno = ENODEV;
  return nullptr;
}

Device* const* all_devices(int* n) {
  Registry& r = registry();
  *n = static_cast<int>(r.devices.size());
  return r.devices.data();
}

}  // namespace softrdma::rdmacm
