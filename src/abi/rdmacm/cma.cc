// The rdma_cm API (rdma_cma.h): ids, event channels, addresses, QPs and the connection calls. What the
// kernel does for rdma-core's librdmacm, the service thread does here (service.cc); the QP state changes
// and the synchronous mode (a NULL channel: each call waits for its event) follow rdma-core's librdmacm.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "abi/rdmacm/cm.h"

using namespace softrdma::rdmacm;

namespace {

int fail(int err) {
  errno = err;
  return -1;
}

// rdma-core's librdmacm fails every call with ENODEV when there is no RDMA device.
int init() {
  std::lock_guard lk(mu());
  int n = 0;
  all_devices(&n);
  return n ? 0 : ENODEV;
}

Channel* new_channel() {
  int fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
  if (fd < 0) return nullptr;
  auto* ch = new Channel;
  ch->ch.fd = fd;
  return ch;
}

// Destroys a channel (see Channel for one that readers are still inside). Under mu().
// Its memory is kept a while: a thread of the application may still call rdma_get_cm_event on it (rping's
// event thread does, while its main thread destroys the channel), so it must find `dead` set rather than
// freed memory.
void free_channel(Channel* ch) {
  static auto* const quarantine = new std::deque<Channel*>;  // never destroyed: what it holds stays reachable
  constexpr size_t kQuarantine = 64;
  for (Event* e : ch->queue) delete e;
  ch->queue.clear();
  ch->dead = true;
  if (ch->readers) return;
  close(ch->ch.fd);
  ch->ch.fd = -1;
  quarantine->push_back(ch);
  if (quarantine->size() > kQuarantine) {
    delete quarantine->front();
    quarantine->pop_front();
  }
}

bool is_any(const sockaddr* a) {
  if (a->sa_family == AF_INET) return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr == INADDR_ANY;
  return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr);
}

// The id takes the device that holds its source address. Under mu().
int attach_device(Id* id, const sockaddr* src) {
  id->sgid = gid_of(src);
  Device* d = find_device(id->sgid, &id->gid_index);
  if (!d) return ENODEV;
  id->dev = d;
  id->id.verbs = d->verbs;
  id->id.pd = d->pd;
  id->id.port_num = 1;
  id->id.route.addr.addr.ibaddr.sgid = id->sgid;
  id->id.route.addr.addr.ibaddr.pkey = htons(0xffff);
  return 0;
}

// A TCP socket bound to addr (port 0: an ephemeral one, which the id then reports as its port), and the
// device of that address unless it is the any-address. Under mu().
int bind_socket(Id* id, const sockaddr* addr) {
  if (addr->sa_family != AF_INET && addr->sa_family != AF_INET6) return EAFNOSUPPORT;
  int fd;
  if (int err = open_socket(id, addr, &fd)) return err;
  if (!is_any(addr)) {
    if (int err = attach_device(id, addr)) {
      close(fd);
      return err;
    }
  }
  socklen_t len = sizeof id->id.route.addr.src_storage;
  getsockname(fd, &id->id.route.addr.src_addr, &len);
  id->fd = fd;
  id->state = State::kBound;
  return 0;
}

// The source address the kernel's routing picks towards dst (a connected UDP socket's name).
int route_source(const sockaddr* dst, sockaddr_storage* src) {
  int fd = socket(dst->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  sockaddr_storage d{};
  memcpy(&d, dst, addr_len(dst));
  if (port_of(dst) == 0) reinterpret_cast<sockaddr_in*>(&d)->sin_port = htons(9);  // any port routes
  int err = 0;
  socklen_t len = sizeof *src;
  if (connect(fd, reinterpret_cast<sockaddr*>(&d), addr_len(dst)) < 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(src), &len) < 0)
    err = errno;
  close(fd);
  return err;
}

// For a synchronous id: waits for its next event and turns a failure into errno (rdma-core's
// ucma_complete). Callers read `sync` when they begin: an asynchronous id's event thread may destroy it as
// soon as the request is out (cmtime's server did, under TSan: rdma_accept read the freed id here).
int complete(Id* id) {
  if (id->id.event) {
    rdma_ack_cm_event(id->id.event);
    id->id.event = nullptr;
  }
  if (rdma_get_cm_event(id->id.channel, &id->id.event)) return -1;
  const rdma_cm_event* ev = id->id.event;
  if (!ev->status) return 0;
  if (ev->event == RDMA_CM_EVENT_REJECTED) return fail(ECONNREFUSED);
  return fail(ev->status < 0 ? -ev->status : ev->status);
}

int modify(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  int err = ibv_modify_qp(qp, attr, mask);
  return err ? fail(err) : 0;
}

int qp_to_state(Id* id, ibv_qp* qp, ibv_qp_state state) {
  ibv_qp_attr attr{};
  int mask = 0;
  attr.qp_state = state;
  if (rdma_init_qp_attr(&id->id, &attr, &mask)) return -1;
  return modify(qp, &attr, mask);
}

int qp_to_err(ibv_qp* qp) {
  if (!qp) return 0;
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  return modify(qp, &attr, IBV_QP_STATE);
}

// A connected QP: INIT again (now with the access flags the negotiation allows), RTR, RTS.
int qp_to_rts(Id* id) {
  if (!id->id.qp) return 0;
  if (qp_to_state(id, id->id.qp, IBV_QPS_INIT) || qp_to_state(id, id->id.qp, IBV_QPS_RTR) ||
      qp_to_state(id, id->id.qp, IBV_QPS_RTS))
    return -1;
  return 0;
}

