// rsockets (<rdma/rsocket.h>): stream sockets over an RC QP, connected through this library's rdma_cm and
// moved with the public verbs, as rdma-core's rsocket.c does; the protocol is in rsocket_proto.h.
//
// - An rsocket is an rdma_cm id on an event channel of its own, whose fd (an eventfd) is the socket's
//   number: rsocket's fds never collide with the process's other fds, and rpoll/rselect tell them apart by
//   a table lookup. The channel fd is always non-blocking here; blocking calls sleep in poll().
// - Once connected, one CQ with a completion channel takes the socket's sends and receives. A call first
//   polls the CQ without a syscall, spins a few microseconds, then arms the CQ and sleeps in poll() on the
//   completion channel and the CM channel (which reports the peer's disconnect).
// - Data: the application's bytes are copied into a registered send ring (or sent inline when small) and
//   written into the peer's receive ring; rrecv copies them out and returns credits in batches. No
//   allocation and no lock other than the socket's own on the data path.
// - Accepting: a connection request is accepted at once (QP, rings, REP); the socket sends only once the
//   RTU has come (ESTABLISHED) or the peer's first write has, so no write reaches a QP not yet ready.
// SOCK_DGRAM rsockets (udpong) are in rsocket_dgram.cc; this file keeps their descriptors and locks.
#pragma GCC visibility push(default)
#include <rdma/rsocket.h>
#pragma GCC visibility pop

#include <arpa/inet.h>
#include <endian.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include "abi/rdmacm/cm.h"
#include "abi/rdmacm/rsocket_dgram.h"
#include "abi/rdmacm/rsocket_proto.h"

namespace softrdma::rdmacm {
namespace {

using namespace rsproto;

// rdma-core's defaults and limits (rsocket.c: def_sqsize, def_rqsize, def_inline, def_mem, RS_QP_MAX_SIZE).
constexpr uint32_t kDefQueue = 384;
constexpr uint32_t kMaxQueue = 0xFFFE;
constexpr uint32_t kDefInline = 64;
constexpr uint32_t kDefBuf = 128 << 10;
constexpr uint32_t kMinBuf = 4 << 10;
constexpr uint32_t kMaxBuf = 256 << 20;
constexpr uint32_t kMaxIomap = 256;
// Send slots and peer receives that data leaves for credit updates and shutdown messages.
constexpr uint32_t kCtrlReserve = 2;
constexpr int64_t kSpinNs = 10'000;                // polling before sleeping (rdma-core's polling_time)
constexpr int64_t kShutdownWaitNs = 5'000'000'000;  // rshutdown/rclose wait this long for sends in flight
constexpr uint64_t kRecvWr = 1ull << 63;           // wr_id of receives; a send's is its bytes of send ring
constexpr int kResolveMs = 2000;

enum class St : uint8_t {
  kInit,
  kBound,
  kListening,
  kAddrQuery,   // rdma_resolve_addr under way
  kRouteQuery,  // rdma_resolve_route under way
  kConnecting,  // REQ sent
  kAccepting,   // REP sent, RTU not yet in: receives only
  kConnected,
  kFailed,  // the connect failed: err says why
};

struct LocalMap {
  void* buf;
  size_t len;
  ibv_mr* mr;
  uint64_t offset;
  int slot;  // its entry in the peer's table, -1 for a local-only mapping
  bool announced;
};

// rsetsockopt's, copied to accepted sockets.
struct Options {
  uint32_t sq_size = kDefQueue, rq_size = kDefQueue, inline_size = kDefInline, iomap_size = 0;
  uint32_t rbuf_size = kDefBuf, sbuf_size = kDefBuf;
  uint32_t so_opts = 0, tcp_opts = 0;  // bits by option name
  int keepidle = 7200;
  linger lin{};
};

struct Socket {
  std::mutex mu;
  int fd = -1;
  dgram::Dgram* dg = nullptr;  // a datagram rsocket: the rest is unused
  rdma_event_channel* ch = nullptr;
  rdma_cm_id* id = nullptr;
  St st = St::kInit;
  int err = 0;  // SO_ERROR
  bool nonblock = false;

  Options o;

  std::deque<rdma_cm_event*> requests;  // listening: CONNECT_REQUESTs not yet accepted (unacked)

  // Connected.
  ibv_comp_channel* cch = nullptr;
  ibv_cq* cq = nullptr;
  uint8_t* region = nullptr;  // Credits, IoEntry table, receive ring (rsocket_proto.h)
  size_t region_len = 0;
  ibv_mr* rmr = nullptr;
  uint8_t* sbuf = nullptr;
  ibv_mr* smr = nullptr;
  uint32_t ring_size = 0, sring_size = 0;  // rbuf_size and sbuf_size as allocated

  // The peer's region.
  uint64_t p_addr = 0;
  uint32_t p_rkey = 0, p_ring = 0, p_rq = 0, p_iomap = 0;

  // Sending (all modulo 2^32).
  uint32_t sent = 0;       // bytes written into the peer's ring
  uint32_t sent_msgs = 0;  // writes with immediate (each took one of its receives)
  uint32_t sq_free = 0;
  uint32_t s_head = 0, s_tail = 0;  // send ring: bytes copied in, bytes released by completions

  // Receiving.
  uint32_t arrived = 0, consumed = 0;  // bytes in our ring
  uint32_t msgs_in = 0;                // writes with immediate received (each receive posted again)
  Credits told{};                      // what the peer last heard from us
  Credits peer{};                      // what we last heard from the peer (host order)
  uint32_t credit_seq = 0;             // credit updates sent: the next goes to slot credit_seq % p_rq

  bool rd_shut = false, wr_shut = false;  // rshutdown
  bool peer_wr_shut = false;              // the peer writes no more
  bool peer_closed = false;               // the peer closed: it neither reads nor writes
  bool gone = false;                      // the connection is broken or disconnected
  uint32_t idle_polls = 0;

  std::vector<LocalMap> maps;

