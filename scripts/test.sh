#!/usr/bin/env bash
# Installs what is needed, builds, and runs the whole test suite (in parallel).
# In CI (CI=true), or with SOFTRDMA_SANITIZERS=1, then also: the gtest binaries under ASan+UBSan and under
# TSan (scripts/sanitize.sh --unit) and two minutes of fuzzing the packet ingress path (scripts/fuzz.sh);
# SOFTRDMA_FUZZ_SECONDS changes the fuzzing time, SOFTRDMA_SANITIZERS=0 skips all three.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh
ctest --test-dir build -j "$(nproc)" --output-on-failure --timeout 600 "$@"

sanitizers=${SOFTRDMA_SANITIZERS:-$([ "${CI:-}" = true ] && echo 1 || echo 0)}
if [ "$sanitizers" = 1 ]; then
  for stage in "scripts/sanitize.sh asan --unit" "scripts/sanitize.sh tsan --unit" \
               "scripts/fuzz.sh ${SOFTRDMA_FUZZ_SECONDS:-120}"; do
    start=$SECONDS
    echo "=== $stage"
    $stage
    echo "=== $stage: $((SECONDS - start)) s"
  done
fi
