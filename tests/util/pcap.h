// Test helpers for packet captures: a reader and a writer of classic libpcap files (Ethernet link type),
// a decoder that finds RoCEv2 packets in Ethernet frames, and a builder of Ethernet/IP/UDP frames around a
// UDP payload, so that tests can write captures that tshark and scapy read.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "wire/addr.h"
#include "wire/headers.h"

namespace softrdma::testutil {

inline constexpr uint32_t kLinkTypeEthernet = 1;

struct PcapFrame {
  uint64_t ts_ns = 0;
  uint32_t orig_len = 0;  // length on the wire; data may be shorter if the capture truncated it
  std::vector<uint8_t> data;
};

struct PcapFile {
  uint32_t link_type = 0;
  std::vector<PcapFrame> frames;
};

// Reads a classic pcap file (either byte order, micro- or nanosecond timestamps). On failure returns
// nullopt and, if `error` is given, says why.
std::optional<PcapFile> read_pcap(const std::string& path, std::string* error = nullptr);

// Writes a classic pcap file (little-endian, microsecond timestamps).
class PcapWriter {
 public:
  PcapWriter() = default;
  PcapWriter(const PcapWriter&) = delete;
  PcapWriter& operator=(const PcapWriter&) = delete;
  ~PcapWriter() { close(); }

  bool open(const std::string& path, uint32_t link_type = kLinkTypeEthernet, uint32_t snaplen = 65535);
  bool write(std::span<const uint8_t> frame, uint64_t ts_ns);
  bool close();  // flushes; true when every write succeeded

 private:
  std::FILE* f_ = nullptr;
  uint32_t snaplen_ = 0;
  bool ok_ = true;
};

// One RoCEv2 packet found in a frame. The spans point into the frame.
struct RocePacket {
  bool ipv6 = false;
  std::span<const uint8_t> ip_header;   // IPv4 header (with options) or the 40-byte IPv6 header
  std::span<const uint8_t> ip_to_pad;   // IP header .. pad: the input of wire::icrc_of_ip_packet
  wire::Endpoint src, dst;              // addresses and UDP ports
  std::span<const uint8_t> bth_to_pad;  // BTH .. pad
  std::span<const uint8_t> icrc;        // the 4 ICRC bytes as on the wire
};

// Decodes Ethernet (with any number of 802.1Q/802.1ad tags) / IPv4 or IPv6 / UDP and returns the packet if
// its UDP destination port is `port`. Fragments, IPv6 extension headers and truncated frames yield nullopt.
std::optional<RocePacket> decode_roce(std::span<const uint8_t> frame, uint16_t port = wire::kRoceV2Port);

struct FrameOptions {
  uint16_t ip_id = 0;                    // IPv4 only
  uint8_t tos = 0;                       // IPv4 TOS or IPv6 traffic class
  uint8_t ttl = 64;                      // IPv4 TTL or IPv6 hop limit
  uint32_t flow_label = 0;               // IPv6 only
  std::optional<uint16_t> udp_checksum;  // nullopt: the real checksum; rxe sends 0 over IPv4
  std::optional<uint16_t> vlan;          // 802.1Q TCI
};

// Builds Ethernet / IPv4 (DF, valid header checksum) or IPv6 / UDP (valid checksum unless given) around
// `udp_payload` (BTH .. ICRC for RoCEv2). IPv4 is used when both addresses are IPv4-mapped.
std::vector<uint8_t> build_frame(const wire::Endpoint& src, const wire::Endpoint& dst,
                                 std::span<const uint8_t> udp_payload, const FrameOptions& opt = {});

}  // namespace softrdma::testutil
