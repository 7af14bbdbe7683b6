// The handshake softrdma's rdma_cm speaks over the TCP connection of each rdma_cm connection: the IB CM's
// messages (REQ, REP, REJ, RTU, DREQ, DREP, and SIDR's REQ/REP for UD) with the fields RoCE needs and the
// IB CM's private-data sizes. Each message is an 8-byte header (magic "SRCM", version, type, body length,
// big-endian) and a body of big-endian fields in the order of `Conn` / `Rej` below.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace softrdma::rdmacm::wire {

constexpr uint32_t kMagic = 0x5352434d;  // "SRCM"
constexpr uint8_t kVersion = 1;
constexpr size_t kHeaderSize = 8;

enum class Type : uint8_t { kReq = 1, kRep, kRej, kRtu, kDreq, kDrep, kSidrReq, kSidrRep };

// The IB CM's private data sizes, less the 36-byte header rdma_cm puts in a REQ (rdma-core and the kernel
// refuse longer private data with EINVAL; the receiver always sees the whole field, zero-padded).
constexpr uint8_t kReqPrivateData = 56;
constexpr uint8_t kRepPrivateData = 196;
constexpr uint8_t kRejPrivateData = 148;
constexpr uint8_t kSidrReqPrivateData = 180;
constexpr uint8_t kSidrRepPrivateData = 136;
constexpr size_t kMaxPrivateData = 256;

// IB CM reject reasons that rdma_cm reports as the status of REJECTED.
constexpr int kRejTimeout = 4;                    // the peer went away while the connection was being set up
constexpr int kRejInvalidServiceId = 8;           // nobody listens on that port
constexpr int kRejConsumerDefined = 28;           // rdma_reject
constexpr int kRejVendorOptionNotSupported = 35;  // rdma_reject_ece
// SIDR REP status (UD): reported as the status of UNREACHABLE.
constexpr uint8_t kSidrSuccess = 0, kSidrUnsupported = 1, kSidrReject = 2;

// REQ, REP and their SIDR forms: one layout, the fields a message does not use are 0.
struct Conn {
  uint32_t qpn = 0;
  uint32_t psn = 0;  // 24 bits
  uint8_t gid[16]{};
  uint8_t mtu = 0;  // enum ibv_mtu
  uint8_t responder_resources = 0, initiator_depth = 0;
  uint8_t flow_control = 0, retry_count = 0, rnr_retry_count = 0, srq = 0;  // counts: 3 bits, as the IB CM's
  uint8_t status = 0;                                                       // SIDR REP
  uint32_t qkey = 0;                                                        // SIDR REP
  uint8_t private_data_len = 0;
  uint8_t private_data[kMaxPrivateData]{};
};

struct Rej {
  uint8_t reason = 0;
  uint8_t private_data_len = 0;
  uint8_t private_data[kMaxPrivateData]{};
};

std::string encode(Type type, const Conn& c);
std::string encode(const Rej& r);
std::string encode(Type type);  // RTU, DREQ, DREP: no body

struct Message {
  Type type;
  Conn conn;
  Rej rej;
};

// Takes one whole message from the front of `buf`: nullopt while incomplete; sets *bad (and returns
// nullopt) on a malformed one, after which the connection is dropped.
std::optional<Message> decode(std::string* buf, bool* bad);

}  // namespace softrdma::rdmacm::wire
