#!/usr/bin/env bash
# abi.testnet_ibv_devinfo: ibv_devices and ibv_devinfo -v inside a test host (tests/e2e/testnet), where the
# device is sr_eth0 on 198.18.0.1 with the veth's MTU (1500: active_mtu 1024).
#   testnet_devinfo.sh LIBDIR
set -euo pipefail
LIBDIR=$(readlink -f "$1")
E2E=$(cd "$(dirname "$0")/../e2e" && pwd)
TESTNET=$E2E/testnet
SKIP=77
source "$E2E/testnet_lib.sh"
testnet_require
command -v ibv_devinfo >/dev/null || { echo "SKIP: ibverbs-utils is not installed"; exit $SKIP; }
fail() { echo "FAIL: $*"; exit 1; }

testnet_session di
devices=$("$TESTNET" exec h1 env LD_LIBRARY_PATH="$LIBDIR" ${SOFTRDMA_PRELOAD:+LD_PRELOAD=$SOFTRDMA_PRELOAD} timeout 20 ibv_devices) || fail "ibv_devices exited non-zero"
echo "$devices"
echo "$devices" | grep -Eq '^ +sr_eth0[[:space:]]+[0-9a-f]{16}$' || fail "ibv_devices does not list sr_eth0"
v=$("$TESTNET" exec h1 env LD_LIBRARY_PATH="$LIBDIR" ${SOFTRDMA_PRELOAD:+LD_PRELOAD=$SOFTRDMA_PRELOAD} timeout 20 ibv_devinfo -v -d sr_eth0) ||
  fail "ibv_devinfo -v exited non-zero"
echo "$v"
mtu=$("$TESTNET" exec h1 cat /sys/class/net/eth0/mtu)
want=256; for m in 512 1024 2048 4096; do [ $((mtu - 80)) -ge $m ] && want=$m; done
for re in 'hca_id:.sr_eth0' 'state:.*PORT_ACTIVE \(4\)' 'link_layer:.*Ethernet' "active_mtu:.*$want " \
          'GID\[  0\]:.*fe80::.*, RoCE v2' 'GID\[  1\]:.*::ffff:198\.18\.0\.1, RoCE v2'; do
  echo "$v" | grep -Eq "$re" || fail "ibv_devinfo -v: no line matching '$re'"
done
echo OK
