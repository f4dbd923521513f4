#!/usr/bin/env bash
# The gRPC front against the REST front of one gateway, in the same run: small `simple`
# requests (REST JSON, REST binary, gRPC raw) and 1M FP32 through `identity_fp32` (REST binary
# against gRPC raw). The gateway serves its built-in models in-process, runs single-threaded
# on core 0 (taskset, TOKIO_WORKER_THREADS=1), and h2load (h2c, one thread) drives it from
# core 1, so that the gateway is the bottleneck: the table gives its CPU use per second, which
# should be close to 1.0. Paths alternate in rounds; medians are reported, with CPU time per
# request. Every answer is checked: h2load's HTTP status, and for gRPC the gateway's own
# count of answers that were not OK.
# Usage: [ROUNDS=3] bench/grpc_vs_rest.sh [SECONDS_PER_RUN]   (default 8)
# Writes bench/out/grpc/results.txt and prints the Markdown section (bench/render_grpc.py).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DUR=${1:-8}
ROUNDS=${ROUNDS:-3}
OUT=$ROOT/bench/out/grpc
rm -rf "$OUT"; mkdir -p "$OUT"
command -v h2load >/dev/null || {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nghttp2-client
}
BIN=${TENSORGATE_BIN:-$ROOT/target/release/tensorgate}
[ -x "$BIN" ] || cargo build --release --locked -q
HL=$(.venv/bin/python bench/make_grpc_bodies.py "$OUT/bodies")
hl() { .venv/bin/python -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$HL" "$1"; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
G=$(free_port); R=$(free_port); M=$(free_port)
env TOKIO_WORKER_THREADS=1 RUST_LOG=warn taskset -c 0 "$BIN" serve --listen 127.0.0.1:$G \
  --grpc-listen 127.0.0.1:$R --metrics-listen 127.0.0.1:$M > "$OUT/gateway.log" 2>&1 &
GW=$!
trap 'kill $GW 2>/dev/null || true; wait 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$G/v2/health/ready" >/dev/null && break; sleep 0.1; done
CLK=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$GW/stat"; }
# gRPC answers that were not OK (an error in a gRPC answer is still HTTP 200 to h2load).
grpc_failed() { curl -s "http://127.0.0.1:$M/metrics" | awk '/^tensorgate_grpc_requests_total\{/ && !/code="OK"/ {s += $2} END {print s + 0}'; }

REST=http://127.0.0.1:$G/v2/models
GRPC=http://127.0.0.1:$R/inference.GRPCInferenceService/ModelInfer
B=$OUT/bodies
# name | concurrency (connections streams) | body | url | headers
paths=(
  "simple_rest_json|16 8|$B/simple.json|$REST/simple/infer|content-type: application/json"
  "simple_rest_binary|16 8|$B/simple.bin|$REST/simple/infer|content-type: application/octet-stream;inference-header-content-length: $(hl simple)"
  "simple_grpc|16 8|$B/simple.grpc|$GRPC|content-type: application/grpc;te: trailers"
  "fp32_1m_rest_binary|4 1|$B/fp32_1m.bin|$REST/identity_fp32/infer|content-type: application/octet-stream;inference-header-content-length: $(hl fp32_1m)"
  "fp32_1m_grpc|4 1|$B/fp32_1m.grpc|$GRPC|content-type: application/grpc;te: trailers"
)

run() { # name round
  local name=$1 round=$2 spec
  for spec in "${paths[@]}"; do [ "${spec%%|*}" = "$name" ] && break; done
  IFS='|' read -r _ conc body url headers <<< "$spec"
  read -r conns streams <<< "$conc"
  local args=(-D "$DUR" -c "$conns" -m "$streams" -t 1 -d "$body")
  IFS=';' read -ra hs <<< "$headers"
  for h in "${hs[@]}"; do args+=(-H "$h"); done
  local bad0 t0 t1 bad1
  bad0=$(grpc_failed); t0=$(ticks)
  taskset -c 1 h2load "${args[@]}" "$url" > "$OUT/$name-$round.txt" 2>&1
  t1=$(ticks); bad1=$(grpc_failed)
  local done_ succeeded secs
  done_=$(sed -n 's/^requests: .* \([0-9]*\) done.*/\1/p' "$OUT/$name-$round.txt")
  succeeded=$(sed -n 's/^requests: .* \([0-9]*\) succeeded.*/\1/p' "$OUT/$name-$round.txt")
  secs=$(sed -n 's/^finished in \([0-9.]*\)s.*/\1/p' "$OUT/$name-$round.txt")
  # Failures: answers h2load saw fail, plus gRPC answers the gateway counted as not OK.
  local failed=$((done_ - succeeded + bad1 - bad0))
  echo "$name $round $done_ $failed $secs $((t1 - t0)) $CLK $(stat -c %s "$body")" >> "$OUT/results.txt"
}

# Warm-up: connections, allocator, page cache.
for p in "${paths[@]}"; do run "${p%%|*}" 0; done
: > "$OUT/results.txt"
for round in $(seq 1 "$ROUNDS"); do
  for p in "${paths[@]}"; do run "${p%%|*}" "$round"; done
done
.venv/bin/python bench/render_grpc.py "$OUT/results.txt" "$DUR" "$ROUNDS"
