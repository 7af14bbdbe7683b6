#include "io/udp/fault_injector.h"

#include <errno.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "io/clock.h"
#include "wire/headers.h"

namespace softrdma::io {
namespace {

bool parse_rate(std::string_view v, double* out) {
  if (v.empty() || v.size() > 32) return false;
  char buf[40];
  std::memcpy(buf, v.data(), v.size());
  buf[v.size()] = '\0';
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(buf, &end);
  if (errno != 0 || end != buf + v.size() || !std::isfinite(d) || d < 0 || d > 1) return false;
  *out = d;
  return true;
}

bool parse_u64(std::string_view v, uint64_t* out) {
  if (v.empty() || v.size() > 20) return false;
  uint64_t x = 0;
  for (char c : v) {
    if (c < '0' || c > '9') return false;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (x > (UINT64_MAX - d) / 10) return false;
    x = x * 10 + d;
  }
  *out = x;
  return true;
}

// "2ms", "500us", "1s", "100ns": a whole number and a unit.
bool parse_duration(std::string_view v, uint64_t* ns) {
  size_t digits = 0;
  while (digits < v.size() && v[digits] >= '0' && v[digits] <= '9') ++digits;
  uint64_t n = 0;
  if (!parse_u64(v.substr(0, digits), &n)) return false;
  const std::string_view unit = v.substr(digits);
  uint64_t mul = 0;
  if (unit == "ns") mul = 1;
  else if (unit == "us") mul = 1000;
  else if (unit == "ms") mul = 1000 * 1000;
  else if (unit == "s") mul = 1000 * 1000 * 1000;
  else return false;
  if (n > kMaxFaultDelayNs / mul) return false;
  *ns = n * mul;
  return *ns > 0;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

std::string FaultConfig::to_string() const {
  char b[200];
  std::snprintf(b, sizeof b, "drop=%g,dup=%g,reorder=%g,delay=%g:%lluus,corrupt=%g,seed=%llu", drop, dup, reorder,
                delay, static_cast<unsigned long long>(delay_ns / 1000), corrupt,
                static_cast<unsigned long long>(seed));
  return b;
}

std::expected<FaultConfig, std::string> parse_faults(std::string_view text) {
  FaultConfig c;
  uint32_t seen = 0;
  while (!text.empty()) {
    const size_t comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    if (comma != std::string_view::npos && text.empty()) return std::unexpected("a trailing ','");
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) return std::unexpected("'" + std::string(item) + "' is not KEY=VALUE");
    const std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
    const std::string what = "'" + std::string(item) + "'";
    uint32_t bit = 0;
    if (key == "drop") {
      bit = 1;
      if (!parse_rate(value, &c.drop)) return std::unexpected(what + ": the rate must be a number in [0, 1]");
    } else if (key == "dup" || key == "duplicate") {
      bit = 2;
      if (!parse_rate(value, &c.dup)) return std::unexpected(what + ": the rate must be a number in [0, 1]");
    } else if (key == "reorder") {
      bit = 4;
      if (!parse_rate(value, &c.reorder)) return std::unexpected(what + ": the rate must be a number in [0, 1]");
    } else if (key == "corrupt") {
      bit = 8;
      if (!parse_rate(value, &c.corrupt)) return std::unexpected(what + ": the rate must be a number in [0, 1]");
    } else if (key == "delay") {
      bit = 16;
      const size_t colon = value.find(':');
      if (colon == std::string_view::npos || !parse_rate(value.substr(0, colon), &c.delay) ||
          !parse_duration(value.substr(colon + 1), &c.delay_ns))
        return std::unexpected(what + ": expected delay=RATE:TIME, RATE in [0, 1], TIME like 2ms, 500us or 1s "
                                      "(more than 0, at most 10 s)");
    } else if (key == "seed") {
      bit = 32;
      if (!parse_u64(value, &c.seed)) return std::unexpected(what + ": the seed must be a decimal number");
    } else {
      return std::unexpected(what + ": unknown fault (known: drop, dup, reorder, delay, corrupt, seed)");
    }
    if (seen & bit) return std::unexpected(what + ": given twice");
    seen |= bit;
  }
  return c;
}

// ---- RxFaults ----

RxFaults::RxFaults(const FaultConfig& cfg, uint64_t stream, Counters* counters)
    : cfg_(cfg), counters_(counters), rng_(splitmix64(cfg.seed + stream) | 1) {}

RxFaults::~RxFaults() {
  if (timer_fd_ >= 0) close(timer_fd_);
}

std::expected<std::unique_ptr<RxFaults>, int> RxFaults::create(const FaultConfig& cfg, uint64_t stream,
                                                               Counters* counters) {
  std::unique_ptr<RxFaults> f(new (std::nothrow) RxFaults(cfg, stream, counters));
  if (!f) return std::unexpected(ENOMEM);
  f->bufs_.reset(new (std::nothrow) uint8_t[size_t{kHoldSlots} * kSlotBytes]);
  if (!f->bufs_) return std::unexpected(ENOMEM);
  for (uint32_t i = 0; i < kHoldSlots; ++i) {
    f->slots_[i].buf = f->bufs_.get() + size_t{i} * kSlotBytes;
    f->free_[i] = static_cast<uint16_t>(kHoldSlots - 1 - i);
  }
  f->nfree_ = kHoldSlots;
  f->timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (f->timer_fd_ < 0) return std::unexpected(errno);
  return f;
}

uint64_t RxFaults::now_ns() { return monotonic_ns(); }

double RxFaults::uniform() {
  rng_ ^= rng_ << 13;
  rng_ ^= rng_ >> 7;
  rng_ ^= rng_ << 17;
  return static_cast<double>(rng_ >> 11) / static_cast<double>(1ull << 53);
}

int RxFaults::hold(const RxPacket& p) {
  if (nfree_ == 0 || p.len > kSlotBytes) return -1;
  const uint16_t i = free_[--nfree_];
  Slot& s = slots_[i];
  std::memcpy(s.buf, p.data, p.len);
  s.pkt = p;
  s.pkt.data = s.buf;
  s.due_ns = 0;
  s.after_next = false;
  s.after_seq = 0;
  held_[nheld_++] = i;
  return i;
}

bool RxFaults::ready(const Slot& s, uint64_t now) const {
  if (s.after_next) return delivered_seq_ > s.after_seq || now >= s.due_ns;
  return now >= s.due_ns;
}

// Moves the ready held packets, oldest first, into out[0, room) and onto the lent list.
uint32_t RxFaults::emit_ready(RxPacket* out, uint32_t room, uint64_t now) {
  uint32_t n = 0, keep = 0;
  for (uint32_t k = 0; k < nheld_; ++k) {
    const uint16_t i = held_[k];
    if (n < room && ready(slots_[i], now)) {
      out[n++] = slots_[i].pkt;
      lent_[nlent_++] = i;
    } else {
      held_[keep++] = i;
    }
  }
  nheld_ = keep;
  return n;
}

uint32_t RxFaults::begin_burst(RxPacket* out, uint32_t max, uint64_t now) {
  while (nlent_ != 0) free_[nfree_++] = lent_[--nlent_];
  if (nheld_ == 0) return 0;
  const uint32_t n = emit_ready(out, max, now);
  delivered_seq_ += n;
  return n;
}

std::expected<std::unique_ptr<RxFaults>, int> RxFaults::from_env(Counters* counters) {
  const char* text = getenv(kFaultsEnv);
  if (text == nullptr || *text == '\0') return nullptr;
  auto cfg = parse_faults(text);
  if (!cfg) {
    std::fprintf(stderr, "softrdma: %s=\"%s\": %s; the device does not open (EINVAL)\n", kFaultsEnv, text,
                 cfg.error().c_str());
    return std::unexpected(EINVAL);
  }
  if (!cfg->any()) return nullptr;
  static std::atomic<uint64_t> streams{0};
  const uint64_t stream = streams.fetch_add(1, std::memory_order_relaxed);
  auto f = create(*cfg, stream, counters);
  if (f && stream == 0)
    std::fprintf(stderr, "softrdma: fault injection on receive (%s): %s\n", kFaultsEnv, cfg->to_string().c_str());
  return f;
}

uint32_t RxFaults::begin_burst_now(RxPacket* out, uint32_t max, uint64_t* now) {
  *now = now_ns();
  const uint32_t got = begin_burst(out, max, *now);
  if (got != 0) {
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < got; ++i) bytes += out[i].len + wire::kIcrcLen;
    counters_->add(Counter::rx_packets, got);
    counters_->add(Counter::rx_bytes, bytes);
  }
  return got;
}

bool RxFaults::maybe_corrupt(uint8_t* data, uint32_t len) {
  // Any bit the ICRC covers: all but BTH byte 4 (FECN, BECN, resv6), which it masks (IBTA 14.6.5.2).
  constexpr uint32_t kMaskedByte = 4;
  if (len <= kMaskedByte + 1 || !draw(cfg_.corrupt)) return false;
  uint64_t bit = static_cast<uint64_t>(uniform() * (len - 1) * 8) % (uint64_t{len - 1} * 8);
  if ((bit >> 3) >= kMaskedByte) bit += 8;
  data[bit >> 3] ^= static_cast<uint8_t>(1u << (bit & 7));
  counters_->add(Counter::fault_corrupt);
  return true;
}

RxFaults::Verdict RxFaults::on_packet(const RxPacket& p, uint64_t now) {
  if (draw(cfg_.drop)) {
    counters_->add(Counter::drop_injected);
    return Verdict::kDrop;
  }
  if (draw(cfg_.delay)) {
    if (const int i = hold(p); i >= 0) {
      slots_[i].due_ns = now + cfg_.delay_ns;
      counters_->add(Counter::fault_delay);
      return Verdict::kHeld;
    }
  }
  if (draw(cfg_.reorder)) {
    if (const int i = hold(p); i >= 0) {
      slots_[i].after_next = true;
      slots_[i].after_seq = delivered_seq_;
      slots_[i].due_ns = now + kReorderMaxHoldNs;
      counters_->add(Counter::fault_reorder);
      return Verdict::kHeld;
    }
  }
  return Verdict::kDeliver;
}

uint32_t RxFaults::after_deliver(const RxPacket& p, RxPacket* out, uint32_t room, uint64_t now) {
  ++delivered_seq_;
  if (draw(cfg_.dup)) {
    if (const int i = hold(p); i >= 0) {
      slots_[i].due_ns = 0;  // at once
      counters_->add(Counter::fault_duplicate);
    }
  }
  if (nheld_ == 0) return 0;
  const uint32_t n = emit_ready(out, room, now);
  delivered_seq_ += n;
  return n;
}

void RxFaults::end_burst(uint64_t now) {
  uint64_t due = 0;
  for (uint32_t k = 0; k < nheld_; ++k) {
    const Slot& s = slots_[held_[k]];
    const uint64_t d = ready(s, now) ? now : s.due_ns;
    if (due == 0 || d < due) due = d;
  }
  if (due == armed_ns_) return;
  // Setting the timer also clears a past expiry, so poll_fd() stops being readable for it.
  itimerspec its{};
  if (due != 0) {
    its.it_value.tv_sec = static_cast<time_t>(due / 1'000'000'000ull);
    its.it_value.tv_nsec = static_cast<long>(due % 1'000'000'000ull);
  }
  if (timerfd_settime(timer_fd_, due != 0 ? TFD_TIMER_ABSTIME : 0, &its, nullptr) == 0) armed_ns_ = due;
}

}  // namespace softrdma::io