// rdma-core's check of connect/accept parameters (RC only): a QP or parameters, and depths within the
// device's.
int check_param(Id* id, const rdma_conn_param* p) {
  if (id->id.ps != RDMA_PS_TCP) return 0;
  if (!id->id.qp && !p) return EINVAL;
  if (!p || !id->dev) return 0;
  if (p->responder_resources != RDMA_MAX_RESP_RES &&
      p->responder_resources > id->dev->max_responder_resources)
    return EINVAL;
  if (p->initiator_depth != RDMA_MAX_INIT_DEPTH && p->initiator_depth > id->dev->max_initiator_depth)
    return EINVAL;
  return 0;
}

void copy_private(wire::Conn* c, const void* data, uint8_t len) {
  if (!data || !len) return;
  memcpy(c->private_data, data, len);
  c->private_data_len = len;
}

Id* create_id(rdma_event_channel* channel, void* context, rdma_port_space ps, ibv_qp_type qp_type) {
  Channel* own = nullptr;
  if (!channel) {
    own = new_channel();
    if (!own) return nullptr;
  }
  auto* id = new Id;
  id->id.channel = own ? &own->ch : channel;
  id->sync = own != nullptr;
  id->id.context = context;
  id->id.ps = ps;
  id->id.qp_type = qp_type;
  std::lock_guard lk(mu());
  register_id(id);
  return id;
}

int create_id_checked(rdma_event_channel* channel, rdma_cm_id** out, void* context, rdma_port_space ps,
                      ibv_qp_type qp_type) {
  if (!out) return fail(EINVAL);
  if (int err = init()) return fail(err);
  Id* id = create_id(channel, context, ps, qp_type);
  if (!id) return -1;
  *out = &id->id;
  return 0;
}

