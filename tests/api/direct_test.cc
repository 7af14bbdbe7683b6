// The same-host one-sided path (io/shm/access_table.h) through the native API on sr_lo: a WRITE or READ
// posted alone, with nothing outstanding, moves its data in the peer's memory with no packet; every check
// the responder would make still holds (a failed one sends the request the ordinary way, whose responder
// NAKs it); a stream of posts goes through the rings, but for its ops of 64 KiB or more.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <span>
#include <thread>
#include <vector>

#include "softrdma/connect.h"
#include "softrdma/softrdma.h"
#include "util/env.h"
#include "util/maps.h"
#include "util/wr.h"

namespace softrdma {
namespace {

bool direct_path_on() {
  for (const char* var : {"SOFTRDMA_SHM", "SOFTRDMA_DIRECT"})
    if (const char* v = std::getenv(var); v && std::strcmp(v, "0") == 0) return false;
  return std::getenv("SOFTRDMA_FAULTS") == nullptr;
}

// SOFTRDMA_SHARE_MR=1 for the contexts opened in its life (read when a context opens).
testutil::ScopedEnv share_mr(bool on) { return {"SOFTRDMA_SHARE_MR", on ? "1" : nullptr}; }

// How far from `p` its next page begins (0 if `p` is page-aligned).
uint64_t first_page_of(const uint8_t* p) {
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return (page - reinterpret_cast<uint64_t>(p) % page) % page;
}

struct Pair {
  std::unique_ptr<Context> ctx;
  std::unique_ptr<ProtectionDomain> pd, pd2;
  std::unique_ptr<CompletionQueue> cq;
  std::unique_ptr<QueuePair> a, b;
  std::vector<uint8_t> src = std::vector<uint8_t>(1 << 20);
  // The destination starts 16 bytes into a page, as glibc's malloc places a large block (a sanitizer's
  // allocator may align it to the page): its first and last pages are partial.
  std::vector<uint8_t> dst_store = std::vector<uint8_t>((1 << 20) + 8192);
  std::span<uint8_t> dst{dst_store.data() + first_page_of(dst_store.data()) + 16, 1 << 20};
  std::unique_ptr<MemoryRegion> smr, dmr;

