// The drop-in librdmacm.so.1: rdma-core's connection manager API over the PUBLIC verbs of libibverbs.so.1
// (as rdma-core's own librdmacm is) and TCP, in place of the kernel's rdma_cm and the IB CM's MADs.
//
// Split as in rdma-core, with a thread of this library standing in for the kernel:
// - the API side (cma.cc) runs in the application's threads: ids, QPs and their state changes
//   (INIT/RTR/RTS/ERR through ibv_modify_qp), and turning a REP into ESTABLISHED when the event is read;
// - the service (service.cc) is one thread per process with an epoll set over the TCP sockets: it accepts
//   connections, reads and writes the handshake messages (wire.h), enforces the connect timeout and queues
//   events on the channels.
// One mutex guards all of it: this is the control path, never touched by a verb on a QP.
//
// Addressing (ARCHITECTURE.md): an id bound or resolved to (IP, port) owns a TCP socket bound there; a
// listener is a listening socket, an active id's source port is its socket's port, and each connection is
// one TCP connection that carries REQ, REP/REJ, RTU and DREQ/DREP. The process's death closes it, which
// the peer reports as DISCONNECTED.
#pragma once

#pragma GCC visibility push(default)
#include <rdma/rdma_cma.h>
#pragma GCC visibility pop

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "abi/rdmacm/wire.h"

#define SR_EXPORT extern "C" __attribute__((visibility("default")))

namespace softrdma::rdmacm {

// A verbs device as the CM uses it: one context and one PD shared by every id on the device, opened on
// first use and kept for the process's lifetime (rdma-core shares them the same way).
struct Device {
  ibv_context* verbs = nullptr;
  ibv_pd* pd = nullptr;
  uint8_t max_responder_resources = 0;  // max_qp_rd_atom
  uint8_t max_initiator_depth = 0;      // max_qp_init_rd_atom
  ibv_mtu active_mtu = IBV_MTU_1024;
};

// The device whose port-1 GID table holds `gid`, and the index there; nullptr (errno ENODEV) if none.
Device* find_device(const ibv_gid& gid, uint8_t* gid_index);
// Every device, opened (rdma_get_devices); the count in *n.
Device* const* all_devices(int* n);
// The GID an IP address has in a RoCE v2 GID table: IPv4 as ::ffff:a.b.c.d, IPv6 as itself.
ibv_gid gid_of(const sockaddr* addr);

struct Id;

struct Event {
  rdma_cm_event ev{};
  Id* owner = nullptr;  // counted against it (the listener for CONNECT_REQUEST, as rdma-core does)
  wire::Conn remote;    // a REP's parameters, for the API side to turn CONNECT_RESPONSE into ESTABLISHED
  uint8_t private_data[wire::kMaxPrivateData]{};
};

// rdma_event_channel's fd is an eventfd in semaphore mode: one count per queued event. rdma_get_cm_event
// reads one (blocking or not, as the application set the fd) and then takes the queue's head; an event
// withdrawn after it was counted (its id destroyed or migrated) leaves a count with no event, which the
// reader skips. So the fd polls readable whenever an event is queued.
//
// A channel destroyed while threads are inside rdma_get_cm_event on it stays allocated, its fd open, and
// those threads never return: so does a read blocked on a destroyed rdma_cm channel of the kernel's.
// (rping of rdma-core 44 destroys its channel while its CM thread waits on it, then exits.)
struct Channel {
  rdma_event_channel ch;
  std::deque<Event*> queue;  // guarded by the global mutex, as the two fields below
  int readers = 0;           // threads inside rdma_get_cm_event
  bool dead = false;         // destroyed
};
inline Channel* to_channel(rdma_event_channel* c) { return reinterpret_cast<Channel*>(c); }

enum class State : uint8_t {
  kIdle,
  kBound,          // socket bound (rdma_bind_addr)
  kAddrResolved,   // source and destination known (rdma_resolve_addr)
  kRouteResolved,  // rdma_resolve_route
  kListening,
  kConnecting,     // active: TCP connect and REQ sent, waiting for REP/REJ
  kRepReceived,    // active: REP in, RTU not yet sent (CONNECT_RESPONSE, then rdma_establish)
  kPending,        // passive: accepted TCP connection, its REQ not yet read (invisible to the application)
  kReqReceived,    // passive: CONNECT_REQUEST delivered, waiting for accept/reject
  kRepSent,        // passive: REP out, waiting for RTU
  kConnected,      // RC established; for UD, SIDR done
  kDisconnecting,  // DREQ sent, waiting for DREP
  kDisconnected,   // DISCONNECTED queued
  kClosed,         // rejected, refused, unreachable or failed: nothing more will happen
};

struct Id {
  rdma_cm_id id{};
  uint64_t handle = 0;  // epoll's key for it (never reused, so a late epoll event finds nothing)
  bool sync = false;    // created with a NULL channel: id.channel is its own, the calls wait for events
  State state = State::kIdle;
  Device* dev = nullptr;
  uint8_t gid_index = 0;
  ibv_gid sgid{}, dgid{};

