#!/usr/bin/env bash
# Installs the Debian 12 packages that softrdma's build and tests need (only those missing).
set -euo pipefail
PKGS=(build-essential cmake ninja-build ccache pkg-config zlib1g-dev libisal-dev libgtest-dev libgmock-dev
      libbenchmark-dev tshark python3-scapy iproute2 nftables tcpdump
      libibverbs-dev librdmacm-dev ibverbs-utils perftest rdmacm-utils qperf
      ucx-utils libfabric-bin python3-matplotlib linux-perf strace  # this line: bench/run.py's peers and tools
      clang-14 libclang-rt-14-dev libfuzzer-14-dev)  # the libFuzzer build (scripts/fuzz.sh)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update
  # tshark asks whether non-root users may capture: answer it beforehand.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | $SUDO debconf-set-selections
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
fi
