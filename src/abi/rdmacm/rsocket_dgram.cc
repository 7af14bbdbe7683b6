// Datagram rsockets: one UD QP per socket on the device of its address; a UDP socket (the rsocket's
// descriptor, bound where rbind says) finds the peers. Our own protocol, as the stream one:
// - To send to (IP, port) the first time, the socket sends a Hello over UDP there: its QPN and GID and the
//   IP it aimed at; the peer's rsocket (in any of its calls, or asleep in one: its UDP socket is among
//   the fds it sleeps on) records the sender, makes its QP on the device of that IP if it has none, and
//   answers with its own QPN and GID. Until the answer, a blocking send resends the Hello every 100 ms for
//   2 s (then the datagram is dropped, as UDP's to nobody), a non-blocking one fails with EAGAIN.
// - Data: one UD SEND per datagram, a DataHeader (the sender's IPv4 address and port, for rrecvfrom)
//   and the bytes; at most the path MTU (4096 on sr_lo) less the header, else EMSGSIZE.
// IPv4 only. Several devices behind a wildcard bind: the first peer's decides (one QP per socket).
#include "abi/rdmacm/rsocket_dgram.h"

#pragma GCC visibility push(default)
#include <rdma/rdma_cma.h>
#pragma GCC visibility pop

#include <arpa/inet.h>
#include <fcntl.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "abi/rdmacm/cm.h"

namespace softrdma::rdmacm::dgram {
namespace {

constexpr uint32_t kHelloMagic = 0x53524447;  // "SRDG"
constexpr uint32_t kHello = 1, kHelloAck = 2;
constexpr uint16_t kDataMagic = 0x5244;
constexpr uint32_t kSendSlots = 256;
// UD has no flow control: what comes while no receive is posted is lost. Room for bursts (4 MiB of
// slots at sr_lo's 4096-byte MTU).
constexpr uint32_t kRecvSlots = 1024;
constexpr uint32_t kGrh = 40;     // a UD receive's first bytes
constexpr uint32_t kInline = 64;
constexpr int64_t kHelloEveryNs = 100'000'000;
constexpr int64_t kResolveNs = 2'000'000'000;

struct Hello {  // over UDP, network order
  uint32_t magic;
  uint32_t type;
  uint32_t qpn;
  uint32_t dst_ip;  // the address the sender aimed at (the receiver's QP goes on its device)
  uint8_t gid[16];
};

struct DataHeader {  // before each datagram's bytes, network order
  uint16_t magic;
  uint16_t port;
  uint32_t ip;
};

struct Dest {
  sockaddr_in addr;
  ibv_ah* ah = nullptr;
  uint32_t qpn = 0;
  int64_t hello_ns = 0;  // last Hello sent
};



bool same(const sockaddr_in& a, const sockaddr_in& b) {
  return a.sin_addr.s_addr == b.sin_addr.s_addr && a.sin_port == b.sin_port;
}

}  // namespace

struct Dgram {
  int fd = -1;
  Device* dev = nullptr;
  uint8_t gid_index = 0;
  ibv_gid sgid{};
  uint32_t src_ip = 0;  // network order: the address of the QP's device
  uint16_t port = 0;    // network order: the UDP socket's, once known
  ibv_comp_channel* cch = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  uint32_t mtu = 0;  // bytes a UD message may carry
  uint8_t* rbuf = nullptr;
  uint8_t* sbuf = nullptr;
  ibv_mr* rmr = nullptr;
  ibv_mr* smr = nullptr;
  uint32_t r_next = 0, r_ready = 0;  // receive slots complete in order: the next one, how many are in
  uint32_t r_len[kRecvSlots]{};
  uint32_t s_next = 0, sq_free = kSendSlots;
  std::vector<Dest> dests;
  int conn = -1;  // rconnect's destination
  uint32_t idle = 0;