  Credits* credits_in() { return reinterpret_cast<Credits*>(region); }
  IoEntry* iomap_in() { return reinterpret_cast<IoEntry*>(region + iomap_offset(o.rq_size)); }
  uint8_t* ring() { return region + ring_offset(o.rq_size, o.iomap_size); }
};

constexpr int kMaxFd = 1 << 16;  // as rdma-core's index map
std::atomic<Socket*> g_table[kMaxFd];

Socket* lookup(int fd) {
  if (fd < 0 || fd >= kMaxFd) return nullptr;
  return g_table[fd].load(std::memory_order_acquire);
}



void set_nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

uint32_t pow2_at_least(uint32_t v) {
  v = std::clamp(v, kMinBuf, kMaxBuf);
  uint32_t p = kMinBuf;
  while (p < v) p <<= 1;
  return p;
}

uint32_t load32(const uint32_t* p) { return le32toh(__atomic_load_n(p, __ATOMIC_ACQUIRE)); }

// The peer's credits record in the slot its kImmCredits completion names, read when that completion is
// polled (no later write reaches the slot before we post that receive again: rsocket_proto.h).
void take_credits(Socket* s, uint32_t slot) {
  if (slot >= s->o.rq_size) return;
  const Credits& c = s->credits_in()[slot];
  s->peer.consumed = load32(&c.consumed);
  s->peer.reposted = load32(&c.reposted);
}

// ---- credits and posting ----

uint32_t peer_room(const Socket* s) { return s->p_ring - (s->sent - s->peer.consumed); }
uint32_t peer_msgs(const Socket* s) { return s->p_rq - (s->sent_msgs - s->peer.reposted); }
bool connected(const Socket* s) { return s->st == St::kConnected || s->st == St::kAccepting; }
bool writable(const Socket* s) { return connected(s) && !s->gone && !s->peer_closed && !s->wr_shut; }

// Posts one write of len bytes from src (copied into the send ring unless inline; sbuf_fit has checked
// the ring has room: a tail too short for them is skipped) to (raddr, rkey), with an immediate unless imm
// is 0.
int post(Socket* s, const void* src, uint32_t len, uint64_t raddr, uint32_t rkey, uint32_t imm, bool inl) {
  ibv_sge sge{};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  wr.imm_data = htonl(imm);
  if (inl || len <= s->o.inline_size) {
    sge = {reinterpret_cast<uintptr_t>(src), len, 0};
    wr.send_flags |= IBV_SEND_INLINE;
  } else {
    uint32_t off = s->s_head & (s->sring_size - 1), skip = 0;
    if (s->sring_size - off < len) {
      skip = s->sring_size - off;  // released with this write
      off = 0;
    }
    uint8_t* dst = s->sbuf + off;
    memcpy(dst, src, len);
    sge = {reinterpret_cast<uintptr_t>(dst), len, s->smr->lkey};
    wr.wr_id = len + skip;
  }
  wr.sg_list = len ? &sge : nullptr;
  wr.num_sge = len ? 1 : 0;
  if (int ret = ibv_post_send(s->id->qp, &wr, &bad)) return fail_errno(ret);

  s->s_head += static_cast<uint32_t>(wr.wr_id);
  s->sq_free--;
  if (imm) s->sent_msgs++;
  return 0;
}

bool can_ctrl(Socket* s) { return s->st == St::kConnected && !s->gone && s->sq_free >= 1 && peer_msgs(s) >= 1; }

int post_ctrl(Socket* s, uint32_t imm) { return post(s, nullptr, 0, s->p_addr, s->p_rkey, imm, true); }

// Tells the peer what we consumed and reposted, in batches: when a quarter of the ring or of the receives
// is to be returned, or less when the peer may be short of ring (it has more than 3/4 of it unreturned).
void give_credits(Socket* s) {
  if (s->st != St::kConnected || s->gone || s->peer_closed) return;
  const uint32_t bytes = s->consumed - s->told.consumed, msgs = s->msgs_in - s->told.reposted;
  const bool b = bytes >= s->ring_size / 4 || (bytes && s->arrived - s->told.consumed > s->ring_size / 4 * 3);
  if (!b && msgs < s->o.rq_size / 4) return;
  if (!can_ctrl(s)) return;  // again at the next poll
  Credits c{htole32(s->consumed), htole32(s->msgs_in)};
  const uint32_t slot = s->credit_seq % s->p_rq;
  if (post(s, &c, sizeof c, s->p_addr + slot * sizeof c, s->p_rkey, credits_imm(slot), true) == 0) {
    s->told = {s->consumed, s->msgs_in};
    s->credit_seq++;
  }
}

void repost(Socket* s) {
  ibv_recv_wr wr{}, *bad = nullptr;
  wr.wr_id = kRecvWr;
  if (ibv_post_recv(s->id->qp, &wr, &bad)) s->gone = true;
}

// Takes what the CQ has; the number of completions.
int poll_cq(Socket* s) {
  if (!s->cq) return 0;
  int total = 0;
  ibv_wc wc[32];
  for (;;) {
    const int n = ibv_poll_cq(s->cq, 32, wc);
    if (n <= 0) break;
    total += n;
    for (int i = 0; i < n; i++) {
      const ibv_wc& w = wc[i];
      if (w.wr_id & kRecvWr) {
        if (w.status != IBV_WC_SUCCESS) {
          s->gone = true;
          continue;
        }
        // A write from the peer: its QP is past the handshake, so ours may write too (the IB CM's COMM_EST).
        if (s->st == St::kAccepting) s->st = St::kConnected;
        s->msgs_in++;
        const uint32_t imm = ntohl(w.imm_data);
        if (!(imm & kImmCtrl))
          s->arrived += imm;
        else if (imm_type(imm) == kImmCredits)
          take_credits(s, imm_slot(imm));
        else if (imm == kImmShutWr)
          s->peer_wr_shut = true;
        else if (imm == kImmClose)
          s->peer_wr_shut = s->peer_closed = true;
        repost(s);
      } else {
        s->sq_free++;
        s->s_tail += static_cast<uint32_t>(w.wr_id);
        if (w.status != IBV_WC_SUCCESS) s->gone = true;
      }
    }
    if (n < 32) break;
  }
  return total;
}

// ---- connection management ----

void drain_cm(Socket* s);

int conn_error(const rdma_cm_event* ev) {
  if (ev->event == RDMA_CM_EVENT_REJECTED) return ECONNREFUSED;
  if (ev->event == RDMA_CM_EVENT_UNREACHABLE) return ETIMEDOUT;
  if (ev->status) return ev->status < 0 ? -ev->status : ev->status;
  return ECONNREFUSED;
}

void free_verbs(Socket* s) {
  for (LocalMap& m : s->maps) ibv_dereg_mr(m.mr);
  s->maps.clear();
  if (s->id && s->id->qp) rdma_destroy_qp(s->id);
  if (s->cq) ibv_destroy_cq(s->cq);
  if (s->cch) ibv_destroy_comp_channel(s->cch);
  if (s->rmr) ibv_dereg_mr(s->rmr);
  if (s->smr) ibv_dereg_mr(s->smr);
  free(s->region);
  free(s->sbuf);
  s->cq = nullptr;
  s->cch = nullptr;
  s->rmr = s->smr = nullptr;
  s->region = s->sbuf = nullptr;
}

// The QP, its CQ and the rings; the receives posted. On failure errno is set and nothing is left.
int setup(Socket* s) {
  rdma_cm_id* id = s->id;
  s->ring_size = pow2_at_least(s->o.rbuf_size);
  s->sring_size = pow2_at_least(s->o.sbuf_size);
  s->region_len = (ring_offset(s->o.rq_size, s->o.iomap_size) + s->ring_size + 4095) & ~size_t{4095};
  s->cch = ibv_create_comp_channel(id->verbs);
  if (s->cch) {
    set_nonblock(s->cch->fd);
    s->cq = ibv_create_cq(id->verbs, static_cast<int>(s->o.sq_size + s->o.rq_size), s, s->cch, 0);
  }
  ibv_qp_init_attr a{};
  a.send_cq = a.recv_cq = s->cq;
  a.qp_type = IBV_QPT_RC;
  a.cap = {s->o.sq_size, s->o.rq_size, 1, 1, std::max<uint32_t>(std::min(s->o.inline_size, 256u), sizeof(IoEntry))};
  if (!s->cq || rdma_create_qp(id, nullptr, &a)) goto err;
  s->o.inline_size = std::min(s->o.inline_size, a.cap.max_inline_data);
  s->region = static_cast<uint8_t*>(aligned_alloc(4096, s->region_len));
  s->sbuf = static_cast<uint8_t*>(aligned_alloc(4096, s->sring_size));
  if (!s->region || !s->sbuf) {
    errno = ENOMEM;
    goto err;
  }
  memset(s->region, 0, s->region_len);
  s->rmr = ibv_reg_mr(id->pd, s->region, s->region_len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  s->smr = ibv_reg_mr(id->pd, s->sbuf, s->sring_size, IBV_ACCESS_LOCAL_WRITE);
  if (!s->rmr || !s->smr) goto err;
  for (uint32_t i = 0; i < s->o.rq_size; i++) {
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = kRecvWr;
    if (int ret = ibv_post_recv(id->qp, &wr, &bad)) {
      errno = ret;
      goto err;
    }
  }
  s->sq_free = s->o.sq_size;
  return 0;
err:
  const int e = errno ? errno : ENOMEM;
  free_verbs(s);
  return fail_errno(e);
}

// Our half of the handshake: the private data (in c) and the QP's parameters.
rdma_conn_param conn_param(const ConnData* c) {
  rdma_conn_param p{};
  p.private_data = c;
  p.private_data_len = sizeof *c;
  p.responder_resources = 1;
  p.initiator_depth = 1;
  p.retry_count = 7;
  p.rnr_retry_count = 7;
  return p;
}

ConnData conn_data(const Socket* s) {
  ConnData c{};
  c.version = kVersion;
  c.rq_size = htole16(static_cast<uint16_t>(s->o.rq_size));
  c.iomap_size = htole16(static_cast<uint16_t>(s->o.iomap_size));
  c.ring_size = htole32(s->ring_size);
  c.rkey = htole32(s->rmr->rkey);
  c.addr = htole64(reinterpret_cast<uintptr_t>(s->region));
  return c;
}

// The peer's region from its private data; false if it is not ours.
bool take_conn_data(Socket* s, const void* data, uint8_t len) {
  ConnData c;
  if (!data || len < sizeof c) return false;
  memcpy(&c, data, sizeof c);
  const uint32_t ring = le32toh(c.ring_size);
  if (c.version != kVersion || !ring || (ring & (ring - 1)) || !le16toh(c.rq_size)) return false;
  s->p_addr = le64toh(c.addr);
  s->p_rkey = le32toh(c.rkey);
  s->p_ring = ring;
  s->p_rq = le16toh(c.rq_size);
  s->p_iomap = le16toh(c.iomap_size);
  return true;
}

void connect_failed(Socket* s, int err) {
  s->st = St::kFailed;
  s->err = err;
}

void on_event(Socket* s, rdma_cm_event* ev) {
  switch (ev->event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      if (s->st != St::kAddrQuery) break;
      if (rdma_resolve_route(s->id, kResolveMs))
        connect_failed(s, errno);
      else
        s->st = St::kRouteQuery;
      break;
    case RDMA_CM_EVENT_ROUTE_RESOLVED: {
      if (s->st != St::kRouteQuery) break;
      if (setup(s)) {
        connect_failed(s, errno);
        break;
      }
      ConnData c = conn_data(s);
      rdma_conn_param p = conn_param(&c);
      if (rdma_connect(s->id, &p))
        connect_failed(s, errno);
      else
        s->st = St::kConnecting;
      break;
    }
    case RDMA_CM_EVENT_ESTABLISHED:
      if (s->st == St::kConnecting) {
        if (take_conn_data(s, ev->param.conn.private_data, ev->param.conn.private_data_len)) {
          s->st = St::kConnected;
        } else {
          rdma_disconnect(s->id);
          connect_failed(s, ECONNREFUSED);
        }
      } else if (s->st == St::kAccepting) {
        s->st = St::kConnected;
      }
      break;
    case RDMA_CM_EVENT_DISCONNECTED:
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      if (connected(s)) {
        s->gone = true;
        rdma_disconnect(s->id);  // our QP to error: what is posted completes (flushed)
      } else if (s->st != St::kFailed && s->st != St::kListening) {
        connect_failed(s, ECONNRESET);
      }
      break;
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
    case RDMA_CM_EVENT_CONNECT_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_REJECTED:
      if (s->st == St::kAccepting || s->st == St::kConnected)
        s->gone = true;
      else if (s->st != St::kListening)
        connect_failed(s, conn_error(ev));
      break;
    default:
      break;
  }
}

// Takes the socket's queued CM events (its channel is non-blocking). A listener keeps its connection
// requests for raccept.
void drain_cm(Socket* s) {
  rdma_cm_event* ev;
  while (rdma_get_cm_event(s->ch, &ev) == 0) {
    if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST && s->st == St::kListening) {
      s->requests.push_back(ev);
      continue;
    }
    on_event(s, ev);
    rdma_ack_cm_event(ev);
  }
}

// Polls the CQ, returns credits; looks at the CM channel while the RTU is awaited, and now and then after
// (a peer that died has no completion to show). Returns the completions taken.
int progress(Socket* s) {
  const int n = poll_cq(s);
  give_credits(s);
  if (s->st == St::kAccepting || (!n && (++s->idle_polls & 1023) == 0)) drain_cm(s);
  return n;
}

// Whether progress() changed anything a waiting loop looks at: completions taken, or a CM event that
// moved the socket (the ESTABLISHED of an accepted socket can come right then; a loop that went on to
// wait_progress would then sleep for an event that had already been taken).
bool progressed(Socket* s) {
  const St before = s->st;
  return progress(s) > 0 || s->st != before;
}

void drain_cq_events(Socket* s) {
  ibv_cq* cq;
  void* ctx;
  unsigned n = 0;
  while (ibv_get_cq_event(s->cch, &cq, &ctx) == 0) n++;
  if (n) ibv_ack_cq_events(s->cq, n);
}

// Waits for something to happen on the socket: a completion or a CM event (the lock is released while
// asleep), at most timeout_ms (-1: no limit). Spins briefly first.
void wait_progress(Socket* s, std::unique_lock<std::mutex>& lk, int timeout_ms = -1) {
  if (s->cq) {
    const int64_t t0 = now_ns();
    do {
      if (progressed(s)) return;
    } while (now_ns() - t0 < kSpinNs);
    ibv_req_notify_cq(s->cq, 0);
    if (progressed(s)) return;
  }
  pollfd p[2] = {{s->ch->fd, POLLIN, 0}, {s->cch ? s->cch->fd : -1, POLLIN, 0}};
  lk.unlock();
  poll(p, 2, timeout_ms);
  lk.lock();
  if (p[1].revents & POLLIN) drain_cq_events(s);
  if (p[0].revents & POLLIN) drain_cm(s);
  progress(s);
}

// Drives a connect: returns 0 once connected; -1 with EINPROGRESS while under way (non-blocking), with the
// failure's errno otherwise.
int do_connect(Socket* s, std::unique_lock<std::mutex>& lk, bool block) {
  for (;;) {
    drain_cm(s);
    if (connected(s)) return 0;
    if (s->st == St::kFailed) return fail_errno(s->err);
    if (s->st != St::kAddrQuery && s->st != St::kRouteQuery && s->st != St::kConnecting) return fail_errno(EINVAL);
    if (!block) return fail_errno(EINPROGRESS);
    wait_progress(s, lk);
  }
}

bool connecting(const Socket* s) {
  return s->st == St::kAddrQuery || s->st == St::kRouteQuery || s->st == St::kConnecting;
}

// Before a send or a receive: a connect under way is driven on (EAGAIN while not done).
int finish_connect(Socket* s, std::unique_lock<std::mutex>& lk) {
  if (!connecting(s)) return 0;
  if (do_connect(s, lk, !s->nonblock) == 0) return 0;
  if (errno == EINPROGRESS) errno = EAGAIN;
  return -1;
}

Socket* new_socket() {
  Socket* s = new Socket;
  s->ch = rdma_create_event_channel();
  if (!s->ch) {
    delete s;
    return nullptr;
  }
  set_nonblock(s->ch->fd);
  s->fd = s->ch->fd;
  if (s->fd >= kMaxFd) {
    rdma_destroy_event_channel(s->ch);
    delete s;
    errno = ENOMEM;
    return nullptr;
  }
  return s;
}

void destroy(Socket* s) {
  if (s->dg) dgram::destroy(s->dg);
  free_verbs(s);
  if (s->id) rdma_destroy_id(s->id);
  if (s->ch) rdma_destroy_event_channel(s->ch);
  delete s;
}

// ---- data ----

// How many of n (more than inline) bytes the send ring takes now, contiguous; a short tail is skipped
// (post) rather than sent in pieces.
uint32_t sbuf_fit(const Socket* s, uint32_t n) {
  const uint32_t room = s->sring_size - (s->s_head - s->s_tail);
  const uint32_t contig = s->sring_size - (s->s_head & (s->sring_size - 1));
  if (n <= contig) return std::min(n, room);
  if (contig > s->o.inline_size) return std::min(contig, room);
  return room < contig ? 0 : std::min(n, room - contig);
}

// How much of len the next write may carry now (0: nothing can go).
uint32_t sendable(Socket* s, size_t len) {
  if (s->st != St::kConnected || s->sq_free <= kCtrlReserve || peer_msgs(s) <= kCtrlReserve) return 0;
  uint32_t n = static_cast<uint32_t>(std::min<size_t>(len, kMaxChunk));
  n = std::min({n, peer_room(s), s->p_ring - (s->sent & (s->p_ring - 1))});
  return n > s->o.inline_size ? sbuf_fit(s, n) : n;
}

// Posts riomap()ed buffers the peer has not heard of yet: before any data, which the peer may take as its
// cue to riowrite there (riostream). -1 with EWOULDBLOCK (non-blocking) if one cannot go yet.
int announce_maps(Socket* s, std::unique_lock<std::mutex>& lk, bool nb) {
  for (LocalMap& m : s->maps) {
    if (m.announced || m.slot < 0) continue;
    while (s->st != St::kConnected || s->sq_free <= kCtrlReserve) {
      if (!writable(s)) return fail_errno(ECONNRESET);
      if (progressed(s)) continue;
      if (nb) return fail_errno(EWOULDBLOCK);
      wait_progress(s, lk);
    }
    IoEntry e{htole64(m.offset), htole64(reinterpret_cast<uintptr_t>(m.buf)), htole32(m.mr->rkey),
              htole32(static_cast<uint32_t>(m.len)), htole64(1)};
    if (post(s, &e, sizeof e, s->p_addr + iomap_offset(s->p_rq) + m.slot * sizeof e, s->p_rkey, 0, true)) return -1;
    m.announced = true;
  }
  return 0;
}

bool nonblocking(const Socket* s, int flags) { return s->nonblock || (flags & MSG_DONTWAIT); }

// A non-blocking call that found nothing to do. Applications call again at once (rstream, riostream):
// give the CPU to the threads that make progress (ours, the peer's on one host) rather than spin against
// them. One syscall on an empty call, none on a call that moves data.
int would_block() {
  sched_yield();
  return fail_errno(EWOULDBLOCK);
}

ssize_t send_iov(Socket* s, const iovec* iov, int iovcnt, int flags, const sockaddr* dst = nullptr) {
  std::unique_lock lk(s->mu);
  const bool nb = nonblocking(s, flags);
  if (s->dg) return dgram::send(s->dg, lk, iov, iovcnt, dst, nb);
  if (finish_connect(s, lk)) return -1;
  if (announce_maps(s, lk, nb)) return errno == EWOULDBLOCK ? would_block() : -1;
  size_t total = 0;
  for (int i = 0; i < iovcnt; i++) {
    const uint8_t* p = static_cast<const uint8_t*>(iov[i].iov_base);
    size_t left = iov[i].iov_len;
    while (left) {
      if (!writable(s)) {
        if (total) return static_cast<ssize_t>(total);
        return fail_errno(ECONNRESET);
      }
      const uint32_t n = sendable(s, left);
      if (!n) {
        if (progressed(s)) continue;
        if (nb) {
          if (total) return static_cast<ssize_t>(total);
          return would_block();
        }
        wait_progress(s, lk);
        continue;
      }
      const uint64_t at = s->p_addr + ring_offset(s->p_rq, s->p_iomap) + (s->sent & (s->p_ring - 1));
      if (post(s, p, n, at, s->p_rkey, n, false)) {
        if (total) return static_cast<ssize_t>(total);
        return -1;
      }
      s->sent += n;
      p += n;
      left -= n;
      total += n;
    }
  }
  return static_cast<ssize_t>(total);
}

ssize_t recv_iov(Socket* s, const iovec* iov, int iovcnt, int flags, sockaddr* src = nullptr,
                 socklen_t* srclen = nullptr) {
  std::unique_lock lk(s->mu);
  if (s->dg) return dgram::recv(s->dg, lk, iov, iovcnt, src, srclen, nonblocking(s, flags), flags & MSG_PEEK);
  if (finish_connect(s, lk)) return -1;
  if (!connected(s)) return 0;  // as rdma-core: a socket that cannot read more reads end-of-file
  const bool nb = nonblocking(s, flags), peek = flags & MSG_PEEK, waitall = flags & MSG_WAITALL;
  size_t want = 0;
  for (int i = 0; i < iovcnt; i++) want += iov[i].iov_len;
  size_t total = 0;
  int vi = 0;
  size_t voff = 0;
  uint32_t pos = s->consumed;
  while (total < want) {
    uint32_t avail = s->arrived - pos;
    if (!avail) {
      progress(s);
      avail = s->arrived - pos;
    }
    if (avail) {
      while (avail && vi < iovcnt) {
        const size_t room = iov[vi].iov_len - voff;
        const uint32_t off = pos & (s->ring_size - 1);
        const uint32_t n = static_cast<uint32_t>(std::min<size_t>({avail, room, s->ring_size - off}));
        memcpy(static_cast<uint8_t*>(iov[vi].iov_base) + voff, s->ring() + off, n);
        pos += n;
        avail -= n;
        total += n;
        voff += n;
        if (voff == iov[vi].iov_len) {
          vi++;
          voff = 0;
        }
      }
      if (!peek) {
        s->consumed = pos;
        give_credits(s);
      }
      if (peek || !waitall) break;
      continue;
    }
    if (total && !waitall) break;
    if (s->rd_shut || s->peer_wr_shut || s->gone) break;  // end of file
    if (nb) {
      if (total) break;
      return would_block();
    }
    wait_progress(s, lk);
  }
  return static_cast<ssize_t>(total);
}

// Sends a shutdown message and waits (bounded) for what is in flight to be acknowledged.
void shutdown_locked(Socket* s, std::unique_lock<std::mutex>& lk, int how) {
  const bool was_wr = s->wr_shut;
  s->rd_shut |= how == SHUT_RD || how == SHUT_RDWR;
  s->wr_shut |= how == SHUT_WR || how == SHUT_RDWR;
  if (!connected(s) || s->gone) return;
  const int64_t deadline = now_ns() + kShutdownWaitNs;
  if (!was_wr && s->wr_shut) {
    while (!s->gone && !can_ctrl(s) && now_ns() < deadline) {
      if (!progress(s)) wait_progress(s, lk, 100);
    }
    if (can_ctrl(s)) post_ctrl(s, s->rd_shut ? kImmClose : kImmShutWr);
  }
  while (!s->gone && s->sq_free < s->o.sq_size && now_ns() < deadline) {
    if (!progress(s)) wait_progress(s, lk, 100);
  }
}

// ---- rpoll ----

short revents_of(Socket* s, short events) {
  std::unique_lock lk(s->mu);
  if (s->dg) return dgram::revents(s->dg, events);
  short r = 0;
  switch (s->st) {
    case St::kListening:
      drain_cm(s);
      if (!s->requests.empty()) r |= POLLIN;
      break;
    case St::kAddrQuery:
    case St::kRouteQuery:
    case St::kConnecting:
      do_connect(s, lk, false);
      if (connecting(s)) break;
      [[fallthrough]];
    default:
      if (s->st == St::kFailed) {
        r |= POLLOUT | POLLERR | POLLHUP;
        break;
      }
      if (!connected(s)) break;
      progress(s);
      if (s->arrived != s->consumed || s->rd_shut || s->peer_wr_shut || s->gone) r |= POLLIN;
      if (sendable(s, 1) || !writable(s)) r |= POLLOUT;
      // Hung up once what the peer sent has been read: an application that polls (rstream -T a) treats
      // POLLHUP as an error and would lose the peer's last bytes.
      if ((s->gone || s->peer_closed) && s->arrived == s->consumed) r |= POLLHUP;
      break;
  }
  return r & (events | POLLERR | POLLHUP);
}

void arm(Socket* s) {
  std::lock_guard lk(s->mu);
  if (s->cq) ibv_req_notify_cq(s->cq, 0);
}

int check_all(pollfd* fds, nfds_t n) {
  int ready = 0;
  for (nfds_t i = 0; i < n; i++) {
    Socket* s = lookup(fds[i].fd);
    if (!s) continue;
    fds[i].revents = revents_of(s, fds[i].events);
    if (fds[i].revents) ready++;
  }
  return ready;
}

// The ordinary fds' state now (no wait): how many are ready.
int poll_plain(pollfd* fds, nfds_t n) {
  thread_local std::vector<pollfd> tmp;  // kept: rpoll(0) in a loop allocates nothing
  thread_local std::vector<nfds_t> at;
  tmp.clear();
  at.clear();
  for (nfds_t i = 0; i < n; i++) {
    if (lookup(fds[i].fd)) continue;
    tmp.push_back(fds[i]);
    at.push_back(i);
  }
  if (tmp.empty()) return 0;
  if (poll(tmp.data(), tmp.size(), 0) < 0) return -1;
  int ready = 0;
  for (size_t k = 0; k < tmp.size(); k++) {
    fds[at[k]].revents = tmp[k].revents;
    if (tmp[k].revents) ready++;
  }
  return ready;
}

}  // namespace
}  // namespace softrdma::rdmacm

