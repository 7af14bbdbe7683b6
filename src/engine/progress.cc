#include "engine/progress.h"

#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

namespace softrdma::engine {

Progress::Progress(core::Context* ctx, const ProgressConfig& cfg) : ctx_(ctx), cfg_(cfg) {
  tx_.sink = ctx->backend();
  if (const char* s = getenv("SOFTRDMA_SPIN_US")) cfg_.spin_us = static_cast<uint32_t>(atoi(s));
  if (const char* s = getenv("SOFTRDMA_SPIN_MAX_US")) cfg_.spin_max_us = static_cast<uint32_t>(atoi(s));
  cfg_.spin_max_us = std::max(cfg_.spin_max_us, cfg_.spin_us);
}

core::Nanos adapt_spin(core::Nanos spin, core::Nanos idle, bool by_packets, core::Nanos base,
                       core::Nanos max) {
  if (idle >= max) return std::max(base, spin / 2);
  if (by_packets) return std::min(max, std::max(spin * 2, base));
  return spin;
}

Progress::~Progress() {
  stop();
  if (wake_fd_ >= 0) close(wake_fd_);
  if (epfd_ >= 0) close(epfd_);
  if (nap_epfd_ >= 0) close(nap_epfd_);
}

int Progress::start() {
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  nap_epfd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epfd_ < 0 || nap_epfd_ < 0 || wake_fd_ < 0) return errno;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u32 = 1;
  if (epoll_ctl(epfd_, EPOLL_CTL_ADD, wake_fd_, &ev) != 0) return errno;
  if (epoll_ctl(nap_epfd_, EPOLL_CTL_ADD, wake_fd_, &ev) != 0) return errno;
  if (int fd = ctx_->backend()->poll_fd(); fd >= 0) {
    // Edge-triggered: one wake-up per arrival. Level-triggered, a packet that a busy-polling application
    // is about to take (or is taking: drive() says another thread drives) woke this thread again and
    // again until it was gone, which on 2 cores kept it from being gone (measured: ibv_rc_pingpong
    // 0.2-3 ms per iteration instead of 30 us, the progress threads busy half the time). Every wake-up
    // drives until the sockets are empty, so nothing waits for an edge that already passed.
    ev.events = EPOLLIN | EPOLLET;
    ev.data.u32 = 2;
    if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) return errno;
  }
  ctx_->set_kick([](void* self, core::Nanos by) { static_cast<Progress*>(self)->kick(by); }, this);
  thread_ = std::thread([this] { run(); });
  pthread_setname_np(thread_.native_handle(), "softrdma-prog");  // for top, perf and the tests
  return 0;
}

void Progress::stop() {
  if (!thread_.joinable()) return;
  stop_.store(true);
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);
  thread_.join();
  ctx_->set_kick(nullptr, nullptr);
}

void Progress::count_sleep(bool nap) {
  Counters& c = ctx_->counters();
  c.add(Counter::progress_sleeps);
  if (nap) c.add(Counter::progress_naps);
}

void Progress::drain_wake_fd() {
  uint64_t v;
  [[maybe_unused]] ssize_t r = read(wake_fd_, &v, sizeof v);
}

bool Progress::drive_lasts() {
  const uint64_t drive = ctx_->drives();
  const core::Nanos now = ctx_->now();
  if (drive != seen_drive_) {
    seen_drive_ = drive;
    seen_drive_at_ = now;
    return false;
  }
  return now - seen_drive_at_ >= kLongDriveNs;
}

void Progress::kick(core::Nanos by) {
  // Only a sleeping thread needs the syscall, and only one that would sleep past the deadline; a spinning
  // one sees new deadlines on its own. (Every post of ib_send_lat and ib_read_lat arms a timer: each kick
  // was a write, a wake-up and a context switch on a machine whose cores the applications keep busy.)
  // The sleeper publishes wake_at_ after it read the deadlines, so a timer armed after that read is
  // compared with the real end of the sleep; before, wake_at_ is 0 and every kick wakes. (It did not: `by`
  // was compared with that 0. A deferred ACK armed by an application thread in that window, which can last
  // milliseconds (before_sleep warms up rings), went out only when the peer sent its packet again: beside a
  // CPU hog, one same-host `ib_write_bw -R -q 4` in 4 waited out the 0.54 s ACK timeout of rdma_cm's QPs.)
  if (by == 0) {
    const core::Nanos now = ctx_->now();
    watch_until_.store(now + kWatchAfterNotifyNs, std::memory_order_seq_cst);
    // An application thread that waits in ibv_get_cq_event receives for itself (the lease's sleep ends
    // by itself soon enough for one that waits otherwise).
    if (ctx_->event_wait_lease_end() > now) return;
  }
  // kKickWatch wakes it whatever its deadline: a nap must turn into a watch (Context::kKickWatch).
  if (!sleeping_.load(std::memory_order_seq_cst)) return;
  const core::Nanos wake_at = wake_at_.load(std::memory_order_seq_cst);
  if (by <= core::Context::kKickWatch || wake_at == 0 || by < wake_at) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);
  }
}