  explicit Pair(uint32_t b_access = kLocalWrite | kRemoteWrite | kRemoteRead,
                uint32_t dmr_access = kLocalWrite | kRemoteWrite | kRemoteRead, uint8_t b_rd_atomic = 16,
                QpType type = QpType::kRc) {
    ctx = std::move(*Context::open("sr_lo"));
    pd = *ctx->alloc_pd();
    pd2 = *ctx->alloc_pd();
    cq = *ctx->create_cq(64);
    smr = *pd->reg_mr(src.data(), src.size(), kLocalWrite);
    dmr = *pd->reg_mr(dst.data(), dst.size(), dmr_access);
    QpInit init;
    init.type = type;
    init.send_cq = init.recv_cq = cq.get();
    a = *pd->create_qp(init);
    b = *pd->create_qp(init);
    PeerInfo ia = local_info(*ctx, *a, nullptr), ib = local_info(*ctx, *b, dmr.get());
    ConnectOptions oa, ob;
    ob.access = b_access;
    ob.rd_atomic = b_rd_atomic;
    EXPECT_TRUE(connect_qp(*ctx, *a, ia, ib, oa));
    EXPECT_TRUE(connect_qp(*ctx, *b, ib, ia, ob));
  }
  uint64_t direct_ops() { return ctx->counters().get(Counter::direct_ops); }
  uint64_t shared_ops() { return ctx->counters().get(Counter::direct_shared_ops); }
  uint64_t mem_file_ops() { return ctx->counters().get(Counter::direct_mem_file_ops); }
  // The offset of dst's first whole page (the pages that SOFTRDMA_SHARE_MR=1 moves begin there).
  uint64_t first_page() const { return first_page_of(dst.data()); }
  uint64_t tx_packets() { return ctx->counters().get(Counter::tx_packets); }
  uint64_t drop_uc_msg() { return ctx->counters().get(Counter::drop_uc_msg); }
  uint64_t ring_lone_writes() { return ctx->counters().get(Counter::ring_lone_writes); }
  // A QP's first small WRITE posted alone goes through the ring, to see whether the peer answers (a
  // ping-pong, Transport::lone_write_by_ring); through pages the peer shares it is a memcpy either way.
  void probe_ring(uint64_t off, bool share) {
    const uint64_t ops = direct_ops(), packets = tx_packets(), ring = ring_lone_writes();
    Sge s = smr->sge(0, 8);
    ASSERT_TRUE(a->post_send(op(WrOpcode::kRdmaWrite, s, off, dmr->rkey())));
    EXPECT_EQ(wait().status, WcStatus::kSuccess);
    EXPECT_EQ(std::memcmp(dst.data() + off, src.data(), 8), 0);
    EXPECT_EQ(direct_ops(), share ? ops + 1 : ops);
    EXPECT_EQ(ring_lone_writes(), share ? ring : ring + 1);
    if (!share) {
      EXPECT_GT(tx_packets(), packets);
    }
  }
  Wc wait() {
    Wc wc;
    for (int i = 0; i < 5'000'000; ++i)
      if (cq->poll(std::span(&wc, 1)) == 1) return wc;
    ADD_FAILURE() << "no completion";
    return wc;
  }
  SendWr op(WrOpcode opcode, const Sge& s, uint64_t off, uint32_t rkey) {
    SendWr wr = testutil::signaled_write(s, reinterpret_cast<uint64_t>(dst.data()) + off, rkey, off);
    wr.opcode = opcode;
    return wr;
  }
};

// Each test below runs twice: with the peer's memory reached by process_vm_writev/readv, and with its
// pages shared (SOFTRDMA_SHARE_MR=1, io/shm/mr_share.h), where an op inside its whole pages is a memcpy.
class DirectP : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(Direct, DirectP, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "SharedPages" : "ProcessVm"; });

TEST_P(DirectP, WriteAndReadMoveTheDataWithoutPackets) {
  if (!direct_path_on()) GTEST_SKIP() << "the same-host path is turned off in this environment";
  const bool share = GetParam();
  auto env = share_mr(share);
  Pair p;
  EXPECT_EQ(testutil::maps_perms(p.dst.data() + p.first_page()), share ? "rw-s" : "rw-p");
  EXPECT_EQ(testutil::maps_perms(p.src.data() + 8192), "rw-p") << "an MR without remote access was moved";
  for (size_t i = 0; i < p.src.size(); ++i) p.src[i] = static_cast<uint8_t>(i * 7 + 1);
  const uint64_t page0 = p.first_page();
  p.probe_ring(page0, share);
  uint64_t ops = p.direct_ops(), shared = p.shared_ops(), mem_file = p.mem_file_ops();
  const uint64_t packets = p.tx_packets();
  struct Case {
    uint32_t len;
    uint64_t off;
    bool in_whole_pages;
  };
  for (Case c : {Case{1, page0, true}, Case{4096, page0, true}, Case{100'000, page0 + 8192, true},
                 Case{1, page0 - 1, false}, Case{1u << 20, 0, false}}) {
    SCOPED_TRACE(testing::Message() << c.len << " B at " << c.off);
    std::fill(p.dst.begin(), p.dst.end(), 0);
    Sge s = p.smr->sge(0, c.len);
    ASSERT_TRUE(p.a->post_send(p.op(WrOpcode::kRdmaWrite, s, c.off, p.dmr->rkey())));
    Wc wc = p.wait();
    EXPECT_EQ(wc.status, WcStatus::kSuccess);
    EXPECT_EQ(wc.opcode, WcOpcode::kRdmaWrite);
    EXPECT_EQ(std::memcmp(p.dst.data() + c.off, p.src.data(), c.len), 0);
    EXPECT_EQ(p.direct_ops(), ++ops);
    if (share && c.in_whole_pages) ++shared;
    EXPECT_EQ(p.shared_ops(), shared);
    // Else a small op is one write to the peer's /proc/<pid>/mem, a large one a process_vm_writev.
    if (!(share && c.in_whole_pages) && c.len <= 1024) ++mem_file;
    EXPECT_EQ(p.mem_file_ops(), mem_file);
  }
  // READ: the peer's bytes into the local buffer (at an offset into the remote MR).
  std::memset(p.src.data(), 0, 5000);
  Sge s = p.smr->sge(0, 5000);
  ASSERT_TRUE(p.a->post_send(p.op(WrOpcode::kRdmaRead, s, page0 + 1000, p.dmr->rkey())));
  Wc wc = p.wait();
  EXPECT_EQ(wc.status, WcStatus::kSuccess);
  EXPECT_EQ(wc.opcode, WcOpcode::kRdmaRead);
  EXPECT_EQ(wc.byte_len, 5000u);
  EXPECT_EQ(std::memcmp(p.src.data(), p.dst.data() + page0 + 1000, 5000), 0);
  EXPECT_EQ(p.direct_ops(), ++ops);
  EXPECT_EQ(p.shared_ops(), share ? ++shared : shared);
  // A small READ: one read of the peer's /proc/<pid>/mem.
  std::memset(p.src.data(), 0, 100);
  s = p.smr->sge(0, 100);
  ASSERT_TRUE(p.a->post_send(p.op(WrOpcode::kRdmaRead, s, page0 - 50, p.dmr->rkey())));
  wc = p.wait();
  EXPECT_EQ(wc.status, WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(p.src.data(), p.dst.data() + page0 - 50, 100), 0);
  EXPECT_EQ(p.direct_ops(), ++ops);
  EXPECT_EQ(p.mem_file_ops(), ++mem_file);
  EXPECT_EQ(p.tx_packets(), packets) << "a one-sided operation on the same host sends nothing";
  // Deregistration moves the pages back, with what the WRITEs put there.
  p.dst[page0 + 5] = 0x6B;
  p.dmr.reset();
  EXPECT_EQ(testutil::maps_perms(p.dst.data() + page0), "rw-p");
  EXPECT_EQ(p.dst[page0 + 5], 0x6B);
}

// A stream of posts goes through the rings, unless the peer shares its pages: then, once an op posted
// alone went one-sided through them, the stream does too, until an op falls outside them.
TEST_P(DirectP, AStreamOfPostsGoesThroughTheRingsUnlessThePagesAreShared) {
  if (!direct_path_on()) GTEST_SKIP() << "the same-host path is turned off in this environment";
  const bool share = GetParam();
  auto env = share_mr(share);
  Pair p;
  const uint64_t page0 = p.first_page();
  if (!share) p.probe_ring(page0 + 4096, share);  // (with shared pages, a first lone op would start below)
  uint64_t ops = p.direct_ops();
  Sge s = p.smr->sge(0, 64);
  SendWr wrs[2] = {p.op(WrOpcode::kRdmaWrite, s, page0, p.dmr->rkey()),
                   p.op(WrOpcode::kRdmaWrite, s, page0 + 64, p.dmr->rkey())};
  ASSERT_TRUE(p.a->post_send(std::span<const SendWr>(wrs, 2)));  // two in one call
  EXPECT_EQ(p.wait().status, WcStatus::kSuccess);
  EXPECT_EQ(p.wait().status, WcStatus::kSuccess);
  EXPECT_EQ(p.direct_ops(), ops);
  ASSERT_TRUE(p.a->post_send(wrs[0]));  // alone, after polls: one-sided
  EXPECT_EQ(p.direct_ops(), ++ops);
  ASSERT_TRUE(p.a->post_send(wrs[1]));  // no poll since the last post: a stream
  EXPECT_EQ(p.direct_ops(), share ? ++ops : ops);
  const SendWr edge = p.op(WrOpcode::kRdmaWrite, s, page0 - 32, p.dmr->rkey());  // half in a partial page
  ASSERT_TRUE(p.a->post_send(edge));
  ASSERT_TRUE(p.a->post_send(wrs[0]));  // after the edge: the rings again
  for (int i = 0; i < 4; ++i) EXPECT_EQ(p.wait().status, WcStatus::kSuccess);
  EXPECT_EQ(p.direct_ops(), ops);
  EXPECT_EQ(p.shared_ops(), share ? 2u : 0u);
  EXPECT_EQ(std::memcmp(p.dst.data() + page0 - 32, p.src.data(), 64), 0);
}

// WRITEs and READs of 64 KiB or more go one-sided in a stream too (SOFTRDMA_DIRECT_STREAM sets the size;
// 0: only ops posted alone); smaller ones in a stream go through the rings.
TEST(Direct, LargeOpsInAStreamGoOneSided) {
  if (!direct_path_on()) GTEST_SKIP() << "the same-host path is turned off in this environment";
  for (const char* env : {static_cast<const char*>(nullptr), "0", "100"}) {
    SCOPED_TRACE(env ? env : "unset");
    testutil::ScopedEnv set("SOFTRDMA_DIRECT_STREAM", env);
    Pair p;
    for (size_t i = 0; i < p.src.size(); ++i) p.src[i] = static_cast<uint8_t>(i * 13 + 5);
    // dst is not cleared here: a new Pair's is zero from before its progress thread started. Cleared now,
    // TSan reported the responder's write of the 128-byte WRITE racing with the clearing once in CI: the
    // order between them is the packet's, which TSan sees through the rings but not through a socket.
    const uint32_t big = 64 << 10;
    const Sge sges[3] = {p.smr->sge(0, big), p.smr->sge(big, big), p.smr->sge(2 * big, 128)};  // WRs point here
    SendWr wrs[3] = {p.op(WrOpcode::kRdmaWrite, sges[0], 0, p.dmr->rkey()),
                     p.op(WrOpcode::kRdmaWrite, sges[1], big, p.dmr->rkey()),
                     p.op(WrOpcode::kRdmaWrite, sges[2], 2 * big, p.dmr->rkey())};
    const uint64_t ops = p.direct_ops(), packets = p.tx_packets();
    ASSERT_TRUE(p.a->post_send(std::span<const SendWr>(wrs, 3)));  // three in one call: a stream
    for (int i = 0; i < 3; ++i) EXPECT_EQ(p.wait().status, WcStatus::kSuccess);
    EXPECT_EQ(std::memcmp(p.dst.data(), p.src.data(), 2 * big + 128), 0);
    const uint64_t want = env == nullptr ? 2 : std::strcmp(env, "0") == 0 ? 0 : 3;
    EXPECT_EQ(p.direct_ops() - ops, want);
    EXPECT_EQ(p.tx_packets() == packets, want == 3) << "the ops not done one-sided went as packets";
    // A READ stream of two: back into the source buffer, from where the WRITEs put the bytes.
    std::fill(p.src.begin(), p.src.begin() + 2 * big, 0);
    SendWr reads[2] = {p.op(WrOpcode::kRdmaRead, sges[0], 0, p.dmr->rkey()),
                       p.op(WrOpcode::kRdmaRead, sges[1], big, p.dmr->rkey())};
    const uint64_t ops2 = p.direct_ops();
    ASSERT_TRUE(p.a->post_send(std::span<const SendWr>(reads, 2)));
    for (int i = 0; i < 2; ++i) EXPECT_EQ(p.wait().status, WcStatus::kSuccess);
    EXPECT_EQ(std::memcmp(p.dst.data(), p.src.data(), 2 * big), 0);
    EXPECT_EQ(p.direct_ops() - ops2, env != nullptr && std::strcmp(env, "0") == 0 ? 0u : 2u);
  }
}

TEST(Direct, AMalformedStreamSizeIsRefused) {
  for (const char* bad : {"", "64k", "-1", "99999999999", " 5"}) {
    SCOPED_TRACE(bad);
    testutil::ScopedEnv set("SOFTRDMA_DIRECT_STREAM", bad);
    auto ctx = Context::open("sr_lo");
    ASSERT_FALSE(ctx.has_value());
    EXPECT_EQ(ctx.error(), EINVAL);
  }
}

// ATOMICs go one-sided only through shared pages (with the CPU's atomics, as the responder runs them);
// otherwise the ordinary way. The results are the same either way.
TEST_P(DirectP, AtomicsGoOneSidedThroughSharedPagesOnly) {
  if (!direct_path_on()) GTEST_SKIP() << "the same-host path is turned off in this environment";
  const bool share = GetParam();
  auto env = share_mr(share);
  const uint32_t all = kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic;
  Pair p(all, all);
  const uint64_t off = p.first_page() + 64;
  // The target is set and read with atomics: the responder's atomic may run on the progress thread,
  // reached through the kernel or the rings, an order that TSan cannot see.
  auto* target = reinterpret_cast<uint64_t*>(p.dst.data() + off);
  __atomic_store_n(target, 100, __ATOMIC_SEQ_CST);
  uint64_t ops = p.direct_ops();
  Sge s = p.smr->sge(0, 8);
  auto atomic = [&](WrOpcode opcode, uint64_t at, uint64_t compare_add, uint64_t swap) {
    SendWr wr = p.op(opcode, s, at, p.dmr->rkey());
    wr.compare_add = compare_add;
    wr.swap = swap;
    EXPECT_TRUE(p.a->post_send(wr));
    return p.wait();
  };
  auto orig = [&] {
    uint64_t v;
    std::memcpy(&v, p.src.data(), 8);
    return v;
  };
  Wc wc = atomic(WrOpcode::kAtomicFetchAndAdd, off, 5, 0);
  EXPECT_EQ(wc.status, WcStatus::kSuccess);
  EXPECT_EQ(wc.byte_len, 8u);
  EXPECT_EQ(orig(), 100u);
  EXPECT_EQ(p.direct_ops(), share ? ++ops : ops);
  wc = atomic(WrOpcode::kAtomicCmpAndSwp, off, 105, 7);  // matches: swapped
  EXPECT_EQ(wc.status, WcStatus::kSuccess);
  EXPECT_EQ(orig(), 105u);
  wc = atomic(WrOpcode::kAtomicCmpAndSwp, off, 1, 9);  // does not match: unchanged
  EXPECT_EQ(orig(), 7u);
  EXPECT_EQ(__atomic_load_n(target, __ATOMIC_SEQ_CST), 7u);
  EXPECT_EQ(p.direct_ops(), share ? ops + 2 : ops);
  EXPECT_EQ(p.shared_ops(), share ? 3u : 0u);
}

// Each check of the responder, failed: the operation goes the ordinary way and its responder NAKs it (as
// rxe: an operation the QP does not allow is an invalid request, a bad key, range, PD or MR access a
// remote access error), and the destination is untouched.
TEST_P(DirectP, EveryResponderCheckStillHolds) {
  if (!direct_path_on()) GTEST_SKIP() << "the same-host path is turned off in this environment";
  auto env = share_mr(GetParam());
  struct Case {
    const char* what;
    uint32_t b_access, dmr_access;
    // 0 as built, 1 wrong rkey, 2 past the end, 3 deregistered, 4 an MR of another PD, 5 no responder
    // resources for READ (max_dest_rd_atomic 0)
    int how;
    WrOpcode op;
    WcStatus want = WcStatus::kRemAccessErr;
  };
  const uint32_t all = kLocalWrite | kRemoteWrite | kRemoteRead;
  for (const Case& c :
       {Case{"QP without remote write", kLocalWrite | kRemoteRead, all, 0, WrOpcode::kRdmaWrite,
             WcStatus::kRemInvReqErr},
        Case{"QP without remote read", kLocalWrite | kRemoteWrite, all, 0, WrOpcode::kRdmaRead,
             WcStatus::kRemInvReqErr},
        Case{"MR without remote write", all, kLocalWrite | kRemoteRead, 0, WrOpcode::kRdmaWrite},
        Case{"MR without remote read", all, kLocalWrite | kRemoteWrite, 0, WrOpcode::kRdmaRead},
        Case{"wrong rkey", all, all, 1, WrOpcode::kRdmaWrite},
        Case{"past the end", all, all, 2, WrOpcode::kRdmaWrite},
        Case{"deregistered", all, all, 3, WrOpcode::kRdmaWrite},
        Case{"MR of another PD", all, all, 4, WrOpcode::kRdmaWrite},
        Case{"QP with max_dest_rd_atomic 0", all, all, 5, WrOpcode::kRdmaRead, WcStatus::kRemInvReqErr}}) {
    SCOPED_TRACE(c.what);
    Pair p(c.b_access, c.dmr_access, c.how == 5 ? 0 : 16);
    std::fill(p.src.begin(), p.src.end(), 0xAB);
    uint32_t rkey = p.dmr->rkey();
    uint64_t off = p.first_page() + 64;  // inside the pages that SOFTRDMA_SHARE_MR=1 shares
    std::unique_ptr<MemoryRegion> other;
    if (c.how == 1) rkey ^= 0x100;
    if (c.how == 2) off = p.dst.size() - 8;
    if (c.how == 3) p.dmr.reset();
    if (c.how == 4) {
      other = *p.pd2->reg_mr(p.dst.data(), p.dst.size(), all);
      rkey = other->rkey();
    }
    const uint64_t ops = p.direct_ops();
    Sge s = p.smr->sge(0, 64);
    ASSERT_TRUE(p.a->post_send(p.op(c.op, s, off, rkey)));
    Wc wc = p.wait();
    EXPECT_EQ(wc.status, c.want);
    EXPECT_EQ(p.direct_ops(), ops);
    if (c.op == WrOpcode::kRdmaWrite) {
      EXPECT_EQ(p.dst[off], 0) << "the destination was written";
    }
  }
}

// UC: no ACK tells the requester that the peer has taken the packets the QP sent before a WRITE, so the
// peer's responder publishes the PSN after the last packet it took, and the WRITE goes one-sided only where
// that is the QP's next PSN (or where the QP has sent nothing): never ahead of a packet still on its way.
// A check that fails sends the WRITE the ordinary way, whose UC responder drops it silently: the
// requester's completion says success, and the destination is untouched.
TEST_P(DirectP, UcWritesGoOneSidedOnlyBehindWhatThePeerTook) {
  if (!direct_path_on()) GTEST_SKIP() << "the same-host path is turned off in this environment";
  const bool share = GetParam();
  auto env = share_mr(share);
  const uint32_t all = kLocalWrite | kRemoteWrite | kRemoteRead;
  Pair p(all, all, 16, QpType::kUc);
  for (size_t i = 0; i < p.src.size(); ++i) p.src[i] = static_cast<uint8_t>(i * 11 + 3);
  const uint64_t page0 = p.first_page();
  // Nothing sent yet: a lone WRITE goes one-sided at once (no probe through the ring, as RC's ping-pong
  // needs: a UC peer waits for no ACK).
  uint64_t ops = p.direct_ops(), packets = p.tx_packets();
  Sge s8 = p.smr->sge(0, 8);
  ASSERT_TRUE(p.a->post_send(p.op(WrOpcode::kRdmaWrite, s8, page0, p.dmr->rkey())));
  EXPECT_EQ(p.wait().status, WcStatus::kSuccess);
  EXPECT_EQ(p.direct_ops(), ++ops);
  EXPECT_EQ(p.tx_packets(), packets);
  EXPECT_EQ(std::memcmp(p.dst.data() + page0, p.src.data(), 8), 0);

  // A SEND, a 64 KiB WRITE and a SEND in one post (a stream; the WRITE's size makes it a candidate): the
  // first SEND's packet is not even handed to the ring when the WRITE's turn comes, so the WRITE follows it
  // as packets. The second SEND's receive completion says that the WRITE's bytes are in place (UC executes
  // in order), and is what orders the reads below after the responder's writes (as TSan sees them).
  std::vector<uint8_t> rbuf(128);
  auto rmr = *p.pd->reg_mr(rbuf.data(), rbuf.size(), kLocalWrite);
  const Sge rs[2] = {rmr->sge(0, 64), rmr->sge(64, 64)};
  for (uint64_t k = 0; k < 2; ++k) {
    RecvWr rwr;
    rwr.wr_id = 77 + k;
    rwr.sg_list = std::span(&rs[k], 1);
    ASSERT_TRUE(p.b->post_recv(rwr));
  }
  const uint32_t big = 64 << 10;
  const Sge s64 = p.smr->sge(0, 64), sbig = p.smr->sge(64, big);
  SendWr wrs[3] = {p.op(WrOpcode::kSend, s64, 0, 0),
                   p.op(WrOpcode::kRdmaWrite, sbig, page0 + 64, p.dmr->rkey()),
                   p.op(WrOpcode::kSend, s64, 0, 0)};
  packets = p.tx_packets();
  ASSERT_TRUE(p.a->post_send(std::span<const SendWr>(wrs, 3)));
  int recvs = 0;
  for (int n = 0; n < 5; ++n) {
    const Wc wc = p.wait();
    EXPECT_EQ(wc.status, WcStatus::kSuccess);
    recvs += wc.opcode == WcOpcode::kRecv;
  }
  EXPECT_EQ(recvs, 2);
  EXPECT_EQ(p.direct_ops(), ops) << "a UC WRITE went one-sided ahead of a packet of its QP";
  EXPECT_EQ(p.tx_packets() - packets, 2u + big / 4096);
  EXPECT_EQ(std::memcmp(rbuf.data(), p.src.data(), 64), 0);
  EXPECT_EQ(std::memcmp(rbuf.data() + 64, p.src.data(), 64), 0);
  EXPECT_EQ(std::memcmp(p.dst.data() + page0 + 64, p.src.data() + 64, big), 0);
  // Its packets were all taken: a lone WRITE goes one-sided again, once the responder's PSN is published
  // (stored right after the last receive completed; until then such a WRITE goes as a packet).
  bool one_sided = false;
  for (int i = 0; i < 1000 && !one_sided; ++i) {
    const uint64_t before = p.direct_ops();
    ASSERT_TRUE(p.a->post_send(p.op(WrOpcode::kRdmaWrite, s8, page0 + 8, p.dmr->rkey())));
    EXPECT_EQ(p.wait().status, WcStatus::kSuccess);
    one_sided = p.direct_ops() == before + 1;
    if (!one_sided) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(one_sided) << "no UC WRITE went one-sided after the peer took every packet";
  ops = p.direct_ops();

  // A wrong rkey: the ordinary way, dropped by the responder, a successful completion all the same.
  const uint64_t drops = p.drop_uc_msg();
  ASSERT_TRUE(p.a->post_send(p.op(WrOpcode::kRdmaWrite, s8, page0 + 16 * 1024 * 10, p.dmr->rkey() ^ 0x100)));
  EXPECT_EQ(p.wait().status, WcStatus::kSuccess);
  EXPECT_EQ(p.direct_ops(), ops);
  for (int i = 0; i < 1'000'000 && p.drop_uc_msg() == drops; ++i) std::this_thread::yield();
  EXPECT_EQ(p.drop_uc_msg(), drops + 1);
  EXPECT_EQ(p.dst[page0 + 16 * 1024 * 10], 0) << "the destination was written";
}

}  // namespace
}  // namespace softrdma
