#include "wire/opcode.h"

#include <cstdio>

namespace softrdma::wire {
namespace {

struct OpDef {
  Op op;
  std::string_view name;
  uint32_t flags;
};

// Per operation: its name and meaning bits, the same for every transport that has it.
constexpr OpDef kOps[] = {
    {kOpSendFirst, "SEND First", kSend | kFirst | kPayload | kRequest | kRwqe},
    {kOpSendMiddle, "SEND Middle", kSend | kMiddle | kPayload | kRequest},
    {kOpSendLast, "SEND Last", kSend | kLast | kPayload | kRequest | kRecvComp},
    {kOpSendLastImm, "SEND Last with Immediate", kSend | kLast | kPayload | kRequest | kRecvComp | kHasImmDt},
    {kOpSendOnly, "SEND Only", kSend | kOnly | kPayload | kRequest | kRwqe | kRecvComp},
    {kOpSendOnlyImm, "SEND Only with Immediate",
     kSend | kOnly | kPayload | kRequest | kRwqe | kRecvComp | kHasImmDt},
    {kOpWriteFirst, "RDMA WRITE First", kWrite | kFirst | kPayload | kRequest | kHasReth},
    {kOpWriteMiddle, "RDMA WRITE Middle", kWrite | kMiddle | kPayload | kRequest},
    {kOpWriteLast, "RDMA WRITE Last", kWrite | kLast | kPayload | kRequest},
    {kOpWriteLastImm, "RDMA WRITE Last with Immediate",
     kWrite | kLast | kPayload | kRequest | kRwqe | kRecvComp | kHasImmDt},
    {kOpWriteOnly, "RDMA WRITE Only", kWrite | kOnly | kPayload | kRequest | kHasReth},
    {kOpWriteOnlyImm, "RDMA WRITE Only with Immediate",
     kWrite | kOnly | kPayload | kRequest | kRwqe | kRecvComp | kHasReth | kHasImmDt},
    {kOpReadRequest, "RDMA READ Request", kReadReq | kOnly | kRequest | kHasReth},
    {kOpReadRespFirst, "RDMA READ response First", kReadResp | kFirst | kPayload | kResponse | kHasAeth},
    {kOpReadRespMiddle, "RDMA READ response Middle", kReadResp | kMiddle | kPayload | kResponse},
    {kOpReadRespLast, "RDMA READ response Last", kReadResp | kLast | kPayload | kResponse | kHasAeth},
    {kOpReadRespOnly, "RDMA READ response Only", kReadResp | kOnly | kPayload | kResponse | kHasAeth},
    {kOpAcknowledge, "Acknowledge", kAck | kOnly | kResponse | kHasAeth},
    {kOpAtomicAcknowledge, "ATOMIC Acknowledge", kAtomicAck | kOnly | kResponse | kHasAeth | kHasAtomicAckEth},
    {kOpCompareSwap, "CmpSwap", kAtomic | kOnly | kRequest | kHasAtomicEth},
    {kOpFetchAdd, "FetchAdd", kAtomic | kOnly | kRequest | kHasAtomicEth},
    {kOpSendLastInv, "SEND Last with Invalidate", kSend | kLast | kPayload | kRequest | kRecvComp | kHasIeth},
    {kOpSendOnlyInv, "SEND Only with Invalidate",
     kSend | kOnly | kPayload | kRequest | kRwqe | kRecvComp | kHasIeth},
};

constexpr bool rc_has(Op) { return true; }
constexpr bool uc_has(Op op) {
  return op <= kOpWriteOnlyImm;  // SEND and RDMA WRITE only; no READ, ATOMIC or ACK
}
constexpr bool ud_has(Op op) { return op == kOpSendOnly || op == kOpSendOnlyImm; }

constexpr OpcodeInfo make(std::string_view tname, const OpDef& d, uint32_t extra) {
  OpcodeInfo i;
  i.transport_name = tname;
  i.op_name = d.name;
  i.flags = d.flags | extra | kValid;
  // Derive every header offset from the IBTA order of extension headers.
  uint32_t off = kBthLen;
  for (size_t h = 0; h < static_cast<size_t>(Hdr::kCount); ++h) {
    if (i.flags & (1u << h)) {
      i.offset[h] = static_cast<uint8_t>(off);
      off += kHdrLen[h];
    }
  }
  i.hdr_len = static_cast<uint8_t>(off);
  return i;
}

constexpr std::array<OpcodeInfo, 256> build() {
  std::array<OpcodeInfo, 256> t{};
  for (const OpDef& d : kOps) {
    if (rc_has(d.op)) t[opcode(Transport::kRc, d.op)] = make("Reliable Connection (RC)", d, 0);
    if (uc_has(d.op)) t[opcode(Transport::kUc, d.op)] = make("Unreliable Connection (UC)", d, 0);
    if (ud_has(d.op)) {
      // UD has only SEND Only (with Immediate), each with a DETH; Wireshark spells it "SEND only".
      OpDef ud = d;
      ud.name = d.op == kOpSendOnly ? "SEND only" : "SEND only with Immediate";
      t[opcode(Transport::kUd, d.op)] = make("Unreliable Datagram (UD)", ud, kHasDeth);
    }
  }
  return t;
}

constexpr std::array<OpcodeInfo, 256> kTable = build();

// Compile-time checks of derived layouts against the IBTA header lengths (IBTA.md 1a-1c).
static_assert(kTable[0x0A].hdr_len == 28 && kTable[0x0A].off(Hdr::kReth) == 12);
static_assert(kTable[0x0B].hdr_len == 32 && kTable[0x0B].off(Hdr::kImmDt) == 28);
static_assert(kTable[0x12].hdr_len == 24 && kTable[0x12].off(Hdr::kAtomicAckEth) == 16);
static_assert(kTable[0x13].hdr_len == 40);
static_assert(kTable[0x65].hdr_len == 24 && kTable[0x65].off(Hdr::kImmDt) == 20);
static_assert(kTable[0x2B].hdr_len == 32);
static_assert(!kTable[0x2C].has(kValid) && !kTable[0x15].has(kValid));

}  // namespace

const std::array<OpcodeInfo, 256>& opcode_table() { return kTable; }

std::string opcode_name(uint8_t op) {
  const OpcodeInfo& i = kTable[op];
  if (!i.has(kValid)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "Unknown (0x%02x)", op);
    return buf;
  }
  std::string s(i.transport_name);
  s += " - ";
  s += i.op_name;
  return s;
}

}  // namespace softrdma::wire
