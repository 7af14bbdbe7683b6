#include "io/udp/udp_io.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "io/sys.h"
#include "util/pcap.h"
#include "wire/headers.h"
#include "wire/icrc.h"

namespace softrdma::io {
namespace {

using Bytes = std::vector<uint8_t>;
using Clock = std::chrono::steady_clock;

wire::Gid addr(const char* text) {
  wire::Gid g;
  EXPECT_TRUE(wire::Gid::parse(text, &g));
  return g;
}

struct Peer {
  Counters counters;
  std::unique_ptr<UdpIo> io;
  std::vector<uint16_t> ports;
  wire::Endpoint ep(size_t i = 0) const { return wire::Endpoint{io->local_addr(), ports.at(i)}; }
};

// A UdpIo on `local` with `nports` ephemeral ports; null if the address is not usable here.
std::unique_ptr<Peer> make_peer(const char* local, int nports = 1) {
  auto p = std::make_unique<Peer>();
  auto io = UdpIo::create(addr(local), &p->counters);
  if (!io) {
    ADD_FAILURE() << "create: " << std::strerror(io.error());
    return nullptr;
  }
  p->io = std::move(*io);
  for (int i = 0; i < nports; ++i) {
    auto port = p->io->open_port(0);
    if (!port) return nullptr;
    EXPECT_NE(*port, 0);
    p->ports.push_back(*port);
  }
  return p;
}

uint64_t count(const Peer& p, Counter c) { return p.counters.get(c); }

// BTH of an RC SEND_ONLY with the pad count and PSN; `hdr_len` - 12 more header bytes follow (a pattern).
void fill_header(TxPacket& p, uint32_t psn, uint32_t hdr_len, uint8_t pad) {
  std::memset(p.hdr, 0, sizeof p.hdr);
  p.hdr[0] = 0x04;
  p.hdr[1] = static_cast<uint8_t>(pad << 4);
  wire::store_be16(p.hdr + 2, 0xFFFF);
  wire::store_be24(p.hdr + 5, 0x000111);
  p.hdr[8] = 0x80;
  wire::store_be24(p.hdr + 9, psn);
  for (uint32_t i = 12; i < hdr_len; ++i) p.hdr[i] = static_cast<uint8_t>(i * 7 + psn);
  p.hdr_len = hdr_len;
}

// Points the packet's payload at `payload`, cut into `n_iov` uneven pieces (some empty when short).
void attach(TxPacket& p, const Bytes& payload, uint32_t n_iov) {
  p.n_iov = n_iov;
  p.payload_len = static_cast<uint32_t>(payload.size());
  size_t off = 0;
  for (uint32_t k = 0; k < n_iov; ++k) {
    size_t len = k + 1 == n_iov
                     ? payload.size() - off
                     : std::min(payload.size() - off, (payload.size() * (k + 1)) / (2 * n_iov) + k);
    p.iov[k] = iovec{const_cast<uint8_t*>(payload.data()) + off, len};
    off += len;
  }
}

// `n` packets from a to b with PSNs 0.. and growing header sizes (so no GSO run: n datagrams).
std::vector<TxPacket> separate_datagrams(const Peer& a, const Peer& b, uint32_t n, const Bytes& payload) {
  std::vector<TxPacket> pkts(n);
  for (uint32_t i = 0; i < n; ++i) {
    fill_header(pkts[i], i, 12 + 4 * i, 0);
    pkts[i].src = a.ep();
    pkts[i].dst = b.ep();
    attach(pkts[i], payload, 1);
  }
  return pkts;
}

Bytes expected_bytes(const TxPacket& p) {
  Bytes b(p.hdr, p.hdr + p.hdr_len);
  for (uint32_t k = 0; k < p.n_iov; ++k) {
    const auto* s = static_cast<const uint8_t*>(p.iov[k].iov_base);
    b.insert(b.end(), s, s + p.iov[k].iov_len);
  }
  b.insert(b.end(), p.pad, 0);
  return b;
}

Bytes pattern(size_t n, uint32_t seed) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(seed * 131 + i * 17 + (i >> 8));
  return b;
}

struct Received {
  wire::Endpoint src, dst;
  uint8_t tos, ttl;
  Bytes data;
};

// Receives until `want` packets arrived or `timeout_ms` passed, sleeping in poll on poll_fd().
std::vector<Received> receive(UdpIo& io, size_t want, int timeout_ms = 5000) {
  std::vector<Received> got;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  RxPacket rx[48];
  while (got.size() < want && Clock::now() < deadline) {
    const uint32_t n = io.rx_burst(rx, 48);
    for (uint32_t i = 0; i < n; ++i) {
      got.push_back(
          Received{rx[i].src, rx[i].dst, rx[i].tos, rx[i].ttl, Bytes(rx[i].data, rx[i].data + rx[i].len)});
    }
    if (n == 0) {
      pollfd pfd{io.poll_fd(), POLLIN, 0};
      poll(&pfd, 1, 20);
    }
  }
  return got;
}

int default_ttl() {
  std::ifstream f("/proc/sys/net/ipv4/ip_default_ttl");
  int ttl = 64;
  f >> ttl;
  return ttl;
}

TEST(UdpIoTest, CreateAndPortErrors) {
  EXPECT_EQ(UdpIo::create(wire::Gid{}, nullptr).error(), EINVAL);
  auto a = make_peer("127.0.0.1");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->io->num_ports(), 1u);
  EXPECT_GE(a->io->poll_fd(), 0);
  auto again = a->io->open_port(a->ports[0]);
  ASSERT_FALSE(again.has_value());
  EXPECT_EQ(again.error(), EADDRINUSE);
  // A second object cannot take the port either (no SO_REUSEPORT: one socket per port).
  auto b = make_peer("127.0.0.1", 0);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->io->open_port(a->ports[0]).error(), EADDRINUSE);
  EXPECT_EQ(b->io->num_ports(), 0u);
}