// Takes the id's queued, not yet reported events off its channel (their counts stay on the eventfd and
// are skipped by the reader). Under mu().
template <typename Pred>
std::vector<Event*> withdraw(Channel* ch, Pred pred) {
  std::vector<Event*> out;
  for (auto it = ch->queue.begin(); it != ch->queue.end();) {
    if (pred(*it)) {
      out.push_back(*it);
      it = ch->queue.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

void ack_locked(rdma_cm_event* event) {
  auto* e = reinterpret_cast<Event*>(event);
  e->owner->acked++;
  acked_cv().notify_all();
  delete e;
}

// Answers a connection request with a rejection: REJ (RC) or a SIDR REP with status "reject" (UD).
// Under mu().
void send_reject(Id* id, int reason, const void* data, uint8_t len) {
  if (id->id.qp_type == IBV_QPT_UD) {
    wire::Conn rep{};
    rep.status = wire::kSidrReject;
    copy_private(&rep, data, len);
    send_msg(id, wire::encode(wire::Type::kSidrRep, rep));
    return;
  }
  wire::Rej rej{};
  rej.reason = static_cast<uint8_t>(reason);
  if (data && len) {
    memcpy(rej.private_data, data, len);
    rej.private_data_len = len;
  }
  send_msg(id, wire::encode(rej));
}

// Frees an id the application never saw (a request withdrawn with its listener), answering its peer.
void drop_child(Id* child) {
  if (child->state == State::kReqReceived) send_reject(child, wire::kRejConsumerDefined, nullptr, 0);
  unregister_id(child);
  if (child->sync) free_channel(to_channel(child->id.channel));
  delete child;
}

int reject(rdma_cm_id* cm_id, const void* data, uint8_t len, int reason) {
  if (!cm_id) return fail(EINVAL);
  Id* id = to_id(cm_id);
  const bool ud = cm_id->qp_type == IBV_QPT_UD;
  if (len > (ud ? wire::kSidrRepPrivateData : wire::kRejPrivateData)) return fail(EINVAL);
  std::lock_guard lk(mu());
  if (id->state != State::kReqReceived) return fail(EINVAL);
  send_reject(id, reason, data, len);
  id->state = State::kClosed;
  return 0;
}

// An event as rdma_get_cm_event hands it out: a REP on an id with a QP becomes ESTABLISHED (QP to
// RTR/RTS, then RTU), a REJECTED puts the QP in error, as rdma-core's librdmacm does.
void process(Event* e) {
  Id* id = to_id(e->ev.id);
  switch (e->ev.event) {
    case RDMA_CM_EVENT_CONNECT_RESPONSE: {
      if (!id->id.qp) return;  // the application moves its QP and calls rdma_establish
      const bool ok = qp_to_rts(id) == 0;
      const int err = errno;
      std::lock_guard lk(mu());
      if (ok) {
        e->ev.event = RDMA_CM_EVENT_ESTABLISHED;
        if (id->state == State::kRepReceived) {
          send_msg(id, wire::encode(wire::Type::kRtu));
          id->state = State::kConnected;
        }
      } else {
        e->ev.event = RDMA_CM_EVENT_CONNECT_ERROR;
        e->ev.status = -err;
        send_msg(id, wire::encode(wire::Rej{.reason = wire::kRejConsumerDefined}));
        id->state = State::kClosed;
        qp_to_err(id->id.qp);
      }
      return;
    }
    case RDMA_CM_EVENT_REJECTED:
      qp_to_err(id->id.qp);
      return;
    default:
      return;
  }
}

}  // namespace

// ---- event channels and events ----

SR_EXPORT rdma_event_channel* rdma_create_event_channel() {
  if (int err = init()) {
    errno = err;
    return nullptr;
  }
  Channel* ch = new_channel();
  return ch ? &ch->ch : nullptr;
}

SR_EXPORT void rdma_destroy_event_channel(rdma_event_channel* channel) {
  if (!channel) return;
  std::lock_guard lk(mu());
  free_channel(to_channel(channel));
}

SR_EXPORT int rdma_get_cm_event(rdma_event_channel* channel, rdma_cm_event** event) {
  if (!channel || !event) return fail(EINVAL);
  Channel* ch = to_channel(channel);
  // Destroyed under us, or before this call: never returns (Channel). With rdma-core the caller is then
  // blocked in read() on the channel's fd, which closing it does not wake; had it come a moment later, it
  // would read a closed fd and fail with EBADF, which rping's event thread answers with exit(-1) (seen
  // under TSan, whose slowness opens that window).
  const auto park = [](std::unique_lock<std::mutex>& lk) {
    static auto* never = new std::condition_variable;
    for (;;) never->wait(lk);
  };
  {
    std::unique_lock lk(mu());
    if (ch->dead) park(lk);
    ch->readers++;
  }
  Event* e = nullptr;
  for (;;) {
    uint64_t count;
    const ssize_t n = read(channel->fd, &count, sizeof count);
    const int err = errno;
    std::unique_lock lk(mu());
    if (ch->dead) park(lk);
    if (n < 0 && err == EINTR) continue;
    if (n < 0 || !ch->queue.empty()) {
      ch->readers--;
      if (n < 0) return fail(err);  // EAGAIN on a non-blocking channel with nothing queued
      e = ch->queue.front();
      ch->queue.pop_front();
      e->owner->reported++;
      break;
    }
    // A withdrawn event's count: wait for the next.
  }
  process(e);
  *event = &e->ev;
  return 0;
}

SR_EXPORT int rdma_ack_cm_event(rdma_cm_event* event) {
  if (!event) return fail(EINVAL);
  std::lock_guard lk(mu());
  ack_locked(event);
  return 0;
}

SR_EXPORT const char* rdma_event_str(rdma_cm_event_type event) {
  static const char* const kNames[] = {
      "RDMA_CM_EVENT_ADDR_RESOLVED",  "RDMA_CM_EVENT_ADDR_ERROR",      "RDMA_CM_EVENT_ROUTE_RESOLVED",
      "RDMA_CM_EVENT_ROUTE_ERROR",    "RDMA_CM_EVENT_CONNECT_REQUEST", "RDMA_CM_EVENT_CONNECT_RESPONSE",
      "RDMA_CM_EVENT_CONNECT_ERROR",  "RDMA_CM_EVENT_UNREACHABLE",     "RDMA_CM_EVENT_REJECTED",
      "RDMA_CM_EVENT_ESTABLISHED",    "RDMA_CM_EVENT_DISCONNECTED",    "RDMA_CM_EVENT_DEVICE_REMOVAL",
      "RDMA_CM_EVENT_MULTICAST_JOIN", "RDMA_CM_EVENT_MULTICAST_ERROR", "RDMA_CM_EVENT_ADDR_CHANGE",
      "RDMA_CM_EVENT_TIMEWAIT_EXIT"};
  if (event < RDMA_CM_EVENT_ADDR_RESOLVED || event > RDMA_CM_EVENT_TIMEWAIT_EXIT) return "UNKNOWN EVENT";
  return kNames[event];
}

// ---- ids ----

SR_EXPORT int rdma_create_id(rdma_event_channel* channel, rdma_cm_id** id, void* context,
                             rdma_port_space ps) {
  ibv_qp_type qp_type;
  switch (ps) {
    case RDMA_PS_TCP:
    case RDMA_PS_IB:
      qp_type = IBV_QPT_RC;
      break;
    case RDMA_PS_UDP:
    case RDMA_PS_IPOIB:
      qp_type = IBV_QPT_UD;
      break;
    default:
      return fail(EINVAL);
  }
  return create_id_checked(channel, id, context, ps, qp_type);
}

SR_EXPORT int rdma_destroy_id(rdma_cm_id* cm_id) {
  if (!cm_id) return fail(EINVAL);
  Id* id = to_id(cm_id);
  std::unique_lock lk(mu());
  Channel* ch = to_channel(cm_id->channel);
  // Requests on a listener that nobody took: answered and freed with it.
  for (Event* e : withdraw(ch, [&](Event* e) { return e->owner == id; })) {
    if (e->ev.event == RDMA_CM_EVENT_CONNECT_REQUEST && e->ev.id != cm_id) drop_child(to_id(e->ev.id));
    delete e;
  }
  for (Event* e : withdraw(ch, [&](Event* e) { return e->ev.id == cm_id; })) delete e;
  if (id->state == State::kListening) drop_pending(id);
  // The peer learns of it as the kernel's rdma_cm would tell it: DREQ, or REJ to a request.
  switch (id->state) {
    case State::kConnected:
    case State::kRepSent:
    case State::kRepReceived:
      if (cm_id->qp_type != IBV_QPT_UD) send_msg(id, wire::encode(wire::Type::kDreq));  // then closed
      break;
    case State::kReqReceived:
      send_reject(id, wire::kRejConsumerDefined, nullptr, 0);
      break;
    default:
      break;
  }
  unregister_id(id);
  if (cm_id->event) {
    ack_locked(cm_id->event);
    cm_id->event = nullptr;
  }
  acked_cv().wait(lk, [&] { return id->acked >= id->reported; });
  if (id->sync) free_channel(ch);
  delete id;
  return 0;
}

SR_EXPORT int rdma_migrate_id(rdma_cm_id* cm_id, rdma_event_channel* channel) {
  if (!cm_id) return fail(EINVAL);
  Id* id = to_id(cm_id);
  if (id->sync && !channel) return fail(EINVAL);
  Channel* own = nullptr;
  if (!channel) {
    own = new_channel();
    if (!own) return -1;
    channel = &own->ch;
  }
  std::unique_lock lk(mu());
  Channel* old = to_channel(cm_id->channel);
  Channel* to = to_channel(channel);
  for (Event* e : withdraw(old, [&](Event* e) { return e->owner == id || e->ev.id == cm_id; })) {
    to->queue.push_back(e);
    uint64_t one = 1;
    (void)!write(channel->fd, &one, sizeof one);
  }
  if (id->sync) {
    if (cm_id->event) {
      ack_locked(cm_id->event);
      cm_id->event = nullptr;
    }
    free_channel(old);
  }
  cm_id->channel = channel;
  id->sync = own != nullptr;
  acked_cv().wait(lk, [&] { return id->acked >= id->reported; });
  return 0;
}

// ---- addresses ----

SR_EXPORT int rdma_bind_addr(rdma_cm_id* cm_id, sockaddr* addr) {
  if (!cm_id || !addr) return fail(EINVAL);
  Id* id = to_id(cm_id);
  std::lock_guard lk(mu());
  if (id->state != State::kIdle) return fail(EINVAL);
  if (int err = bind_socket(id, addr)) return fail(err);
  return 0;
}

SR_EXPORT int rdma_resolve_addr(rdma_cm_id* cm_id, sockaddr* src, sockaddr* dst, int timeout_ms) {
  if (!cm_id || !dst || (dst->sa_family != AF_INET && dst->sa_family != AF_INET6)) return fail(EINVAL);
  Id* id = to_id(cm_id);
  const bool sync = id->sync;  // read on entry (see complete())
  {
    std::lock_guard lk(mu());
    if (id->state != State::kIdle && id->state != State::kBound) return fail(EINVAL);
    int status = 0;
    if (id->state == State::kIdle && src && !is_any(src)) {
      // A named source: bound now; an address with no device fails here, as the kernel's bind does.
      if (int err = bind_socket(id, src)) return fail(err);
    } else if (!id->dev) {
      // The source the routing picks towards dst, on the port asked for (or an ephemeral one).
      sockaddr_storage s{};
      if (int err = route_source(dst, &s)) {
        status = -err;
      } else if (id->state == State::kIdle) {
        if (src)
          reinterpret_cast<sockaddr_in*>(&s)->sin_port = port_of(src);
        else
          reinterpret_cast<sockaddr_in*>(&s)->sin_port = 0;
        if (int err = bind_socket(id, reinterpret_cast<sockaddr*>(&s))) status = -err;
      } else if (int err = attach_device(id, reinterpret_cast<sockaddr*>(&s))) {
        status = -err;  // bound to the any-address: the device of the route's source
      }
    }
    memcpy(&cm_id->route.addr.dst_storage, dst, addr_len(dst));
    id->dgid = gid_of(dst);
    cm_id->route.addr.addr.ibaddr.dgid = id->dgid;
    if (timeout_ms > 0) id->timeout_ms = timeout_ms;
    if (!status) id->state = State::kAddrResolved;
    queue_event(new_event(id, status ? RDMA_CM_EVENT_ADDR_ERROR : RDMA_CM_EVENT_ADDR_RESOLVED, status));
  }
  return sync ? complete(id) : 0;
}

SR_EXPORT int rdma_resolve_route(rdma_cm_id* cm_id, int timeout_ms) {
  if (!cm_id) return fail(EINVAL);
  Id* id = to_id(cm_id);
  const bool sync = id->sync;  // read on entry (see complete())
  {
    std::lock_guard lk(mu());
    if (id->state != State::kAddrResolved) return fail(EINVAL);
    if (timeout_ms > 0) id->timeout_ms = timeout_ms;
    // One path, as the kernel reports for RoCE: the GIDs, the device's MTU, the default pkey.
    ibv_sa_path_rec& p = id->path;
    p = {};
    p.dgid = id->dgid;
    p.sgid = id->sgid;
    p.pkey = htons(0xffff);
    p.hop_limit = 64;
    p.traffic_class = id->tos;
    p.reversible = 1;
    p.numb_path = 1;
    p.mtu_selector = 2;
    p.mtu = id->dev->active_mtu;
    p.rate_selector = 2;
    p.packet_life_time_selector = 2;
    p.packet_life_time = 16;
    cm_id->route.path_rec = &p;
    cm_id->route.num_paths = 1;
    id->state = State::kRouteResolved;
    queue_event(new_event(id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0));
  }
  return sync ? complete(id) : 0;
}

SR_EXPORT __be16 rdma_get_src_port(rdma_cm_id* id) { return port_of(&id->route.addr.src_addr); }
SR_EXPORT __be16 rdma_get_dst_port(rdma_cm_id* id) { return port_of(&id->route.addr.dst_addr); }

SR_EXPORT ibv_context** rdma_get_devices(int* num_devices) {
  if (int err = init()) {
    errno = err;
    return nullptr;
  }
  std::lock_guard lk(mu());
  int n = 0;
  Device* const* devs = all_devices(&n);
  auto** list = static_cast<ibv_context**>(calloc(n + 1, sizeof(ibv_context*)));
  if (!list) return nullptr;
  for (int i = 0; i < n; ++i) list[i] = devs[i]->verbs;
  if (num_devices) *num_devices = n;
  return list;
}

SR_EXPORT void rdma_free_devices(ibv_context** list) { free(list); }

SR_EXPORT int rdma_set_option(rdma_cm_id* cm_id, int level, int optname, void* optval, size_t optlen) {
  if (!cm_id || !optval) return fail(EINVAL);
  Id* id = to_id(cm_id);
  std::lock_guard lk(mu());
  if (level == RDMA_OPTION_ID) {
    switch (optname) {
      case RDMA_OPTION_ID_TOS:
        if (optlen != sizeof(uint8_t)) return fail(EINVAL);
        id->tos = *static_cast<uint8_t*>(optval);
        return 0;
      case RDMA_OPTION_ID_REUSEADDR:
        if (optlen != sizeof(int) || id->state != State::kIdle) return fail(EINVAL);
        id->reuseaddr = *static_cast<int*>(optval) != 0;
        return 0;
      case RDMA_OPTION_ID_AFONLY:
        if (optlen != sizeof(int) || id->state != State::kIdle) return fail(EINVAL);
        id->afonly = *static_cast<int*>(optval) ? 1 : 0;
        return 0;
      case RDMA_OPTION_ID_ACK_TIMEOUT:
        if (optlen != sizeof(uint8_t)) return fail(EINVAL);
        id->ack_timeout = std::min<uint8_t>(*static_cast<uint8_t*>(optval), 31);
        return 0;
      default:
        return fail(ENOSYS);
    }
  }
  if (level == RDMA_OPTION_IB && optname == RDMA_OPTION_IB_PATH) return fail(EOPNOTSUPP);  // no SA paths
  return fail(ENOSYS);
}

// ---- QPs and SRQs ----

SR_EXPORT int rdma_init_qp_attr(rdma_cm_id* cm_id, ibv_qp_attr* attr, int* mask) {
  if (!cm_id || !attr || !mask) return fail(EINVAL);
  Id* id = to_id(cm_id);
  std::lock_guard lk(mu());
  if (!id->dev) return fail(EINVAL);
  const bool ud = cm_id->qp_type == IBV_QPT_UD;
  switch (attr->qp_state) {
    case IBV_QPS_INIT:
      attr->pkey_index = 0;
      attr->port_num = cm_id->port_num;
      *mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
      if (ud) {
        attr->qkey = id->qkey;
        *mask |= IBV_QP_QKEY;
      } else {
        // Before the handshake no remote access (the kernel's cma); after it, what the peer may do.
        attr->qp_access_flags = 0;
        if (id->have_remote) {
          attr->qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
          if (id->responder_resources)
            attr->qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
        }
        *mask |= IBV_QP_ACCESS_FLAGS;
      }
      return 0;
    case IBV_QPS_RTR:
      *mask = IBV_QP_STATE;
      if (ud) return 0;
      if (!id->have_remote) return fail(EINVAL);
      attr->ah_attr = {};
      attr->ah_attr.is_global = 1;
      memcpy(attr->ah_attr.grh.dgid.raw, id->remote.gid, 16);
      attr->ah_attr.grh.sgid_index = id->gid_index;
      attr->ah_attr.grh.hop_limit = 64;
      attr->ah_attr.grh.traffic_class = id->tos;
      attr->ah_attr.port_num = cm_id->port_num;
      attr->path_mtu = id->path_mtu;
      attr->dest_qp_num = id->remote.qpn;
      attr->rq_psn = id->remote.psn;
      attr->max_dest_rd_atomic = id->responder_resources;
      attr->min_rnr_timer = 12;  // 0.64 ms
      *mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
               IBV_QP_MIN_RNR_TIMER;
      return 0;
    case IBV_QPS_RTS:
      attr->sq_psn = id->psn;
      *mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
      if (ud) return 0;
      if (!id->have_remote) return fail(EINVAL);
      attr->timeout = id->ack_timeout;
      attr->retry_cnt = id->retry_count;
      attr->rnr_retry = id->rnr_retry_count;
      attr->max_rd_atomic = id->initiator_depth;
      *mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
      return 0;
    default:
      return fail(EINVAL);
  }
}

namespace {

void destroy_cqs(rdma_cm_id* id) {
  if (id->recv_cq) {
    ibv_destroy_cq(id->recv_cq);
    if (id->send_cq && id->send_cq != id->recv_cq) ibv_destroy_cq(id->send_cq);
  } else if (id->send_cq) {
    ibv_destroy_cq(id->send_cq);
  }
  id->recv_cq = id->send_cq = nullptr;
  if (id->recv_cq_channel) ibv_destroy_comp_channel(id->recv_cq_channel);
  if (id->send_cq_channel && id->send_cq_channel != id->recv_cq_channel)
    ibv_destroy_comp_channel(id->send_cq_channel);
  id->recv_cq_channel = id->send_cq_channel = nullptr;
}

// A CQ with its own completion channel, cq_context = id (as the rdma_verbs.h helpers expect).
int create_cq(rdma_cm_id* id, uint32_t size, ibv_comp_channel** ch, ibv_cq** cq) {
  *ch = ibv_create_comp_channel(id->verbs);
  if (!*ch) return -1;
  *cq = ibv_create_cq(id->verbs, static_cast<int>(size), id, *ch, 0);
  return *cq ? 0 : -1;
}

}  // namespace

SR_EXPORT int rdma_create_qp_ex(rdma_cm_id* cm_id, ibv_qp_init_attr_ex* attr) {
  if (!cm_id || !attr || cm_id->qp || !cm_id->verbs) return fail(EINVAL);
  Id* id = to_id(cm_id);
  if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) {
    attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
    attr->pd = cm_id->pd;
  } else if (attr->pd->context != cm_id->verbs) {
    return fail(EINVAL);
  }
  if ((cm_id->recv_cq && attr->recv_cq && cm_id->recv_cq != attr->recv_cq) ||
      (cm_id->send_cq && attr->send_cq && cm_id->send_cq != attr->send_cq))
    return fail(EINVAL);
  if ((!attr->recv_cq && !cm_id->recv_cq && attr->cap.max_recv_wr &&
       create_cq(cm_id, attr->cap.max_recv_wr, &cm_id->recv_cq_channel, &cm_id->recv_cq)) ||
      (!attr->send_cq && !cm_id->send_cq && attr->cap.max_send_wr &&
       create_cq(cm_id, attr->cap.max_send_wr, &cm_id->send_cq_channel, &cm_id->send_cq))) {
    const int err = errno;
    destroy_cqs(cm_id);
    return fail(err);
  }
  if (!attr->send_cq) attr->send_cq = cm_id->send_cq;
  if (!attr->recv_cq) attr->recv_cq = cm_id->recv_cq;
  if (cm_id->srq && !attr->srq) attr->srq = cm_id->srq;
  ibv_qp* qp = ibv_create_qp_ex(cm_id->verbs, attr);
  if (!qp) {
    const int err = errno;
    destroy_cqs(cm_id);
    return fail(err);
  }
  // RC: INIT, the rest at connect/accept. UD: straight to RTS with the rdma_cm qkey.
  int ret = qp_to_state(id, qp, IBV_QPS_INIT);
  if (!ret && cm_id->qp_type == IBV_QPT_UD) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    ret = modify(qp, &a, IBV_QP_STATE);
    if (!ret) {
      a.qp_state = IBV_QPS_RTS;
      a.sq_psn = 0;
      ret = modify(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
    }
  }
  if (ret) {
    const int err = errno;
    ibv_destroy_qp(qp);
    destroy_cqs(cm_id);
    return fail(err);
  }
  cm_id->pd = qp->pd;
  cm_id->qp = qp;
  return 0;
}

SR_EXPORT int rdma_create_qp(rdma_cm_id* cm_id, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (!cm_id || !qp_init_attr) return fail(EINVAL);
  ibv_qp_init_attr_ex ex{};
  memcpy(&ex, qp_init_attr, sizeof *qp_init_attr);
  ex.comp_mask = IBV_QP_INIT_ATTR_PD;
  ex.pd = pd ? pd : cm_id->pd;
  int ret = rdma_create_qp_ex(cm_id, &ex);
  memcpy(qp_init_attr, &ex, sizeof *qp_init_attr);
  return ret;
}

SR_EXPORT void rdma_destroy_qp(rdma_cm_id* cm_id) {
  if (!cm_id) return;
  if (cm_id->qp) ibv_destroy_qp(cm_id->qp);
  cm_id->qp = nullptr;
  destroy_cqs(cm_id);
}

SR_EXPORT int rdma_create_srq_ex(rdma_cm_id* cm_id, ibv_srq_init_attr_ex* attr) {
  if (!cm_id || !attr || !cm_id->verbs) return fail(EINVAL);
  if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE)) {
    attr->comp_mask |= IBV_SRQ_INIT_ATTR_TYPE;
    attr->srq_type = cm_id->qp_type == IBV_QPT_XRC_RECV ? IBV_SRQT_XRC : IBV_SRQT_BASIC;
  }
  if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd) {
    attr->comp_mask |= IBV_SRQ_INIT_ATTR_PD;
    attr->pd = cm_id->pd;
  }
  // XRC SRQs need an XRC domain and a CQ: softrdma has no XRC (ibv_open_xrcd fails with EOPNOTSUPP).
  if (attr->srq_type != IBV_SRQT_BASIC) return fail(EOPNOTSUPP);
  ibv_srq* srq = ibv_create_srq_ex(cm_id->verbs, attr);
  if (!srq) return -1;
  cm_id->pd = srq->pd;
  cm_id->srq = srq;
  return 0;
}

