#!/bin/sh
# Runs berth under heaptrack while keeping berth's pid (exec), so that a
# benchmark's SIGTERM and RSS sampling reach berth itself. Use it as BERTH_BIN:
#
#   cargo build --release --bin berth --features system-allocator
#   cp target/release/berth /tmp/berth-sysalloc
#   BERTH_SYSALLOC=/tmp/berth-sysalloc HEAP_OUT=/tmp/heap BERTH_BIN=scripts/heap/heaptrack-berth.sh \
#     target/release/bench-ws --clients 300 --sessions 30 --duration-secs 40
#   python3 scripts/heap/heap_diff.py /tmp/heap.gz 5 40
#
# The profile is written (interpreted, gzip) to $HEAP_OUT.gz.
set -eu
out=${HEAP_OUT:-/tmp/berth-heap}
bin=${BERTH_SYSALLOC:?set BERTH_SYSALLOC to a berth built with --features system-allocator}
lib=${HEAPTRACK_LIB:-/usr/lib/heaptrack}
pipe=$(mktemp -u /tmp/heaptrack_fifo.XXXXXX)
mkfifo "$pipe"
("$lib/libexec/heaptrack_interpret" < "$pipe" | gzip -c > "$out.gz"; rm -f "$pipe") &
exec env LD_PRELOAD="$lib/libheaptrack_preload.so" DUMP_HEAPTRACK_OUTPUT="$pipe" "$bin" "$@"
