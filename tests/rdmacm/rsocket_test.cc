// rsockets of softrdma's librdmacm.so.1 through their C API, both ends in this process on 127.0.0.1 (the
// peer-killed test runs Debian's rstream as the peer): misuse gets rdma-core's errno, connect, accept,
// data across the rings' wrap, shutdown and end of file, rpoll/rselect with ordinary fds, riomap/riowrite.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "loopback.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

using rdmacm_test::loopback;
using rdmacm_test::sa;

// A listening rsocket on 127.0.0.1 and an ephemeral port (in *port).
int listener(uint16_t* port, int type = SOCK_STREAM) {
  const int l = rsocket(AF_INET, type, 0);
  EXPECT_GE(l, 0) << strerror(errno);
  sockaddr_in a = loopback(0);
  EXPECT_EQ(rbind(l, sa(&a), sizeof a), 0) << strerror(errno);
  EXPECT_EQ(rlisten(l, 4), 0) << strerror(errno);
  socklen_t len = sizeof a;
  EXPECT_EQ(rgetsockname(l, sa(&a), &len), 0);
  *port = ntohs(a.sin_port);
  return l;
}

struct Pair {
  int l = -1, c = -1, s = -1;
  uint16_t port = 0;
  ~Pair() {
    for (int fd : {c, s, l})
      if (fd >= 0) rclose(fd);
  }
};

// A connected pair (blocking connect from the client, blocking accept), with options set on the client
// and the listener before.
void connect_pair(Pair* p, int iomap = 0, int rcvbuf = 0) {
  p->l = listener(&p->port);
  p->c = rsocket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(p->c, 0);
  for (int fd : {p->l, p->c}) {
    if (iomap) {
      ASSERT_EQ(rsetsockopt(fd, SOL_RDMA, RDMA_IOMAPSIZE, &iomap, sizeof iomap), 0);
    }
    if (rcvbuf) {
      ASSERT_EQ(rsetsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf), 0);
      ASSERT_EQ(rsetsockopt(fd, SOL_SOCKET, SO_SNDBUF, &rcvbuf, sizeof rcvbuf), 0);
    }
  }
  // The request is accepted when raccept takes it (not in the background, as rdma-core's): a blocking
  // rconnect waits for that, so it runs in a thread of its own.
  sockaddr_in a = loopback(p->port);
  std::thread client([&] { EXPECT_EQ(rconnect(p->c, sa(&a), sizeof a), 0) << strerror(errno); });
  p->s = raccept(p->l, nullptr, nullptr);
  client.join();
  ASSERT_GE(p->s, 0) << strerror(errno);
}

void send_all(int fd, const uint8_t* p, size_t n) {
  while (n) {
    const ssize_t k = rsend(fd, p, n, 0);
    ASSERT_GT(k, 0) << strerror(errno);
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void recv_all(int fd, uint8_t* p, size_t n) {
  while (n) {
    const ssize_t k = rrecv(fd, p, n, 0);
    ASSERT_GT(k, 0) << strerror(errno);
    p += k;
    n -= static_cast<size_t>(k);
  }
}

TEST(Rsocket, BadDescriptorsAreEbadf) {
  int pfd[2];
  ASSERT_EQ(pipe(pfd), 0);
  char b[8] = {};
  iovec v{b, sizeof b};
  msghdr m{};
  m.msg_iov = &v;
  m.msg_iovlen = 1;
  sockaddr_in a = loopback(1);
  socklen_t len = sizeof a;
  int val = 1;
  for (int fd : {-1, 1 << 20, pfd[0]}) {
    SCOPED_TRACE(fd);
    auto ebadf = [](long ret) {
      EXPECT_EQ(ret, -1);
      EXPECT_EQ(errno, EBADF);
    };
    ebadf(rbind(fd, sa(&a), sizeof a));
    ebadf(rlisten(fd, 1));
    ebadf(raccept(fd, nullptr, nullptr));
    ebadf(rconnect(fd, sa(&a), sizeof a));
    ebadf(rshutdown(fd, SHUT_RDWR));
    ebadf(rclose(fd));
    ebadf(rrecv(fd, b, sizeof b, 0));
    ebadf(rrecvfrom(fd, b, sizeof b, 0, nullptr, nullptr));
    ebadf(rrecvmsg(fd, &m, 0));
    ebadf(rread(fd, b, sizeof b));
    ebadf(rreadv(fd, &v, 1));
    ebadf(rsend(fd, b, sizeof b, 0));
    ebadf(rsendto(fd, b, sizeof b, 0, nullptr, 0));
    ebadf(rsendmsg(fd, &m, 0));
    ebadf(rwrite(fd, b, sizeof b));
    ebadf(rwritev(fd, &v, 1));
    ebadf(rgetpeername(fd, sa(&a), &len));
    ebadf(rgetsockname(fd, sa(&a), &len));
    ebadf(rsetsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &val, sizeof val));
    ebadf(rgetsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &val, &len));
    ebadf(rfcntl(fd, F_GETFL));
    ebadf(riomap(fd, b, sizeof b, PROT_WRITE, 0, -1));
    ebadf(riounmap(fd, b, sizeof b));
    ebadf(static_cast<long>(riowrite(fd, b, sizeof b, 0, 0)));
  }
  close(pfd[0]);
  close(pfd[1]);
}