using namespace softrdma::rdmacm;

// ---- the API ----

SR_EXPORT int rsocket(int domain, int type, int protocol) {
  const int kind = type & ~(SOCK_CLOEXEC | SOCK_NONBLOCK);
  if ((domain != AF_INET && domain != AF_INET6 && domain != AF_IB) || (kind != SOCK_STREAM && kind != SOCK_DGRAM) ||
      (kind == SOCK_STREAM && protocol && protocol != IPPROTO_TCP) ||
      (kind == SOCK_DGRAM && protocol && protocol != IPPROTO_UDP))
    return fail_errno(EOPNOTSUPP);
  if (domain == AF_IB) return fail_errno(EAFNOSUPPORT);  // IP addressing only
  if (kind == SOCK_DGRAM) {
    int fd;
    dgram::Dgram* d = dgram::create(domain, &fd);
    if (!d) return -1;
    if (fd >= kMaxFd) {
      dgram::destroy(d);
      return fail_errno(ENOMEM);
    }
    Socket* s = new Socket;
    s->fd = fd;
    s->dg = d;
    s->nonblock = type & SOCK_NONBLOCK;
    g_table[fd].store(s, std::memory_order_release);
    return fd;
  }
  Socket* s = new_socket();
  if (!s) return -1;
  if (rdma_create_id(s->ch, &s->id, s, RDMA_PS_TCP)) {
    const int e = errno;
    destroy(s);
    return fail_errno(e);
  }
  s->id->route.addr.src_addr.sa_family = static_cast<sa_family_t>(domain);
  s->nonblock = type & SOCK_NONBLOCK;
  if (type & SOCK_CLOEXEC) fcntl(s->fd, F_SETFD, FD_CLOEXEC);
  g_table[s->fd].store(s, std::memory_order_release);
  return s->fd;
}

