#!/usr/bin/env bash
# The one test command: formatting, lints, every Rust test (unit, integration,
# SIGKILL durability), then the end-to-end test with the official ACP
# TypeScript SDK against the real `berth serve` binary.
# Installs what it needs into project-local folders (conformance/e2e/node_modules,
# and the a2a-sdk venv conformance/a2a/.venv).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo build (the berth binary the end-to-end tests drive)"
cargo build --workspace --bins --locked
echo "== cargo test"
cargo test --workspace --locked
TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
BERTH_BIN="$(cd "$TARGET_DIR" && pwd)/debug/berth"
export BERTH_BIN
echo "== ACP end-to-end with @agentclientprotocol/sdk"
(
  cd conformance/e2e
  npm ci --no-audit --no-fund --loglevel=error
  node --test
)
echo "== A2A end-to-end with a2a-sdk (Python)"
(
  cd conformance/a2a
  if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import importlib.metadata as m; assert m.version("a2a-sdk") == "1.3.0"' 2>/dev/null; then
    python3 -m venv .venv
    .venv/bin/pip install --quiet --disable-pip-version-check a2a-sdk==1.3.0
  fi
  .venv/bin/python -m unittest -v test_a2a_sdk
)
echo "== all tests passed"
