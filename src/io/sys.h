// Syscalls of the data path without glibc's cancellation-point wrappers: recvmmsg, sendmmsg (and their
// one-message forms), pread and
// pwrite switch asynchronous cancellation on and off around the syscall, 4% of a poll of an empty CQ
// (about 20 ns) and 25 instructions of each small same-host WRITE. Application threads make them too,
// inside ibv_post_send and ibv_poll_cq, which are no cancellation points with rdma-core's providers (they
// make no syscall), so none is lost. The sanitizers intercept the wrappers (to see the memory the kernel
// reads and writes), so their builds keep them. And the system's page size, which several callers need.
#pragma once

#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdint>

namespace softrdma::io {

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
inline int sys_recvmmsg(int fd, mmsghdr* m, unsigned n, int flags) {
  return recvmmsg(fd, m, n, flags, nullptr);
}
inline int sys_sendmmsg(int fd, mmsghdr* m, unsigned n, int flags) { return sendmmsg(fd, m, n, flags); }
inline ssize_t sys_recvmsg(int fd, msghdr* m, int flags) { return recvmsg(fd, m, flags); }
inline ssize_t sys_sendmsg(int fd, const msghdr* m, int flags) { return sendmsg(fd, m, flags); }
inline ssize_t sys_pread(int fd, void* buf, size_t n, off_t off) { return pread(fd, buf, n, off); }
inline ssize_t sys_pwrite(int fd, const void* buf, size_t n, off_t off) { return pwrite(fd, buf, n, off); }
#else
inline int sys_recvmmsg(int fd, mmsghdr* m, unsigned n, int flags) {
  return static_cast<int>(syscall(SYS_recvmmsg, fd, m, n, flags, nullptr));
}
inline int sys_sendmmsg(int fd, mmsghdr* m, unsigned n, int flags) {
  return static_cast<int>(syscall(SYS_sendmmsg, fd, m, n, flags));
}
inline ssize_t sys_recvmsg(int fd, msghdr* m, int flags) { return syscall(SYS_recvmsg, fd, m, flags); }
inline ssize_t sys_sendmsg(int fd, const msghdr* m, int flags) { return syscall(SYS_sendmsg, fd, m, flags); }
inline ssize_t sys_pread(int fd, void* buf, size_t n, off_t off) {
  return syscall(SYS_pread64, fd, buf, n, off);
}
inline ssize_t sys_pwrite(int fd, const void* buf, size_t n, off_t off) {
  return syscall(SYS_pwrite64, fd, buf, n, off);
}
#endif

// The system's page size (sysconf, read once).
inline uint64_t page_bytes() {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return page;
}

}  // namespace softrdma::io