SR_EXPORT int rbind(int fd, const sockaddr* addr, socklen_t addrlen) {
  Socket* s = lookup(fd);
  if (!s) return fail_errno(EBADF);
  if (!addr || addrlen < sizeof(sockaddr_in)) return fail_errno(EINVAL);
  std::lock_guard lk(s->mu);
  if (s->dg) return dgram::bind(s->dg, addr, addrlen);
  if (s->st != St::kInit) return fail_errno(EINVAL);
  if (rdma_bind_addr(s->id, const_cast<sockaddr*>(addr))) return -1;
  s->st = St::kBound;
  return 0;
}

SR_EXPORT int rlisten(int fd, int backlog) {
  Socket* s = lookup(fd);
  if (!s) return fail_errno(EBADF);
  std::lock_guard lk(s->mu);
  if (s->dg) return fail_errno(EOPNOTSUPP);  // a datagram socket
  if (s->st == St::kListening) return 0;
  if (s->st != St::kInit && s->st != St::kBound) return fail_errno(EINVAL);
  if (rdma_listen(s->id, backlog)) return -1;
  s->st = St::kListening;
  return 0;
}

namespace {

// Accepts one connection request (acked here): the new socket's fd, or -1.
int accept_one(Socket* ls, rdma_cm_event* ev) {
  rdma_cm_id* cid = ev->id;
  uint8_t pd[64];
  const uint8_t pdlen = std::min<uint8_t>(ev->param.conn.private_data_len, sizeof pd);
  if (ev->param.conn.private_data) memcpy(pd, ev->param.conn.private_data, pdlen);
  rdma_ack_cm_event(ev);
  Socket* s = new_socket();
  if (!s) {
    rdma_reject(cid, nullptr, 0);
    rdma_destroy_id(cid);
    return -1;
  }
  s->o = ls->o;
  s->nonblock = ls->nonblock;
  if (!take_conn_data(s, pd, pdlen) || rdma_migrate_id(cid, s->ch)) {
    rdma_reject(cid, nullptr, 0);
    rdma_destroy_id(cid);
    destroy(s);
    return fail_errno(ECONNABORTED);
  }
  s->id = cid;
  cid->context = s;
  if (setup(s)) {
    const int e = errno;
    rdma_reject(cid, nullptr, 0);
    destroy(s);
    return fail_errno(e);
  }
  ConnData c = conn_data(s);
  rdma_conn_param p = conn_param(&c);
  if (rdma_accept(cid, &p)) {
    const int e = errno;
    destroy(s);
    return fail_errno(e);
  }
  s->st = St::kAccepting;
  g_table[s->fd].store(s, std::memory_order_release);
  return s->fd;
}

void copy_addr(sockaddr* dst, socklen_t* len, const sockaddr* src) {
  const socklen_t n = src->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  memcpy(dst, src, std::min(*len, n));
  *len = n;
}

}  // namespace