SR_EXPORT int rdma_create_srq(rdma_cm_id* cm_id, ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (!cm_id || !attr) return fail(EINVAL);
  ibv_srq_init_attr_ex ex{};
  ex.srq_context = attr->srq_context;
  ex.attr = attr->attr;
  ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
  ex.srq_type = cm_id->qp_type == IBV_QPT_XRC_RECV ? IBV_SRQT_XRC : IBV_SRQT_BASIC;
  ex.pd = pd ? pd : cm_id->pd;
  int ret = rdma_create_srq_ex(cm_id, &ex);
  attr->attr = ex.attr;
  return ret;
}

SR_EXPORT void rdma_destroy_srq(rdma_cm_id* cm_id) {
  if (!cm_id || !cm_id->srq) return;
  ibv_destroy_srq(cm_id->srq);
  cm_id->srq = nullptr;
}

// ---- connections ----

SR_EXPORT int rdma_connect(rdma_cm_id* cm_id, rdma_conn_param* param) {
  if (!cm_id) return fail(EINVAL);
  Id* id = to_id(cm_id);
  const bool sync = id->sync;  // read on entry (see complete())
  const bool ud = cm_id->qp_type == IBV_QPT_UD;
  {
    std::lock_guard lk(mu());
    if (id->state != State::kRouteResolved) return fail(EINVAL);
    if (int err = check_param(id, param)) return fail(err);
    const uint8_t pd_len = param && param->private_data ? param->private_data_len : 0;
    if (pd_len > (ud ? wire::kSidrReqPrivateData : wire::kReqPrivateData)) return fail(EINVAL);

    id->initiator_depth = param && param->initiator_depth != RDMA_MAX_INIT_DEPTH
                              ? param->initiator_depth
                              : id->dev->max_initiator_depth;
    id->responder_resources = param && param->responder_resources != RDMA_MAX_RESP_RES
                                  ? param->responder_resources
                                  : id->dev->max_responder_resources;
    // The IB CM's REQ and REP hold the retry counts in 3 bits (libfabric asks for 15: it gets 7).
    id->retry_count = (param ? param->retry_count : 7) & 7;
    wire::Conn req{};
    req.qpn = cm_id->qp ? cm_id->qp->qp_num : (param ? param->qp_num : 0);
    req.srq = cm_id->qp ? cm_id->qp->srq != nullptr : (param ? param->srq : 0);
    req.psn = id->psn;
    memcpy(req.gid, id->sgid.raw, 16);
    req.mtu = static_cast<uint8_t>(id->dev->active_mtu);
    req.responder_resources = id->responder_resources;
    req.initiator_depth = id->initiator_depth;
    req.flow_control = param ? param->flow_control : 0;
    req.retry_count = id->retry_count;
    req.rnr_retry_count = (param ? param->rnr_retry_count : 7) & 7;
    if (param) copy_private(&req, param->private_data, pd_len);

    id->req = wire::encode(ud ? wire::Type::kSidrReq : wire::Type::kReq, req);
    id->state = State::kConnecting;
    const int64_t now = now_ns();
    id->connect_deadline_ns = now + static_cast<int64_t>(id->timeout_ms) * 1'000'000;
    id->refused_until_ns = now + std::min<int64_t>(id->timeout_ms, kRefusedGraceMs) * 1'000'000;
    id->retry_delay_ms = 0;
    start_connect(id);
  }
  return sync ? complete(id) : 0;
}

