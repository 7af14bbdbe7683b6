// A device context: the soft NIC of one process for one device. It owns the key table, the QP table, the
// async event queue and the counters, and it runs the transport for received packets and timers. Who
// drives it (the engine's progress thread, or a test) calls rx_burst() and tick().
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <expected>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/counters.h"
#include "core/objects.h"
#include "core/qp.h"
#include "io/backend.h"
#include "wire/headers.h"

namespace softrdma::core {

struct ContextConfig {
  std::string device_name = "sr_sim";
  uint32_t active_mtu = 4096;  // bytes, the largest path MTU the interface allows
  bool standard_port = false;  // RoCEv2 standard mode: every peer at UDP 4791
  // RC send window: the payload bytes one QP keeps un-ACKed at most (256 packets at path MTU 4096, 1,024
  // at 1024: counted in packets, a QP at MTU 1500 kept a quarter of the bytes in flight).
  uint32_t window_bytes = 1u << 20;
  // Payload bytes that the RC QPs of this context together keep un-ACKed, at most (each QP's window
  // shrinks to its share, down to kMinWindow packets): 64 QPs with full windows put 64 MiB into the
  // peer's socket buffers, which overran them (go-back-N) and evicted the data from the caches before it
  // was read.
  uint32_t inflight_budget = 4u << 20;
  // A same-host WRITE or READ of at least this many bytes takes the one-sided path even in a stream of
  // posts (Qp::may_direct_ says when smaller ones do); 0: never. SOFTRDMA_DIRECT_STREAM sets it.
  uint32_t direct_stream_min = 64u << 10;
  Nanos (*clock)() = nullptr;  // a fake clock for tests; CLOCK_MONOTONIC when null
  uint64_t mr_key_seed = 0;    // repeatable MR keys for tests and the fuzzer; 0: from getrandom
};

struct AsyncEvent {
  AsyncEventType type;
  void* object = nullptr;  // Qp*, Cq* or Srq*, or nullptr for port events
};

class Context {
 public:
  // `backend` and `counters` must outlive the context.
  Context(io::Backend* backend, Counters* counters, const ContextConfig& cfg);
  ~Context();
  // Sends the ACKs that the QPs of every context of this process deferred (Transport::end_burst). Run at
  // exit (registered with the first context): a process that exits without closing its devices must not
  // leave its peer retransmitting towards it for messages it received. A NIC would have acknowledged them.
  static void flush_deferred_acks_at_exit();

  const ContextConfig& config() const { return cfg_; }
  io::Backend* backend() const { return backend_; }
  Counters& counters() const { return *counters_; }
  MrTable& mrs() { return mrs_; }
  const wire::Gid& local_addr() const { return backend_->local_addr(); }

  // Objects. Return an errno on failure, as rdma-core does.
  std::expected<Pd*, int> alloc_pd();
  int dealloc_pd(Pd* pd);
  std::expected<Mr*, int> reg_mr(Pd* pd, void* addr, uint64_t length, uint64_t iova, uint32_t access);
  int dereg_mr(Mr* mr);
  std::expected<Cq*, int> create_cq(uint32_t cqe, CompChannel* channel, void* user_context);
  int destroy_cq(Cq* cq);
  std::expected<Srq*, int> create_srq(Pd* pd, uint32_t max_wr, uint32_t max_sge, uint32_t limit);
  int destroy_srq(Srq* srq);
  std::expected<Qp*, int> create_qp(Pd* pd, const QpInitAttr& init);
  int destroy_qp(Qp* qp);
  std::expected<Ah*, int> create_ah(Pd* pd, const AhAttr& attr);
  int destroy_ah(Ah* ah);

  Qp* find_qp(uint32_t qpn) const;
  // The UDP endpoint at which a peer QP listens.
  wire::Endpoint peer_endpoint(const wire::Gid& gid, uint32_t qpn) const {
    return {gid, cfg_.standard_port ? wire::kRoceV2Port : static_cast<uint16_t>(qpn >> 8)};
  }

