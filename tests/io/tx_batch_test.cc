// TxBatch: a full batch goes by the sink's tx_burst_some, and what the sink keeps back is sent later, first
// and once; flush() sends everything.
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
    EXPECT_EQ(p.iov[0].iov_len, tag);  // the payload piece travelled with its header
    sent.push_back(tag);
  }
  size_t keep_;
};

void fill(TxBatch& tx, uint32_t from, uint32_t to) {
  for (uint32_t k = from; k < to; ++k) {
    TxPacket& p = tx.next();
    p.hdr_len = 12;
    std::memcpy(p.hdr, &k, sizeof k);
    p.n_iov = 1;
    p.iov[0] = iovec{nullptr, k};
    p.payload_len = k;
  }
}

TEST(TxBatch, WhatTheSinkKeepsBackGoesNextInOrder) {
  KeepingSink sink(2);
  TxBatch tx;
  tx.sink = &sink;
  fill(tx, 0, 100);
  // Full at 32: 30 sent, 2 kept; 2 + 30 new: full again...
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
  fill(tx, 0, TxBatch::kMax + 1);
  EXPECT_EQ(sink.some_calls, 1);
  EXPECT_EQ(tx.n, 1u);
  tx.flush();
  EXPECT_EQ(sink.sent.size(), TxBatch::kMax + 1u);
}

}  // namespace
}  // namespace softrdma::io