SR_EXPORT int rdma_listen(rdma_cm_id* cm_id, int backlog) {
  if (!cm_id) return fail(EINVAL);
  Id* id = to_id(cm_id);
  std::lock_guard lk(mu());
  if (id->state == State::kIdle) {
    sockaddr_in any{};
    any.sin_family = AF_INET;
    if (int err = bind_socket(id, reinterpret_cast<sockaddr*>(&any))) return fail(err);
  }
  if (id->state != State::kBound) return fail(EINVAL);
  // The backlog is the IB CM's concern only for iWARP; the service accepts at once, and a TCP backlog as
  // small as perftest's (its QP count) would only make the kernel drop SYNs of a burst of connects.
  (void)backlog;
  if (listen(id->fd, SOMAXCONN) < 0) return -1;
  id->state = State::kListening;
  id->tcp_connected = true;
  watch(id);
  return 0;
}

SR_EXPORT int rdma_get_request(rdma_cm_id* listen, rdma_cm_id** out) {
  if (!listen || !out) return fail(EINVAL);
  Id* lis = to_id(listen);
  if (!lis->sync) return fail(EINVAL);
  if (listen->event) {
    rdma_ack_cm_event(listen->event);
    listen->event = nullptr;
  }
  rdma_cm_event* event;
  if (rdma_get_cm_event(listen->channel, &event)) return -1;
  int err = 0;
  if (event->event == RDMA_CM_EVENT_REJECTED)
    err = ECONNREFUSED;
  else if (event->status)
    err = event->status < 0 ? -event->status : event->status;
  else if (event->event != RDMA_CM_EVENT_CONNECT_REQUEST)
    err = EINVAL;
  if (!err && lis->ep_qp_attr) {
    ibv_qp_init_attr attr = *lis->ep_qp_attr;
    if (rdma_create_qp(event->id, listen->pd, &attr)) err = errno;
  }
  if (err) {
    listen->event = event;
    return fail(err);
  }
  *out = event->id;
  event->id->event = event;
  return 0;
}

