#!/usr/bin/env bash
# Fuzzes the packet ingress path (tests/fuzz/ingress.h) with libFuzzer under ASan+UBSan for SECONDS
# (default 60): builds the fuzz target with clang-14 into build-fuzz, writes the seed corpus (every packet
# of a session of every operation, and the kernel Soft-RoCE capture's) with the replay program of the
# normal build, and runs. The corpus it grows stays in build-fuzz/corpus for the next run. A crash leaves
# its input in build-fuzz/crashes/: copy it into tests/fuzz/regressions/ingress/ (replayed by the suite,
# fuzz.ingress_regressions) once fixed.
#   scripts/fuzz.sh [SECONDS] [libFuzzer options...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
command -v clang++-14 >/dev/null || { echo "clang++-14 missing: run scripts/deps.sh" >&2; exit 1; }
[ -f build/build.ninja ] || cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" --target ingress_fuzz_replay
CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSOFTRDMA_FUZZ=ON \
  -DSOFTRDMA_SANITIZE=address,undefined >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target ingress_fuzz
rm -rf build-fuzz/seeds
build/bin/ingress_fuzz_replay --make-seeds build-fuzz/seeds tests/data/rxe-linux-6.1.pcap
mkdir -p build-fuzz/corpus build-fuzz/crashes
source scripts/sanitizer_env.sh
# -max_len: the largest seed (a whole session) and room to grow. -timeout: an input that takes this long
# (seconds) is a hang (inputs take milliseconds; a busy machine can stall one for seconds). -rss_limit_mb:
# a leak that grows per input ends the run.
set +e
build-fuzz/bin/ingress_fuzz -max_total_time="$seconds" -max_len=65536 -timeout=60 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix=build-fuzz/crashes/ "$@" build-fuzz/corpus build-fuzz/seeds \
  2>&1 | tee build-fuzz/last-run.log | grep -Ev '^#[0-9]+\s+(NEW|REDUCE|pulse)'
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" != 0 ]; then
  echo "fuzz: FAILED (exit $rc); inputs in build-fuzz/crashes/:" >&2
  ls -l build-fuzz/crashes/ >&2
fi
exit "$rc"
