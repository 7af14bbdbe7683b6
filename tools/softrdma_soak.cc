// softrdma-soak: a bounded soak test. Two processes connect N RC QPs (default 8) and the client runs, on every
// QP at once, rounds of RDMA WRITE, RDMA READ (of what it wrote), WRITE_WITH_IMM, SEND, SEND_WITH_IMM,
// FETCH_AND_ADD and CMP_AND_SWP at pseudo-random sizes from 1 byte to --max-size, until --ops rounds per QP
// or --seconds have passed. Every byte and every atomic result is checked end to end: the client checks
// READ data and atomic results, the server checks every received message (its opcode, length, immediate
// and bytes) against the sequence it must see on that QP, so a message lost, duplicated, reordered or
// corrupted on its way to the application is an error. Run it under SOFTRDMA_FAULTS (README, Settings) or
// across a lossy network; it prints goodput, retransmissions, the worst completion delay, bytes verified
// and errors, and exits non-zero on any error.
//
//   softrdma-soak [OPTIONS]                   both sides over 127.0.0.1 (forks the server)
//   softrdma-soak server [-d DEV]             wait for one client on every address; prints
//                                             "listening on 0.0.0.0:PORT"
//   softrdma-soak client HOST PORT [OPTIONS]
//
// The client tells the server the number of QPs and the largest size over the TCP side channel
// (include/softrdma/connect.h), then QP numbers, PSNs, GIDs and the server's rkey go both ways.
#include <arpa/inet.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "softrdma/connect.h"
#include "softrdma/softrdma.h"

using namespace softrdma;

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kRecvDepth = 8;                // receive WQEs per QP on the server
constexpr uint32_t kImmSlots = kRecvDepth + 1;    // WRITE_WITH_IMM targets per QP (see ServerLayout)
constexpr uint32_t kMaxQps = 1024;
constexpr uint64_t kMaxMaxSize = 1u << 20;
constexpr uint32_t kRecvKinds = 3;                // WRITE_WITH_IMM, SEND, SEND_WITH_IMM per round
constexpr int kDrainSeconds = 30;                 // after the client is done, how long the server waits

enum Step : uint32_t { kWrite, kRead, kWriteImm, kSend, kSendImm, kFetchAdd, kCmpSwap, kSteps };
constexpr const char* kStepName[kSteps] = {"RDMA_WRITE", "RDMA_READ", "RDMA_WRITE_WITH_IMM", "SEND",
                                           "SEND_WITH_IMM", "ATOMIC_FETCH_AND_ADD", "ATOMIC_CMP_AND_SWP"};

struct Options {
  std::string dev = "sr_lo";
  uint32_t qps = 8;
  uint64_t ops = 2000;  // rounds per QP
  double seconds = 10;
  uint64_t max_size = 64 << 10;
  uint8_t timeout = 12;  // 4.096 us x 2^12 = 16.8 ms
  bool verbose = false;
  bool self_test = false;  // corrupt one SEND's source on purpose: the checks must catch it
};

// What the client tells the server first.
struct Hello {
  uint32_t magic = 0x50414b53;  // "SKAP"
  uint32_t qps;
  uint64_t max_size;
};
// What the client sends when it is done: per QP, how many messages the server must have received.
// The server answers with a Report.
struct Report {
  uint64_t messages = 0, bytes = 0, errors = 0, missing = 0;
  uint64_t counters[kNumCounters] = {};
};

// ---- The sequence both sides derive: sizes, patterns and immediates of round `r`, step `s`, QP `q`. ----

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
uint64_t key(uint32_t q, uint64_t round, uint32_t step) { return mix((uint64_t{q} << 48) ^ (round << 4) ^ step); }

