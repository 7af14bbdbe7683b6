// The native API over a real context on sr_lo: objects, their limits and the errno of each misuse (the
// value rdma-core/rxe return), completion channels, solicited events, CQ overflow and the SRQ limit event.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstring>
#include <expected>
#include <thread>
#include <vector>

#include "softrdma/connect.h"
#include "softrdma/softrdma.h"
#include "util/env.h"
#include "util/sanitizer.h"
#include "util/wr.h"

namespace softrdma {
namespace {

std::unique_ptr<Context> open_lo() {
  auto ctx = Context::open("sr_lo");
  EXPECT_TRUE(ctx.has_value()) << (ctx ? 0 : ctx.error());
  return ctx ? std::move(*ctx) : nullptr;
}

TEST(Api, OpenUnknownDeviceIsEnodev) {
  auto ctx = Context::open("sr_no_such_interface");
  ASSERT_FALSE(ctx);
  EXPECT_EQ(ctx.error(), ENODEV);
  OpenOptions bad;
  bad.gid_index = 999;
  auto ctx2 = Context::open("sr_lo", bad);
  ASSERT_FALSE(ctx2);
  EXPECT_EQ(ctx2.error(), EINVAL);
}

TEST(Api, DeviceListHasLoWithRoceV2Gids) {
  bool found = false;
  for (const DeviceInfo& d : list_devices()) {
    if (d.name != "sr_lo") continue;
    found = true;
    ASSERT_GE(d.gids.size(), 2u);
    EXPECT_EQ(d.gids[1].gid.to_string(), "127.0.0.1");
    EXPECT_TRUE(d.gids[1].roce_v2);
    EXPECT_EQ(d.active_mtu, Mtu::k4096);
  }
  EXPECT_TRUE(found);
}

TEST(Api, RegMrChecksAccess) {
  auto ctx = open_lo();
  auto pd = *ctx->alloc_pd();
  std::vector<uint8_t> buf(4096);
  // Remote write or atomic without local write: EINVAL, as ibv_reg_mr.
  auto mr = pd->reg_mr(buf.data(), buf.size(), kRemoteWrite);
  ASSERT_FALSE(mr);
  EXPECT_EQ(mr.error(), EINVAL);
  mr = pd->reg_mr(buf.data(), buf.size(), kRemoteAtomic);
  ASSERT_FALSE(mr);
  EXPECT_EQ(mr.error(), EINVAL);
  mr = pd->reg_mr(nullptr, 100, kLocalWrite);
  ASSERT_FALSE(mr);
  EXPECT_EQ(mr.error(), EINVAL);
  auto ok = pd->reg_mr(buf.data(), buf.size(), kLocalWrite | kRemoteWrite | kRemoteRead);
  ASSERT_TRUE(ok);
  auto ok2 = pd->reg_mr(buf.data(), buf.size(), kLocalWrite);
  ASSERT_TRUE(ok2);
  EXPECT_NE((*ok)->rkey(), (*ok2)->rkey());  // distinct random keys
}

TEST(Api, InUseObjectsAreBusy) {
  auto ctx = open_lo();
  auto pd = *ctx->alloc_pd();
  std::vector<uint8_t> buf(4096);
  auto mr = *pd->reg_mr(buf.data(), buf.size(), kLocalWrite);
  auto cq = *ctx->create_cq(16);
  QpInit init;
  init.send_cq = init.recv_cq = cq.get();
  auto qp = *pd->create_qp(init);
  core::Context* c = ctx->core();
  // What the handles' destructors call: refused while something still uses the object (ibv_dealloc_pd and
  // ibv_destroy_cq return EBUSY).
  EXPECT_EQ(c->dealloc_pd(pd->core()), EBUSY);
  EXPECT_EQ(c->destroy_cq(cq->core()), EBUSY);
  qp.reset();
  cq.reset();
  EXPECT_EQ(c->dealloc_pd(pd->core()), EBUSY);  // still the MR
  mr.reset();
  core::Pd* raw = pd->core();
  EXPECT_EQ(raw->users.load(), 0u);  // nothing holds it now: the handle's destructor frees it
}

TEST(Api, CreateCqLimits) {
  auto ctx = open_lo();
  auto cq = ctx->create_cq(0);
  ASSERT_FALSE(cq);
  EXPECT_EQ(cq.error(), EINVAL);
  cq = ctx->create_cq(core::kMaxCqe + 1);
  ASSERT_FALSE(cq);
  EXPECT_EQ(cq.error(), EINVAL);
  EXPECT_TRUE(ctx->create_cq(1));
}

TEST(Api, CreateQpLimits) {
  auto ctx = open_lo();
  auto pd = *ctx->alloc_pd();
  auto cq = *ctx->create_cq(16);
  QpInit init;
  init.send_cq = init.recv_cq = cq.get();
  init.cap = {16, 16, core::kMaxSge + 1, 1, 0};
  auto qp = pd->create_qp(init);
  ASSERT_FALSE(qp);
  EXPECT_EQ(qp.error(), EINVAL);
  init.cap = {core::kMaxQpWr + 1, 16, 1, 1, 0};
  qp = pd->create_qp(init);
  ASSERT_FALSE(qp);
  EXPECT_EQ(qp.error(), EINVAL);
  init.cap = {16, 16, 1, 1, core::kMaxInline + 1};
  qp = pd->create_qp(init);
  ASSERT_FALSE(qp);
  EXPECT_EQ(qp.error(), EINVAL);
  init.cap = {16, 16, 1, 1, 0};
  init.send_cq = nullptr;
  qp = pd->create_qp(init);
  ASSERT_FALSE(qp);
  EXPECT_EQ(qp.error(), EINVAL);
}

// Two RC QPs on one context, connected to each other through the UDP socket(s) of sr_lo.
struct Loop {
  std::unique_ptr<Context> ctx = open_lo();
  std::unique_ptr<ProtectionDomain> pd = *ctx->alloc_pd();
  std::unique_ptr<CompletionChannel> ch = *ctx->create_comp_channel();
  std::unique_ptr<CompletionQueue> cq_a;
  std::unique_ptr<CompletionQueue> cq_b = *ctx->create_cq(4, ch.get());
  std::unique_ptr<QueuePair> a, b;
  std::vector<uint8_t> buf = std::vector<uint8_t>(1 << 16);
  std::unique_ptr<MemoryRegion> mr =
      *pd->reg_mr(buf.data(), buf.size(), kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic);

