#include "core/context.h"

#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "core/scratch.h"
#include "io/clock.h"
#include "transport/transport.h"

namespace softrdma::core {

using wire::PacketView;

Nanos Context::now_ns() { return io::monotonic_ns(); }

namespace {
// The contexts of this process, for flush_deferred_acks_at_exit. Never destroyed: an exit handler may run
// after static destructors of this library.
struct LiveContexts {
  std::mutex mu;
  std::vector<Context*> all;
  // The process that registered them: a forked child inherits the list (and maybe `mu` held by a thread
  // that does not exist in it), not the contexts.
  std::atomic<pid_t> pid{0};
};
LiveContexts& live_contexts() {
  static auto* live = new LiveContexts;
  return *live;
}
}  // namespace

Context::Context(io::Backend* backend, Counters* counters, const ContextConfig& cfg)
    : backend_(backend), counters_(counters), cfg_(cfg), blocks_(new std::atomic<QpBlock*>[65536]) {
  for (uint32_t i = 0; i < 65536; ++i) blocks_[i].store(nullptr, std::memory_order_relaxed);
  async_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK | EFD_SEMAPHORE);
  if (cfg.mr_key_seed != 0) mrs_.seed_keys(cfg.mr_key_seed);
  LiveContexts& live = live_contexts();
  std::lock_guard g(live.mu);
  if (live.pid.load() != getpid()) {
    if (live.pid.load() == 0) std::atexit(flush_deferred_acks_at_exit);
    live.pid.store(getpid());
    live.all.clear();
  }
  live.all.push_back(this);
}

void Context::flush_deferred_acks_at_exit() {
  LiveContexts& live = live_contexts();
  if (live.pid.load() != getpid()) return;  // a forked child's exit: the QPs are its parent's
  std::lock_guard g(live.mu);
  for (Context* ctx : live.all) {
    std::lock_guard c(ctx->mu_);
    for (Qp* qp : ctx->qps_) qp->flush_deferred_ack();
  }
}

Context::~Context() {
  forget_corked();
  {
    LiveContexts& live = live_contexts();
    std::lock_guard g(live.mu);
    std::erase(live.all, this);
  }
  for (Qp* qp : qps_) {
    qp->flush_deferred_ack();
    delete qp;
  }
  for (uint32_t i = 0; i < 65536; ++i) delete blocks_[i].load();
  if (async_fd_ >= 0) close(async_fd_);
}

namespace {
// One more object against `max`: false (and nothing taken) when there are that many already.
bool take_one(std::atomic<uint32_t>& n, uint32_t max) {
  if (n.fetch_add(1, std::memory_order_relaxed) < max) return true;
  n.fetch_sub(1, std::memory_order_relaxed);
  return false;
}
}  // namespace

std::expected<Pd*, int> Context::alloc_pd() {
  if (!take_one(n_pd_, kMaxPd)) return std::unexpected(ENOMEM);
  Pd* pd = new Pd;
  pd->ctx = this;
  pd->id = next_pd_id_.fetch_add(1, std::memory_order_relaxed) + 1;
  return pd;
}

int Context::dealloc_pd(Pd* pd) {
  if (pd->users.load() != 0) return EBUSY;
  delete pd;
  n_pd_.fetch_sub(1, std::memory_order_relaxed);
  return 0;
}

std::expected<Mr*, int> Context::reg_mr(Pd* pd, void* addr, uint64_t length, uint64_t iova, uint32_t access) {
  // Remote write or atomic access needs local write (rdma-core/the IBTA), as does any write by the NIC.
  if ((access & (kRemoteWrite | kRemoteAtomic)) && !(access & kLocalWrite)) return std::unexpected(EINVAL);
  if (!addr && length) return std::unexpected(EINVAL);
  auto mr = mrs_.add(pd, addr, length, iova, access);
  if (mr) {
    pd->users.fetch_add(1);
    backend_->publish_mr({(*mr)->key, access, pd->id, iova, length, reinterpret_cast<uint64_t>(addr)});
  }
  return mr;
}

