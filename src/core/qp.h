// The queue pair: its attributes, its send and receive queues, and the state of its three transport
// engines (requester, responder, completer: src/transport). One lock per QP; no lock shared across QPs on
// the data path.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <vector>

#include "core/objects.h"
#include "softrdma/types.h"
#include "wire/addr.h"

namespace softrdma::core {

struct QpCap {
  uint32_t max_send_wr = 0;
  uint32_t max_recv_wr = 0;
  uint32_t max_send_sge = 0;
  uint32_t max_recv_sge = 0;
  uint32_t max_inline_data = 0;
};

struct QpInitAttr {
  QpType type = QpType::kRc;
  Cq* send_cq = nullptr;
  Cq* recv_cq = nullptr;
  Srq* srq = nullptr;
  QpCap cap;
  bool sq_sig_all = false;
  void* user_context = nullptr;
};

struct QpAttr {  // ibv_qp_attr's fields that softrdma uses
  QpState qp_state = QpState::kReset;
  QpState cur_qp_state = QpState::kReset;
  Mtu path_mtu = Mtu::k256;
  uint32_t qkey = 0;
  uint32_t rq_psn = 0;
  uint32_t sq_psn = 0;
  uint32_t dest_qp_num = 0;
  uint32_t qp_access_flags = 0;
  QpCap cap;
  AhAttr ah_attr;
  uint16_t pkey_index = 0;
  bool sq_draining = false;
  uint8_t max_rd_atomic = 0;
  uint8_t max_dest_rd_atomic = 0;
  uint8_t min_rnr_timer = 0;
  uint8_t port_num = 1;
  uint8_t timeout = 0;
  uint8_t retry_cnt = 0;
  uint8_t rnr_retry = 0;
  bool en_sqd_async_notify = false;
};

// A local buffer piece of a send WQE: a validated host address range.
struct Seg {
  uint8_t* ptr = nullptr;
  uint32_t len = 0;
};

struct SendWqe {
  uint64_t wr_id = 0;
  WrOpcode opcode = WrOpcode::kSend;
  uint32_t send_flags = 0;
  uint32_t imm_be = 0;
  uint32_t inv_rkey = 0;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint64_t compare_add = 0;
  uint64_t swap = 0;
  // UD destination
  wire::Endpoint ud_dst;
  uint32_t ud_dqpn = 0;
  uint32_t ud_qkey = 0;