  // `a_events`: a's CQ is on the channel too.
  explicit Loop(bool connect = true, bool a_events = false)
      : cq_a(*ctx->create_cq(64, a_events ? ch.get() : nullptr)) {
    QpInit init;
    init.send_cq = init.recv_cq = cq_a.get();
    a = *pd->create_qp(init);
    init.send_cq = init.recv_cq = cq_b.get();
    b = *pd->create_qp(init);
    if (!connect) return;
    PeerInfo ia = local_info(*ctx, *a, mr.get()), ib = local_info(*ctx, *b, mr.get());
    EXPECT_TRUE(connect_qp(*ctx, *a, ia, ib));
    EXPECT_TRUE(connect_qp(*ctx, *b, ib, ia));
  }
  Wc wait(CompletionQueue& cq) {
    Wc wc;
    for (int i = 0; i < 2'000'000; ++i)
      if (cq.poll(std::span(&wc, 1)) == 1) return wc;
    ADD_FAILURE() << "no completion";
    return wc;
  }
  SendWr send(uint64_t off, uint32_t len, Sge* s, uint32_t flags = kSendSignaled) {
    *s = mr->sge(off, len);
    SendWr wr;
    wr.opcode = WrOpcode::kSend;
    wr.send_flags = flags;
    wr.sg_list = std::span(s, 1);
    return wr;
  }
};

TEST(Api, PostSendBeforeRtsIsEinval) {
  Loop l(false);
  Sge s;
  auto r = l.a->post_send(l.send(0, 8, &s));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), EINVAL);  // RESET
  Sge rs = l.mr->sge(0, 8);
  auto rr = l.a->post_recv(RecvWr{1, std::span(&rs, 1)});
  ASSERT_FALSE(rr);
  EXPECT_EQ(rr.error(), EINVAL);  // post_recv in RESET
  QpAttr at;
  at.qp_state = QpState::kInit;
  at.qp_access_flags = kLocalWrite;
  ASSERT_TRUE(l.a->modify(at, kQpState | kQpPkeyIndex | kQpPort | kQpAccessFlags));
  r = l.a->post_send(l.send(0, 8, &s));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), EINVAL);  // INIT
  // A missing required attribute (RTR needs AV, PATH_MTU, DEST_QPN, RQ_PSN, MAX_DEST_RD_ATOMIC, MIN_RNR_TIMER).
  at.qp_state = QpState::kRtr;
  auto m = l.a->modify(at, kQpState | kQpPathMtu);
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error(), EINVAL);
}

