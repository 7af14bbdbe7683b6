// The RoCEv2 invariant CRC (IBTA.md section 6): CRC-32 (IEEE, as zlib's crc32) over 8 bytes of 0xFF, the
// IP and UDP headers with their variant fields masked to ones, and the IBTA packet from BTH (byte 4 masked)
// through the pad. Stored on the wire least-significant byte first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "wire/addr.h"

namespace softrdma::wire {

// Plain CRC-32 (IEEE 802.3, reflected, init/xorout 0xFFFFFFFF) continued from `crc` as zlib's crc32() does.
uint32_t crc32(uint32_t crc, const void* data, size_t len);

// ICRC of a packet whose IP header starts `ip_packet` (IPv4 or IPv6 by its version nibble); the span covers
// IP header .. pad and excludes the 4 ICRC bytes. Used on captured or fully built frames.
uint32_t icrc_of_ip_packet(std::span<const uint8_t> ip_packet);

// ICRC of a packet sent or received over a UDP socket, where the kernel builds the IP and UDP headers: the
// headers are reconstructed as Linux sends them from an unconnected socket with DF set (IPv4 ID 0, DF,
// protocol 17; IPv6 next header 17). `segments` are the bytes from the BTH through the pad, in order (the
// first one starts with the BTH). The UDP length is derived from their total size plus the ICRC.
// `ip_id`: the IPv4 identification the packet carries: 0 from such a socket, and k for the k-th segment of
// a UDP GSO send (the kernel numbers the segments of one send from the first one's 0).
uint32_t icrc_for_udp(const Endpoint& src, const Endpoint& dst, std::span<const std::span<const uint8_t>> segments,
                      uint16_t ip_id = 0);

// Convenience for a contiguous BTH..pad buffer.
inline uint32_t icrc_for_udp(const Endpoint& src, const Endpoint& dst, std::span<const uint8_t> bth_to_pad,
                             uint16_t ip_id = 0) {
  std::span<const uint8_t> one[1] = {bth_to_pad};
  return icrc_for_udp(src, dst, std::span<const std::span<const uint8_t>>(one, 1), ip_id);
}

// The same ICRC as icrc_for_udp for a contiguous BTH..pad buffer that the caller owns and may have written
// for a moment: the BTH's masked byte is set to ones in place for one CRC pass and put back, and the CRC
// of the IP and UDP pseudo header is taken from a per-thread cache of the last few (source, destination,
// length) seen (the IPv4 ID's part by linearity), so a packet costs one pass where icrc_for_udp makes
// two or three (the pseudo header built and CRC'd with the BTH gathered behind it, then the rest): a 1 KiB
// packet's 56 ns became 40 (build/bin/icrc-bench, hot caches). Packets of up to 128 bytes are gathered
// behind a pseudo header on the stack instead, as icrc_for_udp does (one call as well).
uint32_t icrc_in_place(const Endpoint& src, const Endpoint& dst, std::span<uint8_t> bth_to_pad,
                       uint16_t ip_id = 0);

// Checks a received packet's ICRC when the IPv4 ID it was sent with is not known (a UDP socket does not
// show it): 0 for a plain send from softrdma, k for the k-th segment of a GSO send that reached us split
// (the kernel numbers them from 0), anything from a sender that numbers its packets (Linux's rxe does,
// and a connected socket). The ID is solved for from the CRC's linearity (a few XORs once the length's
// table is made, not a pass per candidate) and accepted if it is 0..max_id. Returns the ID, or -1 when
// none in that range matches (the packet is corrupt). IPv6 has no ID: the plain check. With max_id
// 0xFFFF a corrupt packet passes with odds of 2^-16 instead of 2^-32: whatever the corruption, some ID
// makes it match with those odds.
int icrc_check_any_id(const Endpoint& src, const Endpoint& dst, std::span<const uint8_t> bth_to_pad,
                      uint32_t wire_icrc, uint16_t max_id);
// The same check of a buffer the caller owns, by icrc_in_place; `hint` (a coalesced run's position) is
// tried first, in the one pass that checks ID 0 otherwise.
int icrc_check_any_id(const Endpoint& src, const Endpoint& dst, std::span<uint8_t> bth_to_pad,
                      uint32_t wire_icrc, uint16_t hint, uint16_t max_id);

inline void store_icrc(uint8_t* p, uint32_t icrc) {
  p[0] = static_cast<uint8_t>(icrc);
  p[1] = static_cast<uint8_t>(icrc >> 8);
  p[2] = static_cast<uint8_t>(icrc >> 16);
  p[3] = static_cast<uint8_t>(icrc >> 24);
}
inline uint32_t load_icrc(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

}  // namespace softrdma::wire
