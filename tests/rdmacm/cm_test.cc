// The rdma_cm C API of softrdma's librdmacm.so.1, both ends in this process on 127.0.0.1 (each connection
// still goes through TCP and the service thread): event channels, the QPs rdma_create_qp makes, the
// handshake's parameters and private data, its limits, reject, disconnect and UD.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <rdma/rsocket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "loopback.h"

namespace {

using rdmacm_test::loopback;
using rdmacm_test::sa;

// The next event on ch within timeout_ms (nullptr if none), found by polling the channel's fd.
rdma_cm_event* next_event(rdma_event_channel* ch, int timeout_ms = 5000) {
  pollfd p{ch->fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) != 1) return nullptr;
  rdma_cm_event* e = nullptr;
  if (rdma_get_cm_event(ch, &e)) return nullptr;
  return e;
}

// Takes the next event, checks its type, copies what the test needs and acks it.
struct Got {
  rdma_cm_event_type type;
  int status;
  rdma_cm_id* id;
  rdma_cm_id* listen_id;
  rdma_conn_param conn;
  rdma_ud_param ud;
  std::vector<uint8_t> data;
};

Got expect_event(rdma_event_channel* ch, rdma_cm_event_type type) {
  rdma_cm_event* e = next_event(ch);
  EXPECT_NE(e, nullptr) << "no " << rdma_event_str(type);
  if (!e) return Got{};
  Got g{e->event, e->status, e->id, e->listen_id, e->param.conn, e->param.ud, {}};
  const bool ud = e->id->qp_type == IBV_QPT_UD && e->event != RDMA_CM_EVENT_REJECTED;
  const void* pd = ud ? e->param.ud.private_data : e->param.conn.private_data;
  const uint8_t len = ud ? e->param.ud.private_data_len : e->param.conn.private_data_len;
  if (pd) g.data.assign(static_cast<const uint8_t*>(pd), static_cast<const uint8_t*>(pd) + len);
  EXPECT_EQ(e->event, type) << rdma_event_str(e->event) << " status " << e->status;
  rdma_ack_cm_event(e);
  return g;
}

ibv_qp_state qp_state(ibv_qp* qp) {
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  EXPECT_EQ(ibv_query_qp(qp, &attr, IBV_QP_STATE, &init), 0);
  return attr.qp_state;
}

ibv_qp_init_attr qp_attr(ibv_qp_type type) {
  ibv_qp_init_attr a{};
  a.qp_type = type;
  a.cap.max_send_wr = a.cap.max_recv_wr = 8;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  return a;
}

class Cm : public ::testing::Test {
 protected:
  void SetUp() override {
    sch_ = rdma_create_event_channel();
    cch_ = rdma_create_event_channel();
    ASSERT_TRUE(sch_ && cch_);
  }
  void TearDown() override {
    for (rdma_cm_id* id : {child_, client_, listener_}) {
      if (!id) continue;
      if (id->qp) rdma_destroy_qp(id);
      rdma_destroy_id(id);
    }
    rdma_destroy_event_channel(sch_);
    rdma_destroy_event_channel(cch_);
  }

  // A listener on 127.0.0.1 at an ephemeral port, and a client whose route to it is resolved.
  void listen_and_resolve(rdma_port_space ps) {
    ASSERT_EQ(rdma_create_id(sch_, &listener_, nullptr, ps), 0);
    sockaddr_in a = loopback(0);
    ASSERT_EQ(rdma_bind_addr(listener_, sa(&a)), 0);
    ASSERT_EQ(rdma_listen(listener_, 8), 0);
    port_ = ntohs(rdma_get_src_port(listener_));
    ASSERT_NE(port_, 0);
    ASSERT_EQ(rdma_create_id(cch_, &client_, nullptr, ps), 0);
    sockaddr_in dst = loopback(port_);
    ASSERT_EQ(rdma_resolve_addr(client_, nullptr, sa(&dst), 2000), 0);
    expect_event(cch_, RDMA_CM_EVENT_ADDR_RESOLVED);
    ASSERT_EQ(rdma_resolve_route(client_, 2000), 0);
    expect_event(cch_, RDMA_CM_EVENT_ROUTE_RESOLVED);
  }

  // listen_and_resolve(RDMA_PS_TCP) and an RC QP on the client id.
  void connectable_rc_client() {
    listen_and_resolve(RDMA_PS_TCP);
    ibv_qp_init_attr a = qp_attr(IBV_QPT_RC);
    ASSERT_EQ(rdma_create_qp(client_, nullptr, &a), 0);
  }

