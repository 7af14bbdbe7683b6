// floor-bench: the machine's own floors that bench/run.py sets softrdma's figures against.
//
//   floor-bench udp-server PORT [rc]            echo datagrams on 127.0.0.1:PORT, busy-polling, until an
//                                               empty datagram arrives
//   floor-bench udp-client PORT SIZE ITERS      ping-pong SIZE-byte datagrams with that server, busy-polling
//   floor-bench udp-client PORT SIZE ITERS rc   the same with what an RC WRITE ping-pong puts on the wire per
//                                               half round trip: a WRITE of SIZE bytes (32 + SIZE rounded up
//                                               to 4) and an ACK (20 bytes) in one GSO send, received
//                                               coalesced (UDP_GRO); the server echoes each such message as
//                                               it came
//   floor-bench udp-{server,client} ... block   the plain ping-pong with blocking receives: each side
//                                               sleeps in recv until the datagram comes (a wake-up per half
//                                               round trip, as for an application that waits for
//                                               completion events)
//   floor-bench udp-stream-server PORT          receive a UDP stream on 127.0.0.1:PORT, busy-polling
//                                               recvmmsg with UDP_GRO into a 2 MiB ring (a softrdma
//                                               socket's), counting, until the client's end
//   floor-bench udp-stream-client PORT SIZE SECONDS
//                                               send that server the datagrams of RC WRITEs at path MTU
//                                               4096 for SECONDS (4 KiB payloads in turn from a SIZE-byte
//                                               buffer, 12-byte headers and 4-byte trailers around them, GSO
//                                               messages of 15, sendmmsg of 2), as softrdma's socket path
//                                               sends them: each message copied whole into a stage and
//                                               handed to the kernel as one piece; no ICRC, no transport:
//                                               the bound the socket path's bandwidth meets first.
//                                               Prints the rate the server received (bytes_per_sec; its
//                                               first receive to its last) and the share of what was sent
//   floor-bench udp-stream-client PORT SIZE SECONDS pieces
//                                               the same datagrams handed to the kernel in three pieces a
//                                               packet (header, payload, trailer), with no copy of softrdma's
//                                               own, as its socket path sent them before 2026-12-05
//   floor-bench udp-stream-client PORT SIZE SECONDS splice
//                                               the same datagrams with no copy on the sender: the payloads'
//                                               pages handed to the kernel by vmsplice into a pipe and
//                                               splice from it into the corked datagram (a zero-copy send
//                                               that loopback delivers as it is, unlike MSG_ZEROCOPY's);
//                                               GSO messages of 8, the most that fit an skb's 17 page
//                                               fragments (payload, then the trailer and next header)
//   floor-bench memcpy SIZE SECONDS [PAIRS]     copy SIZE bytes between two buffers, again and again, for
//                                               SECONDS; with PAIRS, between PAIRS pairs of buffers in turn
//                                               (64 pairs of 1 MiB: the working set of 64 QPs' buffers)
//   floor-bench kernel-copy SIZE PAIRS          the kernel copying from user memory (what sendmmsg does with
//                                               a packet's payload): PAIRS buffers of SIZE bytes, each
//                                               written by this process first, then handed to pwrite on a
//                                               memfd 64 KiB at a time, twice; prints the first pass's and
//                                               the second's bytes per second (a VM whose kernel pays for
//                                               its first access to each user page shows it in the first)
//   floor-bench mem-pingpong SIZE ITERS         ping-pong between this process and a child it forks, each
//                                               writing SIZE bytes into the other's private memory with a
//                                               pwrite on its /proc/<pid>/mem (softrdma's same-host WRITE
//                                               of up to 1 KiB) and spinning on the last byte for the
//                                               answer: what a same-host one-sided WRITE ping-pong costs
//                                               with no work around the syscall (ib_write_lat's pattern)
//   floor-bench machine SECONDS                 what the machine itself costs every latency figure: a
//                                               system call (getppid, the cheapest; median of batches), and
//                                               the pauses of a thread that spins alone on each CPU (all CPUs
//                                               at once, for SECONDS): how often it stops for 10 us or more
//                                               (the host taking the virtual CPU, interrupts), for how long,
//                                               at what period, and the share of its time they take; then
//                                               each CPU's speed: a fixed chain of dependent multiply-adds
//                                               on every CPU at once (ns per step, per CPU, and
//                                               the slowest CPU's time over the fastest's); and the CPUs'
//                                               placement: how long one cache line takes to go from the
//                                               first CPU to the last and back, halved (two pinned threads
//                                               passing a counter)
//   floor-bench placement                       that last figure alone (line_handoff_ns; bench/run.py takes
//                                               it before and after each run of a target's cases)
//
// Both sides of the ping-pong spin on non-blocking sockets (recv with MSG_DONTWAIT), as a busy-polling RDMA
// application spins on its CQ, so the figure is the kernel's UDP loopback path and nothing else. The client
// prints one line of key=value figures: the mean, median, least and 99th-percentile half round trip (the
// round trip measured per iteration, halved) in microseconds; so does mem-pingpong. memcpy prints the bytes
// copied per second (10^9 B/s and MiB/s).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kWarmup = 100;
constexpr auto kReplyTimeout = std::chrono::seconds(2);
constexpr size_t kMaxDatagram = 65507;  // IPv4 UDP payload limit

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "floor-bench: %s: %s\n", what, std::strerror(errno));
  std::exit(1);
}

// 127.0.0.1:port.
sockaddr_in loopback_addr(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

int loopback_socket(uint16_t bind_port) {
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
  if (fd < 0) die("socket");
  sockaddr_in a = loopback_addr(bind_port);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) die("bind 127.0.0.1");
  return fd;
}

// rc mode: the WRITE-and-ACK pair per half round trip (see the top of the file).
constexpr size_t kRcHeaders = 12 + 16 + 4;  // BTH, RETH, ICRC
constexpr size_t kAckBytes = 12 + 4 + 4;    // BTH, AETH, ICRC

