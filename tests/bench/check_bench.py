#!/usr/bin/python3
"""Runs bench/run.py --quick and checks what it must produce: the table, a CSV and a JSON of raw figures with
a figure (or a stated reason) for every case, CPU time and packets per operation for softrdma's cases, the
targets, and the PNG plot. It asserts no speed. Usage: check_bench.py REPO BUILD OUTDIR"""
import csv
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

repo, build, out = sys.argv[1:4]
_spec = importlib.util.spec_from_file_location("run_py", os.path.join(repo, "bench", "run.py"))
run_py = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_py)  # its constants (bench/run.py runs only as __main__)
if not shutil.which("ib_write_bw"):
    print("perftest not installed (scripts/deps.sh installs it)")
    sys.exit(77)
shutil.rmtree(out, ignore_errors=True)
r = subprocess.run(["/usr/bin/python3", os.path.join(repo, "bench", "run.py"), "--quick", "--build", build,
                    "--out", out], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=170)
print(r.stdout)
printed = r.stdout
errors = []


def check(cond, what):
    if not cond:
        errors.append(what)


check(r.returncode == 0, f"bench/run.py exited {r.returncode}")
table = open(os.path.join(out, "table.txt")).read() if os.path.exists(os.path.join(out, "table.txt")) else ""
for heading in ("softrdma: perftest", "qperf", "UCX", "fi_pingpong", "floors", "side by side", "targets (issue 6)"):
    check(heading in table, f"table.txt lacks '{heading}'")
check(table and table in r.stdout, "the table printed differs from table.txt")

doc = json.load(open(os.path.join(out, "results.json")))
cases = doc["cases"]
check(len(cases) >= 20, f"only {len(cases)} cases in results.json")
tools = {"softrdma": "ib_write_bw", "qperf": "qperf", "ucx": "ucx_perftest", "libfabric": "fi_pingpong",
         "floor": None}
for c in cases:
    metric = {"bw": "bw", "machine": "syscall_us"}.get(c["kind"], "lat_us")
    fig = c["summary"].get(metric, {}).get("median")
    if c["missing"]:
        check(len(c["missing"]) > 10, f"{c['id']}: missing without a reason")
        continue
    if tools.get(c["tool"]) and not shutil.which(tools[c["tool"]]):
        continue  # a peer that is not installed: the table says so
    check(fig is not None and fig > 0, f"{c['id']}: no {metric} figure ({[x.get('error') for x in c['runs']]})")
    if c["tool"] == "softrdma" and fig:
        # CPU per operation is each run's CPU less the setup run's, per operation beyond the setup run's, and
        # is left out where less than MIN_WORK_CPU_S remains (--quick's short runs, often).
        setup = c["setup_run"]
        check(setup and setup["cpu_server_s"] > 0 and setup["cpu_client_s"] > 0, f"{c['id']}: no setup run")
        for r in c["runs"]:
            for side in ("server", "client"):
                check(r.get(f"cpu_{side}_s", 0) > 0, f"{c['id']}: no CPU time of the {side}")
                if setup and f"cpu_{side}_us" in r:
                    work = r[f"cpu_{side}_s"] - setup[f"cpu_{side}_s"]
                    want = work * 1e6 / (r["ops"] - setup["ops"])
                    check(work >= run_py.MIN_WORK_CPU_S and abs(r[f"cpu_{side}_us"] - want) <= 1e-9 * want,
                          f"{c['id']}: cpu_{side}_us {r[f'cpu_{side}_us']} is not (CPU - setup) / (ops - setup ops)")
        # Every operation is either packets or, on the same host, one-sided with none.
        moved = sum(c["summary"].get(m, {}).get("median", 0) for m in ("packets_per_op", "direct_per_op"))
        check(moved > 0, f"{c['id']}: neither packets nor one-sided operations counted")
        check(c["test"] in table, f"{c['id']} not in the table")
    if c["kind"] == "lat":
        check(c["latency_convention"] in ("half", "full"), f"{c['id']}: latency not labelled half/full")

# Syscalls per operation (when they could be counted) less the setup run's counted in the same pass.
if "not counted" not in doc["meta"].get("syscalls", "not counted"):
    for c in [c for c in cases if c["tool"] == "softrdma" and c["syscall_run"] and "error" not in c["syscall_run"]]:
        setup, r = c["syscall_setup_run"], c["syscall_run"]
        check(setup and setup.get("syscalls_client_total", 0) > 0, f"{c['id']}: no counted setup run")
        if setup and "syscalls_client" in r:
            want = (r["syscalls_client_total"] - setup["syscalls_client_total"]) / (r["ops"] - setup["ops"])
            check(abs(r["syscalls_client"] - want) <= 1e-9 * want, f"{c['id']}: syscalls_client is not less the setup's")

# The floors that bound the targets are printed beside them when they ran.
for test, line in (("udp_pingpong_rc", "the RC pair's own floor"), ("mem_pingpong", "the same-host WRITE's own floor"),
                   ("udp_pingpong_block", "the blocking UDP ping-pong, udp_pingpong_block")):
    floor = [c for c in cases if c["tool"] == "floor" and c["test"] == test]
    if floor and floor[0]["summary"].get("lat_us", {}).get("median"):
        check(line in table, f"table.txt lacks '{line}'")