// Log-uniform in [1, max]: small and large messages alike.
uint32_t size_of(uint64_t max, uint32_t q, uint64_t round, uint32_t step) {
  const uint64_t h = key(q, round, step);
  uint32_t bits = 0;
  while ((uint64_t{2} << bits) <= max) ++bits;  // max >= 2^bits
  const uint32_t b = static_cast<uint32_t>(h % (bits + 1));
  const uint64_t n = 1 + ((h >> 8) % (uint64_t{1} << b)) + ((h >> 40) & 1) * ((uint64_t{1} << b) - 1);
  return static_cast<uint32_t>(std::min(n, max));
}
uint32_t imm_of(uint32_t q, uint64_t round, uint32_t step) {
  return static_cast<uint32_t>(key(q, round, step + 100));
}
void fill(uint8_t* p, uint32_t n, uint64_t seed) {
  uint64_t x = seed | 1;
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(p + i, &x, 8);
  }
  x ^= x << 13, x ^= x >> 7, x ^= x << 17;
  for (; i < n; ++i) p[i] = static_cast<uint8_t>(x >> (8 * (i & 7)));
}
// Bytes that differ from fill(seed); `scratch` holds n bytes.
uint64_t mismatches(const uint8_t* p, uint32_t n, uint64_t seed, std::vector<uint8_t>& scratch) {
  fill(scratch.data(), n, seed);
  if (std::memcmp(p, scratch.data(), n) == 0) return 0;
  uint64_t bad = 0;
  for (uint32_t i = 0; i < n; ++i) bad += p[i] != scratch[i];
  return bad;
}


// ---- Server ----

// Per QP: [0, M) WRITE/READ target, kImmSlots x M WRITE_WITH_IMM targets, kRecvDepth x M receive buffers,
// an 8-byte atomic counter (64 bytes). WRITE_WITH_IMM number s of a QP lands in slot s % kImmSlots: the
// client posts it only after number s-1 completed, i.e. after the server took s-1's receive WQE, and the
// server reposts a WQE only after checking a message, so number s - kImmSlots was checked by then.
struct ServerLayout {
  uint64_t m;
  uint64_t per_qp() const { return m * (1 + kImmSlots + kRecvDepth) + 64; }
  uint64_t write_area(uint32_t q) const { return q * per_qp(); }
  uint64_t imm_slot(uint32_t q, uint64_t s) const { return q * per_qp() + m * (1 + s % kImmSlots); }
  uint64_t recv_buf(uint32_t q, uint32_t i) const { return q * per_qp() + m * (1 + kImmSlots + i); }
  uint64_t counter(uint32_t q) const { return q * per_qp() + m * (1 + kImmSlots + kRecvDepth); }
  uint64_t total(uint32_t qps) const { return qps * per_qp(); }
};

struct Common {
  std::unique_ptr<Context> ctx;
  std::unique_ptr<ProtectionDomain> pd;
  std::unique_ptr<CompletionQueue> cq;
  std::vector<std::unique_ptr<QueuePair>> qps;
  std::vector<uint8_t> buf;
  std::unique_ptr<MemoryRegion> mr;
  std::vector<PeerInfo> mine, peer;

  void open(const std::string& dev, uint32_t nqps, uint64_t bytes) {
    ctx = or_exit(Context::open(dev), "open device");
    pd = or_exit(ctx->alloc_pd(), "alloc_pd");
    cq = or_exit(ctx->create_cq(4 * kMaxQps * kRecvDepth), "create_cq");
    buf.assign(bytes, 0);
    mr = or_exit(pd->reg_mr(buf.data(), buf.size(), kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic),
               "reg_mr");
    for (uint32_t q = 0; q < nqps; ++q) {
      QpInit init;
      init.send_cq = init.recv_cq = cq.get();
      init.cap = {16, kRecvDepth, 1, 1, 64};
      qps.push_back(or_exit(pd->create_qp(init), "create_qp"));
      mine.push_back(local_info(*ctx, *qps.back(), mr.get()));
    }
  }
  void exchange_all(int fd) {
    for (auto& m : mine) peer.push_back(or_exit(exchange(fd, m), "exchange"));
  }
  void connect_all(uint8_t timeout) {
    ConnectOptions opt;
    opt.timeout = timeout;
    for (size_t q = 0; q < qps.size(); ++q) or_exit(connect_qp(*ctx, *qps[q], mine[q], peer[q], opt), "connect_qp");
  }
};

void copy_counters(const Counters& k, uint64_t* out) {
  for (uint32_t i = 0; i < kNumCounters; ++i) out[i] = k.get(static_cast<Counter>(i));
}

