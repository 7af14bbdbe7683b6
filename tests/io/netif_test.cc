#include "io/netif.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <net/if.h>

#include <cstdlib>
#include <optional>
#include <string>

namespace softrdma::io {
namespace {

// Sets or unsets SOFTRDMA_DEVICES for the scope of a test, restoring the previous value.
class ScopedDevicesEnv {
 public:
  explicit ScopedDevicesEnv(const char* value) {
    if (const char* old = std::getenv(kDevicesEnv)) old_ = old;
    if (value != nullptr) {
      setenv(kDevicesEnv, value, 1);
    } else {
      unsetenv(kDevicesEnv);
    }
  }
  ~ScopedDevicesEnv() {
    if (old_) {
      setenv(kDevicesEnv, old_->c_str(), 1);
    } else {
      unsetenv(kDevicesEnv);
    }
  }

 private:
  std::optional<std::string> old_;
};

wire::Gid gid(const char* text) {
  wire::Gid g;
  EXPECT_TRUE(wire::Gid::parse(text, &g));
  return g;
}

TEST(NetifTest, ListsLoopbackDevice) {
  ScopedDevicesEnv env(nullptr);
  const auto devs = list_devices();
  std::optional<DeviceInfo> lo;
  for (const auto& d : devs) {
    EXPECT_LE(d.name.size(), 63u);
    EXPECT_EQ(d.name, "sr_" + d.ifname);
    EXPECT_GE(d.gids.size(), 1u);
    if (d.name == "sr_lo") lo = d;
  }
  ASSERT_TRUE(lo.has_value());
  EXPECT_EQ(lo->ifname, "lo");
  EXPECT_EQ(lo->ifindex, static_cast<int>(if_nametoindex("lo")));
  EXPECT_TRUE(lo->active);
  EXPECT_GE(lo->if_mtu, 4176u);  // lo's MTU is 65536 by default
  EXPECT_EQ(lo->active_mtu_enum, 5);
  EXPECT_EQ(lo->active_mtu_bytes, 4096u);
  ASSERT_GE(lo->gids.size(), 2u);
  EXPECT_EQ(lo->gids[1].gid, gid("127.0.0.1"));
  EXPECT_EQ(lo->gids[1].gid.to_string(), "127.0.0.1");
  for (const auto& e : lo->gids) EXPECT_TRUE(e.roce_v2);

  // GID[0] = fe80::<node GUID>; lo's all-zero MAC gives a derived, unicast GUID.
  const wire::Gid& g0 = lo->gids[0].gid;
  EXPECT_EQ(g0.raw[0], 0xFE);
  EXPECT_EQ(g0.raw[1], 0x80);
  for (int i = 2; i < 8; ++i) EXPECT_EQ(g0.raw[i], 0);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(g0.raw[8 + i], static_cast<uint8_t>(lo->node_guid >> (56 - 8 * i)));
  EXPECT_NE(lo->node_guid, 0u);
  const auto again = find_device("sr_lo");
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->node_guid, lo->node_guid);
  EXPECT_EQ(again->gids.size(), lo->gids.size());
}

TEST(NetifTest, LoopbackIpv6IsInTheGidTableWhenConfigured) {
  ScopedDevicesEnv env(nullptr);
  bool lo_has_v6 = false;
  for (const auto& nif : list_interfaces()) {
    if (nif.name != "lo") continue;
    wire::Gid one;
    one.raw[15] = 1;
    for (const auto& a : nif.ipv6) lo_has_v6 = lo_has_v6 || a.addr == one;
  }
  if (!lo_has_v6) GTEST_SKIP() << "lo has no ::1";
  const auto lo = find_device("sr_lo");
  ASSERT_TRUE(lo.has_value());
  bool found = false;
  for (const auto& e : lo->gids) found = found || e.gid.to_string() == "::1";
  EXPECT_TRUE(found);
}

TEST(NetifTest, DevicesEnvRestrictsTheList) {
  std::vector<DeviceInfo> all;
  {
    ScopedDevicesEnv env(nullptr);
    all = list_devices();
  }
  ASSERT_FALSE(all.empty());
  {
    ScopedDevicesEnv env("lo");
    const auto devs = list_devices();
    ASSERT_EQ(devs.size(), 1u);
    EXPECT_EQ(devs[0].name, "sr_lo");
  }
  {
    ScopedDevicesEnv env(" sr_lo ");
    const auto devs = list_devices();
    ASSERT_EQ(devs.size(), 1u);
    EXPECT_EQ(devs[0].name, "sr_lo");
  }
  {
    ScopedDevicesEnv env("no_such_if0");
    EXPECT_TRUE(list_devices().empty());
    EXPECT_FALSE(find_device("sr_lo").has_value());
  }
  {
    // Every device named once, in any order, gives the full list back.
    std::string filter;
    for (auto it = all.rbegin(); it != all.rend(); ++it) filter += it->ifname + ",";
    ScopedDevicesEnv env(filter.c_str());
    const auto devs = list_devices();
    ASSERT_EQ(devs.size(), all.size());
    for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(devs[i].name, all[i].name);
  }
  if (all.size() >= 2) {
    const std::string filter = "lo," + (all[0].ifname == "lo" ? all[1].ifname : all[0].ifname);
    ScopedDevicesEnv env(filter.c_str());
    EXPECT_EQ(list_devices().size(), 2u);
  }
}

TEST(NetifTest, FilterSyntax) {
  EXPECT_TRUE(device_filter_matches("lo,eth0", "eth0"));
  EXPECT_TRUE(device_filter_matches("lo, eth0 ", "eth0"));
  EXPECT_TRUE(device_filter_matches("sr_eth0", "eth0"));
  EXPECT_FALSE(device_filter_matches("eth", "eth0"));
  EXPECT_FALSE(device_filter_matches("eth0", "eth"));
  EXPECT_FALSE(device_filter_matches("sr_", "eth0"));
  EXPECT_FALSE(device_filter_matches(",,", "lo"));
}

TEST(NetifTest, ActiveMtuFollowsRxe) {
  EXPECT_EQ(active_mtu_enum_for(1500), 3);  // IBTA.md 2c: 1500 -> 1024
  EXPECT_EQ(active_mtu_enum_for(65536), 5);
  EXPECT_EQ(active_mtu_enum_for(9000), 5);
  EXPECT_EQ(active_mtu_enum_for(4096 + 80), 5);
  EXPECT_EQ(active_mtu_enum_for(4096 + 79), 4);
  EXPECT_EQ(active_mtu_enum_for(2048 + 80), 4);
  EXPECT_EQ(active_mtu_enum_for(1400), 3);
  EXPECT_EQ(active_mtu_enum_for(1024 + 79), 2);
  EXPECT_EQ(active_mtu_enum_for(512 + 80), 2);
  EXPECT_EQ(active_mtu_enum_for(576), 1);
  EXPECT_EQ(active_mtu_enum_for(0), 1);
  EXPECT_EQ(mtu_enum_to_bytes(1), 256u);
  EXPECT_EQ(mtu_enum_to_bytes(5), 4096u);
  EXPECT_EQ(mtu_enum_to_bytes(0), 0u);
  EXPECT_EQ(mtu_enum_to_bytes(6), 0u);
}

TEST(NetifTest, NodeGuidIsModifiedEui64) {
  EXPECT_EQ(node_guid_for({0x02, 0xfc, 0x00, 0x00, 0x00, 0x01}, "eth0"), 0x00fc00fffe000001ull);
  EXPECT_EQ(node_guid_for({0x52, 0x54, 0x00, 0x12, 0x34, 0x56}, "x"), 0x505400fffe123456ull);
  // All-zero MAC: derived from the name, stable, distinct per name, unicast, ff:fe in the middle.
  const uint64_t lo = node_guid_for({}, "lo");
  EXPECT_EQ(lo, node_guid_for({}, "lo"));
  EXPECT_NE(lo, node_guid_for({}, "lo2"));
  EXPECT_EQ((lo >> 56) & 0x01, 0u);
  EXPECT_EQ((lo >> 24) & 0xFFFF, 0xFFFEu);
  // The derived MAC is locally administered: after the U/L inversion of EUI-64 the bit reads 0.
  EXPECT_EQ((lo >> 56) & 0x02, 0u);
}

TEST(NetifTest, GidTableOrder) {
  NetInterface nif;
  nif.name = "test0";
  nif.ifindex = 7;
  nif.mtu = 1500;
  nif.flags = IFF_UP | IFF_RUNNING;
  nif.mac = {0x02, 0xfc, 0x00, 0x00, 0x00, 0x01};
  nif.ipv4 = {gid("192.0.2.2").v4_be(), gid("198.18.0.1").v4_be()};
  Ipv6Addr ll{gid("fe80::fc:ff:fe00:1"), 7};
  Ipv6Addr global{gid("fd00::2"), 0};
  nif.ipv6 = {ll, global};
  DeviceInfo d = make_device(nif);
  EXPECT_EQ(d.name, "sr_test0");
  EXPECT_TRUE(d.active);
  EXPECT_EQ(d.active_mtu_enum, 3);
  EXPECT_EQ(d.active_mtu_bytes, 1024u);
  ASSERT_EQ(d.gids.size(), 4u);
  EXPECT_EQ(d.gids[0].gid.to_string(), "fe80::fc:ff:fe00:1");
  EXPECT_EQ(d.gids[1].gid.to_string(), "192.0.2.2");
  EXPECT_EQ(d.gids[2].gid.to_string(), "198.18.0.1");
  EXPECT_EQ(d.gids[3].gid.to_string(), "fd00::2");

  // No IPv4: the first global IPv6 address follows GID[0].
  nif.ipv4.clear();
  d = make_device(nif);
  ASSERT_EQ(d.gids.size(), 2u);
  EXPECT_EQ(d.gids[1].gid.to_string(), "fd00::2");

  // Port state: UP and RUNNING, or UP on a loopback interface.
  nif.flags = IFF_UP;
  EXPECT_FALSE(make_device(nif).active);
  nif.flags = IFF_UP | IFF_LOOPBACK;
  EXPECT_TRUE(make_device(nif).active);
  nif.flags = IFF_RUNNING;
  EXPECT_FALSE(make_device(nif).active);
}

}  // namespace
}  // namespace softrdma::io