# softrdma's socket-path ib_write_lat set against the RC pair's floor, on that floor's line, when both ran.
rc_floor = [c for c in cases if c["tool"] == "floor" and c["test"] == "udp_pingpong_rc"]
write_lat = [c for c in cases if c["tool"] == "softrdma" and c["test"] == "ib_write_lat" and c.get("variant") == "socket"]
if rc_floor and write_lat and all(c["summary"].get("lat_us", {}).get("median") for c in rc_floor + write_lat):
    rc_line = next((l for l in table.splitlines() if "the RC pair's own floor" in l), "")
    check("socket path ib_write_lat" in rc_line and "x it" in rc_line,
          f"the RC pair's floor line does not set ib_write_lat against it: {rc_line!r}")

machine = [c for c in cases if c["tool"] == "floor" and c["test"] == "machine"]
check(len(machine) == 1, "the machine floor is not in the quick run")
if machine and machine[0]["summary"].get("pause_lost_pct"):
    check("(the machine, floor-bench machine:" in table, "table.txt lacks the machine's figures beside the targets")
    # The CPUs' speeds: the slowest over the fastest, so at least 1 (a parse that lost it, or a division the
    # wrong way round, fails here).
    spread = machine[0]["summary"].get("cpu_speed_spread", {}).get("median")
    check(spread is not None and spread >= 1.0, f"the machine case's cpu_speed_spread is {spread}, not >= 1")
    check("(the CPUs' speeds, floor-bench machine:" in table, "table.txt lacks the CPUs' speeds beside the targets")
    # The CPUs' placement, pass by pass: a cache line's hand-off between two CPUs takes some nanoseconds and
    # less than a millisecond (a batch that found no answer within a second gives 0).
    if (os.cpu_count() or 1) >= 2:
        handoffs = [r.get("line_handoff_ns") for r in machine[0]["runs"] if "error" not in r]
        check(handoffs and all(h is not None and 1 <= h < 1e6 for h in handoffs),
              f"the machine case's line_handoff_ns per pass are {handoffs}")
        check("(the CPUs' placement, floor-bench machine:" in table,
              "table.txt lacks the CPUs' placement beside the targets")
        # Each run of a case that a target compares is framed by two placement probes.
        compared = {i for t in doc["targets"] for i in t["case_ids"] if i}
        framed = [r.get(k) for c in cases if c["id"] in compared for r in c["runs"] if "error" not in r
                  for k in ("placement_before_ns", "placement_after_ns")]
        check(framed and all(p is not None and 1 <= p < 1e6 for p in framed),
              f"the targets' runs lack their placement probes: {framed[:6]}")

kernel = [c for c in cases if c["tool"] == "floor" and c["test"] in ("kernel_copy_first", "kernel_copy")]
check(len(kernel) == 2, "the kernel_copy floors are not both in the quick run")
if all(c["summary"].get("bw", {}).get("median") for c in kernel):
    check("the kernel's copy from 64 QPs'" in table, "table.txt lacks the kernel_copy floors beside the targets")

stream = [c for c in cases if c["tool"] == "floor" and c["test"] == "udp_stream"]
check(len(stream) == 1, "the udp_stream floor is not in the quick run")
stream_bw = stream[0]["summary"].get("bw", {}).get("median") if stream else None
# Loopback moves a stream at 1-100 GB/s on any machine this runs on; a figure outside says the parse is off.
check(stream_bw is not None and 1e8 < stream_bw < 1e11, f"the udp_stream floor's figure is {stream_bw}")
if stream_bw:
    check("(the socket path's bare stream, udp_stream:" in table, "table.txt lacks the udp_stream floor")

targets = doc["targets"]
# Each pass runs the cases a target compares one after the other (the first pass's order, as printed).
order = [m.group(1) for m in re.finditer(r"^\[run 1/\d+ \d+/\d+\] (\S+):", printed, re.M)]
for t in targets:
    ids = t.get("case_ids") or []
    if len(ids) == 2 and all(i in order for i in ids):
        check(abs(order.index(ids[0]) - order.index(ids[1])) <= 3, f"{t['target']}: its cases ran far apart")

official = [t for t in targets if "opt-in" not in t["target"]]
check(len(official) == 10, f"{len(official)} targets, issue 6 lists 10")
check(len(targets) - len(official) == 2, "the two same-host targets are not repeated for SOFTRDMA_SHARE_MR=1")
for t in targets:
    check(t["ratio"] is not None or t["why_missing"], f"target without ratio or reason: {t['target']}")
    # One run each (--quick): the run-by-run ratio is the ratio of the two figures, as the ratio of medians.
    pairs = t.get("run_by_run")
    if t["ratio"] is not None:
        check(pairs is not None and pairs["n"] >= 1, f"target without its run-by-run ratios: {t['target']}")
        if pairs and pairs["n"] == 1:
            check(abs(pairs["median"] - t["ratio"]) < 1e-9 * t["ratio"],
                  f"{t['target']}: run-by-run ratio {pairs['median']} differs from {t['ratio']}")
    check(t["target"] in table, f"target not in the table: {t['target']}")

with open(os.path.join(out, "results.csv")) as f:
    rows = list(csv.DictReader(f))
ids = {c["id"] for c in cases}
check({row["id"] for row in rows} == ids, "results.csv and results.json list different cases")
sr = [row for row in rows if row["tool"] == "softrdma" and row["run"] == "1"]
check(sr and all(row["bw_bytes_per_sec"] or row["lat_us"] for row in sr), "softrdma rows without figures in CSV")

if importlib.util.find_spec("matplotlib"):
    png = os.path.join(out, "plot.png")
    check(os.path.exists(png) and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n", "plot.png missing or not a PNG")

for e in errors:
    print("FAIL:", e)
print("bench output checked:", "FAILED" if errors else "ok")
sys.exit(1 if errors else 0)
