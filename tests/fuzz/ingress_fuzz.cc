// libFuzzer entry point for the packet ingress path (ingress.h; scripts/fuzz.sh builds and runs it).
#include <cstddef>
#include <cstdint>

#include "fuzz/ingress.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  softrdma::fuzz::run_ingress(data, size);
  return 0;
}
