// The CM service: one thread per process (started with the first id) that stands in for the kernel's
// rdma_cm and IB CM. It owns an epoll set over the ids' TCP sockets, accepts connections on listeners,
// reads the handshake messages and turns them into events, writes what the API side could not write at
// once, and times out connects. Everything runs under mu(); nothing here touches a QP.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <thread>
#include <unordered_map>
#include <vector>

#include "abi/rdmacm/cm.h"

namespace softrdma::rdmacm {
namespace {

struct Service {
  int epfd = -1;
  int wakefd = -1;  // eventfd: a new deadline
  uint64_t next_handle = 1;
  std::unordered_map<uint64_t, Id*> ids;  // by handle: every live id
};

Service& service();

constexpr int64_t kDreqTimeoutNs = 4'000'000'000;  // a DREQ nobody answers

// ---- what each message does, by the id's state ----

// The event keeps the private data; the application sees the IB CM's whole field, zero-padded.
const void* keep_private_data(Event* e, const wire::Conn& c) {
  memcpy(e->private_data, c.private_data, c.private_data_len);
  return e->private_data;
}

void fill_conn_event(Event* e, const wire::Conn& c, uint8_t padded_len) {
  rdma_conn_param& p = e->ev.param.conn;
  p.private_data = keep_private_data(e, c);
  p.private_data_len = padded_len;
  // The peer's figures seen from this side: its initiator depth is our responder resources.
  p.responder_resources = c.initiator_depth;
  p.initiator_depth = c.responder_resources;
  p.flow_control = c.flow_control;
  p.retry_count = c.retry_count;
  p.rnr_retry_count = c.rnr_retry_count;
  p.srq = c.srq;
  p.qp_num = c.qpn;
}

void fill_ud_event(Event* e, const wire::Conn& c, uint8_t padded_len) {
  rdma_ud_param& p = e->ev.param.ud;
  p.private_data = keep_private_data(e, c);
  p.private_data_len = padded_len;
  p.qp_num = c.qpn;
  p.qkey = c.qkey;
}

// No service here for a request (no listener of its kind, no device for the address): the IB CM's answers.
void refuse(Id* child, bool ud) {
  if (ud) {
    wire::Conn rep{};
    rep.status = wire::kSidrUnsupported;
    send_msg(child, wire::encode(wire::Type::kSidrRep, rep));
  } else {
    send_msg(child, wire::encode(wire::Rej{.reason = wire::kRejInvalidServiceId}));
  }
  child->state = State::kClosed;
}

// A connection request on a listener: the pending id becomes a child the application sees.
void on_req(Id* child, const wire::Message& m) {
  Id* lis = child->listener;
  const bool ud = m.type == wire::Type::kSidrReq;
  if (!lis || lis->state != State::kListening || ud != (lis->id.qp_type == IBV_QPT_UD))
    return refuse(child, ud);
  // The local address the peer reached selects the device (a listener on any address serves them all).
  sockaddr_storage local{}, peer{};
  socklen_t len = sizeof local;
  getsockname(child->fd, reinterpret_cast<sockaddr*>(&local), &len);
  len = sizeof peer;
  getpeername(child->fd, reinterpret_cast<sockaddr*>(&peer), &len);
  child->sgid = gid_of(reinterpret_cast<sockaddr*>(&local));
  child->dev = find_device(child->sgid, &child->gid_index);
  if (!child->dev) return refuse(child, ud);
  child->id.verbs = child->dev->verbs;
  child->id.pd = child->dev->pd;
  child->id.port_num = 1;
  child->id.context = lis->id.context;
  child->id.ps = lis->id.ps;
  child->id.qp_type = lis->id.qp_type;
  memcpy(&child->id.route.addr.src_storage, &local, sizeof local);
  memcpy(&child->id.route.addr.dst_storage, &peer, sizeof peer);
  memcpy(child->dgid.raw, m.conn.gid, 16);
  child->id.route.addr.addr.ibaddr.sgid = child->sgid;
  child->id.route.addr.addr.ibaddr.dgid = child->dgid;
  child->id.route.addr.addr.ibaddr.pkey = htons(0xffff);
  child->remote = m.conn;
  child->have_remote = true;
  child->path_mtu = std::min(static_cast<ibv_mtu>(m.conn.mtu), child->dev->active_mtu);
  // What the requester offered, as rdma_accept starts from it (its initiator depth bounds our
  // responder resources and the other way round).
  child->responder_resources = m.conn.initiator_depth;
  child->initiator_depth = m.conn.responder_resources;
  child->retry_count = m.conn.retry_count;
  child->rnr_retry_count = m.conn.rnr_retry_count;
  child->tos = lis->tos;
  child->ack_timeout = lis->ack_timeout;
  child->state = State::kReqReceived;
  child->listener = nullptr;

  Event* e = new_event(child, RDMA_CM_EVENT_CONNECT_REQUEST, 0);
  e->owner = lis;
  e->ev.listen_id = &lis->id;
  if (ud)
    fill_ud_event(e, m.conn, wire::kSidrReqPrivateData);
  else
    fill_conn_event(e, m.conn, wire::kReqPrivateData);
  // The event goes to the listener's channel; a synchronous listener's children are synchronous too.
  if (lis->sync) {
    auto* ch = new Channel;
    ch->ch.fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
    child->id.channel = &ch->ch;
    child->sync = true;
  } else {
    child->id.channel = lis->id.channel;
  }
  // Queued on the listener's channel even when the child has its own (rdma_get_request reads it there).
  to_channel(lis->id.channel)->queue.push_back(e);
  uint64_t one = 1;
  (void)!write(lis->id.channel->fd, &one, sizeof one);
}

void fail_connect(Id* id, rdma_cm_event_type type, int status) {
  Event* e = new_event(id, type, status);
  if (type == RDMA_CM_EVENT_REJECTED) fill_conn_event(e, wire::Conn{}, 0);
  queue_event(e);
  id->state = State::kClosed;
  id->deadline_ns = 0;
  close_socket(id);
}

void disconnected(Id* id) {
  if (id->state == State::kDisconnected || id->state == State::kClosed) return;
  id->state = State::kDisconnected;
  Event* e = new_event(id, RDMA_CM_EVENT_DISCONNECTED, 0);
  e->ev.param.conn.private_data = e->private_data;
  queue_event(e);
}

void on_message(Id* id, const wire::Message& m) {
  using wire::Type;
  switch (m.type) {
    case Type::kReq:
    case Type::kSidrReq:
      if (id->state == State::kPending) on_req(id, m);
      return;
    case Type::kRep:
      if (id->state != State::kConnecting) return;
      id->deadline_ns = 0;
      id->remote = m.conn;
      id->have_remote = true;
      id->path_mtu = static_cast<ibv_mtu>(m.conn.mtu);
      id->responder_resources = m.conn.initiator_depth;
      id->initiator_depth = m.conn.responder_resources;
      id->rnr_retry_count = m.conn.rnr_retry_count;
      id->state = State::kRepReceived;
      {
        // Made ESTABLISHED (QP to RTR/RTS, RTU) by rdma_get_cm_event when the id has a QP, as rdma-core.
        Event* e = new_event(id, RDMA_CM_EVENT_CONNECT_RESPONSE, 0);
        fill_conn_event(e, m.conn, wire::kRepPrivateData);
        e->remote = m.conn;
        queue_event(e);
      }
      return;
    case Type::kSidrRep:
      if (id->state != State::kConnecting) return;
      id->deadline_ns = 0;
      if (m.conn.status != wire::kSidrSuccess) {
        Event* e = new_event(id, RDMA_CM_EVENT_UNREACHABLE, m.conn.status);
        fill_ud_event(e, m.conn, wire::kSidrRepPrivateData);
        queue_event(e);
        id->state = State::kClosed;
      } else {
        id->remote = m.conn;
        id->have_remote = true;
        id->state = State::kConnected;
        Event* e = new_event(id, RDMA_CM_EVENT_ESTABLISHED, 0);
        fill_ud_event(e, m.conn, wire::kSidrRepPrivateData);
        ibv_ah_attr& ah = e->ev.param.ud.ah_attr;
        ah.is_global = 1;
        memcpy(ah.grh.dgid.raw, m.conn.gid, 16);
        ah.grh.sgid_index = id->gid_index;
        ah.grh.hop_limit = 64;
        ah.grh.traffic_class = id->tos;
        ah.port_num = id->id.port_num;
        queue_event(e);
      }
      close_socket(id);  // SIDR is over; the active side closes first (TIME_WAIT stays on its port)
      return;
    case Type::kRej:
      // To a REQ, or to our REP (the active side could not bring its QP up).
      if (id->state != State::kConnecting && id->state != State::kRepReceived && id->state != State::kRepSent)
        return;
      {
        Event* e = new_event(id, RDMA_CM_EVENT_REJECTED, m.rej.reason);
        wire::Conn c{};
        c.private_data_len = m.rej.private_data_len;
        memcpy(c.private_data, m.rej.private_data, m.rej.private_data_len);
        fill_conn_event(e, c, wire::kRejPrivateData);
        queue_event(e);
      }
      id->deadline_ns = 0;
      if (id->state != State::kRepSent) close_socket(id);  // the passive side lets the peer close first
      id->state = State::kClosed;
      return;
    case Type::kRtu:
      if (id->state != State::kRepSent) return;
      id->state = State::kConnected;
      id->deadline_ns = 0;
      {
        Event* e = new_event(id, RDMA_CM_EVENT_ESTABLISHED, 0);
        fill_conn_event(e, wire::Conn{}, 0);
        queue_event(e);
      }
      return;
    case Type::kDreq:
      if (id->state == State::kConnected || id->state == State::kDisconnecting ||
          id->state == State::kRepSent || id->state == State::kRepReceived) {
        send_msg(id, wire::encode(Type::kDrep));
        disconnected(id);
      }
      return;
    case Type::kDrep:
      if (id->state == State::kDisconnecting) {
        disconnected(id);
        close_socket(id);
      }
      return;
  }
}

// Nobody listens (yet): closes the socket and schedules another attempt, while the grace lasts.
bool retry_refused(Id* id) {
  const int64_t now = now_ns();
  id->retry_delay_ms = std::clamp(id->retry_delay_ms * 2, 10, 100);
  const int64_t at = now + static_cast<int64_t>(id->retry_delay_ms) * 1'000'000;
  if (at > id->refused_until_ns) return false;
  epoll_ctl(service().epfd, EPOLL_CTL_DEL, id->fd, nullptr);
  close(id->fd);
  id->fd = -1;
  id->retry_pending = true;
  id->deadline_ns = at;
  return true;
}

// The peer closed the connection (or it failed): what that means in each state.
void on_closed(Id* id, int err) {
  switch (id->state) {
    case State::kPending:
    case State::kClosed:
      id->state = State::kClosed;
      break;
    case State::kConnecting:
      if (!id->tcp_connected) {
        if (err == ECONNREFUSED && retry_refused(id)) return;
        if (err == ECONNREFUSED && id->id.qp_type == IBV_QPT_UD)
          fail_connect(id, RDMA_CM_EVENT_UNREACHABLE, wire::kSidrUnsupported);  // the SIDR REP's status
        else if (err == ECONNREFUSED)
          fail_connect(id, RDMA_CM_EVENT_REJECTED, wire::kRejInvalidServiceId);
        else
          fail_connect(id, RDMA_CM_EVENT_UNREACHABLE, -(err ? err : ECONNRESET));
      } else {
        // Gone before it answered: the IB CM rejects for the peer's destroyed id the same way.
        fail_connect(id, RDMA_CM_EVENT_REJECTED, wire::kRejTimeout);
      }
      return;
    case State::kReqReceived:
      id->peer_closed = true;  // rdma_accept will report CONNECT_ERROR
      break;
    case State::kRepSent: {
      Event* e = new_event(id, RDMA_CM_EVENT_CONNECT_ERROR, -ECONNRESET);
      queue_event(e);
      id->state = State::kClosed;
      break;
    }
    case State::kRepReceived:
    case State::kConnected:
    case State::kDisconnecting:
      id->peer_closed = true;
      if (id->id.qp_type == IBV_QPT_UD) {
        id->state = State::kClosed;  // SIDR is over: nothing to report
      } else {
        disconnected(id);
      }
      break;
    default:
      break;
  }
  close_socket(id);
}

void flush(Id* id) {
  while (!id->out.empty() && id->fd >= 0 && id->tcp_connected) {
    ssize_t n = send(id->fd, id->out.data(), id->out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      id->out.erase(0, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;  // EAGAIN: EPOLLOUT resumes; an error shows as EPOLLERR/HUP
    }
  }
}

void on_accept(Id* lis) {
  for (;;) {
    int fd = accept4(lis->fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto* child = new Id;
    child->fd = fd;
    child->tcp_connected = true;
    child->state = State::kPending;
    child->listener = lis;
    child->id.channel = lis->id.channel;
    register_id(child);
    watch(child);
  }
}

void on_io(Id* id, uint32_t events) {
  if (id->fd < 0) return;
  if (id->state == State::kListening) {
    on_accept(id);
    return;
  }
  if (!id->tcp_connected && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(id->fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err) {
      on_closed(id, err);
      return;
    }
    id->tcp_connected = true;
    // Connected: the REQ goes out; now the peer's application has a minute to answer.
    id->deadline_ns = now_ns() + kRepTimeoutNs;
    id->out = id->req;
  }
  if (events & EPOLLOUT) flush(id);
  if (events & (EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLRDHUP)) {
    char buf[4096];
    for (;;) {
      ssize_t n = recv(id->fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        id->in.append(buf, static_cast<size_t>(n));
        continue;
      }
      int err = n < 0 ? errno : 0;
      if (n < 0 && (err == EAGAIN || err == EINTR)) break;
      // EOF or error: handle what came before it first.
      bool bad = false;
      while (auto m = wire::decode(&id->in, &bad)) on_message(id, *m);
      if (id->fd >= 0) on_closed(id, err);
      return;
    }
    bool bad = false;
    while (id->fd >= 0) {
      auto m = wire::decode(&id->in, &bad);
      if (!m) break;
      on_message(id, *m);
    }
    if (bad && id->fd >= 0) on_closed(id, EPROTO);
  }
  if (id->fd >= 0) watch(id);
}

void on_timeout(Id* id) {
  id->deadline_ns = 0;
  if (id->state == State::kDisconnecting) {
    // No DREP (the peer's host went away without closing): disconnected all the same, as the IB CM's
    // DREQ timeout.
    disconnected(id);
    close_socket(id);
    return;
  }
  if (id->state == State::kRepSent) {
    // No RTU: the active side's application never established the connection.
    queue_event(new_event(id, RDMA_CM_EVENT_CONNECT_ERROR, -ETIMEDOUT));
    send_msg(id, wire::encode(wire::Rej{.reason = wire::kRejTimeout}));
    id->state = State::kClosed;
    return;
  }
  if (id->state != State::kConnecting) return;
  if (id->retry_pending) {
    id->retry_pending = false;
    start_connect(id);
  } else {
    fail_connect(id, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
  }
}

void run() {
  Service& s = service();
  epoll_event evs[64];
  for (;;) {
    int timeout_ms = -1;
    {
      std::lock_guard lk(mu());
      const int64_t now = now_ns();
      for (auto& [h, id] : s.ids) {
        if (!id->deadline_ns) continue;
        int64_t ms = (id->deadline_ns - now) / 1'000'000 + 1;
        if (ms < 0) ms = 0;
        if (timeout_ms < 0 || ms < timeout_ms) timeout_ms = static_cast<int>(ms);
      }
    }
    int n = epoll_wait(s.epfd, evs, 64, timeout_ms);
    std::lock_guard lk(mu());
    for (int i = 0; i < n; ++i) {
      if (evs[i].data.u64 == 0) {
        uint64_t v;
        (void)!read(s.wakefd, &v, sizeof v);
        continue;
      }
      auto it = s.ids.find(evs[i].data.u64);
      if (it != s.ids.end()) on_io(it->second, evs[i].events);
    }
    const int64_t now = now_ns();
    std::vector<Id*> due;
    for (auto& [h, id] : s.ids)
      if (id->deadline_ns && id->deadline_ns <= now) due.push_back(id);
    for (Id* id : due) on_timeout(id);
    // Pending ids whose connection closed before a REQ are the service's own to free.
    std::vector<Id*> dead;
    for (auto& [h, id] : s.ids)
      if (id->state == State::kClosed && id->listener && id->fd < 0) dead.push_back(id);
    for (Id* id : dead) {
      unregister_id(id);
      delete id;
    }
  }
}

Service& service() {
  static Service* s = [] {
    auto* sv = new Service;  // never freed: the thread runs until the process exits
    sv->epfd = epoll_create1(EPOLL_CLOEXEC);
    sv->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = 0;
    epoll_ctl(sv->epfd, EPOLL_CTL_ADD, sv->wakefd, &ev);
    return sv;
  }();
  return *s;
}

void start_thread() {
  static std::once_flag once;
  std::call_once(once, [] { std::thread(run).detach(); });
}

}  // namespace

std::mutex& mu() {
  static auto* m = new std::mutex;
  return *m;
}

std::condition_variable& acked_cv() {
  static auto* cv = new std::condition_variable;
  return *cv;
}

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

int open_socket(Id* id, const sockaddr* addr, int* out) {
  int fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // A named port is a service: rebinding it must not wait for old connections' TIME_WAIT.
  if (port_of(addr) || id->reuseaddr) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (addr->sa_family == AF_INET6 && id->afonly >= 0)
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &id->afonly, sizeof id->afonly);
  if (bind(fd, addr, addr_len(addr)) < 0) {
    int err = errno;
    close(fd);
    return err;
  }
  *out = fd;
  return 0;
}

void start_connect(Id* id) {
  id->tcp_connected = false;
  id->in.clear();
  id->out.clear();
  int err = 0;
  if (id->fd < 0) err = open_socket(id, &id->id.route.addr.src_addr, &id->fd);  // a retry: same address
  const sockaddr* dst = &id->id.route.addr.dst_addr;
  if (!err && connect(id->fd, dst, addr_len(dst)) < 0 && errno != EINPROGRESS) err = errno;
  if (err) {
    on_closed(id, err);  // refused at once (retried while the grace lasts) or no route
    return;
  }
  // The TCP connect must succeed within the application's timeout; writable means done (either way).
  id->deadline_ns = id->connect_deadline_ns;
  watch(id);
  wake_service();
}

void disconnect(Id* id) {
  send_msg(id, wire::encode(wire::Type::kDreq));
  id->state = State::kDisconnecting;
  id->deadline_ns = now_ns() + kDreqTimeoutNs;
  wake_service();
}

void drop_pending(Id* listener) {
  std::vector<Id*> pending;
  for (auto& [h, id] : service().ids)
    if (id->listener == listener) pending.push_back(id);
  for (Id* id : pending) {
    unregister_id(id);  // the peer sees its connection close before any answer: REJECTED
    delete id;
  }
}

void register_id(Id* id) {
  Service& s = service();
  id->handle = s.next_handle++;
  // The PSN is the id's from the start: an application that moves its own QP (rping -q) reads it through
  // rdma_init_qp_attr before it accepts.
  if (getrandom(&id->psn, sizeof id->psn, 0) != sizeof id->psn) id->psn = static_cast<uint32_t>(now_ns());
  id->psn &= 0xffffff;
  s.ids[id->handle] = id;
  start_thread();
}

void unregister_id(Id* id) {
  close_socket(id);
  service().ids.erase(id->handle);
}

void watch(Id* id) {
  if (id->fd < 0) return;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  if (!id->out.empty() || !id->tcp_connected) ev.events |= EPOLLOUT;
  if (id->state == State::kListening) ev.events = EPOLLIN;
  ev.data.u64 = id->handle;
  if (epoll_ctl(service().epfd, EPOLL_CTL_MOD, id->fd, &ev) < 0 && errno == ENOENT)
    epoll_ctl(service().epfd, EPOLL_CTL_ADD, id->fd, &ev);
}

void wake_service() {
  uint64_t one = 1;
  (void)!write(service().wakefd, &one, sizeof one);
}

Event* new_event(Id* id, rdma_cm_event_type type, int status) {
  auto* e = new Event;
  e->ev.id = &id->id;
  e->ev.event = type;
  e->ev.status = status;
  e->owner = id;
  return e;
}

void queue_event(Event* e) {
  Id* id = reinterpret_cast<Id*>(e->ev.id);
  to_channel(id->id.channel)->queue.push_back(e);
  uint64_t one = 1;
  (void)!write(id->id.channel->fd, &one, sizeof one);
}

void send_msg(Id* id, const std::string& msg) {
  if (id->fd < 0) return;
  id->out += msg;
  flush(id);
  watch(id);
}

void close_socket(Id* id) {
  if (id->fd < 0) return;
  flush(id);
  epoll_ctl(service().epfd, EPOLL_CTL_DEL, id->fd, nullptr);
  close(id->fd);
  id->fd = -1;
  id->out.clear();
  id->in.clear();
}

}  // namespace softrdma::rdmacm