// An MR's resident pages are read by the kernel once at registration (io/kernel_touch.h), the count in
// mr_pages_touched, from UdpIo::kTouchMinBytes on; SOFTRDMA_MR_TOUCH=0 (read at create) turns it off.
TEST(UdpIoTest, PublishMrHasTheKernelReadItsResidentPagesUnlessTurnedOff) {
  std::vector<uint8_t> buf(UdpIo::kTouchMinBytes + 100, 7);  // written: resident
  const MrInfo mr{1, 0, 1, 0, buf.size() - 100, reinterpret_cast<uint64_t>(buf.data() + 100)};
  auto p = make_peer("127.0.0.1");
  ASSERT_NE(p, nullptr);
  p->io->publish_mr(mr);
  // The pages from buf.data() + 100 to its end (one more when the vector's start falls mid-page).
  const uint64_t page = page_bytes();
  const uint64_t pages = (reinterpret_cast<uint64_t>(buf.data()) + buf.size() - 1) / page -
                         (reinterpret_cast<uint64_t>(buf.data()) + 100) / page + 1;
  EXPECT_EQ(count(*p, Counter::mr_pages_touched), pages);
  MrInfo small = mr;
  small.length = UdpIo::kTouchMinBytes - 1;
  p->io->publish_mr(small);
  EXPECT_EQ(count(*p, Counter::mr_pages_touched), pages) << "an MR under kTouchMinBytes was touched";

  setenv("SOFTRDMA_MR_TOUCH", "0", 1);
  auto off = make_peer("127.0.0.1");
  unsetenv("SOFTRDMA_MR_TOUCH");
  ASSERT_NE(off, nullptr);
  off->io->publish_mr(mr);
  EXPECT_EQ(count(*off, Counter::mr_pages_touched), 0u);
}

TEST(UdpIoTest, ExchangesBurstsWithEveryIovSplitAndPad) {
  auto a = make_peer("127.0.0.1");
  auto b = make_peer("127.0.0.1");
  ASSERT_TRUE(a && b);
  b->io->want_ip_fields();  // the TOS and TTL below as the kernel reports them

  const size_t sizes[] = {0, 1, 3, 7, 64, 1024, 4093, 4096};
  const uint32_t splits[] = {0, 1, 2, 3, kMaxPayloadIov};
  const uint32_t hdr_lens[] = {12, 28, 44};
  std::vector<Bytes> payloads;
  std::vector<TxPacket> pkts;
  payloads.reserve(200);
  pkts.reserve(200);
  uint32_t psn = 0;
  for (size_t size : sizes) {
    for (uint32_t split : splits) {
      if (split == 0 && size != 0) continue;
      if (split != 0 && size == 0 && split != 1) continue;
      payloads.push_back(pattern(size, psn));
      TxPacket& p = pkts.emplace_back();
      const auto pad = static_cast<uint8_t>(psn % 4);
      fill_header(p, psn, hdr_lens[psn % 3], pad);
      p.src = a->ep();
      p.dst = b->ep();
      attach(p, payloads.back(), split);
      p.pad = pad;
      ++psn;
    }
  }
  a->io->tx_burst(pkts);
  EXPECT_EQ(a->io->tx_dropped(), 0u);
  EXPECT_EQ(count(*a, Counter::tx_packets), pkts.size());

  const auto got = receive(*b->io, pkts.size());
  ASSERT_EQ(got.size(), pkts.size());
  uint64_t bytes = 0;
  for (size_t i = 0; i < pkts.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(got[i].data, expected_bytes(pkts[i]));
    EXPECT_EQ(got[i].src, a->ep());
    EXPECT_EQ(got[i].dst, b->ep());
    EXPECT_EQ(got[i].tos, 0);
    EXPECT_EQ(got[i].ttl, default_ttl());
    bytes += got[i].data.size() + wire::kIcrcLen;
  }
  EXPECT_EQ(count(*b, Counter::rx_packets), pkts.size());
  EXPECT_EQ(count(*b, Counter::rx_bytes), bytes);
  EXPECT_EQ(count(*a, Counter::tx_bytes), bytes);
  EXPECT_EQ(count(*b, Counter::drop_bad_icrc), 0u);
  EXPECT_EQ(count(*b, Counter::drop_truncated), 0u);
}

TEST(UdpIoTest, BurstOf200ArrivesComplete) {
  auto a = make_peer("127.0.0.1");
  auto b = make_peer("127.0.0.1");
  ASSERT_TRUE(a && b);
  const Bytes payload = pattern(1024, 9);
  std::vector<TxPacket> pkts(200);
  for (uint32_t i = 0; i < pkts.size(); ++i) {
    fill_header(pkts[i], i, 12, static_cast<uint8_t>(i & 3));
    pkts[i].src = a->ep();
    pkts[i].dst = b->ep();
    pkts[i].pad = static_cast<uint8_t>(i & 3);
    attach(pkts[i], payload, 1 + i % 4);
  }
  a->io->tx_burst(pkts);
  const auto got = receive(*b->io, pkts.size(), 10000);
  ASSERT_EQ(got.size(), pkts.size());
  for (uint32_t i = 0; i < got.size(); ++i) {
    ASSERT_GE(got[i].data.size(), 12u);
    EXPECT_EQ(wire::load_be24(got[i].data.data() + 9), i);
    EXPECT_EQ(got[i].data.size(), 12 + payload.size() + (i & 3));
  }
  EXPECT_EQ(count(*a, Counter::tx_packets), 200u);
  EXPECT_EQ(count(*b, Counter::rx_packets), 200u);
  EXPECT_EQ(count(*a, Counter::tx_bytes), count(*b, Counter::rx_bytes));
}

