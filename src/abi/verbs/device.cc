// Devices, contexts and the queries: ibv_get_device_list .. ibv_query_gid_type, with rxe's conventions
// (ABI.md "Device conventions"): one device sr_<ifname> per interface with an address, port 1 ACTIVE on an
// Ethernet link, RoCE v2 GIDs (index 1 the IPv4-mapped one), one pkey 0xFFFF.
#include <endian.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "abi/verbs/abi.h"

namespace softrdma::abi {
namespace {

constexpr uint32_t kVendorId = 0xFFFFFF;  // rxe's; perftest's mlx5/EFA part IDs must be avoided (ABI.md)

// The ops pointer of every device (verbs_device::ops): zeros, matched by no provider.
const uint64_t kNoProviderOps[16] = {};

std::mutex g_devices_mu;
// Never freed (nor destroyed at exit): device pointers stay valid for the process's lifetime.
std::vector<Device*>& g_devices = *new std::vector<Device*>;

bool same_device(const io::DeviceInfo& a, const io::DeviceInfo& b) {
  if (a.name != b.name || a.ifindex != b.ifindex || a.if_mtu != b.if_mtu || a.node_guid != b.node_guid ||
      a.active != b.active || a.gids.size() != b.gids.size())
    return false;
  for (size_t i = 0; i < a.gids.size(); ++i)
    if (a.gids[i].gid != b.gids[i].gid || a.gids[i].roce_v2 != b.gids[i].roce_v2) return false;
  return true;
}

// A device's info never changes once handed out (contexts and other threads read it without a lock):
// when the interface changed (address, MTU, state), the listing gets a new device of the same name.
Device* device_for(const io::DeviceInfo& info) {
  for (auto it = g_devices.rbegin(); it != g_devices.rend(); ++it) {
    if (info.name != (*it)->dev.name) continue;
    if (same_device(*(*it)->info, info)) return *it;
    break;
  }
  auto* d = new Device{};
  d->info = new io::DeviceInfo(info);
  d->index = info.ifindex;
  d->ops = kNoProviderOps;
  d->dev.node_type = IBV_NODE_CA;
  d->dev.transport_type = IBV_TRANSPORT_IB;
  snprintf(d->dev.name, sizeof d->dev.name, "%s", info.name.c_str());
  snprintf(d->dev.dev_name, sizeof d->dev.dev_name, "uverbs%d", d->index);
  snprintf(d->dev.dev_path, sizeof d->dev.dev_path, "/sys/class/infiniband_verbs/uverbs%d", d->index);
  snprintf(d->dev.ibdev_path, sizeof d->dev.ibdev_path, "/sys/class/infiniband/%s", info.name.c_str());
  g_devices.push_back(d);
  return d;
}

bool is_roce_v2(const io::GidEntry& g) { return g.roce_v2; }

void fill_port_attr(const io::DeviceInfo& info, ibv_port_attr* a) {
  *a = {};
  a->state = info.active ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
  a->max_mtu = IBV_MTU_4096;
  a->active_mtu = static_cast<ibv_mtu>(info.active_mtu_enum);
  a->gid_tbl_len = static_cast<int>(info.gids.size());
  a->port_cap_flags = IBV_PORT_CM_SUP;  // 0x10000, as rxe
  a->max_msg_sz = static_cast<uint32_t>(core::kMaxMsgSize);
  a->pkey_tbl_len = 1;
  a->max_vl_num = 1;
  a->active_width = 1;                  // 1X (rdma-core's IBV_WIDTH_1X, not in the public header)
  a->active_speed = 32;                 // EDR, 25 Gb/s per lane
  a->phys_state = info.active ? 5 : 3;  // LinkUp : Disabled
  a->link_layer = IBV_LINK_LAYER_ETHERNET;
}

int query_port_len(ibv_context* context, uint8_t port_num, ibv_port_attr* attr, size_t len) {
  if (port_num != 1 || !attr) return EINVAL;
  ibv_port_attr a;
  fill_port_attr(*to_ctx(context)->device->info, &a);
  std::memcpy(attr, &a, std::min(len, sizeof a));
  return 0;
}

void fill_device_attr(const Device* d, ibv_device_attr* a) {
  *a = {};
  snprintf(a->fw_ver, sizeof a->fw_ver, "softrdma %d.%d.%d", 0, 1, 0);
  a->node_guid = htobe64(d->info->node_guid);
  a->sys_image_guid = a->node_guid;
  a->max_mr_size = ~0ull;
  a->page_size_cap = 0xfffff000;
  a->vendor_id = kVendorId;
  a->vendor_part_id = 0;
  a->hw_ver = 0;
  a->max_qp = core::kMaxQp;
  a->max_qp_wr = core::kMaxQpWr;
  a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SYS_IMAGE_GUID;
  a->max_sge = core::kMaxSge;
  a->max_sge_rd = core::kMaxSge;
  a->max_cq = core::kMaxCq;
  a->max_cqe = core::kMaxCqe;
  a->max_mr = core::kMaxMr;
  a->max_pd = core::kMaxPd;
  a->max_qp_rd_atom = core::kMaxRdAtomic;
  a->max_qp_init_rd_atom = core::kMaxRdAtomic;
  a->max_res_rd_atom = core::kMaxRdAtomic * 1024;
  a->atomic_cap = IBV_ATOMIC_HCA;
  a->max_ah = core::kMaxAh;
  a->max_srq = core::kMaxSrq;
  a->max_srq_wr = core::kMaxQpWr;
  a->max_srq_sge = core::kMaxSge;
  a->max_pkeys = 1;
  a->local_ca_ack_delay = 15;
  a->phys_port_cnt = 1;
}

int query_device_ex(ibv_context* context, const ibv_query_device_ex_input* input, ibv_device_attr_ex* attr,
                    size_t attr_size) {
  if (input && input->comp_mask) return EINVAL;
  if (attr_size < sizeof(attr->orig_attr)) return EINVAL;
  ibv_device_attr_ex a{};
  fill_device_attr(to_ctx(context)->device, &a.orig_attr);
  a.device_cap_flags_ex = a.orig_attr.device_cap_flags;
  a.raw_packet_caps = 0;
  std::memcpy(attr, &a, std::min(attr_size, sizeof a));
  return 0;
}

int gid_entry(Context* ctx, uint32_t port_num, uint32_t index, ibv_gid_entry* out) {
  const io::DeviceInfo& info = *ctx->device->info;
  if (port_num != 1 || index >= info.gids.size()) return EINVAL;
  const io::GidEntry& g = info.gids[index];
  if (g.gid.is_zero()) return ENODATA;
  *out = {};
  std::memcpy(out->gid.raw, g.gid.raw.data(), 16);
  out->gid_index = index;
  out->port_num = port_num;
  out->gid_type = is_roce_v2(g) ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_ROCE_V1;
  out->ndev_ifindex = static_cast<uint32_t>(info.ifindex);
  return 0;
}

}  // namespace
}  // namespace softrdma::abi

