// The same-host path (io/shm): the ring on its own, discovery (namespaces, dead peers), and the backend
// between two contexts as the UDP tests drive theirs.
#include "io/shm/shm_io.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "io/clock.h"
#include "io/sys.h"
#include "wire/headers.h"

namespace softrdma::io {
namespace {

using Clock = std::chrono::steady_clock;

// A directory of its own per test, so that tests running in parallel (and the machine's real contexts)
// never see each other's files.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/dev/shm/softrdma-shm-test.XXXXXX";
    path = mkdtemp(tmpl) ? tmpl : "";
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  size_t files() const {
    size_t n = 0;
    for (auto& e : std::filesystem::directory_iterator(path)) n += e.is_regular_file();
    return n;
  }
};

wire::Gid loopback() { return wire::Gid::from_v4(htonl(0x7F000001)); }

struct Side {
  Counters counters;
  std::unique_ptr<ShmIo> io;
  uint16_t port = 0;
  wire::Endpoint ep() const { return {io->local_addr(), port}; }
};

std::unique_ptr<Side> make_side(const std::string& dir, uint64_t netns = 0, uint32_t slots = 64,
                                bool prewarm = true, const wire::Gid& addr = loopback()) {
  auto s = std::make_unique<Side>();
  auto udp = UdpIo::create(addr, &s->counters);
  if (!udp) return nullptr;
  ShmIo::Config cfg;
  cfg.dir = dir;
  cfg.ring_slots = slots;
  cfg.netns = netns;
  cfg.prewarm = prewarm;
  auto io = ShmIo::create(std::move(*udp), &s->counters, cfg);
  if (!io) return nullptr;
  s->io = std::move(*io);
  auto port = s->io->open_port(0);
  if (!port) return nullptr;
  s->port = *port;
  return s;
}

// A side made with `var`=`value` in the environment (read when its backend is created).
std::unique_ptr<Side> make_side_with(const std::string& dir, const char* var, const char* value) {
  setenv(var, value, 1);
  auto s = make_side(dir);
  unsetenv(var);
  return s;
}

// An RC SEND_ONLY to QP 0x111 with `psn`, the payload in two pieces and `pad` pad bytes.
void make_packet(TxPacket& p, const Side& from, const wire::Endpoint& to, uint32_t psn,
                 const std::vector<uint8_t>& payload, uint8_t pad = 0) {
  std::memset(p.hdr, 0, sizeof p.hdr);
  p.hdr[0] = 0x04;
  p.hdr[1] = static_cast<uint8_t>(pad << 4);
  wire::store_be16(p.hdr + 2, 0xFFFF);
  wire::store_be24(p.hdr + 5, 0x000111);
  wire::store_be24(p.hdr + 9, psn);
  p.hdr_len = wire::kBthLen;
  p.src = from.ep();
  p.dst = to;
  p.pad = pad;
  const size_t half = payload.size() / 2;
  p.n_iov = 2;
  p.iov[0] = iovec{const_cast<uint8_t*>(payload.data()), half};
  p.iov[1] = iovec{const_cast<uint8_t*>(payload.data()) + half, payload.size() - half};
  p.payload_len = static_cast<uint32_t>(payload.size());
}

// Receives until `want` packets came or `ms` passed; returns copies of them.
std::vector<std::vector<uint8_t>> receive(Side& s, size_t want, int ms = 2000,
                                          std::vector<wire::Endpoint>* srcs = nullptr,
                                          std::vector<uint8_t>* flags = nullptr, uint32_t room = 32) {
  std::vector<std::vector<uint8_t>> got;
  const auto end = Clock::now() + std::chrono::milliseconds(ms);
  RxPacket pkts[32];
  room = std::min<uint32_t>(room, 32);
  while (got.size() < want && Clock::now() < end) {
    const uint32_t n = s.io->rx_burst(pkts, room);
    for (uint32_t i = 0; i < n; ++i) {
      got.emplace_back(pkts[i].data, pkts[i].data + pkts[i].len);
      if (srcs) srcs->push_back(pkts[i].src);
      if (flags) flags->push_back(pkts[i].flags);
    }
    if (n == 0) std::this_thread::yield();
  }
  return got;
}

// An initialized ring of `slots` in `mem` (sized and aligned here).
shm::Ring ring_in(std::vector<uint8_t>& mem, uint32_t slots) {
  mem.assign(shm::ring_bytes(slots) + 64, 0);
  void* base = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(mem.data()) + 63) & ~uintptr_t{63});
  shm::Ring ring(base, slots);
  ring.init();
  return ring;
}

TEST(ShmRing, FifoAcrossLapsAndFullWhenConsumerLags) {
  constexpr uint32_t kSlots = 8;
  std::vector<uint8_t> mem;
  shm::Ring ring = ring_in(mem, kSlots);
  uint64_t head = 0;
  for (uint32_t lap = 0; lap < 3; ++lap) {
    for (uint32_t i = 0; i < kSlots; ++i) {
      uint64_t pos;
      shm::Slot* s = ring.claim(&pos);
      ASSERT_NE(s, nullptr);
      EXPECT_EQ(pos, uint64_t{lap} * kSlots + i);
      s->len = static_cast<uint32_t>(pos);
      shm::Ring::publish(s, pos);
    }
    uint64_t pos;
    EXPECT_EQ(ring.claim(&pos), nullptr) << "full: the consumer has not freed the previous lap";
    for (uint32_t i = 0; i < kSlots; ++i) {
      shm::Slot* s = ring.peek(head);
      ASSERT_NE(s, nullptr);
      EXPECT_EQ(s->len, head);
      ring.release(head++);
    }
    EXPECT_EQ(ring.peek(head), nullptr);
  }
}

// The consumer's touch (a warm-up of every slot's page when it starts reading a ring) changes nothing: a
// half-full ring reads and fills on as before, across laps.
TEST(ShmRing, TouchLeavesTheRingAsItWas) {
  constexpr uint32_t kSlots = 8;
  std::vector<uint8_t> mem;
  shm::Ring ring = ring_in(mem, kSlots);
  uint64_t pos;
  for (uint32_t i = 0; i < 5; ++i) {
    shm::Slot* s = ring.claim(&pos);
    ASSERT_NE(s, nullptr);
    s->len = 100 + i;
    shm::Ring::publish(s, pos);
  }
  ring.release(0);  // the consumer read one
  ring.touch(page_bytes());
  ring.touch(page_bytes());
  uint64_t head = 1;
  for (uint32_t i = 1; i < 5; ++i, ++head) {
    shm::Slot* s = ring.peek(head);
    ASSERT_NE(s, nullptr) << "slot " << head;
    EXPECT_EQ(s->len, 100 + i);
    ring.release(head);
  }
  EXPECT_EQ(ring.peek(head), nullptr);
  // The producer goes on into the next lap: 8 more fit (3 left of this lap, 5 freed).
  for (uint32_t i = 0; i < kSlots; ++i) {
    shm::Slot* s = ring.claim(&pos);
    ASSERT_NE(s, nullptr) << "claim " << i;
    EXPECT_EQ(pos, 5u + i);
    shm::Ring::publish(s, pos);
  }
  EXPECT_EQ(ring.claim(&pos), nullptr);
}