  // The TCP socket: bound, listening or connected; -1 when none.
  int fd = -1;
  bool tcp_connected = false;
  std::string in, out;  // bytes read but not parsed, bytes not yet written

  Id* listener = nullptr;  // a passive id's listener (until its CONNECT_REQUEST is delivered)
  bool peer_closed = false;

  // Connection parameters: what we announce, and what the peer announced.
  uint32_t psn = 0;
  wire::Conn remote{};
  bool have_remote = false;
  ibv_mtu path_mtu = IBV_MTU_1024;
  uint8_t responder_resources = 0, initiator_depth = 0;  // for our QP (max_dest_rd_atomic, max_rd_atomic)
  uint8_t retry_count = 7, rnr_retry_count = 7;          // for our QP's RTS
  uint32_t qkey = RDMA_UDP_QKEY;

  // rdma_set_option
  uint8_t tos = 0;
  uint8_t ack_timeout = 17;  // the kernel's for RoCE: the path's packet lifetime (16) plus one, about 0.5 s
  bool reuseaddr = false;
  int afonly = -1;

  int timeout_ms = 2000;    // from resolve_addr/resolve_route: bounds the TCP connect
  int64_t deadline_ns = 0;  // service: when the pending step is due (0: none)
  // Connecting: the REQ (sent again on each attempt), until when the connect may take, until when a
  // refusal is retried, and the next retry's delay.
  std::string req;
  int64_t connect_deadline_ns = 0, refused_until_ns = 0;
  int retry_delay_ms = 0;
  bool retry_pending = false;

  // Events handed to the application and events it acked (rdma_destroy_id waits for the second to reach
  // the first, as rdma-core's does).
  uint64_t reported = 0, acked = 0;

  std::unique_ptr<ibv_qp_init_attr> ep_qp_attr;  // rdma_create_ep on a passive id: QPs for its requests
  ibv_sa_path_rec path{};
};
inline Id* to_id(rdma_cm_id* id) { return reinterpret_cast<Id*>(id); }

// ---- the process-wide state (service.cc) ----

// The one mutex of the library, and the condition variable rdma_destroy_id and rdma_migrate_id wait on.
std::mutex& mu();
std::condition_variable& acked_cv();

// Assigns a handle and a random PSN and makes the id known to the service.
void register_id(Id* id);
// Forgets the id: no more events from the service, its socket closed. Under mu().
void unregister_id(Id* id);
// Adds the id's socket to the epoll set (for reading, and for writing while `out` is not empty).
void watch(Id* id);
// Wakes the service so that it recomputes its timeout (a new deadline).
void wake_service();

// Queues an event for id on its channel; `owner` is who counts it (default: id). Under mu().
Event* new_event(Id* id, rdma_cm_event_type type, int status);
void queue_event(Event* e);

// Writes a message on the id's connection (what the socket does not take now, the service writes later).
void send_msg(Id* id, const std::string& msg);
// Closes the id's socket (after what is queued to it is written, as far as the kernel takes it now).
void close_socket(Id* id);

// Sends DREQ: DISCONNECTED follows with the DREP, the peer's own DREQ, its connection's end or a timeout.
void disconnect(Id* id);
// Frees a listener's accepted connections whose REQ has not come yet (the listener goes away).
void drop_pending(Id* listener);

int64_t now_ns();  // CLOCK_MONOTONIC

// errno = err, and -1: how the C API fails.
inline int fail_errno(int err) {
  errno = err;
  return -1;
}

inline socklen_t addr_len(const sockaddr* a) {
  return a->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}
inline uint16_t port_of(const sockaddr* a) {  // network order
  if (a->sa_family == AF_INET) return reinterpret_cast<const sockaddr_in*>(a)->sin_port;
  if (a->sa_family == AF_INET6) return reinterpret_cast<const sockaddr_in6*>(a)->sin6_port;
  return 0;
}

// A non-blocking TCP socket bound to addr, with the id's options. Returns 0 or an errno.
int open_socket(Id* id, const sockaddr* addr, int* fd);

// A connection refused (nobody listens yet) is tried again for this long, at most the application's
// timeout, before it is REJECTED: a server that is about to listen (perftest -R sets up its listener only
// after its out-of-band handshake with the client) is found. The IB CM would reject at once.
constexpr int kRefusedGraceMs = 1000;

// How long a REQ waits for the REP and a REP for the RTU, once the TCP connection is up: the peer's
// application is slow, not gone (that would close the connection). About the IB CM's total of retries.
constexpr int64_t kRepTimeoutNs = 60'000'000'000;

// Connects the active id's socket to its destination and sends its REQ once connected (the service
// completes it, retries a refusal and enforces connect_deadline_ns). Under mu().
void start_connect(Id* id);

}  // namespace softrdma::rdmacm
