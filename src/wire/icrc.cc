#include "wire/icrc.h"

#include <isa-l/crc.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cassert>
#include <cstring>

#include "wire/headers.h"
#include "wire/opcode.h"

namespace softrdma::wire {
namespace {

constexpr size_t kLrhLen = 8;  // the masked LRH: 8 bytes of 0xFF (IBTA.md 6)
constexpr size_t kIpv4Len = 20;
constexpr size_t kIpv4MaxLen = 60;  // with options
constexpr size_t kIpv6Len = 40;
constexpr size_t kUdpLen = 8;
constexpr size_t kBthMaskedByte = 4;  // FECN, BECN, Resv6
constexpr uint8_t kProtoUdp = 17;

// Packets up to this size (BTH to pad) are gathered behind the pseudo header for one CRC call.
constexpr size_t kSmallPacket = 128;

// The masked pseudo header on the stack: LRH, IP, UDP, BTH (or the whole of a small packet).
struct PseudoHeader {
  uint8_t bytes[kLrhLen + kIpv4MaxLen + kUdpLen + std::max<size_t>(kBthLen, kSmallPacket)];
  size_t len = 0;

  uint8_t* append(size_t n) {
    uint8_t* p = bytes + len;
    len += n;
    return p;
  }
};

// Masks the variant IP fields to ones (IBTA.md 6): IPv4 TOS, TTL, checksum; IPv6 traffic class, flow label,
// hop limit.
void mask_ip(uint8_t* ip, bool v6) {
  if (v6) {
    ip[0] |= 0x0F;
    ip[1] = ip[2] = ip[3] = 0xFF;
    ip[7] = 0xFF;
  } else {
    ip[1] = 0xFF;
    ip[8] = 0xFF;
    ip[10] = ip[11] = 0xFF;
  }
}

void mask_udp(uint8_t* udp) { udp[6] = udp[7] = 0xFF; }

void put_ipv4(uint8_t* p, const Endpoint& src, const Endpoint& dst, uint16_t udp_len, uint16_t ip_id) {
  p[0] = 0x45;
  store_be16(p + 2, static_cast<uint16_t>(kIpv4Len + udp_len));
  store_be16(p + 4, ip_id);   // Linux sends 0 on an unconnected socket with DF (segment k of a GSO send: k)
  store_be16(p + 6, 0x4000);  // DF
  p[9] = kProtoUdp;
  std::memcpy(p + 12, &src.addr.raw[12], 4);
  std::memcpy(p + 16, &dst.addr.raw[12], 4);
  mask_ip(p, false);
}

void put_ipv6(uint8_t* p, const Endpoint& src, const Endpoint& dst, uint16_t udp_len) {
  p[0] = 0x60;
  store_be16(p + 4, udp_len);  // payload length: UDP header and everything after it
  p[6] = kProtoUdp;
  std::memcpy(p + 8, src.addr.raw.data(), 16);
  std::memcpy(p + 24, dst.addr.raw.data(), 16);
  mask_ip(p, true);
}

void put_udp(uint8_t* p, uint16_t sport, uint16_t dport, uint16_t udp_len) {
  store_be16(p, sport);
  store_be16(p + 2, dport);
  store_be16(p + 4, udp_len);
  mask_udp(p);
}

// Appends the masked pseudo header before the BTH: LRH, IP and UDP headers as Linux sends them (for IPv4
// with ID `ip_id`). `udp_len` covers the UDP header through the ICRC.
void put_pseudo_header(PseudoHeader& ph, const Endpoint& src, const Endpoint& dst, uint16_t udp_len,
                       uint16_t ip_id) {
  const bool v4 = src.addr.is_v4();
  std::memset(ph.append(kLrhLen), 0xFF, kLrhLen);
  uint8_t* ip = ph.append(v4 ? kIpv4Len : kIpv6Len);
  std::memset(ip, 0, v4 ? kIpv4Len : kIpv6Len);
  if (v4) {
    put_ipv4(ip, src, dst, udp_len, ip_id);
  } else {
    put_ipv6(ip, src, dst, udp_len);
  }
  put_udp(ph.append(kUdpLen), src.port, dst.port, udp_len);
}

// The CRC of an IPv4 pseudo header with ID `id` is that with ID 0 XOR the deltas of the ID's bits, which
// depend only on where the ID sits in the 36 bytes (CRC linearity), not on the addresses or lengths.
uint32_t ipv4_id_delta(uint16_t id) {
  static const auto bits = [] {
    std::array<uint32_t, 16> d{};
    const Endpoint a{Gid::from_v4(0x0100007Fu), 4791};
    PseudoHeader zero;
    put_pseudo_header(zero, a, a, 64, 0);
    const uint32_t crc0 = crc32(0, zero.bytes, zero.len);
    for (int b = 0; b < 16; ++b) {
      PseudoHeader one;
      put_pseudo_header(one, a, a, 64, static_cast<uint16_t>(1u << b));
      d[static_cast<size_t>(b)] = crc32(0, one.bytes, one.len) ^ crc0;
    }
    return d;
  }();
  uint32_t x = 0;
  for (int b = 0; id != 0; ++b, id >>= 1)
    if (id & 1) x ^= bits[static_cast<size_t>(b)];
  return x;
}

// The CRC of the pseudo header with ID 0, from a per-thread cache of the last (source, destination,
// length) in each of a few slots: a stream's packets are mostly of one length between one pair.
uint32_t pseudo_header_crc(const Endpoint& src, const Endpoint& dst, uint16_t udp_len) {
  struct Slot {
    Endpoint src, dst;
    uint16_t udp_len = 0;  // 0: empty (a UDP length is at least 8)
    uint32_t crc = 0;
  };
  constinit thread_local Slot slots[4];
  Slot& s = slots[(udp_len ^ dst.port) & 3];
  if (s.udp_len != udp_len || !(s.dst == dst) || !(s.src == src)) {
    PseudoHeader ph;
    put_pseudo_header(ph, src, dst, udp_len, 0);
    s = Slot{src, dst, udp_len, crc32(0, ph.bytes, ph.len)};
  }
  return s.crc;
}

}  // namespace

uint32_t crc32(uint32_t crc, const void* data, size_t len) {
  // ISA-L's gzip CRC is zlib's crc32 (same chaining); it folds with (V)PCLMULQDQ where the CPU has it.
  return crc32_gzip_refl(crc, static_cast<const unsigned char*>(data), len);
}

uint32_t icrc_of_ip_packet(std::span<const uint8_t> ip_packet) {
  assert(!ip_packet.empty());
  const bool v6 = (ip_packet[0] >> 4) == 6;
  const size_t ip_len = v6 ? kIpv6Len : size_t{ip_packet[0] & 0xFu} * 4;
  const size_t hdrs = ip_len + kUdpLen + kBthLen;
  assert(ip_len >= kIpv4Len && ip_packet.size() >= hdrs);

  PseudoHeader ph;
  std::memset(ph.append(kLrhLen), 0xFF, kLrhLen);
  uint8_t* ip = ph.append(hdrs);
  std::memcpy(ip, ip_packet.data(), hdrs);
  mask_ip(ip, v6);
  mask_udp(ip + ip_len);
  ip[ip_len + kUdpLen + kBthMaskedByte] = 0xFF;
  const uint32_t crc = crc32(0, ph.bytes, ph.len);
  return crc32(crc, ip_packet.data() + hdrs, ip_packet.size() - hdrs);
}

uint32_t icrc_for_udp(const Endpoint& src, const Endpoint& dst,
                      std::span<const std::span<const uint8_t>> segments, uint16_t ip_id) {
  assert(src.addr.is_v4() == dst.addr.is_v4());
  size_t total = 0;
  for (const auto& s : segments) total += s.size();
  const auto udp_len = static_cast<uint16_t>(kUdpLen + total + kIcrcLen);

  PseudoHeader ph;
  put_pseudo_header(ph, src, dst, udp_len, ip_id);

  assert(total >= kBthLen);
  // A small packet is gathered whole after the pseudo header: one CRC call rather than one per piece (an
  // 8-byte WRITE is 4 pieces, and each call costs more than its bytes).
  if (total <= kSmallPacket) {
    uint8_t* p = ph.append(total);
    for (const auto& s : segments) {
      if (!s.empty()) std::memcpy(p, s.data(), s.size());
      p += s.size();
    }
    ph.bytes[ph.len - total + kBthMaskedByte] = 0xFF;
    return crc32(0, ph.bytes, ph.len);
  }

  // The BTH may straddle segments: gather its 12 bytes, then continue after it.
  uint8_t* bth = ph.append(kBthLen);
  size_t seg = 0, off = 0;
  for (size_t got = 0; got < kBthLen && seg < segments.size();) {
    const size_t n = std::min(kBthLen - got, segments[seg].size() - off);
    if (n != 0) std::memcpy(bth + got, segments[seg].data() + off, n);  // data() may be null
    got += n;
    off += n;
    if (off == segments[seg].size()) {
      ++seg;
      off = 0;
    }
  }
  bth[kBthMaskedByte] = 0xFF;

  uint32_t crc = crc32(0, ph.bytes, ph.len);
  for (; seg < segments.size(); ++seg, off = 0) {
    crc = crc32(crc, segments[seg].data() + off, segments[seg].size() - off);
  }
  return crc;
}

uint32_t icrc_in_place(const Endpoint& src, const Endpoint& dst, std::span<uint8_t> bth_to_pad,
                       uint16_t ip_id) {
  assert(bth_to_pad.size() >= kBthLen && src.addr.is_v4() == dst.addr.is_v4());
  // A small packet is gathered behind a pseudo header built on the stack, as icrc_for_udp does: one call
  // too, and no cache to find after a system call (the cached way cost 8-byte socket-path ib_write_lat
  // 0.03-0.17 us typical in 5 of 6 interleaved pairs).
  if (bth_to_pad.size() <= kSmallPacket)
    return icrc_for_udp(src, dst, std::span<const uint8_t>(bth_to_pad), ip_id);
  const auto udp_len = static_cast<uint16_t>(kUdpLen + bth_to_pad.size() + kIcrcLen);
  uint32_t crc = pseudo_header_crc(src, dst, udp_len);
  if (ip_id != 0 && src.addr.is_v4()) crc ^= ipv4_id_delta(ip_id);
  uint8_t& masked = bth_to_pad[kBthMaskedByte];
  const uint8_t saved = masked;
  masked = 0xFF;
  crc = crc32(crc, bth_to_pad.data(), bth_to_pad.size());
  masked = saved;
  return crc;
}

namespace {
// icrc_check_any_id's search, given the packet's ICRC with ID 0: the ID whose ICRC is the wire's, solved for.
int match_ip_id(const Endpoint& src, const Endpoint& dst, std::span<const uint8_t> bth_to_pad, uint32_t crc0,
                uint32_t wire_icrc, uint16_t max_id) {
  if (crc0 == wire_icrc) return 0;
  if (!src.addr.is_v4() || max_id == 0) return -1;
  // crc(id) = crc(0) ^ D(id), with D linear in the ID's bits; D of each bit depends only on how many bytes
  // follow the ID field, i.e. on the packet's length. D is one to one (the ID's 16 bits are a burst that
  // CRC-32 always sees), so D(id) = crc(0) ^ wire has one solution at most: the 16 vectors D(bit) are
  // reduced to rows with distinct leading bits (Gaussian elimination over GF(2)), each with the ID bits
  // that make it, and the difference is reduced by them. Cached per length (per thread).
  struct Entry {
    size_t len = SIZE_MAX;
    uint32_t row[32];  // row[k]: a combination of the D(bit)s whose highest set bit is k, or 0
    uint16_t ids[32];  // the ID bits of that combination
  };
  thread_local Entry cache[16];
  Entry& e = cache[bth_to_pad.size() & 15];
  if (e.len != bth_to_pad.size()) {
    std::fill(std::begin(e.row), std::end(e.row), 0u);
    for (int b = 0; b < 16; ++b) {
      uint32_t x = icrc_for_udp(src, dst, bth_to_pad, static_cast<uint16_t>(1u << b)) ^ crc0;
      auto id = static_cast<uint16_t>(1u << b);
      while (x != 0) {
        const int k = std::bit_width(x) - 1;
        if (e.row[k] == 0) {
          e.row[k] = x;
          e.ids[k] = id;
          break;
        }
        x ^= e.row[k];
        id ^= e.ids[k];
      }
    }
    e.len = bth_to_pad.size();
  }
  uint32_t x = crc0 ^ wire_icrc;
  uint32_t id = 0;
  while (x != 0) {
    const int k = std::bit_width(x) - 1;
    if (e.row[k] == 0) return -1;  // no ID gives the wire's ICRC: the packet is corrupt
    x ^= e.row[k];
    id ^= e.ids[k];
  }
  return id <= max_id ? static_cast<int>(id) : -1;
}

}  // namespace

int icrc_check_any_id(const Endpoint& src, const Endpoint& dst, std::span<const uint8_t> bth_to_pad,
                      uint32_t wire_icrc, uint16_t max_id) {
  return match_ip_id(src, dst, bth_to_pad, icrc_for_udp(src, dst, bth_to_pad, 0), wire_icrc, max_id);
}

int icrc_check_any_id(const Endpoint& src, const Endpoint& dst, std::span<uint8_t> bth_to_pad,
                      uint32_t wire_icrc, uint16_t hint, uint16_t max_id) {
  // The hint first, in one pass (the segments of a coalesced run after its first carry their place).
  if (hint != 0 && hint <= max_id && src.addr.is_v4() &&
      icrc_in_place(src, dst, bth_to_pad, hint) == wire_icrc)
    return hint;
  return match_ip_id(src, dst, bth_to_pad, icrc_in_place(src, dst, bth_to_pad, 0), wire_icrc, max_id);
}

}  // namespace softrdma::wire
