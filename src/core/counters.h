// Per-device counters: packets, retransmissions, NAKs by kind, drops by reason. One list, from which the
// enum and the names the CLI prints are both made.
#pragma once

#include <atomic>
#include <cstdint>
#include <string_view>

namespace softrdma {

#define SOFTRDMA_COUNTERS(X)                                                                                 \
  X(tx_packets, "packets sent")                                                                              \
  X(rx_packets, "packets received")                                                                          \
  X(tx_bytes, "bytes sent (UDP payload)")                                                                    \
  X(rx_bytes, "bytes received (UDP payload)")                                                                \
  X(retransmits, "request packets sent again (go-back-N)")                                                   \
  X(retry_timeouts, "local ACK timeouts")                                                                    \
  X(early_retransmits, "go-back-N before the ACK timeout: no ACK for some round trips")                      \
  X(loss_probes,                                                                                             \
    "oldest unacknowledged packet sent again, asking for an ACK: none for 2 round trips after a loss")       \
  X(probe_go_backs, "go-back-N at once: a probe's ACK showed packets lost after it (or their NAK)")          \
  X(rnr_retries, "retries after RNR NAK")                                                                    \
  X(tx_acks, "ACKs sent")                                                                                    \
  X(tx_nak_psn_seq, "NAK PSN sequence error sent")                                                           \
  X(tx_nak_inv_req, "NAK invalid request sent")                                                              \
  X(tx_nak_rem_access, "NAK remote access error sent")                                                       \
  X(tx_nak_rem_op, "NAK remote operational error sent")                                                      \
  X(tx_rnr_nak, "RNR NAK sent")                                                                              \
  X(rx_nak_psn_seq, "NAK PSN sequence error received")                                                       \
  X(rx_nak_inv_req, "NAK invalid request received")                                                          \
  X(rx_nak_rem_access, "NAK remote access error received")                                                   \
  X(rx_nak_rem_op, "NAK remote operational error received")                                                  \
  X(rx_rnr_nak, "RNR NAK received")                                                                          \
  X(dup_requests, "duplicate requests (re-ACKed or replayed)")                                               \
  X(drop_truncated, "dropped: shorter than its headers")                                                     \
  X(drop_bad_icrc, "dropped: ICRC mismatch")                                                                 \
  X(drop_bad_opcode, "dropped: unknown opcode or wrong for the QP type")                                     \
  X(drop_bad_header, "dropped: bad BTH version, pad or P_Key")                                               \
  X(drop_no_qp, "dropped: no such QP")                                                                       \
  X(drop_qp_state, "dropped: QP not in a state to receive")                                                  \
  X(drop_wrong_peer, "dropped: source is not the QP's peer")                                                 \
  X(drop_bad_qkey, "dropped: Q_Key mismatch")                                                                \
  X(drop_out_of_seq, "dropped: PSN out of sequence")                                                         \
  X(drop_stale_response, "dropped: response to nothing outstanding")                                         \
  X(drop_uc_msg, "dropped: UC message lost a packet")                                                        \
  X(drop_ud_no_wqe, "dropped: UD packet with no receive WQE")                                                \
  X(drop_ud_too_long, "dropped: UD packet longer than the receive WQE")                                      \
  X(drop_socket_full, "dropped by the kernel: the socket's receive buffer was full")                         \
  X(drop_injected, "dropped by fault injection")                                                             \
  X(fault_corrupt, "fault injection: a bit flipped (then dropped by the ICRC check)")                        \
  X(fault_duplicate, "fault injection: delivered twice")                                                     \
  X(fault_reorder, "fault injection: swapped with the next packet")                                          \
  X(fault_delay, "fault injection: held back for the set delay")                                             \
  X(tx_shm_packets, "packets sent through shared memory (same host; also in tx_packets)")                    \
  X(rx_shm_packets, "packets received through shared memory (also in rx_packets)")                           \
  X(drop_shm_ring_full, "dropped: the peer's shared-memory ring was full")                                   \
  X(tx_shm_streamed, "of tx_shm_packets, long ones copied into the ring with streaming stores")              \
  X(shm_doorbells, "wake-ups sent to a sleeping same-host peer")                                             \
  X(shm_rings_warmed, "same-host rings warmed up after their first packet")                                  \
  X(shm_rings_prewarmed, "same-host rings warmed up when their port opened")                                 \
  X(shm_rings_cold_bulk, "same-host rings a UD sender claimed in its post, bulk pages left to first use")    \
  X(direct_ops, "RDMA WRITEs, READs (and ATOMICs) done in a same-host peer's memory directly (no packet)")   \
  X(direct_bytes, "bytes those moved")                                                                       \
  X(direct_shared_ops, "of those, copies through pages the peer shares (SOFTRDMA_SHARE_MR=1)")               \
  X(direct_mem_file_ops, "of those, small ones through the peer's /proc/<pid>/mem")                          \
  X(direct_split_ops, "of those, large ones copied in two halves at once, one on a helper thread")           \
  X(ring_lone_writes, "small signaled WRITEs posted alone that went through a same-host ring (a ping-pong)") \
  X(acks_deferred, "RC ACKs deferred to the QP's next post (at most 20 us)")                                 \
  X(acks_deferred_late, "deferred ACKs that went by their deadline, no post in time")                        \
  X(answer_holds,                                                                                            \
    "send completions held from polls for the peer's answer (a ping-pong's ACK came alone, or its UC WRITE " \
    "went)")                                                                                                 \
  X(answer_holds_late, "of those, released with no answer in time")                                          \
  X(progress_sleeps, "progress-thread sleeps (each ends in a wake-up)")                                      \
  X(progress_naps,                                                                                           \
    "of those, naps (sockets not watched) beside an application that polls or waits for events")             \
  X(event_wait_sleeps, "sleeps of application threads in ibv_get_cq_event that receive themselves")          \
  X(poll_yields,                                                                                             \
    "CPU given up (sched_yield) by application threads after 20 us of polls that found nothing")             \
  X(retry_waits,                                                                                             \
    "ACK timeouts that waited once more: the same-host peer was still reading what came before")             \
  X(mr_pages_touched, "MR pages the kernel read once at registration (io/kernel_touch.h)")

enum class Counter : uint32_t {
#define SOFTRDMA_X(name, desc) name,
  SOFTRDMA_COUNTERS(SOFTRDMA_X)
#undef SOFTRDMA_X
      kCount
};

struct CounterInfo {
  std::string_view name;
  std::string_view description;
};
inline constexpr CounterInfo kCounterInfo[] = {
#define SOFTRDMA_X(name, desc) {#name, desc},
    SOFTRDMA_COUNTERS(SOFTRDMA_X)
#undef SOFTRDMA_X
};
inline constexpr uint32_t kNumCounters = static_cast<uint32_t>(Counter::kCount);

// A block of counters. Relaxed atomics: writers are the progress thread and posting threads.
struct Counters {
  std::atomic<uint64_t> v[kNumCounters] = {};
  void add(Counter c, uint64_t n = 1) { v[static_cast<uint32_t>(c)].fetch_add(n, std::memory_order_relaxed); }
  uint64_t get(Counter c) const { return v[static_cast<uint32_t>(c)].load(std::memory_order_relaxed); }
};

}  // namespace softrdma