TEST(Api, SendRecvAndTooLargeInline) {
  Loop l;
  std::memcpy(l.buf.data(), "hello, world", 12);
  Sge rs = l.mr->sge(1000, 100);
  ASSERT_TRUE(l.b->post_recv(RecvWr{7, std::span(&rs, 1)}));
  Sge s;
  ASSERT_TRUE(l.a->post_send(l.send(0, 12, &s)));
  Wc wc = l.wait(*l.cq_b);
  EXPECT_EQ(wc.status, WcStatus::kSuccess);
  EXPECT_EQ(wc.wr_id, 7u);
  EXPECT_EQ(wc.byte_len, 12u);
  EXPECT_EQ(std::memcmp(l.buf.data() + 1000, "hello, world", 12), 0);
  EXPECT_EQ(l.wait(*l.cq_a).status, WcStatus::kSuccess);
  // Inline data above max_inline_data (64 here) fails the post.
  auto r = l.a->post_send(l.send(0, 65, &s, kSendSignaled | kSendInline));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), EINVAL);
}

TEST(Api, CompletionChannelAndSolicitedEvents) {
  Loop l;
  ASSERT_TRUE(l.cq_b->req_notify(/*solicited_only=*/true));
  Sge rs[2] = {l.mr->sge(1000, 100), l.mr->sge(2000, 100)};
  ASSERT_TRUE(l.b->post_recv(RecvWr{1, std::span(&rs[0], 1)}));
  ASSERT_TRUE(l.b->post_recv(RecvWr{2, std::span(&rs[1], 1)}));
  Sge s;
  ASSERT_TRUE(l.a->post_send(l.send(0, 8, &s)));  // not solicited: no event
  l.wait(*l.cq_a);
  pollfd p{l.ch->fd(), POLLIN, 0};
  Wc wc = l.wait(*l.cq_b);
  EXPECT_EQ(wc.wr_id, 1u);
  EXPECT_EQ(poll(&p, 1, 50), 0) << "an unsolicited completion fired a solicited-only CQ";
  ASSERT_TRUE(l.a->post_send(l.send(0, 8, &s, kSendSignaled | kSendSolicited)));
  l.wait(*l.cq_a);
  ASSERT_EQ(poll(&p, 1, 5000), 1) << "a solicited completion did not fire the channel";
  auto cq = l.ch->get_event();
  ASSERT_TRUE(cq);
  EXPECT_EQ(*cq, l.cq_b.get());
}

