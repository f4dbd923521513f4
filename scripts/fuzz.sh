#!/usr/bin/env bash
# Runs each cargo-fuzz target for a bounded time (default 20 s each) from the corpus kept in
# fuzz/corpus/, failing on any crash. The toolchain is stable Rust: RUSTC_BOOTSTRAP=1 lets it
# accept the sanitizer flags cargo-fuzz passes. Installs cargo-fuzz if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-20}
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked --quiet
fi
export RUSTC_BOOTSTRAP=1
for target in decode_request decode_response json_data decode_grpc_request config_pbtxt inflate; do
  echo "-- fuzz $target for ${SECONDS_EACH}s"
  # Work on a scratch copy so that new inputs found in CI do not dirty the repository.
  work=$(mktemp -d)
  cp -r "fuzz/corpus/$target/." "$work/"
  log="$work.log"
  if cargo fuzz run --fuzz-dir fuzz "$target" "$work" -- \
    -max_total_time="$SECONDS_EACH" -max_len=65536 -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    > "$log" 2>&1; then
    status=0
  else
    status=$?
  fi
  grep -E "^(stat::number_of_executed_units|stat::peak_rss|==[0-9]+==|SUMMARY|thread '|panicked)" "$log" || true
  if [ "$status" -ne 0 ]; then
    tail -40 "$log" >&2
  fi
  rm -f "$log"
  rm -rf "$work"
  if [ "$status" -ne 0 ]; then
    echo "fuzz target $target failed (artifacts in fuzz/artifacts/$target)" >&2
    exit "$status"
  fi
done