void enable_gro(int fd) {
  const int one = 1;
  if (setsockopt(fd, IPPROTO_UDP, UDP_GRO, &one, sizeof one) != 0) die("setsockopt UDP_GRO");
}

// Puts a UDP_SEGMENT control message of `seg` into h, whose control buffer is `ctrl` (CMSG_SPACE of a
// uint16_t): the kernel cuts the message into datagrams of `seg` bytes (GSO).
void set_gso(msghdr& h, char* ctrl, size_t ctrl_len, size_t seg) {
  h.msg_control = ctrl;
  h.msg_controllen = ctrl_len;
  cmsghdr* c = CMSG_FIRSTHDR(&h);
  c->cmsg_level = SOL_UDP;
  c->cmsg_type = UDP_SEGMENT;
  c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
  const auto s16 = static_cast<uint16_t>(seg);
  std::memcpy(CMSG_DATA(c), &s16, sizeof s16);
}

// Sends `len` bytes as datagrams of `seg` bytes (the last may be shorter) in one GSO send; `to` may be null
// on a connected socket. Returns what sendmsg returns.
ssize_t send_segments(int fd, const char* buf, size_t len, size_t seg, const sockaddr_in* to) {
  iovec iov{const_cast<char*>(buf), len};
  msghdr h{};
  h.msg_name = const_cast<sockaddr_in*>(to);
  h.msg_namelen = to != nullptr ? sizeof *to : 0;
  h.msg_iov = &iov;
  h.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(uint16_t))] = {};
  if (seg < len) set_gso(h, ctrl, sizeof ctrl, seg);
  return sendmsg(fd, &h, 0);
}

// Receives one message without blocking: its length, and in *seg the size of the datagrams the kernel
// coalesced into it (its length when it is one datagram). -1 with errno as recvmsg.
ssize_t recv_coalesced(int fd, char* buf, size_t size, sockaddr_in* from, size_t* seg) {
  iovec iov{buf, size};
  msghdr h{};
  h.msg_name = from;
  h.msg_namelen = from != nullptr ? sizeof *from : 0;
  h.msg_iov = &iov;
  h.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))];
  h.msg_control = ctrl;
  h.msg_controllen = sizeof ctrl;
  const ssize_t n = recvmsg(fd, &h, MSG_DONTWAIT);
  if (n < 0) return n;
  *seg = static_cast<size_t>(n);
  for (cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr; c = CMSG_NXTHDR(&h, c)) {
    if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
      int v = 0;
      std::memcpy(&v, CMSG_DATA(c), sizeof v);
      if (v > 0) *seg = static_cast<size_t>(v);
    }
  }
  return n;
}

int udp_server_rc(uint16_t port) {
  const int fd = loopback_socket(port);
  enable_gro(fd);
  std::vector<char> buf(kMaxDatagram);
  for (;;) {
    sockaddr_in from{};
    size_t seg = 0;
    const ssize_t n = recv_coalesced(fd, buf.data(), buf.size(), &from, &seg);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      die("recvmsg");
    }
    if (n == 0) return 0;  // the client's stop signal
    if (send_segments(fd, buf.data(), static_cast<size_t>(n), seg, &from) != n) die("sendmsg");
  }
}

// Makes `fd` blocking, its receives bounded by `timeout` (SO_RCVTIMEO: then EAGAIN).
void set_blocking(int fd, std::chrono::milliseconds timeout) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) die("fcntl");
  const timeval tv{static_cast<time_t>(timeout.count() / 1000),
                   static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
  if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0) die("setsockopt SO_RCVTIMEO");
}

int udp_server(uint16_t port, bool block) {
  const int fd = loopback_socket(port);
  if (block) set_blocking(fd, std::chrono::milliseconds(0));  // 0: no bound
  std::vector<char> buf(kMaxDatagram);
  for (;;) {
    sockaddr_in from{};
    socklen_t len = sizeof from;
    const ssize_t n = recvfrom(fd, buf.data(), buf.size(), block ? 0 : MSG_DONTWAIT,
                               reinterpret_cast<sockaddr*>(&from), &len);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      die("recvfrom");
    }
    if (n == 0) return 0;  // the client's stop signal
    if (sendto(fd, buf.data(), static_cast<size_t>(n), 0, reinterpret_cast<sockaddr*>(&from), len) != n)
      die("sendto");
  }
}

// Spins until one datagram arrives; false after `timeout`, or at once when the port is not (yet) open and
// `refused_ok` (the kernel's ICMP port unreachable arrives as ECONNREFUSED on a connected socket).
bool recv_spin(int fd, char* buf, size_t size, Clock::duration timeout, bool refused_ok = false) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const ssize_t n = recv(fd, buf, size, MSG_DONTWAIT);
    if (n >= 0) return true;
    if (errno == ECONNREFUSED && refused_ok) return false;
    if (errno != EAGAIN && errno != EINTR) die("recv");
    if (Clock::now() > deadline) return false;
  }
}

// A client socket connected to the server on 127.0.0.1:port.
int client_socket(uint16_t port) {
  const int fd = loopback_socket(0);
  sockaddr_in to = loopback_addr(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) die("connect");
  return fd;
}