TEST(ShmRing, ManyProducersOneConsumerLoseAndDuplicateNothing) {
  constexpr uint32_t kSlots = 64, kThreads = 4, kPerThread = 20000;
  std::vector<uint8_t> mem(shm::ring_bytes(kSlots) + 64);
  void* base = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(mem.data()) + 63) & ~uintptr_t{63});
  shm::Ring ring(base, kSlots);
  ring.init();
  std::vector<std::thread> producers;
  for (uint32_t t = 0; t < kThreads; ++t) {
    producers.emplace_back([&, t] {
      for (uint32_t i = 0; i < kPerThread;) {
        uint64_t pos;
        shm::Slot* s = ring.claim(&pos);
        if (s == nullptr) {
          std::this_thread::yield();
          continue;
        }
        s->len = t << 24 | i;
        shm::Ring::publish(s, pos);
        ++i;
      }
    });
  }
  std::vector<uint32_t> next(kThreads, 0);
  uint64_t head = 0;
  const auto end = Clock::now() + std::chrono::seconds(20);
  while (head < uint64_t{kThreads} * kPerThread && Clock::now() < end) {
    shm::Slot* s = ring.peek(head);
    if (s == nullptr) continue;
    const uint32_t t = s->len >> 24, i = s->len & 0xFFFFFF;
    ASSERT_LT(t, kThreads);
    ASSERT_EQ(i, next[t]) << "each producer's packets arrive once and in its order";
    ++next[t];
    ring.release(head++);
  }
  for (auto& p : producers) p.join();
  EXPECT_EQ(head, uint64_t{kThreads} * kPerThread);
}

TEST(ShmIo, CarriesPacketsBetweenTwoContextsInOrder) {
  TempDir dir;
  auto a = make_side(dir.path), b = make_side(dir.path);
  ASSERT_TRUE(a && b);
  EXPECT_TRUE(a->io->reaches(b->ep()));
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<TxPacket> pkts(40);
  for (uint32_t i = 0; i < pkts.size(); ++i) {
    payloads.emplace_back(i * 97 % 4097, static_cast<uint8_t>(i));
  }
  for (uint32_t i = 0; i < pkts.size(); ++i) make_packet(pkts[i], *a, b->ep(), i, payloads[i], i % 4);
  a->io->tx_burst(pkts);
  std::vector<wire::Endpoint> srcs;
  auto got = receive(*b, pkts.size(), 2000, &srcs);
  ASSERT_EQ(got.size(), pkts.size());
  for (uint32_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].size(), wire::kBthLen + payloads[i].size() + i % 4);
    EXPECT_EQ(wire::load_be24(got[i].data() + 9), i);
    EXPECT_TRUE(std::equal(payloads[i].begin(), payloads[i].end(), got[i].begin() + wire::kBthLen));
    EXPECT_EQ(srcs[i], a->ep());
  }
  EXPECT_EQ(a->counters.get(Counter::tx_shm_packets), pkts.size());
  EXPECT_EQ(b->counters.get(Counter::rx_shm_packets), pkts.size());
  EXPECT_EQ(b->counters.get(Counter::rx_packets), pkts.size());
  EXPECT_EQ(a->io->udp()->tx_dropped(), 0u);
}

// A packet of up to kInlineData bytes stays in its slot, a longer one goes in the slot's own bulk buffer:
// both inside the ring, none shared by two slots.
TEST(ShmRing, SmallPacketsStayInTheirSlotLongerOnesInTheirOwnBulkBuffer) {
  constexpr uint32_t kSlots = 8;
  std::vector<uint8_t> mem;
  shm::Ring ring = ring_in(mem, kSlots);
  const uint8_t* const begin = ring.mem();
  const uint8_t* const end = begin + shm::ring_bytes(kSlots);
  const uint8_t* const slots_end = begin + sizeof(shm::RingHeader) + kSlots * sizeof(shm::Slot);
  std::vector<const uint8_t*> bulk;
  for (uint32_t i = 0; i < kSlots; ++i) {
    uint64_t pos;
    shm::Slot* s = ring.claim(&pos);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(ring.data(s, shm::kInlineData), s->inline_data);
    const uint8_t* b = ring.data(s, shm::kInlineData + 1);
    EXPECT_GE(b, slots_end);
    EXPECT_LE(b + shm::kSlotData, end);
    EXPECT_EQ(ring.data(s, shm::kSlotData), b);
    for (const uint8_t* other : bulk) EXPECT_GE(std::abs(b - other), ptrdiff_t{shm::kSlotData});
    bulk.push_back(b);
  }
}

// Two packets sent together to one peer share a slot when both fit in its inline room (a ping-pong's
// request and the ACK it carries: one cache line between the CPUs, not two): 8 small packets in one burst
// fit a ring of 4 slots. Received one per call, each comes whole, in order, with its flags; the slot is
// given back only once both halves went.
TEST(ShmIo, TwoSmallPacketsSentTogetherShareASlot) {
  TempDir dir;
  auto a = make_side(dir.path), b = make_side(dir.path, 0, 4);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->io->reaches(b->ep()));
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<TxPacket> pkts(8);
  for (uint32_t i = 0; i < pkts.size(); ++i)
    payloads.emplace_back(i % 2 == 0 ? 24 : 4, static_cast<uint8_t>(i));
  for (uint32_t round = 0; round < 3; ++round) {  // three laps of the ring
    for (uint32_t i = 0; i < pkts.size(); ++i) {
      make_packet(pkts[i], *a, b->ep(), round * 8 + i, payloads[i]);
      pkts[i].flags = i % 2 == 0 ? kAwaitsAck : 0;  // a lone WRITE's mark, not its ACK's
    }
    a->io->tx_burst(pkts);
    std::vector<wire::Endpoint> srcs;
    std::vector<uint8_t> flags;
    auto got = receive(*b, pkts.size(), 2000, &srcs, &flags, 1);
    ASSERT_EQ(got.size(), pkts.size()) << "round " << round;
    for (uint32_t i = 0; i < pkts.size(); ++i) {
      ASSERT_EQ(got[i].size(), wire::kBthLen + payloads[i].size());
      EXPECT_EQ(wire::load_be24(got[i].data() + 9), round * 8 + i);
      EXPECT_TRUE(std::equal(payloads[i].begin(), payloads[i].end(), got[i].begin() + wire::kBthLen));
      EXPECT_EQ(flags[i], pkts[i].flags);
      EXPECT_EQ(srcs[i], a->ep());
    }
    RxPacket rx[1];
    EXPECT_EQ(b->io->rx_burst(rx, 1), 0u);  // (and gives the last slot back)
  }
  EXPECT_EQ(a->counters.get(Counter::drop_shm_ring_full), 0u);
  EXPECT_EQ(b->counters.get(Counter::rx_shm_packets), 24u);
}

