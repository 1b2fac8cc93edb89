#!/usr/bin/env bash
# The main job on the embedded default: two roced nodes joined by net_memif (shared memory, no
# NIC). Node A runs roced's embedded default; node B runs config/node-b.toml. Each resolves the
# other's MAC by ARP and IPv6 neighbour discovery; A then pings B over IPv4 and IPv6 through the
# lcore loops. Both stop by themselves and print what happened.
set -euo pipefail
cd "$(dirname "$0")/.."
ROCED=${ROCED:-target/release/roced}
SECS=${DEMO_SECONDS:-6}
out=$(mktemp -d)
trap 'kill $a_pid $b_pid 2>/dev/null || true; rm -rf "$out"' EXIT

echo "== ferroce demo: two roced nodes joined by memif (/run/ferroce/memif-ab.sock)"
echo "   node A: embedded default, 10.77.0.1 fd77::1, worker lcore on CPU 1"
echo "   node B: config/node-b.toml, 10.77.0.2 fd77::2, worker lcore on CPU 0"
"$ROCED" --duration "$SECS" --ping 10.77.0.2,fd77::2 --ping-count 10 \
  --report "$out/a.json" >"$out/a.txt" 2>"$out/a.log" &
a_pid=$!
sleep 0.5
"$ROCED" --config config/node-b.toml --duration "$((SECS - 1))" \
  --report "$out/b.json" >"$out/b.txt" 2>"$out/b.log" &
b_pid=$!
rc=0
wait $a_pid || rc=$?
wait $b_pid || rc=$?
echo
echo "== node A log"; sed 's/\x1b\[[0-9;]*m//g' "$out/a.log"
echo "== node A summary"; cat "$out/a.txt"
echo
echo "== node B log"; sed 's/\x1b\[[0-9;]*m//g' "$out/b.log"
echo "== node B summary"; cat "$out/b.txt"
echo
if [ "$rc" != 0 ]; then echo "demo: a node failed (exit $rc)"; exit "$rc"; fi
left=$( (ls -d /var/run/dpdk/ferroce-a /var/run/dpdk/ferroce-b /dev/hugepages/ferroce-[ab]* 2>/dev/null || true) | wc -l)
echo "== both nodes stopped cleanly; DPDK files they left behind: $left"
