// Independent test vectors from IBTA.md (the design fact sheet), kept in one place.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace softrdma::testvec {

// IBTA.md 6, CAP 28 (RC ACK over IPv4): the wire bytes from the IP header through the ICRC ...
inline constexpr std::string_view kCap28Wire =
    "4500003006da40004011a7bbc6120001c6120002c13212b7001c00001100ffff000000120095f9891f0000013c7560fe";
// ... the CRC input (8 x 0xFF + the masked IP header .. AETH) ...
inline constexpr std::string_view kCap28CrcInput =
    "ffffffffffffffff45ff003006da4000ff11ffffc6120001c6120002c13212b7001cffff1100ffffff0000120095f9891f00000"
    "1";
// ... and its CRC-32.
inline constexpr uint32_t kCap28Icrc = 0xFE60753C;

// IBTA.md 6, CAP 537 (RC SEND_ONLY with 16 bytes of payload).
inline constexpr size_t kCap537Frame = 537;
inline constexpr uint32_t kCap537Icrc = 0x00CFA2B0;

// IBTA.md 6: the CRC register after the 8 bytes of 0xFF, as rxe seeds it (before zlib's final inversion).
inline constexpr uint32_t kRxeSeed = 0xDEBB20E3;

inline std::vector<uint8_t> from_hex(std::string_view hex) {
  auto nibble = [](char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; };
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<uint8_t>(nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]));
  }
  return out;
}

}  // namespace softrdma::testvec