SR_EXPORT int raccept(int fd, sockaddr* addr, socklen_t* addrlen) {
  Socket* s = lookup(fd);
  if (!s) return fail_errno(EBADF);
  std::unique_lock lk(s->mu);
  if (s->dg) return fail_errno(EOPNOTSUPP);
  if (s->st != St::kListening) return fail_errno(EBADF);  // as rdma-core
  for (;;) {
    drain_cm(s);
    while (!s->requests.empty()) {
      rdma_cm_event* ev = s->requests.front();
      s->requests.pop_front();
      const int nfd = accept_one(s, ev);
      if (nfd < 0) continue;  // that one failed: the next, or wait
      if (addr && addrlen) {
        Socket* n = lookup(nfd);
        copy_addr(addr, addrlen, rdma_get_peer_addr(n->id));
      }
      return nfd;
    }
    if (s->nonblock) return fail_errno(EAGAIN);
    wait_progress(s, lk);
  }
}

SR_EXPORT int rconnect(int fd, const sockaddr* addr, socklen_t addrlen) {
  Socket* s = lookup(fd);
  if (!s) return fail_errno(EBADF);
  std::unique_lock lk(s->mu);
  if (s->dg) return dgram::connect(s->dg, addr, addrlen);
  switch (s->st) {
    case St::kInit:
    case St::kBound: {
      if (!addr || addrlen < sizeof(sockaddr_in)) return fail_errno(EINVAL);
      sockaddr_storage dst{};
      memcpy(&dst, addr, std::min<size_t>(addrlen, sizeof dst));
      if (rdma_resolve_addr(s->id, nullptr, reinterpret_cast<sockaddr*>(&dst), kResolveMs)) {
        connect_failed(s, errno);
        return -1;
      }
      s->st = St::kAddrQuery;
      break;
    }
    case St::kListening:
      return fail_errno(EINVAL);
    case St::kFailed:
      return fail_errno(ENOTCONN);  // as rdma-core: the error was reported once
    default:
      break;
  }
  return do_connect(s, lk, !s->nonblock);
}

