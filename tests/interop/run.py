#!/usr/bin/env python3
"""ferroce against Linux Soft-RoCE: unmodified perftest in a VM, rocectl perf on roced.

usage: run.py [--only SUBSTRING] [--keep-logs DIR]

Boots one peer VM (peer.Lab), starts roced on net_af_packet in the lab's namespace, and runs
each case in both roles (ferroce as perftest client against the VM's server, and the VM's
perftest client against `rocectl perf --server`). The `lib` cases run the same unmodified
tool on both ends: Debian's perftest or rdma-core example on ferroce through
libferroce_ibverbs.so (LD_PRELOAD, attached to roced's socket), against the same on rxe.
The `cm` cases run the VM's rdmacm-utils against roced's QP1 (its connection manager
refusing what no one listens on, and connections both ways between rping and
`rocectl cm connect` / `rocectl cm accept`, and rocectl's rping, udaddy, ucmatose and perf -R
against the VM's). The `libcm` cases run the same unmodified rdma_cm program on both ends
(rping, ucmatose, udaddy, rdma_server/rdma_client, perftest -R), ferroce's through the
library's librdmacm calls. A case passes when both sides exit 0 and
report the same message size and iteration count with a non-zero bandwidth. Prints one line
per case, then the tools' own output for every case; exits 1 if any case failed.

Needs root, tests/interop/setup.sh done, and roced/rocectl built (ROCED / ROCECTL, default
target/release, else target/debug).
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def binary(name):
    env = os.environ.get(name.upper())
    if env:
        return os.path.abspath(env)
    for kind in ("release", "debug"):
        p = os.path.join(ROOT, "target", kind, name)
        if os.path.exists(p):
            return p
    sys.exit("run.py: build %s first (cargo build --release)" % name)


ROCED = binary("roced")
ROCECTL = binary("rocectl")
API = "127.0.0.1:7480"
# The compatibility library (issue 21), built beside roced: the same Debian tools as the VM's
# run on ferroce through it, in the lab's namespace, attached to roced's socket.
def library():
    """libferroce_ibverbs.so beside roced: where `cargo build` puts it, or in deps/, where
    `cargo test` leaves it (a cdylib is copied up only by a build)."""
    d = os.path.dirname(ROCED)
    for p in (os.path.join(d, "libferroce_ibverbs.so"),
              os.path.join(d, "deps", "libferroce_ibverbs.so")):
        if os.path.exists(p):
            return p
    sys.exit("run.py: libferroce_ibverbs.so is not built beside %s" % ROCED)


LIBRARY = library()
ATTACH = "/run/ferroce/ferroce-interop-%d.sock" % os.getpid()

CONFIG = """[eal]
file_prefix = "ferroce-interop-%d"
[dataplane]
lcores = [1]
mbufs = 8191
idle_sleep_us = 20
[[ports]]
device = "net_af_packet0,iface=fxd0,blocksz=1167360,framesz=9120,framecnt=512"
mtu = %d
addresses = ["%s/24", "%s/64"]
probes = ["%s"]
[api]
listen = "%s"
"""

# The lab's Ethernet MTU: jumbo frames everywhere, so each case picks its path MTU (1024 or
# 4096) with -m, on both sides.
LAB_MTU = 9000


def case(name, tool, perf, **kw):
    """A case: the perftest (or ibv_rc_pingpong) command in the VM, the rocectl arguments for
    ferroce's side, and optionally: gid (GID index on both sides: 1 is ::ffff:IPv4, 2 the
    IPv6 address), netem (a netem qdisc on the VM's eth0 for the case), impair (ferroce's
    impairment stage, both directions), vm_flags (extra perftest flags for the VM in both
    roles), cnp (ferroce must send CNPs while it serves the VM's client)."""
    return dict(name=name, tool=tool, perf=perf, gid=kw.get("gid", 1), netem=kw.get("netem"),
                impair=kw.get("impair"), vm_flags=kw.get("vm_flags", ""),
                cnp=kw.get("cnp", False), cm=" -R" in tool)


# Sizes 1 B to 1 MiB, path MTUs 1024 and 4096, IPv4 and IPv6 GIDs, loss on either side, and
# CE marks from the peer. Iterations are few at large sizes: the VM runs under TCG.
CASES = [
    case("write_bw 1B", "ib_write_bw -s 1 -n 500 -m 1024", "write bw -s 1 -n 500 -m 1024"),
    case("write_bw 4KiB", "ib_write_bw -s 4096 -n 500 -m 1024", "write bw -s 4096 -n 500 -m 1024"),
    case("write_bw 64KiB", "ib_write_bw -s 65536 -n 100 -m 1024", "write bw -s 65536 -n 100 -m 1024"),
    case("write_bw 1MiB", "ib_write_bw -s 1048576 -n 10 -m 1024", "write bw -s 1M -n 10 -m 1024"),
    case("write_bw 64KiB mtu4096", "ib_write_bw -s 65536 -n 100 -m 4096",
         "write bw -s 65536 -n 100 -m 4096"),
    case("write_bw 1MiB mtu4096", "ib_write_bw -s 1048576 -n 10 -m 4096",
         "write bw -s 1M -n 10 -m 4096"),
    case("write_bw 4KiB -D 2s", "ib_write_bw -s 4096 -D 2 -m 1024",
         "write bw -s 4096 -D 2 -m 1024"),
    case("write_bw 4KiB -q 4", "ib_write_bw -s 4096 -n 200 -m 1024 -q 4",
         "write bw -s 4096 -n 200 -m 1024 -q 4"),
    case("read_bw 4KiB", "ib_read_bw -s 4096 -n 500 -m 1024", "read bw -s 4096 -n 500 -m 1024"),
    case("read_bw 4KiB -q 4", "ib_read_bw -s 4096 -n 200 -m 1024 -q 4",
         "read bw -s 4096 -n 200 -m 1024 -q 4"),
    case("atomic_bw fetch-add -q 4", "ib_atomic_bw -A FETCH_AND_ADD -n 200 -q 4",
         "atomic bw -A fetch-add -n 200 -q 4"),
    case("read_bw 1MiB mtu4096", "ib_read_bw -s 1048576 -n 10 -m 4096",
         "read bw -s 1M -n 10 -m 4096"),
    case("send_bw 4KiB", "ib_send_bw -s 4096 -n 500 -m 1024", "send bw -s 4096 -n 500 -m 1024"),
    case("send_bw 4KiB -D 2s", "ib_send_bw -s 4096 -D 2 -m 1024",
         "send bw -s 4096 -D 2 -m 1024"),
    case("send_bw 4KiB -q 4", "ib_send_bw -s 4096 -n 200 -m 1024 -q 4",
         "send bw -s 4096 -n 200 -m 1024 -q 4"),
    case("send_bw 1B", "ib_send_bw -s 1 -n 500 -m 1024", "send bw -s 1 -n 500 -m 1024"),
    case("send_bw 1MiB mtu4096", "ib_send_bw -s 1048576 -n 10 -m 4096",
         "send bw -s 1M -n 10 -m 4096"),
    case("atomic_bw fetch-add", "ib_atomic_bw -A FETCH_AND_ADD -n 500", "atomic bw -A fetch-add -n 500"),
    case("atomic_bw cmp-swap", "ib_atomic_bw -A CMP_AND_SWAP -n 500", "atomic bw -A cmp-swap -n 500"),
    case("write_lat 8B", "ib_write_lat -s 8 -n 300 -m 1024", "write lat -s 8 -n 300 -m 1024"),
    case("write_lat 4KiB", "ib_write_lat -s 4096 -n 200 -m 1024", "write lat -s 4096 -n 200 -m 1024"),
    case("write_lat 1MiB mtu4096", "ib_write_lat -s 1048576 -n 10 -m 4096",
         "write lat -s 1M -n 10 -m 4096"),
    case("read_lat 8B", "ib_read_lat -s 8 -n 300 -m 1024", "read lat -s 8 -n 300 -m 1024"),
    case("read_lat 1MiB mtu4096", "ib_read_lat -s 1048576 -n 10 -m 4096",
         "read lat -s 1M -n 10 -m 4096"),
    case("send_lat 8B", "ib_send_lat -s 8 -n 300 -m 1024", "send lat -s 8 -n 300 -m 1024"),
    case("write_lat 8B inline", "ib_write_lat -s 8 -n 300 -m 1024 -I 64",
         "write lat -s 8 -n 300 -m 1024 -I 64"),
    case("send_lat 8B inline", "ib_send_lat -s 8 -n 300 -m 1024 -I 64",
         "send lat -s 8 -n 300 -m 1024 -I 64"),
    case("send_lat 1MiB mtu4096", "ib_send_lat -s 1048576 -n 10 -m 4096",
         "send lat -s 1M -n 10 -m 4096"),
    case("atomic_lat fetch-add", "ib_atomic_lat -A FETCH_AND_ADD -n 300", "atomic lat -A fetch-add -n 300"),
    # Latency tests with -D: each side counts its own iterations in its window (t_avg only).
    case("write_lat 8B -D 2s", "ib_write_lat -s 8 -D 2 -m 1024", "write lat -s 8 -D 2 -m 1024"),
    case("read_lat 8B -D 2s", "ib_read_lat -s 8 -D 2 -m 1024", "read lat -s 8 -D 2 -m 1024"),
    case("send_lat 8B -D 2s", "ib_send_lat -s 8 -D 2 -m 1024", "send lat -s 8 -D 2 -m 1024"),
    case("rc_pingpong 1B", "ibv_rc_pingpong -s 1 -n 200 -m 1024", "pingpong -s 1 -n 200 -m 1024"),
    case("rc_pingpong 4KiB", "ibv_rc_pingpong -s 4096 -n 200 -m 1024", "pingpong -s 4096 -n 200 -m 1024"),
    case("rc_pingpong 1MiB mtu4096", "ibv_rc_pingpong -s 1048576 -n 10 -m 4096",
         "pingpong -s 1M -n 10 -m 4096"),
    # IPv6 GIDs (RoCEv2 over IPv6; the TCP exchanges stay on IPv4, as with perftest's -x).
    # ibv_ud_pingpong: UD datagrams up to the path MTU (4096 on the jumbo lab).
    case("ud_pingpong 1B", "ibv_ud_pingpong -s 1 -n 200", "pingpong --ud -s 1 -n 200"),
    case("ud_pingpong 512B", "ibv_ud_pingpong -s 512 -n 200", "pingpong --ud -s 512 -n 200"),
    case("ud_pingpong 4KiB", "ibv_ud_pingpong -s 4096 -n 100", "pingpong --ud -s 4096 -n 100"),
    case("ipv6 write_bw 64KiB", "ib_write_bw -s 65536 -n 100 -m 4096",
         "write bw -s 65536 -n 100 -m 4096", gid=2),
    case("ipv6 read_lat 8B", "ib_read_lat -s 8 -n 300 -m 1024", "read lat -s 8 -n 300 -m 1024",
         gid=2),
    case("ipv6 send_bw 4KiB", "ib_send_bw -s 4096 -n 300 -m 1024",
         "send bw -s 4096 -n 300 -m 1024", gid=2),
    case("ipv6 ud_pingpong 1KiB", "ibv_ud_pingpong -s 1024 -n 100",
         "pingpong --ud -s 1024 -n 100", gid=2),
    case("ipv6 rc_pingpong 4KiB", "ibv_rc_pingpong -s 4096 -n 100 -m 1024",
         "pingpong -s 4096 -n 100 -m 1024", gid=2),
    # Loss: netem on the VM's egress and ferroce's own impairment stage, 2% each way.
    # Under loss both sides wait 268 ms for an ACK (-u 16, not perftest's 67 ms): the VM runs
    # under TCG, and a stall of its CPU must not pass for eight lost packets in a row.
    case("loss write_bw 64KiB", "ib_write_bw -s 65536 -n 100 -m 1024",
         "write bw -s 65536 -n 100 -m 1024 -u 16", netem="loss 2%", impair=0.02, vm_flags=" -u 16"),
    case("loss read_bw 64KiB", "ib_read_bw -s 65536 -n 100 -m 1024",
         "read bw -s 65536 -n 100 -m 1024 -u 16", netem="loss 2%", impair=0.02, vm_flags=" -u 16"),
    case("loss send_bw 4KiB", "ib_send_bw -s 4096 -n 300 -m 1024",
         "send bw -s 4096 -n 300 -m 1024 -u 16", netem="loss 2%", impair=0.02, vm_flags=" -u 16"),
    case("loss atomic_bw fetch-add", "ib_atomic_bw -A FETCH_AND_ADD -n 300",
         "atomic bw -A fetch-add -n 300 -u 16", netem="loss 2%", impair=0.02, vm_flags=" -u 16"),
    # The latency tools whose server waits in a last barrier for the client (READ, atomic).
    case("loss read_lat 8B", "ib_read_lat -s 8 -n 300 -m 1024",
         "read lat -s 8 -n 300 -m 1024 -u 16", netem="loss 2%", impair=0.02, vm_flags=" -u 16"),
    case("loss atomic_lat fetch-add", "ib_atomic_lat -A FETCH_AND_ADD -n 300",
         "atomic lat -A fetch-add -n 300 -u 16", netem="loss 2%", impair=0.02, vm_flags=" -u 16"),
    # No ping-pong (rc_pingpong, ud_pingpong, write_lat, send_lat) under loss: its last
    # message's ACK may be lost after the peer, done, has exited, and then the sender's final
    # completion is RETRY_EXC_ERR whatever the stack; ud_pingpong never resends a lost
    # datagram and waits for it forever (tests/interop/NOTES.md).
    # ECN: the VM sends ECT(0) (--tclass=2) and netem marks CE instead of dropping (its ecn
    # option), so ferroce, as the server of the VM's client, must send CNPs, which rxe takes
    # without harm to the connection.
    case("ecn write_bw 64KiB", "ib_write_bw -s 65536 -n 200 -m 1024",
         "write bw -s 65536 -n 200 -m 1024", netem="loss 20% ecn",
         vm_flags=" --tclass=2", cnp=True),
    # perftest's -R: no TCP; the exchange runs as SENDs on a first CM connection (rdma_cm
    # port 18515) and each test QP connects through the CM (REQ/REP/RTU on QP1).
    case("cm write_bw -R 4KiB", "ib_write_bw -s 4096 -n 500 -m 1024 -R",
         "write bw -s 4096 -n 500 -m 1024 -R"),
    case("cm read_bw -R 4KiB", "ib_read_bw -s 4096 -n 500 -m 1024 -R",
         "read bw -s 4096 -n 500 -m 1024 -R"),
    case("cm send_bw -R 4KiB", "ib_send_bw -s 4096 -n 500 -m 1024 -R",
         "send bw -s 4096 -n 500 -m 1024 -R"),
    case("cm write_bw -R 4KiB -q 2", "ib_write_bw -s 4096 -n 200 -m 1024 -q 2 -R",
         "write bw -s 4096 -n 200 -m 1024 -q 2 -R"),
]

# The same unmodified tools on both ends: Debian's perftest and rdma-core examples on ferroce
# through libferroce_ibverbs.so (LD_PRELOAD), against the same tools on rxe in the VM; both
# roles, path MTU 1024 and 4096, IPv4 and IPv6 GIDs.
LIB_CASES = [
    case("lib write_bw 64B", "ib_write_bw -s 64 -n 500 -m 1024", None),
    case("lib write_bw 64KiB mtu4096", "ib_write_bw -s 65536 -n 100 -m 4096", None),
    case("lib read_bw 4KiB", "ib_read_bw -s 4096 -n 300 -m 1024", None),
    case("lib send_bw 4KiB mtu4096", "ib_send_bw -s 4096 -n 300 -m 4096", None),
    case("lib atomic_bw fetch-add", "ib_atomic_bw -A FETCH_AND_ADD -n 300", None),
    case("lib write_lat 8B", "ib_write_lat -s 8 -n 200 -m 1024", None),
    case("lib read_lat 8B mtu4096", "ib_read_lat -s 8 -n 200 -m 4096", None),
    case("lib send_lat 8B", "ib_send_lat -s 8 -n 200 -m 1024", None),
    case("lib rc_pingpong 4KiB", "ibv_rc_pingpong -s 4096 -n 100 -m 1024", None),
    case("lib ud_pingpong 1KiB", "ibv_ud_pingpong -s 1024 -n 100", None),
    case("lib ipv6 write_bw 64KiB", "ib_write_bw -s 65536 -n 100 -m 4096", None, gid=2),
    case("lib ipv6 send_lat 8B", "ib_send_lat -s 8 -n 200 -m 1024", None, gid=2),
    case("lib ipv6 rc_pingpong 4KiB", "ibv_rc_pingpong -s 4096 -n 100 -m 1024", None, gid=2),
]

# rdma_cm against ferroce's QP1: the VM's unmodified rdmacm-utils to roced, whose connection
# manager answers. (name, the command in the VM, what its output must show, the CM counter
# that must grow.)
CM_CASES = [
    dict(name="cm rping -c to no listener", cmd="rping -c -a %s -p 7999 -C 1 -v" % peer.FERROCE_IP,
         expect=r"RDMA_CM_EVENT_REJECTED, error 8", counter="cm_tx_rej"),
    dict(name="cm ipv6 rping -c to no listener",
         cmd="rping -c -a %s -p 7999 -C 1 -v" % peer.FERROCE_IP6,
         expect=r"RDMA_CM_EVENT_REJECTED, error 8", counter="cm_tx_rej"),
    dict(name="cm udaddy to no listener", cmd="udaddy -s %s -C 1" % peer.FERROCE_IP,
         expect=r"RDMA_CM_EVENT_UNREACHABLE", counter="cm_tx_mads"),
    # Connections both ways with the VM's rping (debug output shows its CM events): ferroce's
    # REQ/REP/RTU against rxe's ib_cm, the QPs in RTS on both ends, then a DREQ from ferroce.
    # (rping's own data exchange, both ends rping: the libcm cases.)
    dict(name="cm rping -s <- rocectl cm connect", kind="to_vm", v6=False, port=7472),
    dict(name="cm ipv6 rping -s <- rocectl cm connect", kind="to_vm", v6=True, port=7473),
    dict(name="cm rping -c -> rocectl cm accept", kind="from_vm", v6=False, port=7474),
    dict(name="cm ipv6 rping -c -> rocectl cm accept", kind="from_vm", v6=True, port=7475),
    # rping's whole test both ways, 100 pings with every byte checked by the client (rping's
    # -V when the VM is the client, rocectl rping's -V when ferroce is).
    dict(name="cm rping -C 100", kind="rping", v6=False, port=7476),
    dict(name="cm ipv6 rping -C 100", kind="rping", v6=True, port=7477),
    # perftest 4.5's -R is IPv4 only, on both ends (ferroce's own -R over IPv6 is in
    # controlplane/tests/cm_nodes.rs): its client refuses an IPv6 server before it sends a
    # thing, and its server listens on an AF_INET rdma_cm ID, which Linux's rdma_cm does not
    # match to an IPv6 REQ (cma_match_private_data), so ib_cm rejects it. These rows show
    # that limit as it stands, with ferroce's side counted.
    dict(name="cm ipv6 write_bw -R (perftest: IPv4 only)", kind="perftest_v6"),
    # udaddy both ways: SIDR on QP1 finds the server's UD QP, then 10 datagrams of 100 bytes
    # each way (udaddy's fixed port 7174 in rdma_cm's UDP port space).
    dict(name="cm udaddy", kind="udaddy", v6=False),
    dict(name="cm ipv6 udaddy", kind="udaddy", v6=True),
    # ucmatose both ways: one RC connection, 10 SENDs of 100 bytes each way, the server's DREQ.
    dict(name="cm ucmatose", kind="ucmatose", v6=False),
    dict(name="cm ipv6 ucmatose", kind="ucmatose", v6=True),
]

# The same unmodified rdma_cm programs on both ends: Debian's rdmacm-utils and perftest -R on
# ferroce through libferroce_ibverbs.so (its librdmacm calls answered by roced's CM), against
# the same on rxe in the VM, both roles. ({ip}: the server's address; perftest -R is IPv4 only.)
def libcm(name, server, client, port, v6=False, client_tool=None):
    tool = server.split()[0]
    return dict(name=name, kind="libcm", server=server, client=client,
                client_tool=client_tool or tool, port=port, v6=v6)


PERFTEST_R = "-R -F -s 4096 -n 200 -m 1024 -p 7496"
LIBCM_CASES = [
    libcm("libcm rping -C 100", "rping -s -a {ip} -p 7494 -v",
          "rping -c -a {ip} -p 7494 -C 100 -v", 7494),
    libcm("libcm ipv6 rping -C 100", "rping -s -a {ip} -p 7495 -v",
          "rping -c -a {ip} -p 7495 -C 100 -v", 7495, v6=True),
    libcm("libcm ucmatose", "ucmatose -b {ip} -C 10 -S 100", "ucmatose -s {ip} -C 10 -S 100",
          7471),
    libcm("libcm ipv6 ucmatose", "ucmatose -b {ip} -C 10 -S 100",
          "ucmatose -s {ip} -C 10 -S 100", 7471, v6=True),
    libcm("libcm udaddy", "udaddy -b {ip} -C 10 -S 100", "udaddy -s {ip} -C 10 -S 100", 7174),
    libcm("libcm ipv6 udaddy", "udaddy -b {ip} -C 10 -S 100", "udaddy -s {ip} -C 10 -S 100",
          7174, v6=True),
    libcm("libcm rdma_server/client", "rdma_server -s {ip} -p 7497",
          "rdma_client -s {ip} -p 7497", 7497, client_tool="rdma_client"),
    libcm("libcm ipv6 rdma_server/client", "rdma_server -s {ip} -p 7498",
          "rdma_client -s {ip} -p 7498", 7498, v6=True, client_tool="rdma_client"),
    libcm("libcm write_bw -R -q 2", "ib_write_bw %s -q 2" % PERFTEST_R,
          "ib_write_bw %s -q 2 {ip}" % PERFTEST_R, 7496),
    libcm("libcm read_bw -R", "ib_read_bw %s" % PERFTEST_R, "ib_read_bw %s {ip}" % PERFTEST_R,
          7496),
    libcm("libcm send_bw -R", "ib_send_bw %s" % PERFTEST_R, "ib_send_bw %s {ip}" % PERFTEST_R,
          7496),
]


def rping_rows(vm, c):
    """rocectl rping against the VM's rping, each as client and as server."""
    vip = vm.ip6 if c["v6"] else vm.ip
    fip = peer.FERROCE_IP6 if c["v6"] else peer.FERROCE_IP
    rows = []
    # ferroce's client, the VM's server.
    log = "/tmp/rping-s.log"
    vm_background(vm, "timeout -k 5 90 rping -s -a %s -p %d -C 100" % (vip, c["port"]), log)
    t = time.time()
    for _ in range(30):
        r = ctl("--json rping -c -a %s -p %d -C 100 -V -S 64" % (vip, c["port"]), check=False,
                timeout=120)
        if "cm_rejected" not in r.stderr:
            break
        time.sleep(0.3)
    took = time.time() - t
    vout = vm_log_until(vm, log, "EXIT=", 30)
    try:
        res = json.loads(r.stdout)
    except ValueError:
        res = {}
    ok = r.returncode == 0 and res.get("pings") == 100 and res.get("error") is None
    rows.append(("rocectl rping -c -V -> rxe rping -s", ok,
                 "%s pings checked in %.1fs" % (res.get("pings"), took) if ok else
                 "exit %d: %s" % (r.returncode, (r.stdout + r.stderr).strip()[-300:]),
                 r.stdout + r.stderr, vout))
    vm.run("pkill -x rping", 10)
    # The VM's client, ferroce's server.
    p = subprocess.Popen(["ip", "netns", "exec", peer.NS, ROCECTL, "--api", API, "--json",
                          "rping", "-s", "-p", str(c["port"]), "-C", "100"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(0.5)
    t = time.time()
    _, vout = vm.run("timeout -k 5 90 rping -c -a %s -p %d -C 100 -V -v; echo EXIT=$?"
                     % (fip, c["port"]), 120)
    took = time.time() - t
    try:
        fout = p.communicate(timeout=40)[0]
    except subprocess.TimeoutExpired:
        p.kill()
        fout = p.communicate()[0] + "\n(killed: no exit)"
    pings = len(re.findall(r"^ping data: rdma-ping-\d+: ", vout, re.M))
    ok = exit_of(vout) == "0" and pings == 100 and "mismatch" not in vout
    rows.append(("rxe rping -c -V -> rocectl rping -s", ok,
                 "%d pings checked by rping in %.1fs" % (pings, took) if ok else
                 "rping exit %s, %d pings: %s" % (exit_of(vout), pings, vout.strip()[-300:]),
                 fout, vout))
    return rows


def perftest_v6_rows(vm, c):
    """perftest 4.5's -R against an IPv6 address, each way: the VM's client gives up before
    sending anything (roced's CM receives no MAD), and ferroce's REQ to the VM's server is
    rejected by rxe's rdma_cm (its listener is IPv4)."""
    rows = []
    before = counter("cm_rx_mads")
    _, vout = vm.run("timeout -k 5 30 ib_write_bw -d rxe0 -F -x 2 -R -n 10 %s; echo EXIT=$?"
                     % peer.FERROCE_IP6, 60)
    got = counter("cm_rx_mads") - before
    ok = (exit_of(vout) == "1" and "Address family for hostname not supported" in vout
          and got == 0)
    rows.append(("rxe client -> ferroce IPv6", ok,
                 "perftest refuses an IPv6 server (exit 1, no MAD sent)" if ok else
                 "exit %s, %d MADs at roced: %s" % (exit_of(vout), got, vout.strip()[-300:]),
                 "", vout))
    vm_server(vm, "ib_write_bw -d rxe0 -F -x 2 -R -n 10", cm=True)
    rej = counter("cm_rx_mads")
    r = ctl("perf write bw -R -x 2 -n 10 --timeout 10 %s" % vm.ip6, check=False, timeout=60)
    got = counter("cm_rx_mads") - rej
    vm.run("kill $(pidof ib_write_bw) 2>/dev/null", 10)
    srv = vm_server_result(vm)
    m = re.search(r"rejected \([^)]*\)", r.stderr)
    ok = r.returncode == 1 and m is not None and got > 0
    rows.append(("ferroce client -> rxe IPv6", ok,
                 "rxe's rdma_cm refuses the IPv6 REQ: %s, %d MADs back" % (m.group(0), got)
                 if ok else "exit %d, %d MADs back: %s" % (r.returncode, got,
                                                         r.stderr.strip()[-300:]),
                 r.stdout + r.stderr, srv))
    return rows


def example_rows(vm, c):
    """rocectl udaddy (ucmatose) against the VM's udaddy (ucmatose), each as client and as
    server: both ends' whole test, exit 0 and 'return status 0'."""
    tool = c["kind"]
    port = {"udaddy": 7174, "ucmatose": 7471}[tool]
    what = {"udaddy": "SIDR to", "ucmatose": "connected to"}[tool]
    vip = vm.ip6 if c["v6"] else vm.ip
    fip = peer.FERROCE_IP6 if c["v6"] else peer.FERROCE_IP
    done = re.compile(r"^data transfers complete$.*^return status 0$", re.M | re.S)
    rows = []
    # ferroce's client, the VM's server (bound to its address, so an IPv6 request matches).
    log = "/tmp/%s-s.log" % tool
    vm_background(vm, "timeout -k 5 60 %s -b %s -C 10 -S 100" % (tool, vip), log)
    for _ in range(60):
        rc, _ = vm.run("rdma resource show cm_id | grep LISTEN | grep -q ':%d'" % port, 10)
        if rc == 0:
            break
        time.sleep(0.3)
    t = time.time()
    r = ctl("--json %s -s %s -C 10 -S 100 --timeout-ms 20000" % (tool, vip), check=False,
            timeout=60)
    took = time.time() - t
    vout = vm_log_until(vm, log, "EXIT=", 20)
    try:
        res = json.loads(r.stdout)
    except ValueError:
        res = {}
    ok = (r.returncode == 0 and res.get("messages") == 10 and exit_of(vout) == "0"
          and done.search(vout) is not None)
    rows.append(("rocectl %s -s -> rxe %s" % (tool, tool), ok,
                 "%s rxe QP %s, 10 x 100 B each way in %.1fs" % (
                     what, res.get("connection", {}).get("remote_qpn"), took) if ok else
                 "exit %d / rxe %s: %s" % (r.returncode, exit_of(vout),
                                           (r.stdout + r.stderr).strip()[-300:]),
                 r.stdout + r.stderr, vout))
    vm.run("kill $(pidof %s) 2>/dev/null" % tool, 10)
    # The VM's client, ferroce's server.
    p = subprocess.Popen(["ip", "netns", "exec", peer.NS, ROCECTL, "--api", API, "--json",
                          tool, "-C", "10", "-S", "100", "--timeout-ms", "20000"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for _ in range(100):
        if '"port":%d' % port in ctl("--json cm listeners", check=False).stdout.replace(" ", ""):
            break
        time.sleep(0.1)
    t = time.time()
    _, vout = vm.run("timeout -k 5 60 %s -s %s -C 10 -S 100; echo EXIT=$?" % (tool, fip), 90)
    took = time.time() - t
    try:
        fout = p.communicate(timeout=40)[0]
    except subprocess.TimeoutExpired:
        p.kill()
        fout = p.communicate()[0] + "\n(rocectl killed: no exit)"
    try:
        res = json.loads(fout)
    except ValueError:
        res = {}
    ok = (p.returncode == 0 and res.get("messages") == 10 and exit_of(vout) == "0"
          and done.search(vout) is not None)
    rows.append(("rxe %s -s -> rocectl %s" % (tool, tool), ok,
                 "%s ferroce QP %s, 10 x 100 B each way in %.1fs" % (what, res.get("qpn"), took)
                 if ok else "exit %s / rocectl %s: %s" % (exit_of(vout), p.returncode,
                                                          vout.strip()[-300:]),
                 fout, vout))
    return rows


def libcm_verdict(c, cout, sout):
    """Whether a libcm case's client output `cout` and server output `sout` show the whole
    test done (both exited 0), and its figures."""
    if exit_of(cout) != "0" or exit_of(sout) != "0":
        return False, "exit %s / %s: %s" % (exit_of(cout), exit_of(sout),
                                             (cout + sout).strip()[-300:])
    tool = c["server"].split()[0]
    if tool == "rping":
        pings = len(re.findall(r"^ping data: rdma-ping-\d+: ", cout, re.M))
        return pings == 100 and "mismatch" not in cout, "%d pings checked by rping" % pings
    if tool in ("ucmatose", "udaddy"):
        done = re.compile(r"^data transfers complete$.*^return status 0$", re.M | re.S)
        ok = done.search(cout) is not None and done.search(sout) is not None
        return ok, "10 x 100 B each way, both ends' status 0"
    if tool == "rdma_server":
        ok = "rdma_client: end 0" in cout and "rdma_server: end 0" in sout
        return ok, "one message each way, both ends' end 0"
    return check(cout, sout, False)


def libcm_rows(vm, c):
    """A libcm case both ways: ferroce's tool (through the library) as client of the VM's,
    then the VM's as client of ferroce's."""
    rows = []
    vip = vm.ip6 if c["v6"] else vm.ip
    fip = peer.FERROCE_IP6 if c["v6"] else peer.FERROCE_IP
    tool, ctool = c["server"].split()[0], c["client_tool"]
    # ferroce's client, the VM's server.
    log = "/tmp/libcm-s.log"
    vm_background(vm, "timeout -k 5 90 " + c["server"].format(ip=vip), log)
    for _ in range(60):
        rc, _ = vm.run("rdma resource show cm_id | grep LISTEN | grep -q ':%d'" % c["port"], 10)
        if rc == 0:
            break
        time.sleep(0.3)
    t = time.time()
    try:
        r = subprocess.run(lib_tool(c["client"].format(ip=vip), ""), capture_output=True,
                           text=True, timeout=120)
        fout = r.stdout + r.stderr + "\nEXIT=%d" % r.returncode
    except subprocess.TimeoutExpired as e:
        fout = "%s\n(killed: no exit in 120 s)" % (e.stdout or "")
    took = time.time() - t
    vout = vm_log_until(vm, log, "EXIT=", 30)
    ok, why = libcm_verdict(c, fout, vout)
    rows.append(("ferroce %s (library) -> rxe %s" % (ctool, tool), ok,
                 "%s in %.1fs" % (why, took) if ok else why, fout, vout))
    vm.run("pkill -x %s" % tool, 10)
    # The VM's client, ferroce's server.
    p = subprocess.Popen(lib_tool(c["server"].format(ip=fip), ""), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    for _ in range(100):
        if '"port":%d' % c["port"] in ctl("--json cm listeners", check=False).stdout.replace(
                " ", ""):
            break
        time.sleep(0.1)
    t = time.time()
    _, vout = vm.run("timeout -k 5 90 %s; echo EXIT=$?" % c["client"].format(ip=fip), 120)
    took = time.time() - t
    try:
        fout = p.communicate(timeout=40)[0]
    except subprocess.TimeoutExpired:
        p.kill()
        fout = p.communicate()[0] + "\n(killed: no exit)"
    fout += "\nEXIT=%d" % p.returncode
    ok, why = libcm_verdict(c, vout, fout)
    rows.append(("rxe %s -> ferroce %s (library)" % (ctool, tool), ok,
                 "%s in %.1fs" % (why, took) if ok else why, fout, vout))
    return rows


def hostport(ip, port):
    return "[%s]:%d" % (ip, port) if ":" in ip else "%s:%d" % (ip, port)


def vm_background(vm, cmd, log):
    vm.run("rm -f %s; setsid sh -c '%s > %s 2>&1; echo EXIT=$? >> %s' &" % (log, cmd, log, log))


def vm_log_until(vm, log, pattern, secs):
    """The VM's log once `pattern` (an extended regex) is in it, or after `secs`."""
    for _ in range(int(secs / 0.3)):
        rc, out = vm.run("grep -Eq '%s' %s && cat %s" % (pattern, log, log), 10)
        if rc == 0:
            return out
        time.sleep(0.3)
    return vm.run("cat %s" % log, 10)[1]


def cm_connection_rows(vm, c):
    """One connection over roced's CM with the VM's rping: established on both ends (rping's
    ESTABLISHED event, roced's connection and QP in RTS with the peer's QPN), then ferroce's
    DREQ: rping's DISCONNECTED event, and roced's QP in ERR."""
    vip = vm.ip6 if c["v6"] else vm.ip
    fip = peer.FERROCE_IP6 if c["v6"] else peer.FERROCE_IP
    before = counter("cm_established")
    log = "/tmp/cm.log"
    if c["kind"] == "to_vm":
        vm_background(vm, "timeout -k 5 60 rping -s -d -a %s -p %d -C 1" % (vip, c["port"]),
                      log)
        # rping's debug lines are printf's, seen only when it exits: until it listens, its CM
        # refuses the REQ (invalid service ID), and the connect is tried again.
        for _ in range(30):
            t = time.time()
            r = ctl("--json cm connect %s --timeout-ms 20000" % hostport(vip, c["port"]),
                    check=False)
            if "invalid service ID" not in r.stderr:
                break
            time.sleep(0.3)
        roles = "rocectl cm connect -> rxe rping -s"
    else:
        ctl("cm listen %d" % c["port"])
        p = subprocess.Popen(["ip", "netns", "exec", peer.NS, ROCECTL, "--api", API, "--json",
                              "cm", "accept", str(c["port"]), "--timeout-ms", "30000"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        t = time.time()
        vm_background(vm, "timeout -k 5 60 rping -c -d -a %s -p %d -C 1 -v" % (fip, c["port"]),
                      log)
        try:
            fout = p.communicate(timeout=40)[0]
        except subprocess.TimeoutExpired:
            p.kill()
            fout = p.communicate()[0] + "\n(killed: no exit)"
        r = subprocess.CompletedProcess([], p.returncode, fout, "")
        roles = "rxe rping -c -> rocectl cm accept"
    took = time.time() - t
    fout = r.stdout + r.stderr
    try:
        conn = json.loads(r.stdout) if r.returncode == 0 else {}
    except ValueError:
        conn = {}
    ok, why = False, "rocectl exit %d: %s" % (r.returncode, fout.strip()[-300:])
    vout = ""
    if conn.get("state") == "established":
        qp = api("GET", "/v1/qps/%d" % conn["qpn"])
        ctl("cm disconnect %d" % conn["id"])
        vout = vm_log_until(vm, log, "EXIT=", 20)
        qp_after = qp
        for _ in range(50):
            qp_after = api("GET", "/v1/qps/%d" % conn["qpn"])
            if qp_after.get("state") == "ERR":
                break
            time.sleep(0.1)
        grew = counter("cm_established") - before
        checks = [
            ("rping ESTABLISHED", "RDMA_CM_EVENT_ESTABLISHED" in vout),
            ("rping DISCONNECTED", re.search(r"DISCONNECT", vout) is not None),
            ("QP in RTS", qp.get("state") == "RTS"),
            ("QP to ERR after the DREQ", qp_after.get("state") == "ERR"),
            ("peer QPN", conn.get("remote_qpn") is not None and
             qp.get("rqpn") == conn.get("remote_qpn")),
            ("cm_established +1", grew == 1),
        ]
        failed = [n for n, good in checks if not good]
        ok = not failed
        why = "established in %.1fs, QP %d <-> rxe QP %s, disconnected%s" % (
            took, conn["qpn"], conn.get("remote_qpn"),
            "" if ok else "; failed: " + ", ".join(failed))
    else:
        vm.run("pkill -x rping", 10)
        vout = vm_log_until(vm, log, "EXIT=", 10)
    if c["kind"] == "from_vm":
        ctl("cm unlisten %d" % c["port"], check=False)
    vm.run("pkill -x rping", 10)
    return [(roles, ok, why, fout, vout)]


def run_cm_case(vm, c):
    """The VM's tool against roced: its output shows ferroce's answer, and roced counted it."""
    before = counter(c["counter"])
    t = time.time()
    _, out = vm.run("timeout -k 5 60 %s; echo EXIT=$?" % c["cmd"], 90)
    took = time.time() - t
    grew = counter(c["counter"]) - before
    ok = re.search(c["expect"], out) is not None and grew >= 1
    why = "%s in %.1fs; %s +%d" % ("answered" if ok else "not answered as expected", took,
                                   c["counter"], grew)
    return [("rxe rdma_cm -> ferroce QP1", ok, why, "", out)]


# Flags every tool gets: the device, and for perftest the report format.
PERFTEST_FLAGS = " -d rxe0 -F -x %d"
PINGPONG_FLAGS = " -d rxe0 -g %d"
# perftest's own clock calibration failed (get_cpu_mhz: the fit of cycles against time was
# poor, which the VM's emulated CPU sometimes gives under load): it then reports every figure
# as 0, whatever moved.
PERFTEST_NO_CLOCK = re.compile(r"Correlation coefficient r\^2: \S+ < 0\.9")
PINGPONG = re.compile(r"^(\d+) iters in ([\d.]+) seconds = ([\d.]+) usec/iter", re.M)

def result(out):
    """The figures of perftest's result line (the line after the '#bytes' header):
    bandwidth: bytes, iterations, peak, average, msg rate; latency: bytes, iterations, t_min,
    t_max, t_typical, t_avg, t_stdev, 99%, 99.9%. None when there is none."""
    lines = out.splitlines()
    for i, l in enumerate(lines):
        if "#bytes" in l and i + 1 < len(lines):
            try:
                return tuple(float(x) for x in lines[i + 1].split())
            except ValueError:
                return None
    return None


class Roced:
    def __init__(self, logdir, mtu):
        self.cfg = os.path.join(logdir, "roced.toml")
        self.log = os.path.join(logdir, "roced.log")
        with open(self.cfg, "w") as f:
            f.write(CONFIG % (os.getpid(), mtu, peer.FERROCE_IP, peer.FERROCE_IP6,
                              peer.NET + ".11", API))
        self.p = subprocess.Popen(
            ["ip", "netns", "exec", peer.NS, ROCED, "--config", self.cfg,
             "--report", os.path.join(logdir, "roced.json")],
            stdout=subprocess.DEVNULL, stderr=open(self.log, "w"), stdin=subprocess.DEVNULL)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError("roced exited: " + open(self.log).read()[-3000:])
            r = ctl("port show --json", check=False)
            if r.returncode == 0 and '"link_up":true' in r.stdout.replace(" ", ""):
                return
            time.sleep(0.3)
        raise RuntimeError("roced's port did not come up: " + open(self.log).read()[-3000:])

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGINT)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def ctl(args, check=True, timeout=300):
    cmd = "ip netns exec %s %s --api %s %s" % (peer.NS, ROCECTL, API, args)
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError("%s: %s" % (cmd, r.stderr))
    return r


def vm_server(vm, tool, cm=False):
    """Starts perftest's server in the VM and waits until it listens: on TCP 18515, or with
    -R (cm) on rdma_cm's port 18515 (an rdma_cm ID in LISTEN)."""
    vm.run("rm -f /tmp/srv.log; setsid sh -c '%s > /tmp/srv.log 2>&1; echo EXIT=$? >> /tmp/srv.log' &" % tool)
    listens = ("rdma resource show cm_id | grep LISTEN | grep -q ':18515'" if cm
               else "netstat -ltn | grep -q ':18515 '")
    for _ in range(60):
        rc, _ = vm.run("%s || grep -q '^EXIT=' /tmp/srv.log" % listens, 10)
        if rc == 0:
            return
        time.sleep(0.3)


def vm_server_result(vm):
    for _ in range(120):
        rc, out = vm.run("grep -q '^EXIT=' /tmp/srv.log && cat /tmp/srv.log", 10)
        if rc == 0:
            return out
        time.sleep(0.5)
    vm.run("kill $(pidof ib_write_bw ib_read_bw ib_atomic_bw ib_send_bw ib_write_lat"
           " ib_read_lat ib_send_lat ib_atomic_lat ibv_rc_pingpong ibv_ud_pingpong) 2>/dev/null")
    return vm.run("cat /tmp/srv.log; echo EXIT=killed")[1]


def exit_of(out):
    m = re.search(r"^EXIT=(\S+)", out, re.M)
    return m.group(1) if m else "?"


def check(client, server, lat, pingpong=False, own_count=False):
    """The client's result line shows traffic, and the server's (where perftest prints one:
    not the servers of READ and ATOMIC latency) agrees on size and iterations (own_count: a
    SEND server with -D, or either side of a latency test with -D, counts over its own
    window: the two agree within half either way). For rc_pingpong: both sides print the
    same number of iterations."""
    if pingpong:
        mc, ms = PINGPONG.search(client), PINGPONG.search(server)
        if not mc or not ms:
            return False, "no 'iters in ... usec/iter' line"
        if mc.group(1) != ms.group(1):
            return False, "sides disagree: %s vs %s iterations" % (mc.group(1), ms.group(1))
        return True, "%s iters: %s usec/iter" % (mc.group(1), mc.group(3))
    rc, rs = result(client), result(server)
    if not rc or len(rc) < (4 if lat and own_count else 5):
        return False, "no result line from the client"
    if rs and own_count and not (rs[0] == rc[0] and 0.5 * rc[1] <= rs[1] <= 1.5 * rc[1]):
        return False, "server's count: %s vs the client's %s" % (rs[:2], rc[:2])
    if rs and not own_count and rs[:2] != rc[:2]:
        return False, "sides disagree: %s vs %s" % (rc[:2], rs[:2])
    if lat and own_count:
        # -D: #bytes #iterations t_avg tps.
        if len(rc) != 4 or rc[1] <= 0 or rc[2] <= 0 or rc[3] <= 0:
            return False, "no timed latency figures: %s" % (rc,)
        return True, "%d B x %d in the window: t_avg %.1f us, %.0f tps" % rc
    if lat:
        if len(rc) != 9 or not 0 < rc[2] <= rc[4] <= rc[3]:
            return False, "latency figures out of order: %s" % (rc,)
        return True, "%d B x %d: typical %.1f us, 99%% %.1f us" % (rc[0], rc[1], rc[4], rc[7])
    if not rs:
        return False, "no result line from the server"
    if rc[3] <= 0 and rc[4] <= 0:
        # (8-byte atomics under loss can round to 0.00 MB/s; their message rate shows.)
        return False, "zero bandwidth and message rate"
    return True, "%d B x %d: %.2f MB/s, %.4f Mpps" % (rc[0], rc[1], rc[3], rc[4])


def api(method, path, body=None):
    """One call to roced's REST API (it listens inside the lab's namespace); the JSON reply."""
    code = ("import json,sys,urllib.request as u; r=u.Request(sys.argv[1], method=sys.argv[2],"
            " data=sys.argv[3].encode() or None); print(u.urlopen(r, timeout=30).read().decode())")
    r = subprocess.run(["ip", "netns", "exec", peer.NS, sys.executable, "-c", code,
                        "http://%s%s" % (API, path), method, json.dumps(body) if body else ""],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError("%s %s: %s" % (method, path, r.stderr.strip()[-500:]))
    return json.loads(r.stdout)


def counter(name):
    """A counter summed over roced's lcores."""
    return sum(l["counters"].get(name, 0) for l in api("GET", "/v1/stats")["lcores"])


def impair(loss):
    for d in ("rx", "tx"):
        api("PUT", "/v1/ports/0/impair", {"direction": d, "loss": loss})


def lib_tool(tool, flags, *args):
    """The argv of `tool` on ferroce: in the lab's namespace, the library on LD_PRELOAD."""
    return (["ip", "netns", "exec", peer.NS, "env", "LD_PRELOAD=" + LIBRARY,
             "FERROCE_SOCKET=" + ATTACH] + tool.split() + flags.split() + list(args))


def run_lib_case(vm, c):
    """Both roles of a case whose ferroce side is the same tool through the library: a list of
    (roles, ok, why, ferroce output, rxe output)."""
    tool = c["tool"]
    pingpong = "_pingpong" in tool
    vm_flags = (PINGPONG_FLAGS if pingpong else PERFTEST_FLAGS) % c["gid"]
    lib_flags = vm_flags.replace("rxe0", "ferroce0")
    lat = "_lat" in c["name"]
    out = []
    # ferroce's tool is the client, the VM serves.
    vm_server(vm, tool + vm_flags)
    try:
        r = subprocess.run(lib_tool(tool, lib_flags, vm.ip), capture_output=True,
                           text=True, timeout=150)
        fout, frc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        fout, frc = "%s\n(killed: no exit in 150 s)" % (e.stdout or ""), -9
    srv = vm_server_result(vm)
    ok = frc == 0 and exit_of(srv) == "0"
    ok2, why = check(fout, srv, lat, pingpong) if ok else (
        False, "exit %d / %s: %s" % (frc, exit_of(srv), fout.strip()[-300:]))
    out.append(("ferroce (library) client -> rxe server", ok and ok2, why, fout, srv))
    if pingpong:
        time.sleep(0.5)
    # The VM's tool is the client, ferroce's serves.
    p = subprocess.Popen(lib_tool(tool, lib_flags), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    port = ":18515 "
    for _ in range(100):
        if port in peer.nsx("ss -ltn", check=False):
            break
        time.sleep(0.1)
    _, cout = vm.run("timeout -k 5 120 %s%s %s; echo EXIT=$?" % (tool, vm_flags, peer.HOST_IP),
                     150)
    try:
        sout = p.communicate(timeout=30)[0]
    except subprocess.TimeoutExpired:
        p.kill()
        sout = p.communicate()[0] + "\n(killed: no exit)"
    ok = p.returncode == 0 and exit_of(cout) == "0"
    ok2, why = check(cout, sout, lat, pingpong) if ok else (
        False, "exit %s / %s: %s" % (exit_of(cout), p.returncode, sout.strip()[-300:]))
    out.append(("rxe client -> ferroce (library) server", ok and ok2, why, sout, cout))
    return out


def run_case(vm, c):
    """Both roles of one case: a list of (roles, ok, why, ferroce output, rxe output)."""
    if c["perf"] is None:
        return run_lib_case(vm, c)
    name, tool = c["name"], c["tool"]
    pingpong = tool.startswith("ibv_") and "_pingpong" in tool
    flags = (PINGPONG_FLAGS if pingpong else PERFTEST_FLAGS) % c["gid"] + c["vm_flags"]
    ctl_cmd = "%s %s %d" % (c["perf"], "-g" if pingpong else "-x", c["gid"])
    if not pingpong:
        ctl_cmd = "perf " + ctl_cmd
    lat = "_lat" in name
    own = (tool.startswith("ib_send_bw") or lat) and " -D " in tool
    out = []
    if c["netem"]:
        vm.run("tc qdisc replace dev eth0 root netem %s" % c["netem"])
    if c["impair"]:
        impair(c["impair"])
    try:
        # ferroce is the client, the VM serves.
        vm_server(vm, tool + flags, c["cm"])
        r = ctl("%s %s --timeout 60" % (ctl_cmd, vm.ip), check=False)
        srv = vm_server_result(vm)
        ok = r.returncode == 0 and exit_of(srv) == "0"
        ok2, why = check(r.stdout, srv, lat, pingpong, own) if ok else (False, "exit %d / %s: %s" % (
            r.returncode, exit_of(srv), r.stderr.strip()[-300:]))
        out.append(("ferroce client -> rxe server", ok and ok2, why, r.stdout + r.stderr, srv))
        if pingpong:
            # rc_pingpong's server may still be closing its TCP socket.
            time.sleep(0.5)
        # The VM is the client, ferroce serves.
        cnp0 = counter("np_cnp_sent") if c["cnp"] else 0
        # No shell between us and rocectl (ip execs it), so a kill below reaches rocectl and
        # its end of the pipe closes (a killed shell left rocectl holding it: a hang).
        p = subprocess.Popen(
            ["ip", "netns", "exec", peer.NS, ROCECTL, "--api", API]
            + ctl_cmd.split() + ["--server", "--timeout", "60"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(100):
            if c["cm"]:
                r = ctl("--json cm listeners", check=False)
                if '"port":18515' in r.stdout.replace(" ", ""):
                    break
            elif ":18515 " in peer.nsx("ss -ltn", check=False):
                break
            time.sleep(0.1)
        # With -R the exchange goes to ferroce's RoCE address, through the CM.
        server = peer.FERROCE_IP if c["cm"] else peer.HOST_IP
        _, cout = vm.run("timeout -k 5 120 %s%s %s; echo EXIT=$?" % (tool, flags, server),
                         150)
        try:
            sout = p.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            p.kill()
            sout = p.communicate()[0] + "\n(rocectl killed: no exit)"
        ok = p.returncode == 0 and exit_of(cout) == "0"
        ok2, why = check(cout, sout, lat, pingpong, own) if ok else (False, "exit %s / %s" % (
            exit_of(cout), p.returncode))
        if ok2 and c["cnp"]:
            cnps = counter("np_cnp_sent") - cnp0
            if cnps <= 0:
                ok2, why = False, "ferroce sent no CNP for the peer's CE-marked packets"
            else:
                why += "; ferroce sent %d CNPs" % cnps
        out.append(("rxe client -> ferroce server", ok and ok2, why, sout, cout))
    finally:
        if c["netem"]:
            vm.run("tc qdisc del dev eth0 root 2>/dev/null; true")
        if c["impair"]:
            impair(0.0)
    return out


def peer_side_failure(vm, c, results):
    """Why a failed case's rows are the peer's or perftest's doing, not ferroce's, if they
    are: (what happened, what its rerun rows say, whether the VM must restart first), or None.
    Each is in tests/interop/NOTES.md."""
    if all(r[1] for r in results):
        return None
    if vm.nic_stalled():
        # QEMU stopped taking the guest's frames (NETDEV WATCHDOG in its console).
        return ("the VM's NIC stalled (NETDEV WATCHDOG in its console): restarting it",
                "the VM's NIC had stalled", True)
    if " -D " in c["tool"] and "_lat" in c["name"] and any(
            not r[1] and (
                r[0] == "ferroce client -> rxe server"
                and re.match(r"exit 0 / (143|killed)", r[2])
                or r[0] == "rxe client -> ferroce server"
                and re.match(r"exit (143|killed) / 0", r[2]))
            and check(r[3], "", True, False, True)[0] for r in results):
        # ferroce's side (client or server) ended its window with figures; the VM's ib_*_lat
        # never ended its own and was killed (perftest's duration loop can spin past it).
        return ("the VM's perftest outlived its -D window",
                "the VM's perftest outlived its -D window", False)
    # perftest could not time itself and printed zeros: in the VM, or on the host (a lib case's
    # own perftest, on libferroce_ibverbs.so), the same calibration on a host busy with TCG.
    for where, out in (("in the VM", 4), ("on the host", 3)):
        if any(not r[1] and PERFTEST_NO_CLOCK.search(r[out]) for r in results):
            return ("perftest %s could not calibrate its clock (r^2 < 0.9)" % where,
                    "perftest %s could not time itself" % where, False)
    return None


def main():
    only = None
    if "--only" in sys.argv:
        only = sys.argv[sys.argv.index("--only") + 1]
    logdir = tempfile.mkdtemp(prefix="ferroce-interop-")
    if "--keep-logs" in sys.argv:
        logdir = sys.argv[sys.argv.index("--keep-logs") + 1]
        os.makedirs(logdir, exist_ok=True)
    rows, details = [], []
    t0 = time.time()
    with peer.Lab(vms=1, mtu=LAB_MTU) as lab:
        vm = lab.vms[0]
        print("peer %s up (rxe0 ACTIVE) after %.1fs" % (vm.ip, time.time() - t0), flush=True)
        roced = Roced(logdir, LAB_MTU)
        try:
            for c in CASES + LIB_CASES + CM_CASES + LIBCM_CASES:
                if only and only not in c["name"]:
                    continue
                if c in CM_CASES or c in LIBCM_CASES:
                    results = (libcm_rows(vm, c) if c.get("kind") == "libcm"
                               else rping_rows(vm, c) if c.get("kind") == "rping"
                               else perftest_v6_rows(vm, c) if c.get("kind") == "perftest_v6"
                               else example_rows(vm, c) if c.get("kind") in ("udaddy",
                                                                             "ucmatose")
                               else cm_connection_rows(vm, c) if c.get("kind")
                               else run_cm_case(vm, c))
                    for roles, ok, why, fout, rout in results:
                        rows.append((c["name"], roles, ok, why))
                        details.append((c["name"] + ", " + roles, fout, rout))
                        print("%-28s %-30s %s  %s" % (c["name"], roles, "PASS" if ok else "FAIL",
                                                      why), file=sys.stderr, flush=True)
                    continue
                results = run_case(vm, c)
                why = peer_side_failure(vm, c, results)
                if why:
                    # At most once: the rerun must pass on its own, and its rows say why.
                    print("%s: %s: running the case again" % (c["name"], why[0]),
                          file=sys.stderr, flush=True)
                    if why[2]:
                        vm.restart()
                    results = [(roles + " (rerun: %s)" % why[1],) + tuple(r)
                               for roles, *r in run_case(vm, c)]
                for roles, ok, why, fout, rout in results:
                    rows.append((c["name"], roles, ok, why))
                    details.append((c["name"] + ", " + roles, fout, rout))
                    print("%-28s %-30s %s  %s" % (c["name"], roles, "PASS" if ok else "FAIL", why),
                          file=sys.stderr, flush=True)
        finally:
            roced.stop()
    width = max(len(r[0]) for r in rows) if rows else 10
    print()
    print("%-*s  %-30s  %-4s  %s" % (width, "case", "roles", "", "figures"))
    for name, roles, ok, why in rows:
        print("%-*s  %-30s  %-4s  %s" % (width, name, roles, "PASS" if ok else "FAIL", why))
    failed = sum(1 for r in rows if not r[2])
    print("\n%d passed, %d failed in %.0fs; roced's log and report: %s" % (
        len(rows) - failed, failed, time.time() - t0, logdir))
    for name, ferroce_out, rxe_out in details:
        print("\n===== %s\n----- ferroce (rocectl)\n%s\n----- rxe (in the VM)\n%s" % (
            name, ferroce_out.strip(), rxe_out.strip()))
    if failed:
        # Again last, so that a log's tail (all CI keeps) names what failed and why.
        print("\n== %d failed (their output is above, under ===== case, roles):" % failed)
        for name, roles, ok, why in rows:
            if not ok:
                print("%-*s  %-30s  FAIL  %s" % (width, name, roles, why))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