// Times kWarmup + iters round trips, each ping(i) then pong(i) (false when it failed, having said why on
// stderr), and prints the client's line (see the top of the file). 1 when a round trip failed.
template <class Ping, class Pong>
int timed_round_trips(size_t size, long iters, Ping ping, Pong pong) {
  std::vector<double> rtt_us;
  rtt_us.reserve(static_cast<size_t>(iters));
  const auto start = Clock::now();
  for (long i = 0; i < kWarmup + iters; ++i) {
    const auto t0 = Clock::now();
    if (!ping(i) || !pong(i)) return 1;
    if (i >= kWarmup) rtt_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  const double total_s = std::chrono::duration<double>(Clock::now() - start).count();
  std::sort(rtt_us.begin(), rtt_us.end());
  double sum = 0;
  for (double r : rtt_us) sum += r;
  std::printf(
      "size=%zu iters=%ld half_rtt_avg_us=%.3f half_rtt_median_us=%.3f half_rtt_min_us=%.3f "
      "half_rtt_p99_us=%.3f seconds=%.3f\n",
      size, iters, sum / static_cast<double>(iters) / 2, rtt_us[rtt_us.size() / 2] / 2, rtt_us.front() / 2,
      rtt_us[rtt_us.size() * 99 / 100] / 2, total_s);
  return 0;
}

// The client's ping-pong on `fd`: ping() sends one ping (false on an error other than ECONNREFUSED),
// pong(timeout, refused_ok) spins for its answer. Prints the client's line (see the top of the file).
template <class Ping, class Pong>
int ping_pong(int fd, uint16_t port, size_t size, long iters, Ping ping, Pong pong) {
  // The server may still be starting: repeat the first ping until it answers.
  for (int tries = 0;; ++tries) {
    if (!ping()) die("send");
    if (pong(std::chrono::milliseconds(100), true)) break;
    if (tries == 200) {
      std::fprintf(stderr, "floor-bench: no answer from 127.0.0.1:%u\n", port);
      return 1;
    }
    usleep(10000);
  }
  const int rc = timed_round_trips(
      size, iters,
      [&](long) {
        if (!ping()) die("send");
        return true;
      },
      [&](long i) {
        if (pong(kReplyTimeout, false)) return true;
        std::fprintf(stderr, "floor-bench: reply %ld lost\n", i);
        return false;
      });
  if (rc != 0) return rc;
  char stop = 0;
  send(fd, &stop, 0, 0);  // an empty datagram stops the server
  return 0;
}

int udp_client(uint16_t port, size_t size, long iters, bool block) {
  const int fd = client_socket(port);
  std::vector<char> buf(std::max<size_t>(size, 1));
  const auto ping = [&] {
    return send(fd, buf.data(), size, 0) == static_cast<ssize_t>(size) || errno == ECONNREFUSED;
  };
  std::chrono::milliseconds bound{-1};  // the blocking receive's SO_RCVTIMEO (none set yet)
  const auto pong = [&](Clock::duration timeout, bool refused_ok) {
    if (!block) return recv_spin(fd, buf.data(), buf.size(), timeout, refused_ok);
    if (const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout); ms != bound) {
      set_blocking(fd, ms);
      bound = ms;
    }
    if (recv(fd, buf.data(), buf.size(), 0) >= 0) return true;
    if (errno == ECONNREFUSED && refused_ok) return false;
    if (errno != EAGAIN && errno != EINTR) die("recv");
    return false;
  };
  return ping_pong(fd, port, size, iters, ping, pong);
}

// rc mode: a WRITE-and-ACK pair each way per iteration.
int udp_client_rc(uint16_t port, size_t size, long iters) {
  const size_t write_len = kRcHeaders + (size + 3) / 4 * 4;
  const size_t total = write_len + kAckBytes;
  if (total > kMaxDatagram) {
    std::fprintf(stderr, "floor-bench: SIZE too large for rc mode\n");
    return 2;
  }
  const int fd = client_socket(port);
  enable_gro(fd);
  std::vector<char> out(total, 0x5a), in(kMaxDatagram);
  const auto ping = [&] {
    return send_segments(fd, out.data(), total, write_len, nullptr) == static_cast<ssize_t>(total) ||
           errno == ECONNREFUSED;
  };
  // Spins until the pair came back, coalesced or not.
  const auto pong = [&](Clock::duration timeout, bool refused_ok) {
    const auto deadline = Clock::now() + timeout;
    size_t got = 0;
    while (got < total) {
      size_t seg;
      const ssize_t n = recv_coalesced(fd, in.data(), in.size(), nullptr, &seg);
      if (n >= 0) {
        got += static_cast<size_t>(n);
        continue;
      }
      if (errno == ECONNREFUSED && refused_ok) return false;
      if (errno != EAGAIN && errno != EINTR) die("recvmsg");
      if (Clock::now() > deadline) return false;
    }
    return true;
  };
  return ping_pong(fd, port, size, iters, ping, pong);
}

// udp-stream: what the socket path's bandwidth meets first (see the top of the file). A data datagram is a
// middle RC WRITE packet at path MTU 4096: a 12-byte header, 4 KiB of payload from the source buffer, a
// 4-byte trailer; the sender puts them in GSO messages of 15 and sends two messages per sendmmsg, as
// softrdma's socket path does (a full batch of 32 packets goes as 15 + 15, the rest kept back for the next:
// io/packet.h, TxBatch), from an unconnected socket, each message copied whole into a stage first (one
// piece for the kernel, io/udp UdpIo::send; the pieces mode hands over the three pieces of each). Control
// datagrams (one byte) go on a second socket, so that the kernel never coalesces them with data: 'h' (the
// server answers 'h') and 'e' (the server answers with its count and exits).
constexpr size_t kStreamHeader = 12, kStreamPayload = 4096, kStreamTrailer = 4;
constexpr size_t kStreamSegment = kStreamHeader + kStreamPayload + kStreamTrailer;
constexpr uint32_t kStreamSegsPerMsg = 15, kStreamMsgsPerCall = 2;
constexpr uint32_t kStreamPktsPerCall = kStreamMsgsPerCall * kStreamSegsPerMsg;
constexpr int kStreamRcvBuf = 32 << 20;  // softrdma's socket receive buffer
constexpr uint32_t kStreamRxBatch = 32;
constexpr size_t kStreamRxBuf = 64 << 10;

