#include "util/pcap.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace softrdma::testutil {
namespace {

using wire::load_be16;
using wire::store_be16;
using wire::store_be32;

constexpr uint32_t kMagicMicro = 0xA1B2C3D4;
constexpr uint32_t kMagicNano = 0xA1B23C4D;
constexpr uint32_t kMaxRecord = 1u << 24;  // a sanity bound on one record's captured length
constexpr size_t kEthLen = 14;
constexpr size_t kVlanLen = 4;
constexpr uint16_t kEtherIpv4 = 0x0800;
constexpr uint16_t kEtherIpv6 = 0x86DD;
constexpr uint16_t kEtherVlan = 0x8100;
constexpr uint16_t kEtherQinQ = 0x88A8;
constexpr uint8_t kProtoUdp = 17;
constexpr size_t kUdpLen = 8;

bool fail(std::string* error, std::string why) {
  if (error) *error = std::move(why);
  return false;
}

class FieldReader {
 public:
  explicit FieldReader(bool swap) : swap_(swap) {}
  uint32_t u32(const uint8_t* p) const {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return swap_ ? __builtin_bswap32(v) : v;
  }

 private:
  bool swap_;
};

bool read_records(std::FILE* f, FieldReader rd, bool nano, PcapFile* out, std::string* error) {
  uint8_t rec[16];
  while (true) {
    const size_t n = std::fread(rec, 1, sizeof rec, f);
    if (n == 0) return true;
    if (n != sizeof rec) return fail(error, "truncated record header");
    PcapFrame fr;
    const uint64_t frac = rd.u32(rec + 4);
    fr.ts_ns = uint64_t{rd.u32(rec)} * 1'000'000'000 + (nano ? frac : frac * 1000);
    const uint32_t incl = rd.u32(rec + 8);
    fr.orig_len = rd.u32(rec + 12);
    if (incl > kMaxRecord) return fail(error, "record length " + std::to_string(incl) + " too large");
    fr.data.resize(incl);
    if (incl != 0 && std::fread(fr.data.data(), 1, incl, f) != incl)
      return fail(error, "truncated record data");
    out->frames.push_back(std::move(fr));
  }
}

bool read_file(std::FILE* f, PcapFile* out, std::string* error) {
  uint8_t hdr[24];
  if (std::fread(hdr, 1, sizeof hdr, f) != sizeof hdr) return fail(error, "truncated file header");
  uint32_t magic;
  std::memcpy(&magic, hdr, 4);
  const bool swap = magic == __builtin_bswap32(kMagicMicro) || magic == __builtin_bswap32(kMagicNano);
  const FieldReader rd(swap);
  magic = rd.u32(hdr);
  if (magic != kMagicMicro && magic != kMagicNano) return fail(error, "not a classic pcap file");
  out->link_type = rd.u32(hdr + 20);
  return read_records(f, rd, magic == kMagicNano, out, error);
}

struct Ip {
  bool v6 = false;
  size_t hdr_len = 0;
  std::span<const uint8_t> packet;  // IP header .. end of the IP payload (link padding removed)
  wire::Endpoint src, dst;          // addresses only
};

std::optional<Ip> decode_ipv4(std::span<const uint8_t> p) {
  if (p.size() < 20 || (p[0] >> 4) != 4) return std::nullopt;
  Ip ip;
  ip.hdr_len = size_t{p[0] & 0xFu} * 4;
  const size_t total = load_be16(&p[2]);
  const bool fragment = (load_be16(&p[6]) & 0x3FFF) != 0;  // MF or an offset
  if (ip.hdr_len < 20 || total < ip.hdr_len || total > p.size() || fragment || p[9] != kProtoUdp) {
    return std::nullopt;
  }
  ip.packet = p.first(total);
  uint32_t a;
  std::memcpy(&a, &p[12], 4);
  ip.src.addr = wire::Gid::from_v4(a);
  std::memcpy(&a, &p[16], 4);
  ip.dst.addr = wire::Gid::from_v4(a);
  return ip;
}

std::optional<Ip> decode_ipv6(std::span<const uint8_t> p) {
  if (p.size() < 40 || (p[0] >> 4) != 6 || p[6] != kProtoUdp) return std::nullopt;
  Ip ip;
  ip.v6 = true;
  ip.hdr_len = 40;
  const size_t total = 40 + size_t{load_be16(&p[4])};
  if (total > p.size()) return std::nullopt;
  ip.packet = p.first(total);
  std::memcpy(ip.src.addr.raw.data(), &p[8], 16);
  std::memcpy(ip.dst.addr.raw.data(), &p[24], 16);
  return ip;
}

// Returns the EtherType after any VLAN tags and the offset of the layer-3 header.
std::optional<std::pair<uint16_t, size_t>> decode_ethernet(std::span<const uint8_t> f) {
  if (f.size() < kEthLen) return std::nullopt;
  size_t off = 12;
  uint16_t type = load_be16(&f[off]);
  while (type == kEtherVlan || type == kEtherQinQ) {
    off += kVlanLen;
    if (f.size() < off + 2) return std::nullopt;
    type = load_be16(&f[off]);
  }
  return std::pair{type, off + 2};
}

// The Internet checksum's one's-complement sum of 16-bit words (an odd tail is padded with zero).
uint32_t sum16(const uint8_t* p, size_t len, uint32_t sum = 0) {
  for (size_t i = 0; i + 1 < len; i += 2) sum += load_be16(p + i);
  if (len & 1) sum += uint32_t{p[len - 1]} << 8;
  return sum;
}

uint16_t fold(uint32_t sum) {
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}

// RFC 768 / RFC 8200 8.1: over the pseudo header (addresses, protocol, UDP length) and the UDP datagram.
uint16_t udp_checksum(const uint8_t* ip, bool v4, const uint8_t* udp, uint16_t udp_len) {
  uint32_t sum = v4 ? sum16(ip + 12, 8) : sum16(ip + 8, 32);
  sum += kProtoUdp + udp_len;
  const uint16_t c = fold(sum16(udp, udp_len, sum));
  return c == 0 ? 0xFFFF : c;
}

}  // namespace