  uint32_t rslot() const { return kGrh + mtu; }
};

namespace {

void free_verbs(Dgram* d) {
  for (Dest& x : d->dests)
    if (x.ah) ibv_destroy_ah(x.ah);
  if (d->qp) ibv_destroy_qp(d->qp);
  if (d->cq) ibv_destroy_cq(d->cq);
  if (d->cch) ibv_destroy_comp_channel(d->cch);
  if (d->rmr) ibv_dereg_mr(d->rmr);
  if (d->smr) ibv_dereg_mr(d->smr);
  free(d->rbuf);
  free(d->sbuf);
  d->qp = nullptr;
  d->cq = nullptr;
  d->cch = nullptr;
  d->rmr = d->smr = nullptr;
  d->rbuf = d->sbuf = nullptr;
}

int post_recv(Dgram* d, uint32_t slot) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(d->rbuf + slot * d->rslot()), d->rslot(), d->rmr->lkey};
  ibv_recv_wr wr{}, *bad = nullptr;
  wr.wr_id = slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  return ibv_post_recv(d->qp, &wr, &bad);
}

int modify(ibv_qp* qp, ibv_qp_state state) {
  ibv_qp_attr a{};
  a.qp_state = state;
  int mask = IBV_QP_STATE;
  if (state == IBV_QPS_INIT) {
    a.pkey_index = 0;
    a.port_num = 1;
    a.qkey = RDMA_UDP_QKEY;
    mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
  } else if (state == IBV_QPS_RTS) {
    a.sq_psn = 0;
    mask |= IBV_QP_SQ_PSN;
  }
  return ibv_modify_qp(qp, &a, mask);
}

// The QP, on the device that holds local (an IPv4 address, network order), if there is none yet.
int ensure_qp(Dgram* d, uint32_t local) {
  if (d->qp) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = local;
  d->sgid = gid_of(reinterpret_cast<sockaddr*>(&a));
  {
    std::lock_guard lk(mu());
    d->dev = find_device(d->sgid, &d->gid_index);
  }
  if (!d->dev) return fail_errno(ENODEV);
  d->src_ip = local;
  d->mtu = 128u << d->dev->active_mtu;
  ibv_context* ctx = d->dev->verbs;
  d->cch = ibv_create_comp_channel(ctx);
  if (d->cch) {
    fcntl(d->cch->fd, F_SETFL, fcntl(d->cch->fd, F_GETFL) | O_NONBLOCK);
    d->cq = ibv_create_cq(ctx, kSendSlots + kRecvSlots, d, d->cch, 0);
  }
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = d->cq;
  qa.qp_type = IBV_QPT_UD;
  qa.cap = {kSendSlots, kRecvSlots, 1, 1, kInline};
  if (d->cq) d->qp = ibv_create_qp(d->dev->pd, &qa);
  d->rbuf = static_cast<uint8_t*>(malloc(size_t{kRecvSlots} * d->rslot()));
  d->sbuf = static_cast<uint8_t*>(malloc(size_t{kSendSlots} * d->mtu));
  if (d->rbuf && d->sbuf) {
    d->rmr = ibv_reg_mr(d->dev->pd, d->rbuf, size_t{kRecvSlots} * d->rslot(), IBV_ACCESS_LOCAL_WRITE);
    d->smr = ibv_reg_mr(d->dev->pd, d->sbuf, size_t{kSendSlots} * d->mtu, IBV_ACCESS_LOCAL_WRITE);
  }
  bool ok = d->qp && d->rmr && d->smr && !modify(d->qp, IBV_QPS_INIT) && !modify(d->qp, IBV_QPS_RTR) &&
            !modify(d->qp, IBV_QPS_RTS);
  for (uint32_t i = 0; ok && i < kRecvSlots; i++) ok = post_recv(d, i) == 0;
  if (ok) return 0;
  const int err = errno ? errno : ENOMEM;
  free_verbs(d);
  return fail_errno(err);
}

// The source address the kernel's routing picks towards dst (network order), 0 if none.
uint32_t route_source(const sockaddr_in& dst) {
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in src{};
  socklen_t len = sizeof src;
  const bool ok = connect(fd, reinterpret_cast<const sockaddr*>(&dst), sizeof dst) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&src), &len) == 0;
  close(fd);
  return ok ? src.sin_addr.s_addr : 0;
}