// A slot whose two lengths do not fit its inline room (another process wrote it) is dropped and counted,
// and the ring goes on.
TEST(ShmIo, ASlotWhosePacketsDoNotFitIsDroppedAndTheRingGoesOn) {
  TempDir dir;
  auto a = make_side(dir.path), b = make_side(dir.path, 0, 4);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->io->reaches(b->ep()));
  const int fd = open(b->io->port_path(b->ep()).c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  void* map = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(map, MAP_FAILED);
  const auto* hdr = static_cast<const shm::PortHeader*>(map);
  uint32_t ready = shm::kMaxRings;
  for (uint32_t i = 0; i < shm::kMaxRings && ready == shm::kMaxRings; ++i)
    if (hdr->rings[i].state.load() == shm::RingEntry::kReady) ready = i;
  ASSERT_LT(ready, shm::kMaxRings);
  shm::Ring ring(static_cast<uint8_t*>(map) + hdr->rings_offset + ready * hdr->ring_stride, hdr->nslots);
  const std::vector<uint8_t> payload(4, 9);
  TxPacket pkts[2];
  for (uint32_t i = 0; i < 2; ++i) make_packet(pkts[i], *a, b->ep(), i, payload);
  a->io->tx_burst(pkts);
  shm::Slot* s = ring.peek(0);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->len >> 16 & shm::kLenMask, wire::kBthLen + 4) << "the second packet shares the slot";
  s->len = (shm::kInlineData - 8) << 16 | 16;  // 16 + 108 bytes: more than the room
  EXPECT_TRUE(receive(*b, 1, 50).empty());
  EXPECT_EQ(b->counters.get(Counter::drop_truncated), 1u);
  for (uint32_t i = 0; i < 2; ++i) make_packet(pkts[i], *a, b->ep(), 2 + i, payload);
  a->io->tx_burst(pkts);
  auto got = receive(*b, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(wire::load_be24(got[0].data() + 9), 2u);
  EXPECT_EQ(wire::load_be24(got[1].data() + 9), 3u);
  munmap(map, st.st_size);
}

// Each packet comes with its sender's address, which is its ring's (RingEntry::owner_addr) rather than its
// slot's: two senders of different addresses (127.0.0.1 and 127.0.0.2) into one port, their packets in turn.
TEST(ShmIo, EachPacketComesWithItsSendersAddress) {
  TempDir dir;
  auto a = make_side(dir.path), b = make_side(dir.path);
  auto c = make_side(dir.path, 0, 64, true, wire::Gid::from_v4(htonl(0x7F000002)));
  ASSERT_TRUE(a && b && c);
  ASSERT_NE(a->ep().addr, c->ep().addr);
  ASSERT_TRUE(a->io->reaches(b->ep()));
  ASSERT_TRUE(c->io->reaches(b->ep()));
  const std::vector<uint8_t> payload(24, 5);  // with the BTH, an 8-byte WRITE's 36 bytes and then some
  for (uint32_t round = 0; round < 3; ++round) {
    for (Side* from : {a.get(), c.get()}) {
      TxPacket p;
      make_packet(p, *from, b->ep(), round * 2 + (from == c.get()), payload);
      from->io->tx_burst(std::span(&p, 1));
    }
  }
  std::vector<wire::Endpoint> srcs;
  auto got = receive(*b, 6, 2000, &srcs);
  ASSERT_EQ(got.size(), 6u);
  for (uint32_t i = 0; i < got.size(); ++i) {
    const uint32_t psn = wire::load_be24(got[i].data() + 9);
    EXPECT_EQ(srcs[i], psn % 2 == 1 ? c->ep() : a->ep()) << "packet of PSN " << psn;
  }
}

// Packets on either side of the inline size, and the largest, arrive whole and in order, with their flags.
TEST(ShmIo, CarriesPacketsAroundTheInlineSizeWhole) {
  TempDir dir;
  auto a = make_side(dir.path), b = make_side(dir.path);
  ASSERT_TRUE(a && b);
  const size_t at = shm::kInlineData - wire::kBthLen;  // a packet of exactly kInlineData bytes
  const std::vector<size_t> sizes = {at - 1, at, at + 1, 4096, at, at + 1, 0, at - 3, at - 2};
  const std::vector<uint32_t> pads = {1, 0, 0, 0, 0, 3, 0, 3, 3};
  std::vector<std::vector<uint8_t>> payloads;
  for (uint32_t i = 0; i < sizes.size(); ++i) {
    payloads.emplace_back(sizes[i]);
    for (size_t k = 0; k < sizes[i]; ++k) payloads[i][k] = static_cast<uint8_t>(k * 7 + i);
  }
  std::vector<TxPacket> pkts(sizes.size());
  for (uint32_t i = 0; i < pkts.size(); ++i) {
    make_packet(pkts[i], *a, b->ep(), i, payloads[i], pads[i]);
    pkts[i].flags = i % 3 == 1 ? kAwaitsAck : 0;
  }
  a->io->tx_burst(pkts);
  std::vector<uint8_t> flags;
  auto got = receive(*b, pkts.size(), 2000, nullptr, &flags);
  ASSERT_EQ(got.size(), pkts.size());
  for (uint32_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].size(), wire::kBthLen + sizes[i] + pads[i]) << "packet " << i;
    EXPECT_EQ(flags[i], pkts[i].flags) << "packet " << i;
    EXPECT_EQ(wire::load_be24(got[i].data() + 9), i);
    EXPECT_TRUE(std::equal(payloads[i].begin(), payloads[i].end(), got[i].begin() + wire::kBthLen))
        << "packet " << i;
  }
  EXPECT_EQ(b->counters.get(Counter::rx_shm_packets), pkts.size());
}

// Long packets copied into the ring with streaming stores (SOFTRDMA_SHM_STREAM=1; stream_copy.h) arrive
// whole, as with memcpy (=0, and the default); only the pieces of kStreamMinPiece or more of the packets of
// kStreamMinBytes or more are streamed, and those packets counted.
TEST(ShmIo, LongPacketsCopiedWithStreamingStoresArriveWhole) {
  TempDir dir;
  const size_t least = ShmIo::kStreamMinBytes - wire::kBthLen;  // the shortest payload streamed (no pad)
  const std::vector<size_t> sizes = {least - 1,
                                     least,
                                     4096,
                                     1,
                                     3001,
                                     4093,
                                     least + 100,
                                     2 * shm::kStreamMinPiece,
                                     8 * shm::kStreamMinPiece - 8};
  const std::vector<uint32_t> pads = {0, 0, 0, 3, 1, 3, 2, 0, 0};
  std::vector<std::vector<uint8_t>> payloads;
  uint64_t long_ones = 0;
  for (uint32_t i = 0; i < sizes.size(); ++i) {
    payloads.emplace_back(sizes[i]);
    for (size_t k = 0; k < sizes[i]; ++k) payloads[i][k] = static_cast<uint8_t>(k * 13 + i);
    long_ones += wire::kBthLen + sizes[i] + pads[i] >= ShmIo::kStreamMinBytes ? 1 : 0;
  }
  --long_ones;  // the last, in short pieces (below)
  for (const char* mode : {"1", "0", ""}) {
    auto a = mode[0] != 0 ? make_side_with(dir.path, ShmIo::kStreamEnv, mode) : make_side(dir.path);
    auto b = make_side(dir.path);
    ASSERT_TRUE(a && b);
    std::vector<TxPacket> pkts(sizes.size());
    for (uint32_t i = 0; i < pkts.size(); ++i) make_packet(pkts[i], *a, b->ep(), i, payloads[i], pads[i]);
    // The last packet's payload in 8 pieces shorter than kStreamMinPiece: a long packet, streamed nowhere.
    TxPacket& pieces = pkts.back();
    const size_t piece = payloads.back().size() / 8;
    ASSERT_LT(piece, shm::kStreamMinPiece);
    pieces.n_iov = 8;
    for (uint32_t k = 0; k < 8; ++k)
      pieces.iov[k] =
          iovec{payloads.back().data() + k * piece, k < 7 ? piece : payloads.back().size() - 7 * piece};
    a->io->tx_burst(pkts);
    auto got = receive(*b, pkts.size());
    ASSERT_EQ(got.size(), pkts.size()) << "mode " << mode;
    for (uint32_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].size(), wire::kBthLen + sizes[i] + pads[i]) << "mode " << mode << " packet " << i;
      EXPECT_EQ(wire::load_be24(got[i].data() + 9), i);
      EXPECT_TRUE(std::equal(payloads[i].begin(), payloads[i].end(), got[i].begin() + wire::kBthLen))
          << "mode " << mode << " packet " << i;
      EXPECT_TRUE(std::all_of(got[i].end() - pads[i], got[i].end(), [](uint8_t x) { return x == 0; }));
    }
    const bool streams = shm::kCanStream && mode[0] == '1';
    EXPECT_EQ(a->counters.get(Counter::tx_shm_streamed), streams ? long_ones : 0) << "mode " << mode;
    EXPECT_EQ(a->counters.get(Counter::tx_shm_packets), pkts.size());
  }
}

