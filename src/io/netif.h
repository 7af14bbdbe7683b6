// Network interfaces and the softrdma devices made from them: one device "sr_<ifname>" per interface that
// has an address (lo included), with rxe's conventions (ABI.md "Device conventions"): node GUID = EUI-64 of
// the MAC, GID[0] = fe80::<EUI-64>, GID[1] = ::ffff:<first IPv4>, all RoCE v2; active MTU = the largest IB
// MTU <= interface MTU - 80 (IBTA.md 2c).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "wire/addr.h"

namespace softrdma::io {

// Restricts the device list to these interfaces (comma-separated names, "lo,eth0"; "sr_lo" works too).
inline constexpr const char* kDevicesEnv = "SOFTRDMA_DEVICES";
inline constexpr std::string_view kDevicePrefix = "sr_";
// RXE_MAX_HDR_LENGTH: room for Ethernet/IP/UDP/BTH/ext headers/ICRC below the interface MTU.
inline constexpr uint32_t kRoceHeaderRoom = 80;

// One IPv6 address of an interface with its scope (link-local addresses need it in sockaddr_in6).
struct Ipv6Addr {
  wire::Gid addr;
  uint32_t scope_id = 0;
};

// An interface as the kernel reports it.
struct NetInterface {
  std::string name;
  int ifindex = 0;
  uint32_t mtu = 0;
  uint32_t flags = 0;  // IFF_*
  std::array<uint8_t, 6> mac{};
  std::vector<uint32_t> ipv4;  // network byte order, in the kernel's order (the primary first)
  std::vector<Ipv6Addr> ipv6;
};

// Every interface (with or without addresses), ordered by ifindex. Empty on error.
std::vector<NetInterface> list_interfaces();

struct GidEntry {
  wire::Gid gid;
  bool roce_v2 = true;
};

struct DeviceInfo {
  std::string name;  // "sr_<ifname>"
  std::string ifname;
  int ifindex = 0;
  uint32_t if_mtu = 0;
  uint8_t active_mtu_enum = 0;  // IBV_MTU_256 = 1 .. IBV_MTU_4096 = 5
  uint32_t active_mtu_bytes = 0;
  std::array<uint8_t, 6> mac{};
  uint64_t node_guid = 0;  // host order; its big-endian bytes are the EUI-64 (the ABI stores htobe64 of it)
  bool active = false;     // port state ACTIVE (4) when true, DOWN (1) otherwise
  std::vector<GidEntry> gids;
};

// The devices, ordered by ifindex, restricted by SOFTRDMA_DEVICES when it is set and not empty.
std::vector<DeviceInfo> list_devices();
// By device name ("sr_lo"); the restriction applies.
std::optional<DeviceInfo> find_device(std::string_view name);

// The pieces, exposed for tests and for the ABI layer.
DeviceInfo make_device(const NetInterface& nif);
// IBTA MTU enum (1..5) for an interface MTU; never below IBV_MTU_256.
uint8_t active_mtu_enum_for(uint32_t if_mtu);
inline constexpr uint32_t mtu_enum_to_bytes(uint8_t e) { return (e >= 1 && e <= 5) ? 128u << e : 0; }
// Modified EUI-64 (RFC 4291 appendix A: U/L bit inverted) from a MAC; for an all-zero MAC (lo), from a
// stable locally administered MAC derived from the interface name.
uint64_t node_guid_for(const std::array<uint8_t, 6>& mac, std::string_view ifname);
// Whether `filter` (the SOFTRDMA_DEVICES syntax) selects interface `ifname`.
bool device_filter_matches(std::string_view filter, std::string_view ifname);

}  // namespace softrdma::io
