#!/usr/bin/python3
"""softrdma beside its software peers, side by side in one run (issue 6, "The benchmark").

    bench/run.py [--quick] [--runs N] [--only REGEX] [--out DIR] [--build DIR] [--socket-env VAR=VALUE]
                 [--no-syscalls] [--no-plot] [--list]

Runs on this machine, every process on 127.0.0.1:
  softrdma   perftest (ib_{write,read,send}_{bw,lat}, ib_atomic_{bw,lat}) over build/lib/libibverbs.so.1 on
             sr_lo (-x 1), sizes 8 B .. 8 MiB, 1/8/64 QPs for the _bw tests (1 QP for _lat, 8 B for atomics);
             and 8-byte ib_send_lat -e (variants events and socket-events: waiting for completion events)
  qperf      tcp_bw, tcp_lat, udp_bw, udp_lat
  ucx        ucx_perftest ucp_put_bw, ucp_put_lat, ucp_get with UCX_TLS=tcp and posix (shared memory); for cma
             UCT's put_bw and get with zero copy (UCX 1.13's UCP never puts over cma: its RMA lanes need
             put_short/put_bcopy/get_bcopy, which cma lacks)
  libfabric  fi_pingpong over the tcp (msg endpoint) and shm (rdm endpoint) providers
  floor      floor-bench: a busy-polling UDP ping-pong and a memcpy loop; and at 8 B udp_pingpong_rc, the
             ping-pong of what an RC WRITE ping-pong sends per half round trip (the WRITE and its ACK in one
             GSO send, received coalesced), with no work around it; at 1 MiB udp_stream, a UDP stream of
             datagrams laid out as the socket path's 4 KiB WRITE packets, sent and received as softrdma sends
             and receives them (GSO sends, coalesced receives), with no ICRC and no transport; at 8 B
             mem_pingpong, a ping-pong of pwrite calls on each other's /proc/<pid>/mem between two processes
             (a same-host one-sided WRITE of 8 B with no work around it); memcpy of 1 MiB from 64 pairs of
             buffers in turn (QPs column: 64), the working set of 64 QPs' buffers; and kernel_copy, the kernel
             copying 64 such buffers (written by the process first, as perftest fills its own) into a file,
             first time (kernel_copy_first) and second: what sendmmsg does with the socket path's payloads;
             and machine: a system call's cost (getppid), the pauses of a thread that spins alone on each CPU
             (printed beside the targets: every latency figure here includes them) and how much slower the
             slowest CPU runs the same work than the fastest (cpu_speed_spread), and how long a cache line
             takes to go from one CPU to another (line_handoff_ns, per pass: the CPUs' placement, which moves
             the figures of every transfer between two processes); and at 8 B udp_pingpong_block, the UDP
             ping-pong with blocking receives (ib_send_lat -e's floor)

Every case runs --runs times (the cases interleaved, so that a change in the machine's load touches every tool
alike; in each pass the cases that a target compares run one after the other, then the rest) and each figure
is the median with its min and max. Each target's ratio of medians is followed by the ratios run by run (run k
of one case over run k of the other, from the same pass), and those again for the pairs of runs that ran with
the CPUs close and with them far (floor-bench placement before and after each run). Output (DIR, default
BUILD/bench): table.txt (what is printed), results.csv (every run's raw figures), results.json (raw figures,
medians, targets), plot.png (bandwidth and latency against size).

Units: bandwidth is printed in GB/s (10^9 B/s) and MiB/s. perftest's MB/sec and UCX's MB/s are MiB/s,
qperf's bytes/sec (with -uu) are bytes, fi_pingpong's MB/sec is 10^6 B/s (both directions of its ping-pong).
Latency is in microseconds, labelled half or full round trip:
  perftest   ib_write_lat, ib_send_lat: half the round trip (perftest divides by 2);
             ib_read_lat, ib_atomic_lat: the whole operation, one full round trip (factor 1 for READ/ATOMIC)
  qperf      tcp_lat, udp_lat: half (time / messages received by both sides)
  ucx        ucp_put_lat: half (ping-pong, divided by 2); ucp_get and UCT get: full (one get outstanding)
  fi_pingpong usec/xfer: half (time / (iterations * 2))
  floor      UDP ping-pong: half (measured round trip / 2)
The latency figure is each tool's mean per operation (perftest's t_avg, UCX's overall average, qperf's and
fi_pingpong's only figure); perftest's and UCX's typical (median) values are kept in the raw data.

CPU per operation: user+system time of the server and of the client process (wait4's rusage, threads and
reaped children included) per operation of the run (bandwidth tests: messages; latency tests: round trips),
less the setup: each perftest, UCX and fi_pingpong case also runs once with SETUP_OPS operations (before its
first run), and what that run's processes used is taken off, (CPU - setup CPU) / (operations - SETUP_OPS);
not shown where less than MIN_WORK_CPU_S is left (the setup's CPU time moves by tens of milliseconds).
Without it, setup (connections, buffers, registration, a softrdma port's prewarm) was most of a latency
run's CPU time: 0.45 s of 0.51 per side in an 8-byte socket ib_write_lat of 5,000 round trips. qperf's
runs (2 s each) and the floors are taken whole. Packets per operation (softrdma only): tx_packets of both
processes, read from their own counter files in /dev/shm (src/io/stats_shm.h) before they are reaped, so
other processes' traffic does not count. Syscalls per operation: a separate, shorter pass under `perf stat -e raw_syscalls:sys_enter`
(strace -c -f if perf cannot), so that counting does not disturb the main figures; a setup run is counted
there too and taken off as for CPU time.
"""

import argparse
import csv
import datetime
import glob
import json
import math
import os
import re
import select
import signal
import statistics
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field

