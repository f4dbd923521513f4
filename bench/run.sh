#!/usr/bin/env bash
# Runs the whole benchmark set and rewrites BENCHMARKS.md. See bench/README.md.
# Usage: [ROUNDS=3] bench/run.sh [SECONDS_PER_RUN]   (default 10; the whole set takes about 8 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DUR=${1:-10}
OUT=$ROOT/bench/out
rm -rf "$OUT"; mkdir -p "$OUT"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

need=""
for tool in wrk nginx taskset; do command -v $tool >/dev/null || need="$need $tool"; done
if [ -n "$need" ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wrk nginx-light util-linux
fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
  .venv/bin/pip install -q -r tests/interop/requirements.txt
fi

echo "== building (release)"
cargo build --release --locked -q
BIN=$ROOT/target/release/tensorgate

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_ready() {
  for _ in $(seq 1 300); do
    curl -sf "$1" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "not ready: $1" >&2; return 1
}
# Proxies run on core 0, the backend and wrk on core 1, each proxy single-threaded.
# Access logs are off for every process (RUST_LOG=warn, nginx access_log off): the bench
# measures proxying, not log writing. Each process's output goes to bench/out/<n>.log.
NPROC=0
start_bg() { NPROC=$((NPROC + 1)); "$@" > "$OUT/process-$NPROC.log" 2>&1 & PIDS+=($!); LAST=$!; }

W=$(free_port); start_bg env TOKIO_WORKER_THREADS=1 RUST_LOG=warn taskset -c 1 "$BIN" worker --listen 127.0.0.1:$W
WORKER_PID=$LAST
G=$(free_port); GM=$(free_port)
start_bg env TOKIO_WORKER_THREADS=1 RUST_LOG=warn taskset -c 0 "$BIN" serve --grpc-listen "" --listen 127.0.0.1:$G --metrics-listen 127.0.0.1:$GM --backend http://127.0.0.1:$W
GW_PID=$LAST
N=$(free_port); NH=$(free_port)
mkdir -p "$OUT/nginx"
cat > "$OUT/nginx/nginx.conf" <<NGINX
worker_processes 1;
error_log $OUT/nginx/error.log warn;
pid $OUT/nginx/nginx.pid;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $OUT/nginx/body;
  proxy_temp_path $OUT/nginx/proxy;
  client_max_body_size 128m;
  client_body_buffer_size 32m;
  proxy_buffers 64 256k;
  upstream be { server 127.0.0.1:$W; keepalive 128; }
  upstream be_hash { hash \$http_x_sequence_id consistent; server 127.0.0.1:$W; keepalive 128; }
  server {
    listen 127.0.0.1:$N;
    location / { proxy_pass http://be; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
  server {
    listen 127.0.0.1:$NH;
    location / { proxy_pass http://be_hash; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
NGINX
start_bg taskset -c 0 nginx -c "$OUT/nginx/nginx.conf" -p "$OUT/nginx" -g 'daemon off;'
NGINX_PID=$LAST
wait_ready "http://127.0.0.1:$W/v2/health/ready"
wait_ready "http://127.0.0.1:$G/v2/health/ready"
wait_ready "http://127.0.0.1:$N/v2/health/ready"
sleep 0.5
IDLE_RSS_KB=$(awk '/VmRSS/ {print $2}' /proc/$GW_PID/status)

# wrk_run NAME URL CONNECTIONS SCRIPT [env...] -> appends "name rps p50 p99" to results
wrk_run() {
  local name=$1 url=$2 conns=$3 script=$4; shift 4
  env "$@" taskset -c 1 wrk -t1 -c"$conns" -d"${DUR}s" --latency -s "bench/$script" "$url" > "$OUT/$name.txt" 2>&1
  local rps p50 p99 errors
  rps=$(awk '/Requests\/sec/ {print $2}' "$OUT/$name.txt")
  p50=$(awk '$1=="50%" {print $2}' "$OUT/$name.txt")
  p99=$(awk '$1=="99%" {print $2}' "$OUT/$name.txt")
  errors=$(grep -E "Non-2xx|Socket errors" "$OUT/$name.txt" | tr '\n' ' ' || true)
  echo "$name $rps $p50 $p99 ${errors:-none}" >> "$OUT/results.txt"
  echo "   $name: $rps req/s p50 $p50 p99 $p99 ${errors}"
}

# The proxy cases run in ROUNDS interleaved rounds (default 3) and the table reports medians:
# on a shared VM the machine's speed drifts by 15% and more between minutes, and interleaving
# puts every path under the same drift. Each run also records the CPU time the proxy (or, for
# the direct path, the worker) spent per request, which the drift moves far less than req/s.
ROUNDS=${ROUNDS:-3}
NGINX_WORKER=$(pgrep -P "$NGINX_PID" | head -1)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# proxy_run NAME PORT SEQ PID ROUND
proxy_run() {
  local name=$1 port=$2 seq=$3 pid=$4 round=$5 before after
  before=$(cpu_ticks "$pid")
  wrk_run "$name.r$round" "http://127.0.0.1:$port/v2/models/simple/infer" 32 simple.lua SEQ="$seq"
  after=$(cpu_ticks "$pid")
  # name round cpu_ticks clk_tck rps p50 p99 errors...
  echo "$name $round $((after - before)) $(getconf CLK_TCK) $(tail -1 "$OUT/results.txt" | cut -d' ' -f2-)" >> "$OUT/proxy_rounds.txt"
}
echo "== 1. proxy overhead (small JSON infer of simple, 32 connections, ${DUR}s each, $ROUNDS rounds)"
for round in $(seq 1 "$ROUNDS"); do
  proxy_run direct "$W" 0 "$WORKER_PID" "$round"
  proxy_run nginx "$N" 0 "$NGINX_WORKER" "$round"
  proxy_run tensorgate "$G" 0 "$GW_PID" "$round"
  proxy_run direct_seq "$W" 1 "$WORKER_PID" "$round"
  proxy_run nginx_seq "$NH" 1 "$NGINX_WORKER" "$round"
  proxy_run tensorgate_seq "$G" 1 "$GW_PID" "$round"
done

echo "== 2. large tensors (FP32, 1M elements; 16 MB pass-through)"
HEADERS=$(.venv/bin/python bench/make_bodies.py "$OUT/bodies")
hl() { .venv/bin/python -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$HEADERS" "$1"; }
ID=/v2/models/identity_fp32/infer
wrk_run large_json_to_binary "http://127.0.0.1:$G$ID" 4 body.lua BODY_FILE="$OUT/bodies/fp32_1m_json_to_binary.json" IHCL=
wrk_run large_binary_to_json "http://127.0.0.1:$G$ID" 4 body.lua BODY_FILE="$OUT/bodies/fp32_1m_binary_to_json.bin" IHCL="$(hl binary_to_json)"
wrk_run large_passthrough_tensorgate "http://127.0.0.1:$G$ID" 4 body.lua BODY_FILE="$OUT/bodies/fp32_4m_passthrough.bin" IHCL="$(hl passthrough)"
wrk_run large_passthrough_nginx "http://127.0.0.1:$N$ID" 4 body.lua BODY_FILE="$OUT/bodies/fp32_4m_passthrough.bin" IHCL="$(hl passthrough)"
wrk_run large_passthrough_direct "http://127.0.0.1:$W$ID" 4 body.lua BODY_FILE="$OUT/bodies/fp32_4m_passthrough.bin" IHCL="$(hl passthrough)"

echo "== 4. memory under 256 concurrent 1 MB binary requests"
wrk_run memory_256x1mb "http://127.0.0.1:$G/v2/models/identity_uint8/infer" 256 body.lua BODY_FILE="$OUT/bodies/uint8_1mb.bin" IHCL="$(hl uint8_1mb)"
PEAK_RSS_KB=$(awk '/VmHWM/ {print $2}' /proc/$GW_PID/status)
kill $GW_PID $WORKER_PID 2>/dev/null || true

echo "== 3. MLServer end to end (tritonclient, 4 threads)"
MLS=$(free_port)
MLDIR=$(mktemp -d)
cp -r tests/interop/mlserver_models/. "$MLDIR/"
start_bg env MLSERVER_HTTP_PORT=$MLS MLSERVER_GRPC_PORT=$(free_port) MLSERVER_METRICS_PORT=$(free_port) \
  MLSERVER_PARALLEL_WORKERS=0 MLSERVER_HOST=127.0.0.1 taskset -c 1 .venv/bin/mlserver start "$MLDIR"
for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$MLS/v2/models/simple/ready" >/dev/null 2>&1 && break; sleep 0.2; done
G2=$(free_port)
start_bg env TOKIO_WORKER_THREADS=1 RUST_LOG=warn taskset -c 0 "$BIN" serve --grpc-listen "" --listen 127.0.0.1:$G2 --metrics-listen 127.0.0.1:$(free_port) --backend http://127.0.0.1:$MLS
wait_ready "http://127.0.0.1:$G2/v2/models/simple/ready"
MLRES=$(.venv/bin/python bench/mlserver_e2e.py 127.0.0.1:$MLS 127.0.0.1:$G2 "$DUR")
echo "   $MLRES"

# A step whose failure must not stop the run: it is reported here, recorded in
# bench/out/failed.txt (render.py marks its table as failed), and the run exits non-zero
# once BENCHMARKS.md is written.
FAILED=0
step() {
  local name=$1 rc=0; shift
  "$@" || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "   FAILED: $name (exit $rc); its output is in bench/out/" >&2
    echo "$name $rc" >> "$OUT/failed.txt"
    FAILED=1
  fi
}

echo "== 5. micro-benchmarks (criterion)"
criterion() { cargo bench --locked -q --bench "$1" -- --warm-up-time 1 --measurement-time 3 > "$OUT/criterion_$1.txt" 2>&1; }
for b in codec routing classify onnx; do
  if [ -f "benches/$b.rs" ]; then step "criterion_$b" criterion "$b"; fi
done

echo "== 6. sequence hash quality (the sequence table at the default size, 1M keys)"
hash_quality() { cargo run --release --locked -q --example hash_quality > "$OUT/hash_quality.jsonl" 2> "$OUT/hash_quality.log"; }
step hash_quality hash_quality

# The gRPC front against the REST front: its own gateway and load generator (h2load).
GRPC_SECTION=$OUT/grpc_section.md
if ! TENSORGATE_BIN=$BIN bench/grpc_vs_rest.sh "$DUR" > "$GRPC_SECTION" 2> "$OUT/grpc_vs_rest.err"; then
  echo "grpc_vs_rest $?" >> "$OUT/failed.txt"
  echo "== step grpc_vs_rest failed (bench/out/grpc_vs_rest.err)" >&2
fi
.venv/bin/python bench/render.py "$OUT" "$DUR" "$IDLE_RSS_KB" "$PEAK_RSS_KB" "$MLRES" > BENCHMARKS.md
{
  echo
  echo "## gRPC front against REST front"
  echo
  echo "\`bench/grpc_vs_rest.sh $DUR\`, in the same run."
  echo
  cat "$GRPC_SECTION"
} >> BENCHMARKS.md
echo "== wrote BENCHMARKS.md"
if [ "$FAILED" -ne 0 ]; then
  echo "== some steps failed:" >&2
  cat "$OUT/failed.txt" >&2
  exit 1
fi