int udp_stream_server(uint16_t port) {
  const int fd = loopback_socket(port);
  enable_gro(fd);
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &kStreamRcvBuf, sizeof kStreamRcvBuf) != 0)
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &kStreamRcvBuf, sizeof kStreamRcvBuf);  // capped by rmem_max
  // The receive ring: 32 buffers of 64 KiB in one 2 MiB area, as a softrdma socket's.
  std::vector<char> ring(kStreamRxBatch * kStreamRxBuf, 0);
  mmsghdr msgs[kStreamRxBatch];
  iovec iov[kStreamRxBatch];
  sockaddr_in from[kStreamRxBatch];
  for (uint32_t k = 0; k < kStreamRxBatch; ++k) {
    iov[k] = iovec{ring.data() + k * kStreamRxBuf, kStreamRxBuf};
    msgs[k] = mmsghdr{};
    msgs[k].msg_hdr.msg_iov = &iov[k];
    msgs[k].msg_hdr.msg_iovlen = 1;
    msgs[k].msg_hdr.msg_name = &from[k];
  }
  uint64_t bytes = 0, first_bytes = 0;  // data received; the first receive's (before the clock starts)
  Clock::time_point first{}, last{};
  for (;;) {
    for (uint32_t k = 0; k < kStreamRxBatch; ++k) msgs[k].msg_hdr.msg_namelen = sizeof from[k];
    const int n = recvmmsg(fd, msgs, kStreamRxBatch, MSG_DONTWAIT, nullptr);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      die("recvmmsg");
    }
    const auto now = Clock::now();
    for (int k = 0; k < n; ++k) {
      const unsigned len = msgs[k].msg_len;
      if (len != 1) {  // data
        if (bytes == 0) {
          first = now;
          first_bytes = len;
        }
        bytes += len;
        last = now;
        continue;
      }
      const socklen_t to_len = msgs[k].msg_hdr.msg_namelen;
      const auto* to = reinterpret_cast<const sockaddr*>(&from[k]);
      if (ring[k * kStreamRxBuf] == 'h') {
        if (sendto(fd, "h", 1, 0, to, to_len) != 1) die("sendto");
      } else if (ring[k * kStreamRxBuf] == 'e') {
        char line[160];
        const int m = std::snprintf(line, sizeof line, "received_bytes=%llu timed_bytes=%llu seconds=%.6f",
                                    static_cast<unsigned long long>(bytes),
                                    static_cast<unsigned long long>(bytes - first_bytes),
                                    std::chrono::duration<double>(last - first).count());
        if (sendto(fd, line, static_cast<size_t>(m), 0, to, to_len) != m) die("sendto");
        return 0;
      }
    }
  }
}

// Sends one control byte on `fd` until an answer comes (every 100 ms, for up to 2 s): its length, or 0.
size_t stream_control(int fd, char what, char* answer, size_t size) {
  for (int tries = 0; tries < 20; ++tries) {
    if (send(fd, &what, 1, 0) != 1 && errno != ECONNREFUSED) die("send");
    const auto deadline = Clock::now() + std::chrono::milliseconds(100);
    do {
      const ssize_t n = recv(fd, answer, size - 1, MSG_DONTWAIT);
      if (n > 0) {
        answer[n] = 0;
        return static_cast<size_t>(n);
      }
      if (n < 0 && errno != EAGAIN && errno != EINTR && errno != ECONNREFUSED) die("recv");
    } while (Clock::now() < deadline);
  }
  return 0;
}

// A send that the kernel refused for now (a full buffer or queue, a signal): the caller tries again.
bool send_again(int err) { return err == EINTR || err == ENOBUFS || err == EAGAIN; }

// The splice mode's sender (see the top of the file): per GSO message, the first header by sendmsg with
// MSG_MORE (which names the destination and the segment size and corks the datagram), the payloads and the
// headers between them by vmsplice into a pipe (page references, no copy) and splice into the socket, and
// the last trailer by a send without MSG_MORE, which ends the datagram. Each of the kernel's skbs holds at
// most 17 page fragments: a payload and a trailer-and-next-header (adjacent, one fragment) per packet.
class SpliceSender {
 public:
  static constexpr uint32_t kPerMsg = 8;

  explicit SpliceSender(int fd) : fd_(fd) {
    if (pipe(pipe_) != 0) die("pipe");
    if (fcntl(pipe_[1], F_SETPIPE_SZ, 1 << 20) < 0) die("F_SETPIPE_SZ");  // room for several messages
  }
  ~SpliceSender() {
    close(pipe_[0]);
    close(pipe_[1]);
  }

  // Sends `n` packets (n <= kPerMsg) whose payloads are `payloads`, as one GSO message to `to`.
  void send_message(const char* const* payloads, uint32_t n, const sockaddr_in& to) {
    iovec first{ht_[0] + kStreamTrailer, kStreamHeader};
    msghdr h{};
    h.msg_name = const_cast<sockaddr_in*>(&to);
    h.msg_namelen = sizeof to;
    h.msg_iov = &first;
    h.msg_iovlen = 1;
    alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(uint16_t))] = {};
    set_gso(h, ctrl, sizeof ctrl, kStreamSegment);
    while (sendmsg(fd_, &h, MSG_MORE) != static_cast<ssize_t>(kStreamHeader))
      if (!send_again(errno)) die("sendmsg MSG_MORE");
    iovec v[2 * kPerMsg];
    int k = 0;
    for (uint32_t i = 0; i < n; ++i) {
      v[k++] = iovec{const_cast<char*>(payloads[i]), kStreamPayload};
      if (i + 1 < n) v[k++] = iovec{ht_[i + 1], kStreamTrailer + kStreamHeader};
    }
    size_t left = n * kStreamSegment - kStreamHeader - kStreamTrailer;
    if (vmsplice(pipe_[1], v, static_cast<unsigned long>(k), 0) != static_cast<ssize_t>(left))
      die("vmsplice");
    while (left > 0) {
      const ssize_t r = splice(pipe_[0], nullptr, fd_, nullptr, left, SPLICE_F_MORE);
      if (r < 0 && send_again(errno)) continue;
      if (r <= 0) die("splice");
      left -= static_cast<size_t>(r);
    }
    while (send(fd_, ht_[n], kStreamTrailer, 0) != static_cast<ssize_t>(kStreamTrailer))
      if (!send_again(errno)) die("send");
  }

 private:
  int fd_;
  int pipe_[2] = {-1, -1};
  // The trailer of packet i and the header of packet i + 1, adjacent; never written while pages in flight
  // may still point at them (all zero). Aligned so that no piece straddles two pages, which takes a second
  // page fragment of the skb's 17: where the stack put the object across a page boundary (2 runs in 45),
  // the message's last send failed with EMSGSIZE (every run, with a piece placed there on purpose).
  alignas(256) char ht_[kPerMsg + 1][kStreamTrailer + kStreamHeader] = {};
};

