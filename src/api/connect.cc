#include "softrdma/connect.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <random>

namespace softrdma {

void exit_with(const char* what, int err) {
  std::fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what, std::strerror(err));
  std::exit(1);
}

PeerInfo local_info(const Context& ctx, const QueuePair& qp, const MemoryRegion* mr) {
  PeerInfo i;
  i.qpn = qp.qpn();
  i.psn = std::random_device{}() & 0xFFFFFF;
  std::memcpy(i.gid, ctx.gid().raw.data(), 16);
  if (mr) {
    i.addr = reinterpret_cast<uint64_t>(mr->addr());
    i.rkey = mr->rkey();
  }
  i.mtu = mtu_bytes(ctx.device().active_mtu);
  return i;
}

Result<int> listen_tcp(const char* addr, uint16_t* port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::unexpected(errno);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(*port);
  if (inet_pton(AF_INET, addr, &a.sin_addr) != 1) {
    close(fd);
    return std::unexpected(EINVAL);
  }
  socklen_t len = sizeof a;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) || listen(fd, 8) ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len)) {
    const int err = errno;
    close(fd);
    return std::unexpected(err);
  }
  *port = ntohs(a.sin_port);
  return fd;
}

Result<int> accept_tcp(int listen_fd) {
  const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return std::unexpected(errno);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

Result<int> connect_tcp(const char* host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string p = std::to_string(port);
  if (getaddrinfo(host, p.c_str(), &hints, &res) != 0) return std::unexpected(EHOSTUNREACH);
  int err = ECONNREFUSED;
  for (addrinfo* r = res; r; r = r->ai_next) {
    const int fd = socket(r->ai_family, r->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    if (connect(fd, r->ai_addr, r->ai_addrlen) == 0) {
      freeaddrinfo(res);
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return fd;
    }
    err = errno;
    close(fd);
  }
  freeaddrinfo(res);
  return std::unexpected(err);
}

Result<void> send_all(int fd, const void* p, size_t n) {
  auto* b = static_cast<const uint8_t*>(p);
  while (n) {
    const ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return std::unexpected(k < 0 ? errno : EPIPE);
    b += k;
    n -= static_cast<size_t>(k);
  }
  return {};
}

Result<void> recv_all(int fd, void* p, size_t n) {
  auto* b = static_cast<uint8_t*>(p);
  while (n) {
    const ssize_t k = recv(fd, b, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return std::unexpected(k < 0 ? errno : ECONNRESET);
    b += k;
    n -= static_cast<size_t>(k);
  }
  return {};
}

Result<PeerInfo> exchange(int fd, const PeerInfo& mine) {
  if (auto r = send_all(fd, &mine, sizeof mine); !r) return std::unexpected(r.error());
  PeerInfo peer;
  if (auto r = recv_all(fd, &peer, sizeof peer); !r) return std::unexpected(r.error());
  return peer;
}

namespace {
Mtu mtu_enum(uint32_t bytes) {
  Mtu m = Mtu::k256;
  for (Mtu c : {Mtu::k512, Mtu::k1024, Mtu::k2048, Mtu::k4096})
    if (mtu_bytes(c) <= bytes) m = c;
  return m;
}
}  // namespace

Result<void> connect_qp(const Context& ctx, QueuePair& qp, const PeerInfo& mine, const PeerInfo& peer,
                        const ConnectOptions& opt) {
  const bool rc = qp.core()->type() == QpType::kRc;
  QpAttr a;
  a.qp_state = QpState::kInit;
  a.qp_access_flags = opt.access;
  if (auto r = qp.modify(a, kQpState | kQpPkeyIndex | kQpPort | kQpAccessFlags); !r) return r;
  a.qp_state = QpState::kRtr;
  a.path_mtu = mtu_enum(std::min<uint32_t>({mine.mtu ? mine.mtu : 4096u, peer.mtu ? peer.mtu : 4096u,
                                  mtu_bytes(ctx.device().active_mtu)}));
  a.dest_qp_num = peer.qpn;
  a.rq_psn = peer.psn;
  a.max_dest_rd_atomic = opt.rd_atomic;
  a.min_rnr_timer = opt.min_rnr_timer;
  std::memcpy(a.ah_attr.dgid.raw.data(), peer.gid, 16);
  uint32_t mask = kQpState | kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn;
  if (rc) mask |= kQpMaxDestRdAtomic | kQpMinRnrTimer;
  if (auto r = qp.modify(a, mask); !r) return r;
  a.qp_state = QpState::kRts;
  a.sq_psn = mine.psn;
  a.timeout = opt.timeout;
  a.retry_cnt = opt.retry_cnt;
  a.rnr_retry = opt.rnr_retry;
  a.max_rd_atomic = opt.rd_atomic;
  mask = kQpState | kQpSqPsn;
  if (rc) mask |= kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpMaxQpRdAtomic;
  return qp.modify(a, mask);
}

bool parse_size(const char* text, uint64_t* out) {
  char* end = nullptr;
  errno = 0;
  if (*text < '0' || *text > '9') return false;
  unsigned long long v = std::strtoull(text, &end, 10);
  if (errno) return false;
  if (*end == 'k' || *end == 'K') {
    v <<= 10;
    ++end;
  } else if (*end == 'm' || *end == 'M') {
    v <<= 20;
    ++end;
  }
  if (*end) return false;
  *out = v;
  return true;
}

int run_sides(const std::vector<std::string>& args, const char* usage,
              const std::function<int(int listen_fd, int ready_fd)>& server,
              const std::function<int(const char* host, uint16_t port)>& client) {
  if (args.size() == 1 && args[0] == "server") {
    uint16_t port = 0;
    const int lfd = or_exit(listen_tcp("0.0.0.0", &port), "listen");
    std::printf("listening on 0.0.0.0:%u\n", port);
    std::fflush(stdout);
    return server(lfd, -1);
  }
  if (args.size() == 3 && args[0] == "client") {
    uint64_t port = 0;
    if (!parse_size(args[2].c_str(), &port) || port < 1 || port > 65535) {
      std::fprintf(stderr, "%s: bad port '%s'\n%s", program_invocation_short_name, args[2].c_str(), usage);
      return 2;
    }
    return client(args[1].c_str(), static_cast<uint16_t>(port));
  }
  if (!args.empty()) {
    std::fprintf(stderr, "%s", usage);
    return 2;
  }
  // Both sides: the server in a child process, the client once the server can accept.
  uint16_t port = 0;
  const int lfd = or_exit(listen_tcp("127.0.0.1", &port), "listen");
  int ready[2];
  if (pipe(ready)) exit_with("pipe", errno);
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) exit_with("fork", errno);
  if (pid == 0) {
    close(ready[0]);
    _exit(server(lfd, ready[1]));
  }
  close(ready[1]);
  char c;
  [[maybe_unused]] ssize_t n = read(ready[0], &c, 1);
  close(ready[0]);
  close(lfd);
  const int rc = client("127.0.0.1", port);
  int status = 0;
  waitpid(pid, &status, 0);
  const bool server_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (!server_ok) std::fprintf(stderr, "%s: the server failed\n", program_invocation_short_name);
  return rc == 0 && server_ok ? 0 : 1;
}

}  // namespace softrdma