int Context::dereg_mr(Mr* mr) {
  Pd* pd = mr->pd;
  if (!mr->valid.load()) return EINVAL;
  // Peers on this host stop reaching it first (this waits for their copies in flight), then this
  // process's responders.
  const uint32_t key = mr->key;
  backend_->withdraw_mr(key);
  if (int err = mrs_.remove(mr)) return err;
  backend_->forget_mr(key);
  pd->users.fetch_sub(1);
  return 0;
}

std::expected<Cq*, int> Context::create_cq(uint32_t cqe, CompChannel* channel, void* user_context) {
  if (cqe < 1 || cqe > kMaxCqe) return std::unexpected(EINVAL);
  if (!take_one(n_cq_, kMaxCq)) return std::unexpected(ENOMEM);
  if (channel) channel->users.fetch_add(1);
  return new Cq(this, cqe, channel, user_context);
}

int Context::destroy_cq(Cq* cq) {
  if (cq->users.load() != 0) return EBUSY;
  if (cq->channel()) cq->channel()->users.fetch_sub(1);
  forget_events(cq);
  delete cq;
  n_cq_.fetch_sub(1, std::memory_order_relaxed);
  return 0;
}

std::expected<Srq*, int> Context::create_srq(Pd* pd, uint32_t max_wr, uint32_t max_sge, uint32_t limit) {
  if (max_wr < 1 || max_wr > kMaxQpWr || max_sge < 1 || max_sge > kMaxSge || limit > max_wr)
    return std::unexpected(EINVAL);
  if (!take_one(n_srq_, kMaxSrq)) return std::unexpected(ENOMEM);
  pd->users.fetch_add(1);
  return new Srq(this, pd, max_wr, max_sge, limit, nullptr);
}

int Context::destroy_srq(Srq* srq) {
  if (srq->users.load() != 0) return EBUSY;
  srq->pd()->users.fetch_sub(1);
  forget_events(srq);
  delete srq;
  n_srq_.fetch_sub(1, std::memory_order_relaxed);
  return 0;
}

std::expected<uint32_t, int> Context::alloc_qpn() {
  // QPN = port << 8 | slot: each port owns 256 QPNs, and a peer finds the port from the QPN.
  for (uint16_t port : ports_) {
    QpBlock* b = blocks_[port].load();
    for (uint32_t i = (port == 0 ? 2 : 0); i < 256; ++i)
      if (!b->qp[i].load()) return uint32_t{port} << 8 | i;
  }
  uint16_t port;
  if (cfg_.standard_port) {
    if (ports_.empty() && !backend_->open_port(wire::kRoceV2Port)) return std::unexpected(EADDRINUSE);
    port = next_virtual_port_++;  // QPN blocks only; every QP shares the 4791 socket
  } else {
    auto p = backend_->open_port(0);
    if (!p) return std::unexpected(p.error());
    port = *p;
  }
  if (port == 0xFFFF) return std::unexpected(ENOMEM);  // QPN 0xFFFFxx would reach the multicast QPN
  blocks_[port].store(new QpBlock);
  ports_.push_back(port);
  return uint32_t{port} << 8;
}

std::expected<Qp*, int> Context::create_qp(Pd* pd, const QpInitAttr& init) {
  const QpCap& c = init.cap;
  if (!init.send_cq || !init.recv_cq || c.max_send_wr > kMaxQpWr || c.max_recv_wr > kMaxQpWr ||
      c.max_send_sge > kMaxSge || c.max_recv_sge > kMaxSge || c.max_inline_data > kMaxInline)
    return std::unexpected(EINVAL);
  if (init.type != QpType::kRc && init.type != QpType::kUc && init.type != QpType::kUd)
    return std::unexpected(EOPNOTSUPP);
  if (!take_one(n_qp_, kMaxQp)) return std::unexpected(ENOMEM);
  if (init.type == QpType::kUd) backend_->want_ip_fields();  // for its receives' GRH
  std::lock_guard g(mu_);
  auto qpn = alloc_qpn();
  if (!qpn) {
    n_qp_.fetch_sub(1, std::memory_order_relaxed);
    return std::unexpected(qpn.error());
  }
  const uint16_t port = cfg_.standard_port ? wire::kRoceV2Port : static_cast<uint16_t>(*qpn >> 8);
  Qp* qp = new Qp(this, pd, *qpn, port, init);
  blocks_[*qpn >> 8].load()->qp[*qpn & 0xFF].store(qp, std::memory_order_release);
  qps_.push_back(qp);
  pd->users.fetch_add(1);
  init.send_cq->users.fetch_add(1);
  init.recv_cq->users.fetch_add(1);
  if (init.srq) init.srq->users.fetch_add(1);
  return qp;
}

