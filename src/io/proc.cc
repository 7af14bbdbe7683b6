#include "io/proc.h"

#include <errno.h>
#include <signal.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace softrdma::io {

uint64_t proc_start_time(int pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "re");
  if (f == nullptr) return 0;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return 0;
  // Field 3 (state) follows ") "; starttime is field 22.
  for (int field = 2; field < 22 && p != nullptr; ++field) {
    p = std::strchr(p + 1, ' ');
  }
  return p != nullptr ? std::strtoull(p + 1, nullptr, 10) : 0;
}

bool process_alive(int pid, uint64_t start_time) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno != EPERM) return false;
  // The pid exists; it is the writer unless it was reused (then its start time differs).
  const uint64_t now = proc_start_time(pid);
  return start_time == 0 || now == 0 || now == start_time;
}

uint64_t namespace_inode(const char* kind) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/ns/%s", kind);
  struct stat st;
  if (stat(path, &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

}  // namespace softrdma::io
