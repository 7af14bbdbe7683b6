// Fault injection for the UDP backend (ARCHITECTURE.md "Reliability"), configured by the environment
// variable SOFTRDMA_FAULTS so that unmodified applications can run under faults:
//
//   SOFTRDMA_FAULTS="drop=0.01,dup=0.005,reorder=0.01,delay=0.01:2ms,corrupt=0.001,seed=42"
//
// Faults apply on RECEIVE, to every datagram a context's sockets receive (set the variable in both
// processes to fault both directions). Each kind draws independently, in this order:
//   corrupt  flips one random bit of the datagram before the ICRC check, which then drops it (counted as
//            fault_corrupt and drop_bad_icrc): the real check is exercised, not simulated
//   drop     discards the packet (drop_injected)
//   delay    holds the packet for the given time (ns, us, ms or s; at most 10 s) (fault_delay)
//   reorder  holds the packet until the next one has been delivered, so the two swap; if none comes within
//            kReorderMaxHoldNs it is released anyway (fault_reorder)
//   dup      delivers the packet and then a copy of it (fault_duplicate)
// The same-host path (io/shm) applies them too, to the packets its rings carry, with an injector of its own.
// Rates are probabilities in [0, 1]; seed (default 1) makes a run repeatable: the n-th injector a process
// creates (one per UdpIo, one more per ShmIo) draws from seed + n. Held packets are copies in a hold queue allocated once (kHoldSlots packets);
// when it is full a packet is delivered unharmed instead of held. Held packets are released by rx_burst
// itself (no thread): a timerfd in the backend's epoll set makes poll_fd() readable when one is due.
//
// A malformed value makes UdpIo::create fail with EINVAL after a message on stderr (a run that meant to
// test under faults must not silently run without them).
#pragma once

#include <cstdint>
#include <expected>
#include <memory>
#include <string>
#include <string_view>

#include "core/counters.h"
#include "io/packet.h"

namespace softrdma::io {

struct FaultConfig {
  double drop = 0, dup = 0, reorder = 0, delay = 0, corrupt = 0;
  uint64_t delay_ns = 0;
  uint64_t seed = 1;
  bool any() const { return drop > 0 || dup > 0 || reorder > 0 || delay > 0 || corrupt > 0; }
  std::string to_string() const;
};

inline constexpr const char* kFaultsEnv = "SOFTRDMA_FAULTS";
inline constexpr uint64_t kMaxFaultDelayNs = 10'000'000'000ull;

// Parses the SOFTRDMA_FAULTS syntax ("" is no faults). The error says what is wrong.
std::expected<FaultConfig, std::string> parse_faults(std::string_view text);

// The receive-side injector of one UdpIo. Single-threaded, like rx_burst.
class RxFaults {
 public:
  static constexpr uint32_t kHoldSlots = 256;
  static constexpr uint32_t kSlotBytes = 9216;  // UdpIo::kRxBufSize
  static constexpr uint64_t kReorderMaxHoldNs = 1'000'000;

  // Allocates the hold queue and the timerfd; an errno on failure.
  static std::expected<std::unique_ptr<RxFaults>, int> create(const FaultConfig& cfg, uint64_t stream,
                                                              Counters* counters);
  // From SOFTRDMA_FAULTS: null when it is unset or asks for no faults; EINVAL (after a message on stderr)
  // when it is malformed. Every injector of the process draws from its own stream (seed + n).
  static std::expected<std::unique_ptr<RxFaults>, int> from_env(Counters* counters);
  ~RxFaults();
  RxFaults(const RxFaults&) = delete;
  RxFaults& operator=(const RxFaults&) = delete;

  // Readable when a held packet is due: add it to the backend's epoll set (data.ptr = nullptr).
  int timer_fd() const { return timer_fd_; }
  static uint64_t now_ns();

  // Start of rx_burst: frees what the previous call handed out, then emits the held packets that are due
  // into out[0, max) (oldest first). Returns how many.
  uint32_t begin_burst(RxPacket* out, uint32_t max, uint64_t now);
  // begin_burst at the current time (returned in *now), counting what it emits as received.
  uint32_t begin_burst_now(RxPacket* out, uint32_t max, uint64_t* now);
  // Before the ICRC check of a datagram of `len` bytes (ICRC included): may flip a bit; says whether it did.
  bool maybe_corrupt(uint8_t* data, uint32_t len);
  // After the ICRC check. kDeliver: the caller delivers `p`, then calls after_deliver. kDrop/kHeld: it
  // does not deliver `p` (kHeld: a copy is in the hold queue).
  enum class Verdict { kDeliver, kDrop, kHeld };
  Verdict on_packet(const RxPacket& p, uint64_t now);
  // After a packet was delivered: queues its duplicate (if drawn) and emits, into out[0, room), the
  // packets that were waiting for it (reorder) and the duplicate. Returns how many it emitted.
  uint32_t after_deliver(const RxPacket& p, RxPacket* out, uint32_t room, uint64_t now);
  // End of rx_burst: arms the timer for the earliest held packet (or disarms it).
  void end_burst(uint64_t now);

  uint32_t held() const { return nheld_; }

 private:
  struct Slot {
    RxPacket pkt;
    uint64_t due_ns = 0;
    uint64_t after_seq = 0;  // reorder: released once a packet with a higher delivery number went out
    bool after_next = false;
    uint8_t* buf = nullptr;
  };
  RxFaults(const FaultConfig& cfg, uint64_t stream, Counters* counters);
  double uniform();
  bool draw(double rate) { return rate > 0 && uniform() < rate; }
  int hold(const RxPacket& p);  // slot index, -1 if full
  bool ready(const Slot& s, uint64_t now) const;
  uint32_t emit_ready(RxPacket* out, uint32_t room, uint64_t now);

  const FaultConfig cfg_;
  Counters* const counters_;
  uint64_t rng_;
  int timer_fd_ = -1;
  uint64_t armed_ns_ = 0;  // 0: disarmed
  std::unique_ptr<uint8_t[]> bufs_;
  Slot slots_[kHoldSlots];
  uint16_t free_[kHoldSlots];
  uint32_t nfree_ = 0;
  uint16_t held_[kHoldSlots];  // slot indices in the order they were held
  uint32_t nheld_ = 0;
  uint16_t lent_[kHoldSlots];  // emitted by this burst; freed at the next one
  uint32_t nlent_ = 0;
  uint64_t delivered_seq_ = 0;
};

}  // namespace softrdma::io