TEST(UdpIoTest, RxDrainedOnlyWhenTheSocketCameBackShort) {
  auto a = make_peer("127.0.0.1");
  auto b = make_peer("127.0.0.1");
  ASSERT_TRUE(a && b);
  EXPECT_FALSE(b->io->rx_drained());  // before any call: unsure
  // Five datagrams, queued at b when tx_burst returns (loopback).
  const Bytes payload = pattern(64, 5);
  std::vector<TxPacket> pkts = separate_datagrams(*a, *b, 5, payload);
  a->io->tx_burst(pkts);
  pollfd pfd{b->io->poll_fd(), POLLIN, 0};
  ASSERT_EQ(poll(&pfd, 1, 5000), 1);
  RxPacket rx[48];
  // Room for two: the receive call filled what it asked for, so more may wait.
  ASSERT_EQ(b->io->rx_burst(rx, 2), 2u);
  EXPECT_FALSE(b->io->rx_drained());
  // The other three in a call that asked for more: the queue is empty behind them.
  ASSERT_EQ(b->io->rx_burst(rx, 48), 3u);
  EXPECT_EQ(wire::load_be24(rx[2].data + 9), 4u);
  EXPECT_TRUE(b->io->rx_drained());
  EXPECT_EQ(b->io->rx_burst(rx, 48), 0u);
  EXPECT_TRUE(b->io->rx_drained());
  // Packets that came meanwhile are found by the next call all the same.
  a->io->tx_burst(std::span<TxPacket>(pkts.data(), 1));
  ASSERT_EQ(poll(&pfd, 1, 5000), 1);
  EXPECT_EQ(b->io->rx_burst(rx, 48), 1u);
  EXPECT_TRUE(b->io->rx_drained());
}

// A socket whose last receive found nothing is asked for one message (a second, empty receive inside the
// same call cost a ping-pong 0.15-0.23 us per half round trip), which counts as having emptied it. The
// next call asks for a full batch again.
TEST(UdpIoTest, AnIdleSocketIsAskedForOneMessage) {
  auto a = make_peer("127.0.0.1");
  auto b = make_peer("127.0.0.1");
  ASSERT_TRUE(a && b);
  RxPacket rx[48];
  EXPECT_EQ(b->io->rx_burst(rx, 48), 0u);  // idle
  const Bytes payload = pattern(64, 7);
  std::vector<TxPacket> pkts = separate_datagrams(*a, *b, 4, payload);
  a->io->tx_burst(pkts);
  pollfd pfd{b->io->poll_fd(), POLLIN, 0};
  ASSERT_EQ(poll(&pfd, 1, 5000), 1);
  ASSERT_EQ(b->io->rx_burst(rx, 48), 1u);
  EXPECT_EQ(wire::load_be24(rx[0].data + 9), 0u);
  EXPECT_TRUE(b->io->rx_drained());  // the guess
  // Not idle now: the other three in one call, which came back short.
  ASSERT_EQ(b->io->rx_burst(rx, 48), 3u);
  EXPECT_EQ(wire::load_be24(rx[2].data + 9), 3u);
  EXPECT_TRUE(b->io->rx_drained());
  EXPECT_EQ(b->io->rx_burst(rx, 48), 0u);
}

TEST(UdpIoTest, ManyPortsBothWays) {
  // Four receiving ports take rx_burst through epoll (more than kDirectRecvMaxSockets).
  auto a = make_peer("127.0.0.1", 2);
  auto b = make_peer("127.0.0.1", 4);
  ASSERT_TRUE(a && b);
  static_assert(UdpIo::kDirectRecvMaxSockets < 4);
  const Bytes payload = pattern(100, 3);
  std::vector<TxPacket> pkts(40);
  for (uint32_t i = 0; i < pkts.size(); ++i) {
    fill_header(pkts[i], i, 12, 0);
    pkts[i].src = a->ep((i / 3) % 2);  // runs of the same socket, then a switch
    pkts[i].dst = b->ep(i % 4);
    attach(pkts[i], payload, 1);
  }
  a->io->tx_burst(pkts);
  auto got = receive(*b->io, pkts.size());
  ASSERT_EQ(got.size(), pkts.size());
  std::vector<bool> seen(pkts.size());
  for (const auto& r : got) {
    const uint32_t psn = wire::load_be24(r.data.data() + 9);
    ASSERT_LT(psn, pkts.size());
    EXPECT_FALSE(seen[psn]);
    seen[psn] = true;
    EXPECT_EQ(r.src, pkts[psn].src);
    EXPECT_EQ(r.dst, pkts[psn].dst);
  }

  // And back, from b's ports to a's.
  for (uint32_t i = 0; i < 8; ++i) {
    std::swap(pkts[i].src, pkts[i].dst);
  }
  b->io->tx_burst(std::span<TxPacket>(pkts.data(), 8));
  got = receive(*a->io, 8);
  ASSERT_EQ(got.size(), 8u);
  EXPECT_EQ(count(*b, Counter::tx_packets), 8u);
}

TEST(UdpIoTest, PollFdSignalsData) {
  auto a = make_peer("127.0.0.1");
  auto b = make_peer("127.0.0.1");
  ASSERT_TRUE(a && b);
  pollfd pfd{b->io->poll_fd(), POLLIN, 0};
  EXPECT_EQ(poll(&pfd, 1, 0), 0);
  TxPacket p;
  fill_header(p, 5, 12, 0);
  p.src = a->ep();
  p.dst = b->ep();
  a->io->tx_burst(std::span<TxPacket>(&p, 1));
  EXPECT_EQ(poll(&pfd, 1, 2000), 1);
  EXPECT_EQ(receive(*b->io, 1).size(), 1u);
  EXPECT_EQ(poll(&pfd, 1, 0), 0);
}

