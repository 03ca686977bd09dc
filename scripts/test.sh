#!/usr/bin/env bash
# The one test command: formatting, lints, every Rust test (unit, integration,
# SIGKILL durability), then the end-to-end test with the official ACP
# TypeScript SDK against the real `berth serve` binary.
# Installs what it needs into project-local folders (conformance/e2e/node_modules).
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
echo "== ACP end-to-end with @agentclientprotocol/sdk"
(
  cd conformance/e2e
  npm ci --no-audit --no-fund --loglevel=error
  BERTH_BIN="$PWD/../../target/debug/berth" node --test
)
echo "== all tests passed"