// Before a ring is in use, touch_pages writes one byte in every page of it (the bulk buffers' pages hold
// no slot's beginning, which init() reaches) and never a sequence word (the ring header's tail, a slot's
// seq), so that the ring then works as any other.
TEST(ShmRing, TouchPagesWritesEveryPageButNoSequenceWord) {
  constexpr uint32_t kSlots = 64;
  const size_t page = page_bytes();
  const size_t bytes = (shm::ring_bytes(kSlots) + page - 1) / page * page;
  std::unique_ptr<uint8_t, decltype(&std::free)> mem(static_cast<uint8_t*>(std::aligned_alloc(page, bytes)),
                                                     &std::free);
  ASSERT_NE(mem, nullptr);
  std::memset(mem.get(), 0xAB, bytes);
  shm::Ring ring(mem.get(), kSlots);
  ring.touch_pages(bytes, page);
  const size_t slots_end = sizeof(shm::RingHeader) + size_t{kSlots} * sizeof(shm::Slot);
  const auto is_seq_byte = [&](size_t off) {
    if (off < sizeof(uint64_t)) return true;  // the header's tail
    if (off < sizeof(shm::RingHeader) || off >= slots_end) return false;
    return (off - sizeof(shm::RingHeader)) % sizeof(shm::Slot) < sizeof(uint64_t);
  };
  size_t pages_without_a_slot_start = 0;
  for (size_t p = 0; p < bytes; p += page) {
    size_t written = 0;
    for (size_t off = p; off < p + page; ++off) {
      if (mem.get()[off] == 0xAB) continue;
      ++written;
      EXPECT_FALSE(is_seq_byte(off)) << "a sequence word at " << off;
    }
    EXPECT_EQ(written, 1u) << "page at " << p;
    bool starts = false;
    for (size_t off = p; off < p + page && !starts; off += 64)
      starts = off >= sizeof(shm::RingHeader) && off < slots_end &&
               (off - sizeof(shm::RingHeader)) % sizeof(shm::Slot) == 0;
    pages_without_a_slot_start += !starts;
  }
  EXPECT_GT(pages_without_a_slot_start, 1u) << "the case this is for: pages no slot begins in";
  ring.init();
  for (uint32_t i = 0; i < kSlots; ++i) {
    uint64_t pos;
    shm::Slot* s = ring.claim(&pos);
    ASSERT_NE(s, nullptr) << "claim " << i;
    EXPECT_EQ(pos, i);
    shm::Ring::publish(s, pos);
  }
  uint64_t pos;
  EXPECT_EQ(ring.claim(&pos), nullptr);
  for (uint64_t i = 0; i < kSlots; ++i) EXPECT_NE(ring.peek(i), nullptr) << "slot " << i;
}

// A peer on a ring has no in-flight bound (a full ring makes its sender wait); one reached over UDP (here:
// in another directory, as on another host) has its socket's.
TEST(ShmIo, InflightCapOnlyForPeersOffTheRings) {
  TempDir dir, other;
  auto a = make_side(dir.path), b = make_side(dir.path), c = make_side(other.path);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(a->io->inflight_cap(b->ep()), 0u);
  EXPECT_GT(c->io->inflight_cap(b->ep()), 0u);
  EXPECT_EQ(c->io->inflight_cap(b->ep()), c->io->udp()->inflight_cap(b->ep()));
}

