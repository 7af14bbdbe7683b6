// Settings in the environment (README, Settings).
#pragma once

#include <cstdlib>
#include <cstring>

namespace softrdma::io {

// A switch that is on unless the variable is set to "0" (SOFTRDMA_SHM, SOFTRDMA_DIRECT, SOFTRDMA_GSO,
// SOFTRDMA_MR_TOUCH).
inline bool env_switch_on(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// An opt-in switch: on only when the variable is set to "1" (SOFTRDMA_SHARE_MR, SOFTRDMA_SHM_STREAM).
inline bool env_opt_in(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace softrdma::io