std::optional<PcapFile> read_pcap(const std::string& path, std::string* error) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    fail(error, "cannot open " + path);
    return std::nullopt;
  }
  PcapFile out;
  const bool ok = read_file(f, &out, error);
  std::fclose(f);
  if (!ok) return std::nullopt;
  return out;
}

bool PcapWriter::open(const std::string& path, uint32_t link_type, uint32_t snaplen) {
  close();
  f_ = std::fopen(path.c_str(), "wb");
  if (!f_) return false;
  ok_ = true;
  snaplen_ = snaplen;
  uint8_t hdr[24] = {};
  const uint32_t fields[] = {kMagicMicro, 2u | 4u << 16, 0, 0, snaplen, link_type};  // version 2.4
  std::memcpy(hdr, fields, sizeof hdr);  // host order: readers detect it from the magic
  ok_ = std::fwrite(hdr, 1, sizeof hdr, f_) == sizeof hdr;
  return ok_;
}

bool PcapWriter::write(std::span<const uint8_t> frame, uint64_t ts_ns) {
  if (!f_) return false;
  const auto incl = static_cast<uint32_t>(std::min<size_t>(frame.size(), snaplen_));
  const uint32_t rec[] = {static_cast<uint32_t>(ts_ns / 1'000'000'000),
                          static_cast<uint32_t>(ts_ns % 1'000'000'000 / 1000), incl,
                          static_cast<uint32_t>(frame.size())};
  ok_ = ok_ && std::fwrite(rec, 1, sizeof rec, f_) == sizeof rec;
  ok_ = ok_ && (incl == 0 || std::fwrite(frame.data(), 1, incl, f_) == incl);
  return ok_;
}

bool PcapWriter::close() {
  if (!f_) return ok_;
  ok_ = (std::fclose(f_) == 0) && ok_;
  f_ = nullptr;
  return ok_;
}

std::optional<RocePacket> decode_roce(std::span<const uint8_t> frame, uint16_t port) {
  const auto eth = decode_ethernet(frame);
  if (!eth) return std::nullopt;
  const auto l3 = frame.subspan(eth->second);
  std::optional<Ip> ip;
  if (eth->first == kEtherIpv4) ip = decode_ipv4(l3);
  if (eth->first == kEtherIpv6) ip = decode_ipv6(l3);
  if (!ip) return std::nullopt;
  const auto udp = ip->packet.subspan(ip->hdr_len);
  if (udp.size() < kUdpLen || load_be16(&udp[2]) != port) return std::nullopt;
  const size_t udp_len = load_be16(&udp[4]);
  if (udp_len < kUdpLen + wire::kBthLen + wire::kIcrcLen || udp_len > udp.size()) return std::nullopt;

  RocePacket r;
  r.ipv6 = ip->v6;
  r.ip_header = ip->packet.first(ip->hdr_len);
  r.ip_to_pad = ip->packet.first(ip->hdr_len + udp_len - wire::kIcrcLen);
  r.src = ip->src;
  r.dst = ip->dst;
  r.src.port = load_be16(&udp[0]);
  r.dst.port = port;
  r.bth_to_pad = udp.subspan(kUdpLen, udp_len - kUdpLen - wire::kIcrcLen);
  r.icrc = udp.subspan(udp_len - wire::kIcrcLen, wire::kIcrcLen);
  return r;
}

std::vector<uint8_t> build_frame(const wire::Endpoint& src, const wire::Endpoint& dst,
                                 std::span<const uint8_t> udp_payload, const FrameOptions& opt) {
  const bool v4 = src.addr.is_v4() && dst.addr.is_v4();
  const size_t l2 = kEthLen + (opt.vlan ? kVlanLen : 0);
  const size_t ip_len = v4 ? 20 : 40;
  const auto udp_len = static_cast<uint16_t>(kUdpLen + udp_payload.size());
  std::vector<uint8_t> f(l2 + ip_len + udp_len);
  static constexpr uint8_t kMacs[12] = {0x52, 0x54, 0, 0x12, 0x34, 0x01, 0x52, 0x54, 0, 0x12, 0x34, 0x02};
  std::memcpy(f.data(), kMacs, sizeof kMacs);
  if (opt.vlan) {
    store_be16(&f[12], kEtherVlan);
    store_be16(&f[14], *opt.vlan);
  }
  store_be16(&f[l2 - 2], v4 ? kEtherIpv4 : kEtherIpv6);
  uint8_t* ip = &f[l2];
  if (v4) {
    ip[0] = 0x45;
    ip[1] = opt.tos;
    store_be16(ip + 2, static_cast<uint16_t>(ip_len + udp_len));
    store_be16(ip + 4, opt.ip_id);
    store_be16(ip + 6, 0x4000);  // DF
    ip[8] = opt.ttl;
    ip[9] = kProtoUdp;
    std::memcpy(ip + 12, &src.addr.raw[12], 4);
    std::memcpy(ip + 16, &dst.addr.raw[12], 4);
    store_be16(ip + 10, fold(sum16(ip, 20)));
  } else {
    store_be32(ip, 6u << 28 | uint32_t{opt.tos} << 20 | (opt.flow_label & 0xFFFFF));
    store_be16(ip + 4, udp_len);
    ip[6] = kProtoUdp;
    ip[7] = opt.ttl;
    std::memcpy(ip + 8, src.addr.raw.data(), 16);
    std::memcpy(ip + 24, dst.addr.raw.data(), 16);
  }
  uint8_t* udp = ip + ip_len;
  store_be16(udp, src.port);
  store_be16(udp + 2, dst.port);
  store_be16(udp + 4, udp_len);
  if (!udp_payload.empty()) std::memcpy(udp + kUdpLen, udp_payload.data(), udp_payload.size());
  store_be16(udp + 6, opt.udp_checksum ? *opt.udp_checksum : udp_checksum(ip, v4, udp, udp_len));
  return f;
}

}  // namespace softrdma::testutil
