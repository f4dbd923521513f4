#!/usr/bin/env bash
# Per-core proxy cost, with a backend that is not the bottleneck: tensorgate against nginx as
# a keep-alive reverse proxy, each pinned to core 0 and single-threaded, in front of an nginx
# that answers every v2 call with a fixed response (a Triton-like server: it lists
# binary_tensor_data, so tensorgate may pass the client's bytes through). wrk and the backend
# share core 1. First the backend alone is measured (it must serve at least 1.5 x the faster
# proxy, or the ratio measures it), then the proxies in alternating rounds:
#   P1: the small `simple` JSON request;
#   P2: the same with a sequence_id in the body (nginx hashes an X-Sequence-Id header), a new
#       id on each request;
#   P2 with shared pins: tensorgate with [fleet.pins] store = "redis" (a redis-server on core 1),
#       against the memory store, with a new id per request (a Redis round trip each) and with
#       sequences of 20 requests; its Redis round trips per request come from its metrics.
#       The new-id case once more with the runtime tensorgate picks by itself on one CPU (the
#       multi-threaded one, with one worker; paths *_mt), whose scheduler runs a task woken
#       by the running one next, where the current-thread one queues it behind every other.
#   P1 through a bare hyper proxy (examples/bare_proxy.rs: hyper's server and client::conn on
#       tokio's current-thread runtime, no validation, no log), streaming the body and, as
#       the second path, reading it whole first: the floor of tensorgate's own stack, which
#       tells the stack's share of the gap to nginx from tensorgate's.
# Reported per path: req/s, p50, p99 (medians over rounds) and the proxy's CPU time per request.
# tensorgate runs with TOKIO_WORKER_THREADS=1, which selects its single-threaded runtime (as
# `[server] worker_threads = 1` does).
# Usage: [ROUNDS=3] [CONNS=32] [PATHS="name ..."] bench/proxy_core.sh [SECONDS_PER_RUN]   (default 8)
#   CONNS: wrk's connections (all paths alike); PATHS: run only the named paths (the names of
#   the loop at the end, e.g. PATHS="tensorgate_p2 tensorgate_p2_redis"), default all.
# Access logs stay as each proxy has them by default: on for tensorgate (info), off for nginx
# only where noted; see the printed table.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DUR=${1:-8}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-32}
PATHS=${PATHS:-}
OUT=$ROOT/bench/out/core
rm -rf "$OUT"; mkdir -p "$OUT/nginx-backend" "$OUT/nginx-proxy"
for tool in wrk nginx taskset redis-server; do
  command -v $tool >/dev/null || {
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wrk nginx-light util-linux redis-server >&2
  }
