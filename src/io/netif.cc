#include "io/netif.h"

#include <ifaddrs.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace softrdma::io {
namespace {

bool is_link_local6(const wire::Gid& g) { return g.raw[0] == 0xFE && (g.raw[1] & 0xC0) == 0x80; }
bool is_multicast6(const wire::Gid& g) { return g.raw[0] == 0xFF; }

uint32_t query_mtu(int fd, const std::string& ifname) {
  if (fd < 0) return 0;
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, ifname.c_str(), IFNAMSIZ - 1);
  if (ioctl(fd, SIOCGIFMTU, &ifr) != 0) return 0;
  return ifr.ifr_mtu > 0 ? static_cast<uint32_t>(ifr.ifr_mtu) : 0;
}

bool query_mac(int fd, const std::string& ifname, std::array<uint8_t, 6>* mac) {
  if (fd < 0) return false;
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, ifname.c_str(), IFNAMSIZ - 1);
  if (ioctl(fd, SIOCGIFHWADDR, &ifr) != 0) return false;
  if (ifr.ifr_hwaddr.sa_family != ARPHRD_ETHER && ifr.ifr_hwaddr.sa_family != ARPHRD_LOOPBACK) return false;
  std::memcpy(mac->data(), ifr.ifr_hwaddr.sa_data, 6);
  return true;
}

