// Is MSG_ZEROCOPY worth it for softrdma's large UDP sends? It sends GSO messages (15 x 4 KiB segments, as
// the requester does at path MTU 4096) over loopback to a socket that a second thread drains, with and
// without MSG_ZEROCOPY (draining the completion notifications from the error queue, as a user of it must),
// and prints the send rate of each. Plain sockets, no softrdma.
//   zerocopy-bench [SENDS]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

namespace {

constexpr int kSegment = 4096;
constexpr size_t kMessage = 15 * kSegment;  // the largest multiple of 4 KiB in one UDP datagram

// Sends `sends` messages; returns GB/s (10^9 B/s), or a negative value if the socket refused.
double run(bool zerocopy, long sends) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int rx = socket(AF_INET, SOCK_DGRAM, 0), tx = socket(AF_INET, SOCK_DGRAM, 0);
  const int one = 1, big = 32 << 20, seg = kSegment;
  setsockopt(rx, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
  setsockopt(rx, IPPROTO_UDP, UDP_GRO, &one, sizeof one);
  socklen_t len = sizeof a;
  if (bind(rx, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(rx, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return -1;
  setsockopt(tx, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
  setsockopt(tx, IPPROTO_UDP, UDP_SEGMENT, &seg, sizeof seg);
  if (zerocopy && setsockopt(tx, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof one) != 0) return -1;
  if (connect(tx, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return -1;
  std::atomic<bool> stop{false};
  std::thread drain([&] {
    std::vector<char> buf(1 << 17);
    timeval tv{0, 100'000};
    setsockopt(rx, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    while (!stop.load()) (void)recv(rx, buf.data(), buf.size(), 0);
  });
  std::vector<char> payload(kMessage, 1);
  const auto t0 = std::chrono::steady_clock::now();
  bool failed = false;
  for (long i = 0; i < sends && !failed; ++i) {
    while (send(tx, payload.data(), payload.size(), zerocopy ? MSG_ZEROCOPY : 0) < 0) {
      if (errno != ENOBUFS && errno != EAGAIN) {
        failed = true;
        break;
      }
    }
    if (zerocopy) {  // the notifications say when the kernel let go of the pages
      char ctl[128];
      msghdr m{};
      m.msg_control = ctl;
      m.msg_controllen = sizeof ctl;
      while (recvmsg(tx, &m, MSG_ERRQUEUE | MSG_DONTWAIT) >= 0) m.msg_controllen = sizeof ctl;
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stop = true;
  drain.join();
  close(tx);
  close(rx);
  return failed ? -1 : sends * double(kMessage) / secs / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const long sends = argc > 1 ? std::atol(argv[1]) : 100'000;
  for (bool zc : {false, true}) {
    const double gbps = run(zc, sends);
    if (gbps < 0)
      std::printf("%-12s refused by this kernel or socket\n", zc ? "MSG_ZEROCOPY" : "copy");
    else
      std::printf("%-12s %ld sends of %zu B (GSO %d B): %.2f GB/s\n", zc ? "MSG_ZEROCOPY" : "copy", sends, kMessage,
                  kSegment, gbps);
  }
  return 0;
}