int Context::destroy_qp(Qp* qp) {
  qp->forget_published();
  backend_->publish_qp({qp->qpn(), 0, 0, 0, false});
  {
    std::lock_guard g(mu_);
    blocks_[qp->qpn() >> 8].load()->qp[qp->qpn() & 0xFF].store(nullptr, std::memory_order_seq_cst);
    std::erase(qps_, qp);
  }
  // The driver of this context may be handling a packet of this QP right now: wait for it to finish.
  const uint64_t gen = driver_gen_.load(std::memory_order_seq_cst);
  if (gen & 1) {
    while (driver_gen_.load(std::memory_order_acquire) == gen) std::this_thread::yield();
  }
  qp->flush_deferred_ack();  // owed for messages already executed
  const QpInitAttr& init = qp->init();
  qp->pd()->users.fetch_sub(1);
  init.send_cq->users.fetch_sub(1);
  init.recv_cq->users.fetch_sub(1);
  if (init.srq) init.srq->users.fetch_sub(1);
  forget_events(qp);
  delete qp;
  n_qp_.fetch_sub(1, std::memory_order_relaxed);
  return 0;
}

std::expected<Ah*, int> Context::create_ah(Pd* pd, const AhAttr& attr) {
  if (attr.port_num != 1) return std::unexpected(EINVAL);
  if (!take_one(n_ah_, kMaxAh)) return std::unexpected(ENOMEM);
  Ah* ah = new Ah;
  ah->pd = pd;
  ah->attr = attr;
  pd->users.fetch_add(1);
  return ah;
}

int Context::destroy_ah(Ah* ah) {
  ah->pd->users.fetch_sub(1);
  delete ah;
  n_ah_.fetch_sub(1, std::memory_order_relaxed);
  return 0;
}

Qp* Context::find_qp(uint32_t qpn) const {
  QpBlock* b = blocks_[(qpn >> 8) & 0xFFFF].load(std::memory_order_acquire);
  return b ? b->qp[qpn & 0xFF].load(std::memory_order_acquire) : nullptr;
}

void Context::store_deadline(Qp& qp) {
  const Nanos d = Transport::deadline(qp);
  qp.next_deadline.store(d, std::memory_order_relaxed);
  deadline_armed(d);
}

namespace {
// The QPs whose posts this thread left queued (Context::corked), of one context at a time. A QP that
// does not fit, or that another thread polls for, is sent by the next ACK or the release of a driver's
// hold (RC: Transport::release_tx), or by its cork timer (UC/UD).
struct CorkedList {
  const Context* ctx = nullptr;
  uint32_t n = 0;
  uint32_t qpn[16]{};
};

// What a thread keeps between its verbs calls, in one thread-local object (read through `tls_once`): in a
// shared library each thread-local is found by a call, and a poll of an empty CQ made five of them.
struct ThreadState {
  CorkedList corked;
  bool app_drive = false;  // this thread drives from a poll of the application's (drive_from_app)
  // drive_from_app's: its clock, its polls, and its runs of polls that were blocked or found nothing
  Nanos t = 0;
  uint32_t polls = 0, blocked = 0, idle = 0;
  Nanos idle_since = 0;  // the clock (t) at the first poll of the run of idle ones
  io::TxBatch tx;
};
constinit thread_local ThreadState tls;
}  // namespace

// The destroying thread's list must not name this context after it: the list would stay filled (a
// context's poll empties only its own) and record no other context's QPs again, or name a new context
// made at the same address. Other threads' lists are left as they are.
void Context::forget_corked() {
  CorkedList& l = tls_once(tls).corked;
  if (l.ctx == this) l = CorkedList{};
}