// While the receiver naps, datagrams do not make poll_fd() readable (its sockets are out of epoll: no
// wake-up callbacks for their senders); arm_wakeup() brings them back, with what came meanwhile.
TEST(UdpIoTest, NapTakesTheSocketsOutOfPollFdUntilArmWakeup) {
  auto a = make_peer("127.0.0.1");
  auto b = make_peer("127.0.0.1");
  ASSERT_TRUE(a && b);
  pollfd pfd{b->io->poll_fd(), POLLIN, 0};
  auto send_one = [&](uint32_t psn, const wire::Endpoint& dst) {
    TxPacket p;
    fill_header(p, psn, 12, 0);
    p.src = a->ep();
    p.dst = dst;
    a->io->tx_burst(std::span<TxPacket>(&p, 1));
  };
  b->io->nap();
  b->io->nap();  // twice is once
  send_one(1, b->ep());
  EXPECT_EQ(poll(&pfd, 1, 100), 0);
  // A port opened during the nap stays out too.
  auto late = b->io->open_port(0);
  ASSERT_TRUE(late.has_value());
  send_one(2, wire::Endpoint{b->io->local_addr(), *late});
  EXPECT_EQ(poll(&pfd, 1, 100), 0);
  // rx_burst still reads them (the application receives during a nap).
  EXPECT_EQ(receive(*b->io, 2).size(), 2u);

  send_one(3, b->ep());
  send_one(4, wire::Endpoint{b->io->local_addr(), *late});
  EXPECT_EQ(poll(&pfd, 1, 100), 0);
  EXPECT_FALSE(b->io->arm_wakeup());  // epoll itself reports what is queued
  EXPECT_EQ(poll(&pfd, 1, 2000), 1);
  EXPECT_EQ(receive(*b->io, 2).size(), 2u);
  EXPECT_EQ(poll(&pfd, 1, 0), 0);
  send_one(5, wire::Endpoint{b->io->local_addr(), *late});
  EXPECT_EQ(poll(&pfd, 1, 2000), 1);
  EXPECT_EQ(receive(*b->io, 1).size(), 1u);
}

// A receiver that woke reads the sockets itself until it sleeps again: woke() takes them out of poll_fd()
// (no wake-up callbacks for their senders meanwhile), the next arm_wakeup() brings them back.
TEST(UdpIoTest, WokeTakesTheSocketsOutOfPollFdUntilArmWakeup) {
  auto a = make_peer("127.0.0.1");
  auto b = make_peer("127.0.0.1");
  ASSERT_TRUE(a && b);
  pollfd pfd{b->io->poll_fd(), POLLIN, 0};
  auto send_one = [&](uint32_t psn) {
    TxPacket p;
    fill_header(p, psn, 12, 0);
    p.src = a->ep();
    p.dst = b->ep();
    a->io->tx_burst(std::span<TxPacket>(&p, 1));
  };
  EXPECT_FALSE(b->io->arm_wakeup());
  send_one(1);
  EXPECT_EQ(poll(&pfd, 1, 2000), 1);
  b->io->woke();
  EXPECT_EQ(poll(&pfd, 1, 100), 0);  // the datagram is still queued, but the socket is out
  send_one(2);
  EXPECT_EQ(poll(&pfd, 1, 100), 0);
  EXPECT_EQ(receive(*b->io, 2).size(), 2u);
  send_one(3);
  EXPECT_FALSE(b->io->arm_wakeup());  // epoll itself reports what is queued
  EXPECT_EQ(poll(&pfd, 1, 2000), 1);
  EXPECT_EQ(receive(*b->io, 1).size(), 1u);
  EXPECT_EQ(poll(&pfd, 1, 0), 0);
  send_one(4);
  EXPECT_EQ(poll(&pfd, 1, 2000), 1);
  EXPECT_EQ(receive(*b->io, 1).size(), 1u);
}

// With more sockets than rx_burst tries one by one, they stay in epoll through a nap: rx_burst asks it.
TEST(UdpIoTest, ManySocketsStayInPollFdThroughANap) {
  auto a = make_peer("127.0.0.1");
  auto b = make_peer("127.0.0.1", UdpIo::kDirectRecvMaxSockets + 1);
  ASSERT_TRUE(a && b);
  b->io->nap();
  TxPacket p;
  fill_header(p, 7, 12, 0);
  p.src = a->ep();
  p.dst = b->ep(UdpIo::kDirectRecvMaxSockets);
  a->io->tx_burst(std::span<TxPacket>(&p, 1));
  pollfd pfd{b->io->poll_fd(), POLLIN, 0};
  EXPECT_EQ(poll(&pfd, 1, 2000), 1);
  EXPECT_EQ(receive(*b->io, 1, 200).size(), 1u);
}

TEST(UdpIoTest, TxDropsWhatItCannotSend) {
  auto a = make_peer("127.0.0.1", 2);
  auto b = make_peer("127.0.0.1");
  ASSERT_TRUE(a && b);
  TxPacket p[4];
  for (auto& q : p) {
    fill_header(q, 1, 12, 0);
    q.src = a->ep();
    q.dst = b->ep();
  }
  p[0].src.port = static_cast<uint16_t>(a->ports[0] ^ a->ports[1] ^ 1);  // no such socket
  p[1].dst.addr = addr("::1");                                           // IPv6 peer from an IPv4 socket
  p[2].hdr_len = 8;                                                      // shorter than a BTH
  a->io->tx_burst(p);
  EXPECT_EQ(a->io->tx_dropped(), 3u);
  EXPECT_EQ(count(*a, Counter::tx_packets), 1u);
  EXPECT_EQ(receive(*b->io, 1).size(), 1u);

  // A packet that claims more payload pieces than a packet holds is dropped; the one before it is sent,
  // and nothing reads past the burst (ASan: the claim reaches past this exactly sized array).
  auto two = std::make_unique<TxPacket[]>(2);
  for (uint32_t k = 0; k < 2; ++k) {
    fill_header(two[k], 2 + k, 12, 0);
    two[k].src = a->ep();
    two[k].dst = b->ep();
  }
  two[1].n_iov = kMaxPayloadIov + 1;
  a->io->tx_burst(std::span<TxPacket>(two.get(), 2));
  EXPECT_EQ(a->io->tx_dropped(), 4u);
  EXPECT_EQ(count(*a, Counter::tx_packets), 2u);
  EXPECT_EQ(receive(*b->io, 1).size(), 1u);

  // A closed port sends nothing.
  a->io->close_port(a->ports[1]);
  EXPECT_EQ(a->io->num_ports(), 1u);
  p[3].src = a->ep(1);
  a->io->tx_burst(std::span<TxPacket>(&p[3], 1));
  EXPECT_EQ(a->io->tx_dropped(), 5u);
}