TEST(Rsocket, WhatItCannotBeIsNotSupported) {
  for (auto [domain, type, proto] : {std::tuple{AF_UNIX, SOCK_STREAM, 0}, {AF_INET, SOCK_SEQPACKET, 0},
                                     {AF_INET, SOCK_STREAM, IPPROTO_UDP}, {AF_INET, SOCK_DGRAM, IPPROTO_TCP}}) {
    errno = 0;
    EXPECT_EQ(rsocket(domain, type, proto), -1);
    EXPECT_EQ(errno, EOPNOTSUPP) << domain << " " << type << " " << proto;
  }
  errno = 0;
  EXPECT_EQ(rsocket(AF_INET6, SOCK_DGRAM, 0), -1);  // datagram rsockets: IPv4 only
  EXPECT_EQ(errno, EAFNOSUPPORT);
}

TEST(Rsocket, WrongStateGetsRdmaCoresErrno) {
  const int fd = rsocket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  char b[8] = {};
  errno = 0;
  EXPECT_EQ(raccept(fd, nullptr, nullptr), -1);  // not listening
  EXPECT_EQ(errno, EBADF);
  EXPECT_EQ(rsend(fd, b, sizeof b, 0), -1);  // not connected: not writable
  EXPECT_EQ(errno, ECONNRESET);
  EXPECT_EQ(rrecv(fd, b, sizeof b, 0), 0);  // not readable: end of file, as rdma-core
  EXPECT_EQ(riomap(fd, b, sizeof b, PROT_WRITE, 0, -1), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(riounmap(fd, b, sizeof b), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(riomap(fd, b, sizeof b, PROT_READ, 0, -1), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rshutdown(fd, 42), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rfcntl(fd, F_GETFD), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  int v = 0;
  socklen_t len = sizeof v;
  EXPECT_EQ(rgetsockopt(fd, SOL_SOCKET, SO_PEERCRED, &v, &len), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(rsetsockopt(fd, SOL_SOCKET, SO_RCVBUF, nullptr, sizeof v), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rsetsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &v, sizeof v), -1);  // 0: not a time
  EXPECT_EQ(errno, EINVAL);
  sockaddr_in a = loopback(0);
  ASSERT_EQ(rbind(fd, sa(&a), sizeof a), 0);
  EXPECT_EQ(rbind(fd, sa(&a), sizeof a), -1);  // bound already
  EXPECT_EQ(errno, EINVAL);
  ASSERT_EQ(rlisten(fd, 1), 0);
  EXPECT_EQ(rlisten(fd, 1), 0);  // again: fine, as rdma-core
  EXPECT_EQ(rconnect(fd, sa(&a), sizeof a), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rclose(fd), 0);
  EXPECT_EQ(rclose(fd), -1);
  EXPECT_EQ(errno, EBADF);
}

TEST(Rsocket, OptionsReadBack) {
  const int fd = rsocket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  int v = 1 << 18, got = 0;
  socklen_t len = sizeof got;
  ASSERT_EQ(rsetsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof v), 0);
  ASSERT_EQ(rgetsockopt(fd, SOL_SOCKET, SO_RCVBUF, &got, &len), 0);
  EXPECT_EQ(got, v << 1);  // doubled, as Linux and rdma-core
  v = 1;
  ASSERT_EQ(rsetsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, sizeof v), 0);
  ASSERT_EQ(rgetsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &got, &len), 0);
  EXPECT_EQ(got, 1);
  ASSERT_EQ(rsetsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &v, sizeof v), 0);
  ASSERT_EQ(rgetsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &got, &len), 0);
  EXPECT_EQ(got, 1);
  v = 100;
  ASSERT_EQ(rsetsockopt(fd, SOL_RDMA, RDMA_SQSIZE, &v, sizeof v), 0);
  ASSERT_EQ(rgetsockopt(fd, SOL_RDMA, RDMA_SQSIZE, &got, &len), 0);
  EXPECT_EQ(got, 100);
  EXPECT_EQ(rfcntl(fd, F_GETFL) & O_NONBLOCK, 0);
  ASSERT_EQ(rfcntl(fd, F_SETFL, O_NONBLOCK), 0);
  EXPECT_EQ(rfcntl(fd, F_GETFL) & O_NONBLOCK, O_NONBLOCK);
  rclose(fd);
}