int server(const Options& o, int lfd, int ready_fd) {
  if (ready_fd >= 0) {
    char c = 1;
    [[maybe_unused]] ssize_t n = write(ready_fd, &c, 1);
    close(ready_fd);
  }
  const int fd = or_exit(accept_tcp(lfd), "accept");
  Hello hello;
  or_exit(recv_all(fd, &hello, sizeof hello), "side channel");
  if (hello.magic != Hello{}.magic || hello.qps == 0 || hello.qps > kMaxQps || hello.max_size == 0 ||
      hello.max_size > kMaxMaxSize)
    exit_with("a client that does not speak soak", EPROTO);
  const ServerLayout L{hello.max_size};
  Common s;
  s.open(o.dev, hello.qps, L.total(hello.qps));
  s.exchange_all(fd);
  // Ready to receive before the client starts: a packet reaching a QP not yet in RTR is lost.
  s.connect_all(o.timeout);
  for (uint32_t q = 0; q < hello.qps; ++q) {
    for (uint32_t i = 0; i < kRecvDepth; ++i) {
      Sge sge = s.mr->sge(L.recv_buf(q, i), static_cast<uint32_t>(L.m));
      or_exit(s.qps[q]->post_recv(RecvWr{uint64_t{q} << 16 | i, std::span(&sge, 1)}), "post_recv");
    }
  }
  char go = 1;
  or_exit(send_all(fd, &go, 1), "side channel");

  // Per QP, the number of the next message it must receive: round = n / 3, kind = n % 3.
  std::vector<uint64_t> next(hello.qps, 0), want;
  std::vector<uint8_t> scratch(L.m);
  Report rep;
  bool client_done = false;
  Clock::time_point drain_deadline{};
  uint32_t polls = 0;
  for (;;) {
    Wc wc[32];
    const int n = s.cq->poll(std::span(wc, 32));
    for (int i = 0; i < n; ++i) {
      const Wc& w = wc[i];
      const uint32_t q = static_cast<uint32_t>(w.wr_id >> 16), slot = w.wr_id & 0xFFFF;
      if (w.status != WcStatus::kSuccess) {
        // A flushed or failed receive: every later one of that QP is flushed too.
        if (rep.errors++ < 10)
          std::fprintf(stderr, "softrdma-soak server: QP %u receive failed: %s\n", q, wc_status_str(w.status));
        continue;
      }
      if (q >= hello.qps || slot >= kRecvDepth) {
        ++rep.errors;
        continue;
      }
      const uint64_t msg = next[q]++;
      const uint64_t round = msg / kRecvKinds;
      const uint32_t step = kWriteImm + static_cast<uint32_t>(msg % kRecvKinds);
      const uint32_t len = size_of(L.m, q, round, step);
      const uint8_t* data = w.opcode == WcOpcode::kRecvRdmaWithImm ? s.buf.data() + L.imm_slot(q, round)
                                                                   : s.buf.data() + L.recv_buf(q, slot);
      const WcOpcode want_op = step == kWriteImm ? WcOpcode::kRecvRdmaWithImm : WcOpcode::kRecv;
      const bool want_imm = step != kSend;
      uint64_t bad = 0;
      if (w.opcode != want_op || w.byte_len != len || ((w.wc_flags & kWcWithImm) != 0) != want_imm ||
          (want_imm && ntohl(w.imm_data) != imm_of(q, round, step))) {
        bad = 1;
      } else {
        bad = mismatches(data, len, key(q, round, step), scratch);
      }
      if (bad) {
        if (rep.errors < 10)
          std::fprintf(stderr,
                       "softrdma-soak server: QP %u message %lu (round %lu, %s): got opcode %u len %u imm 0x%x, "
                       "expected len %u; %lu bad bytes\n",
                       q, (unsigned long)msg, (unsigned long)round, kStepName[step], static_cast<unsigned>(w.opcode),
                       w.byte_len, ntohl(w.imm_data), len, (unsigned long)bad);
        ++rep.errors;
      } else {
        ++rep.messages;
        rep.bytes += len;
      }
      Sge sge = s.mr->sge(L.recv_buf(q, slot), static_cast<uint32_t>(L.m));
      if (!s.qps[q]->post_recv(RecvWr{w.wr_id, std::span(&sge, 1)})) ++rep.errors;
    }
    if (n > 0 || (++polls & 1023) != 0) continue;
    if (!client_done) {
      pollfd pfd{fd, POLLIN, 0};
      if (poll(&pfd, 1, 0) == 1) {
        want.resize(hello.qps);
        or_exit(recv_all(fd, want.data(), want.size() * sizeof want[0]), "side channel");
        client_done = true;
        drain_deadline = Clock::now() + std::chrono::seconds(kDrainSeconds);
      }
      continue;
    }
    bool all = true;
    for (uint32_t q = 0; q < hello.qps; ++q) all &= next[q] >= want[q];
    if (all || Clock::now() > drain_deadline) break;
  }
  for (uint32_t q = 0; q < hello.qps; ++q) {
    if (next[q] != want[q]) {
      std::fprintf(stderr, "softrdma-soak server: QP %u received %lu messages, the client sent %lu\n", q,
                   (unsigned long)next[q], (unsigned long)want[q]);
      rep.missing += next[q] > want[q] ? next[q] - want[q] : want[q] - next[q];
    }
  }
  copy_counters(s.ctx->counters(), rep.counters);
  or_exit(send_all(fd, &rep, sizeof rep), "side channel");
  char bye;
  (void)recv_all(fd, &bye, 1);
  close(fd);
  return rep.errors || rep.missing ? 1 : 0;
}