void Context::rx_burst(std::span<io::RxPacket> pkts, io::TxBatch& tx, Nanos now) {
  driver_gen_.fetch_add(1, std::memory_order_seq_cst);  // odd: busy
  Counters& c = *counters_;
  Qp* touched[io::kRxBurst * 2];
  uint32_t n_touched = 0;
  bool answer_late = false;  // kKickWatch
  Qp* held[io::kRxBurst * 2];  // Transport::hold_tx until the flush at the end
  uint32_t n_held = 0;
  for (io::RxPacket& rx : pkts) {
    PacketView v(rx.data, rx.len);
    if (rx.len < wire::kBthLen) {
      c.add(Counter::drop_truncated);
      continue;
    }
    const wire::OpcodeInfo& oi = v.info();
    if (!oi.has(wire::kValid)) {
      c.add(Counter::drop_bad_opcode);
      continue;
    }
    if (!v.valid_length()) {
      c.add(Counter::drop_truncated);
      continue;
    }
    // P_Key: only the default partition exists (IBTA.md 7, P_Key check).
    if (v.tver() != 0 || (v.pkey() & 0x7FFF) != 0x7FFF) {
      c.add(Counter::drop_bad_header);
      continue;
    }
    Qp* qp = find_qp(v.dest_qpn());
    if (!qp) {
      c.add(Counter::drop_no_qp);
      continue;
    }
    const wire::Transport t = wire::transport_of(v.opcode());
    const QpType type = qp->type();
    if ((type == QpType::kRc && t != wire::Transport::kRc) ||
        (type == QpType::kUc && t != wire::Transport::kUc) ||
        (type == QpType::kUd && t != wire::Transport::kUd)) {
      c.add(Counter::drop_bad_opcode);
      continue;
    }
    std::lock_guard g(qp->lock());
    const QpState st = qp->state();
    // Requests need a responder (RTR and later); responses a requester (RTS, SQD).
    const bool request = oi.has(wire::kRequest);
    if (request ? (st != QpState::kRtr && st != QpState::kRts && st != QpState::kSqd)
                : (st != QpState::kRts && st != QpState::kSqd)) {
      c.add(Counter::drop_qp_state);
      continue;
    }
    if (type != QpType::kUd) {
      // A connected QP accepts packets only from its peer.
      const wire::Endpoint& peer = qp->peer();
      if (rx.src.addr != peer.addr || (!cfg_.standard_port && rx.src.port != peer.port)) {
        c.add(Counter::drop_wrong_peer);
        continue;
      }
    }
    if (request) {
      Transport::responder(*qp, v, rx, tx, now);
      if (type == QpType::kUc) Transport::uc_request_came(*qp, now, oi.any(wire::kEnd));
      if (type == QpType::kRc) {
        // Held by the responder (a completion on a channel): its ACK goes first, as for the completer's
        // packets below.
        if (Transport::tx_held(*qp) && (n_held == 0 || held[n_held - 1] != qp)) {
          if (n_held < std::size(held)) {
            held[n_held++] = qp;
          } else {
            Transport::flush_ack(*qp, tx);
            tx.flush();
            Transport::release_tx(*qp, tx, now);
            tx.flush();
          }
        }
        Transport::request_came(*qp, (rx.flags & io::kAwaitsAck) != 0);
        // The answer came (kAnswerHoldNs), or a packet of it: the hold lasts until its last, kAnswerHoldNs
        // after the latest at most, kAnswerUnderwayHoldNs where nothing else is outstanding on the QP (ended
        // at the first, a poll returned the completion while most of a 1 MiB answer was still to come, and
        // the progress thread received it ms later).
        if (oi.any(wire::kEnd))
          qp->init().send_cq->release_hold();
        else
          qp->init().send_cq->extend_hold(
              now + (Transport::answer_underway(*qp) ? kAnswerUnderwayHoldNs : kAnswerHoldNs));
        if (n_touched < std::size(touched) && (n_touched == 0 || touched[n_touched - 1] != qp))
          touched[n_touched++] = qp;
        else if (n_touched == std::size(touched))
          Transport::flush_ack(*qp, tx);
      }
    } else {
      // What ACKs release goes out at the end of the burst, the packets of many QPs in one send call
      // (flushed after each ACK, 64 QPs x 1 MiB over UDP made 12 packets per sendmmsg against 1 QP's 23;
      // 6 interleaved rounds, 64 KiB ib_write_bw: 64 QPs 3,129 -> 3,560 MiB/s, 1 QP 3,369 -> 3,739).
      // Until then the QP is held: a post_send on another thread, which would send at once under this
      // lock, waits instead (Transport::hold_tx), so that it cannot overtake these packets (the peer
      // would NAK the gap and go-back-N).
      const uint64_t completed = Transport::completed(*qp);
      Transport::completer(*qp, v, tx, now);
      // (The burst's last packet has nothing after it to share the send call with: sent at once.)
      if (tx.n != 0 && type == QpType::kRc && &rx != &pkts.back()) {
        if (n_held == std::size(held)) {
          tx.flush();  // no room to remember it: as before (the held ones stay held until the end)
        } else if (n_held == 0 || held[n_held - 1] != qp) {
          Transport::hold_tx(*qp);
          held[n_held++] = qp;
        }
      } else {
        tx.flush();
      }
      if (type == QpType::kRc && Transport::ack_came_alone(*qp, completed)) {
        // The answer comes after this ACK (kAnswerHoldNs): a polling application keeps polling for it.
        // The progress thread is asked to watch for it at once only when it received the ACK itself (the
        // application may be spinning on memory already), or when no poll can be held (events).
        // Held only where nothing else is outstanding on the QP: in a stream in both directions (ib_send_bw
        // -b) such ACKs came about once per 3 messages, and each held the CQ's completions of both
        // directions from an application that waited for no answer.
        Cq* scq = qp->init().send_cq;
        const bool events = scq->events_awaited(now);
        if (!events && Transport::sq_empty(*qp)) {
          scq->hold(now + kAnswerHoldNs);
          c.add(Counter::answer_holds);
        }
        if (events || !tls_once(tls).app_drive) answer_late = true;
      } else if (type == QpType::kRc && Transport::completed(*qp) != completed &&
                 Transport::answer_underway(*qp) && !qp->init().send_cq->events_awaited(now)) {
        // The ACK came with the first packets of the peer's answer (one of many packets, which the peer
        // sends after its first window and its deferred ACK): the poll holds the completion until the
        // answer's last packet, as above, and receives the rest itself. Returned at once, the application
        // (ib_write_lat) spun on memory while the rest waited for the napping progress thread: 2 MiB took
        // 8-12 ms a half round trip, in steps of the scheduler's tick.
        qp->init().send_cq->hold(now + kAnswerUnderwayHoldNs);
        c.add(Counter::answer_holds);
      }
    }
    store_deadline(*qp);
  }
  // One ACK per QP per burst covers every AckReq packet it received (ACK coalescing); a QP that sends
  // too defers it to its next post (Transport::end_burst).
  for (uint32_t i = 0; i < n_touched; ++i) {
    Qp& qp = *touched[i];
    std::lock_guard g(qp.lock());
    const Nanos armed = Transport::end_burst(qp, tx, now);
    store_deadline(qp);
    // An application thread that received this burst may stop polling now, and the progress thread may
    // have read the deadlines before this one and sleep with no bound. Woken only if it would sleep
    // kLateAckNs past the deadline: one that naps or sleeps beside a polling application is not, else
    // every ping-pong iteration (each defers an ACK) would cost it a wake-up (ib_write_lat: 44 us typical
    // in some runs, the thread kicked out of each 20 ms sleep).
    if (armed) kick(armed + kLateAckNs);
  }
  tx.flush();
  for (uint32_t i = 0; i < n_held; ++i) {
    std::lock_guard g(held[i]->lock());
    if (Transport::release_tx(*held[i], tx, now)) {
      tx.flush();  // before the lock goes: a post after it would send at once
      store_deadline(*held[i]);
    }
  }
  if (answer_late) ask_watch(now);
  driver_gen_.fetch_add(1, std::memory_order_acq_rel);  // even: idle
}

