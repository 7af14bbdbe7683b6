#!/usr/bin/env bash
# The main job: installs what is needed, builds, and runs the demo (two processes, RC over 127.0.0.1).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh
exec build/bin/softrdma-demo "$@"