enum class StreamMode { kStaged, kPieces, kSplice };

int udp_stream_client(uint16_t port, size_t size, double seconds, StreamMode mode) {
  const int ctl = client_socket(port);
  char answer[256];
  if (stream_control(ctl, 'h', answer, sizeof answer) == 0) {
    std::fprintf(stderr, "floor-bench: no answer from 127.0.0.1:%u\n", port);
    return 1;
  }
  const int fd = loopback_socket(0);  // unconnected, as softrdma's: each message names its destination
  sockaddr_in to = loopback_addr(port);
  // The application's buffer: page-aligned, written first (as perftest's), its payloads sent in turn.
  void* mem = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) die("mmap");
  std::memset(mem, 0x5a, size);
  const auto* src = static_cast<const char*>(mem);
  static char headers[kStreamPktsPerCall][kStreamHeader];
  static char trailers[kStreamPktsPerCall][kStreamTrailer];
  iovec iov[kStreamPktsPerCall * 3];                                          // the pieces mode's
  static char stage[kStreamMsgsPerCall][kStreamSegsPerMsg * kStreamSegment];  // the staged mode's
  iovec whole[kStreamMsgsPerCall];
  mmsghdr msgs[kStreamMsgsPerCall];
  alignas(cmsghdr) char ctrl[kStreamMsgsPerCall][CMSG_SPACE(sizeof(uint16_t))];
  for (uint32_t m = 0; m < kStreamMsgsPerCall; ++m) {
    msghdr& h = msgs[m].msg_hdr;
    h = msghdr{};
    h.msg_name = &to;
    h.msg_namelen = sizeof to;
    whole[m] = iovec{stage[m], sizeof stage[m]};
    h.msg_iov = mode == StreamMode::kPieces ? &iov[m * kStreamSegsPerMsg * 3] : &whole[m];
    h.msg_iovlen = mode == StreamMode::kPieces ? kStreamSegsPerMsg * 3 : 1;
    set_gso(h, ctrl[m], sizeof ctrl[m], kStreamSegment);
  }
  std::optional<SpliceSender> splicer;
  if (mode == StreamMode::kSplice) splicer.emplace(fd);
  size_t off = 0;
  uint64_t sent = 0;
  const auto start = Clock::now();
  double s = 0;
  const char* payloads[kStreamPktsPerCall];
  do {
    for (uint32_t p = 0; p < kStreamPktsPerCall; ++p) {
      payloads[p] = src + off;
      off = off + 2 * kStreamPayload <= size ? off + kStreamPayload : 0;
    }
    if (splicer) {
      for (uint32_t p = 0; p < kStreamPktsPerCall; p += SpliceSender::kPerMsg)
        splicer->send_message(payloads + p, std::min(SpliceSender::kPerMsg, kStreamPktsPerCall - p), to);
    } else {
      for (uint32_t p = 0; p < kStreamPktsPerCall; ++p) {
        if (mode == StreamMode::kStaged) {
          char* at = stage[p / kStreamSegsPerMsg] + p % kStreamSegsPerMsg * kStreamSegment;
          std::memcpy(at, headers[p], kStreamHeader);
          std::memcpy(at + kStreamHeader, payloads[p], kStreamPayload);
          std::memcpy(at + kStreamHeader + kStreamPayload, trailers[p], kStreamTrailer);
          continue;
        }
        iov[3 * p] = iovec{headers[p], kStreamHeader};
        iov[3 * p + 1] = iovec{const_cast<char*>(payloads[p]), kStreamPayload};
        iov[3 * p + 2] = iovec{trailers[p], kStreamTrailer};
      }
      int done = 0;
      while (done < static_cast<int>(kStreamMsgsPerCall)) {
        const int r = sendmmsg(fd, msgs + done, kStreamMsgsPerCall - done, 0);
        if (r < 0) {
          if (send_again(errno)) continue;
          die("sendmmsg");
        }
        done += r;
      }
    }
    sent += kStreamPktsPerCall * kStreamSegment;
    s = std::chrono::duration<double>(Clock::now() - start).count();
  } while (s < seconds);
  if (stream_control(ctl, 'e', answer, sizeof answer) == 0) {
    std::fprintf(stderr, "floor-bench: no count from 127.0.0.1:%u\n", port);
    return 1;
  }
  unsigned long long received = 0, timed = 0;
  double rs = 0;
  if (std::sscanf(answer, "received_bytes=%llu timed_bytes=%llu seconds=%lf", &received, &timed, &rs) != 3 ||
      !(rs > 0)) {
    std::fprintf(stderr, "floor-bench: no data received (%s)\n", answer);
    return 1;
  }
  const double bps = static_cast<double>(timed) / rs;
  std::printf(
      "size=%zu seconds=%.6f sent_bytes_per_sec=%.1f bytes_per_sec=%.1f gbps=%.3f received_pct=%.2f\n", size,
      s, static_cast<double>(sent) / s, bps, bps / 1e9,
      100.0 * static_cast<double>(received) / static_cast<double>(sent));
  munmap(mem, size);
  return 0;
}

