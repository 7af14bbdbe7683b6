// Value types of the softrdma native API. Every enum value equals its libibverbs counterpart (verbs.h), so
// the drop-in C ABI converts by cast, and users of rdma-core find the words they know.
#pragma once

#include <cstdint>

namespace softrdma {

enum class QpType : uint8_t { kRc = 2, kUc = 3, kUd = 4 };  // IBV_QPT_*
enum class QpState : uint8_t { kReset = 0, kInit, kRtr, kRts, kSqd, kSqe, kErr };
enum class Mtu : uint8_t { k256 = 1, k512, k1024, k2048, k4096 };
constexpr uint32_t mtu_bytes(Mtu m) { return 128u << static_cast<uint8_t>(m); }

enum Access : uint32_t {  // IBV_ACCESS_*
  kLocalWrite = 1,
  kRemoteWrite = 2,
  kRemoteRead = 4,
  kRemoteAtomic = 8,
  kMwBind = 16,
  kZeroBased = 32,
  kOnDemand = 64,
  kHugetlb = 128,
  kRelaxedOrdering = 1u << 20,
};

enum class WrOpcode : uint8_t {  // IBV_WR_*
  kRdmaWrite = 0,
  kRdmaWriteWithImm = 1,
  kSend = 2,
  kSendWithImm = 3,
  kRdmaRead = 4,
  kAtomicCmpAndSwp = 5,
  kAtomicFetchAndAdd = 6,
  kLocalInv = 7,
  kBindMw = 8,
  kSendWithInv = 9,
};

enum SendFlags : uint32_t { kSendFence = 1, kSendSignaled = 2, kSendSolicited = 4, kSendInline = 8 };

enum class WcStatus : uint8_t {  // IBV_WC_*
  kSuccess = 0,
  kLocLenErr,
  kLocQpOpErr,
  kLocEecOpErr,
  kLocProtErr,
  kWrFlushErr,
  kMwBindErr,
  kBadRespErr,
  kLocAccessErr,
  kRemInvReqErr,
  kRemAccessErr,
  kRemOpErr,
  kRetryExcErr,
  kRnrRetryExcErr,
  kLocRddViolErr,
  kRemInvRdReqErr,
  kRemAbortErr,
  kInvEecnErr,
  kInvEecStateErr,
  kFatalErr,
  kRespTimeoutErr,
  kGeneralErr,
};
const char* wc_status_str(WcStatus s);

enum class WcOpcode : uint8_t {  // IBV_WC_*
  kSend = 0,
  kRdmaWrite = 1,
  kRdmaRead = 2,
  kCompSwap = 3,
  kFetchAdd = 4,
  kBindMw = 5,
  kLocalInv = 6,
  kRecv = 128,
  kRecvRdmaWithImm = 129,
};
enum WcFlags : uint32_t { kWcGrh = 1, kWcWithImm = 2, kWcIpCsumOk = 4, kWcWithInv = 8 };

struct Wc {  // the fields of ibv_wc, in its order
  uint64_t wr_id = 0;
  WcStatus status = WcStatus::kSuccess;
  WcOpcode opcode = WcOpcode::kSend;
  uint32_t vendor_err = 0;
  uint32_t byte_len = 0;
  uint32_t imm_data = 0;  // network order; or the invalidated rkey with kWcWithInv
  uint32_t qp_num = 0;
  uint32_t src_qp = 0;
  uint32_t wc_flags = 0;
  uint16_t pkey_index = 0;
  uint16_t slid = 0;
  uint8_t sl = 0;
  uint8_t dlid_path_bits = 0;
};

struct Sge {
  uint64_t addr = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
};

enum AsyncEventType : uint8_t {  // IBV_EVENT_*
  kEventCqErr = 0,
  kEventQpFatal = 1,
  kEventQpReqErr = 2,
  kEventQpAccessErr = 3,
  kEventCommEst = 4,
  kEventSqDrained = 5,
  kEventPathMig = 6,
  kEventPathMigErr = 7,
  kEventDeviceFatal = 8,
  kEventPortActive = 9,
  kEventPortErr = 10,
  kEventLidChange = 11,
  kEventPkeyChange = 12,
  kEventSmChange = 13,
  kEventSrqErr = 14,
  kEventSrqLimitReached = 15,
  kEventQpLastWqeReached = 16,
  kEventClientReregister = 17,
  kEventGidChange = 18,
};

// ibv_qp_attr_mask bits (IBTA.md 9)
enum QpAttrMask : uint32_t {
  kQpState = 1 << 0,
  kQpCurState = 1 << 1,
  kQpEnSqdAsyncNotify = 1 << 2,
  kQpAccessFlags = 1 << 3,
  kQpPkeyIndex = 1 << 4,
  kQpPort = 1 << 5,
  kQpQkey = 1 << 6,
  kQpAv = 1 << 7,
  kQpPathMtu = 1 << 8,
  kQpTimeout = 1 << 9,
  kQpRetryCnt = 1 << 10,
  kQpRnrRetry = 1 << 11,
  kQpRqPsn = 1 << 12,
  kQpMaxQpRdAtomic = 1 << 13,
  kQpAltPath = 1 << 14,
  kQpMinRnrTimer = 1 << 15,
  kQpSqPsn = 1 << 16,
  kQpMaxDestRdAtomic = 1 << 17,
  kQpPathMigState = 1 << 18,
  kQpCap = 1 << 19,
  kQpDestQpn = 1 << 20,
  kQpRateLimit = 1 << 25,
};

}  // namespace softrdma