Nanos Context::tick(io::TxBatch& tx, Nanos now) {
  driver_gen_.fetch_add(1, std::memory_order_acq_rel);
  Nanos next = 0;
  {
    std::lock_guard g(mu_);
    for (Qp* qp : qps_) {
      Nanos d = qp->next_deadline.load(std::memory_order_relaxed);
      if (d && d <= now) {
        std::lock_guard q(qp->lock());
        d = Transport::timers(*qp, tx, now);
        tx.flush();  // retransmissions before the lock goes (see rx_burst)
        d = Transport::deadline(*qp);
        qp->next_deadline.store(d, std::memory_order_relaxed);
      }
      if (d && (!next || d < next)) next = d;
    }
  }
  tx.flush();
  driver_gen_.fetch_add(1, std::memory_order_acq_rel);
  return next;
}

void Context::corked(uint32_t qpn) {
  CorkedList& l = tls_once(tls).corked;
  if (l.ctx != this) {
    if (l.n) return;
    l.ctx = this;
  }
  if (l.n < std::size(l.qpn)) l.qpn[l.n++] = qpn;
}

// Inside the driver's exclusion, as a receive: a QP destroyed meanwhile is gone from the table, and
// destroy_qp waits for an odd generation to pass before it frees one found here.
void Context::send_corked() {
  CorkedList& l = tls_once(tls).corked;
  if (l.n == 0 || l.ctx != this) return;
  driver_gen_.fetch_add(1, std::memory_order_seq_cst);  // odd: busy
  for (uint32_t i = 0; i < l.n; ++i)
    if (Qp* qp = find_qp(l.qpn[i])) qp->send_corked();
  l.n = 0;
  driver_gen_.fetch_add(1, std::memory_order_acq_rel);  // even: idle
}