SR_EXPORT int rdma_accept(rdma_cm_id* cm_id, rdma_conn_param* param) {
  if (!cm_id) return fail(EINVAL);
  Id* id = to_id(cm_id);
  const bool sync = id->sync;  // read on entry (see complete())
  const bool ud = cm_id->qp_type == IBV_QPT_UD;
  {
    std::lock_guard lk(mu());
    if (id->state != State::kReqReceived) return fail(EINVAL);
    if (int err = check_param(id, param)) return fail(err);
    if (param && param->private_data &&
        param->private_data_len > (ud ? wire::kSidrRepPrivateData : wire::kRepPrivateData))
      return fail(EINVAL);
    // Start from what the requester offered, within the device's limits, unless told otherwise.
    if (!param || param->initiator_depth == RDMA_MAX_INIT_DEPTH)
      id->initiator_depth = std::min(id->initiator_depth, id->dev->max_initiator_depth);
    else
      id->initiator_depth = param->initiator_depth;
    if (!param || param->responder_resources == RDMA_MAX_RESP_RES)
      id->responder_resources = std::min(id->responder_resources, id->dev->max_responder_resources);
    else
      id->responder_resources = param->responder_resources;
  }
  if (!ud && qp_to_rts(id)) return -1;
  {
    std::lock_guard lk(mu());
    if (id->peer_closed) {
      queue_event(new_event(id, RDMA_CM_EVENT_CONNECT_ERROR, -ECONNRESET));
      id->state = State::kClosed;
    } else {
      wire::Conn rep{};
      rep.qpn = cm_id->qp ? cm_id->qp->qp_num : (param ? param->qp_num : 0);
      rep.srq = cm_id->qp ? cm_id->qp->srq != nullptr : (param ? param->srq : 0);
      rep.psn = id->psn;
      memcpy(rep.gid, id->sgid.raw, 16);
      rep.mtu = static_cast<uint8_t>(id->path_mtu);
      rep.responder_resources = id->responder_resources;
      rep.initiator_depth = id->initiator_depth;
      rep.flow_control = param ? param->flow_control : 0;
      rep.rnr_retry_count = (param ? param->rnr_retry_count : 7) & 7;
      rep.qkey = id->qkey;
      if (param) copy_private(&rep, param->private_data, param->private_data_len);
      send_msg(id, wire::encode(ud ? wire::Type::kSidrRep : wire::Type::kRep, rep));
      id->state = ud ? State::kConnected : State::kRepSent;
      if (!ud) {
        id->deadline_ns = now_ns() + kRepTimeoutNs;  // for the RTU
        wake_service();
      }
    }
  }
  if (ud) {
    // SIDR has no RTU: nothing to wait for.
    if (sync && cm_id->event) {
      rdma_ack_cm_event(cm_id->event);
      cm_id->event = nullptr;
    }
    return 0;
  }
  return sync ? complete(id) : 0;
}