// A plain UDP socket on 127.0.0.1 with DF (as the ICRC assumes), to send hand-made datagrams; with a TOS
// and TTL of its own when given.
class RawSender {
 public:
  explicit RawSender(int tos = -1, int ttl = -1) {
    fd_ = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int pmtu = IP_PMTUDISC_DO;
    setsockopt(fd_, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
    if (tos >= 0) {
      EXPECT_EQ(setsockopt(fd_, IPPROTO_IP, IP_TOS, &tos, sizeof tos), 0);
    }
    if (ttl >= 0) {
      EXPECT_EQ(setsockopt(fd_, IPPROTO_IP, IP_TTL, &ttl, sizeof ttl), 0);
    }
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&sin), sizeof sin), 0);
    socklen_t len = sizeof sin;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&sin), &len);
    port_ = ntohs(sin.sin_port);
  }
  ~RawSender() { close(fd_); }
  wire::Endpoint ep() const { return wire::Endpoint{addr("127.0.0.1"), port_}; }

  void send(const wire::Endpoint& dst, const Bytes& b) {
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_port = htons(dst.port);
    sin.sin_addr.s_addr = dst.addr.v4_be();
    ASSERT_EQ(sendto(fd_, b.data(), b.size(), 0, reinterpret_cast<sockaddr*>(&sin), sizeof sin),
              static_cast<ssize_t>(b.size()));
  }
  // BTH + payload + correct ICRC as sent from this socket to `dst`.
  Bytes packet(const wire::Endpoint& dst, uint32_t psn, size_t payload) const {
    TxPacket p;
    fill_header(p, psn, 12, 0);
    Bytes b(p.hdr, p.hdr + 12);
    const Bytes pl = pattern(payload, psn);
    b.insert(b.end(), pl.begin(), pl.end());
    const uint32_t icrc = wire::icrc_for_udp(ep(), dst, std::span<const uint8_t>(b));
    b.resize(b.size() + 4);
    wire::store_icrc(b.data() + b.size() - 4, icrc);
    return b;
  }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

// TOS and TTL (a UD receive's GRH) are asked of the sockets once a UD QP wants them, on the ports open then
// and on those opened later; before, a packet says TOS 0 and TTL 64.
TEST(UdpIoTest, TosAndTtlAreReportedOnceWanted) {
  auto b = make_peer("127.0.0.1");
  ASSERT_TRUE(b);
  RawSender raw(0xb8, 9);
  raw.send(b->ep(), raw.packet(b->ep(), 1, 8));
  auto got = receive(*b->io, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].src, raw.ep());
  EXPECT_EQ(got[0].tos, 0);
  EXPECT_EQ(got[0].ttl, 64);
  b->io->want_ip_fields();
  auto later = b->io->open_port(0);
  ASSERT_TRUE(later.has_value());
  b->ports.push_back(*later);
  for (size_t i = 0; i < 2; ++i) {
    raw.send(b->ep(i), raw.packet(b->ep(i), 2, 8));
    got = receive(*b->io, 1);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].dst, b->ep(i));
    EXPECT_EQ(got[0].tos, 0xb8);
    EXPECT_EQ(got[0].ttl, 9);
  }
  EXPECT_EQ(count(*b, Counter::drop_bad_icrc), 0u);
}

TEST(UdpIoTest, DropsBadIcrcAndTruncated) {
  auto b = make_peer("127.0.0.1");
  ASSERT_TRUE(b);
  RawSender s;
  const wire::Endpoint dst = b->ep();

  const Bytes good = s.packet(dst, 1, 32);
  Bytes bad_payload = good;
  bad_payload[20] ^= 0x01;
  Bytes bad_icrc = good;
  bad_icrc.back() ^= 0x80;
  Bytes bad_psn = good;
  bad_psn[11] ^= 0x01;
  Bytes fecn = good;  // FECN/BECN are masked out of the ICRC: still valid
  fecn[4] |= 0xC0;
  const Bytes tiny(11, 0xAB);
  const Bytes bth_no_icrc(good.begin(), good.begin() + 15);
  const Bytes minimal = s.packet(dst, 2, 0);  // BTH + ICRC: 16 bytes, the smallest valid packet

  for (const Bytes* b2 : std::initializer_list<const Bytes*>{&bad_payload, &tiny, &bad_icrc, &bth_no_icrc,
                                                             &bad_psn, &good, &fecn, &minimal}) {
    s.send(dst, *b2);
  }
  const auto got = receive(*b->io, 3);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].data, Bytes(good.begin(), good.end() - 4));
  EXPECT_EQ(got[0].src, s.ep());
  EXPECT_EQ(got[1].data, Bytes(fecn.begin(), fecn.end() - 4));
  EXPECT_EQ(got[2].data.size(), 12u);
  EXPECT_EQ(count(*b, Counter::drop_bad_icrc), 3u);
  EXPECT_EQ(count(*b, Counter::drop_truncated), 2u);
  // (No datagram is too large any more: a receive buffer holds the largest one UDP allows.)
  EXPECT_EQ(b->io->rx_oversize(), 0u);
  EXPECT_EQ(count(*b, Counter::rx_packets), 3u);
}

// Datagrams the kernel drops because nobody read the socket in time are counted (SO_RXQ_OVFL): whatever
// was sent either arrived or shows up in drop_socket_full.
TEST(UdpIoTest, CountsWhatTheKernelDroppedForAFullSocket) {
  auto b = make_peer("127.0.0.1");
  ASSERT_TRUE(b);
  RawSender s;
  const wire::Endpoint dst = b->ep();
  const Bytes pkt = s.packet(dst, 7, 1024);
  // Far more than the receive buffer holds: 2.5 times the most it can (the kernel's doubled
  // UdpIo::kRcvBufBytes, in buffers of 2 KiB or more).
  constexpr size_t kHeldAtMost = 2 * size_t{UdpIo::kRcvBufBytes} / 2048;
  constexpr size_t kSent = kHeldAtMost * 5 / 2;
  for (size_t i = 0; i < kSent; ++i) s.send(dst, pkt);
  size_t got = 0;
  for (;;) {
    const size_t n = receive(*b->io, kSent - got, 200).size();
    if (n == 0) break;
    got += n;
  }
  // The count is read after a receive call that filled its batch (the drain's first), so one more datagram
  // changes nothing.
  s.send(dst, pkt);
  got += receive(*b->io, 1).size();
  const uint64_t dropped = count(*b, Counter::drop_socket_full);
  EXPECT_GT(dropped, 0u);
  EXPECT_EQ(got + dropped, kSent + 1);
  EXPECT_EQ(count(*b, Counter::rx_packets), got);
}