TEST(ShmIo, SocketPacketsStillArriveWhileRingsAreBusy) {
  // While the rings carry packets, rx_burst reads the socket only every few microseconds: a packet from
  // a host that is not on the rings (here: a context in another directory) must still come through while
  // ring packets keep coming.
  TempDir dir, other;
  auto a = make_side(dir.path), b = make_side(dir.path), c = make_side(other.path);
  ASSERT_TRUE(a && b && c);
  EXPECT_FALSE(c->io->reaches(b->ep()));
  const std::vector<uint8_t> payload(64, 7);
  uint32_t ring_psn = 1000;
  uint64_t ring_pkts = 0;
  for (uint32_t psn = 1; psn <= 5; ++psn) {
    TxPacket q;
    make_packet(q, *c, b->ep(), psn, payload);
    c->io->tx_burst(std::span(&q, 1));
    bool seen = false;
    const uint64_t ring_before = ring_pkts;
    const auto end = Clock::now() + std::chrono::seconds(2);
    while (!seen && Clock::now() < end) {
      TxPacket r;
      make_packet(r, *a, b->ep(), ring_psn++, payload);
      a->io->tx_burst(std::span(&r, 1));
      RxPacket pkts[32];
      const uint32_t n = b->io->rx_burst(pkts, 32);
      for (uint32_t i = 0; i < n; ++i) {
        if (wire::load_be24(pkts[i].data + 9) == psn)
          seen = true;
        else
          ++ring_pkts;
      }
    }
    ASSERT_TRUE(seen) << "socket packet " << psn << " never came while the rings were busy";
    // Read at least every 64 us while busy (every 2 us after a read that found packets): a few hundred ring
    // packets at most in between. (Starved, it came after 100,000 to 12 million, when the rings paused for
    // 100 us.)
    EXPECT_LT(ring_pkts - ring_before, 10'000u);
  }
  EXPECT_EQ(b->counters.get(Counter::rx_packets), ring_pkts + 5);
  EXPECT_EQ(b->counters.get(Counter::rx_shm_packets), ring_pkts);
}

// While its rings are busy, a context reads its socket seldom (up to 64 us apart). The progress thread,
// woken by the socket's data, says so (sockets_readable), and the next receive reads the socket at once.
TEST(ShmIo, ASocketReportedReadableIsReadByTheNextReceive) {
  TempDir dir, other;
  auto a = make_side(dir.path), b = make_side(dir.path), c = make_side(other.path);
  ASSERT_TRUE(a && b && c);
  const std::vector<uint8_t> payload(64, 7);
  uint32_t ring_psn = 1000;
  const auto ring_packet_then_receive = [&](RxPacket* pkts) {
    TxPacket r;
    make_packet(r, *a, b->ep(), ring_psn++, payload);
    a->io->tx_burst(std::span(&r, 1));
    return b->io->rx_burst(pkts, 32);
  };
  for (uint32_t round = 0; round < 3; ++round) {
    // Busy rings for a millisecond: reads of the socket that find nothing stretch the gap to its longest.
    RxPacket pkts[32];
    for (const auto end = Clock::now() + std::chrono::milliseconds(1); Clock::now() < end;)
      ring_packet_then_receive(pkts);
    const uint32_t psn = 1 + round;
    TxPacket q;
    make_packet(q, *c, b->ep(), psn, payload);
    c->io->tx_burst(std::span(&q, 1));  // in b's socket when this returns (loopback)
    b->io->sockets_readable();
    const uint32_t n = ring_packet_then_receive(pkts);
    bool seen = false;
    for (uint32_t i = 0; i < n; ++i) seen = seen || wire::load_be24(pkts[i].data + 9) == psn;
    EXPECT_TRUE(seen) << "round " << round << ": the socket's packet was not read by the next receive";
  }
}

// A context whose packets all come from other hosts (no ring carried one lately) handles its sockets as
// io/udp does: a nap does not watch them and takes them out of epoll, a wake-up too, arm_wakeup puts them
// back. Once ring packets come, a nap watches them again (a packet from another host may wait for a
// receive that reads the sockets seldom while the rings are busy), back in epoll if they were out.
TEST(ShmIo, ItsSocketsAreWatchedInNapsOnlyWhileTheRingsCarryPackets) {
  TempDir dir, other;
  auto ring_peer = make_side(dir.path), b = make_side(dir.path), remote = make_side(other.path);
  ASSERT_TRUE(ring_peer && b && remote);
  uint32_t psn = 1;
  const auto from = [&, payload = std::vector<uint8_t>(8, 3)](Side& s) {
    TxPacket p;
    make_packet(p, s, b->ep(), psn++, payload);
    s.io->tx_burst(std::span(&p, 1));  // in b's socket or ring when this returns (loopback)
  };
  pollfd pfd{b->io->poll_fd(), POLLIN, 0};
  EXPECT_FALSE(b->io->wakes_by_doorbell());
  EXPECT_FALSE(b->io->nap());
  from(*remote);
  EXPECT_EQ(poll(&pfd, 1, 100), 0) << "a nap with no ring packets lately took the sockets out";
  EXPECT_EQ(receive(*b, 1).size(), 1u);
  EXPECT_FALSE(b->io->arm_wakeup());
  from(*remote);
  EXPECT_EQ(poll(&pfd, 1, 2000), 1);
  EXPECT_EQ(receive(*b, 1).size(), 1u);
  b->io->woke();
  from(*remote);
  EXPECT_EQ(poll(&pfd, 1, 100), 0) << "a wake-up with no ring packets lately took the sockets out";
  EXPECT_EQ(receive(*b, 1).size(), 1u);

  from(*ring_peer);  // through the ring (its first packet rings a doorbell, read by the same receive)
  EXPECT_EQ(receive(*b, 1).size(), 1u);
  EXPECT_EQ(b->counters.get(Counter::rx_shm_packets), 1u);
  EXPECT_TRUE(b->io->wakes_by_doorbell());
  EXPECT_TRUE(b->io->nap()) << "with ring packets lately a nap watches the sockets";
  EXPECT_EQ(poll(&pfd, 1, 0), 0);
  from(*remote);
  EXPECT_EQ(poll(&pfd, 1, 2000), 1) << "the sockets taken out before are back in epoll";
  b->io->woke();  // they stay in
  EXPECT_EQ(poll(&pfd, 1, 0), 1);
  EXPECT_EQ(receive(*b, 1).size(), 1u);
  EXPECT_EQ(b->counters.get(Counter::rx_packets), 5u);
}

TEST(ShmIo, FullRingDropsAndCountsThenRecovers) {
  TempDir dir;
  auto a = make_side(dir.path, 0, 16), b = make_side(dir.path, 0, 16);
  ASSERT_TRUE(a && b);
  std::vector<uint8_t> payload(100, 7);
  std::vector<TxPacket> pkts(20);
  for (uint32_t i = 0; i < pkts.size(); ++i) make_packet(pkts[i], *a, b->ep(), i, payload);
  const auto t0 = Clock::now();
  a->io->tx_burst(pkts);
  EXPECT_GE(Clock::now() - t0, std::chrono::nanoseconds(ShmIo::kFullWaitNs)) << "it waited for room first";
  EXPECT_EQ(a->counters.get(Counter::drop_shm_ring_full), 4u);
  EXPECT_EQ(receive(*b, 16).size(), 16u);
  EXPECT_EQ(receive(*b, 1, 10).size(), 0u);  // gives back what the last call handed out
  a->io->tx_burst(std::span(pkts).first(10));
  EXPECT_EQ(receive(*b, 10).size(), 10u);
  EXPECT_EQ(receive(*b, 1, 50).size(), 0u);
}

// A retransmit timer that runs out while the peer still reads its ring (more slowly than it is filled)
// found a queue, not a loss; one that finds the peer read nothing since the last look, or all of it, did.
TEST(ShmIo, PeerIsBehindWhileItsRingHoldsUnreadPacketsAndMoves) {
  TempDir dir;
  auto a = make_side(dir.path), b = make_side(dir.path), c = make_side(dir.path);
  ASSERT_TRUE(a && b && c);
  uint64_t mark = 0;
  EXPECT_FALSE(a->io->peer_behind(b->ep(), &mark));  // nothing sent
  std::vector<uint8_t> payload(100, 7);
  std::vector<TxPacket> pkts(20);
  for (uint32_t i = 0; i < pkts.size(); ++i) make_packet(pkts[i], *a, b->ep(), i, payload);
  a->io->tx_burst(pkts);
  EXPECT_TRUE(a->io->peer_behind(b->ep(), &mark));   // 20 unread
  EXPECT_FALSE(a->io->peer_behind(b->ep(), &mark));  // and not one read since
  RxPacket rx[8];
  EXPECT_EQ(b->io->rx_burst(rx, 5), 5u);  // read (released by the next call)
  EXPECT_EQ(b->io->rx_burst(rx, 5), 5u);
  EXPECT_TRUE(a->io->peer_behind(b->ep(), &mark));  // it moved, and 10 or more wait
  EXPECT_FALSE(a->io->peer_behind(b->ep(), &mark));
  // Another context's ring to the same peer says nothing about this one's.
  std::vector<TxPacket> other(3);
  for (uint32_t i = 0; i < other.size(); ++i) make_packet(other[i], *c, b->ep(), i, payload);
  c->io->tx_burst(other);
  uint64_t other_mark = 0;
  EXPECT_TRUE(c->io->peer_behind(b->ep(), &other_mark));
  EXPECT_EQ(receive(*b, 13).size(), 13u);
  EXPECT_EQ(receive(*b, 1, 10).size(), 0u);          // gives back what the last call handed out
  EXPECT_FALSE(a->io->peer_behind(b->ep(), &mark));  // all read
  EXPECT_FALSE(c->io->peer_behind(b->ep(), &other_mark));
  EXPECT_FALSE(b->io->peer_behind(a->ep(), &mark));  // nothing sent that way
}

// UC and UD have no flow control: a burst larger than the ring gets through to a receiver that reads.
TEST(ShmIo, FullRingWaitsForAReceiverThatReads) {
  TempDir dir;
  auto a = make_side(dir.path, 0, 16), b = make_side(dir.path, 0, 16);
  ASSERT_TRUE(a && b);
  std::atomic<bool> running{false}, stop{false};
  std::atomic<size_t> got{0};
  std::thread rx([&] {
    RxPacket pkts[32];
    running = true;
    while (!stop) got += b->io->rx_burst(pkts, 32);
  });
  while (!running) std::this_thread::yield();
  std::vector<uint8_t> payload(1000, 5);
  std::vector<TxPacket> pkts(64);
  for (uint32_t i = 0; i < pkts.size(); ++i) make_packet(pkts[i], *a, b->ep(), i, payload);
  a->io->tx_burst(pkts);
  const auto end = Clock::now() + std::chrono::seconds(2);
  while (got < pkts.size() - a->counters.get(Counter::drop_shm_ring_full) && Clock::now() < end)
    std::this_thread::yield();
  stop = true;
  rx.join();
  EXPECT_EQ(got + a->counters.get(Counter::drop_shm_ring_full), pkts.size());
  EXPECT_GT(got, 16u) << "more than a ring's worth in one burst";
}

TEST(ShmIo, SleepingReceiverGetsOneDoorbellBusyOneGetsNone) {
  TempDir dir;
  auto a = make_side(dir.path), b = make_side(dir.path);
  ASSERT_TRUE(a && b);
  std::vector<uint8_t> payload(8, 1);
  TxPacket p;
  make_packet(p, *a, b->ep(), 1, payload);
  // A port counts as asleep until its receiver runs: the first packet rings.
  a->io->tx_burst(std::span(&p, 1));
  EXPECT_EQ(a->counters.get(Counter::shm_doorbells), 1u);
  EXPECT_EQ(receive(*b, 1).size(), 1u);
  // Busy receiver: no doorbell.
  a->io->tx_burst(std::span(&p, 1));
  EXPECT_EQ(receive(*b, 1).size(), 1u);
  EXPECT_EQ(a->counters.get(Counter::shm_doorbells), 1u);
  // It goes to sleep: the next packets ring once, and its poll fd becomes readable.
  EXPECT_FALSE(b->io->arm_wakeup());
  a->io->tx_burst(std::span(&p, 1));
  a->io->tx_burst(std::span(&p, 1));
  EXPECT_EQ(a->counters.get(Counter::shm_doorbells), 2u);
  pollfd pfd{b->io->poll_fd(), POLLIN, 0};
  EXPECT_EQ(poll(&pfd, 1, 2000), 1);
  EXPECT_EQ(receive(*b, 2).size(), 2u);
  EXPECT_EQ(receive(*b, 1, 50).size(), 0u) << "the doorbell is not a packet";
  EXPECT_EQ(b->counters.get(Counter::drop_truncated), 0u);
  // A packet published before the receiver armed is reported by arm_wakeup itself.
  a->io->tx_burst(std::span(&p, 1));
  EXPECT_TRUE(b->io->arm_wakeup());
}

// One 8-byte packet from `from` to `to`, received; then `to`'s progress thread would go to sleep.
void packet_then_sleep(Side& from, Side& to) {
  std::vector<uint8_t> payload(8, 1);
  TxPacket p;
  make_packet(p, from, to.ep(), 1, payload);
  from.io->tx_burst(std::span(&p, 1));
  EXPECT_EQ(receive(to, 1).size(), 1u);
  to.io->before_sleep();
}

// A destination that a UD packet names first (no QP prepared it) is claimed in that packet's post, as any
// other, but without the pass over the bulk pages, which took the post 30 ms on a VM whose first access
// to each page is slow: their first writes are left to the long packets that fill them. The packets go
// through the ring from the first. Any other packet's destination gets the whole pass.
TEST(ShmIo, AUdPacketsDestinationIsClaimedWithItsBulkPagesCold) {
  TempDir dir;
  auto a = make_side(dir.path), b = make_side(dir.path), c = make_side(dir.path);
  ASSERT_TRUE(a && b && c);
  std::vector<uint8_t> small(64, 5), big(4000, 6);
  TxPacket p[2];
  make_packet(p[0], *a, b->ep(), 1, small);
  make_packet(p[1], *a, b->ep(), 2, big);
  p[0].hdr[0] = p[1].hdr[0] = 0x64;  // UD SEND Only
  a->io->tx_burst(p);
  auto got = receive(*b, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(std::equal(big.begin(), big.end(), got[1].begin() + wire::kBthLen));
  EXPECT_EQ(a->counters.get(Counter::shm_rings_cold_bulk), 1u);
  EXPECT_EQ(a->counters.get(Counter::tx_shm_packets), 2u);
  make_packet(p[0], *c, b->ep(), 3, small);  // RC SEND Only
  c->io->tx_burst(std::span(p, 1));
  EXPECT_EQ(receive(*b, 1).size(), 1u);
  EXPECT_EQ(c->counters.get(Counter::shm_rings_cold_bulk), 0u);
  EXPECT_EQ(c->counters.get(Counter::tx_shm_packets), 1u);
}

// The receiver warms a ring's pages up (before it sleeps) once the ring has carried a packet, and once:
// a ring claimed by a peer that only ever goes one-sided costs it nothing. (Ports opened without the
// warm-up of ring 0, which the next test covers.)
TEST(ShmIo, ARingIsWarmedUpOnceAfterItsFirstPacket) {
  TempDir dir;
  auto a = make_side(dir.path, 0, 64, false), b = make_side(dir.path, 0, 64, false);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->io->reaches(b->ep()));  // claims a ring in b's port
  RxPacket pkts[4];
  EXPECT_EQ(b->io->rx_burst(pkts, 4), 0u);  // b starts reading it
  b->io->before_sleep();
  EXPECT_EQ(b->counters.get(Counter::shm_rings_warmed), 0u) << "a ring without packets was warmed up";
  packet_then_sleep(*a, *b);
  EXPECT_EQ(b->counters.get(Counter::shm_rings_warmed), 1u);
  packet_then_sleep(*a, *b);
  EXPECT_EQ(b->counters.get(Counter::shm_rings_warmed), 1u) << "warmed up twice";
  EXPECT_EQ(a->counters.get(Counter::shm_rings_warmed), 0u);
}

// Ring 0, the one a port's first sender claims, is warmed up when the port opens (given room in the
// directory's filesystem), and its first packet does not warm it up again; a second sender's ring is
// warmed up after its first packet, as without it.
TEST(ShmIo, TheFirstSendersRingIsWarmedUpWhenThePortOpens) {
  TempDir dir;
  struct statvfs vs;
  ASSERT_EQ(statvfs(dir.path.c_str(), &vs), 0);
  if (uint64_t{vs.f_bavail} * vs.f_frsize < ShmIo::kPrewarmFreeRings * 2 * shm::ring_stride(64))
    GTEST_SKIP() << "not enough room in " << dir.path << " for the warm-up";
  auto a = make_side(dir.path), b = make_side(dir.path), c = make_side(dir.path);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(b->counters.get(Counter::shm_rings_prewarmed), 1u);
  ASSERT_TRUE(a->io->reaches(b->ep()));  // ring 0
  ASSERT_TRUE(c->io->reaches(b->ep()));  // ring 1
  packet_then_sleep(*a, *b);
  EXPECT_EQ(b->counters.get(Counter::shm_rings_warmed), 0u) << "ring 0 warmed up again";
  packet_then_sleep(*c, *b);
  EXPECT_EQ(b->counters.get(Counter::shm_rings_warmed), 1u);
  EXPECT_EQ(b->counters.get(Counter::shm_rings_prewarmed), 1u);
}

TEST(ShmIo, OffWhenNoPortFileAndOtherNamespacesAreNotFound) {
  TempDir dir;
  auto a = make_side(dir.path, 1111), b = make_side(dir.path, 2222), c = make_side(dir.path, 1111);
  ASSERT_TRUE(a && b && c);
  EXPECT_FALSE(a->io->reaches(b->ep())) << "another network namespace";
  EXPECT_TRUE(a->io->reaches(c->ep()));
  EXPECT_FALSE(a->io->reaches(wire::Endpoint{loopback(), 1})) << "no softrdma port there";
  // Packets to b still arrive, over UDP.
  std::vector<uint8_t> payload(32, 3);
  TxPacket p;
  make_packet(p, *a, b->ep(), 5, payload);
  a->io->tx_burst(std::span(&p, 1));
  EXPECT_EQ(receive(*b, 1).size(), 1u);
  EXPECT_EQ(b->counters.get(Counter::rx_shm_packets), 0u);
  EXPECT_NE(a->io->port_path(b->ep()), b->io->port_path(b->ep()));
}

// A real second network namespace (needs CAP_SYS_ADMIN): a context there publishes 127.0.0.1:P in the same
// directory, and one here on 127.0.0.1 does not find it.
TEST(ShmIo, RealNetworkNamespacesDoNotMeet) {
  TempDir dir;
  int ready[2], done[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(done), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    uint16_t port = 0;
    if (unshare(CLONE_NEWNET) == 0 && system("ip link set lo up") == 0) {
      auto s = make_side(dir.path);
      if (s) port = s->port;
      [[maybe_unused]] ssize_t w = write(ready[1], &port, sizeof port);
      char c;
      [[maybe_unused]] ssize_t r = read(done[0], &c, 1);
      _exit(0);
    }
    [[maybe_unused]] ssize_t w = write(ready[1], &port, sizeof port);
    _exit(0);
  }
  uint16_t port = 0;
  ASSERT_EQ(read(ready[0], &port, sizeof port), static_cast<ssize_t>(sizeof port));
  if (port == 0) {
    waitpid(child, nullptr, 0);
    GTEST_SKIP() << "no new network namespace here (needs CAP_SYS_ADMIN)";
  }
  EXPECT_EQ(dir.files(), 1u);
  auto here = make_side(dir.path);
  ASSERT_TRUE(here);
  EXPECT_FALSE(here->io->reaches(wire::Endpoint{loopback(), port}));
  [[maybe_unused]] ssize_t w = write(done[1], "x", 1);
  waitpid(child, nullptr, 0);
}

// A receiver killed with SIGKILL leaves its file; it wedges nothing: senders do not use it, a new process on
// that port replaces it, and the garbage collector removes it.
TEST(ShmIo, KilledProcessLeavesAFileThatWedgesNothing) {
  TempDir dir;
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto s = make_side(dir.path);
    uint16_t port = s ? s->port : 0;
    [[maybe_unused]] ssize_t w = write(ready[1], &port, sizeof port);
    pause();
    _exit(0);
  }
  uint16_t port = 0;
  ASSERT_EQ(read(ready[0], &port, sizeof port), static_cast<ssize_t>(sizeof port));
  ASSERT_NE(port, 0);
  auto a = make_side(dir.path);
  ASSERT_TRUE(a);
  EXPECT_TRUE(a->io->reaches(wire::Endpoint{loopback(), port})) << "alive: found";
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_EQ(dir.files(), 2u) << "the killed process's file stays behind";
  // A new context that binds the same port replaces it and is reached.
  auto b = std::make_unique<Side>();
  auto udp = UdpIo::create(loopback(), &b->counters);
  ASSERT_TRUE(udp);
  ShmIo::Config cfg;
  cfg.dir = dir.path;
  cfg.ring_slots = 64;
  auto io = ShmIo::create(std::move(*udp), &b->counters, cfg);
  ASSERT_TRUE(io);
  b->io = std::move(*io);
  auto p = b->io->open_port(port);
  ASSERT_TRUE(p) << std::strerror(p.error());
  b->port = *p;
  auto c = make_side(dir.path);  // a sender that never knew the dead one
  ASSERT_TRUE(c);
  std::vector<uint8_t> payload(64, 9);
  TxPacket pkt;
  make_packet(pkt, *c, b->ep(), 3, payload);
  c->io->tx_burst(std::span(&pkt, 1));
  EXPECT_EQ(receive(*b, 1).size(), 1u);
  EXPECT_EQ(b->counters.get(Counter::rx_shm_packets), 1u);
  // The sender that knew the dead one finds the new one within kRecheckNs.
  const auto end = Clock::now() + std::chrono::seconds(3);
  make_packet(pkt, *a, b->ep(), 4, payload);
  uint64_t before = b->counters.get(Counter::rx_shm_packets);
  while (Clock::now() < end && b->counters.get(Counter::rx_shm_packets) == before) {
    a->io->tx_burst(std::span(&pkt, 1));
    receive(*b, 1, 20);
  }
  EXPECT_GT(b->counters.get(Counter::rx_shm_packets), before);
  // A file nobody holds goes at the next collection.
  b.reset();
  EXPECT_GE(dir.files(), 1u);
  ShmIo::collect_garbage(dir.path);
  EXPECT_EQ(dir.files(), 2u) << "a and c are alive";
}

