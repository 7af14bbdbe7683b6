// softrdma-demo: two processes on this machine open a softrdma device, connect an RC QP, and run RDMA WRITE,
// WRITE_WITH_IMM, READ, SEND/RECV, SEND_WITH_IMM, FETCH_AND_ADD and CMP_AND_SWP at sizes from 1 byte to
// 8 MiB. Every byte and every atomic result is verified; it prints what moved and how fast.
//
//   softrdma-demo [OPTIONS]                      run both sides over 127.0.0.1 (forks the server)
//   softrdma-demo server [OPTIONS]               wait for a client on every address (INADDR_ANY); prints
//                                                "listening on 0.0.0.0:PORT"
//   softrdma-demo client HOST PORT [OPTIONS]
// OPTIONS: -d DEV (default sr_lo); --max-size N (largest message, default 8 MiB: the sizes are 1, 2, 4, ...
// up to N, and 1000); --atomics N (FETCH_AND_ADD and CMP_AND_SWP each, default 1000); --timeout T (the
// QP's local ACK timeout, 4.096 us x 2^T, default 14 = 67 ms); -v (print each side's non-zero counters).
// The QP numbers, PSNs, GIDs, the buffer's rkey and the server's buffer layout (its --max-size) are exchanged
// over a TCP connection. A server serves any client whose --max-size is not larger than its own.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "softrdma/connect.h"
#include "softrdma/softrdma.h"

using namespace softrdma;

namespace {

constexpr uint64_t kDefaultMaxSize = 8u << 20;
constexpr uint64_t kMaxMaxSize = 1u << 30;
constexpr int kRecvBufs = 4;
constexpr uint64_t kWriteArea = 0;  // WRITE / READ target

// The buffer's layout for a given largest message size M (the same on both sides; the client lays out the
// server's buffer from the server's M, which it learns over the side channel):
//   [0, M)          WRITE / READ target (client: its source)        [M, 2M) client: READ destination
//   [M, 4M)         WRITE_WITH_IMM targets: one place per size, since the server may still be checking an
//                   earlier one when the next one lands (the data of a WRITE_WITH_IMM arrives before its
//                   receive WQE is taken); the sizes add up to less than 2M + 1000 <= 3M
//   [4M, 8M)        receive buffers                                  [2M, 2M+16) client: atomic results
//   [8M, 8M+64)     8-byte atomic target
struct Layout {
  uint64_t max_size;
  uint64_t imm_area() const { return max_size; }
  uint64_t recv_area() const { return 4 * max_size; }
  uint64_t counter() const { return recv_area() + kRecvBufs * max_size; }
  uint64_t buf_size() const { return counter() + 64; }
};
enum Kind : uint32_t { kSendKind = 1, kSendImmKind = 2, kWriteImmKind = 3, kDoneKind = 0xFF };

struct Options {
  std::string dev = "sr_lo";
  uint64_t max_size = kDefaultMaxSize;
  uint64_t atomics = 1000;
  uint8_t timeout = 14;
  bool verbose = false;  // print every non-zero counter of each side's context at the end
};

// 1, 2, 4, ... up to max_size, and 1000 (one size that is not a power of two) in its place. The list for a
// smaller max_size is a prefix of the list for a larger one, so a size's index means the same on both sides.
std::vector<uint32_t> sizes(uint64_t max_size) {
  std::vector<uint32_t> s;
  for (uint64_t n = 1; n <= max_size; n *= 2) {
    if (n == 1024) s.push_back(1000);
    s.push_back(static_cast<uint32_t>(n));
  }
  if (max_size >= 1000 && max_size < 1024) s.push_back(1000);
  return s;
}

// Where the WRITE_WITH_IMM of size index `size_index` lands in a buffer laid out for `layout`.
uint64_t imm_offset(const Layout& layout, uint32_t size_index) {
  const auto sz = sizes(layout.max_size);
  uint64_t off = layout.imm_area();
  for (uint32_t i = 0; i < size_index && i < sz.size(); ++i) off += sz[i];
  return off;
}

std::string size_str(uint64_t n) {
  if (n >= (1u << 20) && n % (1u << 20) == 0) return std::to_string(n >> 20) + " MiB";
  if (n >= 1024 && n % 1024 == 0) return std::to_string(n >> 10) + " KiB";
  return std::to_string(n) + " B";
}

uint8_t pattern(uint32_t seed, uint64_t i) { return static_cast<uint8_t>((i * 131 + seed * 7 + (i >> 9)) & 0xFF); }
void fill(uint8_t* p, uint64_t n, uint32_t seed) {
  for (uint64_t i = 0; i < n; ++i) p[i] = pattern(seed, i);
}
uint64_t mismatches(const uint8_t* p, uint64_t n, uint32_t seed) {
  uint64_t bad = 0;
  for (uint64_t i = 0; i < n; ++i) bad += p[i] != pattern(seed, i);
  return bad;
}

// The registered buffer, page-aligned as perftest's are (so that SOFTRDMA_SHARE_MR=1 can share all of it).
struct PageBuffer {
  std::unique_ptr<uint8_t, decltype(&std::free)> p{nullptr, &std::free};
  size_t n = 0;
  void assign(size_t size) {
    p.reset(static_cast<uint8_t*>(std::aligned_alloc(4096, (size + 4095) & ~size_t{4095})));
    if (!p) {
      std::fprintf(stderr, "softrdma-demo: out of memory\n");
      std::exit(1);
    }
    n = size;
    std::memset(p.get(), 0, n);
  }
  uint8_t* data() const { return p.get(); }
  size_t size() const { return n; }
};

// Everything one side owns.
struct Side {
  std::unique_ptr<Context> ctx;
  std::unique_ptr<ProtectionDomain> pd;
  std::unique_ptr<CompletionQueue> cq;
  std::unique_ptr<QueuePair> qp;
  PageBuffer buf;
  std::unique_ptr<MemoryRegion> mr;
  PeerInfo mine;
  Layout layout;
  uint8_t timeout;

