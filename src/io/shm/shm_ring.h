// The shared-memory layout of the same-host path (io/shm), an ABI between processes (and builds): a port
// file per UDP port a context publishes, holding a table of rings, one per sending context. Offsets, not
// pointers; fixed-width fields; magic and version checked before use.
//
//   port file: PortHeader (4 KiB) | ring 0 | ring 1 | ... | ring kMaxRings-1
//   ring:      RingHeader (64 B) | slot 0 | ... | slot nslots-1 | bulk 0 | ... | bulk nslots-1
//
// A slot (128 B) holds a packet's metadata and, when it fits in kInlineData bytes, the packet itself (or
// two sent together that both fit: Slot); a longer packet goes in the slot's bulk buffer (4,224 B)
// instead. Small packets so touch 32 slots per page rather than a page each: a ping-pong ran through a
// ring's slots at 2 per round trip, and where each page is slow at its first access, the ring's first lap
// cost a page per packet (on the project's VM, in about half the runs, about 3.5 us at each page's first
// access by each side although both had written it before, cause not found: 8-byte same-host
// ib_send_lat ran its first 1,024 round trips at 6-7 us, 0.95 after).
//
// A ring is a bounded multi-producer, single-consumer queue of fixed-size slots (Vyukov's bounded queue): the
// threads of one sending context claim slots with a CAS on `tail`, fill them and publish each by storing
// its sequence number; the receiving context (one rx_burst caller at a time) reads slots in order and frees
// them by advancing their sequence by nslots. No locks: a producer that dies between claim and publish only
// stalls its own ring, which its receiver then frees (RingEntry::kClosing).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "io/packet.h"
#include "io/shm/stream_copy.h"

namespace softrdma::io::shm {

inline constexpr uint64_t kPortMagic = 0x54524f504d485352ull;  // "RSHMPORT" as little-endian bytes
inline constexpr uint32_t kVersion = 5;
inline constexpr uint32_t kMaxRings = 32;      // sending contexts per receiving port (more fall back to UDP)
inline constexpr uint32_t kSlotHeader = 12;
inline constexpr uint32_t kSlotBytes = 128;
inline constexpr uint32_t kInlineData = kSlotBytes - kSlotHeader;  // a packet this long stays in its slot
inline constexpr uint32_t kSlotData = 4224;  // BTH .. pad of the largest packet: 64 B headers + 4096 + pad
inline constexpr uint32_t kSlotAndBulkBytes = kSlotBytes + kSlotData;  // a ring's bytes per slot
inline constexpr uint32_t kDefaultSlots = 2048;  // per ring: 8.5 MiB, allocated when a sender claims it
static_assert(kSlotData >= kMaxHdr + 4096 + 3);
static_assert(kSlotData % 64 == 0);
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free);

// Slot::len holds a packet's length in each half: the low half the first packet's, the high half a second
// one's, 0 when the slot holds one. A packet's half is its bytes (BTH .. pad, no ICRC) | kLenAwaitsAck.
inline constexpr uint32_t kLenAwaitsAck = 1u << 15;  // the packet's flags had io::kAwaitsAck
inline constexpr uint32_t kLenMask = kLenAwaitsAck - 1;
static_assert(kSlotData <= kLenMask);

// The sender's address is its ring's (RingEntry::owner_addr), not each slot's: with it in the slot, a
// packet of 33-48 bytes (an 8-byte WRITE, 36) ran into the slot's second cache line, one more line to pass
// from the producer's CPU to the consumer's on the way of each same-host ping-pong. For the same reason two
// packets sent together to one peer share a slot when both fit in it (the second's half of `len`): a
// ping-pong's request and the ACK of the peer's previous one, which came in two slots, two lines.
struct alignas(64) Slot {
  // The low 32 bits of a position (a ring is far shorter than 2^31 slots, so they tell laps apart):
  // == position: free for the producer of that position; == position + 1: full.
  std::atomic<uint32_t> seq;
  // The packets' halves (above): in inline_data if the first is <= kInlineData bytes (and any second),
  // else in the slot's bulk buffer.
  uint32_t len;
  uint16_t src_port;
  uint8_t tos;
  uint8_t ttl;
  uint8_t inline_data[kInlineData];
};
static_assert(sizeof(Slot) == kSlotBytes && offsetof(Slot, inline_data) == kSlotHeader);
static_assert(kSlotHeader + 36 + 16 <= 64,
              "an 8-byte WRITE (36 bytes) and an ACK (16) share their slot's first cache line with its "
              "sequence word");

