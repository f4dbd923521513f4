#!/usr/bin/env bash
# ONNX models: tract (inside `tensorgate worker`) against onnxruntime, and end to end through a
# gateway. See bench/onnx_models.py for what each number is.
#   1. Model time per batch, one thread each on core 0: onnxruntime (InferenceSession, 1
#      intra-op and 1 inter-op thread, sequential) under taskset -c 0, against a worker
#      (TOKIO_WORKER_THREADS=1, taskset -c 0) on a copy of tests/fixtures/onnx/repo where every
#      model has one instance, driven at concurrency 1 with binary tensors by a Python client on
#      core 1; tract's time comes from the worker's statistics (compute_infer). mlp and cnn at
#      batch 1 and 8, intbool as the calibration of the worker's fixed cost per call, the
#      built-in `simple` for the request-time estimate. Sides alternate in rounds; medians.
#   2. End to end: wrk (binary body, batch 1) -> tensorgate serve (core 0, single-threaded) ->
#      worker (core 1, single-threaded, with wrk), and straight to the worker, for mlp and cnn:
#      req/s, p50, p99, CPU per request of the gateway and of the worker.
# Usage: [ROUNDS=3] [CONNS=8] [TENSORGATE_BIN=target/release/tensorgate] bench/onnx_models.sh [SECONDS_PER_RUN]
#        (default 5 s; about 4.5 minutes with the defaults)
# Prints one Markdown section on stdout (progress on stderr); raw results in bench/out/onnx/.
# Needs the release binary (it does not build it), wrk, taskset, curl, and .venv with numpy
# and onnxruntime==1.32.0 (installed if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DUR=${1:-5}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-8}
OUT=$ROOT/bench/out/onnx
COMMAND="ROUNDS=$ROUNDS CONNS=$CONNS bench/onnx_models.sh $DUR"
[ -n "${TENSORGATE_BIN:-}" ] && COMMAND="TENSORGATE_BIN=$TENSORGATE_BIN $COMMAND"
BIN=${TENSORGATE_BIN:-target/release/tensorgate}
SHOWN_BIN=$BIN
case "$BIN" in /*) ;; *) BIN=$ROOT/$BIN ;; esac
fail() { echo "onnx_models.sh: $*" >&2; exit 1; }
log() { echo "== $*" >&2; }

[[ "$DUR" =~ ^[1-9][0-9]*$ ]] || fail "SECONDS_PER_RUN must be a whole number of seconds, not '$DUR'"
[ -x "$BIN" ] || fail "no tensorgate binary at $BIN. Build it first: cargo build --release --locked (or set TENSORGATE_BIN)"
"$BIN" worker --help 2>/dev/null | grep -q -- '--model-repository' ||
  fail "$BIN has no 'worker --model-repository' (built before ONNX support?): rebuild it with cargo build --release --locked"

need=""
for tool in wrk taskset curl; do command -v $tool >/dev/null || need="$need $tool"; done
if [ -n "$need" ]; then
  log "installing$need"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wrk util-linux curl >&2
fi
[ "$(nproc)" -ge 2 ] || fail "needs 2 cores (0 and 1), this machine has $(nproc)"
PY=$ROOT/.venv/bin/python
[ -x "$PY" ] || python3 -m venv "$ROOT/.venv"
if ! "$PY" -c 'import numpy, onnxruntime as o; assert o.__version__ == "1.32.0"' 2>/dev/null; then
  log "installing onnxruntime==1.32.0 into .venv"
  "$PY" -m pip install -q numpy==2.4.6 onnxruntime==1.32.0 >&2
fi

rm -rf "$OUT"; mkdir -p "$OUT"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# wait_ready URL PID: bounded (60 s: a debug build optimises models slowly), and fails at once
# if the process has exited.
wait_ready() {
  for _ in $(seq 1 600); do
    curl -sf "$1" >/dev/null 2>&1 && return 0
    kill -0 "$2" 2>/dev/null || fail "process $2 exited before $1 was ready (see $OUT/*.log)"
    sleep 0.1
  done
  fail "not ready after 60 s: $1 (see $OUT/*.log)"
}
# start NAME CMD...: in the background, output in $OUT/NAME.log; its pid in LAST.
start() { local name=$1; shift; "$@" > "$OUT/$name.log" 2>&1 & PIDS+=($!); LAST=$!; }
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
CLK=$(getconf CLK_TCK)

cat /proc/loadavg > "$OUT/loadavg.start"
"$PY" bench/onnx_models.py prepare tests/fixtures/onnx/repo "$OUT/repo"

# ---------------------------------------------------------------- 1. model time per batch
W=$(free_port)
start worker-core0 env TOKIO_WORKER_THREADS=1 RUST_LOG=warn taskset -c 0 "$BIN" worker \
  --listen 127.0.0.1:$W --model-repository "$OUT/repo" --models simple
WORKER=$LAST
for m in simple intbool mlp cnn; do wait_ready "http://127.0.0.1:$W/v2/models/$m/ready" "$WORKER"; done
log "1. model time per batch: $ROUNDS rounds, ${DUR}s per case (onnxruntime 5 cases, tract 6)"
for round in $(seq 1 "$ROUNDS"); do
  log "   round $round: onnxruntime (core 0)"
  taskset -c 0 "$PY" bench/onnx_models.py ort "$OUT/repo" "$DUR" "$round" >> "$OUT/part1.jsonl" ||
    fail "onnxruntime run failed"
  log "   round $round: tract through the worker (worker core 0, client core 1)"
  taskset -c 1 "$PY" bench/onnx_models.py tract "127.0.0.1:$W" "$OUT/repo" "$DUR" "$round" >> "$OUT/part1.jsonl" ||
    fail "tract run failed (worker log: $OUT/worker-core0.log)"
done
stop "$WORKER"

# ---------------------------------------------------------------- 2. end to end
W=$(free_port); G=$(free_port); GM=$(free_port)
start worker-core1 env TOKIO_WORKER_THREADS=1 RUST_LOG=warn taskset -c 1 "$BIN" worker \
  --listen 127.0.0.1:$W --model-repository "$OUT/repo"
WORKER=$LAST
for m in mlp cnn; do wait_ready "http://127.0.0.1:$W/v2/models/$m/ready" "$WORKER"; done
start gateway env TOKIO_WORKER_THREADS=1 RUST_LOG=warn taskset -c 0 "$BIN" serve --grpc-listen "" \
  --listen 127.0.0.1:$G --metrics-listen 127.0.0.1:$GM --backend "http://127.0.0.1:$W"
GATEWAY=$LAST
for m in mlp cnn; do wait_ready "http://127.0.0.1:$G/v2/models/$m/ready" "$GATEWAY"; done
HL=$("$PY" bench/onnx_models.py bodies "$OUT/bodies")
hl() { "$PY" -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$HL" "$1"; }
HL_MLP=$(hl mlp_b1); HL_CNN=$(hl cnn_b1)

# e2e NAME PORT MODEL HL ROUND SECONDS -> "name round requests non2xx rps p50 p99 gw_ticks worker_ticks clk"
e2e() {
  local name=$1 port=$2 model=$3 ihcl=$4 round=$5 secs=$6 f g0 w0 g1 w1
  f=$OUT/$name.r$round.txt
  g0=$(ticks "$GATEWAY"); w0=$(ticks "$WORKER")
  env BODY_FILE="$OUT/bodies/${model}_b1.bin" IHCL="$ihcl" taskset -c 1 \
    wrk -t1 -c"$CONNS" -d"${secs}s" --latency -s bench/body.lua \
    "http://127.0.0.1:$port/v2/models/$model/infer" > "$f" 2>&1 || fail "wrk failed: $f"
  g1=$(ticks "$GATEWAY"); w1=$(ticks "$WORKER")
  [ "$round" = 0 ] && return 0
  local rps p50 p99 non2xx requests
  rps=$(awk '/Requests\/sec/ {print $2}' "$f")
  p50=$(awk '$1=="50%" {print $2}' "$f")
  p99=$(awk '$1=="99%" {print $2}' "$f")
  requests=$(awk '/requests in/ {print $1}' "$f")
  # Answers that were not 2xx, plus wrk's socket errors (connect, read, write, timeout).
  non2xx=$(awk '/Non-2xx/ {n += $NF} /Socket errors/ {gsub(",", ""); n += $4 + $6 + $8 + $10} END {print n + 0}' "$f")
  [ -n "$rps" ] && [ -n "$p50" ] && [ -n "$requests" ] || fail "no wrk result in $f"
  echo "$name $round $requests $non2xx $rps $p50 $p99 $((g1 - g0)) $((w1 - w0)) $CLK" >> "$OUT/e2e.txt"
  log "   $name r$round: $rps req/s p50 $p50 p99 $p99 non-2xx $non2xx"
}
paths() { # ROUND SECONDS
  e2e gw_mlp "$G" mlp "$HL_MLP" "$1" "$2"
  e2e gw_cnn "$G" cnn "$HL_CNN" "$1" "$2"
  e2e direct_mlp "$W" mlp "$HL_MLP" "$1" "$2"
  e2e direct_cnn "$W" cnn "$HL_CNN" "$1" "$2"
}
log "2. end to end: wrk -c$CONNS, $ROUNDS rounds, ${DUR}s per path"
paths 0 1 # warm-up: connections, the gateway's catalog, the allocator
for round in $(seq 1 "$ROUNDS"); do paths "$round" "$DUR"; done

cat /proc/loadavg > "$OUT/loadavg.end"
"$PY" bench/onnx_models.py render "$OUT" "$DUR" "$ROUNDS" "$CONNS" "$SHOWN_BIN" "$COMMAND"