// The socket's own IPv4 address if it is bound to one, else 0.
uint32_t bound_ip(Dgram* d) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (::getsockname(d->fd, reinterpret_cast<sockaddr*>(&a), &len) || a.sin_family != AF_INET) return 0;
  return a.sin_addr.s_addr;
}

int find(Dgram* d, const sockaddr_in& a) {
  for (size_t i = 0; i < d->dests.size(); i++)
    if (same(d->dests[i].addr, a)) return static_cast<int>(i);
  return -1;
}

int find_or_add(Dgram* d, const sockaddr_in& a) {
  int i = find(d, a);
  if (i >= 0) return i;
  Dest x;
  x.addr = a;
  d->dests.push_back(x);
  return static_cast<int>(d->dests.size() - 1);
}

void send_hello(Dgram* d, Dest& x, uint32_t type) {
  Hello h{htonl(kHelloMagic), htonl(type), htonl(d->qp->qp_num), x.addr.sin_addr.s_addr, {}};
  memcpy(h.gid, d->sgid.raw, 16);
  sendto(d->fd, &h, sizeof h, MSG_DONTWAIT, reinterpret_cast<const sockaddr*>(&x.addr), sizeof x.addr);
  x.hello_ns = now_ns();
}

void learn(Dgram* d, Dest& x, const Hello& h) {
  ibv_ah_attr aa{};
  aa.is_global = 1;
  memcpy(aa.grh.dgid.raw, h.gid, 16);
  aa.grh.sgid_index = d->gid_index;
  aa.grh.hop_limit = 64;
  aa.port_num = 1;
  ibv_ah* ah = ibv_create_ah(d->dev->pd, &aa);
  if (!ah) return;
  if (x.ah) ibv_destroy_ah(x.ah);
  x.ah = ah;
  x.qpn = ntohl(h.qpn);
}

// Answers and takes in Hellos that came to the UDP socket; drops anything else there.
void read_udp(Dgram* d) {
  for (;;) {
    Hello h;
    sockaddr_in from{};
    socklen_t flen = sizeof from;
    const ssize_t n = recvfrom(d->fd, &h, sizeof h, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from), &flen);
    if (n < 0) return;
    if (n != sizeof h || ntohl(h.magic) != kHelloMagic || from.sin_family != AF_INET) continue;
    const uint32_t type = ntohl(h.type);
    if (type == kHello) {
      if (ensure_qp(d, h.dst_ip)) continue;
      Dest& x = d->dests[find_or_add(d, from)];
      learn(d, x, h);
      send_hello(d, x, kHelloAck);
    } else if (type == kHelloAck) {
      const int i = find(d, from);
      if (i >= 0 && d->qp) learn(d, d->dests[i], h);
    }
  }
}

// Looks at the UDP socket on one empty call in 64 (a syscall; Hellos are rare), and whenever no peer is
// known yet.
void maybe_read_udp(Dgram* d) {
  if (d->dests.empty() || (++d->idle & 63) == 0) read_udp(d);
}

// Takes what the CQ has: send slots back, receive slots in. Returns the completions.
int poll_cq(Dgram* d) {
  if (!d->cq) return 0;
  ibv_wc wc[32];
  int total = 0, n;
  while ((n = ibv_poll_cq(d->cq, 32, wc)) > 0) {
    total += n;
    for (int i = 0; i < n; i++) {
      if (wc[i].opcode & IBV_WC_RECV) {
        d->r_len[wc[i].wr_id] = wc[i].status == IBV_WC_SUCCESS ? wc[i].byte_len : 0;
        d->r_ready++;
      } else {
        d->sq_free++;
      }
    }
  }
  return total;
}

// Sleeps (the lock released) until the CQ or the UDP socket has something, at most timeout_ms.
void wait(Dgram* d, std::unique_lock<std::mutex>& lk, int timeout_ms) {
  pollfd p[2];
  const int n = sleep_fds(d, p);
  if (poll_cq(d)) return;
  lk.unlock();
  poll(p, static_cast<nfds_t>(n), timeout_ms);
  lk.lock();
  woken(d);
}

