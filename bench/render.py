"""Renders bench/out into BENCHMARKS.md (stdout)."""
import datetime
import json
import platform
import re
import subprocess
import sys
from statistics import median
from pathlib import Path

out, dur, idle_kb, peak_kb, ml = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5])


def wrk_ms(text):
    """wrk prints latencies as 850.00us, 1.70ms or 1.02s."""
    for unit, scale in (("us", 1e-3), ("ms", 1.0), ("s", 1e3)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    raise ValueError(f"unknown wrk latency {text!r}")


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

# Steps that failed (bench/run.sh records "name exit_status" lines) and whose tables are
# therefore incomplete or missing.
failed = {}
if (out / "failed.txt").exists():
    for line in (out / "failed.txt").read_text().splitlines():
        name, rc = line.split(" ", 1)
        failed[name] = rc
if failed:
    print("**FAILED steps** (their tables below are marked and incomplete): "
          + ", ".join(f"`{n}` (exit {rc})" for n, rc in failed.items()) + "\n")

print("## 1. Proxy overhead\n")
print("Small v2 JSON infer requests for `simple` (two INT32 [1,16] inputs), `wrk -t1 -c32`. The backend is a")
print("`tensorgate worker` on core 1 (with wrk); each proxy runs single-threaded on core 0 (`taskset`,")
print("`TOKIO_WORKER_THREADS=1`, nginx `worker_processes 1`). nginx keeps upstream connections alive; for")
print("sequences it hashes an `X-Sequence-Id` header, while tensorgate reads `sequence_id` from the body,")
print("validates the request, and pins the sequence.\n")
rounds = {}
for line in (out / "proxy_rounds.txt").read_text().splitlines():
    name, rnd, ticks, clk, rps, p50, p99, *err = line.split(" ")
    rounds.setdefault(name, []).append(
        {"round": int(rnd), "rps": float(rps), "p50": wrk_ms(p50), "p99": wrk_ms(p99),
         "cpu_us": int(ticks) * 1e6 / int(clk) / (float(rps) * float(dur)), "errors": " ".join(err)})
n_rounds = max((len(v) for v in rounds.values()), default=0)
print(f"{n_rounds} interleaved rounds of {dur} s per path; the medians, with the range over rounds. CPU/req is the")
print("CPU time (user + system) of the proxy process, or of the worker for the direct path, per request served:")
print("it shows the cost of each proxy even when core 1 (worker and wrk) limits the req/s.\n")
print("| path | req/s (median) | req/s range | p50 | p99 | CPU/req | errors |")
print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
for name, label in [("direct", "(a) worker directly"), ("nginx", "(b) nginx → worker"), ("tensorgate", "(c) tensorgate → worker"),
                    ("direct_seq", "(a) directly, with sequence_id"), ("nginx_seq", "(b) nginx, hash of X-Sequence-Id"),
                    ("tensorgate_seq", "(c) tensorgate, sequence_id in body")]:
    runs = rounds.get(name)
    if not runs:
        continue
    rps = [r["rps"] for r in runs]
    errors = sorted({r["errors"] for r in runs} - {"none"}) or ["none"]
    print(f"| {label} | {median(rps):,.0f} | {min(rps):,.0f}–{max(rps):,.0f} | {median(r['p50'] for r in runs):.2f} ms "
          f"| {median(r['p99'] for r in runs):.2f} ms | {median(r['cpu_us'] for r in runs):.1f} µs | {'; '.join(errors)} |")
for a, b, label in [("tensorgate", "nginx", "without sequences"), ("tensorgate_seq", "nginx_seq", "with sequences")]:
    if a in rounds and b in rounds:
        per_round = [x["rps"] / y["rps"] for x, y in zip(sorted(rounds[a], key=lambda r: r["round"]),
                                                        sorted(rounds[b], key=lambda r: r["round"]))]
        cpu_ratio = median(r["cpu_us"] for r in rounds[a]) / median(r["cpu_us"] for r in rounds[b])
        print(f"\ntensorgate/nginx req/s {label}: **{median(x['rps'] for x in rounds[a]) / median(x['rps'] for x in rounds[b]):.2f}**"
              f" (per round: {', '.join(f'{x:.2f}' for x in per_round)}; bounded by the worker on core 1,"
              f" which is slower than either proxy, so this ratio stays near 1 whatever the proxies cost:"
              f" section 8 compares them where the proxy is the bottleneck);"
              f" CPU per request, tensorgate/nginx: {cpu_ratio:.2f}")

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
rounds = ", ".join(f"{r:.3f}" for r in ml.get("round_ratios", []))
print(f"\nRatio: **{ml['ratio']:.3f}** (target ≥ 0.95: the gateway costs at most 5% of throughput;"
      f" median of interleaved rounds: {rounds})")

print("\n## 4. Memory\n")
r = rows.get("memory_256x1mb")
print(f"- Idle RSS of `tensorgate serve`: **{idle_kb / 1024:.1f} MB** (target ≤ 20 MB)")
print(f"- Peak RSS (VmHWM) over the whole run, including 256 concurrent 1 MB binary requests: **{peak_kb / 1024:.1f} MB**")
print(f"  (target ≤ 2 × 256 MB in flight + 20 MB = 532 MB){'; ' + f'{r[0]:,.1f} req/s' if r else ''}")

print("\n## 5. Micro-benchmarks (criterion)\n")
print("`cargo bench --bench <name> -- --warm-up-time 1 --measurement-time 3`; the middle estimate.\n")
print("| benchmark | time | throughput |\n| --- | ---: | ---: |")
TIME = re.compile(r"^(?:(\S+)\s+)?\s*time:\s+\[\S+ \S+ (\S+ \S+) \S+ \S+\]")
THRPT = re.compile(r"^\s+thrpt:\s+\[\S+ \S+ (\S+ \S+) \S+ \S+\]")
all_rows = []
for f in sorted(out.glob("criterion_*.txt")):
    # criterion prints "name time: [...]" on one line, or the name alone when it is long,
    # then "time:" and optionally "thrpt:" lines.
    bench_rows, name = [], None
    for line in f.read_text().splitlines():
        if m := TIME.match(line):
            name = m.group(1) or name
            bench_rows.append([name, m.group(2), ""])
        elif (m := THRPT.match(line)) and bench_rows:
            bench_rows[-1][2] = m.group(1)
        elif re.match(r"^\S+\s*$", line):
            name = line.strip()
    for bench, time, thrpt in bench_rows:
        print(f"| {bench} | {time} | {thrpt} |")
    all_rows += bench_rows
for name, rc in failed.items():
    if name.startswith("criterion_"):
        print(f"| {name.removeprefix('criterion_')} | **FAILED** (exit {rc}; see bench/out/{name}.txt) | |")

UNITS = {"ps": 1e-12, "ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}
times = {bench: float(time.split()[0]) * UNITS[time.split()[1]] for bench, time, _ in all_rows}
ratios = [(b.rsplit("/", 1)[0], times[b.rsplit("/", 1)[0] + "/serde_json_value"] / t)
          for b, t in times.items() if b.endswith("/tensorgate") and b.rsplit("/", 1)[0] + "/serde_json_value" in times]
if ratios:
    print("\nSpeed-up of tensorgate's codec over the `serde_json::Value` baseline in the same bench (target ≥ 3×):\n")
    for group, ratio in ratios:
        print(f"- {group}: **{ratio:.2f}×**")

print("\n## 6. Sequence hash quality\n")
print("`cargo run --release --example hash_quality`: the sequence table at the default `fleet.hash_table_size`, keyed by")
print("`routing::sequence_key` of `accumulate` sequences 1..1M, members named like backend URLs.\n")
hq = out / "hash_quality.jsonl"
rows_hq = [json.loads(l) for l in hq.read_text().splitlines() if l.startswith("{")] if hq.exists() else []
if "hash_quality" in failed:
    print(f"**FAILED** (exit {failed['hash_quality']}; see bench/out/hash_quality.log); rows below are what it printed.\n")


def met(v):
    return "n/a" if v is None else ("yes" if v else "**no**")


moved = {(r["n"], r["op"]): r for r in rows_hq if r["metric"] == "moved"}
if moved:
    r0 = next(iter(moved.values()))
    print(f"Keys moved when one backend joins (N−1 → N) or leaves (N → N−1), as moved share × N: 1.00 is the")
    print(f"minimum any consistent hash can do; the target is ≤ {r0['target']} (at most {r0['target']}/N of the keys move).")
    print(f"Mean and worst of {r0['trials']} joins and {r0['trials']} leaves of different backends, {r0['keys']:,} keys,"
          f" table of {r0['table_size']:,} buckets.\n")
    print("| N | join: moved × N (mean / worst) | leave: moved × N (mean / worst) | target | met |")
    print("| ---: | ---: | ---: | ---: | --- |")
    for n in sorted({n for n, _ in moved}):
        j, l = moved.get((n, "join")), moved.get((n, "leave"))
        cell = lambda r: f"{r['moved_times_n_mean']:.3f} / {r['moved_times_n_max']:.3f}" if r else "?"
        both = [r for r in (j, l) if r]
        print(f"| {n:,} | {cell(j)} | {cell(l)} | ≤ {both[0]['target']} | {met(all(r['met'] for r in both))} |")
balance = [r for r in rows_hq if r["metric"] == "balance"]
if balance:
    print("\nLoad balance: the busiest backend's keys over the mean, over 1M keys (sampling noise alone puts the")
    print("busiest of N backends about 2.5% above the mean at N = 100 and 10% at N = 1,000), and the same for")
    print("table buckets, which is the hash's own balance without that noise.\n")
    print("| N | max/mean keys | max/mean buckets | target | met |")
    print("| ---: | ---: | ---: | ---: | --- |")
    for r in sorted(balance, key=lambda r: r["n"]):
        target = f"≤ {r['target']}" if r["target"] is not None else "none"
        print(f"| {r['n']:,} | {r['keys_max_over_mean']:.4f} | {r['slots_max_over_mean']:.6f} | {target} | {met(r['met'])} |")
if not rows_hq and "hash_quality" not in failed:
    print("(not run)")