// A peer's shared pages (SOFTRDMA_SHARE_MR=1) are mapped here at its first one-sided op, and unmapped once
// it is found gone, so that its memfds do not outlive it in this process.
TEST(ShmIo, APeersSharedPagesAreUnmappedWhenItCloses) {
  TempDir dir;
  auto a = make_side_with(dir.path, "SOFTRDMA_SHARE_MR", "1");
  auto b = make_side(dir.path);
  ASSERT_TRUE(a && b);
  const size_t len = 2 * page_bytes();
  void* mem = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  const auto addr = reinterpret_cast<uint64_t>(mem);
  a->io->publish_qp({.qpn = 0x123, .access = shm::kAccRemoteWrite, .pd = 1, .dest_qpn = 0x456, .open = true});
  a->io->publish_mr(
      {.key = 0x77, .access = shm::kAccRemoteWrite, .pd = 1, .iova = addr, .length = len, .addr = addr});
  auto shared_maps = [] {  // mappings of shared pages' memfds, MAP_SHARED, in this process
    std::ifstream f("/proc/self/maps");
    int n = 0;
    for (std::string line; std::getline(f, line);)
      n += line.find("softrdma-mr") != std::string::npos && line.find(" rw-s ") != std::string::npos;
    return n;
  };
  EXPECT_EQ(shared_maps(), 1) << "the owner's pages did not move";
  uint64_t v = 42;
  LocalSeg seg{&v, 8};
  const DirectOp op{false, 0x456, 0x123, addr + 8, 0x77, 8, &seg, 1};
  const wire::Endpoint a_ep = a->ep();
  EXPECT_EQ(b->io->direct(a_ep, op), 1) << "not through the shared pages";
  EXPECT_EQ(static_cast<uint64_t*>(mem)[1], 42u);
  EXPECT_EQ(shared_maps(), 2) << "the requester did not map them";
  a.reset();  // closes its port; its own pages move back
  b->io->prepare_peer(a_ep);
  EXPECT_EQ(shared_maps(), 0) << "a gone peer's memfd is still mapped";
  munmap(mem, len);
}