int memcpy_loop(size_t size, double seconds, size_t pairs) {
  // One allocation per side, the pairs side by side in it; every byte written first, so that no page
  // fault is timed.
  std::vector<char> src(size * pairs, 1), dst(size * pairs, 0);
  // Batches of about 1 MiB between looks at the clock, until `seconds` have passed.
  const uint64_t batch = std::max<uint64_t>((1u << 20) / size, 1);
  uint64_t iters = 0;
  size_t pair = 0;
  const auto start = Clock::now();
  double s = 0;
  do {
    for (uint64_t i = 0; i < batch; ++i) {
      char* const d = dst.data() + pair * size;
      const char* const from = src.data() + pair * size;
      std::memcpy(d, from, size);
      asm volatile("" : : "r"(d), "r"(from) : "memory");  // keep every copy
      if (++pair == pairs) pair = 0;
    }
    iters += batch;
    s = std::chrono::duration<double>(Clock::now() - start).count();
  } while (s < seconds);
  const double bps = static_cast<double>(iters) * static_cast<double>(size) / s;
  std::printf("size=%zu pairs=%zu iters=%llu seconds=%.6f bytes_per_sec=%.1f gbps=%.3f mib_per_sec=%.1f\n",
              size, pairs, static_cast<unsigned long long>(iters), s, bps, bps / 1e9, bps / (1 << 20));
  return 0;
}

// kernel-copy: the kernel's copy from user pages that this process has written already, first and second
// time (perftest fills its buffers before it registers them; the socket path's sendmmsg then copies from
// them). On the project's VM the first pass costs about 7.5 us more per 4 KiB page than the second.
int kernel_copy(size_t size, size_t pairs) {
  const size_t total = size * pairs;
  std::vector<char> src(total, 1);  // every page written by this process, as memcpy_loop's
  const int fd = memfd_create("floor-bench", MFD_CLOEXEC);
  constexpr size_t kChunk = 64 << 10;  // a GSO send's worth
  constexpr off_t kFileBytes = 1 << 20;
  if (fd < 0 || ftruncate(fd, kFileBytes) != 0) die("memfd");
  double bps[2];
  for (double& b : bps) {
    const auto start = Clock::now();
    for (size_t off = 0; off < total; off += kChunk) {
      const size_t n = std::min(kChunk, total - off);
      if (pwrite(fd, src.data() + off, n, static_cast<off_t>(off % kFileBytes)) != static_cast<ssize_t>(n))
        die("pwrite");
    }
    b = static_cast<double>(total) / std::chrono::duration<double>(Clock::now() - start).count();
  }
  close(fd);
  const double pages = static_cast<double>(total) / 4096;
  std::printf(
      "size=%zu pairs=%zu first_bytes_per_sec=%.1f later_bytes_per_sec=%.1f first_us_per_page=%.3f "
      "later_us_per_page=%.3f\n",
      size, pairs, bps[0], bps[1], static_cast<double>(total) / bps[0] / pages * 1e6,
      static_cast<double>(total) / bps[1] / pages * 1e6);
  return 0;
}

// mem-pingpong: both processes write into each other's copy of `buf` (the same address in both after fork)
// through the other's /proc/<pid>/mem.
// Iteration i writes SIZE bytes whose last is the iteration's mark; the other side spins on that byte, as
// ib_write_lat spins on the last byte of its buffer.
int mem_pingpong(size_t size, long iters) {
  std::vector<char> out(size, 0);
  // The buffer the other process writes into: private memory (copy-on-write after the fork, not shared),
  // as an application's registered memory is; its pages are the process's own by the warm-up's end.
  std::vector<char> in(size, 0);
  char* const buf = in.data();
  volatile char* const last = buf + size - 1;
  const pid_t parent = getpid();
  const pid_t child = fork();
  if (child < 0) die("fork");
  const pid_t peer = child == 0 ? parent : child;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/mem", static_cast<int>(peer));
  const int mem = open(path, O_RDWR | O_CLOEXEC);  // refused where ptrace rules forbid it (as softrdma is)
  const auto write_mark = [&](long i) {
    out[size - 1] = static_cast<char>((i % 127) + 1);
    return pwrite(mem, out.data(), size, static_cast<off_t>(reinterpret_cast<uintptr_t>(buf))) ==
           static_cast<ssize_t>(size);
  };
  const auto await_mark = [&](long i) {
    const char want = static_cast<char>((i % 127) + 1);
    const auto deadline = Clock::now() + kReplyTimeout;
    for (unsigned spins = 0; *last != want; ++spins)
      if ((spins & 1023) == 0 && Clock::now() > deadline) return false;
    return true;
  };
  const long total = kWarmup + iters;
  if (child == 0) {  // the echo side: answers each mark with the same mark
    for (long i = 0; i < total; ++i)
      if (!await_mark(i) || !write_mark(i)) _exit(1);
    _exit(0);
  }
  const int rc = timed_round_trips(
      size, iters,
      [&](long i) {
        if (write_mark(i)) return true;
        std::fprintf(stderr, "floor-bench: pwrite %s: %s\n", path, std::strerror(errno));
        return false;
      },
      [&](long i) {
        if (await_mark(i)) return true;
        std::fprintf(stderr, "floor-bench: no answer to iteration %ld\n", i);
        return false;
      });
  close(mem);
  if (rc != 0) kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  if (rc == 0 && (!WIFEXITED(status) || WEXITSTATUS(status) != 0)) {
    std::fprintf(stderr, "floor-bench: the echo process failed\n");
    return 1;
  }
  return rc;
}

// machine: see the top of the file. A pause is a gap of kPauseNs or more between two consecutive clock reads
// of a thread that does nothing else; its period is the median time from one pause of kPeriodPauseNs or
// more to the next on the same CPU (the project's VM: about 35 us every 1.000 ms on each CPU, invisible to
// the guest's own accounting, which the floors' ping-pongs pay as well as softrdma's).
constexpr int64_t kPauseNs = 10'000;
constexpr int64_t kPeriodPauseNs = 20'000;

