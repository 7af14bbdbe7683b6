// A peer process killed with SIGKILL in the middle of a transfer: the survivor's QP fails with
// RETRY_EXC_ERR within what its timeout and retry_cnt promise, raises an async QP event, and the survivor
// connects a new QP to a restarted peer. The peer is a child process (fork) that serves RDMA WRITEs.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "softrdma/connect.h"
#include "softrdma/softrdma.h"
#include "util/env.h"
#include "util/socket_path.h"
#include "util/wr.h"
#include "util/sanitizer.h"

namespace softrdma {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kBuf = 1 << 20;

// The child: a QP and a buffer that the parent writes to, until it is killed (or for 60 s at most).
[[noreturn]] void serve(int fd) {
  auto ctx = Context::open("sr_lo");
  if (!ctx) _exit(2);
  auto pd = *(*ctx)->alloc_pd();
  auto cq = *(*ctx)->create_cq(16);
  std::vector<uint8_t> buf(kBuf);
  auto mr = *pd->reg_mr(buf.data(), buf.size(), kLocalWrite | kRemoteWrite);
  QpInit init;
  init.send_cq = init.recv_cq = cq.get();
  auto qp = *pd->create_qp(init);
  const PeerInfo mine = local_info(**ctx, *qp, mr.get());
  auto peer = exchange(fd, mine);
  if (!peer || !connect_qp(**ctx, *qp, mine, *peer)) _exit(3);
  char ready = 1;
  if (write(fd, &ready, 1) != 1) _exit(4);
  sleep(60);
  _exit(0);
}

struct Peer {
  pid_t pid = -1;
  int fd = -1;
  ~Peer() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    if (fd >= 0) close(fd);
  }
};

// A child that, once connected, WRITEs 8 bytes of 0x11 to the start of the parent's buffer, then polls its
// CQ until the parent's WRITE of 0x77 lands at byte 100 of its own buffer, and exits at once with exit(0),
// closing nothing.
[[noreturn]] void write_then_exit(int fd) {
  auto ctx = testutil::open_socket_path();  // on the same-host path, the parent's WRITE needs no ACK
  if (!ctx) _exit(2);
  auto pd = *ctx->alloc_pd();
  auto cq = *ctx->create_cq(16);
  std::vector<uint8_t> buf(4096, 0x11);
  auto mr = *pd->reg_mr(buf.data(), buf.size(), kLocalWrite | kRemoteWrite);
  QpInit init;
  init.send_cq = init.recv_cq = cq.get();
  auto qp = *pd->create_qp(init);
  const PeerInfo mine = local_info(*ctx, *qp, mr.get());
  auto peer = exchange(fd, mine);
  if (!peer || !connect_qp(*ctx, *qp, mine, *peer)) _exit(3);
  char ready = 1;
  if (write(fd, &ready, 1) != 1) _exit(4);
  // A QP that has sent defers its ACKs to its next post (Transport::end_burst).
  Sge s = mr->sge(0, 8);
  if (!qp->post_send(testutil::signaled_write(s, peer->addr, peer->rkey, 1))) _exit(5);
  Wc wc;
  const auto end = Clock::now() + std::chrono::seconds(10);
  while (cq->poll(std::span(&wc, 1)) == 0)
    if (Clock::now() > end) _exit(6);
  if (wc.status != WcStatus::kSuccess) _exit(7);
  const volatile uint8_t* flag = buf.data() + 100;
  while (*flag != 0x77) {
    cq->poll(std::span(&wc, 1));  // this thread receives the WRITE, and its ACK waits
    if (Clock::now() > end) _exit(8);
  }
  std::exit(0);
}

// Starts a child peer running `body`; returns its side-channel socket in `p`.
void start_peer(Peer& p, void (*body)(int) = serve) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  p.pid = fork();
  ASSERT_GE(p.pid, 0);
  if (p.pid == 0) {
    close(sv[0]);
    body(sv[1]);
    _exit(0);
  }
  close(sv[1]);
  p.fd = sv[0];
}

struct Survivor {
  std::unique_ptr<Context> ctx;
  std::unique_ptr<ProtectionDomain> pd;
  std::unique_ptr<CompletionQueue> cq;
  std::vector<uint8_t> buf = std::vector<uint8_t>(kBuf, 0x5A);
  std::unique_ptr<MemoryRegion> mr;
  std::unique_ptr<QueuePair> qp;
  PeerInfo peer;

  void connect(Peer& p, const ConnectOptions& opt) {
    QpInit init;
    init.send_cq = init.recv_cq = cq.get();
    qp = *pd->create_qp(init);
    const PeerInfo mine = local_info(*ctx, *qp, mr.get());
    auto got = exchange(p.fd, mine);
    ASSERT_TRUE(got);
    peer = *got;
    ASSERT_TRUE(connect_qp(*ctx, *qp, mine, peer, opt));
    char ready = 0;
    ASSERT_EQ(read(p.fd, &ready, 1), 1);
  }
  void post_write(uint32_t len, uint64_t id) {
    Sge s = mr->sge(0, len);
    ASSERT_TRUE(qp->post_send(testutil::signaled_write(s, peer.addr, peer.rkey, id)));
  }
  // The next completion, or a failure after `limit`.
  Wc next(std::chrono::milliseconds limit) {
    Wc wc;
    wc.status = WcStatus::kGeneralErr;
    const auto end = Clock::now() + limit;
    while (Clock::now() < end)
      if (cq->poll(std::span(&wc, 1)) == 1) return wc;
    ADD_FAILURE() << "no completion within " << limit.count() << " ms";
    return wc;
  }
};

