#!/usr/bin/env python3
"""Records the connection manager's MADs between two Linux Soft-RoCE VMs (peer.Lab) into
tests/data/rxe: every CM message the golden tests and `rocectl decode` take, from unmodified
rdmacm-utils.

usage: record_cm.py [OUTDIR]    (default tests/data/rxe; needs root and tests/interop/setup.sh)

    rping_cm.pcap     rping -c -C 3 -v over IPv4: REQ, REP, RTU, the data, DREQ, DREP
    rping_cm_v6.pcap  the same over IPv6 (rdma_cm's header with IPv6 addresses)
    cm_rej.pcap       rping -c to a port no one listens on: REQ, REJ (invalid service ID)
    cm_mra.pcap       rping -s stopped (SIGSTOP) before the REQ, continued 8 s later: the
                      client's REQ retransmission is answered by an MRA, then REP, RTU
    udaddy.pcap       udaddy (RDMA_PS_UDP): SIDR_REQ, SIDR_REP, UD SENDs

Each capture comes with a .log: the commands and both sides' output.
"""

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def record(lab, out, name, steps):
    """Runs `steps` (a list of (vm index, script, seconds to wait after)) with a capture of the
    bridge's RoCE traffic running."""
    pcap = os.path.join(out, name + ".pcap")
    cap = subprocess.Popen(
        ["ip", "netns", "exec", peer.NS, "tcpdump", "-i", "fxbr0", "-U", "-w", pcap,
         "udp port 4791"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    log = []
    try:
        for vm, script, wait in steps:
            rc, text = lab.vms[vm].run(script, timeout=120)
            log.append("== vm%d (exit %d): %s\n%s" % (vm, rc, script.strip(), text))
            time.sleep(wait)
    finally:
        time.sleep(1.0)
        cap.terminate()
        cap.wait()
    with open(os.path.join(out, name + ".log"), "w") as f:
        f.write("\n".join(log))
    print("%s: %d bytes" % (pcap, os.path.getsize(pcap)))


def main():
    out = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests/data/rxe"))
    with peer.Lab(vms=2) as lab:
        srv, srv6 = lab.vms[1].ip, lab.vms[1].ip6
        done = "sleep 2; cat /tmp/s.log"
        record(lab, out, "rping_cm", [
            (1, "timeout 40 rping -s -a %s -p 7471 -C 3 -v > /tmp/s.log 2>&1 &" % srv, 2),
            (0, "rping -c -a %s -p 7471 -C 3 -v -S 64" % srv, 0),
            (1, done, 0),
        ])
        record(lab, out, "rping_cm_v6", [
            (1, "timeout 40 rping -s -a %s -p 7472 -C 3 -v > /tmp/s.log 2>&1 &" % srv6, 2),
            (0, "rping -c -a %s -p 7472 -C 3 -v -S 64" % srv6, 0),
            (1, done, 0),
        ])
        record(lab, out, "cm_rej", [
            (0, "rping -c -a %s -p 7999 -C 1 -v; echo rping exit $?" % srv, 0),
        ])
        record(lab, out, "cm_mra", [
            (1, "rping -s -a %s -p 7473 -C 1 -v > /tmp/s.log 2>&1 & echo $! > /tmp/s.pid;"
                " sleep 2; kill -STOP $(cat /tmp/s.pid)" % srv, 0),
            (0, "rping -c -a %s -p 7473 -C 1 -v -S 64 > /tmp/c.log 2>&1 &" % srv, 8),
            (1, "kill -CONT $(cat /tmp/s.pid)", 4),
            (0, "cat /tmp/c.log", 0),
            (1, done + "; kill $(cat /tmp/s.pid) 2>/dev/null; true", 0),
        ])
        record(lab, out, "udaddy", [
            (1, "timeout 40 udaddy -C 2 > /tmp/s.log 2>&1 &", 2),
            (0, "udaddy -s %s -C 2" % srv, 0),
            (1, done, 0),
        ])


if __name__ == "__main__":
    main()