  explicit Side(const Options& o) : layout{o.max_size}, timeout(o.timeout) {
    ctx = or_exit(Context::open(o.dev), "open device");
    pd = or_exit(ctx->alloc_pd(), "alloc_pd");
    cq = or_exit(ctx->create_cq(1024), "create_cq");
    QpInit init;
    init.send_cq = init.recv_cq = cq.get();
    init.cap = {64, 64, 1, 1, 64};
    qp = or_exit(pd->create_qp(init), "create_qp");
    buf.assign(layout.buf_size());
    mr = or_exit(pd->reg_mr(buf.data(), buf.size(), kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic),
               "reg_mr");
    mine = local_info(*ctx, *qp, mr.get());
    mine.user = layout.max_size;
  }

  void connect(const PeerInfo& peer) {
    ConnectOptions c;
    c.timeout = timeout;
    or_exit(connect_qp(*ctx, *qp, mine, peer, c), "connect QP");
  }

  Wc wait() {
    Wc wc;
    while (cq->poll(std::span(&wc, 1)) == 0) {
    }
    if (wc.status != WcStatus::kSuccess) {
      std::fprintf(stderr, "softrdma-demo: completion wr_id %lu failed: %s\n", static_cast<unsigned long>(wc.wr_id),
                   wc_status_str(wc.status));
      std::exit(1);
    }
    return wc;
  }

