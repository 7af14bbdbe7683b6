#!/usr/bin/env bash
# Installs what is needed, builds, and runs the whole test suite (in parallel).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh
ctest --test-dir build -j "$(nproc)" --output-on-failure --timeout 600 "$@"
