// The progress engine of one context: a thread that owns receiving and timers. It drains the backend in
// bursts, runs the transport, and flushes answers in batches; after activity it spins briefly (a reply is
// often microseconds away), then sleeps in epoll until a packet, a kick or the next timer.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

#include "core/context.h"
#include "io/packet.h"

namespace softrdma::engine {

struct ProgressConfig {
  // Busy-poll this long after the last activity before sleeping. 200 gave 8-byte ib_write_bw 1.65-1.73 M
  // messages/s instead of 1.2-1.35 (its receiver slept between the sender's batches), but made rping,
  // whose threads sleep on completion channels, 3-4 times slower (2000 pings: 1.8-2.7 s instead of 0.63):
  // on 2 cores, two spinning progress threads keep the woken application threads off the CPU. So this is
  // the least, and the spin grows only while a stream's packets end short sleeps (below), and not beside
  // an application that waits for events.
  uint32_t spin_us = 20;
  // The spin grows, doubling, up to this while packets keep ending the sleeps after it within this long
  // of the last activity (a stream whose sender pauses between its batches), and halves, down to spin_us,
  // after each idle spell this long or longer (adapt_spin). Equal to spin_us: no growth.
  uint32_t spin_max_us = 100;
};

// The spin after a sleep that ended `idle` after the last activity (the spin included), woken by packets
// or not (a timer, a kick): doubled up to max when packets ended a spell shorter than max, halved down to
// base after a spell of max or longer, else as it was.
core::Nanos adapt_spin(core::Nanos spin, core::Nanos idle, bool by_packets, core::Nanos base,
                       core::Nanos max);

class Progress {
 public:
  Progress(core::Context* ctx, const ProgressConfig& cfg = {});
  ~Progress();  // stops and joins the thread
  int start();  // 0 or errno
  void stop();
  void kick(core::Nanos by);  // wakes the thread if it sleeps past `by` (0: in any case)

 private:
  void run();
  void drain_wake_fd();
  int sleep_in_epoll(core::Nanos sleep_ns, bool nap, bool* sockets, bool deaf = false);
  void count_sleep(bool nap);  // counters progress_sleeps and progress_naps
  bool on_packets_while_app_polls();

  core::Context* ctx_;
  ProgressConfig cfg_;
  int epfd_ = -1;       // the backend's fd and wake_fd_
  int wake_fd_ = -1;
  int nap_epfd_ = -1;   // wake_fd_ alone: a sleep that packets do not end
  // An application armed a CQ for events (kick(0), from req_notify): until then the sleeps watch the
  // sockets even if the application makes verbs calls (it polls after each event, not all the time).
  std::atomic<core::Nanos> watch_until_{0};
  bool events_awaited() const { return ctx_->now() < watch_until_.load(std::memory_order_seq_cst); }
  // As long as a CQ counts as waiting for events after its last arming (Cq::events_awaited).
  static constexpr core::Nanos kWatchAfterNotifyNs = core::Cq::kEventsRecentNs;
  // The last wake-up by packets beside a polling application found some unread (on_packets_while_app_polls).
  bool packets_found_ = true;
  // The last wake-up by packets found the application driving and left them to it (hand_over).
  bool handed_over_ = false;
  // After another thread's drive kept this one out (drive() < 0): whether it is the drive this thread was
  // kept out of kLongDriveNs ago or earlier (Context::drives), one that lasts: an application that polls
  // without a pause, as busy-polling as one whose polls come up empty. Remembers a drive it had not seen.
  bool drive_lasts();
  static constexpr core::Nanos kLongDriveNs = 20'000;
  uint64_t seen_drive_ = 0;
  core::Nanos seen_drive_at_ = 0;
  bool drive_lasted_ = false;  // drive_lasts() at the last hand_over
  std::atomic<bool> stop_{false};
  std::atomic<bool> sleeping_{false};
  // When the current sleep ends by itself (kNoTimer: never; 0: not known yet, so every kick wakes).
  std::atomic<core::Nanos> wake_at_{0};
  std::thread thread_;
  io::TxBatch tx_;
};

}  // namespace softrdma::engine