NetInterface* find_or_add(std::vector<NetInterface>& v, const char* name) {
  for (auto& n : v) {
    if (n.name == name) return &n;
  }
  v.push_back(NetInterface{});
  v.back().name = name;
  return &v.back();
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

std::vector<NetInterface> list_interfaces() {
  std::vector<NetInterface> out;
  ifaddrs* head = nullptr;
  if (getifaddrs(&head) != 0) return out;
  for (ifaddrs* ifa = head; ifa != nullptr; ifa = ifa->ifa_next) {
    if (ifa->ifa_name == nullptr) continue;
    NetInterface* nif = find_or_add(out, ifa->ifa_name);
    nif->flags = ifa->ifa_flags;
    if (ifa->ifa_addr == nullptr) continue;
    switch (ifa->ifa_addr->sa_family) {
      case AF_PACKET: {
        const auto* ll = reinterpret_cast<const sockaddr_ll*>(ifa->ifa_addr);
        nif->ifindex = ll->sll_ifindex;
        if (ll->sll_halen == 6) std::memcpy(nif->mac.data(), ll->sll_addr, 6);
        break;
      }
      case AF_INET: {
        const auto* sin = reinterpret_cast<const sockaddr_in*>(ifa->ifa_addr);
        nif->ipv4.push_back(sin->sin_addr.s_addr);
        break;
      }
      case AF_INET6: {
        const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(ifa->ifa_addr);
        Ipv6Addr a;
        std::memcpy(a.addr.raw.data(), &sin6->sin6_addr, 16);
        a.scope_id = sin6->sin6_scope_id;
        nif->ipv6.push_back(a);
        break;
      }
      default:
        break;
    }
  }
  freeifaddrs(head);

  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fd = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  for (auto& nif : out) {
    if (nif.ifindex == 0) nif.ifindex = static_cast<int>(if_nametoindex(nif.name.c_str()));
    nif.mtu = query_mtu(fd, nif.name);
    if (nif.mac == std::array<uint8_t, 6>{}) query_mac(fd, nif.name, &nif.mac);
  }
  if (fd >= 0) close(fd);
  std::sort(out.begin(), out.end(),
            [](const NetInterface& a, const NetInterface& b) { return a.ifindex < b.ifindex; });
  return out;
}

uint8_t active_mtu_enum_for(uint32_t if_mtu) {
  const uint32_t room = if_mtu > kRoceHeaderRoom ? if_mtu - kRoceHeaderRoom : 0;
  uint8_t e = 1;  // IBV_MTU_256 at least
  for (uint8_t c = 5; c >= 1; --c) {
    if (mtu_enum_to_bytes(c) <= room) {
      e = c;
      break;
    }
  }
  return e;
}

uint64_t node_guid_for(const std::array<uint8_t, 6>& mac_in, std::string_view ifname) {
  std::array<uint8_t, 6> mac = mac_in;
  if (mac == std::array<uint8_t, 6>{}) {
    // FNV-1a of the name: stable across runs and hosts; unicast, locally administered.
    uint64_t h = 0xcbf29ce484222325ull;
    for (char c : ifname) {
      h ^= static_cast<uint8_t>(c);
      h *= 0x100000001b3ull;
    }
    for (int i = 0; i < 6; ++i) mac[i] = static_cast<uint8_t>(h >> (8 * i));
    mac[0] = static_cast<uint8_t>((mac[0] | 0x02) & ~0x01);
  }
  const uint8_t eui[8] = {
      static_cast<uint8_t>(mac[0] ^ 0x02), mac[1], mac[2], 0xFF, 0xFE, mac[3], mac[4], mac[5]};
  uint64_t g = 0;
  for (uint8_t b : eui) g = g << 8 | b;
  return g;
}

bool device_filter_matches(std::string_view filter, std::string_view ifname) {
  while (!filter.empty()) {
    const size_t comma = filter.find(',');
    std::string_view tok = trim(filter.substr(0, comma));
    filter = comma == std::string_view::npos ? std::string_view{} : filter.substr(comma + 1);
    if (tok.starts_with(kDevicePrefix) && tok.substr(kDevicePrefix.size()) == ifname) return true;
    if (tok == ifname) return true;
  }
  return false;
}

DeviceInfo make_device(const NetInterface& nif) {
  DeviceInfo d;
  d.name = std::string(kDevicePrefix) + nif.name;
  d.ifname = nif.name;
  d.ifindex = nif.ifindex;
  d.if_mtu = nif.mtu;
  d.active_mtu_enum = active_mtu_enum_for(nif.mtu);
  d.active_mtu_bytes = mtu_enum_to_bytes(d.active_mtu_enum);
  d.mac = nif.mac;
  d.node_guid = node_guid_for(nif.mac, nif.name);
  const bool up = (nif.flags & IFF_UP) != 0;
  d.active = up && ((nif.flags & IFF_RUNNING) != 0 || (nif.flags & IFF_LOOPBACK) != 0);

  auto add = [&d](const wire::Gid& g) {
    for (const auto& e : d.gids) {
      if (e.gid == g) return;
    }
    d.gids.push_back(GidEntry{g, true});
  };
  wire::Gid ll;
  ll.raw[0] = 0xFE;
  ll.raw[1] = 0x80;
  for (int i = 0; i < 8; ++i) ll.raw[8 + i] = static_cast<uint8_t>(d.node_guid >> (56 - 8 * i));
  add(ll);
  for (uint32_t a : nif.ipv4) add(wire::Gid::from_v4(a));
  for (const auto& a : nif.ipv6) {
    if (is_link_local6(a.addr) || is_multicast6(a.addr) || a.addr.is_zero() || a.addr.is_v4()) continue;
    add(a.addr);
  }
  return d;
}

std::vector<DeviceInfo> list_devices() {
  std::vector<DeviceInfo> out;
  const char* env = std::getenv(kDevicesEnv);
  const std::string_view filter = env != nullptr ? trim(env) : std::string_view{};
  for (const auto& nif : list_interfaces()) {
    if (nif.ipv4.empty() && nif.ipv6.empty()) continue;
    if (!filter.empty() && !device_filter_matches(filter, nif.name)) continue;
    out.push_back(make_device(nif));
  }
  return out;
}

std::optional<DeviceInfo> find_device(std::string_view name) {
  for (auto& d : list_devices()) {
    if (d.name == name) return std::move(d);
  }
  return std::nullopt;
}

}  // namespace softrdma::io