TEST(Rsocket, ConnectToNobodyIsRefused) {
  uint16_t port;
  const int l = listener(&port);
  rclose(l);  // the port is free again: nobody listens there
  const int fd = rsocket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = loopback(port);
  const auto t0 = Clock::now();
  errno = 0;
  EXPECT_EQ(rconnect(fd, sa(&a), sizeof a), -1);
  EXPECT_EQ(errno, ECONNREFUSED);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(rconnect(fd, sa(&a), sizeof a), -1);  // reported once: later, not connected
  EXPECT_EQ(errno, ENOTCONN);
  rclose(fd);
}

TEST(Rsocket, NonBlockingConnectAcceptThroughRpoll) {
  uint16_t port;
  const int l = listener(&port);
  ASSERT_EQ(rfcntl(l, F_SETFL, O_NONBLOCK), 0);
  EXPECT_EQ(raccept(l, nullptr, nullptr), -1);
  EXPECT_EQ(errno, EAGAIN);
  const int c = rsocket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  sockaddr_in a = loopback(port);
  ASSERT_EQ(rconnect(c, sa(&a), sizeof a), -1);
  ASSERT_EQ(errno, EINPROGRESS);
  int s = -1;
  bool out = false;
  const auto t0 = Clock::now();
  while ((s < 0 || !out) && Clock::now() - t0 < std::chrono::seconds(10)) {
    pollfd p[2] = {{l, POLLIN, 0}, {c, POLLOUT, 0}};
    ASSERT_GE(rpoll(p, 2, 1000), 0);
    if (p[0].revents & POLLIN) s = raccept(l, nullptr, nullptr);
    if (p[1].revents) {
      EXPECT_EQ(p[1].revents & (POLLERR | POLLHUP), 0);
      out = true;
    }
  }
  ASSERT_GE(s, 0);
  ASSERT_TRUE(out);
  int err = -1;
  socklen_t len = sizeof err;
  ASSERT_EQ(rgetsockopt(c, SOL_SOCKET, SO_ERROR, &err, &len), 0);
  EXPECT_EQ(err, 0);
  // Names: each end's local port is the other's peer port.
  sockaddr_in cl{}, cp{}, sl{}, sp{};
  socklen_t n = sizeof cl;
  ASSERT_EQ(rgetsockname(c, sa(&cl), &n), 0);
  n = sizeof cp;
  ASSERT_EQ(rgetpeername(c, sa(&cp), &n), 0);
  n = sizeof sl;
  ASSERT_EQ(rgetsockname(s, sa(&sl), &n), 0);
  n = sizeof sp;
  ASSERT_EQ(rgetpeername(s, sa(&sp), &n), 0);
  EXPECT_EQ(ntohs(cp.sin_port), port);
  EXPECT_EQ(ntohs(sl.sin_port), port);
  EXPECT_EQ(cl.sin_port, sp.sin_port);
  EXPECT_EQ(sp.sin_addr.s_addr, htonl(INADDR_LOOPBACK));
  // Connected: the QP's sizes are fixed.
  int v = 64;
  EXPECT_EQ(rsetsockopt(c, SOL_RDMA, RDMA_SQSIZE, &v, sizeof v), -1);
  EXPECT_EQ(errno, EINVAL);
  // Non-blocking receive with nothing there.
  char b[4];
  EXPECT_EQ(rrecv(c, b, sizeof b, 0), -1);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_EQ(rrecv(s, b, sizeof b, MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, EAGAIN);
  // The accepted end (non-blocking as its listener) writes first: it may once the RTU is in.
  ssize_t k = -1;
  const auto t1 = Clock::now();
  while ((k = rsend(s, "z", 1, 0)) != 1 && Clock::now() - t1 < std::chrono::seconds(5)) ASSERT_EQ(errno, EAGAIN);
  ASSERT_EQ(k, 1);
  pollfd pr{c, POLLIN, 0};
  ASSERT_EQ(rpoll(&pr, 1, 5000), 1);
  ASSERT_EQ(rrecv(c, b, 1, 0), 1);
  EXPECT_EQ(b[0], 'z');
  for (int fd : {c, s, l}) rclose(fd);
}

TEST(Rsocket, DataAcrossTheRingsWrapInIrregularPieces) {
  Pair p;
  connect_pair(&p, 0, 8 << 10);  // 16 KiB rings: many wraps
  ASSERT_FALSE(HasFatalFailure());
  const int c = p.c, s = p.s;
  ASSERT_EQ(rfcntl(c, F_SETFL, O_NONBLOCK), 0);
  constexpr size_t kTotal = 3 << 20;
  std::vector<uint8_t> src(kTotal), dst(kTotal);
  for (size_t i = 0; i < kTotal; i++) src[i] = static_cast<uint8_t>(i * 7 + (i >> 11));
  size_t sent = 0, got = 0, step = 0;
  const auto t0 = Clock::now();
  while (got < kTotal && Clock::now() - t0 < std::chrono::seconds(30)) {
    pollfd fds[2] = {{c, static_cast<short>(sent < kTotal ? POLLOUT : 0), 0}, {s, POLLIN, 0}};
    ASSERT_GT(rpoll(fds, 2, 5000), 0);
    if (fds[0].revents & POLLOUT) {
      const size_t want = std::min<size_t>(kTotal - sent, 1 + (step++ * 7919) % 20000);
      const ssize_t k = rsend(c, src.data() + sent, want, 0);
      if (k > 0) sent += static_cast<size_t>(k);
      else ASSERT_EQ(errno, EAGAIN);
    }
    if (fds[1].revents & POLLIN) {
      iovec v[2] = {{dst.data() + got, std::min<size_t>(kTotal - got, 100)},
                    {dst.data() + got + std::min<size_t>(kTotal - got, 100),
                     kTotal - got - std::min<size_t>(kTotal - got, 100)}};
      const ssize_t k = rreadv(s, v, 2);
      ASSERT_GT(k, 0) << strerror(errno);
      got += static_cast<size_t>(k);
    }
  }
  ASSERT_EQ(got, kTotal);
  EXPECT_EQ(memcmp(src.data(), dst.data(), kTotal), 0);
}

TEST(Rsocket, ShutdownGivesEndOfFileAndCloseResetsTheWriter) {
  Pair p;
  connect_pair(&p);
  ASSERT_FALSE(HasFatalFailure());
  uint8_t msg[1000], back[1000];
  for (size_t i = 0; i < sizeof msg; i++) msg[i] = static_cast<uint8_t>(i);
  send_all(p.c, msg, sizeof msg);
  ASSERT_EQ(rshutdown(p.c, SHUT_WR), 0);
  recv_all(p.s, back, sizeof back);
  EXPECT_EQ(memcmp(msg, back, sizeof msg), 0);
  char b;
  EXPECT_EQ(rrecv(p.s, &b, 1, 0), 0);  // end of file after the data
  EXPECT_EQ(rsend(p.c, msg, 1, 0), -1);  // shut for writing
  EXPECT_EQ(errno, ECONNRESET);
  // The other direction still works.
  send_all(p.s, msg, sizeof msg);
  recv_all(p.c, back, sizeof back);
  EXPECT_EQ(memcmp(msg, back, sizeof msg), 0);
  pollfd pf{p.s, POLLIN, 0};
  EXPECT_EQ(rpoll(&pf, 1, 0), 1);  // readable: end of file
  // The server closes: the client reads end of file, and its writes are reset.
  ASSERT_EQ(rclose(p.s), 0);
  p.s = -1;
  EXPECT_EQ(rrecv(p.c, &b, 1, 0), 0);
  ASSERT_EQ(rclose(p.c), 0);
  p.c = -1;
}

TEST(Rsocket, WriterToAClosedPeerIsReset) {
  Pair p;
  connect_pair(&p);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_EQ(rclose(p.s), 0);
  p.s = -1;
  std::vector<uint8_t> buf(1 << 16);
  ssize_t k = 0;
  const auto t0 = Clock::now();
  while ((k = rsend(p.c, buf.data(), buf.size(), 0)) > 0 && Clock::now() - t0 < std::chrono::seconds(10)) {
  }
  EXPECT_EQ(k, -1);
  EXPECT_EQ(errno, ECONNRESET);
  pollfd pf{p.c, POLLOUT, 0};
  EXPECT_EQ(rpoll(&pf, 1, 0), 1);
  EXPECT_NE(pf.revents & POLLHUP, 0);
}

TEST(Rsocket, RpollAndRselectMixOrdinaryDescriptors) {
  Pair p;
  connect_pair(&p);
  ASSERT_FALSE(HasFatalFailure());
  int pfd[2];
  ASSERT_EQ(pipe(pfd), 0);
  // Nothing ready: the timeout is kept.
  pollfd fds[2] = {{pfd[0], POLLIN, 0}, {p.s, POLLIN, 0}};
  auto t0 = Clock::now();
  EXPECT_EQ(rpoll(fds, 2, 100), 0);
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(95));
  // The pipe only.
  ASSERT_EQ(write(pfd[1], "x", 1), 1);
  EXPECT_EQ(rpoll(fds, 2, 1000), 1);
  EXPECT_EQ(fds[0].revents, POLLIN);
  EXPECT_EQ(fds[1].revents, 0);
  char ch;
  ASSERT_EQ(read(pfd[0], &ch, 1), 1);
  // The rsocket only, woken from its sleep by data sent from another thread.
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(rsend(p.c, "y", 1, 0), 1);
  });
  t0 = Clock::now();
  EXPECT_EQ(rpoll(fds, 2, 5000), 1);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(4));
  writer.join();
  EXPECT_EQ(fds[0].revents, 0);
  EXPECT_EQ(fds[1].revents, POLLIN);
  // rselect: the rsocket readable, the pipe writable, the pipe's read end not.
  fd_set rd, wr;
  FD_ZERO(&rd);
  FD_ZERO(&wr);
  FD_SET(p.s, &rd);
  FD_SET(pfd[0], &rd);
  FD_SET(pfd[1], &wr);
  timeval tv{1, 0};
  EXPECT_EQ(rselect(std::max({p.s, pfd[0], pfd[1]}) + 1, &rd, &wr, nullptr, &tv), 2);
  EXPECT_TRUE(FD_ISSET(p.s, &rd));
  EXPECT_FALSE(FD_ISSET(pfd[0], &rd));
  EXPECT_TRUE(FD_ISSET(pfd[1], &wr));
  ASSERT_EQ(rrecv(p.s, &ch, 1, 0), 1);
  EXPECT_EQ(ch, 'y');
  close(pfd[0]);
  close(pfd[1]);
}