// What an RC QP keeps in flight towards a socket peer at most (UdpIo::inflight_cap): half the receive
// buffer the kernel gave the sockets (it reports twice what it was asked for). As root, the kRcvBufBytes
// asked for; without CAP_NET_ADMIN, net.core.rmem_max where that is less (when the test runs as root, a
// child that became nobody shows it).
uint64_t expected_cap(bool privileged) {
  uint64_t rmem_max = 0;
  std::ifstream("/proc/sys/net/core/rmem_max") >> rmem_max;
  const uint64_t asked = UdpIo::kRcvBufBytes;
  return privileged ? asked : std::min(asked, rmem_max);
}

TEST(UdpIoTest, InflightCapIsHalfTheSocketsReceiveBuffer) {
  auto a = make_peer("127.0.0.1", 0);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->io->inflight_cap(wire::Endpoint{}), 0u) << "no socket yet: no bound known";
  ASSERT_TRUE(a->io->open_port(0));
  const bool root = geteuid() == 0;
  EXPECT_EQ(a->io->inflight_cap(wire::Endpoint{}), expected_cap(root));
  if (!root) return;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0) _exit(2);
    auto io = UdpIo::create(addr("127.0.0.1"), nullptr);
    if (!io || !(*io)->open_port(0)) _exit(3);
    _exit((*io)->inflight_cap(wire::Endpoint{}) == expected_cap(false) ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "1: another cap than rmem_max's; 2, 3: could not become nobody or open";
}

// The receive ring is faulted in (and read by the kernel) at open_port, not by the first bursts it
// receives (map_rx_ring): the process's anonymous resident memory grows by the ring's 2 MiB there.
TEST(UdpIoTest, TheReceiveRingIsResidentOnceThePortIsOpen) {
  auto rss_anon_kib = [] {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line))
      if (line.rfind("RssAnon:", 0) == 0) return std::stol(line.substr(8));
    return -1L;
  };
  auto a = make_peer("127.0.0.1", 0);
  ASSERT_TRUE(a);
  const long before = rss_anon_kib();
  ASSERT_GE(before, 0);
  ASSERT_TRUE(a->io->open_port(0));
  EXPECT_GE(rss_anon_kib() - before, long{UdpIo::kRxBatch * UdpIo::kRxBufSize / 1024});
}

// The ICRC is computed before sendmsg assuming what Linux puts in the IP header (ID 0, DF); check that on
// the packet as it crosses lo, captured with a raw socket and checked by the IP-packet ICRC routine.
TEST(UdpIoTest, KernelHeadersMatchTheIcrc) {
  const int raw = socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, IPPROTO_UDP);
  if (raw < 0) GTEST_SKIP() << "no raw socket: " << std::strerror(errno);
  // The raw socket sees every UDP datagram of the host: room for what tests running beside this one send.
  const int big = 16 << 20;
  if (setsockopt(raw, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof big) != 0)
    setsockopt(raw, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
  auto a = make_peer("127.0.0.1");
  auto b = make_peer("127.0.0.1");
  ASSERT_TRUE(a && b);
  const Bytes payload = pattern(1000, 77);
  TxPacket p[2];
  for (uint32_t i = 0; i < 2; ++i) {
    fill_header(p[i], 0x123456 + i, 28, static_cast<uint8_t>(i * 3));
    p[i].pad = static_cast<uint8_t>(i * 3);
    p[i].src = a->ep();
    p[i].dst = b->ep();
    attach(p[i], payload, 3);
  }
  // Each packet checked once; the burst is sent again (at most 5 times) if the capture missed one under
  // load.
  bool checked[2] = {false, false};
  uint32_t sent = 0;
  uint8_t buf[65536];
  for (int attempt = 0; attempt < 5 && !(checked[0] && checked[1]); ++attempt) {
    a->io->tx_burst(p);
    sent += 2;
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    while (!(checked[0] && checked[1]) && Clock::now() < deadline) {
      pollfd pfd{raw, POLLIN, 0};
      poll(&pfd, 1, 50);
      const ssize_t n = recv(raw, buf, sizeof buf, 0);
      if (n < 20 + 8) continue;
      const size_t ihl = (buf[0] & 0xF) * 4u;
      if (wire::load_be16(buf + ihl) != a->ports[0] || wire::load_be16(buf + ihl + 2) != b->ports[0]) continue;
      const uint32_t k = wire::load_be24(buf + ihl + 8 + 9) - 0x123456;
      ASSERT_LT(k, 2u);
      if (checked[k]) continue;
      SCOPED_TRACE(k);
      EXPECT_EQ(ihl, 20u);
      EXPECT_EQ(wire::load_be16(buf + 4), 0) << "IP ID";
      EXPECT_EQ(wire::load_be16(buf + 6), 0x4000) << "DF, no fragment";
      const auto ip = std::span<const uint8_t>(buf, static_cast<size_t>(n));
      EXPECT_EQ(wire::icrc_of_ip_packet(ip.first(ip.size() - 4)), wire::load_icrc(buf + n - 4));
      const Bytes want = expected_bytes(p[k]);
      EXPECT_EQ(Bytes(buf + ihl + 8, buf + n - 4), want);
      checked[k] = true;
    }
  }
  close(raw);
  EXPECT_TRUE(checked[0] && checked[1]);
  EXPECT_GE(receive(*b->io, sent).size(), 2u);
}

