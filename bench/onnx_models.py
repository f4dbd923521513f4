"""tract (in `tensorgate worker`) against onnxruntime on the ONNX fixture models, and the
end-to-end rendering. bench/onnx_models.sh drives it; each subcommand does one step:

  prepare SRC DST          copy mlp, cnn and intbool from the fixture repository SRC to DST,
                           each with `instance_group [ { count: 1 kind: KIND_CPU } ]`
  ort REPO SECONDS ROUND   onnxruntime, 1 intra-op and 1 inter-op thread, sequential: each
                           case warmed up, then timed for SECONDS (run it under taskset)
  tract ADDR REPO SECONDS ROUND
                           a client at concurrency 1 (binary tensor extension) against a
                           worker serving DST: each case warmed up and checked against
                           onnxruntime, then timed for SECONDS, with the worker's statistics
                           (GET /v2/models/{m}/stats) before and after
  bodies DIR               wrk bodies (binary) for mlp and cnn at batch 1; prints the JSON
                           header lengths
  render OUT SECONDS ROUNDS CONNS BIN COMMAND
                           the Markdown section, from OUT/part1.jsonl and OUT/e2e.txt

`ort` and `tract` print one JSON line per case. Times are in nanoseconds.

What tract's model time is: the worker's `compute_infer`, which for a repository model is
the run on the blocking-pool thread (src/fleet/builtin.rs): copying the inputs into tract
tensors, plan.run, and converting the outputs. The model's lookup, the wait for an
instance's permit and the handoff to that thread and back are the statistics' `queue`; at
concurrency 1 that is the lookup and the handoff. Both are reported: compute_infer against onnxruntime's call is the
model-time comparison, and compute_infer + queue (the whole backend call) is an upper bound
of what a call costs the worker. onnxruntime's numbers carry Python's per-call cost; each
side's fixed cost per call is bounded by its cheapest call among `intbool` (three
element-wise ops on [1,4]) and the mlp at batch 1, and a third ratio takes each side's out. The client's request time minus that of the built-in `simple` model
(which runs inline, without the hop) is reported too.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

# (model, batch) pairs of the comparison; intbool is the fixed-cost calibration.
CASES = [("mlp", 1), ("mlp", 8), ("cnn", 1), ("cnn", 8)]
FLOOR = ("intbool", 1)
GROUP = "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int32): "INT32"}
NUMPY = {"FP32": np.float32, "INT32": np.int32, "INT64": np.int64, "BOOL": np.bool_}


def inputs_of(model: str, batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch)
    if model == "mlp":
        return {"INPUT": rng.random((batch, 16), dtype=np.float32)}
    if model == "cnn":
        return {"IMAGE": rng.random((batch, 1, 28, 28), dtype=np.float32)}
    if model == "intbool":
        return {n: rng.integers(-50, 50, (batch, 4), dtype=np.int32) for n in ("A", "B")}
    if model == "simple":
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        return {"INPUT0": a, "INPUT1": a}
    raise ValueError(model)


def latest(repo: Path, model: str) -> Path:
    versions = [int(p.name) for p in (repo / model).iterdir() if p.name.isdigit()]
    return repo / model / str(max(versions)) / "model.onnx"


def session(path: Path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


# ---------------------------------------------------------------------------- prepare
def prepare(src: Path, dst: Path) -> None:
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for model in ("mlp", "cnn", "intbool"):
        shutil.copytree(src / model, dst / model)
        cfg = dst / model / "config.pbtxt"
        if cfg.exists():
            text = re.sub(r"instance_group\s*\[[^\]]*\]\s*", "", cfg.read_text())
            cfg.write_text(text.rstrip("\n") + "\n" + GROUP)
        else:
            cfg.write_text(f'name: "{model}"\n' + GROUP)


# ---------------------------------------------------------------------------- ort
def timed(call, seconds: float) -> list[int]:
    """Calls `call` for `seconds` after a warm-up; the duration of each call, in ns."""
    end = time.perf_counter() + max(0.3, seconds / 10)
    n = 0
    while n < 20 or time.perf_counter() < end:
        call()
        n += 1
    return time_calls(call, seconds)


def time_calls(call, seconds: float) -> list[int]:
    """Calls `call` for `seconds`, no warm-up; the duration of each call, in ns."""
    times = []
    end = time.perf_counter_ns() + int(seconds * 1e9)
    while True:
        a = time.perf_counter_ns()
        call()
        b = time.perf_counter_ns()
        times.append(b - a)
        if b >= end:
            return times


def run_ort(repo: Path, seconds: float, rnd: int) -> None:
    import onnxruntime as ort

    for model, batch in CASES + [FLOOR]:
        sess = session(latest(repo, model))
        feeds = inputs_of(model, batch)
        times = timed(lambda: sess.run(None, feeds), seconds)
        emit({"side": "ort", "round": rnd, "model": model, "batch": batch, "calls": len(times),
              "mean_ns": statistics.fmean(times), "median_ns": statistics.median(times),
              "version": ort.__version__, "affinity": sorted(os.sched_getaffinity(0))})


# ---------------------------------------------------------------------------- tract
def binary_body(inputs: dict[str, np.ndarray]) -> tuple[bytes, int]:
    header = json.dumps({
        "inputs": [{"name": n, "shape": list(a.shape), "datatype": DATATYPES[a.dtype],
                    "parameters": {"binary_data_size": a.nbytes}} for n, a in inputs.items()],
        "parameters": {"binary_data_output": True},
    }, separators=(",", ":")).encode()
    return header + b"".join(np.ascontiguousarray(a).tobytes() for a in inputs.values()), len(header)


def decode(resp: http.client.HTTPResponse, body: bytes) -> dict[str, np.ndarray]:
    hl = int(resp.getheader("Inference-Header-Content-Length") or len(body))
    header = json.loads(body[:hl])
    out, pos = {}, hl
    for o in header["outputs"]:
        dt = NUMPY[o["datatype"]]
        size = o.get("parameters", {}).get("binary_data_size")
        if size is None:
            out[o["name"]] = np.array(o["data"], dtype=dt).reshape(o["shape"])
            continue
        out[o["name"]] = np.frombuffer(body[pos:pos + size], dtype=dt).reshape(o["shape"])
        pos += size
    return out


def stats(conn: http.client.HTTPConnection, model: str) -> dict[str, int]:
    conn.request("GET", f"/v2/models/{model}/stats")
    r = conn.getresponse()
    body = r.read()
    if r.status != 200:
        sys.exit(f"GET /v2/models/{model}/stats: {r.status} {body[:200]!r}")
    total = {"infer_count": 0, "infer_ns": 0, "queue_ns": 0, "success_count": 0, "success_ns": 0}
    for s in json.loads(body)["model_stats"]:  # every version of the model
        st = s["inference_stats"]
        total["infer_count"] += st["compute_infer"]["count"]
        total["infer_ns"] += st["compute_infer"]["ns"]
        total["queue_ns"] += st["queue"]["ns"]
        total["success_count"] += st["success"]["count"]
        total["success_ns"] += st["success"]["ns"]
    return total


def check(model: str, got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    for name, w in want.items():
        g = got.get(name)
        if g is None or g.shape != w.shape:
            sys.exit(f"{model}: output {name}: got {None if g is None else g.shape}, want {w.shape}")
        if w.dtype == np.float32:
            ok = np.all(np.abs(g - w) <= 1e-5 + 1e-4 * np.abs(w))  # reference.json's FP32 tolerance
        else:
            ok = np.array_equal(g, w)
        if not ok:
            sys.exit(f"{model}: output {name} differs from onnxruntime's")


def run_tract(addr: str, repo: Path, seconds: float, rnd: int) -> None:
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    control = http.client.HTTPConnection(host, int(port), timeout=60)
    for model, batch in [("simple", 1), FLOOR] + CASES:
        feeds = inputs_of(model, batch)
        body, hl = binary_body(feeds)
        headers = {"Content-Type": "application/octet-stream",
                   "Inference-Header-Content-Length": str(hl)}
        path = f"/v2/models/{model}/infer"

        def call():
            conn.request("POST", path, body=body, headers=headers)
            r = conn.getresponse()
            data = r.read()
            if r.status != 200:
                sys.exit(f"{path}: {r.status} {data[:300]!r}")
            return r, data

        r, data = call()
        got = decode(r, data)
        if model == "simple":
            if not np.array_equal(got["OUTPUT0"], feeds["INPUT0"] + feeds["INPUT1"]):
                sys.exit("simple: wrong OUTPUT0")
        else:  # the same model file, run by onnxruntime here
            sess = session(latest(repo, model))
            names = [o.name for o in sess.get_outputs()]
            check(model, got, dict(zip(names, sess.run(None, feeds))))
        # Warm up, snapshot, time, snapshot: the statistics cover exactly the timed requests.
        timed(call, 0)
        before = stats(control, model)
        times = time_calls(call, seconds)
        after = stats(control, model)
        d = {k: after[k] - before[k] for k in after}
        emit({"side": "tract", "round": rnd, "model": model, "batch": batch,
              "requests": len(times), "client_median_ns": statistics.median(times),
              "client_mean_ns": statistics.fmean(times), **d,
              "affinity": sorted(os.sched_getaffinity(0))})


# ---------------------------------------------------------------------------- bodies
def bodies(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    lengths = {}
    for model in ("mlp", "cnn"):
        body, hl = binary_body(inputs_of(model, 1))
        (out / f"{model}_b1.bin").write_bytes(body)
        lengths[f"{model}_b1"] = hl
    print(json.dumps(lengths))


# ---------------------------------------------------------------------------- render
def ms(text: str) -> float:
    for unit, scale in (("us", 1e-3), ("ms", 1.0), ("s", 1e3)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    raise ValueError(text)


def med(xs):
    xs = list(xs)
    return statistics.median(xs) if xs else float("nan")


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def tract_version() -> str:
    lock = Path(__file__).resolve().parent.parent / "Cargo.lock"
    m = re.search(r'name = "tract-onnx"\nversion = "([^"]+)"', lock.read_text()) if lock.exists() else None
    return m.group(1) if m else "?"


def render(out: Path, seconds: float, rounds: int, conns: int, binary: str, command: str) -> None:
    recs = [json.loads(line) for line in (out / "part1.jsonl").read_text().splitlines() if line.strip()]
    ort_v = next((r["version"] for r in recs if r["side"] == "ort"), "?")

    def per_round(side, model, batch):
        return [r for r in recs if r["side"] == side and r["model"] == model and r["batch"] == batch]

    # Per round, so that each ratio pairs numbers from the same minutes; medians over rounds.
    def per_call(r, key):
        return r[key] / max(r["infer_count"], 1)

    def fixed_costs(side, cost):
        """Per round, the side's cheapest call among intbool and mlp at batch 1: an upper
        bound of its cost per call beyond the kernels (for onnxruntime from Python, intbool
        alone costs more than the mlp, so neither is a floor on its own)."""
        by_round = {}
        for case in (FLOOR, ("mlp", 1)):
            for r in per_round(side, *case):
                by_round[r["round"]] = min(by_round.get(r["round"], float("inf")), cost(r))
        return by_round

    rows = []
    for model, batch in CASES + [FLOOR]:
        o, t = per_round("ort", model, batch), per_round("tract", model, batch)
        floors = fixed_costs("tract", lambda r: per_call(r, "infer_ns"))
        ort_floors = fixed_costs("ort", lambda r: r["mean_ns"])
        simples = {r["round"]: r for r in per_round("tract", "simple", 1)}
        ratio, ratio_call, ratio_net, ci, call, hop, req, req_est, mism = [], [], [], [], [], [], [], [], 0
        ort_by_round = {r["round"]: r for r in o}
        for r in t:
            c, q = per_call(r, "infer_ns"), per_call(r, "queue_ns")
            ci.append(c)
            call.append(c + q)
            hop.append(q)
            req.append(r["client_median_ns"])
            s = simples.get(r["round"])
            if s:
                req_est.append(r["client_median_ns"] - s["client_median_ns"])
            if r["infer_count"] != r["requests"]:
                mism += 1
            if r["round"] in ort_by_round:
                om = ort_by_round[r["round"]]["mean_ns"]
                ratio.append(om / c)
                ratio_call.append(om / (c + q))
                f, of = floors.get(r["round"]), ort_floors.get(r["round"])
                if f is not None and of is not None:
                    # Each side's run beyond its fixed cost; under a fifth of the call, the
                    # difference is mostly noise and gives no ratio.
                    net, ort_net = c - f, om - of
                    if net > 0.2 * c and ort_net > 0.2 * om:
                        ratio_net.append(ort_net / net)
        rows.append({
            "model": model, "batch": batch,
            "ort_median_ms": med(x["median_ns"] for x in o) / 1e6,
            "ort_bps": 1e9 / med(x["mean_ns"] for x in o) if o else float("nan"),
            "ci_ms": med(ci) / 1e6, "tract_bps": 1e9 / med(ci) if ci else float("nan"),
            "call_ms": med(call) / 1e6, "hop_ms": med(hop) / 1e6,
            "ratio": med(ratio), "ratio_call": med(ratio_call), "ratio_net": med(ratio_net),
            "req_ms": med(req) / 1e6, "req_est_ms": med(req_est) / 1e6, "mismatch": mism,
            "ort_calls": sum(x["calls"] for x in o), "requests": sum(x["requests"] for x in t),
        })
    simple = per_round("tract", "simple", 1)
    simple_req = med(x["client_median_ns"] for x in simple) / 1e6
    simple_ci = med(x["infer_ns"] / max(x["infer_count"], 1) for x in simple) / 1e3

    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    p = print
    p("## ONNX models: tract in tensorgate against onnxruntime\n")
    p(f"- Machine: {os.cpu_count()} cores (nproc), {cpu_model()}")
    p(f"- Command: `{command}`")
    p(f"- Date: {now}")
    loads = [(out / f"loadavg.{w}").read_text().split()[0] for w in ("start", "end")
             if (out / f"loadavg.{w}").exists()]
    if loads:
        p(f"- Load average (1 min) at the start and end: {', '.join(loads)} (this script alone "
          "keeps it near 1-2; more means other work shared the cores and distorted every number)")
    p(f"- Versions: tensorgate binary `{binary}`, tract-onnx {tract_version()} (Cargo.lock), "
      f"onnxruntime {ort_v}; models from `tests/fixtures/onnx/repo` (mlp version 2, the one "
      "the worker serves; cnn 1), each with one instance")
    if "/debug/" in binary:
        p("- **Debug build: these numbers say nothing about performance; they only show that "
          "the script runs.**")
    p("")
    p("### 1. Model time per batch, one thread each on core 0\n")
    p(f"{rounds} alternating rounds of {seconds:g} s per case; medians over rounds. onnxruntime: "
      "`InferenceSession` with intra_op_num_threads=1, inter_op_num_threads=1, sequential "
      "execution, called from Python under `taskset -c 0`; ms/batch is the median call, batches/s "
      "1 / the mean call. tract: `tensorgate worker --model-repository` with "
      "`TOKIO_WORKER_THREADS=1` under `taskset -c 0`, driven at concurrency 1 with binary "
      "tensors by a Python client on core 1; its time is the worker's statistics "
      "(`compute_infer` and `queue` ns / count between snapshots before and after each run, "
      "means). Every output was checked against onnxruntime's first.\n")
    p("| model | batch | onnxruntime ms/batch | onnxruntime batches/s | tract compute_infer ms/batch "
      "| tract batches/s | tract / onnxruntime | tract call with the hop, ms | tract / onnxruntime, "
      "hop counted | tract / onnxruntime, fixed costs out (est.) |")
    p("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        name = r["model"] + (" (calibration)" if (r["model"], r["batch"]) == FLOOR else "")
        if (r["model"], r["batch"]) == FLOOR:
            net = "—"
        elif r["ratio_net"] != r["ratio_net"]:  # NaN: no round had a run beyond the fixed costs
            net = "lost in the fixed costs"
        else:
            net = f"{r['ratio_net']:.2f}"
        p(f"| {name} | {r['batch']} | {r['ort_median_ms']:.4f} | {r['ort_bps']:,.0f} | {r['ci_ms']:.4f} "
          f"| {r['tract_bps']:,.0f} | {r['ratio']:.2f} | {r['call_ms']:.4f} | {r['ratio_call']:.2f} | {net} |")
    floor = rows[-1]
    p("")
    p("What the columns hold: tract's `compute_infer` is the model's run on the blocking-pool "
      "thread (`BuiltinBackend::infer`): copying the inputs into tract tensors, `plan.run`, and "
      "converting the outputs, against onnxruntime's `run` called from Python (ratios of means). "
      "*Call with the hop* adds the statistics' `queue`, at concurrency 1 the model's lookup and "
      "the handoff from the async thread to the blocking pool and back "
      f"({floor['hop_ms'] * 1e3:.1f} µs per call on `intbool`): the whole "
      "backend call, which the issue's rule (a model never runs on the async threads) costs "
      "every request, so that ratio is a lower bound. onnxruntime's numbers include Python's "
      "cost per call; *fixed costs out* subtracts from each side's time, per round, that side's "
      "cheapest call among `intbool` (three element-wise ops on [1,4]) and the mlp at batch 1 "
      "(an upper bound of its fixed cost), an estimate of the kernels alone; a run within a "
      "fifth of its fixed cost gives no ratio.\n")
    p("A second estimate, the client's request time minus that of the built-in `simple` "
      f"model (INT32 [1,16] x2, run inline without the hop: {simple_req:.3f} ms per request, "
      f"compute_infer {simple_ci:.1f} µs), keeps the hop and adds the difference in body sizes:\n")
    p("| model | batch | client request ms (median) | request − simple's ms (est.) |")
    p("| --- | ---: | ---: | ---: |")
    for r in rows:
        p(f"| {r['model']} | {r['batch']} | {r['req_ms']:.4f} | {r['req_est_ms']:.4f} |")
    mism = sum(r["mismatch"] for r in rows)
    if mism:
        p(f"\n**Warning**: in {mism} runs the statistics counted another number of executions than "
          "the client sent.")
    cnn = [r for r in rows if r["model"] == "cnn"]
    holds = all(r["ratio"] >= 0.5 for r in cnn)
    calls_held = sum(r["ratio_call"] >= 0.5 for r in cnn)
    if holds:
        verdict = "**holds** on model time (compute_infer)"
        verdict += {len(cnn): ", and with the blocking-pool hop counted against tract",
                    0: ", at no batch with the blocking-pool hop counted against tract"}.get(
            calls_held, ", not at every batch with the blocking-pool hop counted against tract")
    else:
        verdict = "**does not hold** on model time"

    def net(r):
        return "n/a" if r["ratio_net"] != r["ratio_net"] else f"{r['ratio_net']:.2f} x"

    p(f"\nTarget (tract ≥ 0.5 x onnxruntime's model throughput on the CNN): " + ", ".join(
        f"batch {r['batch']}: {r['ratio']:.2f} x (hop counted {r['ratio_call']:.2f} x, fixed costs "
        f"out {net(r)})" for r in cnn) + f": {verdict}.\n")

    # ------------------------------------------------------------------ part 2
    runs = {}
    e2e = out / "e2e.txt"
    for line in (e2e.read_text().splitlines() if e2e.exists() else []):
        name, rnd, requests, non2xx, rps, p50, p99, gw_ticks, w_ticks, clk = line.split()
        requests = max(int(requests), 1)
        runs.setdefault(name, []).append({
            "rps": float(rps), "p50": ms(p50), "p99": ms(p99), "non2xx": int(non2xx),
            "gw_us": int(gw_ticks) / int(clk) * 1e6 / requests,
            "gw_use": int(gw_ticks) / int(clk) / seconds,
            "w_us": int(w_ticks) / int(clk) * 1e6 / requests,
            "w_use": int(w_ticks) / int(clk) / seconds,
        })
    p("### 2. End to end through the gateway\n")
    p(f"{rounds} alternating rounds of {seconds:g} s per path after a 1 s warm-up; medians. "
      f"`wrk -t1 -c{conns} --latency` with a static binary body (bench/body.lua, one sample, "
      "batch 1). `tensorgate serve --grpc-listen \"\" --backend http://WORKER` pinned to core 0, "
      "single-threaded; the worker (the same one-instance repository, single-threaded) and wrk "
      "share core 1, as the other bench/ scripts put the backend and the load generator; "
      "`RUST_LOG=warn` for both (no access log). CPU per request from /proc/PID/stat (utime + "
      "stime, 10 ms ticks) over the run; CPU use is CPU seconds per second of the run.\n")
    p("| path | req/s | p50 | p99 | gateway CPU/req | gateway CPU use | worker CPU/req | worker CPU use | non-2xx |")
    p("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    labels = [("gw_mlp", "mlp batch 1, through the gateway"), ("gw_cnn", "cnn batch 1, through the gateway"),
              ("direct_mlp", "mlp batch 1, worker directly"), ("direct_cnn", "cnn batch 1, worker directly")]
    for name, label in labels:
        r = runs.get(name)
        if not r:
            p(f"| {label} | **no result** | | | | | | | |")
            continue
        gw = f"{med(x['gw_us'] for x in r):.1f} µs" if name.startswith("gw") else "—"
        gwu = f"{med(x['gw_use'] for x in r):.2f}" if name.startswith("gw") else "—"
        p(f"| {label} | {med(x['rps'] for x in r):,.0f} | {med(x['p50'] for x in r):.2f} ms "
          f"| {med(x['p99'] for x in r):.2f} ms | {gw} | {gwu} | {med(x['w_us'] for x in r):.1f} µs "
          f"| {med(x['w_use'] for x in r):.2f} | {sum(x['non2xx'] for x in r)} |")
    p("")

    # ------------------------------------------------------------------ reading
    mlp1 = next(r for r in rows if (r["model"], r["batch"]) == ("mlp", 1))
    gm, gc = runs.get("gw_mlp"), runs.get("gw_cnn")
    dm, dc = runs.get("direct_mlp"), runs.get("direct_cnn")
    reading = (
        f"Reading: on the CNN, tract's compute_infer gives {cnn[0]['ratio']:.2f} x onnxruntime's "
        f"throughput at batch 1 and {cnn[1]['ratio']:.2f} x at batch 8 ({net(cnn[0])} "
        f"and {net(cnn[1])} with both sides' fixed costs out); with the "
        f"{floor['hop_ms'] * 1e3:.0f} µs of lookup and handoff to the blocking pool counted against tract, "
        f"{cnn[0]['ratio_call']:.2f} x and {cnn[1]['ratio_call']:.2f} x. The mlp is too small to "
        f"compare kernels: onnxruntime runs batch 1 in {mlp1['ort_median_ms'] * 1e3:.1f} µs from "
        f"Python and tract in {mlp1['ci_ms'] * 1e3:.1f} µs, most of either a fixed cost per call. "
        "Both sides are one thread on one core of a shared VM, whose speed drifts between minutes; "
        "rounds alternate and the table gives medians, but differences under about 10% are noise.")
    if gm and gc and dm and dc:
        reading += (
            f" End to end, the gateway on its own core passes {med(x['rps'] for x in gm):,.0f} mlp and "
            f"{med(x['rps'] for x in gc):,.0f} cnn requests/s ({med(x['rps'] for x in dm):,.0f} and "
            f"{med(x['rps'] for x in dc):,.0f} straight to the worker), at "
            f"{med(x['gw_us'] for x in gm):.0f} and {med(x['gw_us'] for x in gc):.0f} µs of gateway CPU "
            f"per request, with a CPU use of {med(x['gw_use'] for x in gm):.2f} and "
            f"{med(x['gw_use'] for x in gc):.2f} of its core (1.0 would make the gateway the "
            "bottleneck; below that the pace is set by core 1, where the worker and wrk share, or "
            "by the round trips at this concurrency). The CPU per request is the number that "
            "carries over to other machines; req/s and p99 move with whatever else runs.")
    p(reading)


def main() -> None:
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "prepare":
        prepare(Path(args[0]), Path(args[1]))
    elif cmd == "ort":
        run_ort(Path(args[0]), float(args[1]), int(args[2]))
    elif cmd == "tract":
        run_tract(args[0], Path(args[1]), float(args[2]), int(args[3]))
    elif cmd == "bodies":
        bodies(Path(args[0]))
    elif cmd == "render":
        render(Path(args[0]), float(args[1]), int(args[2]), int(args[3]), args[4], args[5])
    else:
        sys.exit(f"unknown subcommand {cmd}")


if __name__ == "__main__":
    main()
