// An in-memory network for transport tests: no sockets, no threads, a clock the test advances. Packets get
// the same ICRC as on UDP, and the network can drop, duplicate, reorder, delay and corrupt them, each with
// a rate and a seed, so a failing run can be replayed exactly.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "io/backend.h"

namespace softrdma::io {

struct Faults {
  double drop = 0, duplicate = 0, reorder = 0, corrupt = 0;
  uint64_t seed = 1;
};

class SimBackend;

class SimNet {
 public:
  explicit SimNet(Faults f = {}) : faults_(f), rng_(f.seed | 1) {}
  // A backend (one context's "sockets") at this IPv4 address.
  std::unique_ptr<SimBackend> attach(const char* ipv4);
  void set_faults(const Faults& f) { faults_ = f; }
  // Moves every packet in flight to its destination's inbox (reordered ones go after the rest).
  void deliver();
  size_t in_flight() const { return wire_.size(); }
  uint64_t sent = 0, dropped = 0, duplicated = 0, reordered = 0, corrupted = 0;
  // A test hook, called for every frame sent with its index (0-based, in send order) and its bytes (BTH ..
  // ICRC): returning true drops that frame (counted in `dropped`), so a test can lose one particular packet.
  std::function<bool(uint64_t index, std::span<const uint8_t> frame)> drop_if;

 private:
  friend class SimBackend;
  struct Frame {
    wire::Endpoint src, dst;
    std::vector<uint8_t> bytes;  // BTH .. ICRC
    uint8_t flags = 0;           // TxPacket::flags, carried as a same-host ring carries them
  };
  void send(Frame f);
  double uniform();

  Faults faults_;
  uint64_t rng_;
  std::deque<Frame> wire_;
  std::map<wire::Endpoint, SimBackend*> ports_;
  uint16_t next_port_ = 0x4000;
};

class SimBackend : public Backend {
 public:
  SimBackend(SimNet* net, const wire::Gid& addr) : net_(net), addr_(addr) {}
  ~SimBackend() override;
  std::expected<uint16_t, int> open_port(uint16_t port) override;
  void close_port(uint16_t port) override;
  void tx_burst(std::span<TxPacket> pkts) override;
  uint32_t rx_burst(RxPacket* out, uint32_t max) override;
  int poll_fd() const override { return -1; }
  const wire::Gid& local_addr() const override { return addr_; }
  void want_ip_fields() override { ip_fields_wanted = true; }
  // A test hook: what peer_behind answers (false when unset).
  std::function<bool(const wire::Endpoint& dst, uint64_t* mark)> behind;
  bool peer_behind(const wire::Endpoint& dst, uint64_t* mark) override { return behind && behind(dst, mark); }
  // A test hook: what direct answers (-1, the ordinary way, when unset).
  std::function<int(const wire::Endpoint& dst, const DirectOp& op)> direct_hook;
  int direct(const wire::Endpoint& dst, const DirectOp& op) override {
    return direct_hook ? direct_hook(dst, op) : -1;
  }
  // A test hook: what inflight_cap answers for every destination.
  uint64_t cap = 0;
  uint64_t inflight_cap(const wire::Endpoint& /*dst*/) override { return cap; }
  bool ip_fields_wanted = false;  // (its packets carry the sender's TOS and TTL either way)
  // Counts of what rx_burst dropped.
  uint64_t bad_icrc = 0, truncated = 0;
  // A test hook, run once at the end of the next rx_burst (after it read the inbox), then cleared: what
  // happens while the caller is still inside its receive.
  std::function<void()> after_rx;

 private:
  friend class SimNet;
  SimNet* net_;
  wire::Gid addr_;
  std::vector<uint16_t> ports_;
  std::deque<SimNet::Frame> inbox_;
  std::vector<SimNet::Frame> held_;  // the frames the last rx_burst returned
};

}  // namespace softrdma::io