TEST(Rsocket, RiowriteLandsInThePeersMappedBuffer) {
  Pair p;
  connect_pair(&p, 1);
  ASSERT_FALSE(HasFatalFailure());
  std::vector<uint8_t> target(1 << 20, 0), src(1 << 20);
  for (size_t i = 0; i < src.size(); i++) src[i] = static_cast<uint8_t>(i ^ (i >> 9));
  ASSERT_EQ(riomap(p.s, target.data(), target.size(), PROT_WRITE, 0, 4096), 4096);
  // The peer's table has one entry: a second mapping does not fit.
  uint8_t other[64];
  EXPECT_EQ(riomap(p.s, other, sizeof other, PROT_WRITE, 0, -1), -1);
  EXPECT_EQ(errno, ENOMEM);
  ASSERT_EQ(rsend(p.s, "m", 1, 0), 1);  // after the mapping's announcement, in order
  char ch;
  ASSERT_EQ(rrecv(p.c, &ch, 1, 0), 1);
  EXPECT_EQ(riowrite(p.c, src.data(), 100, 0, 0), 0u);  // below the mapping: nothing written
  ASSERT_EQ(riowrite(p.c, src.data(), src.size(), 4096, 0), src.size());
  EXPECT_EQ(riowrite(p.c, src.data(), 10, 4096 + (1 << 20), 0), 0u);  // past its end
  ASSERT_EQ(rsend(p.c, "d", 1, 0), 1);  // after the writes, in order
  ASSERT_EQ(rrecv(p.s, &ch, 1, 0), 1);
  EXPECT_EQ(memcmp(target.data(), src.data(), src.size()), 0);
  EXPECT_EQ(riounmap(p.s, target.data(), target.size()), 0);
  EXPECT_EQ(riounmap(p.s, target.data(), target.size()), -1);
  EXPECT_EQ(errno, EINVAL);
}

