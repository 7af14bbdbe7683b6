// The progress thread (src/engine/progress.cc) beside an application that polls now and then: a packet
// that wakes it is received even when the application began busy-polling while it slept.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "softrdma/connect.h"
#include "softrdma/softrdma.h"
#include "util/socket_path.h"
#include "util/sanitizer.h"
#include "util/wr.h"

namespace softrdma {
namespace {

// These tests spin on memory that a WRITE lands in (an application waiting without polling, the case
// under test): the responder's copy and that read race by design, as a NIC's DMA and a CPU's read do.
constexpr const char* kTsanSkip = "spins on memory an RDMA WRITE lands in: a race by design under TSan";

using testutil::open_socket_path;

// Two QPs of one context on the socket path, connected to each other, and a source and a destination.
struct Loop {
  std::unique_ptr<Context> ctx = open_socket_path();
  std::unique_ptr<ProtectionDomain> pd;
  std::unique_ptr<CompletionQueue> cq;
  std::vector<uint8_t> src = std::vector<uint8_t>(64, 0), dst = std::vector<uint8_t>(64, 0);
  std::unique_ptr<MemoryRegion> smr, dmr;
  std::unique_ptr<QueuePair> a, b;

  explicit Loop(QpType type) {
    if (!ctx) return;
    pd = *ctx->alloc_pd();
    cq = *ctx->create_cq(64);
    smr = *pd->reg_mr(src.data(), src.size(), kLocalWrite);
    dmr = *pd->reg_mr(dst.data(), dst.size(), kLocalWrite | kRemoteWrite);
    QpInit init;
    init.type = type;
    init.send_cq = init.recv_cq = cq.get();
    a = *pd->create_qp(init);
    b = *pd->create_qp(init);
    PeerInfo ia = local_info(*ctx, *a, nullptr), ib = local_info(*ctx, *b, dmr.get());
    EXPECT_TRUE(connect_qp(*ctx, *a, ia, ib, {}));
    EXPECT_TRUE(connect_qp(*ctx, *b, ib, ia, {}));
  }
  SendWr write(uint32_t off, uint64_t id) {
    sge = smr->sge(off, 1);
    return testutil::signaled_write(sge, reinterpret_cast<uint64_t>(dst.data()) + off, dmr->rkey(), id);
  }
  // Spins on dst[off] (not polling: the progress thread must receive) until it is `v`; milliseconds taken.
  double wait_for(uint32_t off, uint8_t v, std::chrono::steady_clock::time_point t0) {
    const auto deadline = t0 + std::chrono::seconds(2);
    while (std::atomic_ref<uint8_t>(dst[off]).load(std::memory_order_acquire) != v &&
           std::chrono::steady_clock::now() < deadline) {
    }
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  // Polls until one completion comes (busy-polling, as perftest does); its status.
  WcStatus poll_one() {
    Wc wc[1];
    while (cq->poll(wc) == 0) {
    }
    return wc[0].status;
  }
  Sge sge;
};

// ib_write_lat's pattern: the application busy-polls its CQ (for its own send completion), then spins on
// memory for the peer's WRITE, which only the progress thread can receive. Here the progress thread sleeps
// in its ordinary wait when the application starts polling and the WRITE arrives. Before the fix it took
// the wake-up, saw an application polling, and slept again for 20 ms with the packet unread.
TEST(Progress, PacketThatWokeItIsReadWhenTheApplicationStartedPolling) {
  if (testutil::kTsan) GTEST_SKIP() << kTsanSkip;
  Loop l(QpType::kRc);
  ASSERT_TRUE(l.ctx);
  std::vector<double> ms;
  for (uint8_t round = 1; round <= 5; ++round) {
    // Past the progress thread's sleep beside a polling application (20 ms): it is in its ordinary wait.
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    Wc wc[4];
    for (int i = 0; i < 100; ++i) ASSERT_EQ(l.cq->poll(wc), 0);  // busy-polling, as the application is marked
    l.src[0] = round;
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(l.a->post_send(l.write(0, round)));
    ms.push_back(l.wait_for(0, round, t0));
    ASSERT_EQ(l.dst[0], round);
    EXPECT_EQ(l.poll_one(), WcStatus::kSuccess);
  }
  // The best of 5, against the 20 ms a missed wake-up costs: a loaded machine may delay a few rounds.
  std::sort(ms.begin(), ms.end());
  EXPECT_LT(ms[0], 10.0) << "each round took " << ms[0] << " ms or more";
}

// The timer slack of this process's progress threads (nanoseconds), one value per thread.
std::vector<long> progress_thread_slack() {
  std::vector<long> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(e.path() / "comm");
    std::string name;
    std::getline(comm, name);
    if (name != "softrdma-prog") continue;
    long v = -1;
    // Per thread only under /proc/<tid> (the task directory has no timerslack_ns).
    std::ifstream(std::filesystem::path("/proc") / e.path().filename() / "timerslack_ns") >> v;
    out.push_back(v);
  }
  return out;
}

// A progress thread napping beside an application that makes verbs calls sleeps with a large timer slack,
// so that the scheduler's tick ends its nap rather than a timer of its own (Progress::run): each such
// timer cost the application's CPU about 25 us in a VM. Its other sleeps, which transport timers end, keep
// the default slack: once the application stops, the thread's slack is back to what it was.
TEST(Progress, NapsEndOnTheSchedulersTickAndOtherSleepsOnTime) {
  if (testutil::kTsan) GTEST_SKIP() << kTsanSkip;
  Loop l(QpType::kRc);
  ASSERT_TRUE(l.ctx);
  const std::vector<long> before = progress_thread_slack();
  ASSERT_EQ(before.size(), 1u) << "one context, one progress thread named softrdma-prog";
  const Counters& c = l.ctx->counters();
  const uint64_t naps0 = c.get(Counter::progress_naps);
  // A ping-pong of WRITEs and polls, as ib_write_lat's (bounded: 2 s), looking at the slack now and then.
  bool napped = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (uint32_t i = 0; !napped && std::chrono::steady_clock::now() < until; ++i) {
    ASSERT_TRUE(l.a->post_send(l.write(0, i)));
    ASSERT_EQ(l.poll_one(), WcStatus::kSuccess);
    if (i % 64 == 63) napped = progress_thread_slack().at(0) > before[0];
  }
  EXPECT_TRUE(napped) << "the progress thread's slack stayed at " << before[0] << " ns while the application polled";
  EXPECT_GT(c.get(Counter::progress_naps), naps0);  // counted, and among the sleeps
  EXPECT_GE(c.get(Counter::progress_sleeps), c.get(Counter::progress_naps));
  // The application stopped: the next nap ends by a tick at the latest, and the sleep after it watches.
  long after = -1;
  for (int i = 0; i < 200 && (after = progress_thread_slack().at(0)) != before[0]; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(after, before[0]);
}

// ib_write_lat's pattern over UC: the application posts a WRITE, finds its completion at once (UC has no
// ACK to wait for) and spins on memory for the peer's WRITE, which only the progress thread can receive.
// Its verbs calls are no sign that it receives: a progress thread that napped beside it (not watching the
// sockets, 200 us at least) left each WRITE unread until the nap ended.
TEST(Progress, ApplicationThatNeverPollsAnEmptyCqGetsItsPacketsReceived) {
  if (testutil::kTsan) GTEST_SKIP() << kTsanSkip;
  Loop l(QpType::kUc);
  ASSERT_TRUE(l.ctx);
  std::vector<double> ms;
  for (uint32_t i = 1; i <= 200; ++i) {
    const auto v = static_cast<uint8_t>(i);
    l.src[0] = v;
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(l.a->post_send(l.write(0, i)));
    ASSERT_EQ(l.poll_one(), WcStatus::kSuccess);
    ms.push_back(l.wait_for(0, v, t0));
    ASSERT_EQ(l.dst[0], v);
  }
  // The 10th percentile, against the 0.2 ms a nap lasts at least: most rounds may be slow on a loaded
  // machine, not nine in ten.
  std::sort(ms.begin(), ms.end());
  EXPECT_LT(ms[ms.size() / 10], 0.15) << "a WRITE took " << ms[ms.size() / 10] << " ms or more in 9 rounds of 10";
}

// UC posts in a row with no poll between wait for the poster's next poll (Qp::post_send). An application
// that never polls gets them sent by the progress thread when the QP's cork timer fires.
TEST(Progress, PostsInARowGoOutWithoutAPoll) {
  if (testutil::kTsan) GTEST_SKIP() << kTsanSkip;
  Loop l(QpType::kUc);
  ASSERT_TRUE(l.ctx);
  for (uint32_t i = 0; i < 5; ++i) l.src[i] = static_cast<uint8_t>(i + 1);
  const auto t0 = std::chrono::steady_clock::now();
  for (uint32_t i = 0; i < 5; ++i) ASSERT_TRUE(l.a->post_send(l.write(i, i)));
  l.wait_for(4, 5, t0);
  EXPECT_EQ(std::memcmp(l.src.data(), l.dst.data(), 5), 0);
  Wc wc[8];
  int got = 0;
  for (int i = 0; i < 1000 && got < 5; ++i) got += l.cq->poll(std::span(wc + got, 5 - got));
  EXPECT_EQ(got, 5);
}

}  // namespace
}  // namespace softrdma