struct alignas(64) RingHeader {
  std::atomic<uint64_t> tail;  // next position a producer claims
  uint8_t reserved[56];
};
static_assert(sizeof(RingHeader) == 64);

inline constexpr size_t ring_bytes(uint32_t nslots) {
  return sizeof(RingHeader) + size_t{nslots} * kSlotAndBulkBytes;
}

// One entry of a port's ring table: who owns ring i. A sender claims a free entry (CAS kFree -> kClaimed),
// initializes the ring, and publishes it (kReady, epoch + 1, then PortHeader::gen + 1). It gives it back
// with kClosing (or another sender does, for an owner that died); the receiver stops reading it once it
// holds nothing readable and sets kFree.
struct alignas(64) RingEntry {
  enum : uint32_t { kFree = 0, kClaimed = 1, kReady = 2, kClosing = 3 };
  std::atomic<uint32_t> state;
  std::atomic<uint32_t> epoch;  // + 1 at each claim: the receiver restarts reading at position 0
  int32_t owner_pid;
  uint32_t reserved0;
  uint64_t owner_start_time;  // /proc/<pid>/stat field 22: tells a reused pid apart
  uint64_t owner_pidns;       // a pid means something only in its pid namespace
  uint8_t owner_addr[16];     // the sending context's GID: the source of every packet in the ring
  uint8_t reserved[16];
};
static_assert(sizeof(RingEntry) == 64);

struct PortHeader {
  uint64_t magic;  // stored last (release), checked first (acquire)
  uint32_t version;
  uint32_t max_rings;
  uint32_t nslots;      // per ring
  uint32_t slot_bytes;  // kSlotAndBulkBytes
  uint64_t rings_offset;
  uint64_t ring_stride;  // ring_bytes(nslots), rounded up to a page
  int32_t pid;           // the receiving process
  uint32_t access_serial;  // names its context's access table (access_table.h); 0: none
  uint64_t start_time;
  uint64_t pidns;  // the pid namespace `pid` belongs to
  alignas(64) std::atomic<uint32_t> closed;    // 1: the port closed; senders look the peer up again
  alignas(64) std::atomic<uint32_t> sleeping;  // 1: the receiver sleeps; the next sender wakes it (doorbell)
  alignas(64) std::atomic<uint64_t> gen;       // + 1 whenever an entry changes state
  alignas(64) RingEntry rings[kMaxRings];
};
inline constexpr size_t kPortHeaderBytes = 4096;
static_assert(sizeof(PortHeader) <= kPortHeaderBytes);

inline constexpr size_t ring_stride(uint32_t nslots) { return (ring_bytes(nslots) + 4095) & ~size_t{4095}; }
inline constexpr size_t port_file_bytes(uint32_t nslots) {
  return kPortHeaderBytes + size_t{kMaxRings} * ring_stride(nslots);
}