namespace {
// Asks the scheduler for a short time slice (EEVDF, Linux 6.12+): a woken progress thread then preempts a
// thread that spins on the CPU at once instead of after that thread's slice (about 3 ms), which would be
// the latency of every packet on a machine whose cores are all busy. Older kernels ignore or refuse it.
void request_short_slice() {
  struct SchedAttr {
    uint32_t size, policy;
    uint64_t flags;
    int32_t nice;
    uint32_t priority;
    uint64_t runtime, deadline, period;
    uint32_t util_min, util_max;
  } attr{};
  attr.size = sizeof attr;
  attr.policy = 0;         // SCHED_OTHER
  attr.runtime = 100'000;  // the shortest slice the kernel accepts
  [[maybe_unused]] long r = syscall(SYS_sched_setattr, 0, &attr, 0);
}

// A nap's end need not be exact: with this much timer slack the kernel ends it at the first timer
// interrupt after kNapNs, usually the scheduler's tick (every 4 ms at HZ=250), which interrupts the
// application anyway. Ended by a timer of its own, every nap cost the thread that spun on that CPU about
// 25 us in this VM (arming the timer, its interrupt, two context switches): 9% of the CPU at a nap per
// 200 us. The price: an application that stops making verbs calls has its packets received up to a tick
// later than kNapNs. Other sleeps keep the default slack (50 us): their ends are timers of the transport.
// Same-host contexts (io/shm) nap so too, with the two rules below that keep them napping. They did not
// while one run in ten of perftest's default 1,000 iterations ran at 2-4 us per iteration throughout, a
// startup state later found to be the rings' first lap (ShmIo::touch_rings). Since: 8-byte same-host
// ib_send_lat average 1.75-2.68 against 2.76-3.24 us (5,000 iterations, 99th percentile 15-19 against
// 34-46), ib_atomic_lat 3.0-4.6 against 3.8-7.3, ib_send_bw 8 B 2.1-2.5 against 1.0-1.2 M/s.
constexpr unsigned long kNapSlackNs = 4'000'000;

// Sets the calling thread's timer slack for a nap or back to its default, with a syscall only on a change.
void set_nap_slack(bool nap, bool& now_nap) {
  if (nap == now_nap) return;
  now_nap = nap;
  prctl(PR_SET_TIMERSLACK, nap ? kNapSlackNs : 0UL);  // 0: the thread's default
}
}  // namespace

// Woken by a packet while an application thread busy-polls. Usually the application takes it first (this
// thread then finds nothing). One that is still unread is received here; if the application did not poll
// even while that took, it has stopped polling its CQ for now (ib_write_lat polls for its send
// completion, then spins on memory for the peer's WRITE), so this thread takes over (and spins) until the
// application polls again. Otherwise it goes back to sleep: spinning beside a polling application on 2
// cores cost ibv_rc_pingpong 30 -> 200 us per iteration. Returns whether it took over.
bool Progress::on_packets_while_app_polls() {
  const uint32_t seq = ctx_->app_poll_seq();
  int got;
  // Another thread driving (the application, in a poll) may have read the sockets before this packet came
  // (the wake-up is edge-triggered): it reads them once more before it lets go (hand_over), and the packet
  // is its to take, as usual. This thread waited for it to finish before, spinning and yielding: beside an
  // application that polls without a pause (ib_write_bw's sender, woken by its ACKs) it was runnable most
  // of the time and took a CPU's share from the threads that move the data (64 QPs x 1 MiB over sockets:
  // run 30 ms and waiting for a CPU 86 ms of each 110; after, 5 and 5; median 2,942 -> 3,264 MiB/s in 8
  // interleaved pairs, 2,390 -> 2,675 in 8 more).
  while ((got = ctx_->drive(tx_, ctx_->now(), false)) < 0) {
    if (ctx_->hand_over()) {
      packets_found_ = false;
      handed_over_ = true;
      drive_lasted_ = drive_lasts();
      return false;
    }
  }
  // Packets taken on the CPU where the application polls were not received beside it but instead of it,
  // in its time: that is no reason to watch the sockets. (Over UDP the two then shared one CPU for good,
  // this thread woken for every packet: 8-byte ib_send_lat at 11 us typical instead of 4.5, in about one
  // run of ten.)
  packets_found_ = got > 0 && sched_getcpu() != ctx_->app_cpu();
  if (got == 0 || ctx_->app_poll_seq() != seq) return false;
  ctx_->clear_app_driving();
  return true;
}

