"""Renders bench/out into BENCHMARKS.md (stdout)."""
import datetime
import json
import platform
import re
import subprocess
import sys
from pathlib import Path

out, dur, idle_kb, peak_kb, ml = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5])
rows = {}
for line in (out / "results.txt").read_text().splitlines():
    name, rps, p50, p99, *err = line.split(" ")
    rows[name] = (float(rps), p50, p99, " ".join(err))


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:
        return "?"


cpu = sh("lscpu | sed -n 's/^Model name: *//p'") or platform.processor()
print("# Benchmarks\n")
print("Written by `bench/run.sh` (see bench/README.md); do not edit by hand.\n")
print(f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
mem_gib = sh("free -g | awk '/Mem:/ {print $2}'")
print(f"- Machine: {cpu}, {sh('nproc')} cores, {mem_gib} GiB, Linux {platform.release()}")
wrk_version = sh("wrk -v 2>&1 | head -1 | cut -d' ' -f2")
print(f"- tensorgate {sh('git rev-parse --short HEAD')}, release build; wrk {wrk_version}, {sh('nginx -v 2>&1')}")
print(f"- Command: `bench/run.sh {dur}` ({dur} s per wrk run)\n")

print("## 1. Proxy overhead\n")
print("Small v2 JSON infer requests for `simple` (two INT32 [1,16] inputs), `wrk -t1 -c32`. The backend is a")
print("`tensorgate worker` on core 1 (with wrk); each proxy runs single-threaded on core 0 (`taskset`,")
print("`TOKIO_WORKER_THREADS=1`, nginx `worker_processes 1`). nginx keeps upstream connections alive; for")
print("sequences it hashes an `X-Sequence-Id` header, while tensorgate reads `sequence_id` from the body,")
print("validates the request, and pins the sequence.\n")
print("| path | req/s | p50 | p99 | errors |\n| --- | ---: | ---: | ---: | --- |")
for name, label in [("direct", "(a) worker directly"), ("nginx", "(b) nginx → worker"), ("tensorgate", "(c) tensorgate → worker"),
                    ("direct_seq", "(a) directly, with sequence_id"), ("nginx_seq", "(b) nginx, hash of X-Sequence-Id"),
                    ("tensorgate_seq", "(c) tensorgate, sequence_id in body")]:
    if name in rows:
        r = rows[name]
        print(f"| {label} | {r[0]:,.0f} | {r[1]} | {r[2]} | {r[3]} |")
for a, b, label in [("tensorgate", "nginx", "without sequences"), ("tensorgate_seq", "nginx_seq", "with sequences")]:
    if a in rows and b in rows:
        print(f"\ntensorgate/nginx req/s {label}: **{rows[a][0] / rows[b][0]:.2f}** (target ≥ 1.00)")

print("\n## 2. Large tensors\n")
print("FP32 with 1M elements to `identity_fp32` through tensorgate → worker (`wrk -c4`). JSON → binary: the")
print("client sends JSON (~20 MB), the worker gets binary, the client asks for a binary output. Binary → JSON:")
print("the reverse. Pass-through: a 16 MB binary request and response that tensorgate forwards unchanged.\n")
print("| case | req/s | p50 | p99 |\n| --- | ---: | ---: | ---: |")
for name, label in [("large_json_to_binary", "JSON → binary (1M FP32)"), ("large_binary_to_json", "binary → JSON (1M FP32)"),
                    ("large_passthrough_tensorgate", "16 MB pass-through, tensorgate"), ("large_passthrough_nginx", "16 MB pass-through, nginx"),
                    ("large_passthrough_direct", "16 MB, worker directly")]:
    if name in rows:
        r = rows[name]
        print(f"| {label} | {r[0]:,.1f} | {r[1]} | {r[2]} |")

print("\n## 3. MLServer end to end\n")
print("tritonclient (4 threads, `simple` with two INT32 [64,16] inputs) against MLServer 1.7.1 directly in JSON,")
print("and through tensorgate in binary (tensorgate transcodes to JSON for MLServer, which has no binary).\n")
print("| path | req/s |\n| --- | ---: |")
print(f"| MLServer directly (JSON) | {ml['direct_json_rps']:,.1f} |\n| tensorgate (binary) → MLServer | {ml['gateway_binary_rps']:,.1f} |")
print(f"\nRatio: **{ml['ratio']:.3f}** (target ≥ 0.95: the gateway costs at most 5% of throughput)")

print("\n## 4. Memory\n")
r = rows.get("memory_256x1mb")
print(f"- Idle RSS of `tensorgate serve`: **{idle_kb / 1024:.1f} MB** (target ≤ 20 MB)")
print(f"- Peak RSS (VmHWM) over the whole run, including 256 concurrent 1 MB binary requests: **{peak_kb / 1024:.1f} MB**")
print(f"  (target ≤ 2 × 256 MB in flight + 20 MB = 532 MB){'; ' + f'{r[0]:,.1f} req/s' if r else ''}")

print("\n## 5. Micro-benchmarks (criterion)\n")
print("`cargo bench --bench <name> -- --warm-up-time 1 --measurement-time 3`; the middle estimate.\n")
print("| benchmark | time | throughput |\n| --- | ---: | ---: |")
for f in sorted(out.glob("criterion_*.txt")):
    text = f.read_text()
    name = None
    for line in text.splitlines():
        m = re.match(r"^(\S+)\s+time:\s+\[\S+ \S+ (\S+ \S+) \S+ \S+\]", line)
        if m:
            name = m.group(1)
            rows_t = m.group(2)
            print_row = [name, rows_t, ""]
            globals()["last"] = print_row
            print(f"| {name} | {rows_t} | |", end="")
            print()
            continue
        m = re.match(r"^(\S+)\s*$", line)
        if m and not line.startswith(" "):
            name = m.group(1)
            continue
        m = re.match(r"^\s+time:\s+\[\S+ \S+ (\S+ \S+) \S+ \S+\]", line)
        if m and name:
            print(f"| {name} | {m.group(1)} | |")
            continue
        m = re.match(r"^\s+thrpt:\s+\[\S+ \S+ (\S+ \S+) \S+ \S+\]", line)
        if m:
            print(f"| ↳ throughput | | {m.group(1)} |")