// A view of one ring in mapped memory.
class Ring {
 public:
  Ring() = default;
  Ring(void* mem, uint32_t nslots)
      : hdr_(static_cast<RingHeader*>(mem)),
        slots_(reinterpret_cast<Slot*>(static_cast<uint8_t*>(mem) + sizeof(RingHeader))),
        bulk_(static_cast<uint8_t*>(mem) + sizeof(RingHeader) + size_t{nslots} * kSlotBytes),
        nslots_(nslots),
        mask_(nslots - 1) {}
  bool valid() const { return hdr_ != nullptr; }
  uint32_t size() const { return nslots_; }
  uint8_t* mem() const { return reinterpret_cast<uint8_t*>(hdr_); }  // where the ring begins
  // Where the `len` bytes of slot s's packet are: in the slot, or in its bulk buffer.
  uint8_t* data(Slot* s, uint32_t len) const {
    return len <= kInlineData ? s->inline_data : bulk_ + static_cast<size_t>(s - slots_) * kSlotData;
  }

  // Before the ring is published: every slot free for the first lap.
  void init() {
    for (uint32_t i = 0; i < nslots_; ++i) slots_[i].seq.store(i, std::memory_order_relaxed);
    hdr_->tail.store(0, std::memory_order_release);
  }

  // Consumer, once, when it starts reading the ring: a write to every slot's page (an add of 0 to the
  // slot's sequence word, atomic since the producer may store it meanwhile) and a read of every page of
  // the bulk buffers (which the consumer only reads; a producer may be filling one). Page tables filled by
  // madvise(MADV_POPULATE_WRITE) were not enough in a VM (PVM): the first access of each page still cost
  // about 5 us (11 without the populate), so the ring's first lap ran at 21-27 us per 8-byte ib_send_lat
  // round trip instead of 2-3 (1,024 round trips: a SEND and an ACK each way, a page per slot then).
  void touch(size_t page) {
    for (uint32_t i = 0; i < nslots_; ++i) slots_[i].seq.fetch_add(0, std::memory_order_relaxed);
    for (size_t off = 0; off < size_t{nslots_} * kSlotData; off += page)
      (void)__atomic_load_n(bulk_ + off, __ATOMIC_RELAXED);
  }

  // The end of the slots (where the bulk buffers begin), from the ring's start.
  size_t slots_end() const { return sizeof(RingHeader) + size_t{nslots_} * kSlotBytes; }

  // While no other process uses the ring (a producer's claim, before init; a consumer's warm-up before
  // its port file is visible): a write to every page of the ring's `bytes`, a zero byte where no sequence
  // word is. init() writes only the slots' pages, and a first write to a page cost each process 5-11 us
  // in the ring's first lap (a VM, as above): same-host 8-byte ib_send_lat, one iteration in 32 took 13-19
  // us when some pages were left, and the stall put the two processes' threads into a slower way of taking
  // turns for hundreds of iterations.
  void touch_pages(size_t bytes, size_t page) {
    volatile uint8_t* const m = mem();
    const size_t end = slots_end();
    for (size_t off = 0; off < bytes; off += page) {
      const bool seq_word =
          off < sizeof(RingHeader) || (off < end && (off - sizeof(RingHeader)) % kSlotBytes == 0);
      m[seq_word ? off + sizeof(uint64_t) : off] = 0;
    }
  }

  // Producer: a slot to fill and its position, or null when the ring is full (or broken: below).
  Slot* claim(uint64_t* pos) {
    uint64_t p = hdr_->tail.load(std::memory_order_relaxed);
    for (;;) {
      Slot& s = slots_[p & mask_];
      const uint32_t seq = s.seq.load(std::memory_order_acquire);
      const auto dif = static_cast<int32_t>(seq - static_cast<uint32_t>(p));
      if (dif == 0) {
        if (hdr_->tail.compare_exchange_weak(p, p + 1, std::memory_order_relaxed)) {
          *pos = p;
          return &s;
        }
      } else if (dif < 0) {
        return nullptr;  // the consumer has not freed this slot of the previous lap
      } else {
        // Another producer took p: the tail has moved past it (its claim came before the store of seq that
        // this load acquired). A tail still at p means a sequence word no producer or consumer wrote, in
        // memory that another process shares: the ring is treated as full (its packets drop, counted)
        // rather than spun on for ever.
        const uint64_t t = hdr_->tail.load(std::memory_order_relaxed);
        if (t == p) return nullptr;
        p = t;
      }
    }
  }
  static void publish(Slot* s, uint64_t pos) {
    s->seq.store(static_cast<uint32_t>(pos + 1), std::memory_order_release);
  }

