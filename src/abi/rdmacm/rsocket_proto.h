// rsockets' protocol between the two ends of a stream rsocket (rsocket.cc). Our own, not rdma-core's: both
// ends must run this library (our connection handshake is our own anyway).
//
// Each end registers one region, laid out as
//   [Credits x rq_size][IoEntry x iomap_size][receive ring, ring_size bytes (a power of two)]
// (each part 64-byte aligned)
// and announces it in the connection's private data (ConnData, in the REQ and in the REP). The peer then
// - writes stream data with RDMA WRITE WITH IMMEDIATE at its ring's tail (the tail is implicit: both ends
//   count the bytes), imm = the length (at most kMaxChunk); each such write takes one posted receive;
// - returns credits by writing a Credits record (running totals of the bytes consumed from its ring and of
//   the receives posted again) into the next of our Credits slots, WITH IMMEDIATE kImmCredits and the slot
//   (credits_imm), which wakes a sender sleeping on its completion channel. The slots go round: a slot
//   is written again only rq_size writes with immediate later, which our receives bound, so we read it
//   (when we poll its completion, before posting that receive again) with no write landing on it;
// - says it will write no more (kImmShutWr) or closes (kImmClose) with a zero-length write;
// - announces riomap()ed buffers by an RDMA WRITE of an IoEntry into our table: riowrite() writes there by
//   RDMA WRITE (no immediate, no receive taken).
// Fields are little endian (le*toh/htole* where they are read and written).
#pragma once

#include <cstddef>
#include <cstdint>

namespace softrdma::rdmacm::rsproto {

inline constexpr uint8_t kVersion = 1;

struct ConnData {
  uint8_t version;
  uint8_t reserved;
  uint16_t rq_size;     // receives the end keeps posted: writes with immediate the peer may have in flight
  uint16_t iomap_size;  // entries in its IoEntry table
  uint16_t reserved2;
  uint32_t ring_size;  // bytes, a power of two
  uint32_t rkey;
  uint64_t addr;  // the region
};
static_assert(sizeof(ConnData) == 24, "fits the REQ's 56 bytes of private data");

// Running totals modulo 2^32, each written whole by the peer; a reader that sees an older value of either
// only sees fewer credits.
struct Credits {
  uint32_t consumed;  // bytes of the ring read by the application
  uint32_t reposted;  // receives posted again
};

struct IoEntry {
  uint64_t offset;  // riomap's offset: riowrite's offset selects the entry
  uint64_t addr;
  uint32_t rkey;
  uint32_t length;
  uint64_t valid;  // 0: a free entry (riounmap)
};
static_assert(sizeof(IoEntry) == 32);

inline constexpr size_t align64(size_t n) { return (n + 63) & ~size_t{63}; }
inline constexpr size_t iomap_offset(uint32_t rq_size) { return align64(rq_size * sizeof(Credits)); }
inline constexpr size_t ring_offset(uint32_t rq_size, uint32_t iomap_size) {
  return align64(iomap_offset(rq_size) + iomap_size * sizeof(IoEntry));
}

inline constexpr uint32_t kImmCtrl = 1u << 31;  // clear: stream data, imm = its length
inline constexpr uint32_t kImmCredits = kImmCtrl | 1;  // | the slot << 8 (credits_imm)
inline constexpr uint32_t kImmShutWr = kImmCtrl | 2;
inline constexpr uint32_t kImmClose = kImmCtrl | 3;
inline constexpr uint32_t credits_imm(uint32_t slot) { return kImmCredits | slot << 8; }
inline constexpr uint32_t imm_type(uint32_t imm) { return imm & (kImmCtrl | 0xff); }
inline constexpr uint32_t imm_slot(uint32_t imm) { return (imm & ~kImmCtrl) >> 8; }

inline constexpr uint32_t kMaxChunk = 64 << 10;  // one write: the receiver sees data as it arrives

}  // namespace softrdma::rdmacm::rsproto
