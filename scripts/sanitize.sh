#!/usr/bin/env bash
# Builds softrdma with sanitizers and runs the test suite there (README "Sanitizers").
#   scripts/sanitize.sh asan [--unit] [CTEST ARGS...]   ASan+UBSan into build-asan
#   scripts/sanitize.sh tsan [--unit] [CTEST ARGS...]   TSan into build-tsan
# --unit builds only the gtest binaries and runs only them (ctest label "unit"): what CI runs.
# Any sanitizer report fails its test: halt_on_error, and LeakSanitizer is on under ASan.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:?usage: scripts/sanitize.sh asan|tsan [--unit] [ctest args...]}
shift
unit=0
if [ "${1:-}" = "--unit" ]; then unit=1; shift; fi
case $kind in
  asan) dir=build-asan san=address,undefined ;;
  tsan) dir=build-tsan san=thread ;;
  *) echo "unknown sanitizer '$kind' (asan or tsan)" >&2; exit 2 ;;
esac
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSOFTRDMA_SANITIZE=$san >/dev/null
if ((unit)); then
  cmake --build "$dir" -j "$(nproc)" --target unit_tests  # the gtest binaries and what they need
else
  cmake --build "$dir" -j "$(nproc)"
fi
source scripts/sanitizer_env.sh
args=(--test-dir "$dir" -j "$(nproc)" --output-on-failure --timeout 600)
((unit)) && args+=(-L unit)
exec ctest "${args[@]}" "$@"