// Debian's rstream as the peer, killed with SIGKILL mid-connection: a blocked read ends within seconds.
TEST(Rsocket, PeerKilledEndsABlockedRead) {
  if (access("/usr/bin/rstream", X_OK)) GTEST_SKIP() << "rstream (rdmacm-utils) is not installed";
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "rstream cannot load a sanitized librdmacm.so.1";
#endif
  uint16_t port;
  const int l = listener(&port);
  const std::string ps = std::to_string(port), env = std::string("LD_LIBRARY_PATH=") + RDMACM_LIBDIR;
  const char* argv[] = {"rstream", "-s", "127.0.0.1", "-p", ps.c_str(), "-S", "64", "-C", "1000000", "-T", "b",
                        nullptr};
  std::vector<char*> envp;
  for (char** e = environ; *e; e++)
    if (strncmp(*e, "LD_LIBRARY_PATH=", 16)) envp.push_back(*e);
  envp.push_back(const_cast<char*>(env.c_str()));
  envp.push_back(nullptr);
  pid_t pid;
  ASSERT_EQ(posix_spawn(&pid, "/usr/bin/rstream", nullptr, nullptr, const_cast<char**>(argv), envp.data()), 0);
  const int s = raccept(l, nullptr, nullptr);
  ASSERT_GE(s, 0) << strerror(errno);
  uint8_t sync[16];
  recv_all(s, sync, sizeof sync);  // rstream's first message: it is connected and waits for ours
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  const auto t0 = Clock::now();
  char b;
  EXPECT_EQ(rrecv(s, &b, 1, 0), 0);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(rsend(s, sync, sizeof sync, 0), -1);
  EXPECT_EQ(errno, ECONNRESET);
  rclose(s);
  rclose(l);
}