SR_EXPORT int rshutdown(int fd, int how) {
  Socket* s = lookup(fd);
  if (!s) return fail_errno(EBADF);
  if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) return fail_errno(EINVAL);
  std::unique_lock lk(s->mu);
  if (!s->dg) shutdown_locked(s, lk, how);
  return 0;
}

SR_EXPORT int rclose(int fd) {
  Socket* s = lookup(fd);
  if (!s) return fail_errno(EBADF);
  {
    std::unique_lock lk(s->mu);
    if (!s->dg && connected(s)) {
      shutdown_locked(s, lk, SHUT_RDWR);
      rdma_disconnect(s->id);
    }
    for (rdma_cm_event* ev : s->requests) {
      rdma_cm_id* cid = ev->id;
      rdma_ack_cm_event(ev);
      rdma_reject(cid, nullptr, 0);
      rdma_destroy_id(cid);
    }
    s->requests.clear();
    g_table[fd].store(nullptr, std::memory_order_release);
  }
  destroy(s);
  return 0;
}

SR_EXPORT ssize_t rrecv(int fd, void* buf, size_t len, int flags) {
  Socket* s = lookup(fd);
  if (!s) return fail_errno(EBADF);
  iovec v{buf, len};
  return recv_iov(s, &v, 1, flags);
}

SR_EXPORT ssize_t rrecvfrom(int fd, void* buf, size_t len, int flags, sockaddr* src, socklen_t* srclen) {
  Socket* s = lookup(fd);
  if (s && s->dg) {
    iovec v{buf, len};
    return recv_iov(s, &v, 1, flags, src, srclen);
  }
  const ssize_t n = rrecv(fd, buf, len, flags);
  if (n > 0 && src && srclen) rgetpeername(fd, src, srclen);
  return n;
}

SR_EXPORT ssize_t rrecvmsg(int fd, msghdr* msg, int flags) {
  Socket* s = lookup(fd);
  if (!s) return fail_errno(EBADF);
  if (!msg) return fail_errno(EINVAL);
  if (msg->msg_control && msg->msg_controllen) return fail_errno(EOPNOTSUPP);
  return recv_iov(s, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags, static_cast<sockaddr*>(msg->msg_name),
                  msg->msg_name ? &msg->msg_namelen : nullptr);
}

SR_EXPORT ssize_t rread(int fd, void* buf, size_t count) { return rrecv(fd, buf, count, 0); }

SR_EXPORT ssize_t rreadv(int fd, const iovec* iov, int iovcnt) {
  Socket* s = lookup(fd);
  if (!s) return fail_errno(EBADF);
  if (iovcnt < 0 || (iovcnt && !iov)) return fail_errno(EINVAL);
  return recv_iov(s, iov, iovcnt, 0);
}

SR_EXPORT ssize_t rsend(int fd, const void* buf, size_t len, int flags) {
  Socket* s = lookup(fd);
  if (!s) return fail_errno(EBADF);
  iovec v{const_cast<void*>(buf), len};
  return send_iov(s, &v, 1, flags);
}

SR_EXPORT ssize_t rsendto(int fd, const void* buf, size_t len, int flags, const sockaddr* dst, socklen_t dstlen) {
  Socket* s = lookup(fd);
  if (!s) return fail_errno(EBADF);
  if (s->dg) {
    if (dst && dstlen < sizeof(sockaddr_in)) return fail_errno(EINVAL);
    iovec v{const_cast<void*>(buf), len};
    return send_iov(s, &v, 1, flags, dst);
  }
  if (dst || dstlen) return fail_errno(EISCONN);  // a stream socket (as rdma-core)
  return rsend(fd, buf, len, flags);
}

SR_EXPORT ssize_t rsendmsg(int fd, const msghdr* msg, int flags) {
  Socket* s = lookup(fd);
  if (!s) return fail_errno(EBADF);
  if (!msg) return fail_errno(EINVAL);
  if (msg->msg_control && msg->msg_controllen) return fail_errno(EOPNOTSUPP);
  if (s->dg && msg->msg_name && msg->msg_namelen < sizeof(sockaddr_in)) return fail_errno(EINVAL);
  return send_iov(s, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags,
                  s->dg ? static_cast<const sockaddr*>(msg->msg_name) : nullptr);
}

SR_EXPORT ssize_t rwrite(int fd, const void* buf, size_t count) { return rsend(fd, buf, count, 0); }

SR_EXPORT ssize_t rwritev(int fd, const iovec* iov, int iovcnt) {
  Socket* s = lookup(fd);
  if (!s) return fail_errno(EBADF);
  if (iovcnt < 0 || (iovcnt && !iov)) return fail_errno(EINVAL);
  return send_iov(s, iov, iovcnt, 0);
}

namespace {
// rgetpeername (peer) and rgetsockname: the datagram socket's own answer, or the cm id's address.
int get_name(int fd, sockaddr* addr, socklen_t* addrlen, bool peer) {
  Socket* s = lookup(fd);
  if (!s) return fail_errno(EBADF);
  if (!addr || !addrlen) return fail_errno(EFAULT);
  std::lock_guard lk(s->mu);
  if (s->dg) return peer ? dgram::getpeername(s->dg, addr, addrlen) : dgram::getsockname(s->dg, addr, addrlen);
  copy_addr(addr, addrlen, peer ? rdma_get_peer_addr(s->id) : rdma_get_local_addr(s->id));
  return 0;
}
}  // namespace

SR_EXPORT int rgetpeername(int fd, sockaddr* addr, socklen_t* addrlen) { return get_name(fd, addr, addrlen, true); }

SR_EXPORT int rgetsockname(int fd, sockaddr* addr, socklen_t* addrlen) { return get_name(fd, addr, addrlen, false); }