done
BIN=${TENSORGATE_BIN:-$ROOT/target/release/tensorgate}
[ -x "$BIN" ] || cargo build --release --locked -q
BARE=${BARE_PROXY_BIN:-$ROOT/target/release/examples/bare_proxy}
[ -x "$BARE" ] || cargo build --release --locked -q --example bare_proxy
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_ready() { for _ in $(seq 1 100); do curl -sf "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done; echo "not ready: $1" >&2; return 1; }

B=$(free_port); N=$(free_port); NH=$(free_port); G=$(free_port)
R=$(free_port); GR=$(free_port); GRM=$(free_port); H=$(free_port); HB=$(free_port)
GT=$(free_port); GRT=$(free_port); GRTM=$(free_port)
META='{"name":"simple","versions":["1"],"platform":"fixed","inputs":[{"name":"INPUT0","datatype":"INT32","shape":[-1,16]},{"name":"INPUT1","datatype":"INT32","shape":[-1,16]}],"outputs":[{"name":"OUTPUT0","datatype":"INT32","shape":[-1,16]},{"name":"OUTPUT1","datatype":"INT32","shape":[-1,16]}]}'
ANSWER='{"model_name":"simple","model_version":"1","outputs":[{"name":"OUTPUT0","datatype":"INT32","shape":[1,16],"data":[2,4,6,8,10,12,14,16,18,20,22,24,26,28,30,32]},{"name":"OUTPUT1","datatype":"INT32","shape":[1,16],"data":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]}]}'
cat > "$OUT/nginx-backend/nginx.conf" <<NGINX
worker_processes 1;
error_log $OUT/nginx-backend/error.log warn;
pid $OUT/nginx-backend/nginx.pid;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $OUT/nginx-backend/body;
  client_body_buffer_size 1m;
  default_type application/json;
  server {
    listen 127.0.0.1:$B;
    keepalive_requests 1000000;
    location = /v2 { return 200 '{"name":"fixed","version":"1","extensions":["binary_tensor_data"]}'; }
    location = /v2/health/ready { return 200 '{}'; }
    location = /v2/repository/index { return 200 '[{"name":"simple","version":"1","state":"READY"}]'; }
    location = /v2/models/simple { return 200 '$META'; }
    location = /v2/models/simple/ready { return 200 '{}'; }
    location = /v2/models/simple/infer { return 200 '$ANSWER'; }
  }
}
NGINX
cat > "$OUT/nginx-proxy/nginx.conf" <<NGINX
worker_processes 1;
error_log $OUT/nginx-proxy/error.log warn;
pid $OUT/nginx-proxy/nginx.pid;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $OUT/nginx-proxy/body;
  proxy_temp_path $OUT/nginx-proxy/proxy;
  upstream be { server 127.0.0.1:$B; keepalive 128; }
  upstream be_hash { hash \$http_x_sequence_id consistent; server 127.0.0.1:$B; keepalive 128; }
  server { listen 127.0.0.1:$N; keepalive_requests 1000000;
    location / { proxy_pass http://be; proxy_http_version 1.1; proxy_set_header Connection ""; } }
  server { listen 127.0.0.1:$NH; keepalive_requests 1000000;
    location / { proxy_pass http://be_hash; proxy_http_version 1.1; proxy_set_header Connection ""; } }
}
NGINX
taskset -c 1 nginx -c "$OUT/nginx-backend/nginx.conf" -p "$OUT/nginx-backend" -g 'daemon off;' & PIDS+=($!)
taskset -c 0 nginx -c "$OUT/nginx-proxy/nginx.conf" -p "$OUT/nginx-proxy" -g 'daemon off;' & PIDS+=($!)
NGINX_PROXY=$!
env TOKIO_WORKER_THREADS=1 taskset -c 0 "$BIN" serve --listen 127.0.0.1:$G --grpc-listen "" \
  --metrics-listen 127.0.0.1:$(free_port) --backend http://127.0.0.1:$B > "$OUT/tensorgate.log" 2>&1 & PIDS+=($!)
GW=$!
taskset -c 0 "$BARE" --listen 127.0.0.1:$H --backend 127.0.0.1:$B > "$OUT/bare.log" 2>&1 & PIDS+=($!)
BARE_STREAM=$!
taskset -c 0 "$BARE" --listen 127.0.0.1:$HB --backend 127.0.0.1:$B --buffer > "$OUT/bare-buffer.log" 2>&1 & PIDS+=($!)
BARE_BUFFER=$!
# The same gateway with pins shared through Redis (nothing persisted, as deploy/ runs it).
taskset -c 1 redis-server --bind 127.0.0.1 --port "$R" --save "" --appendonly no \
  --dir "$OUT" > "$OUT/redis.log" 2>&1 & PIDS+=($!)
cat > "$OUT/tensorgate-redis.toml" <<TOML
[server]
listen = "127.0.0.1:$GR"
metrics_listen = "127.0.0.1:$GRM"
grpc_listen = ""

[fleet.pins]
store = "redis"
url = "redis://127.0.0.1:$R/0"

[[backends]]
name = "fixed"
url = "http://127.0.0.1:$B"
TOML
env TOKIO_WORKER_THREADS=1 taskset -c 0 "$BIN" serve --config "$OUT/tensorgate-redis.toml" \
  > "$OUT/tensorgate-redis.log" 2>&1 & PIDS+=($!)
GWR=$!
# Both again with the runtime chosen by the gateway itself (one CPU: multi-threaded, one worker).
env -u TOKIO_WORKER_THREADS taskset -c 0 "$BIN" serve --listen 127.0.0.1:$GT --grpc-listen "" \
  --metrics-listen 127.0.0.1:$(free_port) --backend http://127.0.0.1:$B > "$OUT/tensorgate-mt.log" 2>&1 & PIDS+=($!)
GWT=$!
sed -e "s/127.0.0.1:$GR\"/127.0.0.1:$GRT\"/" -e "s/127.0.0.1:$GRM\"/127.0.0.1:$GRTM\"/" \
  "$OUT/tensorgate-redis.toml" > "$OUT/tensorgate-redis-mt.toml"
env -u TOKIO_WORKER_THREADS taskset -c 0 "$BIN" serve --config "$OUT/tensorgate-redis-mt.toml" \
  > "$OUT/tensorgate-redis-mt.log" 2>&1 & PIDS+=($!)
GWRT=$!
wait_ready "http://127.0.0.1:$B/v2/health/ready"
wait_ready "http://127.0.0.1:$GR/v2/models/simple/ready"
wait_ready "http://127.0.0.1:$G/v2/models/simple/ready"
wait_ready "http://127.0.0.1:$GT/v2/models/simple/ready"
wait_ready "http://127.0.0.1:$GRT/v2/models/simple/ready"
wait_ready "http://127.0.0.1:$N/v2/health/ready"
wait_ready "http://127.0.0.1:$H/v2/health/ready"
wait_ready "http://127.0.0.1:$HB/v2/health/ready"
sleep 0.5
NGINX_PROXY_WORKER=$(pgrep -P "$NGINX_PROXY" | head -1)
NGINX_BACKEND_WORKER=$(pgrep -f "nginx-backend/nginx.conf" | xargs -I{} pgrep -P {} | head -1)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
CLK=$(getconf CLK_TCK)

# Redis round trips a shared-pins gateway (its metrics port; default the first) has made so far.
pin_ops() {
  curl -sf "http://127.0.0.1:${1:-$GRM}/metrics" |
    awk '/^tensorgate_pin_store_operations_total/ {s += $2} END {print s + 0}'
}

RUN_NO=0
# run NAME PORT SEQ PID ROUND [SEQLEN] -> "name round ticks clk rps p50 p99 non2xx requests pin_ops"
run() {
  local name=$1 port=$2 seq=$3 pid=$4 round=$5 seqlen=${6:-1} before after ops_before ops_after
  if [ -n "$PATHS" ] && [[ " $PATHS " != *" $name "* ]]; then return 0; fi
  RUN_NO=$((RUN_NO + 1))
  local mport=$GRM
  [ "$name" = tensorgate_p2_redis_mt ] && mport=$GRTM
  before=$(cpu_ticks "$pid")
  ops_before=$(pin_ops "$mport")
  # P1's body never changes (bench/static.lua: no Lua per request); P2's carries a sequence
  # id that changes every SEQLEN requests (bench/simple.lua).
  local script=bench/static.lua
  [ "$seq" = 1 ] && script=bench/simple.lua
  env SEQ="$seq" SEQLEN="$seqlen" SEQBASE=$((RUN_NO * 100000000)) taskset -c 1 wrk -t1 -c"$CONNS" -d"${DUR}s" --latency -s "$script" \
    "http://127.0.0.1:$port/v2/models/simple/infer" > "$OUT/$name.r$round.txt" 2>&1
  after=$(cpu_ticks "$pid")
  ops_after=$(pin_ops "$mport")
  local f=$OUT/$name.r$round.txt
  echo "$name $round $((after - before)) $CLK $(awk '/Requests\/sec/ {print $2}' "$f") \
$(awk '$1=="50%" {print $2}' "$f") $(awk '$1=="99%" {print $2}' "$f") \
$(awk '/Non-2xx/ {print $NF}' "$f" | grep . || echo 0) \
$(awk '/requests in/ {print $1}' "$f") $((ops_after - ops_before))" >> "$OUT/rounds.txt"
}
for round in $(seq 1 "$ROUNDS"); do
  run backend_direct "$B" 0 "$NGINX_BACKEND_WORKER" "$round"
  run nginx_p1 "$N" 0 "$NGINX_PROXY_WORKER" "$round"
  run tensorgate_p1 "$G" 0 "$GW" "$round"
  run hyper_p1 "$H" 0 "$BARE_STREAM" "$round"
  run hyper_p1_buffered "$HB" 0 "$BARE_BUFFER" "$round"
  run nginx_p2 "$NH" 1 "$NGINX_PROXY_WORKER" "$round"
  run tensorgate_p2 "$G" 1 "$GW" "$round"
  run tensorgate_p2_redis "$GR" 1 "$GWR" "$round"
  run tensorgate_p2x20 "$G" 1 "$GW" "$round" 20
  run tensorgate_p2x20_redis "$GR" 1 "$GWR" "$round" 20
  run tensorgate_p2_mt "$GT" 1 "$GWT" "$round"
  run tensorgate_p2_redis_mt "$GRT" 1 "$GWRT" "$round"
done
CONNS=$CONNS .venv/bin/python bench/render_core.py "$OUT/rounds.txt" "$DUR"