// Datagram rsockets: the sender finds the receiver's QP through its UDP socket (answered by whichever
// call the receiver is in, here non-blocking receives), then datagrams go by UD with their source.
TEST(RsocketDgram, DatagramsBothWaysWithTheirSource) {
  const int a = rsocket(AF_INET, SOCK_DGRAM, 0), b = rsocket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(a, 0) << strerror(errno);
  ASSERT_GE(b, 0);
  sockaddr_in aa = loopback(0);
  ASSERT_EQ(rbind(a, sa(&aa), sizeof aa), 0) << strerror(errno);
  socklen_t len = sizeof aa;
  ASSERT_EQ(rgetsockname(a, sa(&aa), &len), 0);
  char msg[1000], got[2000];
  for (size_t i = 0; i < sizeof msg; i++) msg[i] = static_cast<char>(i * 3);
  // b sends (non-blocking: EAGAIN until a has answered its Hello, which a's receives do).
  ssize_t k = -1;
  const auto t0 = Clock::now();
  while ((k = rsendto(b, msg, sizeof msg, MSG_DONTWAIT, sa(&aa), sizeof aa)) < 0 &&
         Clock::now() - t0 < std::chrono::seconds(5)) {
    ASSERT_EQ(errno, EAGAIN);
    rrecvfrom(a, got, sizeof got, MSG_DONTWAIT, nullptr, nullptr);
  }
  ASSERT_EQ(k, static_cast<ssize_t>(sizeof msg));
  sockaddr_in from{};
  socklen_t flen = sizeof from;
  pollfd p{a, POLLIN, 0};
  ASSERT_EQ(rpoll(&p, 1, 5000), 1);
  ASSERT_EQ(rrecvfrom(a, got, sizeof got, 0, sa(&from), &flen), static_cast<ssize_t>(sizeof msg));
  EXPECT_EQ(memcmp(got, msg, sizeof msg), 0);
  sockaddr_in bn{};
  len = sizeof bn;
  ASSERT_EQ(rgetsockname(b, sa(&bn), &len), 0);
  EXPECT_EQ(from.sin_port, bn.sin_port);
  EXPECT_EQ(from.sin_addr.s_addr, htonl(INADDR_LOOPBACK));
  // a answers the source: it knows b's QP already, so a blocking send goes at once.
  ASSERT_EQ(rsendto(a, "pong", 4, 0, sa(&from), flen), 4);
  ASSERT_EQ(rrecv(b, got, 2, 0), 2);  // a shorter buffer: the rest of the datagram is dropped
  EXPECT_EQ(memcmp(got, "po", 2), 0);
  EXPECT_EQ(rrecv(b, got, sizeof got, MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, EAGAIN);
  // Connected: rsend goes to the connected address.
  ASSERT_EQ(rconnect(a, sa(&from), flen), 0);
  ASSERT_EQ(rsend(a, "x", 1, 0), 1);
  ASSERT_EQ(rrecv(b, got, sizeof got, 0), 1);
  sockaddr_in peer{};
  len = sizeof peer;
  ASSERT_EQ(rgetpeername(a, sa(&peer), &len), 0);
  EXPECT_EQ(peer.sin_port, bn.sin_port);
  rclose(a);
  rclose(b);
}

TEST(RsocketDgram, MisuseGetsTheSocketsErrno) {
  const int d = rsocket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(d, 0);
  char b[8] = {};
  errno = 0;
  EXPECT_EQ(rlisten(d, 1), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(raccept(d, nullptr, nullptr), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(rsend(d, b, sizeof b, 0), -1);  // no destination
  EXPECT_EQ(errno, EDESTADDRREQ);
  sockaddr_in p{};
  socklen_t len = sizeof p;
  EXPECT_EQ(rgetpeername(d, sa(&p), &len), -1);
  EXPECT_EQ(errno, ENOTCONN);
  EXPECT_EQ(riomap(d, b, sizeof b, PROT_WRITE, 0, -1), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  int v = 64;
  EXPECT_EQ(rsetsockopt(d, SOL_RDMA, RDMA_SQSIZE, &v, sizeof v), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  sockaddr_in a = loopback(0);
  ASSERT_EQ(rbind(d, sa(&a), sizeof a), 0);
  len = sizeof a;
  ASSERT_EQ(rgetsockname(d, sa(&a), &len), 0);
  std::vector<char> big(1 << 16);
  EXPECT_EQ(rsendto(d, big.data(), big.size(), 0, sa(&a), sizeof a), -1);  // more than the path MTU
  EXPECT_EQ(errno, EMSGSIZE);
  sockaddr_in6 six{};
  six.sin6_family = AF_INET6;
  EXPECT_EQ(rsendto(d, b, 1, 0, reinterpret_cast<sockaddr*>(&six), sizeof six), -1);
  EXPECT_EQ(errno, EAFNOSUPPORT);
  EXPECT_EQ(rclose(d), 0);
}

}  // namespace