SR_EXPORT int rdma_reject(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  return reject(id, private_data, private_data_len, wire::kRejConsumerDefined);
}

SR_EXPORT int rdma_reject_ece(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  return reject(id, private_data, private_data_len, wire::kRejVendorOptionNotSupported);
}

SR_EXPORT int rdma_establish(rdma_cm_id* cm_id) {
  if (!cm_id || cm_id->qp) return fail(EINVAL);
  Id* id = to_id(cm_id);
  std::lock_guard lk(mu());
  if (id->state == State::kRepReceived) {
    send_msg(id, wire::encode(wire::Type::kRtu));
    id->state = State::kConnected;
    return 0;
  }
  return id->peer_closed ? 0 : fail(EINVAL);  // closed meanwhile: DISCONNECTED is queued
}

SR_EXPORT int rdma_notify(rdma_cm_id* cm_id, ibv_event_type event) {
  if (!cm_id) return fail(EINVAL);
  Id* id = to_id(cm_id);
  std::lock_guard lk(mu());
  // A receive before the RTU: the connection is established (the IB CM's COMM_EST).
  if (event == IBV_EVENT_COMM_EST && id->state == State::kRepSent) {
    id->state = State::kConnected;
    Event* e = new_event(id, RDMA_CM_EVENT_ESTABLISHED, 0);
    e->ev.param.conn.private_data = e->private_data;
    queue_event(e);
  }
  return 0;
}

