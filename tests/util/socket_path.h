// Opens a device on the socket path (UDP), whatever the environment says, and gives the setting back: for
// tests of what happens on the wire between two hosts, which the same-host path would bypass.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>

#include "softrdma/softrdma.h"

namespace softrdma::testutil {

inline std::unique_ptr<Context> open_socket_path(const char* device = "sr_lo") {
  const char* old = std::getenv("SOFTRDMA_SHM");
  const std::string saved = old ? old : "";
  setenv("SOFTRDMA_SHM", "0", 1);
  auto ctx = Context::open(device);
  if (old)
    setenv("SOFTRDMA_SHM", saved.c_str(), 1);
  else
    unsetenv("SOFTRDMA_SHM");
  return ctx ? std::move(*ctx) : nullptr;
}

}  // namespace softrdma::testutil
