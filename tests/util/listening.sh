# Sourced by the test scripts that start a server and then its client.
# wait_listening PORT [PREFIX...]: waits (at most 10 s) until a TCP socket listens on PORT; probing with a
# connection instead would be taken by the server for its client. Returns 1 if none does by then. PREFIX
# runs the check elsewhere (`testnet exec h1`).
wait_listening() {
  local hexport
  hexport=$(printf '%04X' "$1")
  shift
  for _ in $(seq 200); do
    "$@" grep -qs ":$hexport [0-9A-F:]* 0A " /proc/net/tcp /proc/net/tcp6 && return 0
    sleep 0.05
  done
  return 1
}
