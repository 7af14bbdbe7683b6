// What /proc/self/maps says of the mapping that holds an address (tests of memory that softrdma moves).
#pragma once

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>

namespace softrdma::testutil {

// The permissions of the mapping that holds `addr` ("rw-p", "rw-s", ...), or "" if none does.
inline std::string maps_perms(const void* addr) {
  const auto a = reinterpret_cast<uint64_t>(addr);
  FILE* f = std::fopen("/proc/self/maps", "r");
  if (f == nullptr) return "";
  char line[512];
  std::string out;
  while (std::fgets(line, sizeof line, f)) {
    uint64_t lo = 0, hi = 0;
    char perms[5] = {};
    if (std::sscanf(line, "%" SCNx64 "-%" SCNx64 " %4s", &lo, &hi, perms) == 3 && a >= lo && a < hi) {
      out = perms;
      break;
    }
  }
  std::fclose(f);
  return out;
}

}  // namespace softrdma::testutil
