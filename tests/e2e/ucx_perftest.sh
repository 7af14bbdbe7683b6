#!/usr/bin/env bash
# UCX's own benchmark, unmodified, over softrdma's libibverbs.so.1: UCT's rc_verbs (put_lat) and UCP
# over rc_verbs with its ud_verbs wire-up (tag_lat and put_bw), same host and over sockets.
#
#   tests/e2e/ucx_perftest.sh LIBDIR
#
# UCX (1.13) lists an RDMA device only if /dev/infiniband/<dev_name> is a character device it may open,
# which softrdma, with no kernel module, does not have: this runs in a mount namespace of its own with a
# tmpfs on /dev/infiniband holding a null device named uverbs<ifindex of lo> (softrdma never opens it).
# Needs root (exit 77 otherwise) and ucx_perftest.
set -euo pipefail
lib=$(realpath "$1")
if [ "$(id -u)" != 0 ] || ! command -v ucx_perftest >/dev/null || ! command -v unshare >/dev/null; then
  echo "SKIP: needs root, unshare and ucx_perftest (ucx-utils)"
  exit 77
fi
made_dir=0
if [ ! -e /dev/infiniband ]; then
  mkdir /dev/infiniband
  made_dir=1
fi
cleanup() { if [ "$made_dir" = 1 ]; then rmdir /dev/infiniband 2>/dev/null || true; fi; }
trap cleanup EXIT

# In the new mount namespace: the device node, then every case as a server and client pair
# (tests/rdmacm/pair.sh: the client starts once the server listens, both must exit 0, and the client must
# print its "Final:" line). Returns the number of failed cases.
inner() {
  mount -t tmpfs none /dev/infiniband
  mknod "/dev/infiniband/uverbs$(cat /sys/class/net/lo/ifindex)" c 1 3
  local fails=0 port=$((14000 + RANDOM % 1000))
  one() {  # "ENV..." ARGS...: one ucx_perftest pair with the VAR=VALUE words of ENV on both sides
    local env=$1
    shift
    port=$((port + 1))
    # shellcheck disable=SC2086 # ENV is a list of words
    "$pair" "$lib" "$port" '^Final:' env $env ucx_perftest -p "$port" "$@" \
      -- env $env ucx_perftest -p "$port" "$@" 127.0.0.1 || fails=$((fails + 1))
  }
  local ucp="UCX_TLS=rc_verbs,ud_verbs UCX_NET_DEVICES=sr_lo:1"
  for shm in 1 0; do
    one "SOFTRDMA_SHM=$shm" -t put_lat -x rc_verbs -d sr_lo:1 -s 8 -n 2000
    one "SOFTRDMA_SHM=$shm $ucp" -t tag_lat -s 8 -n 2000
    one "SOFTRDMA_SHM=$shm $ucp" -t ucp_put_bw -s 65536 -n 2000
  done
  return "$fails"
}
pair=$(realpath "$(dirname "$0")/../rdmacm/pair.sh")
export lib pair
export -f inner
unshare -m bash -c inner
