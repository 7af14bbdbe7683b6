// The rest of libibverbs' ABI: string and rate helpers, fork and import calls, the IBVERBS_1.0 compat
// entry points and the IBVERBS_PRIVATE_34 provider interface. What softrdma cannot do fails as rdma-core's
// dummy ops do (EOPNOTSUPP, or NULL with errno); what providers call at load time is a harmless no-op.
#include <cstdarg>

#include "abi/verbs/abi.h"

using namespace softrdma::abi;

// ---- strings ----

const char* ibv_node_type_str(ibv_node_type node_type) {
  static const char* const kNames[] = {"unknown",           "InfiniBand channel adapter",
                                       "InfiniBand switch", "InfiniBand router",
                                       "iWARP NIC",         "usNIC",
                                       "usNIC UDP",         "unspecified"};
  if (node_type < IBV_NODE_CA || node_type > IBV_NODE_UNSPECIFIED) return "unknown";
  return kNames[node_type];
}

const char* ibv_port_state_str(ibv_port_state port_state) {
  static const char* const kNames[] = {"no state change (NOP)", "down", "init", "armed", "active",
                                       "active defer"};
  if (port_state < IBV_PORT_NOP || port_state > IBV_PORT_ACTIVE_DEFER) return "unknown";
  return kNames[port_state];
}

const char* ibv_event_type_str(ibv_event_type event) {
  static const char* const kNames[] = {"CQ error",
                                       "local work queue catastrophic error",
                                       "invalid request local work queue error",
                                       "local access violation work queue error",
                                       "communication established",
                                       "send queue drained",
                                       "path migrated",
                                       "path migration request error",
                                       "local catastrophic error",
                                       "port active",
                                       "port error",
                                       "LID change",
                                       "P_Key change",
                                       "SM change",
                                       "SRQ catastrophic error",
                                       "SRQ limit reached",
                                       "last WQE reached",
                                       "client reregistration",
                                       "GID table change",
                                       "WQ fatal"};
  if (event < IBV_EVENT_CQ_ERR || event > IBV_EVENT_WQ_FATAL) return "unknown";
  return kNames[event];
}

const char* ibv_wc_status_str(ibv_wc_status status) {
  static const char* const kNames[] = {"success",
                                       "local length error",
                                       "local QP operation error",
                                       "local EE context operation error",
                                       "local protection error",
                                       "Work Request Flushed Error",
                                       "memory management operation error",
                                       "bad response error",
                                       "local access error",
                                       "remote invalid request error",
                                       "remote access error",
                                       "remote operation error",
                                       "transport retry counter exceeded",
                                       "RNR retry counter exceeded",
                                       "local RDD violation error",
                                       "remote invalid RD request",
                                       "aborted error",
                                       "invalid EE context number",
                                       "invalid EE context state",
                                       "fatal error",
                                       "response timeout error",
                                       "general error",
                                       "TM error",
                                       "TM rendezvous error"};
  if (status < IBV_WC_SUCCESS || status > IBV_WC_TM_RNDV_INCOMPLETE) return "unknown";
  return kNames[status];
}

// ---- rates ----

namespace {
struct RateRow {
  ibv_rate rate;
  int mult;  // of 2.5 Gb/s, 0 for rates that are not a multiple
  int mbps;
};
constexpr RateRow kRates[] = {
    {IBV_RATE_2_5_GBPS, 1, 2500},   {IBV_RATE_5_GBPS, 2, 5000},       {IBV_RATE_10_GBPS, 4, 10000},
    {IBV_RATE_20_GBPS, 8, 20000},   {IBV_RATE_30_GBPS, 12, 30000},    {IBV_RATE_40_GBPS, 16, 40000},
    {IBV_RATE_60_GBPS, 24, 60000},  {IBV_RATE_80_GBPS, 32, 80000},    {IBV_RATE_120_GBPS, 48, 120000},
    {IBV_RATE_14_GBPS, 0, 14062},   {IBV_RATE_56_GBPS, 0, 56250},     {IBV_RATE_112_GBPS, 0, 112500},
    {IBV_RATE_168_GBPS, 0, 168750}, {IBV_RATE_25_GBPS, 0, 25781},     {IBV_RATE_100_GBPS, 0, 103125},
    {IBV_RATE_200_GBPS, 0, 206250}, {IBV_RATE_300_GBPS, 0, 309375},   {IBV_RATE_28_GBPS, 0, 28125},
    {IBV_RATE_50_GBPS, 0, 53125},   {IBV_RATE_400_GBPS, 0, 425000},   {IBV_RATE_600_GBPS, 0, 637500},
    {IBV_RATE_800_GBPS, 0, 850000}, {IBV_RATE_1200_GBPS, 0, 1275000},
};
}  // namespace