// A thread blocked in get_event receives the packets itself (core::Context::wait_for_event), sleeping on
// the sockets: the SEND posted by another thread while it waits wakes it with its event.
TEST(Api, BlockingGetEventReceivesOnTheWaitingThread) {
  Loop l;
  const uint64_t sleeps = l.ctx->counters().get(Counter::event_wait_sleeps);
  ASSERT_TRUE(l.cq_b->req_notify());
  Sge rs = l.mr->sge(1000, 100);
  ASSERT_TRUE(l.b->post_recv(RecvWr{5, std::span(&rs, 1)}));
  std::memcpy(l.buf.data(), "while waiting", 13);
  std::thread sender([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // get_event is asleep by then
    Sge s;
    EXPECT_TRUE(l.a->post_send(l.send(0, 13, &s)));
  });
  auto cq = l.ch->get_event();
  sender.join();
  ASSERT_TRUE(cq);
  EXPECT_EQ(*cq, l.cq_b.get());
  Wc wc = l.wait(*l.cq_b);
  EXPECT_EQ(wc.wr_id, 5u);
  EXPECT_EQ(std::memcmp(l.buf.data() + 1000, "while waiting", 13), 0);
  EXPECT_GT(l.ctx->counters().get(Counter::event_wait_sleeps), sleeps)
      << "get_event did not wait on the sockets";
  EXPECT_EQ(l.wait(*l.cq_a).status, WcStatus::kSuccess);
}

// Events that fire while a thread waits in get_event, taken by that thread without the fd's count: the
// one it returns is gone, the others are on the fd for the next call (which must not block), and none is
// left behind. Each round: a SEND's receive and its send completion (the ACK), on one channel. From the
// second round on the progress thread sleeps beside the waiting thread (the lease), which then receives.
TEST(Api, EventsThatFireDuringAWaitAreEachTakenOnce) {
  Loop l(true, /*a_events=*/true);
  Sge rs = l.mr->sge(1000, 100), s;
  for (int round = 0; round < 20; ++round) {
    SCOPED_TRACE(round);
    ASSERT_TRUE(l.cq_a->req_notify());
    ASSERT_TRUE(l.cq_b->req_notify());
    ASSERT_TRUE(l.b->post_recv(RecvWr{4, std::span(&rs, 1)}));
    std::thread sender([&] {
      std::this_thread::sleep_for(std::chrono::microseconds(300));
      EXPECT_TRUE(l.a->post_send(l.send(0, 8, &s)));
    });
    std::vector<CompletionQueue*> got;
    for (int i = 0; i < 2; ++i) {
      auto cq = l.ch->get_event();
      ASSERT_TRUE(cq);
      got.push_back(*cq);
    }
    sender.join();
    EXPECT_NE(got[0], got[1]);
    pollfd p{l.ch->fd(), POLLIN, 0};
    ASSERT_EQ(poll(&p, 1, 0), 0) << "an event counted on the fd twice";
    EXPECT_EQ(l.wait(*l.cq_b).wr_id, 4u);
    EXPECT_EQ(l.wait(*l.cq_a).status, WcStatus::kSuccess);
  }
}

// The timers still run while a thread waits for events and the progress thread sleeps beside it without
// watching the sockets: a SEND that finds no receive is retried (RNR) until one is posted, 30 ms later.
TEST(Api, RnrRetriesRunWhileAThreadWaitsForEvents) {
  Loop l;
  ASSERT_TRUE(l.cq_b->req_notify());
  Sge s;
  ASSERT_TRUE(l.a->post_send(l.send(0, 8, &s)));
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    Sge rs = l.mr->sge(1000, 100);
    EXPECT_TRUE(l.b->post_recv(RecvWr{9, std::span(&rs, 1)}));
  });
  auto cq = l.ch->get_event();
  late.join();
  ASSERT_TRUE(cq);
  EXPECT_EQ(l.wait(*l.cq_b).wr_id, 9u);
  EXPECT_EQ(l.wait(*l.cq_a).status, WcStatus::kSuccess);
  EXPECT_GT(l.ctx->counters().get(Counter::rnr_retries), 0u);
}