// The UDP layer under it has the kernel read an MR's resident pages (io/kernel_touch.h): the direct path's
// own kernel copies (process_vm_writev, /proc/<pid>/mem) read them too.
TEST(ShmIo, PublishMrHasTheKernelReadTheResidentPages) {
  TempDir dir;
  auto a = make_side(dir.path);
  ASSERT_TRUE(a);
  const size_t len = UdpIo::kTouchMinBytes;
  void* mem = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  static_cast<char*>(mem)[0] = 1;
  static_cast<char*>(mem)[len / 2] = 1;  // two pages resident, the others not
  const auto addr = reinterpret_cast<uint64_t>(mem);
  a->io->publish_mr(
      {.key = 0x78, .access = shm::kAccRemoteWrite, .pd = 1, .iova = addr, .length = len, .addr = addr});
  EXPECT_EQ(a->counters.get(Counter::mr_pages_touched), 2u);
  a.reset();
  munmap(mem, len);
}

// Several senders at once, each in its own ring: the receiver, reading a few packets per call, gets every
// sender's packets in that sender's order; two senders leave (their rings go back) and the others go on.
TEST(ShmIo, ManySendersAtOnceEachInOrder) {
  TempDir dir;
  auto b = make_side(dir.path);
  ASSERT_TRUE(b);
  std::vector<std::unique_ptr<Side>> senders;
  for (int i = 0; i < 6; ++i) {
    senders.push_back(make_side(dir.path));
    ASSERT_TRUE(senders.back());
  }
  const std::vector<uint8_t> payload(16, 3);
  auto round = [&](uint32_t first_psn) {
    uint32_t sent = 0;
    for (uint32_t k = 0; k < senders.size(); ++k) {
      if (!senders[k]) continue;
      std::vector<TxPacket> pkts(5);
      for (uint32_t i = 0; i < pkts.size(); ++i)
        make_packet(pkts[i], *senders[k], b->ep(), first_psn + i, payload);
      senders[k]->io->tx_burst(pkts);
      sent += 5;
    }
    std::vector<wire::Endpoint> srcs;
    auto got = receive(*b, sent, 2000, &srcs, nullptr, 4);
    EXPECT_EQ(got.size(), sent);
    std::map<uint16_t, uint32_t> next;  // by sender port: the PSN expected next
    for (uint32_t i = 0; i < got.size(); ++i) {
      auto [it, fresh] = next.try_emplace(srcs[i].port, first_psn);
      EXPECT_EQ(wire::load_be24(got[i].data() + 9), it->second++) << "from port " << srcs[i].port;
    }
    for (auto& [port, psn] : next) EXPECT_EQ(psn, first_psn + 5) << "from port " << port;
  };
  round(0);
  senders[1].reset();
  senders[4].reset();
  receive(*b, 1, 5);  // the receiver frees their rings
  round(100);
  round(200);
  EXPECT_EQ(b->counters.get(Counter::rx_shm_packets), 6u * 5 + 2 * 4u * 5);
}

