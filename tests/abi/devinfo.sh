#!/bin/bash
# ibv_devices, ibv_devinfo and ibv_devinfo -v on softrdma: sane RoCE devices (ABI.md "Device conventions").
set -u
export LD_LIBRARY_PATH=$1
# A sanitized build (tests/abi/CMakeLists.txt) names its runtime, which these programs must load first.
[ -z "${SOFTRDMA_PRELOAD:-}" ] || export LD_PRELOAD=$SOFTRDMA_PRELOAD
command -v ibv_devinfo >/dev/null || { echo "ibverbs-utils not installed"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
devices=$(timeout 20 ibv_devices) || fail "ibv_devices exited non-zero"
echo "$devices"
echo "$devices" | grep -Eq '^ +sr_lo[[:space:]]+[0-9a-f]{16}$' || fail "ibv_devices does not list sr_lo with a GUID"
info=$(timeout 20 ibv_devinfo -d sr_lo) || fail "ibv_devinfo exited non-zero"
echo "$info"
for want in 'hca_id:.sr_lo' 'transport:.*InfiniBand \(0\)' 'vendor_id:.*0xffffff' 'phys_port_cnt:.*1' \
            'state:.*PORT_ACTIVE \(4\)' 'max_mtu:.*4096 \(5\)' 'link_layer:.*Ethernet'; do
  echo "$info" | grep -Eq "$want" || fail "ibv_devinfo: no line matching '$want'"
done
# active_mtu: the largest IB MTU <= interface MTU - 80 (lo: 65536 -> 4096).
mtu=$(cat /sys/class/net/lo/mtu)
want=1; for m in 256 512 1024 2048 4096; do [ $((mtu - 80)) -ge $m ] && want=$m; done
echo "$info" | grep -Eq "active_mtu:.*$want " || fail "active_mtu is not $want for MTU $mtu"
v=$(timeout 20 ibv_devinfo -v -d sr_lo) || fail "ibv_devinfo -v exited non-zero"
echo "$v"
for want in 'GID\[  0\]:.*fe80::.*, RoCE v2' 'GID\[  1\]:.*::ffff:127\.0\.0\.1, RoCE v2' 'pkey_tbl_len:.*1$' \
            'gid_tbl_len:' 'max_qp_rd_atom:.*[1-9]' 'atomic_cap:.*ATOMIC_HCA' 'phys_state:.*LINK_UP \(5\)' \
            'port_cap_flags:.*0x00010000' 'num_comp_vectors:.*1'; do
  echo "$v" | grep -Eq "$want" || fail "ibv_devinfo -v: no line matching '$want'"
done
echo OK