int ibv_rate_to_mult(ibv_rate rate) {
  for (const RateRow& r : kRates)
    if (r.rate == rate && r.mult) return r.mult;
  return -1;
}

ibv_rate mult_to_ibv_rate(int mult) {
  for (const RateRow& r : kRates)
    if (r.mult && r.mult == mult) return r.rate;
  return IBV_RATE_MAX;
}

int ibv_rate_to_mbps(ibv_rate rate) {
  for (const RateRow& r : kRates)
    if (r.rate == rate) return r.mbps;
  return -1;
}

ibv_rate mbps_to_ibv_rate(int mbps) {
  for (const RateRow& r : kRates)
    if (r.mbps == mbps) return r.rate;
  return IBV_RATE_MAX;
}

// ---- fork: softrdma pins nothing in a kernel, so fork is always safe ----

int ibv_fork_init() { return 0; }
ibv_fork_status ibv_is_fork_initialized() { return IBV_FORK_UNNEEDED; }
SR_EXPORT int ibv_dontfork_range(void*, size_t) { return 0; }
SR_EXPORT int ibv_dofork_range(void*, size_t) { return 0; }

// ---- what softrdma does not do ----

int ibv_attach_mcast(ibv_qp*, const ibv_gid*, uint16_t) { return EOPNOTSUPP; }
int ibv_detach_mcast(ibv_qp*, const ibv_gid*, uint16_t) { return EOPNOTSUPP; }
int ibv_rereg_mr(ibv_mr*, int, ibv_pd*, void*, size_t, int) {
  errno = EOPNOTSUPP;
  return IBV_REREG_MR_ERR_INPUT;
}
ibv_mr* ibv_reg_dmabuf_mr(ibv_pd*, uint64_t, size_t, uint64_t, int, int) { return fail<ibv_mr>(EOPNOTSUPP); }
int ibv_resolve_eth_l2_from_gid(ibv_context*, ibv_ah_attr*, uint8_t[6], uint16_t*) { return EOPNOTSUPP; }
ibv_context* ibv_import_device(int) { return fail<ibv_context>(EOPNOTSUPP); }
ibv_pd* ibv_import_pd(ibv_context*, uint32_t) { return fail<ibv_pd>(EOPNOTSUPP); }
void ibv_unimport_pd(ibv_pd*) {}
ibv_mr* ibv_import_mr(ibv_pd*, uint32_t) { return fail<ibv_mr>(EOPNOTSUPP); }
void ibv_unimport_mr(ibv_mr*) {}
ibv_dm* ibv_import_dm(ibv_context*, uint32_t) { return fail<ibv_dm>(EOPNOTSUPP); }
void ibv_unimport_dm(ibv_dm*) {}
int ibv_query_ece(ibv_qp*, ibv_ece*) { return EOPNOTSUPP; }
int ibv_set_ece(ibv_qp*, ibv_ece*) { return EOPNOTSUPP; }
int ibv_query_qp_data_in_order(ibv_qp*, ibv_wr_opcode, uint32_t) { return 0; }

// Kernel-ABI struct copies (rdma-core's kern-abi.h, not shipped): the destination is cleared.
SR_EXPORT void ibv_copy_qp_attr_from_kern(ibv_qp_attr* dst, void*) { *dst = {}; }
SR_EXPORT void ibv_copy_ah_attr_from_kern(ibv_ah_attr* dst, void*) { *dst = {}; }
SR_EXPORT void ibv_copy_path_rec_from_kern(void*, void*) {}
SR_EXPORT void ibv_copy_path_rec_to_kern(void*, void*) {}