// rx_clock: the CLOCK_MONOTONIC time a receive read as it began, which its caller takes for the packets.
TEST(ShmIo, AReceiveSaysTheTimeItRead) {
  TempDir dir;
  auto a = make_side(dir.path), b = make_side(dir.path);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(b->io->rx_clock(), 0u) << "no receive yet";
  const std::vector<uint8_t> payload(8, 1);  // (the packet points into it until it is sent)
  TxPacket p;
  make_packet(p, *a, b->ep(), 1, payload);
  a->io->tx_burst(std::span(&p, 1));
  RxPacket rx[4];
  const uint64_t before = monotonic_ns();
  const uint32_t n = b->io->rx_burst(rx, 4);
  const uint64_t after = monotonic_ns();
  EXPECT_EQ(n, 1u);
  EXPECT_GE(b->io->rx_clock(), before);
  EXPECT_LE(b->io->rx_clock(), after);
}

TEST(ShmIo, SenderThatLeavesGivesItsRingBack) {
  TempDir dir;
  auto b = make_side(dir.path);
  ASSERT_TRUE(b);
  std::vector<uint8_t> payload(16, 2);
  // More senders over time than the port has rings: each gives its ring back when it goes.
  for (uint32_t i = 0; i < shm::kMaxRings + 8; ++i) {
    auto a = make_side(dir.path);
    ASSERT_TRUE(a);
    TxPacket p;
    make_packet(p, *a, b->ep(), i, payload);
    a->io->tx_burst(std::span(&p, 1));
    ASSERT_EQ(receive(*b, 1).size(), 1u) << i;
    a.reset();
    receive(*b, 1, 5);  // the receiver frees the ring
  }
  EXPECT_EQ(b->counters.get(Counter::rx_shm_packets), shm::kMaxRings + 8);
}

// A corrupted ring packet is dropped as the ICRC check would drop it, and the bit flipped is its own: a
// packet that fills its slot's inline room (96 bytes), corrupted, leaves the next slot's sequence word as
// it was. Two laps of such packets, every one corrupted, all received and dropped; the ring never full.
TEST(ShmIo, CorruptedRingPacketsTouchOnlyThemselves) {
  TempDir dir;
  auto b = make_side_with(dir.path, "SOFTRDMA_FAULTS", "corrupt=1,seed=3");
  auto a = make_side(dir.path);
  ASSERT_TRUE(a && b);
  std::vector<uint8_t> payload(shm::kInlineData - wire::kBthLen, 7);  // BTH + payload = the inline room
  std::vector<TxPacket> pkts(16);
  uint32_t psn = 0;
  for (int round = 0; round < 8; ++round) {  // 128 packets: two laps of the 64-slot ring
    for (TxPacket& p : pkts) make_packet(p, *a, b->ep(), psn++, payload);
    a->io->tx_burst(pkts);
    EXPECT_TRUE(receive(*b, 1, 50).empty());
    ASSERT_EQ(b->counters.get(Counter::drop_bad_icrc), psn) << "round " << round;
  }
  EXPECT_EQ(a->counters.get(Counter::drop_shm_ring_full), 0u);
  EXPECT_EQ(b->counters.get(Counter::fault_corrupt), psn);
}

// A sequence word that no producer or consumer wrote (another process shares the ring's memory) makes the
// ring look full to a producer, which returns instead of spinning.
TEST(ShmRing, ABrokenSequenceWordIsFullNotASpin) {
  std::vector<uint8_t> mem;
  shm::Ring ring = ring_in(mem, 8);
  uint64_t pos;
  shm::Slot* s = ring.claim(&pos);
  ASSERT_NE(s, nullptr);
  shm::Ring::publish(s, pos);
  ASSERT_EQ(ring.peek(0), s);
  ring.release(0);
  // Slot 1, not claimed yet, gets a sequence word ahead of its position.
  auto* slot1 = reinterpret_cast<shm::Slot*>(ring.mem() + sizeof(shm::RingHeader)) + 1;
  slot1->seq.store(1 + (1u << 20));
  EXPECT_EQ(ring.claim(&pos), nullptr);
  slot1->seq.store(1);
  EXPECT_NE(ring.claim(&pos), nullptr);
  EXPECT_EQ(pos, 1u);
}

TEST(ShmIo, FaultInjectionAppliesToRingPackets) {
  TempDir dir;
  auto b = make_side_with(dir.path, "SOFTRDMA_FAULTS", "drop=0.5,seed=7");
  auto a = make_side(dir.path);
  ASSERT_TRUE(a && b);
  std::vector<uint8_t> payload(16, 2);
  std::vector<TxPacket> pkts(32);
  for (uint32_t i = 0; i < pkts.size(); ++i) make_packet(pkts[i], *a, b->ep(), i, payload);
  a->io->tx_burst(pkts);
  auto got = receive(*b, 32, 300);
  EXPECT_GT(got.size(), 4u);
  EXPECT_LT(got.size(), 28u);
  EXPECT_EQ(got.size() + b->counters.get(Counter::drop_injected), 32u);
}

}  // namespace
}  // namespace softrdma::io