KIB, MIB = 1 << 10, 1 << 20
PERFTEST_CQ_MOD = 100  # perftest's default -Q (cq_mod): one send completion per 100 posts
SETUP_OPS = 10  # operations of a setup run (Runner.setup_cost), whose CPU time each run of the case is less
SETUP_TOOLS = ("softrdma", "ucx", "libfabric")  # the tools whose runs are counted in operations: they get one
# Less CPU than this beyond the setup run's is not shown: the setup's own CPU time (0.4-0.5 s per side for
# perftest over softrdma) moves by tens of milliseconds from run to run. A same-host ping-pong of 5,000
# round trips of 1-2 us is 5-10 ms of work.
MIN_WORK_CPU_S = 0.05
SIZES = [8, 64, 4 * KIB, 64 * KIB, MIB, 8 * MIB]
QPS = [1, 8, 64]
UDP_MAX = 65507
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def size_str(n):
    for unit, div in (("MiB", MIB), ("KiB", KIB)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


@dataclass
class Case:
    tool: str  # softrdma, qperf, ucx, libfabric, floor
    test: str  # the tool's own name of the test
    transport: str  # sr_lo, tcp, udp, posix, cma, shm, memory
    size: int
    kind: str  # bw or lat
    qps: int = 1
    rtt: str = ""  # half or full, for latency figures
    # softrdma: default, socket (run with --socket-env) or shared-mr (SHARED_MR_ENV, opt-in)
    variant: str = "default"
    syscalls: bool = False  # also measured in the syscall pass
    missing: str = ""  # why the figure cannot be had here (set before or during the run)
    runs: list = field(default_factory=list)
    setup: dict = None  # the setup run's operations and CPU seconds per side (Runner.setup_cost)
    syscall_setup: dict = None  # the same, counted in the syscall pass: its syscalls per side too
    syscall_run: dict = field(default_factory=dict)

    @property
    def id(self):
        v = "" if self.variant == "default" else f"[{self.variant}]"
        return f"{self.tool}/{self.test}{v}/{self.transport}/{self.size}/q{self.qps}"

    @property
    def label(self):
        v = "" if self.variant == "default" else f" ({self.variant} path)"
        if self.tool == "softrdma":
            return f"{self.test}{v}"
        if self.tool in ("qperf", "floor"):
            return f"{self.tool} {self.test}"
        return f"{self.tool} {self.transport} {self.test}"


# ---------------------------------------------------------------------------------------------------- #
# Processes: started in their own process group, waited for without being reaped (WNOWAIT) so that their
# softrdma counter files stay (a zombie counts as alive for the files' garbage collector), then reaped with
# wait4 for their CPU time.


class Proc:
    def __init__(self, argv, env, log_path):
        self.argv = argv
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.p = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid = self.p.pid
        self.rc = None
        self.cpu_s = None
        self.counters = None

    def exited(self):
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None

    def wait_exit(self, deadline):
        """True once the process has exited (not reaped); False at the deadline."""
        # Asleep on a pidfd until the exit, rather than polling every 5 ms: the harness then does not wake
        # 200 times a second on the CPUs of the busy-polling processes it measures. (Measured: no change
        # beyond the noise in the socket-path latency runs; kept as the quieter way.)
        try:
            fd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            fd = None
        try:
            while not self.exited():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if fd is None:
                    time.sleep(min(left, 0.005))
                else:
                    select.select([fd], [], [], left)
            return True
        finally:
            if fd is not None:
                os.close(fd)

    def kill(self, sig=signal.SIGKILL):
        if self.rc is None:
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                pass

    def reap(self):
        if self.rc is None:
            _, status, ru = os.wait4(self.pid, 0)
            self.rc = os.waitstatus_to_exitcode(status)
            self.cpu_s = ru.ru_utime + ru.ru_stime
            self.p.returncode = self.rc
            self.log.close()
        return self.rc

    def output(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()


def children_of(pid):
    kids = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                s = f.read()
        except OSError:
            continue
        fields = s[s.rfind(")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            kids.append(int(stat.split("/")[2]))
    return kids


def listening(port, timeout):
    """Waits until something listens on TCP port `port`; True if it does."""
    hexport = f":{port:04X} "
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                with open(path) as f:
                    for line in f:
                        parts = line.split()
                        if len(parts) > 3 and parts[1].endswith(hexport.strip()) and parts[3] == "0A":
                            return True
            except OSError:
                pass
        time.sleep(0.02)
    return False


def port_in_use(port):
    hexport = f":{port:04X}"
    for path in ("/proc/net/tcp", "/proc/net/tcp6", "/proc/net/udp", "/proc/net/udp6"):
        try:
            with open(path) as f:
                if any(line.split()[1].endswith(hexport) for line in list(f)[1:] if len(line.split()) > 1):
                    return True
        except OSError:
            pass
    return False


class Ports:
    def __init__(self, base):
        self.next = base

    def take(self):
        while True:
            p = self.next
            self.next += 2
            if self.next > 60000:
                self.next = 23000
            if not port_in_use(p) and not port_in_use(p + 1):
                return p


# ---------------------------------------------------------------------------------------------------- #
# softrdma's counters of one process (the stats file ABI of src/io/stats_shm.h: a header, uint64 counters
# at counters_offset, NUL-padded names of name_len bytes at names_offset).

STATS_MAGIC = 0x5354415453524453
STATS_HEADER = struct.Struct("<QIIIIIiQII")


def softrdma_counters(pid, device="sr_lo"):
    totals, found = {}, False
    for path in glob.glob(f"/dev/shm/softrdma.{device}.{pid}.*"):
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        if len(data) < STATS_HEADER.size:
            continue
        magic, _ver, num, coff, noff, nlen, hpid, _st, _closed, _r = STATS_HEADER.unpack_from(data)
        if magic != STATS_MAGIC or hpid != pid or noff + num * nlen > len(data):
            continue
        found = True
        for i in range(num):
            name = data[noff + i * nlen:noff + (i + 1) * nlen].split(b"\0")[0].decode()
            (value,) = struct.unpack_from("<Q", data, coff + 8 * i)
            totals[name] = totals.get(name, 0) + value
    return totals if found else None


# ---------------------------------------------------------------------------------------------------- #
# Syscall counting (the separate pass).


class SyscallCounter:
    def __init__(self, workdir):
        self.how, self.why = None, ""
        probe = os.path.join(workdir, "perf-probe.txt")
        try:
            r = subprocess.run(["perf", "stat", "-e", "raw_syscalls:sys_enter", "-x,", "-o", probe, "--", "true"],
                               capture_output=True, timeout=30)
            if r.returncode == 0 and self._perf_count(probe) is not None:
                self.how = "perf"
                return
            self.why = "perf stat -e raw_syscalls:sys_enter failed: " + r.stderr.decode(errors="replace").strip()[:200]
        except (OSError, subprocess.TimeoutExpired) as e:
            self.why = f"perf: {e}"
        try:
            r = subprocess.run(["strace", "-f", "-c", "-o", probe, "true"], capture_output=True, timeout=30)
            if r.returncode == 0 and self._strace_count(probe) is not None:
                self.how = "strace"
                return
            self.why += "; strace -c failed: " + r.stderr.decode(errors="replace").strip()[:200]
        except (OSError, subprocess.TimeoutExpired) as e:
            self.why += f"; strace: {e}"

    def wrap(self, argv, out):
        if self.how == "perf":
            return ["perf", "stat", "-e", "raw_syscalls:sys_enter", "-x,", "-o", out, "--"] + argv
        return ["strace", "-f", "-c", "-o", out] + argv

    def count(self, out):
        return self._perf_count(out) if self.how == "perf" else self._strace_count(out)

    @staticmethod
    def _perf_count(path):
        try:
            with open(path) as f:
                for line in f:
                    parts = line.strip().split(",")
                    if len(parts) > 2 and parts[2] == "raw_syscalls:sys_enter" and parts[0].isdigit():
                        return int(parts[0])
        except OSError:
            pass
        return None

    @staticmethod
    def _strace_count(path):
        try:
            with open(path) as f:
                for line in f:
                    parts = line.split()
                    if parts and parts[-1] == "total":
                        return int(parts[3] if len(parts) >= 5 else parts[2])
        except (OSError, ValueError, IndexError):
            pass
        return None


# ---------------------------------------------------------------------------------------------------- #
# The runners. Each takes the case and a Runner (paths, ports, budgets) and returns a dict of figures:
# bw (bytes/s), rate (operations/s), lat_us, ops, plus raw values, or raises Missing.


class Missing(Exception):
    pass


class Runner:
    def __init__(self, args, build, out):
        self.args = args
        self.build = build
        self.out = out
        self.logdir = os.path.join(out, "logs")
        os.makedirs(self.logdir, exist_ok=True)
        self.ports = Ports(args.port_base)
        self.quick = args.quick
        self.timeout = 60 if args.quick else 180
        self.sys = None  # SyscallCounter during the syscall pass
        self.socket_env = dict(kv.split("=", 1) for kv in args.socket_env)
        self.kernel_copy_vals = {}  # (size, pairs, run): one floor-bench kernel-copy gives both floors
        self.tiny = False  # a setup run (setup_cost): SETUP_OPS operations

    # Budgets: how much one run moves. Bandwidth: bytes or messages; latency: round trips.
    def bw_msgs(self, size):
        if self.tiny:
            return SETUP_OPS
        if self.quick:
            return max(20, min(10000, (32 * MIB) // size))
        return max(100, min(200000, (1024 * MIB) // size))

    def lat_iters(self, size):
        if self.tiny:
            return SETUP_OPS
        if self.quick:
            return max(10, min(100, MIB // size))  # under load a round trip can take 20 ms
        return max(20, min(5000, (256 * MIB) // size))

    def seconds(self):
        return 1 if self.quick else 2

    def log(self, case, run, side):
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", case.id)
        return os.path.join(self.logdir, f"{name}.run{run}.{side}.log")

    def env(self, extra=None):
        e = dict(os.environ)
        e.update(extra or {})
        return e

    def pair(self, case, run, server_argv, client_argv, env, port=None, serves_forever=False):
        """Runs a server and a client; returns (server, client) Procs, both reaped."""
        syscalls = self.sys is not None
        if syscalls:
            s_out, c_out = self.log(case, run, "server.sys"), self.log(case, run, "client.sys")
            server_argv, client_argv = self.sys.wrap(server_argv, s_out), self.sys.wrap(client_argv, c_out)
        deadline = time.monotonic() + self.timeout
        server = Proc(server_argv, env, self.log(case, run, "server"))
        client = None
        try:
            if port is not None and not listening(port, 15):
                server.kill()
                server.wait_exit(time.monotonic() + 5)
                raise Missing(f"server did not listen on port {port}: {server.output().strip()[-300:]}")
            client = Proc(client_argv, env, self.log(case, run, "client"))
            if not client.wait_exit(deadline):
                client.kill()
                server.kill()
                raise Missing(f"timed out after {self.timeout} s")
            if not server.wait_exit(time.monotonic() + (0.05 if serves_forever else 10)):
                # A server that serves forever (qperf) or that missed the end: stop it once its children (qperf
                # forks one per test and reaps it) are gone, so that its CPU time is complete.
                for _ in range(100):
                    if not children_of(server.pid):
                        break
                    time.sleep(0.02)
                server.kill(signal.SIGINT)  # perf stat (syscall pass) prints its count on SIGINT
                if not server.wait_exit(time.monotonic() + 5):
                    server.kill()
                    server.wait_exit(time.monotonic() + 5)
            if case.tool == "softrdma" and not syscalls:
                server.counters = softrdma_counters(server.pid)
                client.counters = softrdma_counters(client.pid)
        finally:
            for p in (client, server):
                if p is not None:
                    if not p.exited():
                        p.kill()
                    p.reap()
        if syscalls:
            server.syscalls, client.syscalls = self.sys.count(s_out), self.sys.count(c_out)
        return server, client

    # --- perftest over softrdma's libibverbs.so.1 ---
    def perftest(self, case, run):
        prog = case.test
        if not shutil_which(prog):
            raise Missing(f"{prog} not installed (Debian package perftest)")
        port = self.ports.take()
        opts = ["-d", "sr_lo", "-x", "1", "-p", str(port)]
        if case.kind == "bw":
            msgs = self.bw_msgs(case.size)
            if "atomic" in prog:  # one round trip each, and responders run them one at a time
                msgs = max(20, msgs // 10)
            per_qp = max(5, math.ceil(msgs / case.qps))  # perftest's least is 5
            if case.qps > 1 and per_qp >= PERFTEST_CQ_MOD:
                # perftest counts each send completion as cq_mod WRs (one is asked for every cq_mod posts,
                # and for the last) and stops polling once the count reaches QPs x iterations. With
                # iterations not a multiple of cq_mod the last completion of each QP counts more than it
                # did, so the count can reach the total while a QP that lagged still waits for one; then
                # perftest spins without polling, for good (8 B x 64 QPs with -n 3125: 1 run in 10 to
                # 20). Below cq_mod, -t below makes cq_mod the iterations themselves.
                per_qp = math.ceil(per_qp / PERFTEST_CQ_MOD) * PERFTEST_CQ_MOD
            # -N: no BW-peak report. perftest computes it (for up to 20,000 iterations) in time that grows with
            # the square of iterations x QPs: 5000 x 64 QPs took minutes after the transfer ended.
            opts += ["-q", str(case.qps), "-n", str(per_qp), "-N"]
            if per_qp < 128:
                opts += ["-t", str(per_qp)]  # perftest wants the send queue no deeper than the iterations
        else:
            opts += ["-n", str(self.lat_iters(case.size))]
        if "atomic" not in prog:
            opts += ["-s", str(case.size)]
        libdir = os.path.join(self.build, "lib")
        extra = {"LD_LIBRARY_PATH": libdir}
        if case.variant in ("socket", "socket-events"):
            extra.update(self.socket_env)
        elif case.variant == "shared-mr":
            extra.update(SHARED_MR_ENV)
        if case.variant.endswith("events"):
            opts += ["-e"]  # completion events: ibv_get_cq_event, not polling
        # Line-buffered, so that a run stopped by the timeout still shows how far it got.
        argv = (["stdbuf", "-oL", "-eL"] if shutil_which("stdbuf") else []) + [prog] + opts
        server, client = self.pair(case, run, argv, argv + ["127.0.0.1"], self.env(extra), port)
        out = client.output()
        if client.rc != 0 or server.rc != 0:
            raise Missing(f"exit codes server {server.rc} client {client.rc}: {tail(out)}")
        lines = out.splitlines()
        figs = None
        for i, line in enumerate(lines):
            if line.lstrip().startswith("#bytes") and i + 1 < len(lines):
                figs = lines[i + 1].split()
        if not figs:
            raise Missing(f"no figures in the output: {tail(out)}")
        r = {"ops": int(figs[1])}
        if case.kind == "bw":  # #bytes #iterations BW-peak BW-average[MiB/s] MsgRate[Mpps]
            # The rate has 6 decimals, the MiB/s 2 (0.16 at 8 B): bandwidth = rate * size, as perftest's own.
            rate = float(figs[4]) * 1e6
            r.update(bw=rate * case.size, rate=rate, raw_bw_mib=float(figs[3]))
        else:  # #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%
            r.update(lat_us=float(figs[5]), lat_typical_us=float(figs[4]), lat_min_us=float(figs[2]))
        return self.finish(case, r, server, client)

    # --- qperf ---
    def qperf(self, case, run):
        if not shutil_which("qperf"):
            raise Missing("qperf not installed (Debian package qperf)")
        port = self.ports.take()
        argv = ["qperf", "127.0.0.1", "--listen_port", str(port), "-t", str(self.seconds()), "-uu", "-vvs",
                "-m", str(case.size), case.test]
        server, client = self.pair(case, run, ["qperf", "--listen_port", str(port)], argv, self.env(), port,
                                   serves_forever=True)
        out = client.output()
        vals = dict(re.findall(r"^\s*(\w+)\s*=\s*([0-9.]+)", out, re.M))
        if client.rc != 0 or not vals:
            raise Missing(f"qperf exit {client.rc}: {tail(out)}")
        if case.kind == "bw":
            bw = float(vals.get("recv_bw", vals.get("bw", 0)))
            ops = float(vals.get("recv_bytes", 0)) / case.size
            r = {"bw": bw, "rate": bw / case.size, "ops": ops}
            if "send_bw" in vals:
                r["send_bw"] = float(vals["send_bw"])
        else:
            lat = float(vals["latency"]) / 1000  # -uu prints nanoseconds
            r = {"lat_us": lat, "ops": float(vals.get("loc_recv_msgs", 0))}
        return self.finish(case, r, server, client)

    # --- ucx_perftest ---
    def ucx(self, case, run):
        if not shutil_which("ucx_perftest"):
            raise Missing("ucx_perftest not installed (Debian package ucx-utils)")
        port = self.ports.take()
        env = {"UCX_TLS": case.transport}
        if case.transport == "tcp":
            env["UCX_NET_DEVICES"] = "lo"
        opts = ["-p", str(port)]
        client_opts = ["-t", case.test, "-s", str(case.size), "-f", "-v"]
        if case.kind == "bw" or case.test in ("get", "ucp_get"):
            n = self.bw_msgs(case.size) if case.kind == "bw" else self.lat_iters(case.size)
        else:
            n = self.lat_iters(case.size)
        client_opts += ["-n", str(n), "-w", str(max(10, n // 10))]
        if case.transport == "cma":  # UCT level: one device, zero copy
            env = {}
            client_opts += ["-x", "cma", "-d", "memory", "-D", "zcopy"]
        server, client = self.pair(case, run, ["ucx_perftest"] + opts,
                                   ["ucx_perftest", "127.0.0.1"] + opts + client_opts, self.env(env), port)
        out = client.output()
        rows = [l.split(",") for l in out.splitlines() if re.match(r"^\s*\d+,[0-9.]+,", l)]
        if client.rc != 0 or not rows:
            raise Missing(f"ucx_perftest exit {client.rc}: {tail(out)}")
        it, typ, _avg_lat, overall_lat, _avg_bw, overall_bw, _avg_mr, overall_mr = rows[-1][:8]
        r = {"ops": int(it), "bw": float(overall_bw) * MIB, "rate": float(overall_mr)}
        if case.kind == "lat":
            r.update(lat_us=float(overall_lat), lat_typical_us=float(typ))
        return self.finish(case, r, server, client)

    # --- fi_pingpong ---
    def fabric(self, case, run):
        if not shutil_which("fi_pingpong"):
            raise Missing("fi_pingpong not installed (Debian package libfabric-bin)")
        port = self.ports.take()
        ep = "msg" if case.transport == "tcp" else "rdm"
        iters = self.lat_iters(case.size)
        opts = ["-p", case.transport, "-e", ep, "-S", str(case.size), "-I", str(iters)]
        env = {"FI_TCP_IFACE": "lo"} if case.transport == "tcp" else {}
        server, client = self.pair(case, run, ["fi_pingpong", "-B", str(port)] + opts,
                                   ["fi_pingpong", "-P", str(port)] + opts + ["127.0.0.1"], self.env(env), port)
        out = client.output()
        # bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec
        rows = [l.split() for l in out.splitlines() if re.match(r"^\d+\S*\s+\S+\s+[=+-]", l)]
        if client.rc != 0 or server.rc != 0 or not rows:
            raise Missing(f"fi_pingpong exit server {server.rc} client {client.rc}: {tail(out)}")
        row = rows[-1]
        lat = float(row[-2])
        r = {"lat_us": lat, "ops": iters, "bw": float(row[-3]) * 1e6, "bw_note": "both directions"}
        return self.finish(case, r, server, client)

    # --- floors ---
    def floor(self, case, run):
        exe = os.path.join(self.build, "bin", "floor-bench")
        if not os.access(exe, os.X_OK):
            raise Missing(f"{exe} not built (cmake --build {self.build} --target floor-bench)")
        if case.test == "memcpy":
            secs = 0.2 if self.quick else 1.0
            p, vals = self.solo(case, run, [exe, "memcpy", str(case.size), str(secs), str(case.qps)], "memcpy",
                                "bytes_per_sec")
            bw = float(vals["bytes_per_sec"])
            ops = int(vals["iters"])
            return {"bw": bw, "rate": bw / case.size, "ops": ops, "cpu_client_us": p.cpu_s * 1e6 / ops}
        if case.test in ("kernel_copy_first", "kernel_copy"):
            key = "first_bytes_per_sec" if case.test == "kernel_copy_first" else "later_bytes_per_sec"
            # Both figures come from one pass of the program (a first and a second copy of the same
            # buffers): the second case of a run reads what the first one's pass printed.
            vals = self.kernel_copy_vals.get((case.size, case.qps, run))
            if vals is None:
                _, vals = self.solo(case, run, [exe, "kernel-copy", str(case.size), str(case.qps)], "kernel_copy",
                                    key)
                self.kernel_copy_vals[(case.size, case.qps, run)] = vals
            bw = float(vals[key])
            return {"bw": bw, "rate": bw / case.size, "ops": case.qps}  # its CPU time includes filling them
        if case.test == "udp_stream":
            secs = 0.3 if self.quick else 1.5
            port = self.ports.take()
            server, client, vals = self.floor_pair(case, run, [exe, "udp-stream-server", str(port)],
                                                   [exe, "udp-stream-client", str(port), str(case.size), str(secs)],
                                                   "bytes_per_sec")
            bw = float(vals["bytes_per_sec"])
            r = {"bw": bw, "rate": bw / case.size, "ops": max(1, round(bw * float(vals["seconds"]) / case.size))}
            return self.finish(case, r, server, client)
        if case.test == "machine":
            secs = 0.3 if self.quick else 1.0
            _, vals = self.solo(case, run, [exe, "machine", str(secs)], "machine", "pause_lost_pct")
            return {m: float(vals[m]) for m in MACHINE_METRICS if m in vals}
        iters = self.lat_iters(case.size) * (1 if self.quick or case.size > 64 else 10)
        if case.test == "mem_pingpong":
            p, vals = self.solo(case, run, [exe, "mem-pingpong", str(case.size), str(iters)], "client",
                                "half_rtt_avg_us")
            # Both processes' CPU time is the client's here (wait4 counts the reaped child).
            return {"lat_us": float(vals["half_rtt_avg_us"]), "lat_typical_us": float(vals["half_rtt_median_us"]),
                    "ops": iters, "cpu_client_us": p.cpu_s * 1e6 / iters}
        port = self.ports.take()
        rc = {"udp_pingpong_rc": ["rc"], "udp_pingpong_block": ["block"]}.get(case.test, [])
        server, client, vals = self.floor_pair(case, run, [exe, "udp-server", str(port)] + rc,
                                               [exe, "udp-client", str(port), str(case.size), str(iters)] + rc,
                                               "half_rtt_avg_us")
        r = {"lat_us": float(vals["half_rtt_avg_us"]), "lat_typical_us": float(vals["half_rtt_median_us"]),
             "ops": iters}
        return self.finish(case, r, server, client)

    def floor_pair(self, case, run, server_argv, client_argv, key):
        """Runs a floor-bench server and client (pair): both Procs and the client's key=values; Missing unless
        the client exited 0 and printed `key`."""
        server, client = self.pair(case, run, server_argv, client_argv, self.env())
        vals = keyvals(client.output())
        if client.rc != 0 or key not in vals:
            raise Missing(f"floor-bench {client_argv[1]} exit {client.rc}: {tail(client.output())}")
        return server, client, vals

    def placement(self):
        """floor-bench placement's line_handoff_ns (the CPUs' placement at this moment), or None."""
        exe = os.path.join(self.build, "bin", "floor-bench")
        try:
            p = subprocess.run([exe, "placement"], capture_output=True, text=True, timeout=10)
            return float(keyvals(p.stdout)["line_handoff_ns"]) or None
        except (OSError, subprocess.SubprocessError, KeyError, ValueError):
            return None

    def solo(self, case, run, argv, side, key):
        """Runs one floor-bench process to its end: its Proc and key=values; Missing unless it exited 0 and
        printed `key`."""
        p = Proc(argv, self.env(), self.log(case, run, side))
        p.wait_exit(time.monotonic() + self.timeout) or p.kill()
        p.reap()
        vals = keyvals(p.output())
        if p.rc != 0 or key not in vals:
            raise Missing(f"floor-bench {argv[1]} exit {p.rc}: {tail(p.output())}")
        return p, vals

    def finish(self, case, r, server, client):
        ops = r.get("ops") or 0
        r["cpu_server_s"], r["cpu_client_s"] = server.cpu_s, client.cpu_s  # the whole process, setup included
        for side, p in (("server", server), ("client", client)):
            if getattr(p, "syscalls", None) is not None:
                r[f"syscalls_{side}_total"] = p.syscalls
        if self.tiny:
            return r
        setup = case.syscall_setup if self.sys is not None else case.setup

        def less_setup(total, key, least):
            """`total` per operation, less the setup run's `key` (per operation beyond its operations); None
            where less than `least` is left (the setup's noise), or where the case's setup run failed. The
            tools without one (SETUP_TOOLS) are taken whole."""
            if setup is None:
                return None if case.tool in SETUP_TOOLS else total / ops
            base = setup.get(key)
            if base is None or total - base < least or ops <= setup["ops"]:
                return None
            return (total - base) / (ops - setup["ops"])

        if ops > 0:
            for side, p in (("server", server), ("client", client)):
                if p.cpu_s is not None:
                    per_op = less_setup(p.cpu_s, f"cpu_{side}_s", MIN_WORK_CPU_S)
                    if per_op is not None:
                        r[f"cpu_{side}_us"] = per_op * 1e6
            if server.counters is not None and client.counters is not None:
                tx = server.counters.get("tx_packets", 0) + client.counters.get("tx_packets", 0)
                r["packets_per_op"] = tx / ops
                direct = server.counters.get("direct_ops", 0) + client.counters.get("direct_ops", 0)
                r["direct_per_op"] = direct / ops
                r["retransmits"] = server.counters.get("retransmits", 0) + client.counters.get("retransmits", 0)
            # Syscalls less the setup run's, counted in the same pass (at least one left).
            for side in ("server", "client"):
                total = r.get(f"syscalls_{side}_total")
                if total is not None:
                    per_op = less_setup(total, f"syscalls_{side}_total", 1)
                    if per_op is not None:
                        r[f"syscalls_{side}"] = per_op
        return r

    def tool(self, case):
        return {"softrdma": self.perftest, "qperf": self.qperf, "ucx": self.ucx, "libfabric": self.fabric,
                "floor": self.floor}[case.tool]

    def run(self, case, run):
        return self.tool(case)(case, run)

    def setup_cost(self, case):
        """Runs an iteration-counted case once with SETUP_OPS operations: its processes' CPU time is the
        setup that finish() takes off each run's. None for the tools whose runs are timed (qperf), the floors,
        or when that run failed."""
        if case.tool not in SETUP_TOOLS:
            return None
        self.tiny = True
        try:
            r = self.tool(case)(case, "setup" if self.sys is None else "sys-setup")
        except Missing:
            return None
        finally:
            self.tiny = False
        if r.get("cpu_server_s") is None or r.get("cpu_client_s") is None or not r.get("ops"):
            return None
        return {k: v for k, v in r.items()
                if k == "ops" or k.startswith("cpu_") or (k.startswith("syscalls_") and k.endswith("_total"))}


def cma_unavailable():
    """Why UCX's cma (process_vm_readv/writev between two unrelated processes) cannot run here, or ""."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = int(f.read())
        if scope >= 1:
            return (f"kernel.yama.ptrace_scope = {scope}: a process may not process_vm_writev into a sibling "
                    "(cma needs 0)")
    except (OSError, ValueError):
        pass  # no Yama: ordinary ptrace rules (same user) apply
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)

    class Iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    src, dst = ctypes.create_string_buffer(b"x" * 8), ctypes.create_string_buffer(8)
    local = Iovec(ctypes.cast(dst, ctypes.c_void_p), 8)
    remote = Iovec(ctypes.cast(src, ctypes.c_void_p), 8)
    n = libc.process_vm_readv(os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    if n != 8:
        err = ctypes.get_errno()
        return f"process_vm_readv is refused here ({os.strerror(err)}; a seccomp filter?): cma cannot run"
    return ""


def keyvals(text):
    return dict(re.findall(r"(\w+)=([0-9.]+)", text))


def tail(text, n=300):
    return " ".join(text.strip().split())[-n:]


def shutil_which(prog):
    import shutil
    return shutil.which(prog)


# ---------------------------------------------------------------------------------------------------- #
# The cases.


def all_cases(socket_variant):
    cases = []
    for verb in ("write", "read", "send"):
        for size in SIZES:
            for q in QPS:
                cases.append(Case("softrdma", f"ib_{verb}_bw", "sr_lo", size, "bw", qps=q))
            cases.append(Case("softrdma", f"ib_{verb}_lat", "sr_lo", size, "lat",
                              rtt="full" if verb == "read" else "half"))
    for q in QPS:
        cases.append(Case("softrdma", "ib_atomic_bw", "sr_lo", 8, "bw", qps=q))
    cases.append(Case("softrdma", "ib_atomic_lat", "sr_lo", 8, "lat", rtt="full"))
    if socket_variant:
        for c in [c for c in cases if (c.test, c.size, c.qps) in SOCKET_TARGET_CASES]:
            cases.append(Case(c.tool, c.test, c.transport, c.size, c.kind, c.qps, c.rtt, variant="socket"))
    for c in [c for c in cases if c.variant == "default" and (c.test, c.size, c.qps) in SHARED_MR_CASES]:
        cases.append(Case(c.tool, c.test, c.transport, c.size, c.kind, c.qps, c.rtt, variant="shared-mr"))
    # An application that waits for completion events (ibv_get_cq_event) instead of polling: not a target,
    # shown beside a blocking UDP ping-pong (udp_pingpong_block), its floor.
    for v in ("events", "socket-events") if socket_variant else ("events",):
        cases.append(Case("softrdma", "ib_send_lat", "sr_lo", 8, "lat", rtt="half", variant=v))
    for size in SIZES:
        cases.append(Case("qperf", "tcp_bw", "tcp", size, "bw"))
        cases.append(Case("qperf", "tcp_lat", "tcp", size, "lat", rtt="half"))
        udp = Case("qperf", "udp_bw", "udp", size, "bw")
        udpl = Case("qperf", "udp_lat", "udp", size, "lat", rtt="half")
        if size > UDP_MAX:
            udp.missing = udpl.missing = f"a UDP datagram carries at most {UDP_MAX} bytes"
        cases += [udp, udpl]
    for tl in ("tcp", "posix", "cma"):
        for size in SIZES:
            if tl == "cma":
                cases.append(Case("ucx", "put_bw", tl, size, "bw"))
                lat = Case("ucx", "put_lat", tl, size, "lat", rtt="half")
                lat.missing = "cma has no put_short, which UCX's put ping-pong needs (and UCP puts over cma never)"
                cases += [lat, Case("ucx", "get", tl, size, "lat", rtt="full")]
            else:
                cases += [Case("ucx", "ucp_put_bw", tl, size, "bw"),
                          Case("ucx", "ucp_put_lat", tl, size, "lat", rtt="half"),
                          Case("ucx", "ucp_get", tl, size, "lat", rtt="full")]
    for prov in ("tcp", "shm"):
        for size in SIZES:
            cases.append(Case("libfabric", "fi_pingpong", prov, size, "lat", rtt="half"))
    for size in SIZES:
        u = Case("floor", "udp_pingpong", "udp", size, "lat", rtt="half")
        if size > UDP_MAX:
            u.missing = f"a UDP datagram carries at most {UDP_MAX} bytes"
        cases += [u, Case("floor", "memcpy", "memory", size, "bw")]
    # What the latency targets' RC ping-pong needs on the wire (a WRITE and an ACK per half round trip, one
    # GSO send) with no work around it: the bound those targets meet first.
    cases.append(Case("floor", "udp_pingpong_rc", "udp", 8, "lat", rtt="half"))
    # What the event-driven case above meets first: a UDP ping-pong whose sides sleep in recv (a wake-up per
    # half round trip).
    cases.append(Case("floor", "udp_pingpong_block", "udp", 8, "lat", rtt="half"))
    # The same-host targets' own bounds: a one-sided WRITE ping-pong that is one pwrite on the peer's
    # /proc/<pid>/mem each way (softrdma's same-host WRITE of 8 B) and nothing else; and copying 1 MiB from
    # 64 pairs of buffers in turn (the working set of 64 QPs' buffers, beyond the caches) against one pair,
    # the bound of the 64-QP bandwidth target.
    cases.append(Case("floor", "mem_pingpong", "procmem", 8, "lat", rtt="half"))
    # The socket path's bandwidth targets' own bound: a UDP stream laid out as softrdma's 4 KiB WRITE packets
    # and sent and received as it sends and receives them, with no ICRC and no transport (one copy a side).
    cases.append(Case("floor", "udp_stream", "udp", MIB, "bw"))
    cases.append(Case("floor", "memcpy", "memory", MIB, "bw", qps=64))
    # The socket path's sender: the kernel copies each payload from the application's buffer (sendmmsg).
    # Where the kernel's first access to a user page costs more (the project's VM), the first pass over
    # 64 QPs' 64 MiB of sources is slower than the rest; softrdma has the kernel read each page of an MR at
    # registration (io/kernel_touch.h), so the 64-QP 1 MiB target's runs (16 messages per QP) do not pay it.
    cases += [Case("floor", t, "memory", MIB, "bw", qps=64) for t in ("kernel_copy_first", "kernel_copy")]
    # What the machine itself adds to every latency figure, the floors' included: a system call's cost and
    # the pauses of a thread that spins alone on each CPU (a virtual CPU that the host takes away).
    cases.append(Case("floor", "machine", "cpu", 0, "machine"))
    return cases


# The softrdma cases the socket-path targets read.
SOCKET_TARGET_CASES = {("ib_write_bw", 64 * KIB, 1), ("ib_write_bw", MIB, 1), ("ib_write_bw", 8, 1),
                       ("ib_write_bw", 64 * KIB, 64), ("ib_write_bw", MIB, 64), ("ib_write_lat", 8, 1),
                       ("ib_send_lat", 8, 1), ("ib_read_lat", 8, 1)}

# The same-host cases run again with registered memory that the peer maps itself (src/io/shm/mr_share.h):
# an opt-in setting, so the same-host targets are read from the default runs and these are shown beside.
SHARED_MR_ENV = {"SOFTRDMA_SHARE_MR": "1"}
SHARED_MR_CASES = {("ib_write_bw", 8, 1), ("ib_write_bw", 64 * KIB, 1), ("ib_write_bw", MIB, 1),
                   ("ib_read_bw", MIB, 1), ("ib_write_lat", 8, 1), ("ib_read_lat", 8, 1),
                   ("ib_atomic_lat", 8, 1)}

# --quick: the cases the targets need, and one of every peer's tests so that every parser runs.
QUICK = {
    "softrdma": SOCKET_TARGET_CASES,
    "qperf": {("tcp_bw", 64 * KIB), ("tcp_bw", MIB), ("tcp_lat", 8), ("udp_lat", 8), ("udp_bw", 4 * KIB)},
    "ucx": {("ucp_put_bw", 8), ("ucp_put_lat", 8), ("ucp_get", 8), ("put_bw", MIB), ("ucp_put_bw", MIB)},
    "libfabric": {("fi_pingpong", 64)},
    "floor": {("udp_pingpong", 8), ("udp_pingpong_rc", 8), ("udp_stream", MIB), ("udp_pingpong_block", 8), ("memcpy", MIB), ("mem_pingpong", 8),
              ("kernel_copy_first", MIB), ("kernel_copy", MIB), ("machine", 0)},
}
QUICK_TRANSPORTS = {("ucx", "ucp_put_bw", MIB): "posix", ("ucx", "ucp_put_lat", 8): "tcp", ("ucx", "ucp_get", 8): "tcp",
                    ("ucx", "ucp_put_bw", 8): "tcp"}


def in_quick(c):
    if c.tool == "softrdma":
        return (c.test, c.size, c.qps) in QUICK["softrdma"]
    if (c.test, c.size) not in QUICK.get(c.tool, set()):
        return False
    want = QUICK_TRANSPORTS.get((c.tool, c.test, c.size))
    return want is None or want == c.transport


def syscall_subset(c, quick):
    if c.qps != 1:
        return False
    if quick:
        return c.variant == "default" and (c.test, c.size) in (("ib_write_lat", 8), ("ib_write_bw", 64 * KIB),
                                                               ("udp_pingpong", 8))
    return c.size in (8, 64, 64 * KIB, MIB) and c.test not in ("memcpy", "mem_pingpong", "machine")


# ---------------------------------------------------------------------------------------------------- #
# Figures, targets, output.

METRICS = ["bw", "rate", "lat_us", "lat_typical_us", "cpu_server_us", "cpu_client_us", "packets_per_op",
           "direct_per_op"]
# floor-bench machine's figures (kind "machine"): printed beside the targets, not in the tables.
MACHINE_METRICS = ["syscall_us", "pauses_per_s", "pause_median_us", "pause_max_us", "pause_lost_pct",
                   "pause_period_ms", "cpu_speed_spread", "line_handoff_ns"]


def summary(case):
    ok = [r for r in case.runs if "error" not in r]
    s = {}
    for m in METRICS + MACHINE_METRICS:
        vals = [r[m] for r in ok if m in r]
        if vals:
            s[m] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}
    for m in ("syscalls_server", "syscalls_client"):
        if m in case.syscall_run:
            s[m] = {"median": case.syscall_run[m], "min": case.syscall_run[m], "max": case.syscall_run[m], "n": 1}
    return s


def find(cases, tool, test, transport=None, size=None, qps=1, variant="default"):
    for c in cases:
        if (c.tool == tool and c.test == test and (transport is None or c.transport == transport)
                and c.size == size and c.qps == qps and c.variant == variant):
            return c
    return None


def med(case, metric):
    if case is None:
        return None
    s = summary(case).get(metric)
    return s["median"] if s else None


def socket_case_variant(cases):
    """The variant of softrdma's socket-path cases: 'socket' where they ran with --socket-env, else
    'default' (--socket-env none: the targets read the default path's cases)."""
    return "socket" if any(c.variant == "socket" for c in cases) else "default"


def targets(cases):
    """Issue 6's targets: (name, softrdma figure, peer figure, ratio, limit, met)."""
    sock = socket_case_variant(cases)

    def sr(test, size, qps=1, variant=sock):
        return find(cases, "softrdma", test, "sr_lo", size, qps, variant)

    out = []

    least = least_placement(cases)

    def add(name, a, am, b, bm, op, limit, how):
        va, vb = med(a, am), med(b, bm)
        ratio = va / vb if va is not None and vb else None
        met = None if ratio is None else (ratio >= limit if op == ">=" else ratio <= limit)
        out.append({"target": name, "softrdma": va, "peer": vb, "ratio": ratio, "op": op, "limit": limit,
                    "met": met, "unit": how, "run_by_run": run_by_run(a, am, b, bm),
                    "run_by_run_by_placement": run_by_run_placed(a, am, b, bm, least),
                    "case_ids": [a.id if a else None, b.id if b else None],
                    "why_missing": None if ratio is not None else
                    "; ".join(dict.fromkeys(x for x in (why(a, am), why(b, bm)) if x))})

    path = "socket path"
    for size in (64 * KIB, MIB):
        add(f"{path}: ib_write_bw {size_str(size)} >= 1.0x qperf tcp_bw", sr("ib_write_bw", size), "bw",
            find(cases, "qperf", "tcp_bw", "tcp", size), "bw", ">=", 1.0, "GB/s")
    floor = find(cases, "floor", "udp_pingpong", "udp", 8)
    add(f"{path}: ib_write_lat 8 B <= 1.3x UDP busy-poll half RTT", sr("ib_write_lat", 8), "lat_us", floor, "lat_us",
        "<=", 1.3, "us")
    add(f"{path}: ib_send_lat 8 B <= 1.3x UDP busy-poll half RTT", sr("ib_send_lat", 8), "lat_us", floor, "lat_us",
        "<=", 1.3, "us")
    add(f"{path}: ib_read_lat 8 B (full RTT) <= 2.0x UDP busy-poll half RTT", sr("ib_read_lat", 8), "lat_us", floor,
        "lat_us", "<=", 2.0, "us")
    add(f"{path}: ib_write_bw 8 B msg rate >= 5x UCX tcp ucp_put_bw", sr("ib_write_bw", 8), "rate",
        find(cases, "ucx", "ucp_put_bw", "tcp", 8), "rate", ">=", 5.0, "Mmsg/s")
    for size in (64 * KIB, MIB):
        add(f"{path}: ib_write_bw {size_str(size)} 64 QPs >= 0.9x 1 QP", sr("ib_write_bw", size, 64), "bw",
            sr("ib_write_bw", size, 1), "bw", ">=", 0.9, "GB/s")
    # The same two again with SOFTRDMA_SHARE_MR=1 (opt-in, not the default the targets name), beside them.
    for variant, path in (("default", "same-host path"),
                          ("shared-mr", "same-host path, SOFTRDMA_SHARE_MR=1 (opt-in)")):
        add(f"{path}: ib_write_bw 1 MiB >= 1.0x UCX cma put_bw 1 MiB", sr("ib_write_bw", MIB, variant=variant),
            "bw", find(cases, "ucx", "put_bw", "cma", MIB), "bw", ">=", 1.0, "GB/s")
        add(f"{path}: ib_write_lat 8 B <= 1.0x fi_pingpong shm 64 B", sr("ib_write_lat", 8, variant=variant),
            "lat_us", find(cases, "libfabric", "fi_pingpong", "shm", 64), "lat_us", "<=", 1.0, "us")
    return out


# The floors printed beside the targets (table), each with what it is set against: (that case, the floor),
# as find()'s arguments. The event-driven cases (not targets) are set against theirs.
BESIDE_TARGETS = ((("floor", "udp_pingpong", "udp", 8), ("floor", "udp_pingpong_rc", "udp", 8)),
                  (("libfabric", "fi_pingpong", "shm", 64), ("floor", "mem_pingpong", "procmem", 8)),
                  (("softrdma", "ib_send_lat", "sr_lo", 8, 1, "socket-events"), ("floor", "udp_pingpong_block", "udp", 8)),
                  (("softrdma", "ib_send_lat", "sr_lo", 8, 1, "events"), ("floor", "udp_pingpong_block", "udp", 8)),
                  (("qperf", "tcp_bw", "tcp", MIB), ("floor", "udp_stream", "udp", MIB)))


def beside_targets(cases):
    """[(case, floor)] of BESIDE_TARGETS, None where not in `cases`."""
    return [(find(cases, *a), find(cases, *b)) for a, b in BESIDE_TARGETS]


def execution_order(todo):
    """The cases of a pass in the order they run: the cases that targets compare first, each beside the cases
    it is compared with (the machine's speed moves within a pass: ratios of runs minutes apart mixed it in),
    then the rest in the table's order."""
    by_id = {c.id: c for c in todo}
    pairs = [t["case_ids"] for t in targets(todo) if all(i in by_id for i in t["case_ids"])]
    # The floors printed beside the targets, beside what they are set against.
    for a, b in beside_targets(todo):
        if a is not None and b is not None:
            pairs.append([b.id, a.id])
    partners = {}
    for a, b in pairs:
        partners.setdefault(a, []).append(b)
        partners.setdefault(b, []).append(a)
    order, placed = [], set()

    def place(i):  # the case, then (depth first) whatever is compared with it
        if i in placed:
            return
        placed.add(i)
        order.append(by_id[i])
        for j in partners[i]:
            place(j)

    for a, b in pairs:
        place(b)  # the peer first: each softrdma case then follows what it is set against
    return order + [c for c in todo if c.id not in placed]


def run_by_run(a, am, b, bm):
    """The ratios of the two cases' runs of the same pass (run k of one over run k of the other), as a
    summary, or None: a check on a ratio of medians when the machine's speed moves between passes (the
    medians can then come from a fast pass of one case and a slow one of the other)."""
    if a is None or b is None:
        return None
    ratios = [ra[am] / rb[bm] for ra, rb in zip(a.runs, b.runs)
              if "error" not in ra and "error" not in rb and ra.get(am) is not None and rb.get(bm)]
    if not ratios:
        return None
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "n": len(ratios)}


# A run's placement is close when both of its probes read at most this many times the least probe of the
# whole benchmark (the CPUs share a cache), far when both read more; a run between the two is neither.
# On the project's VM: 26-32 ns close, 166-175 far.
PLACEMENT_FAR_FACTOR = 2.5
PLACEMENT_PROBES = ["placement_before_ns", "placement_after_ns"]


def placement_of(r, least):
    probes = [r.get(k) for k in PLACEMENT_PROBES]
    if not least or not all(probes):
        return None
    far = [p > PLACEMENT_FAR_FACTOR * least for p in probes]
    return "far" if all(far) else ("close" if not any(far) else None)


def least_placement(cases):
    probes = [r[k] for c in cases for r in c.runs for k in PLACEMENT_PROBES if r.get(k)]
    return min(probes) if probes else None


def run_by_run_placed(a, am, b, bm, least):
    """run_by_run's ratios split by the CPUs' placement: {"close": summary, "far": summary} for the pairs of
    runs whose four probes all agree; {} when no pair does."""
    if a is None or b is None:
        return {}
    split = {}
    for ra, rb in zip(a.runs, b.runs):
        if "error" in ra or "error" in rb or ra.get(am) is None or not rb.get(bm):
            continue
        where = placement_of(ra, least)
        if where is not None and where == placement_of(rb, least):
            split.setdefault(where, []).append(ra[am] / rb[bm])
    return {k: {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}
            for k, v in split.items()}


def why(case, metric):
    if case is None:
        return "not run (filtered out)"
    if case.missing:
        return f"{case.label}: {case.missing}"
    if med(case, metric) is None:
        errs = [r["error"] for r in case.runs if "error" in r]
        return f"{case.label}: " + (errs[-1] if errs else "no figure")
    return ""


def fmt(v, digits=3):
    if v is None:
        return "-"
    if v == 0:
        return "0"
    mag = math.floor(math.log10(abs(v)))
    return f"{v:.{max(0, digits - 1 - mag)}f}"


def mmm(case, metric, scale=1.0):
    s = summary(case).get(metric)
    if not s:
        return "-"
    if s["n"] == 1:
        return fmt(s["median"] * scale)
    return f"{fmt(s['median'] * scale)} [{fmt(s['min'] * scale)}-{fmt(s['max'] * scale)}]"


def table(cases, meta, tgts):
    lines = []
    w = lines.append
    w(f"softrdma benchmark  {meta['date']}  host {meta['host']} ({meta['cpus']} CPUs)  commit {meta['commit']}")
    w(f"runs per case: {meta['runs']}{' (--quick)' if meta['quick'] else ''}   load average before the run "
      f"{meta['loadavg_start']} (after: {meta['loadavg_end']}, its own processes included)"
      + ("   ** measured under load: figures are noisy **" if meta["under_load"] else ""))
    w("figures: median [min-max] over the runs. GB/s = 10^9 B/s; MiB/s = 2^20 B/s; Mmsg/s = 10^6 messages/s.")
    w("latency in us: 'half' = half the round trip (one-way estimate), 'full' = a whole round trip; the figure is")
    w("each run's mean per operation (the statistic every tool reports); (median) is the run's median where the")
    w("tool reports one (perftest t_typical, UCX 50th percentile, floor-bench). Targets compare means.")
    w(f"CPU us/op per side (server/client) = process user+sys time / operations, less a setup run of {SETUP_OPS}")
    w("operations (perftest, UCX, fi_pingpong: (CPU - its CPU) / (operations - its operations); '-' where less than")
    w(f"{MIN_WORK_CPU_S * 1e3:.0f} ms of CPU was left, within the setup's noise); pkts/op = packets sent by both softrdma "
      "processes /")
    w("operations, +Nd: also N operations done one-sided, with no packet (same host); sys/op = syscalls per operation")
    w(f"from a separate pass of 1 run (less a setup run's there), counted by: {meta['syscalls']}.")
    w("")
    hdr = (f"{'case':34} {'size':>7} {'QPs':>3} {'GB/s':>22} {'MiB/s':>9} {'Mmsg/s':>9} {'latency us (mean)':>24} "
           f"{'(median)':>8} {'CPU us/op srv/cli':>19} {'pkts/op':>11} {'sys/op srv/cli':>15}")
    for tool, title in (("softrdma", "softrdma: perftest on build/lib/libibverbs.so.1, device sr_lo (-x 1)"),
                        ("qperf", "qperf (TCP/UDP sockets on 127.0.0.1)"),
                        ("ucx", "UCX ucx_perftest (tcp on lo; posix = shared memory; cma = process_vm_writev)"),
                        ("libfabric", "libfabric fi_pingpong (tcp msg endpoint; shm rdm endpoint)"),
                        ("floor", "the harness's floors (floor-bench)")):
        group = [c for c in cases if c.tool == tool and c.kind != "machine"]
        if not group:
            continue
        w(title)
        w(hdr)
        for c in group:
            s = summary(c)
            if c.missing or not s:
                w(f"  {c.label:32} {size_str(c.size):>7} {c.qps:>3}  missing: {why(c, 'bw' if c.kind == 'bw' else 'lat_us')}")
                continue
            is_bw = c.kind == "bw"  # latency tests' by-product rates stay in the CSV/JSON
            bw = mmm(c, "bw", 1e-9) if is_bw and "bw" in s else "-"
            mib = fmt(s["bw"]["median"] / MIB) if is_bw and "bw" in s else "-"
            rate = fmt(s["rate"]["median"] / 1e6) if is_bw and "rate" in s else "-"
            lat = (mmm(c, "lat_us") + f" {c.rtt}") if "lat_us" in s else "-"
            typ = fmt(med(c, "lat_typical_us"))
            cpu = f"{fmt(med(c, 'cpu_server_us'))}/{fmt(med(c, 'cpu_client_us'))}"
            pk = fmt(med(c, "packets_per_op"))
            if med(c, "direct_per_op"):
                pk += f"+{fmt(med(c, 'direct_per_op'))}d"
            sysc = (f"{fmt(s['syscalls_server']['median'])}/{fmt(s['syscalls_client']['median'])}"
                    if "syscalls_server" in s and "syscalls_client" in s else "-")
            w(f"  {c.label:32} {size_str(c.size):>7} {c.qps:>3} {bw:>22} {mib:>9} {rate:>9} {lat:>24} {typ:>8} {cpu:>19} "
              f"{pk:>11} {sysc:>15}")
        w("")
    # Side by side: the same size across tools (1 QP).
    bw_series = series(cases, "bw")
    lat_series = series(cases, "lat_us")
    for title, ser, metric, scale in (("bandwidth GB/s", bw_series, "bw", 1e-9),
                                      ("latency us (h = half RTT, f = full RTT)", lat_series, "lat_us", 1.0)):
        w("side by side, 1 QP (medians): " + title)
        names = [n for n, _ in ser]
        w(f"  {'size':>7} " + " ".join(f"{n[:14]:>14}" for n in names))
        for size in SIZES:
            row = []
            for _, cs in ser:
                c = cs.get(size)
                row.append(fmt(med(c, metric) * scale) if c is not None and med(c, metric) is not None else "-")
            if any(v != "-" for v in row):
                w(f"  {size_str(size):>7} " + " ".join(f"{v:>14}" for v in row))
        w("  columns: " + "; ".join(n for n in names))
        w("")
    w("targets (issue 6): ratio = softrdma / peer, of medians from this run; run by run: the ratios of the runs of")
    w("  one pass (run k of each; the cases of a pass run one after the other), whose spread shows how far the")
    w("  machine's changing speed moves the ratio of medians; and those ratios again by the CPUs' placement, the")
    w(f"  pairs of runs whose placement probes (floor-bench placement, before and after each) all read close (at")
    w(f"  most {PLACEMENT_FAR_FACTOR}x the least probe: the two CPUs share a cache) or all far")
    if socket_case_variant(cases) != "socket":
        w("  (socket path = softrdma's default here: --socket-env none kept the same-host path on for them)")
    mach = find(cases, "floor", "machine", "cpu", 0)
    if med(mach, "pause_lost_pct") is not None:
        w(f"  (the machine, floor-bench machine: a system call (getppid) costs {fmt(med(mach, 'syscall_us'))} us; a "
          f"thread spinning alone on each CPU paused for 10 us or more {fmt(med(mach, 'pauses_per_s'))} times a "
          f"second, {fmt(med(mach, 'pause_median_us'))} us at the median (longest {fmt(med(mach, 'pause_max_us'))}), "
          f"the long ones every {fmt(med(mach, 'pause_period_ms'))} ms: {fmt(med(mach, 'pause_lost_pct'))}% of its "
          "time, which every latency mean here includes, the floors' too)")
    if med(mach, "cpu_speed_spread") is not None:
        spread = summary(mach)["cpu_speed_spread"]
        w(f"  (the CPUs' speeds, floor-bench machine: the slowest CPU took {fmt(spread['median'])}x as "
          f"long as the fastest for the same chain of integer steps, run by run {fmt(spread['min'])}-"
          f"{fmt(spread['max'])}x; a process on a slow CPU is slow in every figure, its peer's wait included)")
    handoffs = [r["line_handoff_ns"] for r in (mach.runs if mach else []) if r.get("line_handoff_ns")]
    if handoffs:
        # Pass by pass, beside the run-by-run ratios: a VM whose two CPUs share no cache in some minutes and one
        # in others (README, "Long packets and the two CPUs") runs every transfer between two processes slower
        # in the first, softrdma's and the peers' alike, and not always in the same minutes.
        w(f"  (the CPUs' placement, floor-bench machine: a cache line went from one CPU to the other in "
          f"{', '.join(fmt(h) for h in handoffs)} ns, pass by pass; a pass with a figure several times the others "
          "ran where the CPUs share no cache, and its runs of data between two processes ran slower)")
    (plain, rc), (shm, mem), (sock_ev, block), (host_ev, _), (tcp, stream) = beside_targets(cases)
    if med(plain, "lat_us") and med(rc, "lat_us"):
        # softrdma's own share of the socket-path latency targets: their figures against this floor.
        sock = socket_case_variant(cases)
        mine = [(t, find(cases, "softrdma", t, "sr_lo", 8, 1, sock)) for t in ("ib_write_lat", "ib_send_lat")]
        against = "; ".join(f"{t} {fmt(med(c, 'lat_us'))} us = {med(c, 'lat_us') / med(rc, 'lat_us'):.2f}x it"
                            for t, c in mine if med(c, "lat_us"))
        w(f"  (the RC pair's own floor, udp_pingpong_rc: {fmt(med(rc, 'lat_us'))} us = "
          f"{med(rc, 'lat_us') / med(plain, 'lat_us'):.2f}x the UDP floor, before any work of softrdma's"
          + (f"; {'socket path' if sock == 'socket' else 'default path'} {against}" if against else "") + ")")
        read = find(cases, "softrdma", "ib_read_lat", "sr_lo", 8, 1, sock)
        if med(read, "lat_us"):
            # The READ target's 2.0x of the half round trip is the floor's whole round trip: a request and a
            # response, the floor's two datagrams, with nothing left for the READ's own work on either side.
            w(f"  (ib_read_lat 8 B, a whole round trip of two datagrams: {fmt(med(read, 'lat_us'))} us = "
              f"{med(read, 'lat_us') / (2 * med(plain, 'lat_us')):.2f}x the UDP floor's whole round trip, "
              f"2 x {fmt(med(plain, 'lat_us'))} us, which the target's 2.0x its half equals)")
    if med(mem, "lat_us") and med(shm, "lat_us"):
        w(f"  (the same-host WRITE's own floor, mem_pingpong: {fmt(med(mem, 'lat_us'))} us = "
          f"{med(mem, 'lat_us') / med(shm, 'lat_us'):.2f}x fi_pingpong shm 64 B: a pwrite on the peer's "
          "/proc/<pid>/mem each way and nothing else)")
    ev = [(where, c) for where, c in (("over sockets", sock_ev), ("same-host", host_ev)) if med(c, "lat_us")]
    if med(block, "lat_us") and ev:
        figs = ", ".join(f"{where} {fmt(med(c, 'lat_us'))} us = {med(c, 'lat_us') / med(block, 'lat_us'):.2f}x"
                         for where, c in ev)
        w(f"  (waiting for completion events, not a target: 8-byte ib_send_lat -e {figs} the blocking UDP "
          f"ping-pong, udp_pingpong_block: {fmt(med(block, 'lat_us'))} us, a wake-up per half round trip)")
    one, many = (find(cases, "floor", "memcpy", "memory", MIB, q) for q in (1, 64))
    if med(one, "bw") and med(many, "bw"):
        w(f"  (memcpy of 1 MiB from 64 pairs of buffers in turn, as 64 QPs' buffers: {fmt(med(many, 'bw') * 1e-9)} "
          f"GB/s = {med(many, 'bw') / med(one, 'bw'):.2f}x from one pair)")
    first, later = (find(cases, "floor", t, "memory", MIB, 64) for t in ("kernel_copy_first", "kernel_copy"))
    if med(first, "bw") and med(later, "bw"):
        extra_ms = (64 * MIB / med(first, "bw") - 64 * MIB / med(later, "bw")) * 1e3
        w(f"  (the kernel's copy from 64 QPs' 1 MiB sources, as sendmmsg copies them: {fmt(med(first, 'bw') * 1e-9)} GB/s "
          f"the first time, {fmt(med(later, 'bw') * 1e-9)} after: the first pass over them costs {extra_ms:.0f} ms more, "
          f"paid by softrdma at ibv_reg_mr (SOFTRDMA_MR_TOUCH), before the transfer)")
    if med(stream, "bw") and med(tcp, "bw"):
        # What the 1 MiB bandwidth target meets first: the same datagrams with none of softrdma's work.
        mine = find(cases, "softrdma", "ib_write_bw", "sr_lo", MIB, 1, socket_case_variant(cases))
        close = run_by_run_placed(stream, "bw", tcp, "bw", least_placement(cases)).get("close")
        w(f"  (the socket path's bare stream, udp_stream: {fmt(med(stream, 'bw') * 1e-9)} GB/s = "
          f"{med(stream, 'bw') / med(tcp, 'bw'):.2f}x qperf tcp_bw 1 MiB"
          + (f" (close placement, {close['n']} of its runs: {close['median']:.2f}x)" if close else "")
          + "; datagrams laid out as its 4 KiB WRITE packets, sent (each GSO message copied into one piece) and "
          "received as it does, no ICRC, no transport"
          + (f"; ib_write_bw 1 MiB {med(mine, 'bw') / med(stream, 'bw'):.2f}x it" if med(mine, "bw") else "") + ")")
    for t in tgts:
        status = "MET" if t["met"] else ("missed" if t["met"] is not None else "n/a")
        if t["ratio"] is None:
            w(f"  {status:6} {t['target']}: no figure ({t['why_missing']})")
        else:
            sc = 1e-9 if t["unit"] == "GB/s" else (1e-6 if t["unit"] == "Mmsg/s" else 1.0)
            pairs = t["run_by_run"]
            by_run = (f"; run by run {pairs['min']:.2f}-{pairs['max']:.2f}, median {pairs['median']:.2f}"
                      if pairs and pairs["n"] > 1 else "")
            placed = t.get("run_by_run_by_placement") or {}
            by_run += "".join(f"; {where} placement ({p['n']} of {pairs['n']}) median {p['median']:.2f}"
                              for where in ("close", "far") if pairs and (p := placed.get(where)))
            w(f"  {status:6} {t['target']}: {fmt(t['softrdma'] * sc)} vs {fmt(t['peer'] * sc)} {t['unit']}, "
              f"ratio {t['ratio']:.2f} (needs {t['op']} {t['limit']}){by_run}")
    return "\n".join(lines) + "\n"


def series(cases, metric):
    """[(column name, {size: case})] of 1-QP cases that have `metric`, in a fixed order."""
    out = {}
    for c in cases:
        if c.qps != 1 or c.missing or med(c, metric) is None:
            continue
        if metric == "bw" and c.tool == "libfabric":
            continue  # fi_pingpong's MB/sec counts both directions of a ping-pong: not a bandwidth
        if metric == "bw" and c.kind == "lat":
            continue
        name = c.label + ((" " + c.rtt[0]) if metric == "lat_us" else "")
        out.setdefault(name, {})[c.size] = c
    return list(out.items())


def write_csv(path, cases):
    cols = ["id", "tool", "test", "transport", "variant", "size", "qps", "kind", "latency_convention", "run",
            "bw_bytes_per_sec", "msg_rate_per_sec", "lat_us", "lat_typical_us", "ops", "cpu_server_us_per_op",
            "cpu_client_us_per_op", "cpu_server_s", "cpu_client_s", "packets_per_op", "direct_per_op", "retransmits",
            "syscalls_server_per_op", "syscalls_client_per_op", "error"] + MACHINE_METRICS + PLACEMENT_PROBES
    with open(path, "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(cols)
        for c in cases:
            rows = list(enumerate(c.runs, 1))
            if c.setup:
                rows.insert(0, ("setup", c.setup))  # its CPU seconds are what each run's per-op CPU is less
            if c.syscall_run:
                rows.append(("syscalls", c.syscall_run))
            if not rows:
                rows = [("-", {"error": c.missing or "not run"})]
            for run, r in rows:
                wr.writerow([c.id, c.tool, c.test, c.transport, c.variant, c.size, c.qps, c.kind, c.rtt, run,
                             r.get("bw"), r.get("rate"), r.get("lat_us"), r.get("lat_typical_us"), r.get("ops"),
                             r.get("cpu_server_us"), r.get("cpu_client_us"), r.get("cpu_server_s"),
                             r.get("cpu_client_s"), r.get("packets_per_op"),
                             r.get("direct_per_op"),
                             r.get("retransmits"), r.get("syscalls_server"), r.get("syscalls_client"),
                             r.get("error", c.missing)] + [r.get(m) for m in MACHINE_METRICS + PLACEMENT_PROBES])


def plot(path, cases):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"no plot: matplotlib is missing ({e}; Debian package python3-matplotlib)"
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 6))
    for ax, metric, scale, ylabel in ((ax1, "bw", 1e-9, "bandwidth, GB/s (10^9 B/s)"),
                                      (ax2, "lat_us", 1.0, "latency, us (h: half RTT, f: full RTT)")):
        for name, by_size in series(cases, metric):
            xs = sorted(by_size)
            ys = [med(by_size[x], metric) * scale for x in xs]
            style = "-o" if name.startswith("ib_") else "--."
            ax.plot(xs, ys, style, label=name, linewidth=2 if name.startswith("ib_") else 1)
        if metric == "bw":
            for q in (8, 64):
                pts = sorted((c.size, med(c, "bw") * scale) for c in cases
                             if c.test == "ib_write_bw" and c.qps == q and c.variant == "default"
                             and med(c, "bw") is not None)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], ":o", label=f"ib_write_bw {q} QPs")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(SIZES)
        ax.set_xticklabels([size_str(s) for s in SIZES])
        ax.set_xlabel("message size")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    ax1.set_title("bandwidth against size (1 QP unless named)")
    ax2.set_title("latency against size")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return None


def git_commit():
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--quick", action="store_true", help="only the cases the targets need, short runs")
    ap.add_argument("--runs", type=int, default=None, help="runs per case (default 3, --quick 1)")
    ap.add_argument("--only", default=None, help="only the cases whose id (see --list) matches this regular "
                    "expression, chosen from all cases; with --quick they get --quick's short runs")
    ap.add_argument("--build", default=os.path.join(REPO, "build"), help="the build directory (default build/)")
    ap.add_argument("--out", default=None, help="where the outputs go (default BUILD/bench)")
    ap.add_argument("--socket-env", action="append", default=None, metavar="VAR=VALUE",
                    help="environment that turns softrdma's same-host path off (default SOFTRDMA_SHM=0): the "
                         "socket-path target cases run again with it (variant 'socket'); 'none': they do not")
    ap.add_argument("--no-syscalls", action="store_true", help="skip the syscall-counting pass")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--port-base", type=int, default=23000)
    ap.add_argument("--list", action="store_true", help="print the case ids and exit")
    args = ap.parse_args()
    if args.socket_env is None:
        args.socket_env = ["SOFTRDMA_SHM=0"]  # the setting of softrdma's same-host path (src/io/shm)
    args.socket_env = [kv for kv in args.socket_env if kv != "none"]
    runs = args.runs or (1 if args.quick else 3)
    build = os.path.abspath(args.build)
    out = os.path.abspath(args.out or os.path.join(build, "bench"))
    os.makedirs(out, exist_ok=True)

    cases = all_cases(bool(args.socket_env))
    if args.only:  # from every case (with --quick's short runs if given)
        cases = [c for c in cases if re.search(args.only, c.id)]
    elif args.quick:
        cases = [c for c in cases if in_quick(c)]
    cma_missing = cma_unavailable()
    for c in cases:
        if c.transport == "cma" and not c.missing and cma_missing:
            c.missing = cma_missing
    if args.list:
        for c in cases:
            print(c.id + (f"  (missing: {c.missing})" if c.missing else ""))
        return 0
    if not os.path.exists(os.path.join(build, "lib", "libibverbs.so.1")):
        print(f"bench: {build}/lib/libibverbs.so.1 is missing: build first (scripts/build.sh)", file=sys.stderr)
        return 2

    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "host": os.uname().nodename, "kernel": os.uname().release, "cpus": os.cpu_count(),
            "commit": git_commit(), "runs": runs, "quick": args.quick,
            "loadavg_start": " ".join(open("/proc/loadavg").read().split()[:3]), "socket_env": args.socket_env,
            "units": {"bw": "bytes/s", "rate": "operations/s", "lat_us": "microseconds, mean per operation",
                      "lat_typical_us": "microseconds, the run's median", "cpu_*_us": "CPU microseconds per operation",
                      "packets_per_op": "packets sent by both softrdma processes per operation",
                      "direct_per_op": "operations done one-sided (same host, no packet) per operation",
                      "syscalls_*": "syscalls per operation",
                      "syscall_us": "microseconds per getppid (the machine case)",
                      "cpu_speed_spread": "the slowest CPU's time over the fastest's for the same fixed work (the "
                                          "machine case)",
                      "line_handoff_ns": "nanoseconds for a cache line to go from one CPU to another, two pinned "
                                         "threads taking turns at a counter (the machine case)",
                      "placement_*_ns": "the same, by floor-bench placement just before and just after each run "
                                        "of a case that a target compares",
                      "pause*": "a spinning thread's stops of 10 us or more, per CPU: per second, their median "
                                "and longest in microseconds, the share of its time in percent, the period of the "
                                "20 us ones in milliseconds"}}
    runner = Runner(args, build, out)
    todo = execution_order([c for c in cases if not c.missing])
    # The runs of the cases that targets compare, and of the floors printed beside them, are each framed by
    # the CPUs' placement (floor-bench placement, before and after), so that their ratios can also be read
    # placement by placement. Such cases run one after the other (execution_order): one run's probe after is
    # the next one's before.
    compared = {i for t in targets(todo) for i in t["case_ids"]}
    compared |= {c.id for pair in beside_targets(todo) for c in pair if c is not None}
    started = time.monotonic()
    for run in range(1, runs + 1):
        last_probe = None  # the probe after the run just before, if it was framed
        for i, c in enumerate(todo, 1):
            t0 = time.monotonic()
            if run == 1:
                c.setup = runner.setup_cost(c)
                last_probe = None  # a setup run came between
            before = (last_probe or runner.placement()) if c.id in compared else None
            try:
                r = runner.run(c, run)
            except Missing as e:
                r = {"error": str(e)}
            last_probe = None
            if before is not None:
                last_probe = runner.placement()
                r["placement_before_ns"], r["placement_after_ns"] = before, last_probe
            c.runs.append(r)
            fig = (f"{fmt(r['bw'] / 1e9)} GB/s" if "bw" in r and c.kind == "bw" else
                   f"{fmt(r['lat_us'])} us {c.rtt}" if "lat_us" in r else
                   f"syscall {fmt(r['syscall_us'])} us, {fmt(r['pause_lost_pct'])}% in pauses"
                   if "pause_lost_pct" in r else "missing: " + r.get("error", "?"))
            print(f"[run {run}/{runs} {i}/{len(todo)}] {c.id}: {fig} ({time.monotonic() - t0:.1f} s)", flush=True)
    if not args.no_syscalls:
        counter = SyscallCounter(runner.logdir)
        if counter.how == "strace" and args.quick:
            counter.how, counter.why = None, ("perf stat cannot count here (" + counter.why + "), and strace slows "
                                              "busy-polling processes too much for --quick")
        if counter.how is None:
            meta["syscalls"] = "not counted: " + counter.why
            print("syscalls " + meta["syscalls"], flush=True)
        else:
            meta["syscalls"] = counter.how
            runner.sys = counter
            for c in [c for c in todo if syscall_subset(c, args.quick)]:
                c.syscall_setup = runner.setup_cost(c)
                try:
                    c.syscall_run = runner.run(c, "sys")
                except Missing as e:
                    c.syscall_run = {"error": str(e)}
                print(f"[syscalls] {c.id}: server {fmt(c.syscall_run.get('syscalls_server'))}/op, client "
                      f"{fmt(c.syscall_run.get('syscalls_client'))}/op", flush=True)
    else:
        meta["syscalls"] = "skipped (--no-syscalls)"
    meta["seconds"] = round(time.monotonic() - started, 1)
    meta["loadavg_end"] = " ".join(open("/proc/loadavg").read().split()[:3])
    # The end's load average includes the benchmark's own busy-polling processes: judge by the start's.
    meta["under_load"] = float(meta["loadavg_start"].split()[0]) > 0.5

    tg = targets(cases)
    text = table(cases, meta, tg)
    with open(os.path.join(out, "table.txt"), "w") as f:
        f.write(text)
    write_csv(os.path.join(out, "results.csv"), cases)
    doc = {"meta": meta, "conventions": __doc__, "targets": tg,
           "cases": [{"id": c.id, "tool": c.tool, "test": c.test, "transport": c.transport, "variant": c.variant,
                      "size": c.size, "qps": c.qps, "kind": c.kind, "latency_convention": c.rtt,
                      "missing": c.missing or None, "runs": c.runs, "setup_run": c.setup, "syscall_run": c.syscall_run,
                      "syscall_setup_run": c.syscall_setup,
                      "summary": summary(c)} for c in cases]}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(doc, f, indent=1)
    print()
    print(text, end="")
    if not args.no_plot:
        err = plot(os.path.join(out, "plot.png"), cases)
        print(err if err else f"plot: {os.path.join(out, 'plot.png')}")
    print(f"table: {out}/table.txt  csv: {out}/results.csv  json: {out}/results.json  ({meta['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