// ---- IBVERBS_PRIVATE_34: the provider interface (libmlx5/libefa link it; they never get a device) ----

extern "C" {
__attribute__((visibility("default"))) bool verbs_allow_disassociate_destroy = false;
}
SR_EXPORT void verbs_register_driver_34(const void*) {}
SR_EXPORT void __verbs_log(void*, uint32_t, const char*, ...) {}
SR_EXPORT void verbs_set_ops(void*, const void*) {}
SR_EXPORT void verbs_uninit_context(void*) {}
SR_EXPORT void* _verbs_init_and_alloc_context(void*, int, size_t, size_t, uint32_t) {
  return fail<void>(EOPNOTSUPP);
}
SR_EXPORT void* verbs_open_device(void*, void*) { return fail<void>(EOPNOTSUPP); }
SR_EXPORT int verbs_init_cq(void*, void*, void*, void*) { return EOPNOTSUPP; }
SR_EXPORT int execute_ioctl(void*, void*) { return EOPNOTSUPP; }
SR_EXPORT unsigned int __ioctl_final_num_attrs(unsigned int num_attrs, void*) { return num_attrs; }
SR_EXPORT int ibv_read_ibdev_sysfs_file(char*, size_t, void*, const char*, ...) {
  errno = EOPNOTSUPP;
  return -1;
}

#define SR_CMD_STUB(name) \
  SR_EXPORT int name() { return EOPNOTSUPP; }
SR_CMD_STUB(ibv_cmd_advise_mr)
SR_CMD_STUB(ibv_cmd_alloc_dm)
SR_CMD_STUB(ibv_cmd_alloc_mw)
SR_CMD_STUB(ibv_cmd_alloc_pd)
SR_CMD_STUB(ibv_cmd_attach_mcast)
SR_CMD_STUB(ibv_cmd_close_xrcd)
SR_CMD_STUB(ibv_cmd_create_ah)
SR_CMD_STUB(ibv_cmd_create_counters)
SR_CMD_STUB(ibv_cmd_create_cq)
SR_CMD_STUB(ibv_cmd_create_cq_ex)
SR_CMD_STUB(ibv_cmd_create_flow)
SR_CMD_STUB(ibv_cmd_create_flow_action_esp)
SR_CMD_STUB(ibv_cmd_create_qp)
SR_CMD_STUB(ibv_cmd_create_qp_ex)
SR_CMD_STUB(ibv_cmd_create_qp_ex2)
SR_CMD_STUB(ibv_cmd_create_rwq_ind_table)
SR_CMD_STUB(ibv_cmd_create_srq)
SR_CMD_STUB(ibv_cmd_create_srq_ex)
SR_CMD_STUB(ibv_cmd_create_wq)
SR_CMD_STUB(ibv_cmd_dealloc_mw)
SR_CMD_STUB(ibv_cmd_dealloc_pd)
SR_CMD_STUB(ibv_cmd_dereg_mr)
SR_CMD_STUB(ibv_cmd_destroy_ah)
SR_CMD_STUB(ibv_cmd_destroy_counters)
SR_CMD_STUB(ibv_cmd_destroy_cq)
SR_CMD_STUB(ibv_cmd_destroy_flow)
SR_CMD_STUB(ibv_cmd_destroy_flow_action)
SR_CMD_STUB(ibv_cmd_destroy_qp)
SR_CMD_STUB(ibv_cmd_destroy_rwq_ind_table)
SR_CMD_STUB(ibv_cmd_destroy_srq)
SR_CMD_STUB(ibv_cmd_destroy_wq)
SR_CMD_STUB(ibv_cmd_detach_mcast)
SR_CMD_STUB(ibv_cmd_free_dm)
SR_CMD_STUB(ibv_cmd_get_context)
SR_CMD_STUB(ibv_cmd_modify_cq)
SR_CMD_STUB(ibv_cmd_modify_flow_action_esp)
SR_CMD_STUB(ibv_cmd_modify_qp)
SR_CMD_STUB(ibv_cmd_modify_qp_ex)
SR_CMD_STUB(ibv_cmd_modify_srq)
SR_CMD_STUB(ibv_cmd_modify_wq)
SR_CMD_STUB(ibv_cmd_open_qp)
SR_CMD_STUB(ibv_cmd_open_xrcd)
SR_CMD_STUB(ibv_cmd_poll_cq)
SR_CMD_STUB(ibv_cmd_post_recv)
SR_CMD_STUB(ibv_cmd_post_send)
SR_CMD_STUB(ibv_cmd_post_srq_recv)
SR_CMD_STUB(ibv_cmd_query_context)
SR_CMD_STUB(ibv_cmd_query_device_any)
SR_CMD_STUB(ibv_cmd_query_mr)
SR_CMD_STUB(ibv_cmd_query_port)
SR_CMD_STUB(ibv_cmd_query_qp)
SR_CMD_STUB(ibv_cmd_query_srq)
SR_CMD_STUB(ibv_cmd_read_counters)
SR_CMD_STUB(ibv_cmd_reg_dm_mr)
SR_CMD_STUB(ibv_cmd_reg_dmabuf_mr)
SR_CMD_STUB(ibv_cmd_reg_mr)
SR_CMD_STUB(ibv_cmd_req_notify_cq)
SR_CMD_STUB(ibv_cmd_rereg_mr)
SR_CMD_STUB(ibv_cmd_resize_cq)