SR_EXPORT int rdma_disconnect(rdma_cm_id* cm_id) {
  if (!cm_id || !cm_id->verbs) return fail(EINVAL);
  Id* id = to_id(cm_id);
  const bool sync = id->sync;  // read on entry (see complete())
  if (qp_to_err(cm_id->qp)) return -1;
  {
    std::lock_guard lk(mu());
    switch (id->state) {
      case State::kConnected:
      case State::kRepSent:
      case State::kRepReceived:
        if (cm_id->qp_type == IBV_QPT_UD) return fail(EINVAL);
        disconnect(id);
        break;
      case State::kDisconnected:
        break;  // the peer was first: its DISCONNECTED is queued (and read below in synchronous mode)
      default:
        return fail(EINVAL);
    }
  }
  return sync ? complete(id) : 0;
}

// ---- endpoints (rdma_create_ep: synchronous ids) ----

SR_EXPORT int rdma_create_ep(rdma_cm_id** out, rdma_addrinfo* res, ibv_pd* pd,
                             ibv_qp_init_attr* qp_init_attr) {
  if (!out || !res) return fail(EINVAL);
  rdma_cm_id* cm_id;
  if (create_id_checked(nullptr, &cm_id, nullptr, static_cast<rdma_port_space>(res->ai_port_space),
                        static_cast<ibv_qp_type>(res->ai_qp_type)))
    return -1;
  Id* id = to_id(cm_id);
  int ret;
  if (res->ai_flags & RAI_PASSIVE) {
    ret = rdma_bind_addr(cm_id, res->ai_src_addr);
    if (!ret) {
      if (pd) cm_id->pd = pd;
      if (qp_init_attr) {
        id->ep_qp_attr = std::make_unique<ibv_qp_init_attr>(*qp_init_attr);
        id->ep_qp_attr->qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
      }
    }
  } else {
    ret = rdma_resolve_addr(cm_id, res->ai_src_addr, res->ai_dst_addr, 2000);
    if (!ret) ret = rdma_resolve_route(cm_id, 2000);
    if (!ret && qp_init_attr) {
      qp_init_attr->qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
      ret = rdma_create_qp(cm_id, pd, qp_init_attr);
    }
  }
  if (ret) {
    const int err = errno;
    rdma_destroy_ep(cm_id);
    return fail(err);
  }
  *out = cm_id;
  return 0;
}

SR_EXPORT void rdma_destroy_ep(rdma_cm_id* cm_id) {
  if (!cm_id) return;
  if (cm_id->qp) rdma_destroy_qp(cm_id);
  if (cm_id->srq) rdma_destroy_srq(cm_id);
  rdma_destroy_id(cm_id);
}