  // Driving the soft NIC.
  void rx_burst(std::span<io::RxPacket> pkts, io::TxBatch& tx, Nanos now);
  // Runs expired timers; returns the nearest deadline still armed (0 = none). For a single-threaded
  // driver (the tests); threads call drive(), which runs it inside the driver's exclusion.
  Nanos tick(io::TxBatch& tx, Nanos now);
  // Receive progress from whichever thread gets there: the progress thread, or an application thread that
  // polls an empty CQ (so a busy-polling application needs no other thread to run on a 2-core machine).
  // Returns the number of packets received, or -1 when another thread is driving. `tx` is that thread's
  // batch.
  int drive(io::TxBatch& tx, Nanos now, bool run_timers);
  // After drive() returned -1: asks the thread driving to read the sockets once more before it lets go (a
  // packet may have come after its last read, and the kernel may not wake anyone for it). False when no
  // thread was driving by then: the caller drives itself.
  bool hand_over() {
    rescan_.store(true, std::memory_order_seq_cst);
    return driving_.load(std::memory_order_seq_cst);
  }
  // The drives begun so far: a thread that found another driving twice, some time apart, with the same
  // count, found one drive that lasted (an application thread whose poll keeps finding work: the ACKs of
  // a stream, each releasing packets to send). A count and not the drive's start time: an application's
  // drive takes a clock read up to 16 polls old (drive_from_app).
  uint64_t drives() const { return drives_.load(std::memory_order_relaxed); }
  // A post on this thread left WRs of QP `qpn` queued (Qp::post_send): this thread's next drive sends them
  // (an application polls its CQ after it posted), unless an ACK (RC) or the QP's cork timer (UC/UD) did.
  void corked(uint32_t qpn);
  // Whether an application thread drove progress within `ns` before `now`.
  bool app_driving(Nanos now, Nanos ns) const {
    return now - app_drive_ns_.load(std::memory_order_relaxed) < ns;
  }
  void clear_app_driving() { app_drive_ns_.store(0, std::memory_order_relaxed); }
  void set_app_driving(Nanos now) { app_drive_ns_.store(now, std::memory_order_relaxed); }
  // A poll found completions: the run of empty polls that marks a busy-polling thread starts again.
  void app_polled_something() {
    if (app_empty_polls_.load(std::memory_order_relaxed))
      app_empty_polls_.store(0, std::memory_order_relaxed);
  }
  // From an application thread: drives progress with a batch of its own if no one else is. True when it
  // may have produced completions (it received packets, or sent what this thread's posts left queued).
  bool drive_from_app();
  // From an application thread about to block on `ch` (ibv_get_cq_event) with no event there: receives
  // itself until one is, sleeping in poll() between packets and timers on the backend's sockets and the
  // channel's fd, so that a packet wakes the thread that waits for it, as a blocking UDP receive would
  // (the progress thread's wake-up, then the channel's, made two: 8-byte ib_send_lat -e over UDP 55-87 us
  // typical against 14 for a blocking UDP ping-pong). Returns without an event only when the backend
  // offers nothing to sleep on (io/sim, fault injection): the caller then blocks on the fd alone. 0, or
  // EINTR where a signal would have interrupted that blocking read (a handler without SA_RESTART).
  int wait_for_event(CompChannel& ch);
  static constexpr int kMaxEventWaitFds = 8;  // sockets; a context with more leaves it to the progress thread
  static constexpr long kEventWaitBesideDriverNs = 50'000;
  // The lease: until kEventWaitLeaseNs after such a wait first slept on the sockets, and after it ended,
  // the progress thread sleeps without watching the sockets (the application receives; each packet woke
  // both threads) and req_notify does not wake it. Past that, a thread that waits on the channel's fd by
  // its own poll() gets its events from the progress thread again: the lease bounds how late they come.
  Nanos event_wait_lease_end() const {
    const Nanos at = event_wait_at_.load(std::memory_order_relaxed);
    return at == 0 ? 0 : at + kEventWaitLeaseNs;
  }
  static constexpr Nanos kEventWaitLeaseNs = 2'000'000;
  // Counts the application's empty polls (a hint: relaxed, lost updates possible): a value that does not
  // move for microseconds means no thread polls right now.
  uint32_t app_poll_seq() const { return app_poll_seq_.load(std::memory_order_relaxed); }
  // The CPU a busy-polling application thread was last seen on (-1: none yet; a hint, as app_poll_seq).
  int app_cpu() const { return app_cpu_.load(std::memory_order_relaxed); }
  // Counts the application's posts and the polls that found completions (a hint, as app_poll_seq).
  void note_app_call() { app_calls_.store(app_calls_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
  // Moves with every post and poll: a value that stays put while the progress thread spins means no
  // application thread of this context is running verbs calls.
  uint32_t app_calls() const {
    return app_calls_.load(std::memory_order_relaxed) + app_poll_seq_.load(std::memory_order_relaxed);
  }

  // Wakes a sleeping driver that would sleep past `by` (0: wakes it in any case): a QP armed a timer due
  // then, or (0) an application is about to wait for events and the driver must receive for it.
  void kick(Nanos by = 0);
  // A QP armed a timer for `d`: the next drive runs the timers by then. (A polling application runs them
  // when they are due by this; without it an RNR retry waited for a later deadline, such as the 67 ms ACK
  // timeout: ib_send_bw -s 8 -Q 1 at 2,200 messages per second.)
  void deadline_armed(Nanos d) {
    Nanos cur = next_tick_.load(std::memory_order_relaxed);
    while (d != 0 && d < cur && !next_tick_.compare_exchange_weak(cur, d, std::memory_order_seq_cst)) {
    }
  }
  // The RC send window of a QP with this path MTU: the context's budget shared by its sending QPs, or
  // `cap` (its path's Backend::inflight_cap, 0: none) where that is smaller. Each QP keeps kMinWindow
  // packets of the budget at least; of a cap, kMinCappedWindow: one packet (socket ib_write_bw -q 64 -n 200
  // as a user, 416 KiB buffers: with two each, 9-35 drops and 28-50 ACK timeouts a run; with one, 0-1, 0-15).
  uint32_t window_for(uint32_t pmtu, uint64_t cap = 0) const {
    const uint64_t n = std::max<uint32_t>(1, rc_sending_.load(std::memory_order_relaxed));
    const bool capped = cap != 0 && cap < cfg_.inflight_budget;
    const uint64_t budget = capped ? cap : cfg_.inflight_budget;
    return static_cast<uint32_t>(std::clamp<uint64_t>(
        budget / (pmtu * n), capped ? kMinCappedWindow : kMinWindow, cfg_.window_bytes / pmtu));
  }
  static constexpr uint32_t kMinWindow = 16;
  static constexpr uint32_t kMinCappedWindow = 1;
  // RC QPs that have reached RTS (and were not reset or destroyed since): the sharers of the budget.
  void rc_sending(int delta) { rc_sending_.fetch_add(delta, std::memory_order_relaxed); }
  // The earliest armed timer (kNoTimer: none), for a driver that is about to sleep.
  Nanos next_timer() const { return next_tick_.load(std::memory_order_seq_cst); }
  static constexpr Nanos kNoTimer = std::numeric_limits<Nanos>::max();
  // How late past its deadline a deferred ACK may go before a sleeping driver is woken for it (rx_burst):
  // as late as other timers beside a polling application (the progress thread's 20 ms sleep then).
  static constexpr Nanos kLateAckNs = 20'000'000;
  // The kick of an answer that comes late (rx_burst): the ACK of a ping-pong came without the peer's
  // request, which follows it, maybe when the application no longer polls (ib_write_lat spins on memory
  // once its WRITE completed). A progress thread that naps beside the polling application is woken and
  // watches the sockets for its next sleep instead (take_watch_request); a nap ends on the scheduler's
  // tick, and the answer waited for it: 3-4 ms, 1 to 4 times per 5,000 iterations of 8-byte socket-path
  // ib_write_lat, which took its average from 6.5 to 8-12 us.
  static constexpr Nanos kKickWatch = 1;
  static constexpr Nanos kWatchAskGapNs = 1'000'000;
  bool take_watch_request() { return watch_asked_.exchange(false, std::memory_order_acq_rel); }
  // Asks for that watch (at most once per kWatchAskGapNs) and kicks the progress thread.
  void ask_watch(Nanos now);
  // How long the completion of such an ACK is held from the application's polls (Cq::hold) when an
  // application thread received it: it polls on, receives the answer itself and finds it in memory when
  // the poll returns the completion, instead of spinning on memory while the answer waits in the socket
  // for the progress thread. Asked from there, that thread, woken for each packet beside two spinning
  // applications on 2 cores, was queued behind one of them for a whole slice (3-4 ms, perf sched) about
  // once per thousand iterations. The hold ends when a request of the peer's comes on the QP, else after
  // this (the same bound as the peer's deferred ACK, Transport::kAckDeferNs), with the watch asked then.
  // Measured, 8-byte socket-path ib_write_lat, 20 interleaved runs of 20,000 iterations: average of the
  // averages 10.26 -> 6.65 us, runs with a 99.9th percentile over 1 ms 12 -> 0 (the typical unchanged).
  static constexpr Nanos kAnswerHoldNs = 20'000;
  // Once a packet of the answer came, the hold lasts until its last one, and this long after the latest
  // at most: an answer of more than one window (1 MiB) pauses until the peer has this side's ACK,
  // which took 20-50 us over sockets here (a 2 MiB ib_write_lat, whose holds ran out at 20 us in 9 of 10
  // iterations; then the application spun on memory and the rest waited for the napping progress thread).
  static constexpr Nanos kAnswerUnderwayHoldNs = 200'000;
  // An application thread polling an empty CQ yields its CPU after this long of polls that found
  // nothing (and at least kYieldAfterIdlePolls of them): drive_from_app.
  static constexpr Nanos kYieldAfterIdleNs = 20'000;
  void set_kick(void (*fn)(void*, Nanos), void* arg) {
    kick_fn_ = fn;
    kick_arg_ = arg;
  }

  // Async events (ibv_get_async_event): a pollable eventfd and a queue.
  void raise(AsyncEventType type, void* object);
  // Drops the unread events of an object being destroyed (rdma-core instead makes destroy wait until the
  // application acknowledged them; an application that never reads events would then never get here).
  void forget_events(const void* object);
  int async_fd() const { return async_fd_; }
  std::expected<AsyncEvent, int> get_async_event();  // EAGAIN when none

  static Nanos now_ns();
  Nanos now() const { return cfg_.clock ? cfg_.clock() : now_ns(); }

 private:
  struct QpBlock {
    std::atomic<Qp*> qp[256] = {};
  };
  std::expected<uint32_t, int> alloc_qpn();
  void send_corked();
  void forget_corked();  // ~Context
  // Inside rx_burst, under the QP's lock: the QP's nearest timer for the timer scan and the drivers (no
  // kick: the thread receiving runs the timers; see rx_burst for the one exception).
  void store_deadline(Qp& qp);

  io::Backend* backend_;
  Counters* counters_;
  ContextConfig cfg_;
  MrTable mrs_;

  std::mutex mu_;                                    // object creation and destruction (not the data path)
  std::unique_ptr<std::atomic<QpBlock*>[]> blocks_;  // by QPN >> 8
  std::vector<uint16_t> ports_;                      // opened ports with free QPN slots
  std::vector<Qp*> qps_;                             // every QP, for the timer scan
  std::atomic<uint64_t> driver_gen_{0};
  std::atomic<bool> driving_{false};    // one receiver at a time (io backends allow one rx caller)
  std::atomic<uint64_t> drives_{0};     // drives(): written by the driver only
  std::atomic<bool> rescan_{false};     // hand_over: the driver reads the sockets once more
  std::atomic<bool> watch_asked_{false};  // kKickWatch
  std::atomic<Nanos> watch_asked_at_{0};
  std::atomic<uint32_t> rc_sending_{0};
  std::atomic<uint32_t> next_pd_id_{0};
  std::atomic<Nanos> event_wait_at_{0};  // wait_for_event: its first sleep on the sockets, or its end
  std::atomic<Nanos> app_drive_ns_{0};  // when an application thread was last seen busy-polling
  std::atomic<int> app_cpu_{-1};        // app_cpu
  static constexpr uint32_t kBusyPollRun = 64;
  static constexpr uint32_t kYieldAfterBlockedPolls = 64;
  static constexpr uint32_t kYieldAfterIdlePolls = 16;
  // A hint, not a count: threads may lose each other's updates (relaxed load and store, no RMW).
  std::atomic<uint32_t> app_empty_polls_{0};
  std::atomic<uint32_t> app_poll_seq_{0};
  std::atomic<uint32_t> app_calls_{0};
  // Live objects, against the limits the device reports.
  std::atomic<uint32_t> n_pd_{0}, n_cq_{0}, n_qp_{0}, n_srq_{0}, n_ah_{0};
  std::atomic<Nanos> next_tick_{0};  // when drive() next runs the timers (0: at its next call)
  uint16_t next_virtual_port_ = 0xC000;  // standard mode: QPN blocks not tied to sockets

  void (*kick_fn_)(void*, Nanos) = nullptr;
  void* kick_arg_ = nullptr;

  int async_fd_ = -1;
  std::mutex async_mu_;
  std::deque<AsyncEvent> async_q_;
};

}  // namespace softrdma::core