namespace io = softrdma::io;
namespace core = softrdma::core;
using namespace softrdma::abi;
using softrdma::abi::Context;

ibv_device** ibv_get_device_list(int* num_devices) {
  std::lock_guard g(g_devices_mu);
  std::vector<io::DeviceInfo> infos = io::list_devices();
  auto** list = static_cast<ibv_device**>(calloc(infos.size() + 1, sizeof(ibv_device*)));
  if (!list) return fail<ibv_device*>(ENOMEM);
  for (size_t i = 0; i < infos.size(); ++i) list[i] = &device_for(infos[i])->dev;
  if (num_devices) *num_devices = static_cast<int>(infos.size());
  return list;
}

void ibv_free_device_list(ibv_device** list) { free(list); }

const char* ibv_get_device_name(ibv_device* device) { return device ? device->name : nullptr; }

__be64 ibv_get_device_guid(ibv_device* device) { return htobe64(to_dev(device)->info->node_guid); }

int ibv_get_device_index(ibv_device* device) { return to_dev(device)->index; }

ibv_context* ibv_open_device(ibv_device* device) {
  Device* d = to_dev(device);
  const int gid_index = d->info->gids.size() > 1 ? 1 : 0;
  auto native = softrdma::Context::open(d->info->name, {.gid_index = gid_index});
  if (!native) return fail<ibv_context>(native.error());
  auto* ctx = new Context{};
  ctx->device = d;
  ctx->native = native->release();
  ctx->core = ctx->native->core();
  ctx->gid_index = gid_index;
  ibv_context& c = ctx->vctx.context;
  c.device = device;
  c.cmd_fd = -1;
  c.async_fd = ctx->core->async_fd();
  // rdma-core's async fd blocks until the application makes it non-blocking (UCX does; ibv_asyncwatch
  // relies on ibv_get_async_event blocking). The core reads it only when an event is queued.
  fcntl(c.async_fd, F_SETFL, fcntl(c.async_fd, F_GETFL) & ~O_NONBLOCK);
  c.num_comp_vectors = 1;
  pthread_mutex_init(&c.mutex, nullptr);
  c.abi_compat = __VERBS_ABI_IS_EXTENDED;
  ctx->vctx.sz = sizeof(verbs_context);
  ctx->vctx.query_port = query_port_len;
  ctx->vctx.query_device_ex = query_device_ex;
  fill_ops(ctx);
  return &c;
}

