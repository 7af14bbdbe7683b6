// The progress thread (src/engine/progress.cc) beside an application that polls now and then: a packet
// that wakes it is received even when the application began busy-polling while it slept.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "softrdma/connect.h"
#include "softrdma/softrdma.h"
#include "util/wr.h"

namespace softrdma {
namespace {

// Opens sr_lo on the socket path (UDP), whatever the environment says, and gives the setting back.
std::unique_ptr<Context> open_socket_path() {
  const char* old = std::getenv("SOFTRDMA_SHM");
  const std::string saved = old ? old : "";
  setenv("SOFTRDMA_SHM", "0", 1);
  auto ctx = Context::open("sr_lo");
  if (old)
    setenv("SOFTRDMA_SHM", saved.c_str(), 1);
  else
    unsetenv("SOFTRDMA_SHM");
  return ctx ? std::move(*ctx) : nullptr;
}

// ib_write_lat's pattern: the application busy-polls its CQ (for its own send completion), then spins on
// memory for the peer's WRITE, which only the progress thread can receive. Here the progress thread sleeps
// in its ordinary wait when the application starts polling and the WRITE arrives. Before the fix it took
// the wake-up, saw an application polling, and slept again for 20 ms with the packet unread.
TEST(Progress, PacketThatWokeItIsReadWhenTheApplicationStartedPolling) {
  auto ctx = open_socket_path();
  ASSERT_TRUE(ctx);
  auto pd = *ctx->alloc_pd();
  auto cq = *ctx->create_cq(64);
  std::vector<uint8_t> src(64, 0), dst(64, 0);
  auto smr = *pd->reg_mr(src.data(), src.size(), kLocalWrite);
  auto dmr = *pd->reg_mr(dst.data(), dst.size(), kLocalWrite | kRemoteWrite);
  QpInit init;
  init.send_cq = init.recv_cq = cq.get();
  auto a = *pd->create_qp(init);
  auto b = *pd->create_qp(init);
  PeerInfo ia = local_info(*ctx, *a, nullptr), ib = local_info(*ctx, *b, dmr.get());
  ASSERT_TRUE(connect_qp(*ctx, *a, ia, ib, {}));
  ASSERT_TRUE(connect_qp(*ctx, *b, ib, ia, {}));
  const auto remote = reinterpret_cast<uint64_t>(dst.data());
  std::vector<double> ms;
  for (uint8_t round = 1; round <= 5; ++round) {
    // Past the progress thread's sleep beside a polling application (20 ms): it is in its ordinary wait.
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    Wc wc[4];
    for (int i = 0; i < 100; ++i) ASSERT_EQ(cq->poll(wc), 0);  // busy-polling, as the application is marked
    src[0] = round;
    Sge s = smr->sge(0, 1);
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(a->post_send(testutil::signaled_write(s, remote, dmr->rkey(), round)));
    const auto deadline = t0 + std::chrono::seconds(2);
    while (std::atomic_ref<uint8_t>(dst[0]).load(std::memory_order_acquire) != round &&
           std::chrono::steady_clock::now() < deadline) {
    }
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    ASSERT_EQ(dst[0], round);
    while (cq->poll(std::span(wc, 1)) == 0) {
    }
    EXPECT_EQ(wc[0].status, WcStatus::kSuccess);
  }
  // The best of 5, against the 20 ms a missed wake-up costs: a loaded machine may delay a few rounds.
  std::sort(ms.begin(), ms.end());
  EXPECT_LT(ms[0], 10.0) << "each round took " << ms[0] << " ms or more";
}

}  // namespace
}  // namespace softrdma