// ---- IBVERBS_1.0 compat versions (rdma-core's compat-1_0.c, for binaries linked before 2006) and
// ibv_register_driver@IBVERBS_1.1: they used other struct layouts, so they fail cleanly. ----

#define SR_COMPAT(ret, name, version, body)                                \
  extern "C" __attribute__((visibility("default"))) ret sr_compat_##name() \
      body __asm__(".symver sr_compat_" #name "," #name "@" version);
#define SR_COMPAT_NULL(name) SR_COMPAT(void*, name, "IBVERBS_1.0", { return fail<void>(EOPNOTSUPP); })
#define SR_COMPAT_INT(name) SR_COMPAT(int, name, "IBVERBS_1.0", { return EOPNOTSUPP; })
#define SR_COMPAT_VOID(name) SR_COMPAT(void, name, "IBVERBS_1.0", {})

SR_COMPAT_VOID(ibv_ack_async_event)
SR_COMPAT_VOID(ibv_ack_cq_events)
SR_COMPAT_NULL(ibv_alloc_pd)
SR_COMPAT_INT(ibv_attach_mcast)
SR_COMPAT_INT(ibv_close_device)
SR_COMPAT_NULL(ibv_create_ah)
SR_COMPAT_NULL(ibv_create_cq)
SR_COMPAT_NULL(ibv_create_qp)
SR_COMPAT_NULL(ibv_create_srq)
SR_COMPAT_INT(ibv_dealloc_pd)
SR_COMPAT_INT(ibv_dereg_mr)
SR_COMPAT_INT(ibv_destroy_ah)
SR_COMPAT_INT(ibv_destroy_cq)
SR_COMPAT_INT(ibv_destroy_qp)
SR_COMPAT_INT(ibv_destroy_srq)
SR_COMPAT_INT(ibv_detach_mcast)
SR_COMPAT_VOID(ibv_free_device_list)
SR_COMPAT_INT(ibv_get_async_event)
SR_COMPAT_INT(ibv_get_cq_event)
SR_COMPAT(uint64_t, ibv_get_device_guid, "IBVERBS_1.0", { return 0; })
SR_COMPAT_NULL(ibv_get_device_list)
SR_COMPAT_NULL(ibv_get_device_name)
SR_COMPAT_INT(ibv_modify_qp)
SR_COMPAT_INT(ibv_modify_srq)
SR_COMPAT_NULL(ibv_open_device)
SR_COMPAT_INT(ibv_query_device)
SR_COMPAT_INT(ibv_query_gid)
SR_COMPAT_INT(ibv_query_pkey)
SR_COMPAT_INT(ibv_query_port)
SR_COMPAT_INT(ibv_query_qp)
SR_COMPAT_INT(ibv_query_srq)
SR_COMPAT_NULL(ibv_reg_mr)
SR_COMPAT_INT(ibv_resize_cq)
SR_COMPAT(void, ibv_register_driver, "IBVERBS_1.1", {})