// One sleep: until the wake fd, the sockets or sleep_ns (kNoTimer: no bound). A nap does not watch the
// sockets (nap_epfd_ holds the wake fd alone) unless the backend's nap() asks it to; a deaf sleep watches
// none. Sockets that woke it (*sockets) are read at the next receive, even by a backend that reads them
// seldom. Returns the number of events.
int Progress::sleep_in_epoll(core::Nanos sleep_ns, bool nap, bool* sockets, bool deaf) {
  const bool watch_sockets = !deaf && (!nap || ctx_->backend()->nap());
  epoll_event evs[4];
  const timespec ts{static_cast<time_t>(sleep_ns / 1'000'000'000),
                    static_cast<long>(sleep_ns % 1'000'000'000)};
  const int n = epoll_pwait2(watch_sockets ? epfd_ : nap_epfd_, evs, 4,
                             sleep_ns == core::Context::kNoTimer ? nullptr : &ts, nullptr);
  ctx_->backend()->woke();  // (after a nap, which armed nothing, a no-op)
  sleeping_.store(false, std::memory_order_release);
  for (int i = 0; i < n; ++i) {
    if (evs[i].data.u32 == 1) drain_wake_fd();
    if (evs[i].data.u32 == 2) {
      *sockets = true;
      ctx_->backend()->sockets_readable();
    }
  }
  return n;
}

void Progress::run() {
  request_short_slice();
  core::Nanos last_activity = ctx_->now();
  uint32_t app_calls_seen = ctx_->app_calls();  // the application's verbs calls, and when they last moved
  core::Nanos app_call_at = last_activity;
  constexpr core::Nanos kAppQuietNs = 1'000'000;
  core::Nanos tick_at = 0;
  constexpr core::Nanos kTickEvery = 100'000;
  // An application thread that polls its CQ runs the receive path and the timers itself (Cq::poll); then
  // this thread does not spin: on 2 cores each wake-up of it displaced a spinning thread, and the
  // scheduler's rebalancing turned that into stalls of whole ticks (measured: 8-byte WRITE half round
  // trip 7 us without it, 35 us median and 2 ms at the 90th percentile with a 1 ms wake-up). It sleeps
  // until a packet arrives, and at once when an application arms a CQ for events (req_notify kicks).
  constexpr core::Nanos kAppDriveWindow = 1'000'000;
  // A sleep that watches the sockets beside a polling application (its first, or after this thread found
  // packets the application left): short, since every packet wakes it in the kernel (below).
  constexpr core::Nanos kWatchBesideAppNs = 1'000'000;
  constexpr uint32_t kAppPollsWhileSpinning = 16;
  uint32_t spin_seq = ctx_->app_poll_seq();  // the application's poll count when this thread took over
  constexpr core::Nanos kNapNs = 200'000;
  constexpr core::Nanos kBlockedSleepNs = 20'000;  // the least sleep while another thread drives
  bool napping = false;  // the last sleep beside a polling application
  bool nap_slack = false;  // the timer slack is kNapSlackNs (set_nap_slack)
  uint32_t nap_seq = 0;  // the application's poll count when it began
  // The sockets' wake-up is edge-triggered: one that this thread took and did not act on yet (it woke from
  // its own sleep, and an application began polling meanwhile) is acted on before the next sleep. Slept
  // through, it left a packet unread until the sleep's end: ib_write_lat, whose application spins on
  // memory after it polled, stalled 20 ms about once in 2,000 iterations.
  bool woken_by_packets = false;
  uint32_t sleep_calls = ctx_->app_poll_seq();  // the application's empty polls when the last sleep began
  const core::Nanos spin_base = core::Nanos{cfg_.spin_us} * 1000,
                    spin_max = core::Nanos{cfg_.spin_max_us} * 1000;
  core::Nanos spin_ns = spin_base;  // adapt_spin
  while (!stop_.load(std::memory_order_relaxed)) {
    core::Nanos now = ctx_->now();
    if (ctx_->app_driving(now, kAppDriveWindow)) {
      if (woken_by_packets) {
        woken_by_packets = false;
        if (on_packets_while_app_polls()) last_activity = ctx_->now();
        spin_seq = ctx_->app_poll_seq();
        continue;
      }
      wake_at_.store(0, std::memory_order_seq_cst);
      sleeping_.store(true, std::memory_order_seq_cst);
      // While the application keeps polling, this thread naps: it sleeps without watching the sockets
      // (nap_epfd_), and watches them again once a nap passed with no poll. Over UDP it naps only while
      // its wake-ups by packets find them taken already: each such wake-up displaced a spinning thread on
      // 2 cores (8-byte ib_write_lat over UDP: typical half round trip 13-15 us in half the runs, 5-6
      // with naps), while one that finds packets does work beside the application (ib_write_bw's sender
      // receives ACKs and sends what they release: 1.45 M messages/s when it napped, 1.65-1.85 without).
      // A backend whose packets need no syscall (io/shm, while its rings carry packets) rings this thread's
      // epoll only when asked to (a doorbell: a syscall for the sender too), and a nap does not ask: it
      // naps whatever its wake-ups found. (Same-host ib_send_lat: one doorbell per 4 iterations.)
      ctx_->backend()->before_sleep();
      const uint32_t seq = ctx_->app_poll_seq();
      // (A watch request is taken only when it turns a nap into a watch: an answer is on its way.)
      // The application polled since the last sleep, or it is still in the poll whose drive this thread's
      // wake-up found lasting (below, in the loop).
      const bool polls = seq != nap_seq || (handed_over_ && drive_lasted_);
      const bool nap = napping && polls && (ctx_->backend()->wakes_by_doorbell() || !packets_found_) &&
                       !ctx_->take_watch_request();
      nap_seq = seq;
      napping = true;
      const bool pending = !nap && ctx_->backend()->arm_wakeup();
      // A packet still unread right after this thread left it to the driving application (in a ring of the
      // same-host path, where arm_wakeup looks) is likely the one that application is taking: look again
      // after kBlockedSleepNs, not at once. At once, this thread went round through epoll_pwait2 until the
      // application's drive ended, runnable all the while: on 2 cores, same-host 8-byte ib_write_lat then
      // had iterations of 0.5 ms (in 5 runs of 17; 4,500-25,000 sleeps a run instead of about 25).
      const core::Nanos sleep_ns = pending ? (handed_over_ ? kBlockedSleepNs : 0)
                                   : nap   ? kNapNs
                                           : kWatchBesideAppNs;
      handed_over_ = false;
      wake_at_.store(pending ? 0 : now + sleep_ns, std::memory_order_seq_cst);
      set_nap_slack(nap, nap_slack);
      count_sleep(nap);
      bool packets = false;
      const int n = sleep_in_epoll(sleep_ns, nap, &packets);
      // A watch that ended with no packet left for this thread: the application took every one, so the
      // next sleep naps. Each packet that came still woke this thread inside epoll_pwait2, which found the
      // socket read and slept on without returning, on 2 cores preempting a spinning thread: watched for
      // 20 ms, 8-byte ib_write_lat ran at 10-15 us per half round trip for hundreds of iterations at a
      // time (perf sched: the progress thread woken by each of the peer's sends, 4-5 us each).
      if (!nap && !pending && n == 0) packets_found_ = false;
      packets = packets || pending;
      // A kick for a timer needs nothing (the polling application runs timers); req_notify clears the
      // application's mark before it kicks, so the loop then takes over.
      if (packets && on_packets_while_app_polls()) last_activity = ctx_->now();
      spin_seq = ctx_->app_poll_seq();
      // A nap that the application polled through leaves it marked as polling (its own mark needs a run
      // of 64 empty polls, which a same-host ping-pong's 1 us round trips never make): past the mark's
      // 1 ms, the loop below slept watching for doorbells, and the peer rang one for each packet.
      if (nap && spin_seq != seq && !events_awaited())
        ctx_->set_app_driving(ctx_->now());
      continue;
    }
    napping = false;
    handed_over_ = false;  // it describes the wake-up just before a sleep beside the application
    const bool run_timers = now >= tick_at;
    const int got = ctx_->drive(tx_, now, run_timers);
    if (got >= 0) woken_by_packets = false;
    if (got > 0) last_activity = now;
    if (const uint32_t calls = ctx_->app_calls(); calls != app_calls_seen) {
      app_calls_seen = calls;
      app_call_at = now;
    }
    if (got >= 0 && run_timers) tick_at = now + kTickEvery;
    // An application that polls its CQ again while this thread spins is busy-polling: leave receiving to
    // it. (Its own mark needs a run of empty polls, which this thread's receiving keeps it from having: the
    // two then drove side by side for good, ibv_rc_pingpong 20 -> 150 us per iteration.)
    const uint32_t seq = ctx_->app_poll_seq();
    if (seq - spin_seq >= kAppPollsWhileSpinning) {
      ctx_->set_app_driving(now);
      spin_seq = seq;
      // It polls: the next sleep beside it may nap at once. (Its first sleep watched the sockets for 20 ms
      // before: a packet that the application took before this thread looked woke it inside epoll_pwait2,
      // which found nothing and slept on without returning, so nothing here learned that the packets were
      // taken. 8-byte ib_send_lat's progress threads were woken so 52,000 times a second, each time
      // preempting an application thread.) Not while an application waits for events (watch_until_):
      // rping polls after each event, then waits again, and 2,000 pings took 1.0-1.7 s instead of 0.6-0.75.
      if (!events_awaited()) {
        napping = true;
        nap_seq = seq - 1;
      }
      continue;
    }
    // Spin briefly after activity, unless an application thread made verbs calls lately: it is running,
    // likely beside this thread on a busy CPU, and spinning there cost this thread its place in the
    // scheduler (EEVDF: a thread that ran more than its share is not let preempt when it wakes, and waits
    // for the next tick, 4 ms). Measured, 8-byte ib_write_lat over UC, whose application spins on memory
    // between a post and a poll: 38 us typical and 460 us average with the spin, 8 and 18 without; while
    // a receiver whose application sleeps (ib_write_bw's server) keeps it: 1 MiB 5.0 -> 6.3 GB/s.
    if (now - last_activity < spin_ns && now - app_call_at > kAppQuietNs) continue;

    // Sleep until a packet, a kick or the next timer. The timers run once more first (only a driver runs
    // them; when another thread drives, that one does, and the deadline read below is what it leaves).
    // Asleep from here: a timer armed from now on kicks.
    wake_at_.store(0, std::memory_order_seq_cst);
    sleeping_.store(true, std::memory_order_seq_cst);
    int got_last;
    while ((got_last = ctx_->drive(tx_, ctx_->now(), true)) < 0 && !ctx_->hand_over()) {
    }
    if (got_last > 0) {
      sleeping_.store(false, std::memory_order_release);
      last_activity = ctx_->now();
      continue;
    }
    // An application thread in a drive that lasts polls without a pause, its polls finding ACKs that
    // release more to send (ib_write_bw's sender): it is busy-polling, though its mark needs a run of
    // empty polls, which it seldom has. Beside it this thread sleeps as beside any polling application
    // (above), rather than waking every kBlockedSleepNs or for every ACK to find it still driving.
    // Measured, 64 QPs x 1 MiB socket-path ib_write_bw: about one run in three at 1.3-1.5 GB/s instead of
    // 2.7-3.1, this thread woken 7,000-10,000 times a run on the CPU where the peer's receiver ran.
    if (got_last < 0 && !events_awaited() && drive_lasts()) {
      sleeping_.store(false, std::memory_order_release);
      ctx_->set_app_driving(ctx_->now());
      continue;
    }
    const core::Nanos next_deadline = ctx_->next_timer();
    // To the nanosecond (epoll_pwait2): a deferred ACK is due microseconds after it was deferred.
    core::Nanos sleep_ns = core::Context::kNoTimer;
    if (next_deadline != core::Context::kNoTimer) {
      now = ctx_->now();
      sleep_ns = next_deadline <= now ? 0 : next_deadline - now;
    }
    // An application that polled an empty CQ since this thread last slept receives in its polls: this
    // thread naps (without watching the sockets, for kNapNs at least) rather than wake for each packet,
    // as above, unless the application armed a CQ for events lately (watch_until_: rping, whose threads
    // wait for events and poll after each, took 50% longer with naps). A nap that ends with no such poll
    // in it is followed by a sleep that watches. Measured, 8-byte ib_write_lat over UDP (deferred ACKs,
    // Transport::end_burst): a wake-up per packet kept the typical half round trip at 16 us in half the
    // runs; with naps it is 5 us. Other verbs calls do not count: over UC, ib_write_lat's application
    // posts, finds its completion at once, and spins on memory for the peer's WRITE, which waited for
    // each nap to end (133 us per iteration with naps of 200 us, and a tick with naps to the tick).
    // A doorbell backend (io/shm) naps here too, as above: it then asks its senders for no doorbell, and
    // still watches its sockets while its rings carry packets (ShmIo::nap). Excluded before, this sleep armed
    // the doorbells beside an application polling the rings, whose same-host ping-pong never marks it
    // busy-polling (that needs 64 empty polls in a row): every packet of the peer's rang one, and the woken
    // thread preempted the application on its CPU (8-byte same-host ib_write_lat through the rings, a sched
    // trace: a doorbell every ~118 us, the woken thread on the CPU 60 us later, 20 us there, for 13 ms). 6
    // interleaved pairs of 5,000 iterations: doorbells 7-217 -> 5-13 a run, average 1.13-4.11 -> 1.18-1.53 us
    // (lower in 5 of 6).
    ctx_->backend()->before_sleep();
    // An application thread waits for events and receives itself (Context::wait_for_event), or did so
    // lately: sleep without watching the sockets (every packet woke both, and the two then took turns at
    // the receive path), until the next timer or the end of that lease, which need not be exact (nap
    // slack). 8-byte ib_send_lat -e over UDP, typical: 55-87 -> 21.5 us.
    if (const core::Nanos lease_end = ctx_->event_wait_lease_end();
        got_last >= 0 && lease_end > ctx_->now()) {
      const core::Nanos to_lease_end = lease_end - ctx_->now();
      set_nap_slack(to_lease_end <= sleep_ns, nap_slack);
      sleep_ns = std::min(sleep_ns, to_lease_end);
      count_sleep(true);
      wake_at_.store(ctx_->now() + sleep_ns, std::memory_order_seq_cst);
      bool packets = false;
      sleep_in_epoll(sleep_ns, true, &packets, true);
      last_activity = ctx_->now();
      tick_at = 0;
      continue;
    }
    const uint32_t calls_now = ctx_->app_poll_seq();
    const bool nap = !events_awaited() && calls_now != sleep_calls && !ctx_->take_watch_request();
    sleep_calls = calls_now;
    if (nap) {
      sleep_ns = std::min(sleep_ns, kNapNs);
    } else if (ctx_->backend()->arm_wakeup()) {
      sleep_ns = 0;  // something came before the doorbell was asked for
    }
    // Another thread is driving (the application, in a poll): it runs the timers that are due and reads
    // the sockets once more when it is done (hand_over). Sleeping 0 for a due timer here was a spin, and
    // on the application's CPU one that kept it off until the scheduler's next tick: both progress threads
    // of a same-host ib_send_lat ran 3 ms at a time while their applications waited.
    if (got_last < 0) sleep_ns = std::max(sleep_ns, kBlockedSleepNs);
    set_nap_slack(nap && sleep_ns == kNapNs, nap_slack);  // a nap that no transport timer ends first
    count_sleep(nap);
    wake_at_.store(sleep_ns == core::Context::kNoTimer ? core::Context::kNoTimer : ctx_->now() + sleep_ns,
                   std::memory_order_seq_cst);
    bool packets = false;
    sleep_in_epoll(sleep_ns, nap, &packets);
    if (packets) woken_by_packets = true;
    const core::Nanos idle_from = last_activity;
    last_activity = ctx_->now();
    // Packets that ended a short sleep (a sender that pauses between batches): spin longer before the
    // next, so that its packets find this thread awake rather than pay a wake-up each (in the sender's
    // send call, an IPI in a VM, and on this CPU). Not beside an application that waits for events, whose
    // woken threads need the CPU (rping: ProgressConfig).
    spin_ns = adapt_spin(spin_ns, last_activity - idle_from, packets && !nap && !events_awaited(), spin_base,
                         spin_max);
    tick_at = 0;  // after waking, run timers at once: a kick may have armed an earlier one
  }
}

}  // namespace softrdma::engine
