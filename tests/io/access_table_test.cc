// The access table of the same-host one-sided path on its own: what a reader finds, what it refuses, and
// that withdrawing an MR waits for a reader's access in flight.
#include "io/shm/access_table.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

namespace softrdma::io::shm {
namespace {

struct Table {
  std::string path = "/dev/shm/softrdma-acc-test." + std::to_string(getpid());
  std::unique_ptr<AccessTable> t = std::move(*AccessTable::create(path, getpid(), 1, 2));
  std::vector<uint8_t> mem = std::vector<uint8_t>(8192, 0);
  std::vector<uint8_t> src = std::vector<uint8_t>(8192, 0x5A);

  Table() {
    t->publish_qp({.qpn = 0x12345, .access = kAccRemoteWrite | kAccRemoteRead, .pd = 3, .dest_qpn = 0x777,
                   .open = true});
    t->publish_mr({.key = 0xABCD01, .access = kAccRemoteWrite | kAccRemoteRead, .pd = 3, .iova = 0x100000,
                   .length = mem.size(), .addr = reinterpret_cast<uint64_t>(mem.data())},
                  nullptr);
  }
  int write(uint64_t va, uint64_t len, uint32_t rkey = 0xABCD01, uint32_t src_qpn = 0x777,
            uint32_t dest_qpn = 0x12345) {
    LocalSeg seg{src.data(), len};
    DirectOp op{false, src_qpn, dest_qpn, va, rkey, len, &seg, 1};
    return AccessTable::direct(t->map(), AccessTable::file_bytes(), getpid(), op, nullptr);
  }
  SharedMr* entry(uint32_t key) {  // the reader's view of an MR entry, found as a reader finds it
    auto* base = reinterpret_cast<SharedMr*>(static_cast<uint8_t*>(t->map()) + 4096);
    for (uint32_t i = 0; i < kMrSlots; ++i)
      if (base[i].state.load() == 1 && base[i].key.load() == key) return &base[i];
    return nullptr;
  }
};

TEST(AccessTable, ReaderChecksQpMrAndRange) {
  Table x;
  EXPECT_EQ(x.write(0x100000 + 100, 50), 0);
  EXPECT_EQ(x.mem[100], 0x5A);
  EXPECT_EQ(x.mem[150], 0);
  EXPECT_EQ(x.write(0x100000 + 8192 - 10, 10), 0);  // up to the last byte
  EXPECT_EQ(x.write(0x100000 + 8192 - 10, 11), -1);  // one past it
  EXPECT_EQ(x.write(0x100000 - 1, 10), -1);           // below it
  EXPECT_EQ(x.write(0x100000, 10, 0xABCD02), -1);     // unknown key
  EXPECT_EQ(x.write(0x100000, 10, 0xABCD01, 0x778), -1);  // not the QP's peer
  EXPECT_EQ(x.write(0x100000, 10, 0xABCD01, 0x777, 0x12346), -1);  // no such QP
  EXPECT_EQ(x.write(0x100000, 0), -1);  // zero length: the ordinary way
  x.t->publish_qp({.qpn = 0x12345, .access = kAccRemoteRead, .pd = 3, .dest_qpn = 0x777, .open = true});
  EXPECT_EQ(x.write(0x100000, 10), -1);  // the QP no longer allows writes
  x.t->publish_qp({.qpn = 0x12345, .access = kAccRemoteWrite, .pd = 4, .dest_qpn = 0x777, .open = true});
  EXPECT_EQ(x.write(0x100000, 10), -1);  // another PD than the MR's
  x.t->publish_qp({.qpn = 0x12345, .access = kAccRemoteWrite, .pd = 3, .dest_qpn = 0x777, .open = false});
  EXPECT_EQ(x.write(0x100000, 10), -1);  // closed
  x.t->publish_qp({.qpn = 0x12345, .access = kAccRemoteWrite, .pd = 3, .dest_qpn = 0x777, .open = true});
  EXPECT_EQ(x.write(0x100000, 10), 0);
  x.t->withdraw_mr(0xABCD01);
  EXPECT_EQ(x.write(0x100000, 10), -1);
}

// A peer with no MR whose pages may be mapped answers an op that wants only those (a lone WRITE that takes
// the ring otherwise) at its header, and says so once one is published.
TEST(AccessTable, SharedOnlyOpsStopAtTheHeaderUntilAnMrHasPagesToMap) {
  Table x;
  const auto* h = static_cast<const AccessHeader*>(x.t->map());
  EXPECT_EQ(h->any_shared.load(), 0u);
  LocalSeg seg{x.src.data(), 10};
  DirectOp op{false, 0x777, 0x12345, 0x100000, 0xABCD01, 10, &seg, 1, true};
  EXPECT_EQ(AccessTable::direct(x.t->map(), AccessTable::file_bytes(), getpid(), op, nullptr), -1);
  EXPECT_EQ(x.mem[0], 0);
  EXPECT_EQ(x.write(0x100000, 10), 0);  // the other ways still go
  EXPECT_EQ(x.mem[0], 0x5A);
  const SharedPages pages{.id = 7, .fd = -1, .ino = 1, .file_off = 0, .addr = 0, .len = 4096};
  x.t->publish_mr({.key = 0xABCD02, .access = kAccRemoteWrite, .pd = 3, .iova = 0, .length = 4096, .addr = 0},
                  &pages);
  EXPECT_EQ(h->any_shared.load(), 1u);
  x.t->withdraw_mr(0xABCD02);
  EXPECT_EQ(h->any_shared.load(), 1u) << "never back to 0";
}

// A UC QP's entry: only a UC op may use it (and an RC op only an RC entry), only a WRITE, and one from a QP
// that sent packets only once the responder published the PSN after the last of them.
TEST(AccessTable, UcWritesWaitForThePsnAfterThePacketsBefore) {
  Table x;
  auto uc_write = [&](bool sent, uint32_t psn, bool read = false) {
    LocalSeg seg{x.src.data(), 16};
    DirectOp op{read, 0x777, 0x12345, 0x100000, 0xABCD01, 16, &seg, 1};
    op.uc = true;
    op.uc_sent = sent;
    op.uc_psn = psn;
    return AccessTable::direct(x.t->map(), AccessTable::file_bytes(), getpid(), op, nullptr);
  };
  EXPECT_EQ(uc_write(false, 0), -1);  // an RC entry
  std::atomic<uint32_t>* seen = x.t->publish_qp(
      {.qpn = 0x12345, .access = kAccRemoteWrite, .pd = 3, .dest_qpn = 0x777, .open = true, .uc = true});
  ASSERT_NE(seen, nullptr);
  EXPECT_EQ(seen->load(), kNoPsn);
  EXPECT_EQ(x.write(0x100000, 16), -1);  // an RC op on a UC entry
  EXPECT_EQ(uc_write(false, 5), 0);      // nothing sent before
  EXPECT_EQ(uc_write(true, 5), -1);      // sent, and the responder took nothing yet
  seen->store(5);
  EXPECT_EQ(uc_write(true, 5), 0);
  EXPECT_EQ(uc_write(true, 6), -1);  // a packet (PSN 5) not taken yet
  EXPECT_EQ(uc_write(true, 4), -1);
  EXPECT_EQ(uc_write(false, 5, true), -1);  // UC has no READ
  // Published again (a new connection): nothing taken since.
  seen = x.t->publish_qp(
      {.qpn = 0x12345, .access = kAccRemoteWrite, .pd = 3, .dest_qpn = 0x777, .open = true, .uc = true});
  ASSERT_NE(seen, nullptr);
  EXPECT_EQ(uc_write(true, 5), -1);
  EXPECT_EQ(
      x.t->publish_qp(
          {.qpn = 0x12345, .access = kAccRemoteWrite, .pd = 3, .dest_qpn = 0x777, .open = false, .uc = true}),
      nullptr);
  EXPECT_EQ(uc_write(false, 5), -1);  // closed
}

TEST(AccessTable, WithdrawWaitsForAnAccessInFlight) {
  Table x;
  SharedMr* e = x.entry(0xABCD01);
  ASSERT_NE(e, nullptr);
  e->inflight.fetch_add(1);  // a reader between its check and its copy
  std::atomic<bool> done{false};
  std::thread t([&] {
    x.t->withdraw_mr(0xABCD01);
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(done.load()) << "withdraw_mr returned while an access was in flight";
  EXPECT_EQ(x.write(0x100000, 10), -1) << "a new reader got in after the withdrawal began";
  e->inflight.fetch_sub(1);
  t.join();
  EXPECT_TRUE(done.load());
}

TEST(AccessTable, FileIsRemovedWithItsOwner) {
  std::string path;
  {
    Table x;
    path = x.path;
    EXPECT_EQ(access(path.c_str(), F_OK), 0);
  }
  EXPECT_NE(access(path.c_str(), F_OK), 0);
}

}  // namespace
}  // namespace softrdma::io::shm
