// The library loaded with dlopen (as plugins and language bindings load libibverbs), not at start-up: its
// thread-locals then live in dynamic TLS, which a build with the initial-exec TLS model could not get (its
// ~26 KiB exceed glibc's static TLS reserve). Four threads each send UD datagrams to a QP of their own
// through the loaded library and check what arrives.
//   dlopen_test LIBRARY
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define kThreads 4
#define kRounds 200
#define kMsg 64
#define kGrh 40
#define kQkey 0x11111111u

static struct {
  struct ibv_device** (*get_device_list)(int*);
  const char* (*get_device_name)(struct ibv_device*);
  struct ibv_context* (*open_device)(struct ibv_device*);
  struct ibv_pd* (*alloc_pd)(struct ibv_context*);
  struct ibv_mr* (*reg_mr)(struct ibv_pd*, void*, size_t, int);
  struct ibv_cq* (*create_cq)(struct ibv_context*, int, void*, struct ibv_comp_channel*, int);
  struct ibv_qp* (*create_qp)(struct ibv_pd*, struct ibv_qp_init_attr*);
  int (*modify_qp)(struct ibv_qp*, struct ibv_qp_attr*, int);
  int (*query_gid)(struct ibv_context*, uint8_t, int, union ibv_gid*);
  struct ibv_ah* (*create_ah)(struct ibv_pd*, struct ibv_ah_attr*);
} v;

static struct ibv_context* ctx;
static struct ibv_pd* pd;

static int fail(const char* what) {
  fprintf(stderr, "dlopen_test: %s\n", what);
  return 1;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

// Polls until `want` completions came (each successful), for at most 5 s.
static int wait_for(struct ibv_cq* cq, int want) {
  const double end = now_s() + 5;
  struct ibv_wc wc;
  while (want > 0) {
    const int n = ibv_poll_cq(cq, 1, &wc);
    if (n < 0 || (n == 1 && wc.status != IBV_WC_SUCCESS)) return -1;
    want -= n;
    if (n == 0 && now_s() > end) return -1;
  }
  return 0;
}

static void* run(void* arg) {
  const long id = (long)arg;
  char* buf = calloc(1, kGrh + kMsg + kMsg);
  struct ibv_mr* mr = buf ? v.reg_mr(pd, buf, kGrh + 2 * kMsg, IBV_ACCESS_LOCAL_WRITE) : NULL;
  struct ibv_cq* cq = v.create_cq(ctx, 16, NULL, NULL, 0);
  if (!mr || !cq) return "reg_mr or create_cq failed";
  struct ibv_qp_init_attr ia = {
      .send_cq = cq,
      .recv_cq = cq,
      .qp_type = IBV_QPT_UD,
      .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
  struct ibv_qp* qp = v.create_qp(pd, &ia);
  if (!qp) return "create_qp failed";
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1, .qkey = kQkey};
  if (v.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
    return "to INIT failed";
  a.qp_state = IBV_QPS_RTR;
  if (v.modify_qp(qp, &a, IBV_QP_STATE)) return "to RTR failed";
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0;
  if (v.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN)) return "to RTS failed";
  union ibv_gid gid;
  if (v.query_gid(ctx, 1, 1, &gid)) return "query_gid failed";
  struct ibv_ah_attr aa = {
      .is_global = 1, .port_num = 1, .grh = {.dgid = gid, .sgid_index = 1, .hop_limit = 64}};
  struct ibv_ah* ah = v.create_ah(pd, &aa);
  if (!ah) return "create_ah failed";
  char* in = buf + kGrh;  // what arrives, behind the GRH's 40 bytes
  char* out = buf + kGrh + kMsg;
  for (int r = 0; r < kRounds; ++r) {
    memset(buf, 0, kGrh + kMsg);
    for (int i = 0; i < kMsg; ++i) out[i] = (char)(id * 31 + r + i);
    struct ibv_sge rs = {.addr = (uintptr_t)buf, .length = kGrh + kMsg, .lkey = mr->lkey};
    struct ibv_recv_wr rw = {.wr_id = 1, .sg_list = &rs, .num_sge = 1}, *bad_r;
    if (ibv_post_recv(qp, &rw, &bad_r)) return "post_recv failed";
    struct ibv_sge ss = {.addr = (uintptr_t)out, .length = kMsg, .lkey = mr->lkey};
    struct ibv_send_wr sw = {.wr_id = 2,
                             .sg_list = &ss,
                             .num_sge = 1,
                             .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED,
                             .wr.ud = {.ah = ah, .remote_qpn = qp->qp_num, .remote_qkey = kQkey}},
                       *bad_s;
    if (ibv_post_send(qp, &sw, &bad_s)) return "post_send failed";
    if (wait_for(cq, 2)) return "no completion, or an error completion";
    if (memcmp(in, out, kMsg) != 0) return "the datagram's bytes differ";
  }
  return NULL;
}

int main(int argc, char** argv) {
  if (argc != 2) return fail("usage: dlopen_test LIBRARY");
  void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) return fail(dlerror());
#define LOAD(field, name) \
  if (!(*(void**)& v.field = dlsym(h, name))) return fail("missing " name)
  LOAD(get_device_list, "ibv_get_device_list");
  LOAD(get_device_name, "ibv_get_device_name");
  LOAD(open_device, "ibv_open_device");
  LOAD(alloc_pd, "ibv_alloc_pd");
  LOAD(reg_mr, "ibv_reg_mr");
  LOAD(create_cq, "ibv_create_cq");
  LOAD(create_qp, "ibv_create_qp");
  LOAD(modify_qp, "ibv_modify_qp");
  LOAD(query_gid, "ibv_query_gid");
  LOAD(create_ah, "ibv_create_ah");
  int n = 0;
  struct ibv_device** list = v.get_device_list(&n);
  for (int i = 0; list && i < n && !ctx; ++i)
    if (strcmp(v.get_device_name(list[i]), "sr_lo") == 0) ctx = v.open_device(list[i]);
  if (!ctx) return fail("no device sr_lo");
  pd = v.alloc_pd(ctx);
  if (!pd) return fail("alloc_pd failed");
  pthread_t t[kThreads];
  for (long i = 0; i < kThreads; ++i)
    if (pthread_create(&t[i], NULL, run, (void*)i)) return fail("pthread_create failed");
  int bad = 0;
  for (int i = 0; i < kThreads; ++i) {
    void* err;
    pthread_join(t[i], &err);
    if (err) bad = fail((const char*)err);
  }
  if (!bad)
    printf("dlopen_test: %d threads x %d UD datagrams through the loaded library\n", kThreads, kRounds);
  return bad;
}