  rdma_event_channel* sch_ = nullptr;
  rdma_event_channel* cch_ = nullptr;
  rdma_cm_id* listener_ = nullptr;
  rdma_cm_id* client_ = nullptr;
  rdma_cm_id* child_ = nullptr;
  uint16_t port_ = 0;
};

TEST_F(Cm, ChannelFdPollsReadableWithAnEventAndReadsEagainWithout) {
  ASSERT_EQ(rdma_create_id(cch_, &client_, nullptr, RDMA_PS_TCP), 0);
  pollfd p{cch_->fd, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 0), 0);
  sockaddr_in dst = loopback(9);
  ASSERT_EQ(rdma_resolve_addr(client_, nullptr, sa(&dst), 2000), 0);
  EXPECT_EQ(poll(&p, 1, 1000), 1);
  fcntl(cch_->fd, F_SETFL, fcntl(cch_->fd, F_GETFL) | O_NONBLOCK);
  rdma_cm_event* e = nullptr;
  ASSERT_EQ(rdma_get_cm_event(cch_, &e), 0);
  EXPECT_EQ(e->event, RDMA_CM_EVENT_ADDR_RESOLVED);
  EXPECT_EQ(e->id, client_);
  rdma_ack_cm_event(e);
  EXPECT_EQ(rdma_get_cm_event(cch_, &e), -1);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_EQ(poll(&p, 1, 0), 0);
}

TEST_F(Cm, ResolvedIdSharesOneContextAndPdPerDevice) {
  listen_and_resolve(RDMA_PS_TCP);
  ASSERT_NE(client_->verbs, nullptr);
  EXPECT_EQ(client_->verbs, listener_->verbs);
  EXPECT_EQ(client_->pd, listener_->pd);
  EXPECT_EQ(client_->port_num, 1);
  EXPECT_EQ(client_->route.num_paths, 1);
  // The source GID is 127.0.0.1 as an IPv4-mapped GID.
  const uint8_t mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
  EXPECT_EQ(memcmp(client_->route.addr.addr.ibaddr.sgid.raw, mapped, 16), 0);
  EXPECT_NE(rdma_get_src_port(client_), 0);
  EXPECT_EQ(ntohs(rdma_get_dst_port(client_)), port_);
}