int would_block() {
  sched_yield();  // as rsocket.cc's: the caller calls again at once
  return fail_errno(EWOULDBLOCK);
}

}  // namespace

Dgram* create(int domain, int* fd) {
  if (domain != AF_INET) {  // IPv4 only, as the rest of this librdmacm
    errno = EAFNOSUPPORT;
    return nullptr;
  }
  const int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s < 0) return nullptr;
  Dgram* d = new Dgram;
  d->fd = *fd = s;
  return d;
}

void destroy(Dgram* d) {
  free_verbs(d);
  close(d->fd);
  delete d;
}

int bind(Dgram* d, const sockaddr* addr, socklen_t len) {
  if (!addr || len < sizeof(sockaddr_in)) return fail_errno(EINVAL);
  if (addr->sa_family != AF_INET) return fail_errno(EAFNOSUPPORT);
  if (::bind(d->fd, addr, len)) return -1;
  const uint32_t ip = reinterpret_cast<const sockaddr_in*>(addr)->sin_addr.s_addr;
  return ip == INADDR_ANY ? 0 : ensure_qp(d, ip);  // a wildcard: the first peer's device
}

namespace {

// The destination's index, its QP found (a Hello sent, again every 100 ms, until it answers).
int resolve(Dgram* d, const sockaddr* dst, socklen_t len) {
  if (len < sizeof(sockaddr_in)) return fail_errno(EINVAL);
  if (dst->sa_family != AF_INET) return fail_errno(EAFNOSUPPORT);
  const sockaddr_in& a = *reinterpret_cast<const sockaddr_in*>(dst);
  if (!d->qp) {
    uint32_t local = bound_ip(d);
    if (!local) local = route_source(a);
    if (!local) return fail_errno(ENETUNREACH);
    if (ensure_qp(d, local)) return -1;
  }
  const int i = find_or_add(d, a);
  if (!d->dests[i].ah) send_hello(d, d->dests[i], kHello);
  return i;
}

}  // namespace

int connect(Dgram* d, const sockaddr* addr, socklen_t len) {
  if (!addr) return fail_errno(EINVAL);
  const int i = resolve(d, addr, len);
  if (i < 0) return -1;
  d->conn = i;
  return 0;
}

int getsockname(Dgram* d, sockaddr* addr, socklen_t* len) { return ::getsockname(d->fd, addr, len); }

int getpeername(Dgram* d, sockaddr* addr, socklen_t* len) {
  if (d->conn < 0) return fail_errno(ENOTCONN);
  const sockaddr_in& a = d->dests[d->conn].addr;
  memcpy(addr, &a, std::min<socklen_t>(*len, sizeof a));
  *len = sizeof a;
  return 0;
}

int setsockopt(Dgram* d, int level, int name, const void* val, socklen_t len) {
  return ::setsockopt(d->fd, level, name, val, len);
}