struct Pauses {
  std::vector<int64_t> lengths;  // ns
  std::vector<int64_t> periods;  // ns between the long ones
  double seconds = 0;
  int64_t work_ns = 0;  // the median batch of the fixed work (kWorkSteps), timed after the pauses
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// The fixed work that compares the CPUs' speeds: a chain of dependent multiply-adds (a step waits for the
// one before, so the time is the CPU's own and not the memory's). A virtual CPU whose physical core is
// shared with another guest runs it slower; so do the processes on it (the project's VM, 2026-12-04: one
// CPU took 1.6x as long as the other for minutes, and softrdma's probes on that CPU 1.5-2x the cycles).
constexpr uint64_t kWorkSteps = 1u << 22;
constexpr int kWorkBatches = 5;

int64_t work_batch_ns() {
  const int64_t t0 = now_ns();
  uint64_t x = static_cast<uint64_t>(t0);
  for (uint64_t i = 0; i < kWorkSteps; ++i) x = x * 6364136223846793005ull + 1442695040888963407ull;
  asm volatile("" : : "r"(x) : "memory");  // the chain is done before the clock is read
  return now_ns() - t0;
}

int64_t median(std::vector<int64_t> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof set, &set);  // best effort: a refused pin still measures some CPU
}

void spin_and_record(int cpu, double seconds, Pauses* out) {
  pin_to(cpu);
  out->lengths.reserve(1 << 16);           // filled up to here: nothing is allocated while the thread spins
  out->periods.reserve(1 << 16);
  const int64_t start = now_ns(), end = start + static_cast<int64_t>(seconds * 1e9);
  int64_t last = start, last_long = -1;
  while (last < end) {
    const int64_t t = now_ns();
    if (const int64_t gap = t - last; gap >= kPauseNs) {
      if (out->lengths.size() < out->lengths.capacity()) out->lengths.push_back(gap);
      if (gap >= kPeriodPauseNs) {
        if (last_long >= 0 && out->periods.size() < out->periods.capacity())
          out->periods.push_back(last - last_long);
        last_long = last;
      }
    }
    last = t;
  }
  out->seconds = static_cast<double>(last - start) / 1e9;
  // Every CPU's thread does this at about the same time, so each CPU is measured while all are busy (as in
  // a ping-pong or a stream of two processes).
  std::vector<int64_t> batches;
  for (int b = 0; b < kWorkBatches; ++b) batches.push_back(work_batch_ns());
  out->work_ns = median(std::move(batches));
}

// The CPUs' placement: two threads pinned to the first CPU and the last take turns at one counter, each
// waiting (spinning) for the other's increment, so each turn moves the counter's cache line from one
// CPU's cache to the other's. A VM's two virtual CPUs may share a cache or not, and which they are can
// change within minutes (the project's VM, 2026-12-04/05: `fi_pingpong` shm at 0.23-0.4 us or 0.9-1.1;
// every figure that moves data between the two processes moves with it). Returns the median over batches
// of nanoseconds per hand-off, 0 with one CPU or when the other thread did not answer within a second.
constexpr int kHandoffBatches = 7;
constexpr uint64_t kHandoffTrips = 20'000;  // round trips per batch
constexpr int64_t kHandoffLimitNs = 1'000'000'000;

struct alignas(64) HandoffLine {
  std::atomic<uint64_t> turn{0};
};
struct alignas(64) HandoffStop {
  std::atomic<bool> stop{false};
};

// Waits until `line` holds `want`; false once the batch that began at `t0` ran out of time or `stop` is set.
bool wait_turn(const HandoffLine& line, uint64_t want, const HandoffStop& stop, int64_t t0) {
  for (uint32_t spins = 1; line.turn.load(std::memory_order_acquire) != want; ++spins) {
    if ((spins & 1023) == 0 && (stop.stop.load(std::memory_order_relaxed) || now_ns() - t0 > kHandoffLimitNs))
      return false;
  }
  return true;
}

double line_handoff_ns() {
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  if (cpus < 2) return 0;
  HandoffLine line;
  HandoffStop stop;
  std::thread echo([&] {
    pin_to(static_cast<int>(cpus - 1));
    for (uint64_t k = 1;; k += 2) {
      if (!wait_turn(line, k, stop, now_ns())) return;
      line.turn.store(k + 1, std::memory_order_release);
    }
  });
  pin_to(0);
  std::vector<int64_t> per_handoff;  // picoseconds
  uint64_t k = 0;
  bool answered = true;
  for (int b = 0; b < kHandoffBatches && answered; ++b) {
    const int64_t t0 = now_ns();
    for (uint64_t i = 0; i < kHandoffTrips && answered; ++i, k += 2) {
      line.turn.store(k + 1, std::memory_order_release);
      answered = wait_turn(line, k + 2, stop, t0);
    }
    if (answered) per_handoff.push_back((now_ns() - t0) * 1000 / static_cast<int64_t>(2 * kHandoffTrips));
  }
  stop.stop.store(true);
  echo.join();
  return answered ? static_cast<double>(median(std::move(per_handoff))) / 1e3 : 0.0;
}

