#!/bin/bash
# Every symbol of rdma-core's librdmacm.so.1, with its version, is exported by ours, and nothing else.
set -eu
ours=$1
real=/lib/x86_64-linux-gnu/librdmacm.so.1
[ -e "$real" ] || { echo "rdma-core's librdmacm.so.1 is not installed"; exit 77; }
list() { objdump -T "$1" | grep -v '\*UND\*' | awk 'NF >= 6 && $(NF-1) ~ /RDMACM/ {print $(NF-1), $NF}' | sort; }
diff <(list "$real") <(list "$ours")
extra=$(objdump -T "$ours" | grep -v '\*UND\*' | awk 'NF >= 6 && $(NF-1) !~ /RDMACM/' | grep -v 'DYNAMIC SYMBOL' || true)
[ -z "$extra" ] || { echo "exported beyond the ABI:"; echo "$extra"; exit 1; }
# It uses libibverbs through its public ABI only (rdma-core's librdmacm does the same).
objdump -p "$ours" | grep -q 'NEEDED *libibverbs.so.1' || { echo "does not link libibverbs.so.1"; exit 1; }
echo "$(list "$ours" | wc -l) symbols, versions as rdma-core's"
