// rc-bench: RC WRITE bandwidth (64 KiB, 1 MiB) and 8-byte WRITE ping-pong latency between two processes
// on this machine over softrdma, printed beside qperf's tcp_bw and tcp_lat measured in the same run.
//
//   rc-bench [-d DEV] [--seconds S] [--no-qperf]
// Latency is half the round trip (as ib_write_lat and qperf's tcp_lat report it). Bandwidth is in
// 10^9 bytes per second (qperf's GB/sec) and MiB/s.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "softrdma/connect.h"
#include "softrdma/softrdma.h"

using namespace softrdma;
using Clock = std::chrono::steady_clock;

namespace {

constexpr uint64_t kBuf = 4u << 20;

struct Side {
  std::unique_ptr<Context> ctx;
  std::unique_ptr<ProtectionDomain> pd;
  std::unique_ptr<CompletionQueue> cq;
  std::unique_ptr<QueuePair> qp;
  std::vector<uint8_t> buf;
  std::unique_ptr<MemoryRegion> mr;
  PeerInfo mine, peer;

  Side(const std::string& dev, int fd) {
    ctx = or_exit(Context::open(dev), "open device");
    pd = or_exit(ctx->alloc_pd(), "alloc_pd");
    cq = or_exit(ctx->create_cq(1024), "create_cq");
    QpInit init;
    init.send_cq = init.recv_cq = cq.get();
    init.cap = {256, 16, 1, 1, 64};
    qp = or_exit(pd->create_qp(init), "create_qp");
    buf.assign(kBuf, 0);
    mr = or_exit(pd->reg_mr(buf.data(), buf.size(), kLocalWrite | kRemoteWrite | kRemoteRead), "reg_mr");
    mine = local_info(*ctx, *qp, mr.get());
    peer = or_exit(exchange(fd, mine), "exchange");
    or_exit(connect_qp(*ctx, *qp, mine, peer), "connect");
  }

  int poll(Wc* wc, int n) {
    const int k = cq->poll(std::span(wc, n));
    for (int i = 0; i < k; ++i)
      if (wc[i].status != WcStatus::kSuccess) {
        std::fprintf(stderr, "rc-bench: completion failed: %s\n", wc_status_str(wc[i].status));
        std::exit(1);
      }
    return k;
  }