SR_EXPORT int rsetsockopt(int fd, int level, int optname, const void* optval, socklen_t optlen) {
  Socket* s = lookup(fd);
  if (!s) return fail_errno(EBADF);
  if (!optval || optlen < sizeof(int)) return fail_errno(EINVAL);
  std::lock_guard lk(s->mu);
  if (s->dg) return level == SOL_RDMA ? fail_errno(EOPNOTSUPP) : dgram::setsockopt(s->dg, level, optname, optval, optlen);
  const int v = *static_cast<const int*>(optval);
  uint32_t* bits = nullptr;
  bool on = v != 0;
  switch (level) {
    case SOL_SOCKET:
      bits = &s->o.so_opts;
      switch (optname) {
        case SO_REUSEADDR: {
          int val = v;
          // Only before the bind matters; later it is accepted and kept (rdma-core ignores it too).
          if (s->st == St::kInit && rdma_set_option(s->id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &val, sizeof val))
            return -1;
          break;
        }
        case SO_RCVBUF:
          if (!s->region) s->o.rbuf_size = static_cast<uint32_t>(v) << 1;  // doubled, as Linux and rdma-core
          break;
        case SO_SNDBUF:
          if (!s->sbuf) s->o.sbuf_size = static_cast<uint32_t>(v) << 1;
          break;
        case SO_LINGER:
          if (optlen < sizeof(linger)) return fail_errno(EINVAL);
          memcpy(&s->o.lin, optval, sizeof s->o.lin);
          on = s->o.lin.l_onoff;
          break;
        case SO_KEEPALIVE:  // the CM's TCP connection reports a peer that is gone
        case SO_OOBINLINE:
          break;
        default:
          return fail_errno(EOPNOTSUPP);
      }
      break;
    case IPPROTO_IP:
      if (optname != IP_TOS) return fail_errno(EOPNOTSUPP);
      {
        uint8_t tos = static_cast<uint8_t>(v);
        return rdma_set_option(s->id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof tos);
      }
    case IPPROTO_TCP:
      bits = &s->o.tcp_opts;
      switch (optname) {
        case TCP_NODELAY:
        case TCP_KEEPCNT:
        case TCP_KEEPINTVL:
        case TCP_MAXSEG:
        case TCP_CONGESTION:
          break;
        case TCP_KEEPIDLE:
          if (v <= 0) return fail_errno(EINVAL);
          s->o.keepidle = v;
          break;
        default:
          return fail_errno(EOPNOTSUPP);
      }
      break;
    case IPPROTO_IPV6:
      if (optname != IPV6_V6ONLY) return fail_errno(EOPNOTSUPP);
      {
        int val = v;
        if (rdma_set_option(s->id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &val, sizeof val)) return -1;
      }
      return 0;
    case SOL_RDMA:
      if (s->st != St::kInit && s->st != St::kBound && s->st != St::kListening) return fail_errno(EINVAL);
      switch (optname) {
        case RDMA_SQSIZE:
          s->o.sq_size = std::clamp<uint32_t>(static_cast<uint32_t>(v), kCtrlReserve * 4, kMaxQueue);
          return 0;
        case RDMA_RQSIZE:
          s->o.rq_size = std::clamp<uint32_t>(static_cast<uint32_t>(v), kCtrlReserve * 4, kMaxQueue);
          return 0;
        case RDMA_INLINE:
          s->o.inline_size = std::min<uint32_t>(static_cast<uint32_t>(v), kMaxQueue);
          return 0;
        case RDMA_IOMAPSIZE:
          s->o.iomap_size = std::min<uint32_t>(static_cast<uint32_t>(v), kMaxIomap);
          return 0;
        case RDMA_ROUTE:
          return 0;  // our rdma_cm resolves the route itself
        default:
          return fail_errno(EOPNOTSUPP);
      }
    default:
      return fail_errno(EOPNOTSUPP);
  }
  if (bits && optname < 32) *bits = on ? (*bits | (1u << optname)) : (*bits & ~(1u << optname));
  return 0;
}

SR_EXPORT int rgetsockopt(int fd, int level, int optname, void* optval, socklen_t* optlen) {
  Socket* s = lookup(fd);
  if (!s) return fail_errno(EBADF);
  if (!optval || !optlen || *optlen < sizeof(int)) return fail_errno(EINVAL);
  std::unique_lock lk(s->mu);
  if (s->dg) return level == SOL_RDMA ? fail_errno(EOPNOTSUPP) : getsockopt(fd, level, optname, optval, optlen);
  int v = 0;
  switch (level) {
    case SOL_SOCKET:
      switch (optname) {
        case SO_REUSEADDR:
        case SO_KEEPALIVE:
        case SO_OOBINLINE:
          v = (s->o.so_opts >> optname) & 1;
          break;
        case SO_RCVBUF:
          v = static_cast<int>(s->o.rbuf_size);
          break;
        case SO_SNDBUF:
          v = static_cast<int>(s->o.sbuf_size);
          break;
        case SO_LINGER:
          if (*optlen < sizeof(linger)) return fail_errno(EINVAL);
          memcpy(optval, &s->o.lin, sizeof s->o.lin);
          *optlen = sizeof s->o.lin;
          return 0;
        case SO_ERROR:
          if (connecting(s)) do_connect(s, lk, false);
          v = s->err;
          s->err = 0;
          break;
        default:
          return fail_errno(EOPNOTSUPP);
      }
      break;
    case IPPROTO_TCP:
      switch (optname) {
        case TCP_NODELAY:
          v = (s->o.tcp_opts >> optname) & 1;
          break;
        case TCP_KEEPIDLE:
          v = s->o.keepidle;
          break;
        case TCP_MAXSEG:
          v = 2048;
          break;
        default:
          return fail_errno(EOPNOTSUPP);
      }
      break;
    case SOL_RDMA:
      switch (optname) {
        case RDMA_SQSIZE:
          v = static_cast<int>(s->o.sq_size);
          break;
        case RDMA_RQSIZE:
          v = static_cast<int>(s->o.rq_size);
          break;
        case RDMA_INLINE:
          v = static_cast<int>(s->o.inline_size);
          break;
        case RDMA_IOMAPSIZE:
          v = static_cast<int>(s->o.iomap_size);
          break;
        default:
          return fail_errno(EOPNOTSUPP);
      }
      break;
    default:
      return fail_errno(EOPNOTSUPP);
  }
  memcpy(optval, &v, sizeof v);
  *optlen = sizeof v;
  return 0;
}

SR_EXPORT int rfcntl(int fd, int cmd, ...) {
  Socket* s = lookup(fd);
  if (!s) return fail_errno(EBADF);
  std::lock_guard lk(s->mu);
  switch (cmd) {
    case F_GETFL:
      return O_RDWR | (s->nonblock ? O_NONBLOCK : 0);
    case F_SETFL: {
      va_list ap;
      va_start(ap, cmd);
      const int flags = va_arg(ap, int);
      va_end(ap);
      s->nonblock = flags & O_NONBLOCK;
      return 0;
    }
    default:
      return fail_errno(EOPNOTSUPP);
  }
}

SR_EXPORT off_t riomap(int fd, void* buf, size_t len, int prot, int flags, off_t offset) {
  Socket* s = lookup(fd);
  if (!s) return fail_errno(EBADF);
  if (!buf || !len || len > UINT32_MAX || (prot & ~PROT_WRITE) || flags) return fail_errno(EINVAL);
  std::unique_lock lk(s->mu);
  if (s->dg) return fail_errno(EOPNOTSUPP);  // a datagram socket has no connection to map into
  if (!connected(s) || !s->id->pd) return fail_errno(EINVAL);
  int slot = -1;
  if (prot & PROT_WRITE) {
    for (uint32_t i = 0; i < s->p_iomap && slot < 0; i++) {
      slot = static_cast<int>(i);
      for (const LocalMap& m : s->maps)
        if (m.slot == slot) slot = -1;
    }
    if (slot < 0) return fail_errno(ENOMEM);  // the peer's table (its RDMA_IOMAPSIZE) is full
  }
  const int access = IBV_ACCESS_LOCAL_WRITE | ((prot & PROT_WRITE) ? IBV_ACCESS_REMOTE_WRITE : 0);
  ibv_mr* mr = ibv_reg_mr(s->id->pd, buf, len, access);
  if (!mr) return -1;
  if (offset == -1) offset = static_cast<off_t>(reinterpret_cast<uintptr_t>(buf));
  s->maps.push_back({buf, len, mr, static_cast<uint64_t>(offset), slot, false});
  // Announced now if it can go at once, else before the next send or riowrite.
  announce_maps(s, lk, true);
  return offset;
}

