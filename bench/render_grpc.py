"""Renders bench/grpc_vs_rest.sh's results as a Markdown section (stdout)."""
import sys
from statistics import median

path, dur, rounds = sys.argv[1], sys.argv[2], sys.argv[3]
runs = {}
for line in open(path):
    name, rnd, done, failed, secs, ticks, clk, size = line.split()
    secs = float(secs)
    cpu = int(ticks) / int(clk)
    runs.setdefault(name, []).append({
        "rps": int(done) / secs, "failed": int(failed), "cpu_us": cpu * 1e6 / max(int(done), 1),
        "busy": cpu / secs, "mbps": int(done) * int(size) / secs / 1e6,
    })

labels = [
    ("simple_rest_json", "`simple`, REST JSON"),
    ("simple_rest_binary", "`simple`, REST binary tensors"),
    ("simple_grpc", "`simple`, gRPC (raw contents)"),
    ("fp32_1m_rest_binary", "1M FP32 `identity_fp32`, REST binary"),
    ("fp32_1m_grpc", "1M FP32 `identity_fp32`, gRPC raw"),
]
print(f"{rounds} interleaved rounds of {dur} s per path (h2load over h2c, one thread, on core 1;")
print("the gateway single-threaded on core 0, its built-in models in-process). Medians, with")
print("the gateway's CPU time (user + system) per request, and its CPU use per second of the")
print("run (1.0 = its core was saturated, so the gateway, not h2load, set the pace). MB/s counts")
print("request payload only; the answer is the same size again.\n")
print("| path | req/s (median) | req/s range | gateway CPU/req | gateway CPU use | MB/s in | failed answers |")
print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
for name, label in labels:
    r = runs.get(name)
    if not r:
        continue
    rps = [x["rps"] for x in r]
    print(f"| {label} | {median(rps):,.0f} | {min(rps):,.0f}–{max(rps):,.0f} | "
          f"{median(x['cpu_us'] for x in r):.1f} µs | {median(x['busy'] for x in r):.2f} | "
          f"{median(x['mbps'] for x in r):,.0f} | {sum(x['failed'] for x in r)} |")