  uint32_t length = 0;
  uint32_t num_seg = 0;
  WcStatus post_status = WcStatus::kSuccess;  // a local error found at post time, reported at completion
  // transport progress
  uint32_t first_psn = 0;
  uint32_t last_psn = 0;
  bool started = false;
  bool done = false;  // acknowledged (or failed); completes in order
  WcStatus status = WcStatus::kSuccess;
  Seg seg[kMaxSge];
  alignas(8) uint8_t inline_data[kMaxInline];
};

// Requester (src/transport/requester.cc): what to send next.
struct ReqState {
  uint32_t psn = 0;        // next PSN
  uint32_t high_psn = 0;   // the first PSN never sent (packets below it that go again are retransmissions)
  uint64_t wqe = 0;        // index of the WQE being sent (monotonic; ring slot = & mask)
  uint32_t offset = 0;     // bytes of it already sent
  uint32_t noack_pkts = 0;
  uint32_t rd_atomic = 0;  // READ/ATOMIC WQEs outstanding
  Nanos cork_deadline = 0;  // UC/UD: WRs a post left queued go by then at the latest (0 = none)
  // Same-host lone WRITEs (Transport::lone_write_by_ring): lone posts since the peer's last request packet
  // that awaited its ACK (up to 255), and whether one went through the ring yet.
  uint8_t lone_since_request = 255;
  bool ring_tried = false;
  bool uc_sent = false;  // UC: a packet went out since the reset (io::DirectOp::uc)
};

// Completer (src/transport/completer.cc): what is acknowledged, and the timers.
struct CompState {
  uint32_t psn = 0;      // oldest unacknowledged PSN
  uint64_t wqe = 0;      // oldest WQE not yet completed
  uint8_t retry_left = 0;
  uint8_t rnr_left = 0;
  Nanos retrans_deadline = 0;  // 0 = not armed
  Nanos rnr_deadline = 0;      // waiting after an RNR NAK
  uint64_t peer_mark = 0;      // io::Backend::peer_behind's state for this QP
  uint8_t retry_waits = 0;     // timeouts in a row that waited for it (Transport::kMaxRetryWaits)
  uint32_t read_gap_psn = 0;   // comp.psn + 1 when a READ was re-requested for a gap there (0 = none)
  // Transport::ack_came_alone: ACKs that came behind a request of the peer's (up to kPingPongAcks), ACKs
  // in a row that came alone since, and whether a request came since the last post.
  uint8_t acks_behind_requests = 0;
  uint16_t acks_alone = 0;
  bool request_since_post = false;
  // UC (Transport::uc_answer_hold): lone WRITEs posted in a row that each found a request of the peer's
  // come since the post before (up to kPingPongAcks), and the end of the hold of the last one (0: none).
  uint8_t uc_answers = 0;
  Nanos uc_hold_until = 0;
  // Early retransmission (Transport::timers): the round trip, timed from a packet sent for the first time
  // to the ACK that passes it (none across a go-back-N, whose ACK may answer either sending), smoothed as
  // TCP's (RFC 6298), and the deadline it sets for a go-back-N before the QP's own ACK timeout.
  Nanos srtt = 0;  // 0: none timed yet
  Nanos rttvar = 0;
  Nanos rtt_sent_at = 0;  // when rtt_psn went out (0: none being timed)
  uint32_t rtt_psn = 0;
  Nanos early_deadline = 0;   // 0 = not armed
  uint8_t early_backoff = 0;  // early retransmissions since the last progress (each doubles the wait)
  bool answered = false;      // an ACK has made progress (until one has, the peer may be gone, not lossy)
  bool probed = false;        // a loss probe went since the last progress or go-back-N (Transport::probe)
  // The send window after a loss, in packets (Transport::resend_after_loss; 0: the full window, none lost
  // since).
  uint32_t loss_window = 0;
};

// A saved READ or ATOMIC request, for replay of duplicates (IBTA.md 5).
struct RespResource {
  bool atomic = false;
  bool valid = false;
  uint32_t first_psn = 0;
  uint32_t last_psn = 0;
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint32_t length = 0;
  uint64_t atomic_orig = 0;
  uint32_t msn = 0;
};

// Responder (src/transport/responder.cc).
struct RespState {
  uint32_t psn = 0;  // expected PSN
  uint32_t msn = 0;
  bool sent_psn_nak = false;
  uint8_t last_opcode = 0xFF;  // of the last accepted packet, for sequence checks (0xFF = message boundary)
  bool uc_drop = false;        // UC: drop until the next FIRST/ONLY
  // The message being received
  bool have_wqe = false;
  RecvWqe wqe;
  uint32_t offset = 0;  // bytes placed into wqe
  MrRef write_mr;       // WRITE in progress
  uint64_t write_va = 0;
  uint32_t write_resid = 0;
  // ACK to send after this burst (coalesced)
  bool ack_pending = false;
  uint32_t ack_psn = 0;
  uint8_t ack_syndrome = 0;
  uint32_t ack_msn = 0;
  Nanos ack_deadline = 0;  // a deferred ACK goes by then at the latest (0 = none)
  uint32_t acks_undeferred = 0;  // after deferred ACKs went by their deadline: ACKs left to send at once
  uint32_t acks_expired = 0;     // deferred ACKs in a row that went by their deadline
  uint32_t ack_backoffs = 0;     // runs of acks_undeferred since an answer came in time (Transport::timers)
  std::vector<RespResource> res;
  uint32_t res_next = 0;
};

// A send work request (ibv_send_wr without the list link).
struct SendWr {
  uint64_t wr_id = 0;
  WrOpcode opcode = WrOpcode::kSend;
  uint32_t send_flags = 0;
  uint32_t imm_data = 0;  // network order
  std::span<const Sge> sg_list;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint64_t compare_add = 0;
  uint64_t swap = 0;
  Ah* ah = nullptr;  // UD
  uint32_t remote_qpn = 0;
  uint32_t remote_qkey = 0;
  uint32_t invalidate_rkey = 0;
};

struct RecvWr {
  uint64_t wr_id = 0;
  std::span<const Sge> sg_list;
};

class Qp {
 public:
  Qp(Context* ctx, Pd* pd, uint32_t qpn, uint16_t port, const QpInitAttr& init);
  ~Qp();

  Context* ctx() const { return ctx_; }
  Pd* pd() const { return pd_; }
  uint32_t qpn() const { return qpn_; }
  uint16_t port() const { return port_; }
  QpType type() const { return init_.type; }
  QpState state() const { return attr_.qp_state; }
  const QpInitAttr& init() const { return init_; }
  const QpAttr& attr() const { return attr_; }
  SpinLock& lock() { return lock_; }
  uint32_t pmtu() const { return pmtu_; }
  const wire::Endpoint& peer() const { return peer_; }
  // The nearest armed timer (0 = none), readable without the lock by the timer scan.
  std::atomic<Nanos> next_deadline{0};

