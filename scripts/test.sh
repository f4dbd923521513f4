#!/usr/bin/env bash
# The project's test command (README: "Test it"; CI runs it through .ci/run).
#
# On a fresh Debian machine, as root, with network access to Debian, PyPI and crates.io only,
# it installs what the tests need (missing Debian packages, and a .venv with the pinned
# tritonclient and MLServer of tests/interop/requirements.txt, and a .venv-kserve with the
# KServe of tests/interop/kserve/requirements.txt), then runs, failing fast:
#   cargo fmt --check, cargo clippy -D warnings, cargo build, cargo test,
#   scripts/fuzz.sh (if present, short and bounded), and the Python interop suites (pytest).
#
# Environment:
#   FUZZ_SECONDS   seconds for scripts/fuzz.sh (default 10)
#   TG_CARGO_LOCK  a lock file; when set, every cargo command runs under `flock` on it
#                  (for machines where several people build at once)
#   PYTEST_ARGS    extra arguments for pytest (e.g. "-x" or "-k simple")
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

STARTED=$SECONDS
# Each section says how much disk is left: a build that runs out of it dies in the linker
# with nothing but "Bus error" to say why.
section() {
  printf '\n==== %s ==== (t=%ss, %s free)\n' "$*" "$((SECONDS - STARTED))" \
    "$(df -h --output=avail . 2>/dev/null | tail -1 | tr -d ' ')"
}

# A fresh clone (CI's case) gains nothing from incremental caches, which cost 2 GB of disk.
if [ ! -d target ] && [ -z "${CARGO_INCREMENTAL:-}" ]; then
  export CARGO_INCREMENTAL=0
fi

cargo_() {
  if [ -n "${TG_CARGO_LOCK:-}" ]; then
    flock "$TG_CARGO_LOCK" cargo "$@"
  else
    cargo "$@"
  fi
}

# ---------------------------------------------------------------------------------------
# Debian packages. The one list: promtool (Debian's prometheus) for the metrics checks, and
# redis-server for the shared-pin tests (tests/shared_pins.rs starts its own instances).
# python3 / python3-venv are added below only when this machine lacks a working
# `python3 -m venv`.
DEBIAN_PACKAGES="prometheus redis-server"

section "Debian packages"
wanted="$DEBIAN_PACKAGES"
if ! command -v python3 >/dev/null 2>&1; then
  wanted="$wanted python3 python3-venv"
elif [ ! -x .venv/bin/python ]; then
  probe=$(mktemp -d)
  if ! python3 -m venv "$probe/venv" >/dev/null 2>&1; then
    wanted="$wanted python3-venv"
  fi
  rm -rf "$probe"
fi
missing=""
for p in $wanted; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "installing:$missing"
  if [ "$(id -u)" != 0 ]; then
    echo "missing Debian packages:$missing (run as root, or install them)" >&2
    exit 1
  fi
  aptlog=$(mktemp)
  # shellcheck disable=SC2086
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
         apt-get install -y -qq --no-install-recommends $missing; } >"$aptlog" 2>&1; then
    cat "$aptlog" >&2
    echo "apt-get failed" >&2
    exit 1
  fi
  rm -f "$aptlog"
else
  echo "all present: $wanted"
fi

# ---------------------------------------------------------------------------------------
section "Python venv (.venv, tests/interop/requirements.txt)"
REQS=tests/interop/requirements.txt
CONSTRAINTS=tests/interop/constraints.txt
if [ -x .venv/bin/python ] && ! .venv/bin/python -c 'import sys' >/dev/null 2>&1; then
  echo ".venv is broken (its Python is gone): recreating it"
  rm -rf .venv
fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
stamp=$(cat "$REQS" "$CONSTRAINTS" | sha256sum | cut -d' ' -f1)
if [ "$(cat .venv/.requirements.sha256 2>/dev/null || true)" != "$stamp" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -r "$REQS"
  echo "$stamp" > .venv/.requirements.sha256
else
  echo "up to date"
fi
.venv/bin/python --version

# ---------------------------------------------------------------------------------------
# KServe cannot share .venv (pip: ResolutionImpossible against MLServer's pins), so it gets
# its own; tests/interop/kserve/addsub_server.py runs with its Python.
section "Python venv (.venv-kserve, tests/interop/kserve/requirements.txt)"
KS_REQS=tests/interop/kserve/requirements.txt
KS_CONSTRAINTS=tests/interop/kserve/constraints.txt
if [ -x .venv-kserve/bin/python ] && ! .venv-kserve/bin/python -c 'import sys' >/dev/null 2>&1; then
  echo ".venv-kserve is broken (its Python is gone): recreating it"
  rm -rf .venv-kserve
fi
if [ ! -x .venv-kserve/bin/python ]; then
  python3 -m venv .venv-kserve
fi
stamp=$(cat "$KS_REQS" "$KS_CONSTRAINTS" | sha256sum | cut -d' ' -f1)
if [ "$(cat .venv-kserve/.requirements.sha256 2>/dev/null || true)" != "$stamp" ]; then
  .venv-kserve/bin/python -m pip install -q --disable-pip-version-check -r "$KS_REQS"
  echo "$stamp" > .venv-kserve/.requirements.sha256
else
  echo "up to date"
fi
.venv-kserve/bin/python -c 'import sys, importlib.metadata as m; print("kserve", m.version("kserve"), "on Python", sys.version.split()[0])'

# ---------------------------------------------------------------------------------------
section "cargo fmt --check"
cargo_ fmt --all -- --check

section "cargo clippy -D warnings"
cargo_ clippy --locked --all-targets -- -D warnings

section "cargo build"
# The examples too: test_pki makes the certificates of the Python TLS tests.
cargo_ build --locked --bins --examples

section "cargo test"
cargo_ test --locked

if [ -f scripts/fuzz.sh ]; then
  section "fuzz (${FUZZ_SECONDS:-10} s)"
  bash scripts/fuzz.sh "${FUZZ_SECONDS:-10}"
fi

# ---------------------------------------------------------------------------------------
section "pytest: Python interop suites"
export TENSORGATE_BIN="$ROOT/target/debug/tensorgate"
# Debian's prometheus was installed above: the real-Prometheus test must fail, not skip,
# if it is missing.
export TG_REQUIRE_PROMETHEUS=1
# .venv-kserve was installed above: the KServe tests must fail, not skip, if it is missing.
export TG_KSERVE_PYTHON="$ROOT/.venv-kserve/bin/python"
# One pytest run per directory, so each finds its own pytest.ini and conftest.py.
for d in tests/interop tests/observability tests/deploy; do
  if [ -d "$d" ]; then
    echo "-- $d"
    # shellcheck disable=SC2086
    .venv/bin/python -m pytest -q "$d" ${PYTEST_ARGS:-}
  fi
done

section "all tests passed"