SR_EXPORT int riounmap(int fd, void* buf, size_t len) {
  Socket* s = lookup(fd);
  if (!s) return fail_errno(EBADF);
  std::unique_lock lk(s->mu);
  for (auto it = s->maps.begin(); it != s->maps.end(); ++it) {
    if (it->buf != buf || it->len != len) continue;
    if (it->announced && can_ctrl(s)) {  // the peer's entry cleared (best effort: the peer may hold it)
      static const IoEntry kFree{};
      post(s, &kFree, sizeof kFree, s->p_addr + iomap_offset(s->p_rq) + it->slot * sizeof kFree, s->p_rkey, 0, true);
    }
    ibv_dereg_mr(it->mr);
    s->maps.erase(it);
    return 0;
  }
  return fail_errno(EINVAL);
}

SR_EXPORT size_t riowrite(int fd, const void* buf, size_t count, off_t offset, int flags) {
  Socket* s = lookup(fd);
  if (!s) return static_cast<size_t>(fail_errno(EBADF));
  std::unique_lock lk(s->mu);
  if (s->dg) return static_cast<size_t>(fail_errno(EOPNOTSUPP));
  if (finish_connect(s, lk)) return static_cast<size_t>(-1);
  const bool nb = nonblocking(s, flags);
  if (announce_maps(s, lk, nb)) return static_cast<size_t>(errno == EWOULDBLOCK ? would_block() : -1);
  const uint8_t* p = static_cast<const uint8_t*>(buf);
  size_t left = count;
  int ret = 0;
  while (left) {
    // The peer's mapping that holds offset (read from our table, which the peer writes).
    const IoEntry* e = nullptr;
    for (uint32_t i = 0; i < s->o.iomap_size && !e; i++) {
      const IoEntry* c = s->iomap_in() + i;
      const uint64_t off = le64toh(__atomic_load_n(&c->offset, __ATOMIC_ACQUIRE));
      if (__atomic_load_n(&c->valid, __ATOMIC_ACQUIRE) && static_cast<uint64_t>(offset) >= off &&
          static_cast<uint64_t>(offset) < off + le32toh(c->length))
        e = c;
    }
    if (!e) break;
    if (!writable(s)) {
      ret = fail_errno(ECONNRESET);
      break;
    }
    const uint64_t end = le64toh(e->offset) + le32toh(e->length);
    uint32_t n = 0;
    if (s->st == St::kConnected && s->sq_free > kCtrlReserve) {
      n = static_cast<uint32_t>(std::min<uint64_t>({left, kMaxChunk, end - static_cast<uint64_t>(offset)}));
      if (n > s->o.inline_size) n = sbuf_fit(s, n);
    }
    if (!n) {
      if (progressed(s)) continue;
      if (nb) {
        ret = fail_errno(EWOULDBLOCK);
        break;
      }
      wait_progress(s, lk);
      continue;
    }
    const uint64_t raddr = le64toh(e->addr) + (static_cast<uint64_t>(offset) - le64toh(e->offset));
    if ((ret = post(s, p, n, raddr, le32toh(e->rkey), 0, false))) break;
    p += n;
    left -= n;
    offset += n;
  }
  return (ret && left == count) ? static_cast<size_t>(ret) : count - left;
}

SR_EXPORT int rpoll(pollfd* fds, nfds_t nfds, int timeout) {
  bool any = false;
  for (nfds_t i = 0; i < nfds && !any; i++) any = lookup(fds[i].fd) != nullptr;
  if (!any) return poll(fds, nfds, timeout);
  const int64_t start = now_ns();
  const int64_t deadline = timeout < 0 ? INT64_MAX : start + int64_t{timeout} * 1'000'000;
  thread_local std::vector<pollfd> set;
  thread_local std::vector<Socket*> owners;
  for (;;) {
    for (nfds_t i = 0; i < nfds; i++) fds[i].revents = 0;
    int ready = check_all(fds, nfds);
    const int plain = poll_plain(fds, nfds);
    if (plain < 0) return -1;
    ready += plain;
    const int64_t now = now_ns();
    if (ready) return ready;
    if (now >= deadline) {
      sched_yield();  // as would_block: rpoll(0) in a loop
      return 0;
    }
    if (now - start < kSpinNs) continue;
    // Asleep: the rsockets' channels (completions and CM events) and the ordinary fds.
    set.clear();
    owners.clear();
    for (nfds_t i = 0; i < nfds; i++) {
      Socket* s = lookup(fds[i].fd);
      if (!s) {
        set.push_back(fds[i]);
        owners.push_back(nullptr);
        continue;
      }
      if (s->dg) {
        pollfd p[2];
        std::lock_guard lk(s->mu);
        for (int k = 0, n = dgram::sleep_fds(s->dg, p); k < n; k++) {
          set.push_back(p[k]);
          owners.push_back(s);
        }
        continue;
      }
      arm(s);
      set.push_back({s->ch->fd, POLLIN, 0});
      owners.push_back(s);
      if (s->cch) {
        set.push_back({s->cch->fd, POLLIN, 0});
        owners.push_back(s);
      }
    }
    if (check_all(fds, nfds)) continue;  // armed after the last look: look again before sleeping
    const int64_t left_ms = deadline == INT64_MAX ? -1 : std::max<int64_t>(0, (deadline - now_ns() + 999'999) / 1'000'000);
    if (poll(set.data(), set.size(), static_cast<int>(left_ms)) < 0 && errno != EINTR) return -1;
    for (size_t k = 0; k < set.size(); k++) {
      Socket* s = owners[k];
      if (!s || !(set[k].revents & POLLIN)) continue;
      std::lock_guard lk(s->mu);
      if (s->dg)
        dgram::woken(s->dg);
      else if (s->cch && set[k].fd == s->cch->fd)
        drain_cq_events(s);
      else
        drain_cm(s);
    }
  }
}

SR_EXPORT int rselect(int nfds, fd_set* readfds, fd_set* writefds, fd_set* exceptfds, timeval* timeout) {
  if (nfds < 0 || nfds > FD_SETSIZE) return fail_errno(EINVAL);
  thread_local std::vector<pollfd> fds;
  fds.clear();
  for (int fd = 0; fd < nfds; fd++) {
    short ev = 0;
    if (readfds && FD_ISSET(fd, readfds)) ev |= POLLIN;
    if (writefds && FD_ISSET(fd, writefds)) ev |= POLLOUT;
    if (exceptfds && FD_ISSET(fd, exceptfds)) ev |= POLLPRI;
    if (ev) fds.push_back({fd, ev, 0});
  }
  const int ms = timeout ? static_cast<int>(timeout->tv_sec * 1000 + (timeout->tv_usec + 999) / 1000) : -1;
  const int ret = rpoll(fds.data(), fds.size(), ms);
  if (ret < 0) return ret;
  if (readfds) FD_ZERO(readfds);
  if (writefds) FD_ZERO(writefds);
  if (exceptfds) FD_ZERO(exceptfds);
  int count = 0;
  for (const pollfd& p : fds) {
    if ((p.events & POLLIN) && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
      FD_SET(p.fd, readfds);
      count++;
    }
    if ((p.events & POLLOUT) && (p.revents & (POLLOUT | POLLERR))) {
      FD_SET(p.fd, writefds);
      count++;
    }
    if ((p.events & POLLPRI) && (p.revents & POLLPRI)) {
      FD_SET(p.fd, exceptfds);
      count++;
    }
  }
  return count;
}