// ---- Client ----

struct StepStat {
  uint64_t ops = 0, bytes = 0;
  double worst_us = 0, total_us = 0;
};

// Per QP: [0, M) source of WRITE/WRITE_WITH_IMM/SEND, [M, 2M) READ destination, 8 bytes atomic result.
struct QpState {
  uint64_t round = 0;
  uint32_t step = 0;
  uint64_t sent_msgs = 0;  // messages that consume a receive at the server (WRITE_WITH_IMM, SEND, SEND_IMM)
  uint64_t counter = 0;    // what the server's counter holds
  uint64_t expect_old = 0;
  bool cas_swaps = false;
  uint64_t cas_new = 0;
  bool busy = false, stopped = false;
  Clock::time_point posted;
};

int client(const Options& o, const char* host, uint16_t port) {
  const int fd = or_exit(connect_tcp(host, port), "connect");
  Hello hello;
  hello.qps = o.qps;
  hello.max_size = o.max_size;
  or_exit(send_all(fd, &hello, sizeof hello), "side channel");
  const uint64_t M = o.max_size;
  const uint64_t per_qp = 2 * M + 64;
  const ServerLayout R{M};
  Common c;
  c.open(o.dev, o.qps, per_qp * o.qps);
  c.exchange_all(fd);
  c.connect_all(o.timeout);
  char go;
  or_exit(recv_all(fd, &go, 1), "side channel");
  std::printf("softrdma-soak: %s at %s, %u RC QPs, sizes 1 B .. %lu B, up to %lu rounds or %.0f s, timeout %u\n",
              c.ctx->device().name.c_str(), c.ctx->gid().to_string().c_str(), o.qps, (unsigned long)M,
              (unsigned long)o.ops, o.seconds, o.timeout);
  std::fflush(stdout);

  std::vector<QpState> st(o.qps);
  StepStat stat[kSteps];
  std::vector<uint8_t> scratch(M);
  uint64_t errors = 0, verified = 0, atomics = 0;
  auto base = [&](uint32_t q) { return q * per_qp; };

  auto post = [&](uint32_t q) {
    QpState& s = st[q];
    const uint32_t len = size_of(M, q, s.round, s.step);
    SendWr wr;
    wr.wr_id = uint64_t{q} << 8 | s.step;
    wr.send_flags = kSendSignaled;
    Sge sge = c.mr->sge(base(q), len);
    wr.sg_list = std::span(&sge, 1);
    wr.rkey = c.peer[q].rkey;
    const uint64_t raddr = c.peer[q].addr;
    switch (s.step) {
      case kWrite:
        fill(c.buf.data() + base(q), len, key(q, s.round, kWrite));
        wr.opcode = WrOpcode::kRdmaWrite;
        wr.remote_addr = raddr + R.write_area(q);
        break;
      case kRead:  // what the WRITE just put there
        std::memset(c.buf.data() + base(q) + M, 0, size_of(M, q, s.round, kWrite));
        sge = c.mr->sge(base(q) + M, size_of(M, q, s.round, kWrite));
        wr.opcode = WrOpcode::kRdmaRead;
        wr.remote_addr = raddr + R.write_area(q);
        break;
      case kWriteImm:
        fill(c.buf.data() + base(q), len, key(q, s.round, kWriteImm));
        wr.opcode = WrOpcode::kRdmaWriteWithImm;
        wr.remote_addr = raddr + R.imm_slot(q, s.round);
        wr.imm_data = htonl(imm_of(q, s.round, kWriteImm));
        break;
      case kSend:
        fill(c.buf.data() + base(q), len, key(q, s.round, kSend));
        if (o.self_test && q == 0 && s.round == 1) c.buf[base(q) + len / 2] ^= 0x10;
        wr.opcode = WrOpcode::kSend;
        break;
      case kSendImm:
        fill(c.buf.data() + base(q), len, key(q, s.round, kSendImm));
        wr.opcode = WrOpcode::kSendWithImm;
        wr.imm_data = htonl(imm_of(q, s.round, kSendImm));
        break;
      case kFetchAdd:
        sge = c.mr->sge(base(q) + 2 * M, 8);
        wr.opcode = WrOpcode::kAtomicFetchAndAdd;
        wr.remote_addr = raddr + R.counter(q);
        wr.compare_add = key(q, s.round, kFetchAdd) >> 20;
        s.expect_old = s.counter;
        s.counter += wr.compare_add;
        break;
      case kCmpSwap: {
        sge = c.mr->sge(base(q) + 2 * M, 8);
        wr.opcode = WrOpcode::kAtomicCmpAndSwp;
        wr.remote_addr = raddr + R.counter(q);
        s.cas_swaps = s.round % 3 != 2;  // every third compare misses
        wr.compare_add = s.cas_swaps ? s.counter : ~s.counter;
        wr.swap = s.cas_new = key(q, s.round, kCmpSwap);
        s.expect_old = s.counter;
        break;
      }
    }
    s.posted = Clock::now();
    s.busy = true;
    if (auto r = c.qps[q]->post_send(wr); !r) {
      std::fprintf(stderr, "softrdma-soak: QP %u post_send: %s\n", q, std::strerror(r.error()));
      ++errors;
      s.busy = false;
      s.stopped = true;
    }
  };

  const auto t0 = Clock::now();
  const auto stop_at = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
  // A completion that never comes is an error too: give up this long after the last completion.
  const auto stall_limit = std::chrono::seconds(30);
  auto last_progress = t0;
  bool starting = true;
  for (uint32_t q = 0; q < o.qps; ++q) post(q);
  uint32_t busy = o.qps;
  uint32_t polls = 0;
  while (busy > 0) {
    Wc wc[16];
    const int n = c.cq->poll(std::span(wc, 16));
    if (n == 0) {
      if ((++polls & 4095) == 0 && Clock::now() - last_progress > stall_limit) {
        for (uint32_t q = 0; q < o.qps; ++q)
          if (st[q].busy)
            std::fprintf(stderr, "softrdma-soak: QP %u (0x%06x): %s of round %lu never completed\n", q,
                         c.qps[q]->qpn(), kStepName[st[q].step], (unsigned long)st[q].round);
        errors += busy;
        break;
      }
      continue;
    }
    const auto now = Clock::now();
    last_progress = now;
    if (starting && (now >= stop_at)) starting = false;
    for (int i = 0; i < n; ++i) {
      const Wc& w = wc[i];
      const uint32_t q = static_cast<uint32_t>(w.wr_id >> 8), step = w.wr_id & 0xFF;
      if (q >= o.qps || step >= kSteps || !st[q].busy || st[q].step != step) {
        std::fprintf(stderr, "softrdma-soak: unexpected completion wr_id 0x%lx\n", (unsigned long)w.wr_id);
        ++errors;
        continue;
      }
      QpState& s = st[q];
      s.busy = false;
      --busy;
      if (w.status != WcStatus::kSuccess) {
        std::fprintf(stderr, "softrdma-soak: QP %u %s of round %lu failed: %s\n", q, kStepName[step],
                     (unsigned long)s.round, wc_status_str(w.status));
        ++errors;
        s.stopped = true;
        continue;
      }
      const double us = std::chrono::duration<double, std::micro>(now - s.posted).count();
      const uint32_t len = step >= kFetchAdd ? 8 : size_of(M, q, s.round, step == kRead ? kWrite : step);
      StepStat& x = stat[step];
      ++x.ops;
      x.bytes += len;
      x.total_us += us;
      x.worst_us = std::max(x.worst_us, us);
      uint64_t bad = 0;
      if (step == kRead) {
        bad = mismatches(c.buf.data() + base(q) + M, len, key(q, s.round, kWrite), scratch);
        if (!bad) verified += 2 * uint64_t{len};  // the WRITE's bytes and the READ's
      } else if (step == kFetchAdd || step == kCmpSwap) {
        uint64_t old;
        std::memcpy(&old, c.buf.data() + base(q) + 2 * M, 8);
        bad = old != s.expect_old;
        if (step == kCmpSwap && s.cas_swaps) s.counter = s.cas_new;
        if (!bad) ++atomics;
      } else if (step != kWrite) {
        ++s.sent_msgs;
      }
      if (bad) {
        std::fprintf(stderr, "softrdma-soak: QP %u %s of round %lu returned wrong data (%lu bad)\n", q,
                     kStepName[step], (unsigned long)s.round, (unsigned long)bad);
        ++errors;
      }
      if (++s.step == kSteps) {
        s.step = 0;
        ++s.round;
        if (!starting || s.round >= o.ops) s.stopped = true;
      }
      if (!s.stopped) {
        post(q);
        if (s.busy) ++busy;
      }
    }
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();

  // The final value of every counter, read back.
  for (uint32_t q = 0; q < o.qps && errors == 0; ++q) {
    SendWr rd;
    rd.opcode = WrOpcode::kRdmaRead;
    rd.send_flags = kSendSignaled;
    Sge sge = c.mr->sge(base(q) + 2 * M, 8);
    rd.sg_list = std::span(&sge, 1);
    rd.remote_addr = c.peer[q].addr + R.counter(q);
    rd.rkey = c.peer[q].rkey;
    or_exit(c.qps[q]->post_send(rd), "post_send");
    Wc w;
    const auto deadline = Clock::now() + stall_limit;
    int got = 0;
    while ((got = c.cq->poll(std::span(&w, 1))) == 0 && Clock::now() < deadline) {
    }
    uint64_t v = 0;
    std::memcpy(&v, c.buf.data() + base(q) + 2 * M, 8);
    if (got != 1 || w.status != WcStatus::kSuccess || v != st[q].counter) {
      std::fprintf(stderr, "softrdma-soak: QP %u final counter wrong or unread\n", q);
      ++errors;
    } else {
      ++atomics;
    }
  }

  std::vector<uint64_t> want(o.qps);
  for (uint32_t q = 0; q < o.qps; ++q) want[q] = st[q].sent_msgs;
  or_exit(send_all(fd, want.data(), want.size() * sizeof want[0]), "side channel");
  Report rep;
  or_exit(recv_all(fd, &rep, sizeof rep), "side channel");
  char bye = 1;
  (void)send_all(fd, &bye, 1);
  close(fd);

  uint64_t ops = 0, bytes = 0;
  double worst = 0;
  std::printf("%-22s %9s %14s %12s %12s\n", "operation", "ops", "bytes", "avg us", "worst us");
  for (uint32_t i = 0; i < kSteps; ++i) {
    const StepStat& x = stat[i];
    std::printf("%-22s %9lu %14lu %12.1f %12.1f\n", kStepName[i], (unsigned long)x.ops, (unsigned long)x.bytes,
                x.ops ? x.total_us / x.ops : 0.0, x.worst_us);
    ops += x.ops;
    bytes += x.bytes;
    worst = std::max(worst, x.worst_us);
  }
  const Counters& k = c.ctx->counters();
  auto both = [&](Counter ctr) { return k.get(ctr) + rep.counters[static_cast<uint32_t>(ctr)]; };
  auto show = [&](const char* who, auto get) {
    std::printf("%s counters:", who);
    for (uint32_t i = 0; i < kNumCounters; ++i)
      if (const uint64_t v = get(i))
        std::printf(" %.*s=%lu", static_cast<int>(kCounterInfo[i].name.size()), kCounterInfo[i].name.data(),
                    (unsigned long)v);
    std::printf("\n");
  };
  if (o.verbose) {
    show("client", [&](uint32_t i) { return k.get(static_cast<Counter>(i)); });
    show("server", [&](uint32_t i) { return rep.counters[i]; });
  }
  const uint64_t faults = both(Counter::drop_injected) + both(Counter::fault_corrupt) +
                          both(Counter::fault_duplicate) + both(Counter::fault_reorder) +
                          both(Counter::fault_delay);
  const uint64_t all_errors = errors + rep.errors + rep.missing;
  verified += rep.bytes;
  std::printf("soak: ops=%lu seconds=%.2f goodput_MiBps=%.2f retransmits=%lu retry_timeouts=%lu "
              "dup_requests=%lu injected_faults=%lu bad_icrc_drops=%lu worst_completion_ms=%.2f "
              "bytes_verified=%lu atomics_verified=%lu messages_verified=%lu errors=%lu\n",
              (unsigned long)ops, secs, bytes / secs / (1 << 20), (unsigned long)both(Counter::retransmits),
              (unsigned long)both(Counter::retry_timeouts), (unsigned long)both(Counter::dup_requests),
              (unsigned long)faults, (unsigned long)both(Counter::drop_bad_icrc), worst / 1000,
              (unsigned long)verified, (unsigned long)atomics, (unsigned long)rep.messages,
              (unsigned long)all_errors);
  std::printf("soak: %s\n", all_errors == 0 && ops > 0 ? "PASS: every byte and atomic result verified, no errors"
                                                         : "FAIL");
  return all_errors == 0 && ops > 0 ? 0 : 1;
}

constexpr const char* kUsage =
    "usage: softrdma-soak [server | client HOST PORT] [OPTIONS]\n"
    "  (no command)        both sides on this machine, over 127.0.0.1\n"
    "  server              wait for one client on every address; prints \"listening on 0.0.0.0:PORT\"\n"
    "  client HOST PORT    connect to a server and run\n"
    "  -d DEVICE           softrdma device (default sr_lo)\n"
    "  --qps N             RC QPs (default 8, at most 1024)\n"
    "  --ops N             rounds per QP, each round all 7 operations (default 2000)\n"
    "  --seconds S         stop starting rounds after S seconds (default 10)\n"
    "  --max-size BYTES    largest message (default 65536, at most 1048576; k/m suffixes)\n"
    "  --timeout T         the QPs' local ACK timeout, 4.096 us x 2^T (default 12 = 16.8 ms)\n"
    "  -v                  print both sides' non-zero counters\n"
    "  --self-test         flip a bit of one SEND on purpose: the run must then fail (checks the checker)\n"
    "Faults: run under SOFTRDMA_FAULTS (see README, Settings). Exit status 0 only if nothing went wrong.\n";


}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::vector<std::string> args;
  auto bad = [](const char* what, const char* value) {
    std::fprintf(stderr, "softrdma-soak: bad %s '%s'\n%s", what, value, kUsage);
    return 2;
  };
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    uint64_t v = 0;
    if (std::strcmp(argv[i], "-d") == 0 && has_value) {
      o.dev = argv[++i];
    } else if (std::strcmp(argv[i], "--qps") == 0 && has_value) {
      if (!parse_size(argv[++i], &v) || v < 1 || v > kMaxQps) return bad("--qps", argv[i]);
      o.qps = static_cast<uint32_t>(v);
    } else if (std::strcmp(argv[i], "--ops") == 0 && has_value) {
      if (!parse_size(argv[++i], &v) || v < 1) return bad("--ops", argv[i]);
      o.ops = v;
    } else if (std::strcmp(argv[i], "--seconds") == 0 && has_value) {
      char* end = nullptr;
      o.seconds = std::strtod(argv[++i], &end);
      if (*end || !(o.seconds > 0) || o.seconds > 86400) return bad("--seconds", argv[i]);
    } else if (std::strcmp(argv[i], "--max-size") == 0 && has_value) {
      if (!parse_size(argv[++i], &v) || v < 1 || v > kMaxMaxSize) return bad("--max-size", argv[i]);
      o.max_size = v;
    } else if (std::strcmp(argv[i], "--timeout") == 0 && has_value) {
      if (!parse_size(argv[++i], &v) || v < 1 || v > 31) return bad("--timeout", argv[i]);
      o.timeout = static_cast<uint8_t>(v);
    } else if (std::strcmp(argv[i], "-v") == 0) {
      o.verbose = true;
    } else if (std::strcmp(argv[i], "--self-test") == 0) {
      o.self_test = true;
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
