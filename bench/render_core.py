"""Renders bench/proxy_core.sh's rounds as a Markdown table (stdout)."""
import os
import sys
from statistics import median

path, dur = sys.argv[1], float(sys.argv[2])


def ms(text):
    for unit, scale in (("us", 1e-3), ("ms", 1.0), ("s", 1e3)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    raise ValueError(text)


runs = {}
for line in open(path):
    name, rnd, ticks, clk, rps, p50, p99, non2xx, requests, pin_ops = line.split()
    rps = float(rps)
    runs.setdefault(name, []).append({
        "rps": rps, "p50": ms(p50), "p99": ms(p99), "non2xx": int(non2xx),
        "cpu_us": int(ticks) / int(clk) * 1e6 / (rps * dur),
        "trips": int(pin_ops) / max(int(requests), 1),
    })
labels = [
    ("backend_direct", "fixed-response backend, directly"),
    ("nginx_p1", "P1 nginx → backend"),
    ("tensorgate_p1", "P1 tensorgate → backend"),
    ("hyper_p1", "P1 bare hyper proxy, body streamed (no validation, no log)"),
    ("hyper_p1_buffered", "P1 bare hyper proxy, body read whole first"),
    ("nginx_p2", "P2 nginx, hash of X-Sequence-Id"),
    ("tensorgate_p2", "P2 tensorgate, sequence_id in body"),
    ("tensorgate_p2_redis", "P2 tensorgate, shared pins in Redis"),
    ("tensorgate_p2x20", "P2 tensorgate, sequences of 20 requests"),
    ("tensorgate_p2x20_redis", "P2 tensorgate, sequences of 20, shared pins in Redis"),
    ("tensorgate_p2_mt", "P2 tensorgate, multi-threaded runtime (one worker)"),
    ("tensorgate_p2_redis_mt", "P2 tensorgate, shared pins in Redis, multi-threaded runtime (one worker)"),
]
print(f"{max(map(len, runs.values()), default=0)} alternating rounds of {dur:g} s, `wrk -t1 -c{os.environ.get('CONNS', '32')} --latency`; medians.\n")
print("| path | req/s | req/s range | p50 | p99 | CPU/req of the proxy (backend for the direct row) | non-2xx |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for name, label in labels:
    r = runs.get(name)
    if not r:
        continue
    rps = [x["rps"] for x in r]
    print(f"| {label} | {median(rps):,.0f} | {min(rps):,.0f}–{max(rps):,.0f} | {median(x['p50'] for x in r):.2f} ms | "
          f"{median(x['p99'] for x in r):.2f} ms | {median(x['cpu_us'] for x in r):.1f} µs | {sum(x['non2xx'] for x in r)} |")
for p in ("p1", "p2"):
    t, n = runs.get(f"tensorgate_{p}"), runs.get(f"nginx_{p}")
    if t and n:
        print(f"\n{p.upper()}: tensorgate/nginx req/s = {median(x['rps'] for x in t) / median(x['rps'] for x in n):.2f}, "
              f"CPU per request {median(x['cpu_us'] for x in t) / median(x['cpu_us'] for x in n):.2f} x nginx's.")
n = runs.get("nginx_p1")
for bare in ("hyper_p1", "hyper_p1_buffered"):
    h, t = runs.get(bare), runs.get("tensorgate_p1")
    if h and n:
        line = (f"\n{bare}: req/s {median(x['rps'] for x in h) / median(x['rps'] for x in n):.2f} x nginx's, "
                f"CPU per request {median(x['cpu_us'] for x in h) / median(x['cpu_us'] for x in n):.2f} x")
        if t:
            line += (f"; tensorgate's P1 spends {median(x['cpu_us'] for x in t) / median(x['cpu_us'] for x in h):.2f} x "
                     f"its CPU per request")
        print(line + ".")
b = runs.get("backend_direct")
fast = max((median(x["rps"] for x in runs[k])
            for k in ("nginx_p1", "tensorgate_p1", "hyper_p1", "hyper_p1_buffered") if k in runs), default=0)
if b and fast:
    print(f"\nBackend headroom: {median(x['rps'] for x in b) / fast:.2f} x the faster proxy (target ≥ 1.5).")
for memory, redis in (("tensorgate_p2", "tensorgate_p2_redis"), ("tensorgate_p2x20", "tensorgate_p2x20_redis"),
                      ("tensorgate_p2_mt", "tensorgate_p2_redis_mt")):
    m, r = runs.get(memory), runs.get(redis)
    if m and r:
        print(f"\n{redis}: req/s {median(x['rps'] for x in r) / median(x['rps'] for x in m):.2f} x the memory store's, "
              f"CPU per request {median(x['cpu_us'] for x in r) / median(x['cpu_us'] for x in m):.2f} x, "
              f"{median(x['trips'] for x in r):.3f} Redis round trips per request.")