TEST_F(Cm, BindToAnyAddressHasNoDeviceYet) {
  ASSERT_EQ(rdma_create_id(sch_, &listener_, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ASSERT_EQ(rdma_bind_addr(listener_, sa(&a)), 0);
  EXPECT_EQ(listener_->verbs, nullptr);
  EXPECT_NE(rdma_get_src_port(listener_), 0);
  // Bound once: a second bind is refused.
  EXPECT_EQ(rdma_bind_addr(listener_, sa(&a)), -1);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(Cm, CreateQpMakesCqsWithChannelsAndLeavesRcInInitUdInRts) {
  listen_and_resolve(RDMA_PS_TCP);
  ibv_qp_init_attr a = qp_attr(IBV_QPT_RC);
  ASSERT_EQ(rdma_create_qp(client_, nullptr, &a), 0);
  ASSERT_TRUE(client_->qp && client_->send_cq && client_->recv_cq);
  EXPECT_NE(client_->send_cq, client_->recv_cq);
  EXPECT_TRUE(client_->send_cq_channel && client_->recv_cq_channel);
  EXPECT_EQ(client_->send_cq->cq_context, client_);
  EXPECT_EQ(client_->qp->pd, client_->pd);
  EXPECT_EQ(qp_state(client_->qp), IBV_QPS_INIT);
  // One QP per id.
  EXPECT_EQ(rdma_create_qp(client_, nullptr, &a), -1);

  rdma_cm_id* ud = nullptr;
  ASSERT_EQ(rdma_create_id(cch_, &ud, nullptr, RDMA_PS_UDP), 0);
  sockaddr_in src = loopback(0);
  ASSERT_EQ(rdma_bind_addr(ud, sa(&src)), 0);
  ibv_qp_init_attr u = qp_attr(IBV_QPT_UD);
  ASSERT_EQ(rdma_create_qp(ud, nullptr, &u), 0);
  EXPECT_EQ(qp_state(ud->qp), IBV_QPS_RTS);
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(ibv_query_qp(ud->qp, &attr, IBV_QP_QKEY, &init), 0);
  EXPECT_EQ(attr.qkey, static_cast<uint32_t>(RDMA_UDP_QKEY));
  rdma_destroy_qp(ud);
  rdma_destroy_id(ud);
}

TEST_F(Cm, ConnectAcceptCarryPrivateDataAndBothEndsExchangeMessages) {
  connectable_rc_client();
  uint8_t req_data[56];
  for (int i = 0; i < 56; ++i) req_data[i] = static_cast<uint8_t>(i + 1);
  rdma_conn_param p{};
  p.private_data = req_data;
  p.private_data_len = 57;  // one more than the IB CM's REQ holds
  p.responder_resources = p.initiator_depth = 1;
  p.retry_count = 15;  // libfabric's: the IB CM's 3-bit field carries 7
  p.rnr_retry_count = 6;
  EXPECT_EQ(rdma_connect(client_, &p), -1);
  EXPECT_EQ(errno, EINVAL);
  p.private_data_len = 56;
  ASSERT_EQ(rdma_connect(client_, &p), 0);

  Got req = expect_event(sch_, RDMA_CM_EVENT_CONNECT_REQUEST);
  child_ = req.id;
  ASSERT_NE(child_, nullptr);
  EXPECT_EQ(req.listen_id, listener_);
  EXPECT_NE(child_, listener_);
  ASSERT_EQ(req.data.size(), 56u);
  EXPECT_EQ(memcmp(req.data.data(), req_data, 56), 0);
  EXPECT_EQ(req.conn.responder_resources, 1);
  EXPECT_EQ(req.conn.initiator_depth, 1);
  EXPECT_EQ(req.conn.qp_num, client_->qp->qp_num);
  EXPECT_EQ(req.conn.retry_count, 7);
  EXPECT_EQ(req.conn.rnr_retry_count, 6);
  EXPECT_EQ(child_->verbs, listener_->verbs);

  ibv_qp_init_attr ca = qp_attr(IBV_QPT_RC);
  ASSERT_EQ(rdma_create_qp(child_, nullptr, &ca), 0);
  char recv_buf[64] = {};
  ibv_mr* rmr = rdma_reg_msgs(child_, recv_buf, sizeof recv_buf);
  ASSERT_NE(rmr, nullptr);
  ASSERT_EQ(rdma_post_recv(child_, nullptr, recv_buf, sizeof recv_buf, rmr), 0);

  uint8_t rep_data[197];
  memset(rep_data, 0xab, sizeof rep_data);
  rdma_conn_param r{};
  r.private_data = rep_data;
  r.private_data_len = 197;  // the REP holds 196
  r.responder_resources = r.initiator_depth = 1;
  EXPECT_EQ(rdma_accept(child_, &r), -1);
  EXPECT_EQ(errno, EINVAL);
  r.private_data_len = 196;
  ASSERT_EQ(rdma_accept(child_, &r), 0);

  Got est = expect_event(cch_, RDMA_CM_EVENT_ESTABLISHED);
  ASSERT_EQ(est.data.size(), 196u);
  EXPECT_EQ(est.data[0], 0xab);
  EXPECT_EQ(est.data[195], 0xab);
  EXPECT_EQ(est.conn.qp_num, child_->qp->qp_num);
  expect_event(sch_, RDMA_CM_EVENT_ESTABLISHED);
  EXPECT_EQ(qp_state(client_->qp), IBV_QPS_RTS);
  EXPECT_EQ(qp_state(child_->qp), IBV_QPS_RTS);

  // The QPs are connected: a message goes through, with the rdma_verbs.h helpers.
  char msg[] = "over the connection rdma_cm made";
  ibv_mr* smr = rdma_reg_msgs(client_, msg, sizeof msg);
  ASSERT_NE(smr, nullptr);
  ASSERT_EQ(rdma_post_send(client_, nullptr, msg, sizeof msg, smr, IBV_SEND_SIGNALED), 0);
  ibv_wc wc{};
  ASSERT_EQ(rdma_get_send_comp(client_, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_EQ(rdma_get_recv_comp(child_, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_STREQ(recv_buf, msg);

  // Either end disconnects: both get DISCONNECTED, and the disconnecting QP is in error.
  ASSERT_EQ(rdma_disconnect(client_), 0);
  expect_event(cch_, RDMA_CM_EVENT_DISCONNECTED);
  expect_event(sch_, RDMA_CM_EVENT_DISCONNECTED);
  EXPECT_EQ(qp_state(client_->qp), IBV_QPS_ERR);
  ASSERT_EQ(rdma_disconnect(child_), 0);  // after the peer's: nothing more to send
  rdma_dereg_mr(smr);
  rdma_dereg_mr(rmr);
}

TEST_F(Cm, RejectGivesConsumerReasonAndPrivateData) {
  connectable_rc_client();
  ASSERT_EQ(rdma_connect(client_, nullptr), 0);
  Got req = expect_event(sch_, RDMA_CM_EVENT_CONNECT_REQUEST);
  child_ = req.id;
  uint8_t why[149];
  memset(why, 7, sizeof why);
  EXPECT_EQ(rdma_reject(child_, why, 149), -1);  // the REJ holds 148
  EXPECT_EQ(errno, EINVAL);
  ASSERT_EQ(rdma_reject(child_, why, 148), 0);
  Got rej = expect_event(cch_, RDMA_CM_EVENT_REJECTED);
  EXPECT_EQ(rej.status, 28);  // IB_CM_REJ_CONSUMER_DEFINED
  ASSERT_EQ(rej.data.size(), 148u);
  EXPECT_EQ(rej.data[147], 7);
  EXPECT_EQ(qp_state(client_->qp), IBV_QPS_ERR);
}

TEST_F(Cm, AnActiveQpThatCannotComeUpGivesConnectErrorHereAndRejectedThere) {
  connectable_rc_client();
  ASSERT_EQ(rdma_connect(client_, nullptr), 0);
  child_ = expect_event(sch_, RDMA_CM_EVENT_CONNECT_REQUEST).id;
  ibv_qp_init_attr a = qp_attr(IBV_QPT_RC);
  ASSERT_EQ(rdma_create_qp(child_, nullptr, &a), 0);
  ASSERT_EQ(rdma_accept(child_, nullptr), 0);
  // The client's QP goes to ERR before the REP is read: it cannot be brought to RTR/RTS.
  ibv_qp_attr err{};
  err.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(client_->qp, &err, IBV_QP_STATE), 0);
  Got ce = expect_event(cch_, RDMA_CM_EVENT_CONNECT_ERROR);
  EXPECT_LT(ce.status, 0);
  Got rej = expect_event(sch_, RDMA_CM_EVENT_REJECTED);
  EXPECT_EQ(rej.status, 28);
}

TEST_F(Cm, NoQpOnTheIdGivesConnectResponseThenEstablish) {
  listen_and_resolve(RDMA_PS_TCP);
  rdma_conn_param p{};
  p.qp_num = 0x123456;
  EXPECT_EQ(rdma_connect(client_, nullptr), -1);  // neither a QP nor parameters
  EXPECT_EQ(errno, EINVAL);
  ASSERT_EQ(rdma_connect(client_, &p), 0);
  Got req = expect_event(sch_, RDMA_CM_EVENT_CONNECT_REQUEST);
  child_ = req.id;
  EXPECT_EQ(req.conn.qp_num, 0x123456u);
  rdma_conn_param r{};
  r.qp_num = 0x654321;
  ASSERT_EQ(rdma_accept(child_, &r), 0);
  Got resp = expect_event(cch_, RDMA_CM_EVENT_CONNECT_RESPONSE);
  EXPECT_EQ(resp.conn.qp_num, 0x654321u);
  // What the application's own QP needs for RTR: the peer's QPN and a path to its GID.
  ibv_qp_attr attr{};
  int mask = 0;
  attr.qp_state = IBV_QPS_RTR;
  ASSERT_EQ(rdma_init_qp_attr(client_, &attr, &mask), 0);
  EXPECT_EQ(attr.dest_qp_num, 0x654321u);
  EXPECT_TRUE(mask & IBV_QP_AV);
  EXPECT_EQ(attr.ah_attr.is_global, 1);
  ASSERT_EQ(rdma_establish(client_), 0);
  expect_event(sch_, RDMA_CM_EVENT_ESTABLISHED);
}

TEST_F(Cm, UdConnectGivesTheServersQpnQkeyAndAddressHandle) {
  listen_and_resolve(RDMA_PS_UDP);
  ibv_qp_init_attr a = qp_attr(IBV_QPT_UD);
  ASSERT_EQ(rdma_create_qp(client_, nullptr, &a), 0);
  const char hello[] = "sidr";
  rdma_conn_param p{};
  p.private_data = hello;
  p.private_data_len = sizeof hello;
  ASSERT_EQ(rdma_connect(client_, &p), 0);
  Got req = expect_event(sch_, RDMA_CM_EVENT_CONNECT_REQUEST);
  child_ = req.id;
  EXPECT_EQ(child_->qp_type, IBV_QPT_UD);
  ASSERT_GE(req.data.size(), sizeof hello);
  EXPECT_STREQ(reinterpret_cast<const char*>(req.data.data()), hello);
  ibv_qp_init_attr ca = qp_attr(IBV_QPT_UD);
  ASSERT_EQ(rdma_create_qp(child_, nullptr, &ca), 0);
  ASSERT_EQ(rdma_accept(child_, nullptr), 0);
  Got est = expect_event(cch_, RDMA_CM_EVENT_ESTABLISHED);
  EXPECT_EQ(est.ud.qp_num, child_->qp->qp_num);
  EXPECT_EQ(est.ud.qkey, static_cast<uint32_t>(RDMA_UDP_QKEY));
  EXPECT_EQ(est.ud.ah_attr.is_global, 1);
  EXPECT_EQ(memcmp(est.ud.ah_attr.grh.dgid.raw, child_->route.addr.addr.ibaddr.sgid.raw, 16), 0);
  ibv_ah* ah = ibv_create_ah(client_->pd, &est.ud.ah_attr);
  EXPECT_NE(ah, nullptr);
  if (ah) ibv_destroy_ah(ah);
  // UD has no disconnect.
  EXPECT_EQ(rdma_disconnect(client_), -1);
}

TEST_F(Cm, DestroyedListenerRejectsItsPendingRequests) {
  listen_and_resolve(RDMA_PS_TCP);
  rdma_conn_param p{};
  p.qp_num = 1;
  ASSERT_EQ(rdma_connect(client_, &p), 0);
  // Wait for the request to be queued, then destroy the listener without reading it.
  pollfd pf{sch_->fd, POLLIN, 0};
  ASSERT_EQ(poll(&pf, 1, 5000), 1);
  ASSERT_EQ(rdma_destroy_id(listener_), 0);
  listener_ = nullptr;
  Got rej = expect_event(cch_, RDMA_CM_EVENT_REJECTED);
  EXPECT_EQ(rej.status, 28);
}

TEST_F(Cm, DestroyingAConnectedIdDisconnectsThePeer) {
  connectable_rc_client();
  ASSERT_EQ(rdma_connect(client_, nullptr), 0);
  child_ = expect_event(sch_, RDMA_CM_EVENT_CONNECT_REQUEST).id;
  ibv_qp_init_attr a = qp_attr(IBV_QPT_RC);
  ASSERT_EQ(rdma_create_qp(child_, nullptr, &a), 0);
  ASSERT_EQ(rdma_accept(child_, nullptr), 0);
  expect_event(cch_, RDMA_CM_EVENT_ESTABLISHED);
  expect_event(sch_, RDMA_CM_EVENT_ESTABLISHED);
  rdma_destroy_qp(client_);
  ASSERT_EQ(rdma_destroy_id(client_), 0);
  client_ = nullptr;
  expect_event(sch_, RDMA_CM_EVENT_DISCONNECTED);
}

TEST_F(Cm, GetaddrinfoGivesRcOverTcpPortSpaceAndPassiveSource) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_PASSIVE;
  hints.ai_port_space = RDMA_PS_TCP;
  rdma_addrinfo* res = nullptr;
  ASSERT_EQ(rdma_getaddrinfo("127.0.0.1", "7471", &hints, &res), 0);
  ASSERT_NE(res, nullptr);
  EXPECT_EQ(res->ai_flags & RAI_PASSIVE, RAI_PASSIVE);
  EXPECT_EQ(res->ai_qp_type, IBV_QPT_RC);
  EXPECT_EQ(res->ai_port_space, RDMA_PS_TCP);
  ASSERT_NE(res->ai_src_addr, nullptr);
  EXPECT_EQ(ntohs(reinterpret_cast<sockaddr_in*>(res->ai_src_addr)->sin_port), 7471);
  rdma_freeaddrinfo(res);
  EXPECT_EQ(rdma_getaddrinfo(nullptr, nullptr, nullptr, &res), -1);
}

// A thread that asks a destroyed channel for its next event (rping's event thread does, while the main
// thread tears down) stays blocked, as in rdma-core's read() of the channel's fd, and touches no freed
// memory (the sanitizer builds would see it).
TEST(CmChannel, GetEventAfterDestroyBlocks) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_destroy_event_channel(ch);
  static std::atomic<int> returned{0};
  std::thread([ch] {
    rdma_cm_event* ev = nullptr;
    rdma_get_cm_event(ch, &ev);
    returned = 1;
  }).detach();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(returned.load(), 0);
}

TEST(CmUnsupported, MulticastFailsAsNotThere) {
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_UDP), 0);
  sockaddr_in mc{};
  mc.sin_family = AF_INET;
  mc.sin_addr.s_addr = htonl(0xe0000101);
  EXPECT_EQ(rdma_join_multicast(id, reinterpret_cast<sockaddr*>(&mc), nullptr), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ch);
}

}  // namespace
