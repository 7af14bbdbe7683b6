// Addresses as RoCEv2 uses them: a GID is an IPv6 address; IPv4 addresses are IPv4-mapped (::ffff:a.b.c.d).
#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <cstring>
#include <string>

namespace softrdma::wire {

struct Gid {
  std::array<uint8_t, 16> raw{};

  static Gid from_v4(uint32_t addr_be) {
    Gid g;
    g.raw[10] = 0xFF;
    g.raw[11] = 0xFF;
    std::memcpy(&g.raw[12], &addr_be, 4);
    return g;
  }
  bool is_v4() const {
    static constexpr uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
    return std::memcmp(raw.data(), kPrefix, 12) == 0;
  }
  uint32_t v4_be() const {
    uint32_t a;
    std::memcpy(&a, &raw[12], 4);
    return a;
  }
  bool is_zero() const { return raw == std::array<uint8_t, 16>{}; }
  auto operator<=>(const Gid&) const = default;
  std::string to_string() const;  // "198.18.0.1" for IPv4-mapped, else RFC 5952 IPv6 text
  static bool parse(const char* text, Gid* out);  // accepts IPv4 or IPv6 text
};

// A UDP endpoint: address and port (host order).
struct Endpoint {
  Gid addr;
  uint16_t port = 0;
  auto operator<=>(const Endpoint&) const = default;
};

}  // namespace softrdma::wire