// Linux's rxe numbers its packets' IPv4 IDs (the reference capture's run 0x06da.., 0xa967..), and the
// ICRC covers the ID: at the standard port any ID is accepted, found from the ICRC; at softrdma's own
// ports only its IDs (0 .. kMaxGsoSegments - 1), and the rest is dropped and counted. The packets are
// built whole (IPv4 header with the ID, UDP checksum 0 as rxe sends) and sent on a raw socket.
TEST(UdpIoTest, AtTheStandardPortAnyIpIdIsAccepted) {
  const int raw = socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW);  // IPPROTO_RAW: IP_HDRINCL
  if (raw < 0) GTEST_SKIP() << "no raw socket: " << std::strerror(errno);
  // An address of its own in 127/8, so that a context of another test at 127.0.0.1:4791 does not meet it.
  const char* const local = "127.0.0.77";
  auto std_port = std::make_unique<Peer>();
  auto io = UdpIo::create(addr(local), &std_port->counters);
  ASSERT_TRUE(io);
  std_port->io = std::move(*io);
  auto bound = std_port->io->open_port(wire::kRoceV2Port);
  if (!bound && bound.error() == EADDRINUSE) {
    close(raw);
    GTEST_SKIP() << local << ":4791 is taken on this host";
  }
  ASSERT_TRUE(bound) << std::strerror(bound.error());
  std_port->ports.push_back(*bound);
  auto own = make_peer(local);
  ASSERT_TRUE(own);
  const wire::Endpoint from{addr("127.0.0.78"), 49458};
  const Bytes payload = pattern(1024, 9);
  TxPacket p;
  fill_header(p, 77, 12, 0);
  Bytes body(p.hdr, p.hdr + p.hdr_len);
  body.insert(body.end(), payload.begin(), payload.end());
  const uint16_t ids[] = {0, 5, 0x06DA, 0xA967, 0xFFFF};
  auto send_to = [&](const wire::Endpoint& to, uint16_t id) {
    Bytes udp_payload = body;
    udp_payload.resize(body.size() + wire::kIcrcLen);
    testutil::FrameOptions opt;
    opt.ip_id = id;
    opt.udp_checksum = 0;
    auto frame = testutil::build_frame(from, to, udp_payload, opt);
    const std::span<uint8_t> ip = std::span<uint8_t>(frame).subspan(14);  // past the Ethernet header
    wire::store_icrc(ip.data() + ip.size() - wire::kIcrcLen,
                     wire::icrc_of_ip_packet(ip.first(ip.size() - wire::kIcrcLen)));
    sockaddr_in dst{};
    dst.sin_family = AF_INET;
    dst.sin_port = htons(to.port);
    inet_pton(AF_INET, local, &dst.sin_addr);
    ASSERT_EQ(sendto(raw, ip.data(), ip.size(), 0, reinterpret_cast<const sockaddr*>(&dst), sizeof dst),
              static_cast<ssize_t>(ip.size()))
        << std::strerror(errno);
  };
  for (uint16_t id : ids) send_to(std_port->ep(), id);
  for (uint16_t id : ids) send_to(own->ep(), id);
  close(raw);
  const auto got = receive(*std_port->io, std::size(ids));
  ASSERT_EQ(got.size(), std::size(ids));
  for (const Received& r : got) {
    EXPECT_EQ(r.data, body);
    EXPECT_EQ(r.src, from);
  }
  EXPECT_EQ(count(*std_port, Counter::drop_bad_icrc), 0u);
  // softrdma's own port: IDs 0 and 5 pass, the three others are dropped as corrupt.
  EXPECT_EQ(receive(*own->io, 2).size(), 2u);
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (count(*own, Counter::drop_bad_icrc) < 3 && Clock::now() < deadline) receive(*own->io, 1, 20);
  EXPECT_EQ(count(*own, Counter::drop_bad_icrc), 3u);
}

TEST(UdpIoTest, Ipv6Loopback) {
  auto probe = UdpIo::create(addr("::1"), nullptr);
  ASSERT_TRUE(probe.has_value());
  if (!(*probe)->open_port(0)) GTEST_SKIP() << "::1 not available";
  auto a = make_peer("::1");
  auto b = make_peer("::1");
  ASSERT_TRUE(a && b);
  const Bytes payload = pattern(333, 1);
  std::vector<TxPacket> pkts(4);
  for (uint32_t i = 0; i < pkts.size(); ++i) {
    fill_header(pkts[i], i, 12, static_cast<uint8_t>(i));
    pkts[i].pad = static_cast<uint8_t>(i);
    pkts[i].src = a->ep();
    pkts[i].dst = b->ep();
    attach(pkts[i], payload, i + 1);
  }
  a->io->tx_burst(pkts);
  const auto got = receive(*b->io, pkts.size());
  ASSERT_EQ(got.size(), pkts.size());
  for (uint32_t i = 0; i < pkts.size(); ++i) {
    EXPECT_EQ(got[i].data, expected_bytes(pkts[i]));
    EXPECT_EQ(got[i].src, a->ep());
    EXPECT_EQ(got[i].dst, b->ep());
    EXPECT_EQ(got[i].dst.addr.to_string(), "::1");
  }
  EXPECT_EQ(count(*b, Counter::drop_bad_icrc), 0u);
}

}  // namespace
}  // namespace softrdma::io