// A signal whose handler does not restart system calls interrupts a blocking get_event with EINTR, as it
// interrupts rdma-core's blocking read() of the channel's fd; with SA_RESTART the wait goes on.
void on_usr1(int) {}
std::expected<CompletionQueue*, int> get_event_signalled(Loop& l, bool restart) {
  struct sigaction sa {
  }, old{};
  sa.sa_handler = on_usr1;
  sa.sa_flags = restart ? SA_RESTART : 0;
  sigemptyset(&sa.sa_mask);
  EXPECT_EQ(sigaction(SIGUSR1, &sa, &old), 0);
  EXPECT_TRUE(l.cq_b->req_notify());
  Sge rs = l.mr->sge(1000, 100);
  EXPECT_TRUE(l.b->post_recv(RecvWr{3, std::span(&rs, 1)}));
  const pthread_t waiter = pthread_self();
  std::thread other([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    pthread_kill(waiter, SIGUSR1);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    Sge s;
    EXPECT_TRUE(l.a->post_send(l.send(0, 8, &s)));  // the event a wait that went on gets
  });
  auto cq = l.ch->get_event();
  other.join();
  sigaction(SIGUSR1, &old, nullptr);
  return cq;
}

TEST(Api, SignalWithoutRestartInterruptsGetEvent) {
  Loop l;
  auto cq = get_event_signalled(l, false);
  ASSERT_FALSE(cq);
  EXPECT_EQ(cq.error(), EINTR);
  EXPECT_EQ(l.wait(*l.cq_b).wr_id, 3u);
}

TEST(Api, SignalWithRestartLeavesGetEventWaiting) {
  Loop l;
  auto cq = get_event_signalled(l, true);
  ASSERT_TRUE(cq);
  EXPECT_EQ(*cq, l.cq_b.get());
  EXPECT_EQ(l.wait(*l.cq_b).wr_id, 3u);
}

// A channel fd made non-blocking: get_event with nothing fired says EAGAIN at once, without waiting.
TEST(Api, NonBlockingChannelGetEventIsEagain) {
  Loop l;
  ASSERT_TRUE(l.cq_b->req_notify());
  const int fl = fcntl(l.ch->fd(), F_GETFL);
  ASSERT_EQ(fcntl(l.ch->fd(), F_SETFL, fl | O_NONBLOCK), 0);
  const uint64_t sleeps = l.ctx->counters().get(Counter::event_wait_sleeps);
  auto cq = l.ch->get_event();
  ASSERT_FALSE(cq);
  EXPECT_EQ(cq.error(), EAGAIN);
  EXPECT_EQ(l.ctx->counters().get(Counter::event_wait_sleeps), sleeps);
}

TEST(Api, CqOverflowRaisesCqError) {
  Loop l;
  // cq_b holds 4: post 6 receives and 6 sends without polling b.
  Sge rs = l.mr->sge(1000, 100);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(l.b->post_recv(RecvWr{uint64_t(i), std::span(&rs, 1)}));
  Sge s;
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(l.a->post_send(l.send(0, 8, &s)));
    l.wait(*l.cq_a);
  }
  core::Context* c = l.ctx->core();
  pollfd p{c->async_fd(), POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 5000), 1);
  auto ev = c->get_async_event();
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->type, kEventCqErr);
  EXPECT_EQ(ev->object, l.cq_b->core());
  EXPECT_TRUE(l.cq_b->core()->overflowed());
}

TEST(Api, SrqLimitEvent) {
  Loop l(false);
  auto srq = *l.pd->create_srq(16, 1, 0);
  Sge rs = l.mr->sge(0, 64);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(srq->post_recv(RecvWr{uint64_t(i), std::span(&rs, 1)}));
  ASSERT_EQ(srq->core()->modify(0, 3, 2), 0);  // arm the limit at 3 (IBV_SRQ_LIMIT)
  core::RecvWqe w;
  ASSERT_TRUE(srq->core()->pop(&w));  // 3 left: not below the limit
  core::Context* c = l.ctx->core();
  EXPECT_FALSE(c->get_async_event());
  ASSERT_TRUE(srq->core()->pop(&w));  // 2 left: fires once
  auto ev = c->get_async_event();
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->type, kEventSrqLimitReached);
  ASSERT_TRUE(srq->core()->pop(&w));
  EXPECT_FALSE(c->get_async_event()) << "the limit disarms when it fires";
  EXPECT_EQ(srq->core()->modify(0, 17, 2), EINVAL);  // a limit above max_wr
  auto bad = l.pd->create_srq(0, 1);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error(), EINVAL);
}

}  // namespace
}  // namespace softrdma