int machine(double seconds) {
  // A system call: the median of 21 batches of 20,000.
  std::vector<int64_t> per_call;
  for (int b = 0; b < 21; ++b) {
    constexpr int kCalls = 20'000;
    const int64_t t0 = now_ns();
    for (int i = 0; i < kCalls; ++i) syscall(SYS_getppid);
    per_call.push_back((now_ns() - t0) * 1000 / kCalls);  // picoseconds, for the median's resolution
  }
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  std::vector<Pauses> per_cpu(cpus);
  std::vector<std::thread> threads;
  for (unsigned c = 0; c < cpus; ++c)
    threads.emplace_back(spin_and_record, static_cast<int>(c), seconds, &per_cpu[c]);
  for (std::thread& t : threads) t.join();
  std::vector<int64_t> lengths, periods;
  double lost = 0, secs = 0;
  for (const Pauses& p : per_cpu) {
    lengths.insert(lengths.end(), p.lengths.begin(), p.lengths.end());
    periods.insert(periods.end(), p.periods.begin(), p.periods.end());
    for (const int64_t l : p.lengths) lost += static_cast<double>(l);
    secs += p.seconds;
  }
  const int64_t longest = lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
  int64_t fastest = INT64_MAX, slowest = 0;
  std::string work;  // per CPU, ns per step
  for (const Pauses& p : per_cpu) {
    fastest = std::min(fastest, p.work_ns);
    slowest = std::max(slowest, p.work_ns);
    char b[32];
    std::snprintf(b, sizeof b, "%s%.3f", work.empty() ? "" : ",",
                  static_cast<double>(p.work_ns) / static_cast<double>(kWorkSteps));
    work += b;
  }
  const double handoff = line_handoff_ns();
  std::printf(
      "cpus=%u seconds=%.3f syscall_us=%.4f pauses_per_s=%.1f pause_median_us=%.1f pause_max_us=%.1f "
      "pause_lost_pct=%.2f pause_period_ms=%.3f cpu_step_ns=%s cpu_speed_spread=%.2f line_handoff_ns=%.1f\n",
      cpus, seconds, static_cast<double>(median(per_call)) / 1e6,
      secs > 0 ? static_cast<double>(lengths.size()) / secs : 0.0, static_cast<double>(median(lengths)) / 1e3,
      static_cast<double>(longest) / 1e3, secs > 0 ? lost / (secs * 1e9) * 100 : 0.0,
      static_cast<double>(median(periods)) / 1e6, work.c_str(),
      fastest > 0 ? static_cast<double>(slowest) / static_cast<double>(fastest) : 0.0, handoff);
  return 0;
}

int usage() {
  std::fprintf(stderr,
               "usage: floor-bench udp-server PORT [rc|block]\n"
               "       floor-bench udp-client PORT SIZE ITERS [rc|block]\n"
               "       floor-bench udp-stream-server PORT\n"
               "       floor-bench udp-stream-client PORT SIZE SECONDS [pieces|splice]\n"
               "       floor-bench memcpy SIZE SECONDS [PAIRS]\n"
               "       floor-bench kernel-copy SIZE PAIRS\n"
               "       floor-bench mem-pingpong SIZE ITERS\n"
               "       floor-bench machine SECONDS\n"
               "       floor-bench placement\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const auto num = [&](int i) { return std::strtoull(argv[i], nullptr, 0); };
  const std::string_view cmd = argv[1];
  const bool rc = argc >= 2 && std::string_view(argv[argc - 1]) == "rc";
  const bool block = argc >= 2 && std::string_view(argv[argc - 1]) == "block";
  const int args = argc - (rc || block ? 1 : 0);
  if (cmd == "udp-server" && args == 3)
    return rc ? udp_server_rc(static_cast<uint16_t>(num(2)))
              : udp_server(static_cast<uint16_t>(num(2)), block);
  if (cmd == "udp-client" && args == 5) {
    const size_t size = num(3);
    const long iters = static_cast<long>(num(4));
    if (size == 0 || size > kMaxDatagram || iters < 1) return usage();
    return rc ? udp_client_rc(static_cast<uint16_t>(num(2)), size, iters)
              : udp_client(static_cast<uint16_t>(num(2)), size, iters, block);
  }
  if (cmd == "udp-stream-server" && argc == 3) return udp_stream_server(static_cast<uint16_t>(num(2)));
  const std::string_view stream_mode = argc == 6 ? argv[5] : "";
  if (cmd == "udp-stream-client" && (argc == 5 || stream_mode == "splice" || stream_mode == "pieces")) {
    const size_t size = num(3);
    const double seconds = std::strtod(argv[4], nullptr);
    if (size < 2 * kStreamPayload || size % kStreamPayload != 0 || size > (size_t{1} << 30) ||
        !(seconds > 0) || seconds > 60)
      return usage();
    return udp_stream_client(static_cast<uint16_t>(num(2)), size, seconds,
                             stream_mode == "splice"   ? StreamMode::kSplice
                             : stream_mode == "pieces" ? StreamMode::kPieces
                                                       : StreamMode::kStaged);
  }
  if (cmd == "memcpy" && (argc == 4 || argc == 5)) {
    const double seconds = std::strtod(argv[3], nullptr);
    const size_t pairs = argc == 5 ? num(4) : 1;
    if (num(2) == 0 || !(seconds > 0) || pairs == 0 || pairs > 1024 || num(2) > (size_t{1} << 30) / pairs)
      return usage();
    return memcpy_loop(num(2), seconds, pairs);
  }
  if (cmd == "kernel-copy" && argc == 4) {
    const size_t pairs = num(3);
    if (num(2) == 0 || pairs == 0 || pairs > 1024 || num(2) > (size_t{1} << 30) / pairs) return usage();
    return kernel_copy(num(2), pairs);
  }
  if (cmd == "mem-pingpong" && argc == 4) {
    const size_t size = num(2);
    const long iters = static_cast<long>(num(3));
    if (size == 0 || size > (size_t{1} << 24) || iters < 1) return usage();
    return mem_pingpong(size, iters);
  }
  if (cmd == "placement" && argc == 2) {
    std::printf("line_handoff_ns=%.1f\n", line_handoff_ns());
    return 0;
  }
  if (cmd == "machine" && argc == 3) {
    const double seconds = std::strtod(argv[2], nullptr);
    if (!(seconds > 0) || seconds > 60) return usage();
    return machine(seconds);
  }
  return usage();
}