  void post_recv(int slot) {
    Sge s = mr->sge(layout.recv_area() + slot * layout.max_size, static_cast<uint32_t>(layout.max_size));
    or_exit(qp->post_recv(RecvWr{static_cast<uint64_t>(slot), std::span(&s, 1)}), "post_recv");
  }
};

// Listens on 127.0.0.1 (both sides in this process) or on every address (`softrdma-demo server`).
void print_counters(const char* who, const Counters& k) {
  std::printf("%s counters:", who);
  for (uint32_t i = 0; i < kNumCounters; ++i)
    if (const uint64_t v = k.get(static_cast<Counter>(i)))
      std::printf(" %.*s=%lu", static_cast<int>(kCounterInfo[i].name.size()), kCounterInfo[i].name.data(),
                  static_cast<unsigned long>(v));
  std::printf("\n");
  std::fflush(stdout);
}

// The server checks every message that reaches it and reports the totals when the client says done.
int server(const Options& o, int lfd, int ready_fd) {
  Side s(o);
  if (ready_fd >= 0) {
    char c = 1;
    [[maybe_unused]] ssize_t n = write(ready_fd, &c, 1);
    close(ready_fd);
  }
  const int fd = or_exit(accept_tcp(lfd), "accept");
  PeerInfo peer;
  or_exit(recv_all(fd, &peer, sizeof peer), "side channel");
  const PeerInfo& mine = s.mine;
  if (peer.user > s.layout.max_size) {  // the client says so too, and gives up
    or_exit(send_all(fd, &mine, sizeof mine), "side channel");
    std::fprintf(stderr, "softrdma-demo: the client's --max-size %lu is larger than this server's %lu\n",
                 static_cast<unsigned long>(peer.user), static_cast<unsigned long>(s.layout.max_size));
    return 1;
  }
  // Ready to receive before the client learns this QP's number: otherwise the client's first packets can
  // reach a QP still in RESET/INIT, which drops them, and each such loss costs a local ACK timeout.
  s.connect(peer);
  for (int i = 0; i < kRecvBufs; ++i) s.post_recv(i);
  or_exit(send_all(fd, &mine, sizeof mine), "side channel");
  if (ready_fd < 0) {  // a server of its own (when both sides run here, the client's line says it all)
    std::printf("softrdma-demo server: %s, local QP 0x%06x <- remote QP 0x%06x\n", s.ctx->device().name.c_str(),
                mine.qpn, peer.qpn);
    std::fflush(stdout);
  }
  const auto sz = sizes(s.layout.max_size);
  uint64_t messages = 0, bytes = 0, bad = 0;
  for (;;) {
    Wc wc = s.wait();
    const uint32_t imm = ntohl(wc.imm_data);
    const uint32_t kind = (wc.wc_flags & kWcWithImm) ? imm >> 24 : kSendKind;
    if (kind == kDoneKind) break;
    const uint32_t size_index = (wc.wc_flags & kWcWithImm) ? imm & 0xFFFF : 0;
    const uint8_t* data = wc.opcode == WcOpcode::kRecvRdmaWithImm
                              ? s.buf.data() + imm_offset(s.layout, size_index)
                              : s.buf.data() + s.layout.recv_area() + wc.wr_id * s.layout.max_size;
    // A plain SEND carries no index: its length tells which size it is.
    uint32_t seed = 0;
    if (kind == kSendKind) {
      for (size_t i = 0; i < sz.size(); ++i)
        if (sz[i] == wc.byte_len) seed = kSendKind * 100 + static_cast<uint32_t>(i);
    } else {
      seed = kind * 100 + size_index;
      if (size_index >= sz.size() || sz[size_index] != wc.byte_len) ++bad;
    }
    bad += mismatches(data, wc.byte_len, seed);
    ++messages;
    bytes += wc.byte_len;
    if (wc.opcode == WcOpcode::kRecv || wc.opcode == WcOpcode::kRecvRdmaWithImm) s.post_recv(static_cast<int>(wc.wr_id));
  }
  const uint64_t report[3] = {messages, bytes, bad};
  or_exit(send_all(fd, report, sizeof report), "side channel");
  char c;
  or_exit(recv_all(fd, &c, 1), "side channel");  // the client has read everything back
  close(fd);
  if (o.verbose) print_counters("server", s.ctx->counters());
  return bad ? 1 : 0;
}

struct Stat {
  const char* name;
  uint64_t ops = 0, bytes = 0;
  double secs = 0;
};

int client(const Options& o, const char* host, uint16_t port) {
  Side s(o);
  const int fd = or_exit(connect_tcp(host, port), "connect to the server");
  const PeerInfo& mine = s.mine;
  const PeerInfo peer = or_exit(exchange(fd, mine), "side channel");
  if (peer.user < s.layout.max_size) {
    std::fprintf(stderr, "softrdma-demo: --max-size %lu is larger than the server's %lu\n",
                 static_cast<unsigned long>(s.layout.max_size), static_cast<unsigned long>(peer.user));
    return 1;
  }
  const Layout remote{peer.user};
  const uint64_t max_size = s.layout.max_size;
  s.connect(peer);
  std::printf("softrdma-demo: %s, local QP 0x%06x -> remote QP 0x%06x at %s, path MTU %u\n",
              s.ctx->device().name.c_str(), mine.qpn, peer.qpn, s.ctx->gid().to_string().c_str(),
              mtu_bytes(s.ctx->device().active_mtu));
  std::fflush(stdout);  // a watcher of a run that hangs sees which QPs

  Stat st[] = {{"RDMA_WRITE"}, {"RDMA_READ"}, {"RDMA_WRITE_WITH_IMM"}, {"SEND"}, {"SEND_WITH_IMM"},
               {"ATOMIC_FETCH_AND_ADD"}, {"ATOMIC_CMP_AND_SWP"}};
  auto timed = [&s](Stat& stat, const SendWr& wr, uint64_t len) {
    const auto t0 = std::chrono::steady_clock::now();
    or_exit(s.qp->post_send(wr), "post_send");
    s.wait();
    stat.secs += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++stat.ops;
    stat.bytes += len;
  };
  uint8_t* local = s.buf.data();
  uint8_t* back = s.buf.data() + max_size;
  uint64_t bad = 0;
  const auto sz = sizes(max_size);
  for (size_t i = 0; i < sz.size(); ++i) {
    const uint32_t n = sz[i];
    const uint32_t idx = static_cast<uint32_t>(i);
    SendWr wr;
    wr.send_flags = kSendSignaled;
    Sge sge = s.mr->sge(0, n);
    wr.sg_list = std::span(&sge, 1);

    // WRITE, then READ it back into another buffer: both directions verified here.
    fill(local, n, 1000 + idx);
    wr.opcode = WrOpcode::kRdmaWrite;
    wr.remote_addr = peer.addr + kWriteArea;
    wr.rkey = peer.rkey;
    timed(st[0], wr, n);
    std::memset(back, 0, n);
    Sge rsge = s.mr->sge(max_size, n);
    wr.sg_list = std::span(&rsge, 1);
    wr.opcode = WrOpcode::kRdmaRead;
    timed(st[1], wr, n);
    bad += mismatches(back, n, 1000 + idx);
    wr.sg_list = std::span(&sge, 1);

    // WRITE_WITH_IMM, SEND, SEND_WITH_IMM: the server checks these.
    fill(local, n, kWriteImmKind * 100 + idx);
    wr.opcode = WrOpcode::kRdmaWriteWithImm;
    wr.remote_addr = peer.addr + imm_offset(remote, idx);
    wr.imm_data = htonl(kWriteImmKind << 24 | idx);
    timed(st[2], wr, n);
    fill(local, n, kSendKind * 100 + idx);
    wr.opcode = WrOpcode::kSend;
    timed(st[3], wr, n);
    fill(local, n, kSendImmKind * 100 + idx);
    wr.opcode = WrOpcode::kSendWithImm;
    wr.imm_data = htonl(kSendImmKind << 24 | idx);
    timed(st[4], wr, n);
  }

  // Atomics on the server's counter: every returned value is checked against the expected sequence.
  uint64_t expect = 0;
  Sge asge = s.mr->sge(2 * max_size, 8);
  auto* result = reinterpret_cast<uint64_t*>(s.buf.data() + 2 * max_size);
  SendWr aw;
  aw.send_flags = kSendSignaled;
  aw.sg_list = std::span(&asge, 1);
  aw.remote_addr = peer.addr + remote.counter();
  aw.rkey = peer.rkey;
  for (uint64_t k = 1; k <= o.atomics; ++k) {
    aw.opcode = WrOpcode::kAtomicFetchAndAdd;
    aw.compare_add = k;
    timed(st[5], aw, 8);
    bad += *result != expect;
    expect += k;
    aw.opcode = WrOpcode::kAtomicCmpAndSwp;
    aw.compare_add = (k % 3 == 0) ? expect + 1 : expect;  // every third compare misses: no swap
    aw.swap = expect ^ 0x5555;
    timed(st[6], aw, 8);
    bad += *result != expect;
    if (k % 3 != 0) expect ^= 0x5555;
  }
  // The final value, read back.
  Sge csge = s.mr->sge(2 * max_size + 8, 8);
  SendWr rd;
  rd.opcode = WrOpcode::kRdmaRead;
  rd.send_flags = kSendSignaled;
  rd.sg_list = std::span(&csge, 1);
  rd.remote_addr = peer.addr + remote.counter();
  rd.rkey = peer.rkey;
  or_exit(s.qp->post_send(rd), "post_send");
  s.wait();
  bad += result[1] != expect;

  SendWr done;
  done.opcode = WrOpcode::kSendWithImm;
  done.send_flags = kSendSignaled;
  done.imm_data = htonl(uint32_t{kDoneKind} << 24);
  or_exit(s.qp->post_send(done), "post_send");
  s.wait();
  uint64_t report[3];
  or_exit(recv_all(fd, report, sizeof report), "side channel");
  char c = 1;
  or_exit(send_all(fd, &c, 1), "side channel");
  close(fd);

  std::printf("%-22s %8s %14s %10s %12s %10s\n", "operation", "ops", "bytes", "seconds", "MiB/s", "us/op");
  for (const Stat& x : st)
    std::printf("%-22s %8lu %14lu %10.3f %12.1f %10.1f\n", x.name, static_cast<unsigned long>(x.ops),
                static_cast<unsigned long>(x.bytes), x.secs, x.bytes / x.secs / (1 << 20), x.secs * 1e6 / x.ops);
  std::printf("sizes 1 B .. %s; client verified %s; server verified %lu messages (%lu bytes): %s\n",
              size_str(max_size).c_str(), bad ? "MISMATCHES" : "every byte and atomic result", static_cast<unsigned long>(report[0]),
              static_cast<unsigned long>(report[1]), report[2] ? "MISMATCHES" : "all correct");
  Counters& k = s.ctx->counters();
  std::printf("client counters: %lu packets sent, %lu received, %lu retransmitted, %lu operations one-sided "
              "(same host, no packet; %lu through shared pages)\n",
              static_cast<unsigned long>(k.get(Counter::tx_packets)),
              static_cast<unsigned long>(k.get(Counter::rx_packets)),
              static_cast<unsigned long>(k.get(Counter::retransmits)),
              static_cast<unsigned long>(k.get(Counter::direct_ops)),
              static_cast<unsigned long>(k.get(Counter::direct_shared_ops)));
  if (o.verbose) print_counters("client", k);
  return bad || report[2] ? 1 : 0;
}

}  // namespace

