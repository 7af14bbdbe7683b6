// Facts about processes that shared-memory files record about their writers, so that a reader can tell a
// live writer from a dead one (io/stats_shm, io/shm).
#pragma once

#include <cstdint>

namespace softrdma::io {

// The start time of a process (/proc/<pid>/stat field 22, clock ticks since boot); 0 if unknown.
uint64_t proc_start_time(int pid);
// Whether `pid` is alive and (unless start_time is 0 or unknown) the same process that had `start_time`.
bool process_alive(int pid, uint64_t start_time);
// The inode of one of this process's namespaces ("net", "pid"): two processes share that namespace
// exactly when the inodes are equal. 0 if unknown.
uint64_t namespace_inode(const char* kind);

}  // namespace softrdma::io
