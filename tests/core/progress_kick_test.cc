// The progress thread (src/engine/progress.cc) and the timers that application threads arm while it goes
// to sleep: a timer armed after the thread read the deadlines for its sleep must still end that sleep.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "core/context.h"
#include "engine/progress.h"
#include "transport/harness.h"

namespace softrdma {
namespace {

using namespace std::chrono_literals;

// A backend with no network: what is sent is counted and goes nowhere, nothing ever arrives. The test can
// hold the progress thread in before_sleep(), which it calls after it read the deadlines for its sleep.
class HoldingBackend : public io::Backend {
 public:
  HoldingBackend() { wire::Gid::parse("10.9.8.7", &addr_); }
  std::expected<uint16_t, int> open_port(uint16_t port) override { return port ? port : 0x4000; }
  void close_port(uint16_t) override {}
  void tx_burst(std::span<io::TxPacket> pkts) override { sent.fetch_add(pkts.size()); }
  uint32_t rx_burst(io::RxPacket*, uint32_t) override { return 0; }
  int poll_fd() const override { return -1; }
  const wire::Gid& local_addr() const override { return addr_; }

  void before_sleep() override {
    std::unique_lock g(mu_);
    if (!hold_) return;
    hold_ = false;
    held_ = true;
    cv_.notify_all();
    cv_.wait(g, [this] { return !held_; });
  }
  // The progress thread's next sleep stops in before_sleep(); true once it is there (false after 5 s).
  void hold_next() {
    std::lock_guard g(mu_);
    hold_ = true;
  }
  bool wait_held() {
    std::unique_lock g(mu_);
    return cv_.wait_for(g, 5s, [this] { return held_; });
  }
  void release() {
    std::lock_guard g(mu_);
    held_ = false;
    cv_.notify_all();
  }

  std::atomic<uint64_t> sent{0};

 private:
  wire::Gid addr_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool hold_ = false, held_ = false;
};

// An RC QP connected to a peer that never answers, so that its first send arms the retransmit timer.
struct QpToNowhere {
  core::Context& ctx;
  core::Pd* pd = nullptr;
  core::Cq* cq = nullptr;
  core::Qp* qp = nullptr;

  QpToNowhere(core::Context& c, uint8_t timeout) : ctx(c) {
    pd = *ctx.alloc_pd();
    cq = *ctx.create_cq(16, nullptr, nullptr);
    core::QpInitAttr init;
    init.type = QpType::kRc;
    init.send_cq = init.recv_cq = cq;
    init.cap = {16, 16, 1, 1, 64};
    qp = *ctx.create_qp(pd, init);
    test::QpOptions o;
    o.timeout = timeout;
    wire::Gid dgid;
    wire::Gid::parse("10.9.8.6", &dgid);
    test::connect_qp(*qp, dgid, 0x4001 << 8, o);
  }
  ~QpToNowhere() {
    ctx.destroy_qp(qp);
    ctx.destroy_cq(cq);
    ctx.dealloc_pd(pd);
  }
};

// The thread sleeps with no timer (nothing armed when it looked); while it is between that look and the
// sleep, an application thread posts a send, which arms the ACK timeout (4 ms here) and kicks the thread.
// The kick must end the coming sleep: no one else runs this timer. Before the fix the kick was dropped
// (the thread's wake-up time, not yet published, read as 0), and the thread slept with no end.
TEST(ProgressKick, TimerArmedWhileTheThreadGoesToSleepEndsThatSleep) {
  HoldingBackend be;
  Counters counters;
  core::Context ctx(&be, &counters, core::ContextConfig{});
  QpToNowhere q(ctx, 10);  // 4096 ns << 10: an ACK timeout of 4.2 ms
  engine::Progress progress(&ctx);
  be.hold_next();  // its first sleep: nothing is armed yet
  ASSERT_EQ(progress.start(), 0);
  ASSERT_TRUE(be.wait_held());

  core::SendWr wr;  // an empty SEND: one packet, no memory
  wr.wr_id = 1;
  wr.send_flags = kSendSignaled;
  size_t bad;
  ASSERT_EQ(q.qp->post_send(std::span(&wr, 1), &bad), 0);
  EXPECT_EQ(be.sent.load(), 1u);
  be.release();

  // The ACK timeout fires within milliseconds and sends the packet again; 2 s allows for a loaded machine.
  // (The timeout is counted before the packet is sent again: wait for both. Under TSan a check between
  // the two once saw the count and not the send.)
  const auto end = std::chrono::steady_clock::now() + 2s;
  while ((counters.get(Counter::retry_timeouts) == 0 || be.sent.load() < 2) &&
         std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(1ms);
  EXPECT_GE(counters.get(Counter::retry_timeouts), 1u) << "the thread slept through the timer";
  EXPECT_GE(be.sent.load(), 2u);
  progress.stop();
}

}  // namespace
}  // namespace softrdma