namespace softrdma {
namespace {

// Connects two QPs of one context to each other.
void connect_pair(const Context& ctx, QueuePair& a, QueuePair& b, const MemoryRegion* mr) {
  PeerInfo ia = local_info(ctx, a, mr), ib = local_info(ctx, b, mr);
  ASSERT_TRUE(connect_qp(ctx, a, ia, ib));
  ASSERT_TRUE(connect_qp(ctx, b, ib, ia));
}

// One RDMA WRITE of `len` bytes from `src` to `dst` (both in `mr`); returns its completion.
Wc write_and_wait(QueuePair& qp, CompletionQueue& cq, const MemoryRegion& src_mr, const void* src,
                  uint32_t len, uint64_t dst, uint32_t rkey) {
  Sge s{reinterpret_cast<uint64_t>(src), len, src_mr.lkey()};
  EXPECT_TRUE(qp.post_send(testutil::signaled_write(s, dst, rkey)));
  Wc wc;
  wc.status = WcStatus::kGeneralErr;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < end)
    if (cq.poll(std::span(&wc, 1)) == 1) return wc;
  ADD_FAILURE() << "no completion";
  return wc;
}

// RoCEv2 over IPv6: the context binds ::1 (GID index 2 of sr_lo).
TEST(Api, Ipv6SendAndWrite) {
  OpenOptions o;
  o.gid_index = 2;
  auto ctx = Context::open("sr_lo", o);
  ASSERT_TRUE(ctx) << ctx.error();
  ASSERT_FALSE((*ctx)->gid().is_v4());
  auto pd = *(*ctx)->alloc_pd();
  auto cq = *(*ctx)->create_cq(16);
  std::vector<uint8_t> buf(1 << 20);
  auto mr = *pd->reg_mr(buf.data(), buf.size(), kLocalWrite | kRemoteWrite);
  QpInit init;
  init.send_cq = init.recv_cq = cq.get();
  auto a = *pd->create_qp(init), b = *pd->create_qp(init);
  connect_pair(**ctx, *a, *b, mr.get());
  for (size_t i = 0; i < 300000; ++i) buf[i] = static_cast<uint8_t>(i * 7);
  const Wc wc = write_and_wait(*a, *cq, *mr, buf.data(), 300000, reinterpret_cast<uint64_t>(buf.data()) + 500000,
                               mr->rkey());
  EXPECT_EQ(wc.status, WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(buf.data(), buf.data() + 500000, 300000), 0);
}

// The largest message (2 GiB) in one RDMA WRITE, over the real UDP path.
TEST(Api, TwoGibWrite) {
  if (testutil::kTsan) GTEST_SKIP() << "under TSan, 2 GiB of checked copies take minutes (ASan runs it)";
  auto ctx = open_lo();
  auto pd = *ctx->alloc_pd();
  auto cq = *ctx->create_cq(16);
  const uint64_t len = core::kMaxMsgSize;
  std::unique_ptr<uint8_t[]> src(new uint8_t[len]), dst(new uint8_t[len]);
  for (uint64_t i = 0; i < len; i += 4096) {
    std::memset(src.get() + i, static_cast<int>((i >> 12) * 13 + 1), 4096);
    dst[i] = 0;
  }
  auto ms = *pd->reg_mr(src.get(), len, kLocalWrite);
  auto md = *pd->reg_mr(dst.get(), len, kLocalWrite | kRemoteWrite);
  QpInit init;
  init.send_cq = init.recv_cq = cq.get();
  auto a = *pd->create_qp(init), b = *pd->create_qp(init);
  connect_pair(*ctx, *a, *b, nullptr);
  const Wc wc = write_and_wait(*a, *cq, *ms, src.get(), static_cast<uint32_t>(len),
                               reinterpret_cast<uint64_t>(dst.get()), md->rkey());
  EXPECT_EQ(wc.status, WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(src.get(), dst.get(), len), 0);
}

}  // namespace
}  // namespace softrdma