  // Consumer: the slot at `pos` if it is full (its contents are then visible), else null.
  Slot* peek(uint64_t pos) const {
    Slot& s = slots_[pos & mask_];
    return s.seq.load(std::memory_order_acquire) == static_cast<uint32_t>(pos + 1) ? &s : nullptr;
  }
  uint64_t tail() const { return hdr_->tail.load(std::memory_order_acquire); }  // the next position claimed
  bool readable(uint64_t pos) const {
    return slots_[pos & mask_].seq.load(std::memory_order_seq_cst) == static_cast<uint32_t>(pos + 1);
  }
  void release(uint64_t pos) {
    slots_[pos & mask_].seq.store(static_cast<uint32_t>(pos + nslots_), std::memory_order_release);
  }

 private:
  RingHeader* hdr_ = nullptr;
  Slot* slots_ = nullptr;
  uint8_t* bulk_ = nullptr;
  uint32_t nslots_ = 0;
  uint64_t mask_ = 0;
};

// The bytes a packet takes in a slot: header, payload pieces, pad (no ICRC: memory does not corrupt it).
inline uint64_t slot_len(const TxPacket& p) {
  uint64_t len = p.hdr_len + (p.pad & 3u);
  for (uint32_t k = 0; k < p.n_iov; ++k) len += p.iov[k].iov_len;
  return len;
}

inline uint32_t len_half(const TxPacket& p, uint32_t len) {
  return len | ((p.flags & kAwaitsAck) != 0 ? kLenAwaitsAck : 0u);
}

// Payload pieces this long are copied with streaming stores when the sender streams (stream_copy.h).
inline constexpr size_t kStreamMinPiece = 256;

// Copies packet p's slot_len(p) bytes to d; with `stream`, its long payload pieces by streaming stores,
// fenced before it returns. Returns whether any piece was streamed.
inline bool copy_packet(uint8_t* d, const TxPacket& p, bool stream = false) {
  std::memcpy(d, p.hdr, p.hdr_len);
  d += p.hdr_len;
  bool streamed = false;
  for (uint32_t k = 0; k < p.n_iov; ++k) {
    const size_t n = p.iov[k].iov_len;
    if (n == 0) continue;  // its base may be null
    const auto* src = static_cast<const uint8_t*>(p.iov[k].iov_base);
    if (stream && n >= kStreamMinPiece) {
      copy_streaming(d, src, n);
      streamed = true;
    } else {
      std::memcpy(d, src, n);
    }
    d += n;
  }
  std::memset(d, 0, p.pad & 3u);
  if (streamed) stream_fence();  // before the slot's publication (a release store orders no streaming one)
  return streamed;
}

// Copies a packet of slot_len(p) == len <= kSlotData bytes into slot s of `ring` (`stream`: copy_packet,
// whose result it returns).
inline bool fill_slot(const Ring& ring, Slot* s, const TxPacket& p, uint32_t len, bool stream = false) {
  const bool streamed = copy_packet(ring.data(s, len), p, stream);
  s->len = len_half(p, len);
  s->src_port = p.src.port;
  s->tos = 0;
  s->ttl = 64;
  return streamed;
}

// Adds packet p (`len` bytes, from the same port) after the one packet of `first` bytes in slot s, which
// both fit in: first + len <= kInlineData.
inline void add_to_slot(Slot* s, const TxPacket& p, uint32_t first, uint32_t len) {
  copy_packet(s->inline_data + first, p);
  s->len |= len_half(p, len) << 16;
}

}  // namespace softrdma::io::shm
