#!/usr/bin/env bash
# The main job on the embedded default (`make run`): two roced nodes joined by memif, QP pairs
# connected with rocectl, WRITE, READ, SEND and ATOMIC traffic with every byte checked, the
# nodes' counters and /metrics, then a clean stop.
# With DEMO_A and DEMO_B set (host:port of two running nodes' APIs, configured as
# config/node-{a,b}.toml's addresses; the compose job of docker/compose.yaml), it starts no roced
# and drives those two instead, leaving them running.
set -euo pipefail
cd "$(dirname "$0")/.." 2>/dev/null || true
ROCED=${ROCED:-target/release/roced}
CTL=${ROCECTL:-target/release/rocectl}
out=$(mktemp -d)
a_pid=""; b_pid=""
trap 'for p in $a_pid $b_pid; do kill "$p" 2>/dev/null || true; done; rm -rf "$out"' EXIT

A=${DEMO_A:-127.0.0.1:7470}
B=${DEMO_B:-127.0.0.1:7471}
a() { "$CTL" --api "$A" "$@"; }
b() { "$CTL" --api "$B" "$@"; }
# A field of rocectl's JSON output: field KEY < json
field() { python3 -c 'import json,sys; v=json.load(sys.stdin); print(v[sys.argv[1]] if isinstance(v, dict) else v[0][sys.argv[1]])' "$1"; }
check() { # check WHAT GOT WANT
  if [ "$2" == "$3" ]; then echo "   ok: $1"; else echo "   MISMATCH: $1: got $2, want $3"; exit 1; fi
}

echo "== ferroce demo: two roced nodes joined by memif (/run/ferroce/memif-ab.sock)"
if [ -n "${DEMO_A:-}" ]; then
  echo "   node A: 10.77.0.1 fd77::1, API $A; node B: 10.77.0.2 fd77::2, API $B (both already running)"
else
  echo "   node A: the embedded default, 10.77.0.1 fd77::1, API $A, worker lcore on CPU 1"
  echo "   node B: config/node-b.toml, 10.77.0.2 fd77::2, API $B, worker lcore on CPU 0"
  "$ROCED" --duration 120 --report "$out/a.json" >"$out/a.txt" 2>"$out/a.log" &
  a_pid=$!
  sleep 0.5
  "$ROCED" --config config/node-b.toml --duration 120 --report "$out/b.json" >"$out/b.txt" 2>"$out/b.log" &
  b_pid=$!
fi
for _ in $(seq 100); do
  if a port show 2>/dev/null | grep -q ' up' && b port show 2>/dev/null | grep -q ' up'; then break; fi
  sleep 0.2
done
echo
echo "== rocectl --api $A port show"
a port show

echo
echo "== memory regions (64 KiB of hugepage memory on each node)"
acc=local-write,remote-write,remote-read,remote-atomic
a --json mr reg --size 64K --access "$acc" >"$out/mra"
b --json mr reg --size 64K --access "$acc" >"$out/mrb"
ka=$(field lkey <"$out/mra"); aa=$(field addr <"$out/mra")
kb=$(field lkey <"$out/mrb"); ab=$(field addr <"$out/mrb")
a mr show

echo
echo "== QP pairs: one over IPv4 at path MTU 1024, one over IPv6 at 512 (the ports' MTU is 1500)"
# Each QP starts at a random PSN (its sq-psn): the peers exchange QPNs and PSNs, as verbs
# programs do out of band.
for q in a4 b4 a6 b6; do "${q:0:1}" --json qp create >"$out/qp$q"; done
qa4=$(field qpn <"$out/qpa4"); qb4=$(field qpn <"$out/qpb4"); qa6=$(field qpn <"$out/qpa6"); qb6=$(field qpn <"$out/qpb6")
pa4=$(field sq-psn <"$out/qpa4"); pb4=$(field sq-psn <"$out/qpb4"); pa6=$(field sq-psn <"$out/qpa6"); pb6=$(field sq-psn <"$out/qpb6")
echo "-- a path MTU the port cannot carry is refused, and the QP stays in RESET:"
a qp connect "$qa4" --remote-qpn "$qb4" --remote-gid 10.77.0.2 --remote-psn "$pb4" --mtu 4096 || echo "   (rocectl exit status $?)"
a qp connect "$qa4" --remote-qpn "$qb4" --remote-gid 10.77.0.2 --remote-psn "$pb4" --mtu 1024 >/dev/null
b qp connect "$qb4" --remote-qpn "$qa4" --remote-gid 10.77.0.1 --remote-psn "$pa4" --mtu 1024 >/dev/null
a qp connect "$qa6" --remote-qpn "$qb6" --remote-gid fd77::2 --remote-psn "$pb6" --mtu 512 >/dev/null
b qp connect "$qb6" --remote-qpn "$qa6" --remote-gid fd77::1 --remote-psn "$pa6" --mtu 512 >/dev/null
echo "-- node A:"; a qp show
echo "-- node B:"; b qp show

