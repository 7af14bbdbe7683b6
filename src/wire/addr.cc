#include "wire/addr.h"

#include <arpa/inet.h>

namespace softrdma::wire {

std::string Gid::to_string() const {
  char buf[INET6_ADDRSTRLEN];
  const bool v4 = is_v4();
  const void* src = v4 ? static_cast<const void*>(&raw[12]) : static_cast<const void*>(raw.data());
  if (inet_ntop(v4 ? AF_INET : AF_INET6, src, buf, sizeof buf) == nullptr) return {};
  return buf;
}

bool Gid::parse(const char* text, Gid* out) {
  if (text == nullptr) return false;
  uint32_t v4;
  if (inet_pton(AF_INET, text, &v4) == 1) {
    *out = from_v4(v4);
    return true;
  }
  Gid g;
  if (inet_pton(AF_INET6, text, g.raw.data()) != 1) return false;
  *out = g;
  return true;
}

}  // namespace softrdma::wire
