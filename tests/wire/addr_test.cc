#include "wire/addr.h"

#include <gtest/gtest.h>

namespace softrdma::wire {
namespace {

TEST(Gid, ParsesIpv4AsMapped) {
  Gid g;
  ASSERT_TRUE(Gid::parse("198.18.0.1", &g));
  const std::array<uint8_t, 16> expected = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 198, 18, 0, 1};
  EXPECT_EQ(g.raw, expected);
  EXPECT_TRUE(g.is_v4());
  EXPECT_EQ(g.to_string(), "198.18.0.1");
  EXPECT_EQ(g, Gid::from_v4(g.v4_be()));
}

TEST(Gid, MappedIpv6TextIsIpv4) {
  Gid g;
  ASSERT_TRUE(Gid::parse("::ffff:198.18.0.2", &g));
  EXPECT_TRUE(g.is_v4());
  EXPECT_EQ(g.to_string(), "198.18.0.2");
}

TEST(Gid, Ipv6RoundTripsInRfc5952Form) {
  Gid g;
  ASSERT_TRUE(Gid::parse("FE80:0:0:0:5054:FF:FE12:3402", &g));
  EXPECT_FALSE(g.is_v4());
  EXPECT_EQ(g.raw[0], 0xFE);
  EXPECT_EQ(g.raw[15], 0x02);
  EXPECT_EQ(g.to_string(), "fe80::5054:ff:fe12:3402");
  ASSERT_TRUE(Gid::parse("::", &g));
  EXPECT_TRUE(g.is_zero());
  EXPECT_EQ(g.to_string(), "::");
}

TEST(Gid, RejectsBadTextAndLeavesOutputAlone) {
  Gid g = Gid::from_v4(0x01020304);
  const Gid before = g;
  for (const char* bad : {"", "1.2.3", "1.2.3.256", "hello", "::ffff::1", "1.2.3.4 ", "fe80::1%eth0"}) {
    EXPECT_FALSE(Gid::parse(bad, &g)) << bad;
  }
  EXPECT_FALSE(Gid::parse(nullptr, &g));
  EXPECT_EQ(g, before);
}

}  // namespace
}  // namespace softrdma::wire