int Context::drive(io::TxBatch& tx, Nanos now, bool run_timers) {
  int total = 0;
  // A thread that found this one driving may have asked it to read once more (hand_over): the flag is
  // set before that thread looks at driving_, and read here after driving_ is released (both seq_cst), so
  // either it saw driving_ clear and drives itself, or this thread sees the flag.
  do {
    if (driving_.exchange(true, std::memory_order_acquire)) return total ? total : -1;
    drives_.store(drives_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    rescan_.store(false, std::memory_order_relaxed);
    send_corked();
    // Left uninitialised: rx_burst sets every field of each packet it returns. Initialising the 32 was 40%
    // of this function's time in a polling loop, where most calls find nothing.
    Scratch<io::RxPacket, io::kRxBurst> burst;
    io::RxPacket* const pkts = burst.at;
    for (int i = 0; i < 64; ++i) {  // bounded, so timers still run under a flood
      const uint32_t n = backend_->rx_burst(pkts, io::kRxBurst);
      if (n == 0) break;
      total += static_cast<int>(n);
      // The clock is read per burst: the ACKs of one burst can release many packets to send, and a
      // retransmit deadline armed from a clock frozen at the start of this loop would fire early. (The
      // caller's `now` may be a few microseconds old: it is used only when nothing arrives.) The backend's
      // read as its receive began will do, where it made one (the same-host backend's).
      const uint64_t rx_clock = cfg_.clock ? 0 : backend_->rx_clock();
      now = rx_clock != 0 ? rx_clock : this->now();
      rx_burst(std::span(pkts, n), tx, now);
      // (The timers below take this `now`, older by the last burst's work: one due meanwhile runs in the
      // next drive. Read again after the loop, it was one of the five clock reads, 60 TSC cycles each, of
      // every same-host ping-pong turnaround, about 900 cycles from the ring's slot to the answer's.)
      // Another receive call would find nothing: skip it. It cost a syscall before the caller got the
      // completions of this burst (8-byte ib_write_lat over UDP: one per half round trip).
      if (backend_->rx_drained()) break;
    }
    if (run_timers || now >= next_tick_.load(std::memory_order_relaxed)) {
      // Timers run only here, inside the driver's exclusion: the packets a timer retransmits point into
      // send buffers, and only the driver completes WQEs (on ACKs), so no buffer can be handed back to the
      // application before those packets are on the wire. The mark is cleared before the scan: a timer
      // that a post arms during the scan lowers it again (deadline_armed), and what the scan found lowers
      // it after; storing the scan's result instead would raise the mark over a timer armed meanwhile.
      next_tick_.store(kNoTimer, std::memory_order_seq_cst);
      deadline_armed(tick(tx, now));
    }
    run_timers = false;
    driving_.store(false, std::memory_order_seq_cst);
  } while (rescan_.load(std::memory_order_seq_cst));
  return total;
}

namespace {
// Whether every signal handler of the process restarts system calls (SA_RESTART). A signal interrupts a
// blocking read() of a channel's fd (ibv_get_cq_event in rdma-core) only without it, but poll() always:
// after poll() says EINTR, waiting on is right only if the read would have gone on. (Which signal came is
// not known: a handler without SA_RESTART makes it EINTR. qperf ends a test with SIGALRM so, its side
// blocked in ibv_get_cq_event; a wait that went on hung the test.)
bool handlers_restart() {
  for (int sig = 1; sig < NSIG; ++sig) {
    // Raised by a faulting instruction, never during a system call (sanitizers install handlers for them).
    if (sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL || sig == SIGTRAP) continue;
    struct sigaction sa {};
    if (sigaction(sig, nullptr, &sa) != 0) continue;
    if ((sa.sa_flags & SA_SIGINFO) == 0 && (sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN)) continue;
    if ((sa.sa_flags & SA_RESTART) == 0) return false;
  }
  return true;
}
}  // namespace

int Context::wait_for_event(CompChannel& ch) {
  ThreadState& ts = tls_once(tls);
  ts.tx.sink = backend_;
  pollfd fds[1 + kMaxEventWaitFds];
  // The lease (event_wait_lease_end) begins at the first sleep on the sockets, and again when the wait
  // ends: a thread that cannot sleep on them here leaves receiving to the progress thread, undisturbed.
  struct Leave {
    Context* c;
    bool slept = false;
    ~Leave() {
      if (slept) c->event_wait_at_.store(c->now(), std::memory_order_relaxed);
    }
  } leave{this};
  fds[0] = pollfd{ch.fd(), POLLIN, 0};
  for (;;) {
    bool other = false;  // another thread drives: it reads the sockets (hand_over)
    while (drive(ts.tx, now(), true) < 0 && !(other = hand_over())) {
    }
    if (ch.has_event()) return 0;
    int n = 0;  // sockets polled beside the channel
    timespec t{};
    const timespec* bound = &t;
    if (other) {
      // Sleeping on the sockets, which it has yet to read, would be a spin beside it (on its CPU, until the
      // scheduler's tick): wait for the channel alone, briefly, then look again.
      t.tv_nsec = kEventWaitBesideDriverNs;
    } else {
      n = backend_->app_wait_fds(fds + 1, kMaxEventWaitFds);
      if (n < 0) continue;  // something came meanwhile
      if (n == 0) return 0;
      // Until the next timer (this thread runs the timers, as any driver).
      const Nanos deadline = next_timer();
      if (deadline == kNoTimer) {
        bound = nullptr;
      } else {
        const Nanos at = now();
        const Nanos ns = deadline > at ? deadline - at : 0;
        t = timespec{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
      }
      counters_->add(Counter::event_wait_sleeps);
      if (!leave.slept) {
        leave.slept = true;
        event_wait_at_.store(now(), std::memory_order_relaxed);
      }
    }
    const int r = ppoll(fds, static_cast<nfds_t>(n + 1), bound, nullptr);
    if (r > 0 && (fds[0].revents & POLLIN) != 0) return 0;
    if (r > 0) backend_->sockets_readable();
    if (r < 0 && errno == EINTR && !handlers_restart()) return EINTR;
  }
}

bool Context::drive_from_app() {
  ThreadState& ts = tls_once(tls);
  uint32_t& polls = ts.polls;
  Nanos& t = ts.t;
  ts.tx.sink = backend_;
  // A polling loop calls this millions of times a second; reading the clock each time cost 6% of the
  // CPU in rc-bench's profile. Every 16th call is fresh enough for the "application is busy-polling" mark
  // and for deciding whether timers are due (drive reads the clock itself when packets arrive).
  if ((polls++ & 15) == 0 || !t) t = now();
  // Busy-polling: a run of empty polls with no completion in between (a waiting loop). An application
  // that polls once now and then (ib_write_lat polls once per iteration, then spins on memory) is not
  // one: the progress thread must keep receiving for it.
  const uint32_t empty = app_empty_polls_.load(std::memory_order_relaxed) + 1;
  app_empty_polls_.store(empty, std::memory_order_relaxed);
  app_poll_seq_.store(app_poll_seq_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  if (empty >= kBusyPollRun && (polls & 15) == 1) {
    app_drive_ns_.store(t, std::memory_order_relaxed);
    app_cpu_.store(sched_getcpu(), std::memory_order_relaxed);
  }
  // Posts this thread left queued go in this drive (send_corked); UC/UD ones complete as they go.
  const bool corked = ts.corked.n != 0 && ts.corked.ctx == this;
  ts.app_drive = true;
  const int got = drive(ts.tx, t, false);
  ts.app_drive = false;
  // Another thread has been driving through many polls: the progress thread, preempted on this CPU while
  // it held the receive path (a woken progress thread runs briefly; if the scheduler's tick falls then,
  // this thread spun without progress until the next tick, 4 ms). Yield so that it can finish.
  uint32_t& blocked = ts.blocked;
  // A run of polls that found nothing: yield now and then. A progress thread that a packet woke on this
  // CPU waits behind this thread otherwise: the scheduler (EEVDF) does not let it preempt while its lag is
  // negative, and this thread enters the kernel only for receive calls that do not reschedule, so it
  // waited for the next tick (4 ms; perf sched timehist). What this thread waits for is often what that
  // one is to send: ib_write_lat's sender polls for the ACK of the peer's progress thread. Measured, 8-byte
  // ib_write_lat over UDP: 680 -> 20 us average, 4 ms -> 40 us at the 99.9th percentile. Now and then is
  // after kYieldAfterIdleNs of such polls, not after a count of them: over UDP 16 polls took about that
  // long (a receive call each), but on the same-host path, where a poll reads the rings and makes no
  // system call, 16 took about 1 us, and a ping-pong's waiting side yielded once or twice per round trip,
  // a system call that an answer coming meanwhile waited for. Same-host 8-byte ib_send_lat, 5,000
  // iterations: yields 0.4-0.74 -> 0.005-0.04 per iteration; mean lower in 8 of 11 interleaved pairs.
  uint32_t& idle = ts.idle;
  if (got >= 0) {
    blocked = 0;
    if (got > 0) {
      idle = 0;
    } else if (idle++ == 0) {
      ts.idle_since = t;
    } else if (idle >= kYieldAfterIdlePolls && t - ts.idle_since >= kYieldAfterIdleNs) {
      idle = 0;
      counters_->add(Counter::poll_yields);
      sched_yield();
    }
  } else if (++blocked >= kYieldAfterBlockedPolls) {
    blocked = 0;
    sched_yield();
  }
  return got > 0 || (corked && got == 0);
}

void Context::ask_watch(Nanos now) {
  // At most one ask per kWatchAskGapNs: the watch it starts lasts about that long (engine/progress.cc).
  if (now - watch_asked_at_.load(std::memory_order_relaxed) < kWatchAskGapNs) return;
  watch_asked_at_.store(now, std::memory_order_relaxed);
  watch_asked_.store(true, std::memory_order_release);
  kick(kKickWatch);
}

void Context::kick(Nanos by) {
  if (kick_fn_) kick_fn_(kick_arg_, by);
}

void Context::raise(AsyncEventType type, void* object) {
  std::lock_guard g(async_mu_);  // the queue and the fd's count move together (forget_events)
  async_q_.push_back({type, object});
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(async_fd_, &one, sizeof one);
}

void Context::forget_events(const void* object) {
  std::lock_guard g(async_mu_);
  const size_t before = async_q_.size();
  std::erase_if(async_q_, [object](const AsyncEvent& e) { return e.object == object; });
  for (size_t i = async_q_.size(); i < before; ++i) {
    uint64_t v;
    [[maybe_unused]] ssize_t n = read(async_fd_, &v, sizeof v);  // a semaphore: takes one
  }
}

std::expected<AsyncEvent, int> Context::get_async_event() {
  std::lock_guard g(async_mu_);
  if (async_q_.empty()) return std::unexpected(EAGAIN);
  uint64_t v;
  [[maybe_unused]] ssize_t n = read(async_fd_, &v, sizeof v);
  AsyncEvent e = async_q_.front();
  async_q_.pop_front();
  return e;
}

}  // namespace softrdma::core