  // Verbs (each takes the QP lock). Return 0 or an errno, as rdma-core does.
  int modify(const QpAttr& attr, uint32_t mask);
  int query(QpAttr* attr, QpInitAttr* init) const;
  // Posts WRs in order and runs the requester; on failure returns the errno and sets *bad to the index of
  // the first WR not posted.
  int post_send(std::span<const SendWr> wrs, size_t* bad);
  int post_recv(std::span<const RecvWr> wrs, size_t* bad);
  // RC packets un-ACKed from which post_send leaves sending to the posting thread's next poll, or the
  // next ACK (qp.cc).
  static constexpr int32_t kCorkInFlight = 2;
  // UC/UD posts in a row, with no poll of the send CQ between, that go at once; later ones wait.
  static constexpr uint32_t kCorkPostsInARow = 2;
  // UC/UD posts left queued go at the poster's next poll, or by the progress thread's timer this late.
  static constexpr Nanos kCorkDelayNs = 200'000;
  // Sends what post_send left queued (Context::send_corked, inside the driver's exclusion).
  void send_corked();
  // Sends an ACK the responder deferred (Transport::end_burst) now: the QP is going away.
  void flush_deferred_ack();
  // The QP is going away: its responder stops storing its PSN into the access table's entry, which another
  // QP may take once it is withdrawn (Context::destroy_qp calls it first).
  void forget_published();
  // After the transport ran under the lock: the QP's nearest timer for the drivers (a sleeping one is
  // kicked if it would sleep past it).
  void publish_deadline();

 private:
  friend class Transport;
  friend class TransportTest;

  Context* ctx_;
  Pd* pd_;
  uint32_t qpn_;
  uint16_t port_;
  QpInitAttr init_;
  QpAttr attr_;
  mutable SpinLock lock_;
  void send_deferred_ack();  // under the lock
  bool sharing_window_ = false;  // counted in the context's rc_sending
  void share_window(bool on);    // counts this QP in (or out of) the context's rc_sending
  // The same-host one-sided path suits an application that waits for each operation (a latency test,
  // a request-response protocol): a post of one WR after the send CQ was polled may take it. In a stream
  // of posts, so do WRITEs and READs of ContextConfig::direct_stream_min bytes or more (ib_write_bw same
  // host on this project's second VM, whose syscalls cost 1 us: 1 MiB 21-25.7 GB/s one-sided against
  // 8.4-8.7 through the rings, 64 KiB 11.8-12.7 against 8.7; on its first VM 1 MiB went 14.8 one-sided
  // against 25.6 through the rings); smaller ones go through the rings, which overlap the two processes'
  // copies (16 KiB 5.8 GB/s against 4.5 one-sided, 8 B 3.5 M/s against 3.2).
  // Once an op copied through pages the peer shares (SOFTRDMA_SHARE_MR=1), a memcpy with no syscall, a
  // stream takes the path too, until an op cannot (ib_write_bw same host, 1 MiB 53 GB/s against 12-30
  // through the rings, 64 KiB 69-87 against 11-22, 8 B 2.3-6.1 M/s against 3.5-4.9).
  uint32_t send_cq_polls_ = ~0u;
  // A UC QP's published PSN after the last packet its responder took (io::Backend::publish_qp), which a
  // same-host peer reads before its WRITEs go one-sided (Transport::responder stores it); null: none.
  std::atomic<uint32_t>* psn_seen_ = nullptr;
  bool may_direct_ = false;
  bool shared_direct_ = false;
  bool corked_ = false;  // WRs wait in the send queue (post_send; on the poster's list if it had room)
  bool tx_held_ = false;  // packets of this QP may wait in a driver's batch (Transport::hold_tx)
  bool lone_held_ = false;         // the last post that a hold corked was lone (may_direct_ at release_tx)
  uint32_t posts_since_poll_ = 0;  // post_send calls since the send CQ was last polled (UC/UD corking)

  // Send queue
  std::vector<SendWqe> sq_;
  uint32_t sq_mask_ = 0;
  uint64_t sq_head_ = 0;  // next slot to post
  // Receive queue (unless init_.srq)
  RecvQueue rq_;

  wire::Endpoint peer_;  // RC/UC: the connected peer's endpoint
  uint64_t path_cap_ = 0;  // RC/UC: the backend's inflight_cap towards peer_ (Context::window_for)
  uint32_t pmtu_ = 256;
  ReqState req_;
  CompState comp_;
  RespState resp_;
};

}  // namespace softrdma::core
