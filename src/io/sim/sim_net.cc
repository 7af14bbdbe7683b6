#include "io/sim/sim_net.h"

#include <utility>

#include <arpa/inet.h>

#include <cerrno>
#include <cstring>

#include "wire/icrc.h"

namespace softrdma::io {

std::unique_ptr<SimBackend> SimNet::attach(const char* ipv4) {
  in_addr a{};
  inet_pton(AF_INET, ipv4, &a);
  return std::make_unique<SimBackend>(this, wire::Gid::from_v4(a.s_addr));
}

double SimNet::uniform() {
  rng_ ^= rng_ << 13;
  rng_ ^= rng_ >> 7;
  rng_ ^= rng_ << 17;
  return static_cast<double>(rng_ >> 11) / static_cast<double>(1ull << 53);
}

void SimNet::send(Frame f) {
  ++sent;
  if (drop_if && drop_if(sent - 1, f.bytes)) {
    ++dropped;
    return;
  }
  if (faults_.drop > 0 && uniform() < faults_.drop) {
    ++dropped;
    return;
  }
  if (faults_.corrupt > 0 && uniform() < faults_.corrupt && !f.bytes.empty()) {
    ++corrupted;
    const size_t at = static_cast<size_t>(uniform() * f.bytes.size()) % f.bytes.size();
    f.bytes[at] ^= static_cast<uint8_t>(1u << (static_cast<unsigned>(uniform() * 8) & 7));
  }
  if (faults_.duplicate > 0 && uniform() < faults_.duplicate) {
    ++duplicated;
    wire_.push_back(f);
  }
  if (faults_.reorder > 0 && uniform() < faults_.reorder && !wire_.empty()) {
    // Swap with the packet before it: they arrive in the other order.
    ++reordered;
    wire_.insert(wire_.end() - 1, std::move(f));
    return;
  }
  wire_.push_back(std::move(f));
}

void SimNet::deliver() {
  while (!wire_.empty()) {
    Frame f = std::move(wire_.front());
    wire_.pop_front();
    auto it = ports_.find(f.dst);
    if (it != ports_.end()) it->second->inbox_.push_back(std::move(f));
  }
}

SimBackend::~SimBackend() {
  for (uint16_t p : ports_) net_->ports_.erase({addr_, p});
}

std::expected<uint16_t, int> SimBackend::open_port(uint16_t port) {
  if (port == 0) {
    while (net_->ports_.count({addr_, net_->next_port_})) ++net_->next_port_;
    port = net_->next_port_++;
  }
  if (!net_->ports_.emplace(wire::Endpoint{addr_, port}, this).second) return std::unexpected(EADDRINUSE);
  ports_.push_back(port);
  return port;
}

void SimBackend::close_port(uint16_t port) {
  net_->ports_.erase({addr_, port});
  std::erase(ports_, port);
}

void SimBackend::tx_burst(std::span<TxPacket> pkts) {
  for (TxPacket& p : pkts) {
    SimNet::Frame f{p.src, p.dst, {}, p.flags};
    f.bytes.assign(p.hdr, p.hdr + p.hdr_len);
    for (uint32_t i = 0; i < p.n_iov; ++i) {
      const auto* b = static_cast<const uint8_t*>(p.iov[i].iov_base);
      f.bytes.insert(f.bytes.end(), b, b + p.iov[i].iov_len);
    }
    f.bytes.insert(f.bytes.end(), p.pad, 0);
    const uint32_t icrc = wire::icrc_for_udp(p.src, p.dst, f.bytes);
    f.bytes.resize(f.bytes.size() + 4);
    wire::store_icrc(f.bytes.data() + f.bytes.size() - 4, icrc);
    net_->send(std::move(f));
  }
}

uint32_t SimBackend::rx_burst(RxPacket* out, uint32_t max) {
  held_.clear();
  while (held_.size() < max && !inbox_.empty()) {
    SimNet::Frame f = std::move(inbox_.front());
    inbox_.pop_front();
    if (f.bytes.size() < 16) {
      ++truncated;
      continue;
    }
    const size_t n = f.bytes.size() - 4;
    if (wire::icrc_for_udp(f.src, f.dst, std::span<const uint8_t>(f.bytes.data(), n)) !=
        wire::load_icrc(f.bytes.data() + n)) {
      ++bad_icrc;
      continue;
    }
    held_.push_back(std::move(f));
  }
  for (size_t i = 0; i < held_.size(); ++i) {
    SimNet::Frame& f = held_[i];
    out[i] =
        RxPacket{f.src, f.dst, f.bytes.data(), static_cast<uint32_t>(f.bytes.size() - 4), 0, 64, f.flags};
  }
  if (after_rx) std::exchange(after_rx, nullptr)();
  return static_cast<uint32_t>(held_.size());
}

}  // namespace softrdma::io