int ibv_close_device(ibv_context* context) {
  Context* ctx = to_ctx(context);
  delete ctx->native;  // stops the progress thread, closes the socket
  pthread_mutex_destroy(&context->mutex);
  delete ctx;
  return 0;
}

int ibv_query_device(ibv_context* context, ibv_device_attr* device_attr) {
  fill_device_attr(to_ctx(context)->device, device_attr);
  return 0;
}

// The exported entry point behind the ibv_query_port macro's fallback: the 48-byte struct of old.
int ibv_query_port(ibv_context* context, uint8_t port_num, _compat_ibv_port_attr* port_attr) {
  return query_port_len(context, port_num, reinterpret_cast<ibv_port_attr*>(port_attr), 48);
}

int _ibv_query_gid_ex(ibv_context* context, uint32_t port_num, uint32_t gid_index, ibv_gid_entry* entry,
                      uint32_t flags, size_t entry_size) {
  if (flags || !entry) return EINVAL;
  ibv_gid_entry e;
  if (int err = gid_entry(to_ctx(context), port_num, gid_index, &e)) return err;
  std::memcpy(entry, &e, std::min(entry_size, sizeof e));
  return 0;
}

ssize_t _ibv_query_gid_table(ibv_context* context, ibv_gid_entry* entries, size_t max_entries, uint32_t flags,
                             size_t entry_size) {
  if (flags || entry_size < sizeof(ibv_gid_entry)) return -EINVAL;
  Context* ctx = to_ctx(context);
  size_t n = 0;
  for (uint32_t i = 0; i < ctx->device->info->gids.size(); ++i) {
    ibv_gid_entry e;
    if (gid_entry(ctx, 1, i, &e)) continue;
    if (n == max_entries) return -EINVAL;
    std::memcpy(reinterpret_cast<char*>(entries) + n * entry_size, &e, sizeof e);
    ++n;
  }
  return static_cast<ssize_t>(n);
}

int ibv_query_gid(ibv_context* context, uint8_t port_num, int index, ibv_gid* gid) {
  ibv_gid_entry e;
  const int err = index < 0 ? EINVAL : gid_entry(to_ctx(context), port_num, static_cast<uint32_t>(index), &e);
  if (err == ENODATA) {
    std::memset(gid, 0, sizeof *gid);
    return 0;
  }
  if (err) {
    errno = err;
    return -1;
  }
  *gid = e.gid;
  return 0;
}

// enum ibv_gid_type_sysfs (rdma-core's driver.h): IB and RoCE v1 -> 0, RoCE v2 -> 1.
SR_EXPORT int ibv_query_gid_type(ibv_context* context, uint8_t port_num, unsigned int index, uint32_t* type) {
  ibv_gid_entry e;
  const int err = gid_entry(to_ctx(context), port_num, index, &e);
  if (err && err != ENODATA) {
    errno = err;
    return -1;
  }
  const io::DeviceInfo& info = *to_ctx(context)->device->info;
  *type = is_roce_v2(info.gids[index]) ? 1 : 0;
  return 0;
}

int ibv_query_pkey(ibv_context*, uint8_t port_num, int index, __be16* pkey) {
  if (port_num != 1 || index != 0) {
    errno = EINVAL;
    return -1;
  }
  *pkey = htobe16(0xFFFF);
  return 0;
}

int ibv_get_pkey_index(ibv_context*, uint8_t port_num, __be16 pkey) {
  if (port_num == 1 && (be16toh(pkey) & 0x7FFF) == 0x7FFF) return 0;
  errno = ENOENT;
  return -1;
}

// sysfs: real files when they exist; the devices' own directory has only board_id.
SR_EXPORT const char* ibv_get_sysfs_path() {
  static std::string path = [] {
    const char* env = getenv("SYSFS_PATH");
    std::string p = env && *env ? env : "/sys";
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    return p;
  }();
  return path.c_str();
}

SR_EXPORT int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size) {
  if (!dir || !file || !buf || size == 0) return -1;
  std::string path = std::string(dir) + "/" + file;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (std::strncmp(dir, "/sys/class/infiniband/sr_", 25) == 0 && std::strcmp(file, "board_id") == 0) {
      const int n = snprintf(buf, size, "softrdma");
      return std::min<int>(n, static_cast<int>(size) - 1);
    }
    return -1;
  }
  ssize_t n = read(fd, buf, size);
  close(fd);
  if (n <= 0) return -1;
  if (static_cast<size_t>(n) == size) --n;
  buf[n] = 0;
  if (n > 0 && buf[n - 1] == '\n') buf[--n] = 0;
  return static_cast<int>(n);
}
