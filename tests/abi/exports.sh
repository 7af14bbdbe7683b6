#!/bin/bash
# Every symbol of one of rdma-core's libraries, with its version, is exported by ours, and nothing else.
# Usage: exports.sh OURS [REAL [VERSION-NODE-PREFIX]] (default: libibverbs.so.1, IBVERBS).
set -eu
ours=$1
real=${2:-/lib/x86_64-linux-gnu/libibverbs.so.1}
node=${3:-IBVERBS}
[ -e "$real" ] || { echo "rdma-core's $(basename "$real") is not installed"; exit 77; }
list() { objdump -T "$1" | grep -v '\*UND\*' | awk -v n="$node" 'NF >= 6 && $(NF-1) ~ n {print $(NF-1), $NF}' | sort; }
diff <(list "$real") <(list "$ours")
extra=$(objdump -T "$ours" | grep -v '\*UND\*' | awk -v n="$node" 'NF >= 6 && $(NF-1) !~ n' | grep -v 'DYNAMIC SYMBOL' || true)
[ -z "$extra" ] || { echo "exported beyond the ABI:"; echo "$extra"; exit 1; }
echo "$(list "$ours" | wc -l) symbols, versions as rdma-core's"