# 4 KiB of a pattern at the start of A's region.
pattern=$(python3 -c 'print("".join("%02x" % ((i * 7 + 3) % 256) for i in range(4096)))')
a mr write "$ka" --hex "$pattern" >/dev/null
wait_ok() { # wait_ok NODE QPN: the next send completion must be a success
  local c; c=$("$CTL" --api "$1" --json cq poll --qp "$2" --max 1 --wait-ms 5000)
  python3 -c 'import json,sys; c=json.loads(sys.argv[1]); s=c["send"] or c["recv"]; sys.exit(0 if s and s[0]["status"]=="success" else 1)' "$c" \
    || { echo "   completion failed: $c"; exit 1; }
}

for qp in "$qa4:IPv4" "$qa6:IPv6"; do
  q=${qp%%:*}; fam=${qp##*:}
  echo
  echo "== traffic on QP $q ($fam)"
  a post write "$q" --lkey "$ka" --addr "$aa" --length 4096 --rkey "$kb" --remote-addr "$ab" >/dev/null
  wait_ok "$A" "$q"
  check "RDMA WRITE of 4096 B landed in B's region" "$(b --json mr read "$kb" --length 4096 | field hex)" "$pattern"
  a post read "$q" --lkey "$ka" --addr $((aa + 8192)) --length 4096 --rkey "$kb" --remote-addr "$ab" >/dev/null
  wait_ok "$A" "$q"
  check "RDMA READ of 4096 B came back to A" "$(a --json mr read "$ka" --addr $((aa + 8192)) --length 4096 | field hex)" "$pattern"
done

echo
echo "== SEND with immediate, A to B, into a receive B posted"
b post recv "$qb4" --lkey "$kb" --addr $((ab + 16384)) --length 4096 >/dev/null
a post send "$qa4" --lkey "$ka" --addr "$aa" --length 1000 --imm 0x2a >/dev/null
wait_ok "$A" "$qa4"
b cq poll --qp "$qb4" --wait-ms 5000
check "SEND payload in B's receive buffer" "$(b --json mr read "$kb" --addr $((ab + 16384)) --length 1000 | field hex)" "${pattern:0:2000}"

echo
echo "== ATOMICs on the 8-byte word at B's region start"
before=$(b --json mr read "$kb" --length 8 | field hex)
a post fetch-add "$qa4" --lkey "$ka" --addr $((aa + 32768)) --length 8 --rkey "$kb" --remote-addr "$ab" --add 5 >/dev/null
wait_ok "$A" "$qa4"
check "fetch-add returned the old value" "$(a --json mr read "$ka" --addr $((aa + 32768)) --length 8 | field hex)" "$before"
now=$(b --json mr read "$kb" --length 8 | field hex)
old_le=$(python3 -c 'import sys; print(int.from_bytes(bytes.fromhex(sys.argv[1]), "little"))' "$now")
a post cmp-swap "$qa4" --lkey "$ka" --addr $((aa + 32768)) --length 8 --rkey "$kb" --remote-addr "$ab" \
  --compare "$old_le" --swap 42 >/dev/null
wait_ok "$A" "$qa4"
check "compare-swap stored 42" "$(b --json mr read "$kb" --length 8 | field hex)" "2a00000000000000"

echo
echo "== counters (rocectl stats on node B)"
b stats
echo
echo "== congestion control of QP $qa4 (rocectl cc show)"
a cc show "$qa4"
echo
echo "== Prometheus metrics: http://$A/metrics and http://$B/metrics (a few lines of A's)"
python3 - "$A" <<'PY'
import os, re, sys, urllib.request
req = urllib.request.Request(f"http://{sys.argv[1]}/metrics")
if os.environ.get("ROCECTL_TOKEN"):
    req.add_header("Authorization", "Bearer " + os.environ["ROCECTL_TOKEN"])
lines = urllib.request.urlopen(req, timeout=5).read().decode().splitlines()
pat = re.compile(r"^ferroce_(rx_write_requests|sent_pkts|qps\{.*RTS|completion_latency_seconds_count)")
print("\n".join([l for l in lines if pat.match(l)][:8]))
PY

echo
echo "== teardown"
for q in "$qa4" "$qa6"; do a qp destroy "$q" >/dev/null; done
for q in "$qb4" "$qb6"; do b qp destroy "$q" >/dev/null; done
a mr dereg "$ka" >/dev/null; b mr dereg "$kb" >/dev/null
echo "   QPs destroyed, regions deregistered"
if [ -n "${DEMO_A:-}" ]; then
  echo
  echo "== demo passed; nodes $A and $B left running"
  exit 0
fi
kill -TERM "$a_pid" "$b_pid"
rc=0
wait "$a_pid" || rc=$?
wait "$b_pid" || rc=$?
a_pid=""; b_pid=""
echo
echo "== node A summary"; cat "$out/a.txt"
echo "== node B summary"; cat "$out/b.txt"
echo
if [ "$rc" != 0 ]; then
  echo "demo: a node failed (exit $rc); logs:"; sed 's/\x1b\[[0-9;]*m//g' "$out/a.log" "$out/b.log"; exit "$rc"
fi
left=$( (ls -d /var/run/dpdk/ferroce-a /var/run/dpdk/ferroce-b /dev/hugepages/ferroce-[ab]* 2>/dev/null || true) | wc -l)
echo "== both nodes stopped cleanly; DPDK files they left behind: $left"
