// TxBatch: a full batch (kMax packets, or kFullBytes of payload) goes by the sink's tx_burst_some, and what
// the sink keeps back is sent later, first and once; flush() sends everything.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "io/packet.h"

namespace softrdma::io {
namespace {

// Records every packet it sends (by the PSN-like tag in hdr[0..3]); tx_burst_some keeps back the last
// `keep` packets of each burst.
class KeepingSink : public TxSink {
 public:
  explicit KeepingSink(size_t keep) : keep_(keep) {}
  void tx_burst(std::span<TxPacket> pkts) override {
    for (const TxPacket& p : pkts) record(p);
    ++full_calls;
  }
  size_t tx_burst_some(std::span<TxPacket> pkts) override {
    const size_t n = pkts.size() > keep_ ? pkts.size() - keep_ : pkts.size();
    for (const TxPacket& p : pkts.first(n)) record(p);
    ++some_calls;
    return n;
  }
  std::vector<uint32_t> sent;
  int full_calls = 0, some_calls = 0;

 private:
  void record(const TxPacket& p) {
    uint32_t tag = 0;
    std::memcpy(&tag, p.hdr, sizeof tag);
    EXPECT_EQ(p.hdr_len, 12u);
    EXPECT_EQ(p.n_iov, 1u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p.iov[0].iov_base), tag);  // the payload travelled with its header
    EXPECT_EQ(p.iov[0].iov_len, p.payload_len);
    sent.push_back(tag);
  }
  size_t keep_;
};

// Packets tagged from..to-1, each with `payload` bytes (by default as many as its tag: small ones).
void fill(TxBatch& tx, uint32_t from, uint32_t to, uint32_t payload = 0) {
  for (uint32_t k = from; k < to; ++k) {
    TxPacket& p = tx.next();
    p.hdr_len = 12;
    std::memcpy(p.hdr, &k, sizeof k);
    p.n_iov = 1;
    const uint32_t len = payload != 0 ? payload : k;
    p.iov[0] = iovec{reinterpret_cast<void*>(uintptr_t{k}), len};
    p.payload_len = len;
  }
}

TEST(TxBatch, WhatTheSinkKeepsBackGoesNextInOrder) {
  KeepingSink sink(2);
  TxBatch tx;
  tx.sink = &sink;
  fill(tx, 0, 100);
  // Small packets: full at 32, 30 sent, 2 kept; 2 + 30 new: full again...
  EXPECT_EQ(sink.some_calls, 3);
  EXPECT_EQ(sink.sent.size(), 90u);
  tx.flush();
  EXPECT_EQ(sink.full_calls, 1);
  std::vector<uint32_t> want(100);
  for (uint32_t k = 0; k < 100; ++k) want[k] = k;
  EXPECT_EQ(sink.sent, want);
  EXPECT_EQ(tx.n, 0u);
}

TEST(TxBatch, ASinkThatSendsAllLeavesTheBatchEmpty) {
  KeepingSink sink(0);
  TxBatch tx;
  tx.sink = &sink;
  fill(tx, 0, TxBatch::kMax + 1, 1024);
  EXPECT_EQ(sink.some_calls, 1);
  EXPECT_EQ(tx.n, 1u);
  tx.flush();
  EXPECT_EQ(sink.sent.size(), TxBatch::kMax + 1u);
}

// Full by payload: 32 packets of 4 KiB (kFullBytes, 128 KiB: two GSO messages and a short one), but 64
// (kMax) of 1 KiB (path MTU 1024: 32 made GSO messages of half the size one may hold), and 32 small ones;
// what the sink kept back counts in the next batch.
TEST(TxBatch, FullAtKMaxPacketsOrKFullBytesOfPayload) {
  static_assert(TxBatch::kFullBytes == 32 * 4096 && TxBatch::kMax == 64);
  struct Case {
    uint32_t payload, full_at;
  };
  for (const Case c : {Case{4096, 32}, Case{1024, 64}, Case{8, 32}}) {
    KeepingSink all(0);
    TxBatch tx;
    tx.sink = &all;
    fill(tx, 0, c.full_at + 1, c.payload);
    EXPECT_EQ(all.some_calls, 1) << c.payload;
    EXPECT_EQ(all.sent.size(), c.full_at) << c.payload;
    tx.flush();
  }

  KeepingSink keep(2);
  TxBatch kept;
  kept.sink = &keep;
  fill(kept, 0, 33, 4096);  // 30 sent; 2 (8 KiB) kept before the 33rd: full again at 30 more
  EXPECT_EQ(keep.sent.size(), 30u);
  fill(kept, 33, 62, 4096);
  EXPECT_EQ(keep.some_calls, 1);
  fill(kept, 62, 63, 4096);
  EXPECT_EQ(keep.some_calls, 2);
  EXPECT_EQ(keep.sent.size(), 60u);
  kept.flush();
  std::vector<uint32_t> want(63);
  for (uint32_t k = 0; k < 63; ++k) want[k] = k;
  EXPECT_EQ(keep.sent, want);
}

}  // namespace
}  // namespace softrdma::io