TEST(PeerFailure, KilledPeerGivesRetryExceededAndAQpEventThenReconnects) {
  if (testutil::kTsan) GTEST_SKIP() << "TSan cannot start threads in a child of a multi-threaded process";
  Peer first;
  ASSERT_NO_FATAL_FAILURE(start_peer(first));
  Survivor s;
  // The 1 MiB WRITEs below must be in flight when the peer dies: on the same host a stream of them would
  // go one-sided and complete at once (SOFTRDMA_DIRECT_STREAM), so this context sends them as packets.
  auto ctx = [] {
    testutil::ScopedEnv streams_on_rings("SOFTRDMA_DIRECT_STREAM", "0");
    return Context::open("sr_lo");
  }();
  ASSERT_TRUE(ctx);
  s.ctx = std::move(*ctx);
  s.pd = *s.ctx->alloc_pd();
  s.cq = *s.ctx->create_cq(256);
  s.mr = *s.pd->reg_mr(s.buf.data(), s.buf.size(), kLocalWrite);
  ConnectOptions opt;
  opt.timeout = 12;  // 4.096 us x 2^12 = 16.8 ms
  opt.retry_cnt = 3;
  ASSERT_NO_FATAL_FAILURE(s.connect(first, opt));

  // Writes in flight, then the peer dies with some of them unacknowledged.
  for (uint64_t i = 0; i < 20; ++i) {
    ASSERT_NO_FATAL_FAILURE(s.post_write(64 * 1024, i));
    EXPECT_EQ(s.next(std::chrono::seconds(10)).status, WcStatus::kSuccess);
  }
  for (uint64_t i = 100; i < 108; ++i) ASSERT_NO_FATAL_FAILURE(s.post_write(kBuf, i));
  ASSERT_EQ(kill(first.pid, SIGKILL), 0);
  const auto killed = Clock::now();

  // Completions: successes for what the peer acknowledged before it died, then RETRY_EXC_ERR for the
  // oldest unacknowledged WRITE and WR_FLUSH_ERR for the rest.
  Wc wc;
  do {
    wc = s.next(std::chrono::seconds(10));
  } while (wc.status == WcStatus::kSuccess);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - killed).count();
  EXPECT_EQ(wc.status, WcStatus::kRetryExcErr);
  // retry_cnt + 1 timeouts of 16.8 ms (67 ms), with room for a loaded machine: the timer starts at the
  // last packet sent, and the detection is bounded by the promise, not by seconds.
  const double promised = (opt.retry_cnt + 1) * 4.096e-3 * (1 << opt.timeout);
  std::printf("peer killed: RETRY_EXC_ERR after %.1f ms (promised %.1f ms)\n", ms, promised);
  EXPECT_GE(ms, promised * 0.5);
  EXPECT_LE(ms, promised * 3 + 200);
  for (uint64_t left = 107 - wc.wr_id; left > 0; --left)
    EXPECT_EQ(s.next(std::chrono::seconds(1)).status, WcStatus::kWrFlushErr);

  core::Context* c = s.ctx->core();
  pollfd p{c->async_fd(), POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 1000), 1);
  auto ev = c->get_async_event();
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->type, kEventQpFatal);
  EXPECT_EQ(ev->object, s.qp->core());

  // A restarted peer: a new QP of the same context connects and moves data.
  Peer second;
  ASSERT_NO_FATAL_FAILURE(start_peer(second));
  s.qp.reset();
  ASSERT_NO_FATAL_FAILURE(s.connect(second, opt));
  ASSERT_NO_FATAL_FAILURE(s.post_write(kBuf, 7));
  EXPECT_EQ(s.next(std::chrono::seconds(10)).status, WcStatus::kSuccess);
}

// A peer that exits right after it received a WRITE, without destroying or closing anything, while the ACK
// for that WRITE was deferred: the exit handler (core::Context::flush_deferred_acks_at_exit) sends it, so
// the WRITE completes with success, as it would with a NIC, rather than with RETRY_EXC_ERR.
TEST(PeerFailure, PeerThatExitsWithoutClosingStillAcknowledges) {
  if (testutil::kTsan) GTEST_SKIP() << "TSan cannot start threads in a child of a multi-threaded process";
  Peer child;
  ASSERT_NO_FATAL_FAILURE(start_peer(child, write_then_exit));
  Survivor s;
  s.ctx = testutil::open_socket_path();
  ASSERT_TRUE(s.ctx);
  s.pd = *s.ctx->alloc_pd();
  s.cq = *s.ctx->create_cq(16);
  s.mr = *s.pd->reg_mr(s.buf.data(), s.buf.size(), kLocalWrite | kRemoteWrite);
  ConnectOptions opt;
  opt.timeout = 12;  // 16.8 ms, 4 tries: a lost ACK fails the WRITE within about 70 ms
  opt.retry_cnt = 3;
  ASSERT_NO_FATAL_FAILURE(s.connect(child, opt));
  const volatile uint8_t* first = s.buf.data();
  const auto end = Clock::now() + std::chrono::seconds(10);
  while (first[0] != 0x11 || first[7] != 0x11) ASSERT_LT(Clock::now(), end) << "the child's WRITE never came";
  s.buf[100] = 0x77;
  Sge sge = s.mr->sge(100, 1);
  ASSERT_TRUE(s.qp->post_send(testutil::signaled_write(sge, s.peer.addr + 100, s.peer.rkey, 9)));
  const Wc wc = s.next(std::chrono::seconds(5));
  EXPECT_EQ(wc.status, WcStatus::kSuccess);
  int status = 0;
  ASSERT_EQ(waitpid(child.pid, &status, 0), child.pid);
  child.pid = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

}  // namespace
}  // namespace softrdma
