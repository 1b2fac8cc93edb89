#!/usr/bin/env bash
# Instructions per 64 B WRITE, both ends, counted by callgrind (bench/src/bin/stream_cost.rs):
# the built-in engine's stream and the same stream through an application's rings (--app), each
# with every request signalled and with one in 100 (perftest's --cq-mod),
# from one build of the `cost` profile (one codegen unit, so that the figure does not move with
# unrelated code). The link's memset is left out; per message = (count at 2n - count at n) / n.
#
#   bash scripts/stream-cost.sh [n]        n messages and 2n (default 20000)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-20000}
command -v valgrind >/dev/null || { echo "stream-cost: valgrind is not installed" >&2; exit 1; }
cargo build --profile cost -q -p bench --bin stream_cost
bin=target/cost/stream_cost
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
count() { # messages, then stream_cost's other arguments
    local m=$1
    shift
    valgrind --tool=callgrind --callgrind-out-file="$out/cg" "$bin" -n "$m" "$@" >/dev/null 2>&1
    callgrind_annotate "$out/cg" | awk '
        /PROGRAM TOTALS/ { gsub(",", "", $1); total = $1 }
        /memset/ && !seen { gsub(",", "", $1); memset = $1; seen = 1 }
        END { print total - memset }'
}
# Every request signalled, and one in 100 as perftest's bandwidth tests signal (--cq-mod).
for mode in "" "--app"; do
    for q in 1 100; do
        a=$(count "$n" $mode --cq-mod $q)
        b=$(count $((2 * n)) $mode --cq-mod $q)
        echo "stream_cost ${mode:-(built-in)} --cq-mod $q: $(((b - a) / n)) instructions per 64 B WRITE"
    done
done
