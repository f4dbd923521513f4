#!/usr/bin/env bash
# The project's test command (README: "Test it"). On a fresh Debian machine it installs what
# the tests need: Debian packages (prometheus for promtool and the scrape test) and a Python
# venv with tritonclient and MLServer for the interop tests. Then: format, lint, unit and
# integration tests, a short bounded fuzz run, and the Python interop suites.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

section() { printf '\n==== %s ====\n' "$*"; }

DEBIAN_PACKAGES="prometheus python3-venv"
section "Debian packages: $DEBIAN_PACKAGES"
missing=""
for p in $DEBIAN_PACKAGES; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing
  else
    echo "missing Debian packages:$missing (run as root to install them)" >&2
    exit 1
  fi
fi

section "Python venv (.venv)"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
REQS=tests/interop/requirements.txt
if [ -f "$REQS" ] && ! cmp -s "$REQS" .venv/.installed-requirements 2>/dev/null; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -r "$REQS"
  cp "$REQS" .venv/.installed-requirements
fi

section "cargo fmt --check"
cargo fmt --all -- --check

section "cargo clippy"
cargo clippy --all-targets -- -D warnings

section "cargo build"
cargo build --locked

section "cargo test"
cargo test --locked

if [ -x scripts/fuzz.sh ]; then
  section "fuzz (bounded)"
  scripts/fuzz.sh "${FUZZ_SECONDS:-10}"
fi

if [ -d tests/interop ] || [ -d tests/deploy ]; then
  section "pytest: interop and deploy"
  export TENSORGATE_BIN="$ROOT/target/debug/tensorgate"
  dirs=""
  for d in tests/interop tests/deploy; do [ -d "$d" ] && dirs="$dirs $d"; done
  .venv/bin/python -m pytest -q $dirs
fi

section "all tests passed"