  SendWr write(uint64_t off, uint32_t len, uint64_t remote_off, Sge* sge, bool signaled) {
    *sge = mr->sge(off, len);
    SendWr wr;
    wr.opcode = WrOpcode::kRdmaWrite;
    wr.send_flags = signaled ? uint32_t{kSendSignaled} : 0u;
    wr.sg_list = std::span(sge, 1);
    wr.remote_addr = peer.addr + remote_off;
    wr.rkey = peer.rkey;
    return wr;
  }
};

// Keeps `depth` WRITEs of `size` in flight for `seconds`; returns bytes per second.
double write_bw(Side& s, uint32_t size, double seconds) {
  const int depth = 64, signal_every = 16;
  Sge sge;
  uint64_t posted = 0, completed = 0;
  Wc wc[32];
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::duration<double>(seconds);
  bool stop = false;
  while (!stop || completed < posted) {
    while (!stop && posted - completed < uint64_t(depth)) {
      const bool sig = (posted + 1) % signal_every == 0;
      or_exit(s.qp->post_send(s.write(0, size, 0, &sge, sig)), "post_send");
      ++posted;
      if (posted % signal_every == 0 && Clock::now() >= end) stop = true;
    }
    const int n = s.poll(wc, 32);
    completed += uint64_t(n) * signal_every;
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  return double(posted) * size / secs;
}

// ib_write_lat's scheme: each side spins on the last byte of its buffer and answers with a WRITE.
std::vector<double> pingpong(Side& s, bool client, int iters) {
  std::vector<double> half_rtt_us;
  volatile uint8_t* mine = s.buf.data() + 64;
  Sge sge;
  Wc wc[8];
  for (int i = 1; i <= iters; ++i) {
    const uint8_t v = static_cast<uint8_t>(i);
    const auto t0 = Clock::now();
    if (client) {
      s.buf[7] = v;
      or_exit(s.qp->post_send(s.write(0, 8, 64 - 7, &sge, i % 64 == 0)), "post_send");
      while (*mine != v) s.poll(wc, 8);  // polling the CQ also runs softrdma's receive path
      half_rtt_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / 2);
    } else {
      while (*mine != v) s.poll(wc, 8);
      s.buf[7] = v;
      or_exit(s.qp->post_send(s.write(0, 8, 64 - 7, &sge, i % 64 == 0)), "post_send");
    }
    s.poll(wc, 8);
  }
  return half_rtt_us;
}

int server(const std::string& dev, int lfd) {
  int fd = or_exit(accept_tcp(lfd), "accept");
  Side s(dev, fd);
  int iters;
  or_exit(recv_all(fd, &iters, sizeof iters), "side channel");
  pingpong(s, false, iters);
  char c;
  or_exit(recv_all(fd, &c, 1), "side channel");
  return 0;
}

// qperf's figure for one test, in its own units (GB/sec or us), or a negative value.
double qperf(const char* args) {
  std::string cmd = std::string("qperf 127.0.0.1 ") + args + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  char line[256];
  double v = -1;
  while (std::fgets(line, sizeof line, p)) {
    char unit[32];
    if (std::sscanf(line, " %*[a-z] = %lf %31s", &v, unit) == 2) {
      if (std::strncmp(unit, "MB", 2) == 0) v /= 1000;
      if (std::strncmp(unit, "ms", 2) == 0) v *= 1000;
    }
  }
  pclose(p);
  return v;
}

struct Figures {
  double bw64k = 0, bw1m = 0, lat_avg = 0, lat_med = 0, lat_p90 = 0, lat_p99 = 0, lat_max = 0;
  double q64k = -1, q1m = -1, qlat = -1;
};

// One round: softrdma's figures (a fresh pair of processes), then qperf's on the same loopback.
Figures measure(const std::string& dev, double seconds, bool latency_only, bool with_qperf, int iters) {
  Figures f;
  uint16_t port = 0;
  int lfd = or_exit(listen_tcp("127.0.0.1", &port), "listen");
  const pid_t pid = fork();
  if (pid == 0) _exit(server(dev, lfd));
  close(lfd);
  int fd = or_exit(connect_tcp("127.0.0.1", port), "connect");
  {
    Side s(dev, fd);
    f.bw64k = latency_only ? 0 : write_bw(s, 65536, seconds) / 1e9;
    f.bw1m = latency_only ? 0 : write_bw(s, 1 << 20, seconds) / 1e9;
    or_exit(send_all(fd, &iters, sizeof iters), "side channel");
    auto lat = pingpong(s, true, iters);
    std::sort(lat.begin(), lat.end());
    f.lat_med = lat[lat.size() / 2];
    f.lat_p90 = lat[lat.size() * 9 / 10];
    f.lat_p99 = lat[lat.size() * 99 / 100];
    f.lat_max = lat.back();
    double sum = 0;
    for (double x : lat) sum += x;
    f.lat_avg = sum / lat.size();
    char c = 1;
    or_exit(send_all(fd, &c, 1), "side channel");
  }
  close(fd);
  waitpid(pid, nullptr, 0);
  if (with_qperf) {
    const pid_t q = fork();
    if (q == 0) {
      execlp("qperf", "qperf", static_cast<char*>(nullptr));
      _exit(127);
    }
    usleep(300000);
    f.q64k = qperf("-m 64K tcp_bw");
    f.q1m = qperf("-m 1M tcp_bw");
    f.qlat = qperf("-m 8 tcp_lat");
    kill(q, SIGTERM);
    waitpid(q, nullptr, 0);
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dev = "sr_lo";
  double seconds = 2;
  bool with_qperf = true;
  bool latency_only = false;
  int runs = 3;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "-d") && i + 1 < argc) dev = argv[++i];
    else if (!std::strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--runs") && i + 1 < argc) runs = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--no-qperf")) with_qperf = false;
    else if (!std::strcmp(argv[i], "--latency-only")) latency_only = true;
    else {
      std::fprintf(stderr,
                   "usage: rc-bench [-d DEV] [--seconds S] [--runs N] [--no-qperf] [--latency-only]\n");
      return 2;
    }
  }
  const int iters = std::getenv("RC_BENCH_ITERS") ? std::atoi(std::getenv("RC_BENCH_ITERS")) : 20000;
  std::vector<Figures> all;
  for (int r = 0; r < runs; ++r) all.push_back(measure(dev, seconds, latency_only, with_qperf, iters));

  // Each figure: the median of the runs, with their min and max.
  struct Stat {
    double med, min, max;
  };
  auto stat = [&all](double Figures::*field) {
    std::vector<double> v;
    for (const Figures& f : all) v.push_back(f.*field);
    std::sort(v.begin(), v.end());
    return Stat{v[v.size() / 2], v.front(), v.back()};
  };
  std::printf("rc-bench: %d run(s), each figure the median [min - max]; softrdma on %s, qperf over TCP on 127.0.0.1\n",
              runs, dev.c_str());
  std::printf("%-40s %24s %24s %7s\n", "test (2 processes on this machine)", "softrdma", "qperf tcp", "ratio");
  auto row = [&](const char* name, double Figures::*ours, double Figures::*theirs) {
    const Stat a = stat(ours);
    char x[64], y[64] = "n/a";
    std::snprintf(x, sizeof x, "%.3f [%.3f - %.3f]", a.med, a.min, a.max);
    double ratio = 0;
    if (theirs && with_qperf) {
      const Stat b = stat(theirs);
      std::snprintf(y, sizeof y, "%.3f [%.3f - %.3f]", b.med, b.min, b.max);
      ratio = b.med > 0 ? a.med / b.med : 0;
    }
    if (ratio > 0)
      std::printf("%-40s %24s %24s %7.2f\n", name, x, y, ratio);
    else
      std::printf("%-40s %24s %24s\n", name, x, y);
  };
  if (!latency_only) {
    row("RC WRITE bw 64 KiB (GB/s = 10^9 B/s)", &Figures::bw64k, &Figures::q64k);
    row("RC WRITE bw 1 MiB (GB/s = 10^9 B/s)", &Figures::bw1m, &Figures::q1m);
  }
  row("8 B WRITE latency, half RTT, avg (us)", &Figures::lat_avg, &Figures::qlat);
  row("  median (us)", &Figures::lat_med, nullptr);
  row("  p90 (us)", &Figures::lat_p90, nullptr);
  row("  p99 (us)", &Figures::lat_p99, nullptr);
  row("  max (us)", &Figures::lat_max, nullptr);
  return 0;
}