constexpr const char* kUsage =
    "usage: softrdma-demo [server | client HOST PORT] [-d DEVICE] [--max-size BYTES] [--atomics N] [--timeout T] [-v]\n"
    "  (no command)        both sides on this machine, over 127.0.0.1\n"
    "  server              wait for one client on every address; prints \"listening on 0.0.0.0:PORT\"\n"
    "  client HOST PORT    connect to a server\n"
    "  -d DEVICE           softrdma device (default sr_lo; see `softrdma devices`)\n"
    "  --max-size BYTES    largest message (default 8388608): sizes 1, 2, 4, ... up to it, and 1000; a suffix\n"
    "                      k or m multiplies by 1024 or 1048576\n"
    "  --atomics N         FETCH_AND_ADD and CMP_AND_SWP operations, N of each (default 1000)\n"
    "  --timeout T         the QP's local ACK timeout, 4.096 us x 2^T (default 14 = 67 ms; 1..31)\n"
    "  -v, --verbose       print every non-zero counter of each side's context at the end\n";


int main(int argc, char** argv) {
  Options o;
  std::vector<std::string> args;
  auto usage_error = [](const char* what, const char* value) {
    std::fprintf(stderr, "softrdma-demo: bad %s '%s'\n%s", what, value, kUsage);
    return 2;
  };
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    uint64_t v = 0;
    if (std::strcmp(argv[i], "-d") == 0 && has_value) {
      o.dev = argv[++i];
    } else if (std::strcmp(argv[i], "--max-size") == 0 && has_value) {
      if (!parse_size(argv[++i], &v) || v < 1 || v > kMaxMaxSize) return usage_error("--max-size", argv[i]);
      o.max_size = v;
    } else if (std::strcmp(argv[i], "--atomics") == 0 && has_value) {
      if (!parse_size(argv[++i], &v) || v > 100'000'000) return usage_error("--atomics", argv[i]);
      o.atomics = v;
    } else if (std::strcmp(argv[i], "--timeout") == 0 && has_value) {
      if (!parse_size(argv[++i], &v) || v < 1 || v > 31) return usage_error("--timeout", argv[i]);
      o.timeout = static_cast<uint8_t>(v);
    } else if (std::strcmp(argv[i], "-v") == 0 || std::strcmp(argv[i], "--verbose") == 0) {
      o.verbose = true;
    } else if (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0) {
      std::printf("%s", kUsage);
      return 0;
    } else {
      args.push_back(argv[i]);
    }
  }
  return run_sides(
      args, kUsage, [&o](int lfd, int ready_fd) { return server(o, lfd, ready_fd); },
      [&o](const char* host, uint16_t port) { return client(o, host, port); });
}