ssize_t send(Dgram* d, std::unique_lock<std::mutex>& lk, const iovec* iov, int iovcnt, const sockaddr* dst,
             bool nonblock) {
  size_t total = 0;
  for (int i = 0; i < iovcnt; i++) total += iov[i].iov_len;
  int di = d->conn;
  if (dst) {
    if ((di = resolve(d, dst, sizeof(sockaddr_in))) < 0) return -1;
  } else if (di < 0) {
    return fail_errno(EDESTADDRREQ);
  }
  if (total > d->mtu - sizeof(DataHeader)) return fail_errno(EMSGSIZE);
  const int64_t deadline = now_ns() + kResolveNs;
  for (;;) {
    if (d->dests[di].ah && d->sq_free) break;
    if (!d->dests[di].ah) {
      read_udp(d);  // may add destinations: indexes stay, references do not
      Dest& x = d->dests[di];
      if (x.ah) continue;
      if (now_ns() - x.hello_ns > kHelloEveryNs) send_hello(d, x, kHello);
    }
    if (poll_cq(d)) continue;
    if (nonblock) return would_block();
    if (now_ns() > deadline) return static_cast<ssize_t>(total);  // nobody answers: dropped, as UDP's
    wait(d, lk, 10);
  }
  Dest& x = d->dests[di];
  uint8_t* slot = d->sbuf + d->s_next * d->mtu;
  if (!d->port) {  // bound by now (rbind, or the kernel at the first Hello)
    sockaddr_in me{};
    socklen_t mlen = sizeof me;
    ::getsockname(d->fd, reinterpret_cast<sockaddr*>(&me), &mlen);
    d->port = me.sin_port;
  }
  const DataHeader h{htons(kDataMagic), d->port, d->src_ip};
  memcpy(slot, &h, sizeof h);
  size_t off = sizeof h;
  for (int i = 0; i < iovcnt; i++) {
    memcpy(slot + off, iov[i].iov_base, iov[i].iov_len);
    off += iov[i].iov_len;
  }
  ibv_sge sge{reinterpret_cast<uintptr_t>(slot), static_cast<uint32_t>(off), d->smr->lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = d->s_next;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED | (off <= kInline ? IBV_SEND_INLINE : 0);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.wr.ud.ah = x.ah;
  wr.wr.ud.remote_qpn = x.qpn;
  wr.wr.ud.remote_qkey = RDMA_UDP_QKEY;
  if (int ret = ibv_post_send(d->qp, &wr, &bad)) return fail_errno(ret);
  d->s_next = (d->s_next + 1) % kSendSlots;
  d->sq_free--;
  return static_cast<ssize_t>(total);
}

ssize_t recv(Dgram* d, std::unique_lock<std::mutex>& lk, const iovec* iov, int iovcnt, sockaddr* src,
             socklen_t* srclen, bool nonblock, bool peek) {
  for (;;) {
    poll_cq(d);
    if (d->r_ready) {
      const uint32_t slot = d->r_next;
      const uint8_t* p = d->rbuf + slot * d->rslot() + kGrh;
      const uint32_t len = d->r_len[slot];
      DataHeader h{};
      if (len >= kGrh + sizeof h) memcpy(&h, p, sizeof h);
      const bool good = len >= kGrh + sizeof h && ntohs(h.magic) == kDataMagic;
      size_t n = 0;
      if (good) {
        size_t left = len - kGrh - sizeof h;
        const uint8_t* q = p + sizeof h;
        for (int i = 0; i < iovcnt && left; i++) {
          const size_t k = std::min(left, iov[i].iov_len);
          memcpy(iov[i].iov_base, q, k);
          q += k;
          left -= k;
          n += k;
        }
        if (src && srclen) {
          sockaddr_in a{};
          a.sin_family = AF_INET;
          a.sin_port = h.port;
          a.sin_addr.s_addr = h.ip;
          memcpy(src, &a, std::min<socklen_t>(*srclen, sizeof a));
          *srclen = sizeof a;
        }
      }
      if (!peek || !good) {
        d->r_next = (d->r_next + 1) % kRecvSlots;
        d->r_ready--;
        post_recv(d, slot);
      }
      if (good) return static_cast<ssize_t>(n);
      continue;  // not one of ours (or a flushed receive): the next
    }
    maybe_read_udp(d);
    if (nonblock) return would_block();
    wait(d, lk, -1);
  }
}

short revents(Dgram* d, short events) {
  if (!poll_cq(d)) maybe_read_udp(d);
  short r = 0;
  if (d->r_ready) r |= POLLIN;
  if (!d->qp || d->sq_free) r |= POLLOUT;
  return r & events;
}

int sleep_fds(Dgram* d, pollfd* out) {
  out[0] = {d->fd, POLLIN, 0};
  if (!d->cq) return 1;
  ibv_req_notify_cq(d->cq, 0);
  out[1] = {d->cch->fd, POLLIN, 0};
  return 2;
}

void woken(Dgram* d) {
  if (d->cch) {
    ibv_cq* cq;
    void* ctx;
    unsigned n = 0;
    while (ibv_get_cq_event(d->cch, &cq, &ctx) == 0) n++;
    if (n) ibv_ack_cq_events(d->cq, n);
  }
  read_udp(d);
}

}  // namespace softrdma::rdmacm::dgram