namespace softrdma::io {
namespace {

// A sender with SOFTRDMA_GSO=1 (read when the UdpIo is created).
std::unique_ptr<Peer> make_gso_peer(const char* local) {
  setenv("SOFTRDMA_GSO", "1", 1);
  auto p = make_peer(local);
  unsetenv("SOFTRDMA_GSO");
  return p;
}

// 40 full-size packets and a shorter last one to one destination go out as GSO messages; the receiver
// (UDP_GRO) splits the coalesced runs and checks each packet's ICRC with the ID its segment carried.
TEST(UdpIoTest, GsoRunsArriveAsPackets) {
  auto a = make_gso_peer("127.0.0.1");
  auto b = make_peer("127.0.0.1");
  ASSERT_TRUE(a && b);
  const Bytes full = pattern(4096, 3), tail = pattern(1000, 4);
  std::vector<TxPacket> pkts(41);
  // More than a sending thread's stage holds: the first messages go laid out whole, the rest in pieces.
  static_assert(40 * (28 + 4096 + wire::kIcrcLen) > UdpIo::kTxStageBytes);
  for (uint32_t i = 0; i < pkts.size(); ++i) {
    fill_header(pkts[i], i, 28, 0);
    pkts[i].src = a->ep();
    pkts[i].dst = b->ep();
    attach(pkts[i], i + 1 == pkts.size() ? tail : full, 1 + i % 3);
  }
  a->io->tx_burst(pkts);
  const auto got = receive(*b->io, pkts.size(), 10000);
  ASSERT_EQ(got.size(), pkts.size());
  for (uint32_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].data, expected_bytes(pkts[i])) << i;
  EXPECT_EQ(count(*b, Counter::drop_bad_icrc), 0u);
  EXPECT_EQ(count(*a, Counter::tx_packets), 41u);
  EXPECT_EQ(count(*b, Counter::rx_packets), 41u);
}

// tx_burst_some keeps back a GSO message at the end that could take more packets of its size when another
// goes before it (TxBatch passes the rest again): 32 packets of 4 KiB are 15 + 15 + 2, and the 2 stay.
TEST(UdpIoTest, TxBurstSomeKeepsBackAnOpenGsoMessageAtTheEnd) {
  auto a = make_gso_peer("127.0.0.1");
  auto b = make_peer("127.0.0.1");
  ASSERT_TRUE(a && b);
  const Bytes full = pattern(4096, 6), small = pattern(8, 7);
  auto make = [&](uint32_t n, const Bytes& payload) {
    std::vector<TxPacket> pkts(n);
    for (uint32_t i = 0; i < n; ++i) {
      fill_header(pkts[i], i, 28, 0);
      pkts[i].src = a->ep();
      pkts[i].dst = b->ep();
      attach(pkts[i], payload, 1);
    }
    return pkts;
  };
  auto pkts = make(32, full);
  EXPECT_EQ(a->io->tx_burst_some(pkts), 30u);
  auto got = receive(*b->io, 32, 300);
  ASSERT_EQ(got.size(), 30u);
  for (uint32_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].data, expected_bytes(pkts[i])) << i;
  // The two, passed again with more: 15 + 15, both full: all go.
  std::vector<TxPacket> rest(pkts.begin() + 30, pkts.end());
  for (const TxPacket& p : make(28, full)) rest.push_back(p);
  EXPECT_EQ(a->io->tx_burst_some(rest), 30u);
  EXPECT_EQ(receive(*b->io, 30).size(), 30u);
  // One message alone is sent, open or not; so are small packets (one message of 32).
  auto ten = make(10, full);
  EXPECT_EQ(a->io->tx_burst_some(ten), 10u);
  auto tiny = make(32, small);
  EXPECT_EQ(a->io->tx_burst_some(tiny), 32u);
  EXPECT_EQ(receive(*b->io, 42).size(), 42u);
  // tx_burst sends everything.
  auto all = make(32, full);
  a->io->tx_burst(all);
  EXPECT_EQ(receive(*b->io, 32).size(), 32u);
  EXPECT_EQ(count(*b, Counter::drop_bad_icrc), 0u);
}

// A buffer that holds fewer coalesced datagrams than a receive call asks for (as one capped by rmem_max
// does) never fills a call's batch: its drops are counted when the burst ends. (The kernel counts each
// dropped coalesced datagram once, whatever number of packets it held.)
TEST(UdpIoTest, CountsDropsOfASmallBufferWhenTheBurstEnds) {
  auto a = make_gso_peer("127.0.0.1");
  auto b = make_peer("127.0.0.1");
  ASSERT_TRUE(a && b);
  b->io->set_rcvbuf_for_test(64 << 10);  // 128 KiB: two or three 60 KiB datagrams
  const Bytes full = pattern(4096, 5);
  std::vector<TxPacket> pkts(300);
  for (uint32_t i = 0; i < pkts.size(); ++i) {
    fill_header(pkts[i], i, 28, 0);
    pkts[i].src = a->ep();
    pkts[i].dst = b->ep();
    attach(pkts[i], full, 1);
  }
  a->io->tx_burst(pkts);
  const size_t got = receive(*b->io, pkts.size(), 300).size();
  EXPECT_LT(got, pkts.size());
  EXPECT_GT(count(*b, Counter::drop_socket_full), 0u);
  EXPECT_EQ(count(*b, Counter::rx_packets), got);
}

// When the kernel splits a GSO send itself (a receiving socket without UDP_GRO), the k-th datagram
// carries IPv4 ID k: the ICRC a softrdma sender put in it must check with that ID. Proves the rule the
// sender's ICRC relies on against the real kernel.
TEST(UdpIoTest, KernelSplitGsoSegmentsCarryIdK) {
  auto a = make_gso_peer("127.0.0.1");
  ASSERT_TRUE(a);
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&sin), sizeof sin), 0);
  socklen_t sl = sizeof sin;
  getsockname(fd, reinterpret_cast<sockaddr*>(&sin), &sl);
  const wire::Endpoint dst{addr("127.0.0.1"), ntohs(sin.sin_port)};
  const Bytes full = pattern(2048, 5);
  std::vector<TxPacket> pkts(8);
  for (uint32_t i = 0; i < pkts.size(); ++i) {
    fill_header(pkts[i], i, 12, 0);
    pkts[i].src = a->ep();
    pkts[i].dst = dst;
    attach(pkts[i], full, 1);
  }
  a->io->tx_burst(pkts);
  for (uint32_t k = 0; k < pkts.size(); ++k) {
    uint8_t buf[4200];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    ASSERT_EQ(n, static_cast<ssize_t>(12 + 2048 + 4));
    const std::span<const uint8_t> body(buf, static_cast<size_t>(n) - 4);
    EXPECT_EQ(wire::icrc_for_udp(a->ep(), dst, body, static_cast<uint16_t>(k)), wire::load_icrc(buf + n - 4))
        << "segment " << k;
    EXPECT_EQ(wire::icrc_check_any_id(a->ep(), dst, body, wire::load_icrc(buf + n - 4), 63),
              static_cast<int>(k));
  }
  close(fd);
}

}  // namespace
}  // namespace softrdma::io