namespace softrdma {
namespace {

// Standard mode over real UDP: the context binds 127.0.0.1:4791 and every QP lives behind it.
TEST(Api, StandardPortOverUdp) {
  OpenOptions o;
  o.standard_port = true;
  auto ctx = Context::open("sr_lo", o);
  ASSERT_TRUE(ctx) << ctx.error();
  auto pd = *(*ctx)->alloc_pd();
  auto cq = *(*ctx)->create_cq(16);
  std::vector<uint8_t> buf(1 << 16);
  auto mr = *pd->reg_mr(buf.data(), buf.size(), kLocalWrite | kRemoteWrite);
  QpInit init;
  init.send_cq = init.recv_cq = cq.get();
  auto qa = pd->create_qp(init);
  if (!qa && qa.error() == EADDRINUSE) GTEST_SKIP() << "UDP 4791 on 127.0.0.1 is taken on this host";
  ASSERT_TRUE(qa);
  auto a = std::move(*qa);
  auto b = *pd->create_qp(init);
  EXPECT_EQ(a->core()->port(), 4791);
  EXPECT_EQ(b->core()->port(), 4791);
  connect_pair(**ctx, *a, *b, mr.get());
  std::memcpy(buf.data(), "to port 4791", 12);
  const Wc wc = write_and_wait(*a, *cq, *mr, buf.data(), 12, reinterpret_cast<uint64_t>(buf.data()) + 100,
                               mr->rkey());
  EXPECT_EQ(wc.status, WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(buf.data() + 100, "to port 4791", 12), 0);
  // A second process-like context on the same address cannot have 4791 too.
  auto ctx2 = Context::open("sr_lo", o);
  ASSERT_TRUE(ctx2);
  auto pd2 = *(*ctx2)->alloc_pd();
  auto cq2 = *(*ctx2)->create_cq(4);
  init.send_cq = init.recv_cq = cq2.get();
  auto c = pd2->create_qp(init);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error(), EADDRINUSE);
}

// SOFTRDMA_STANDARD_PORT=1 is the same mode for programs that cannot pass OpenOptions (libibverbs); 0 is
// the default; anything else makes the device fail to open.
TEST(Api, StandardPortBySetting) {
  for (const char* bad : {"", "2", "yes", "1 "}) {
    SCOPED_TRACE(bad);
    testutil::ScopedEnv set("SOFTRDMA_STANDARD_PORT", bad);
    auto ctx = Context::open("sr_lo");
    ASSERT_FALSE(ctx.has_value());
    EXPECT_EQ(ctx.error(), EINVAL);
  }
  for (const char* v : {"0", "1"}) {
    SCOPED_TRACE(v);
    testutil::ScopedEnv set("SOFTRDMA_STANDARD_PORT", v);
    auto ctx = Context::open("sr_lo");
    ASSERT_TRUE(ctx) << ctx.error();
    auto pd = *(*ctx)->alloc_pd();
    auto cq = *(*ctx)->create_cq(4);
    QpInit init;
    init.send_cq = init.recv_cq = cq.get();
    auto qp = pd->create_qp(init);
    if (!qp && qp.error() == EADDRINUSE && v[0] == '1')
      GTEST_SKIP() << "UDP 4791 on 127.0.0.1 is taken on this host";
    ASSERT_TRUE(qp) << qp.error();
    if (v[0] == '1')
      EXPECT_EQ((*qp)->core()->port(), 4791);
    else
      EXPECT_NE((*qp)->core()->port(), 4791);
  }
}

}  // namespace
}  // namespace softrdma
