// Has the kernel read one byte of each resident page of a region, so that the kernel's later copies from
// those pages (sendmmsg gathering a payload from an MR, process_vm_writev) do not pay a first access.
//
// Why: on a VM whose guest page tables the host shadows (a PVM guest here, with pti=on, where the kernel
// runs on page tables of its own), the kernel's first access to each user page costs about 7.5 us more
// than the next ones, even for pages the process has written itself (floor-bench kernel-copy: 0.5-0.7
// GB/s on the first pass over 64 MiB, 7-14 GB/s after). A NIC driver walks and pins every page of an MR
// at registration (rxe: ib_umem_get); softrdma does this touch there instead, so that the data path does
// not pay for it. Pages that are not resident are left alone (touching them would map them: a sparse
// registration would grow), as are pages past `max_bytes` from the start.
#pragma once

#include <cstdint>

namespace softrdma::io {

struct TouchResult {
  uint64_t pages = 0;  // pages the kernel was asked to read
  int error = 0;       // 0, or the errno of the call that stopped it (the rest is left alone)
};

// SOFTRDMA_MR_TOUCH=0 turns it off (the caller asks io/env.h's env_switch_on).
inline constexpr const char* kTouchEnv = "SOFTRDMA_MR_TOUCH";
// The file the kernel copies the bytes into (a memfd of the caller's: 1 KiB at offset 0, rewritten), or
// -1 with errno.
int kernel_touch_sink();
TouchResult kernel_touch(int sink, const void* addr, uint64_t len, uint64_t max_bytes);

}  // namespace softrdma::io
