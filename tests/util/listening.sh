# Sourced by the test scripts that start a server and then its client.
# wait_listening PORT [PREFIX...]: waits (at most 10 s) until a TCP socket listens on PORT; probing with a
# connection instead would be taken by the server for its client. Returns 1 if none does by then. PREFIX
# runs the check elsewhere (`testnet exec h1`).
wait_listening() { wait_socket_state 0A "/proc/net/tcp /proc/net/tcp6" "$@"; }

# wait_bound_udp PORT [PREFIX...]: the same for a UDP socket bound to PORT (udpong's server).
wait_bound_udp() { wait_socket_state 07 "/proc/net/udp /proc/net/udp6" "$@"; }

# wait_socket_state STATE FILES PORT [PREFIX...]: a socket on PORT in STATE (hex, as /proc/net shows it).
wait_socket_state() {
  local state=$1 files=$2 hexport
  hexport=$(printf '%04X' "$3")
  shift 3
  for _ in $(seq 200); do
    # shellcheck disable=SC2086 # FILES is a list
    "$@" grep -qs ":$hexport [0-9A-F:]* $state " $files && return 0
    sleep 0.05
  done
  return 1
}
