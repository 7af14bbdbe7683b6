// Addresses on 127.0.0.1 for the rdmacm tests (cm_test.cc, rsocket_test.cc).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdint>

namespace rdmacm_test {

inline sockaddr_in loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

inline sockaddr* sa(sockaddr_in* a) { return reinterpret_cast<sockaddr*>(a); }

}  // namespace rdmacm_test
