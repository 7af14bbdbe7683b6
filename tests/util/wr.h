// Work requests the API tests post again and again, built in one place.
#pragma once

#include <cstdint>
#include <span>

#include "softrdma/softrdma.h"

namespace softrdma::testutil {

// A signaled RDMA WRITE of `s` (which must outlive the post) to `remote_addr` under `rkey`.
inline SendWr signaled_write(const Sge& s, uint64_t remote_addr, uint32_t rkey, uint64_t wr_id = 0) {
  SendWr wr;
  wr.wr_id = wr_id;
  wr.opcode = WrOpcode::kRdmaWrite;
  wr.send_flags = kSendSignaled;
  wr.sg_list = std::span(&s, 1);
  wr.remote_addr = remote_addr;
  wr.rkey = rkey;
  return wr;
}

}  // namespace softrdma::testutil
